//! Native blob leases (15 to 60 s, or infinite), sharing each lock with lease records.
//!
//! To take a lock: read the blob (HEAD), or start from a kept state
//! ([`super::Start::Kept`]); if nobody else holds it (no lease with another's live
//! claim, no live record of another), acquire the lease **with `If-Match` on the ETag read**,
//! so that a record written in between makes storage refuse (412) and the caller reads again;
//! then write the holder's claim under the new lease. A holder that acquires again with its
//! own id extends its lease, keeps its token, and moves its claim's expiry. (A lock blob's
//! first holder with an id it generated and no label has its claim written by the blob's
//! create instead: see `acquire`.)
//!
//! Storage enforces the lease itself; the claim says who holds it, since when, until when and
//! with which token, and it counts only while the lease is held. A leased blob without a live
//! claim is held by a holder that stopped between its grant and its claim: the acquire itself
//! asks storage (it grants that lease to its own id only). An infinite lease left so stays
//! until its id releases it or an operator breaks it.

use std::time::SystemTime;

use super::snapshot::{at, checked_date, Read, Snapshot, Tenure};
use super::{
    is_missing, may_have_granted, no_date, Acquire, Acquired, Acquiring, Claim, Grant, IdOrigin,
    Kind, Locks, Release, MAX_ATTEMPTS,
};
use crate::error::ErrorClass;
use crate::names::BlobName;
use crate::ops::{Condition, LeaseAction, LeaseOutcome, Refusal, SetMetadata, WriteOutcome};
use crate::types::{unix_secs, LeaseDuration, LeaseId};
use crate::{Error, Transport};

/// Takes or extends the native lease on `blob` for `id`, starting from `seen` (a read the
/// caller already made, or with `kept`, the blob as an earlier holder's last write left it,
/// not leased) or from a HEAD of its own.
pub(super) async fn acquire<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    duration: LeaseDuration,
    how: &Acquiring<'_>,
    (mut seen, kept): (Option<Read>, bool),
    now: SystemTime,
) -> Result<Acquire, Error> {
    let (id, origin, label) = (how.lease_id, how.origin, how.label);
    for attempt in 0..MAX_ATTEMPTS {
        let from_kept = kept && attempt == 0;
        let read = match seen.take() {
            Some(read) => read,
            None => locks.read(blob, now).await?,
        };
        // Busy by the claim, unless the lease may be the caller's own all the same: then the
        // acquire asks storage, and a refusal answers what the claim says.
        let mut busy_by_claim = None;
        let (snap, tenure, write_claim) = match read {
            Read::Found(snap) => {
                if let Some(busy) = snap.busy_for(id) {
                    if !(origin == IdOrigin::Known && snap.may_be_held_by(id)) {
                        return Ok(busy);
                    }
                    busy_by_claim = Some(busy);
                }
                let tenure = snap.tenure_for(id)?;
                (snap, tenure, true)
            }
            Read::Missing {
                date,
                container_missing,
            } => {
                // First use: create the blob with the first token in it (so that tokens never
                // go back, whoever wins) but no holder, then acquire at the new blob's ETag and
                // write the claim under the lease. Another caller can take the lease at the new
                // blob first: until the winner's claim is there, a reader must not see the
                // creator named on a leased blob, when a name can tell anyone anything (a label,
                // or an id the caller chose, which other calls may hold too).
                //
                // An id this call generated, with no label, names nothing anybody knows: the
                // create carries the claim as the grant would write it (by the read's `Date`),
                // and a grant in the same second as the read finds it written already (the
                // claim's write below sends nothing): HEAD, create, acquire.
                // (Not for an infinite lease: its claim never moves, so a claim the create
                // wrote would stay the create's for the whole lease.)
                let creator = (origin == IdOrigin::Fresh
                    && label.is_empty()
                    && duration.as_duration().is_some())
                .then(|| (id, expiry(date, duration)));
                match locks
                    .create_first(
                        blob,
                        Kind::Native(duration),
                        (date, container_missing),
                        creator,
                        now,
                    )
                    .await?
                {
                    Some((created, tenure)) => (created, tenure, true),
                    None => continue,
                }
            }
        };
        let claim = write_claim.then(|| Claim {
            holder: Some(id),
            kind: Kind::Native(duration),
            since: tenure.since,
            expires: 0, // set from the grant's Date
            token: tenure.token,
            label: label.to_string(),
        });
        let marks = snap.marks();
        let taking = Taking {
            id,
            origin,
            claim,
            tenure,
        };
        let (granted, tenure, grant) = match take(locks, blob, &snap, duration, taking, now).await?
        {
            Take::Granted(time, tenure, grant) => (time, tenure, grant),
            // Leased, and not written since the kept state: the blob is that state, leased. A
            // read would see as much (whose claim, how long it has left), by the refusal's
            // `Date`.
            Take::Leased(date) if from_kept => {
                let busy = date
                    .and_then(|d| snap.leased_at(d))
                    .and_then(|s| s.busy_for(id));
                return Ok(busy.unwrap_or_else(busy_unknown));
            }
            // Refused where the claim said busy: what it said.
            Take::Leased(_) => return Ok(busy_by_claim.unwrap_or_else(busy_unknown)),
            Take::TakenMeanwhile => return Ok(busy_unknown()),
            Take::Moved => continue,
        };
        return Ok(Acquire::Acquired(Acquired {
            lease_id: id,
            fencing_token: Some(tenure.token),
            expires_at: duration.as_duration().map(|d| granted + d),
            server_date: granted,
            since: at(tenure.since),
            extended: tenure.extended,
            marks,
            grant,
        }));
    }
    Err(super::gave_up("acquire"))
}

/// Extends `id`'s native lease from `grant` (the blob as the holder's own last write left it)
/// without a read: a renew and the claim's new expiry, each `If-Match` that write's ETag, with
/// the answer an acquire after a read would give (same token and start, the new expiry).
/// `None` whenever that cannot tell the extension exactly (a grant not of this holder's lease,
/// a renew or claim storage refuses, a renew that landed after the claim's expiry): the caller
/// then acquires from a read. docs/protocol.md, "Calls from what a holder kept".
pub(super) async fn extend_at<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    duration: LeaseDuration,
    id: LeaseId,
    label: &str,
    grant: &Grant,
    now: SystemTime,
) -> Result<Option<Acquired>, Error> {
    let Some(etag) = grant.etag.as_ref().filter(|_| grant.leased) else {
        return Ok(None);
    };
    let Ok(claim) = Claim::read(&grant.metadata) else {
        return Ok(None);
    };
    if claim.holder != Some(id)
        || claim.kind != Kind::Native(duration)
        || claim.label != label
        || duration.as_duration().is_none()
    {
        return Ok(None);
    }
    let renew = locks
        .lease_op(blob, LeaseAction::Renew(id))
        .with_condition(Condition::IfMatch(etag.clone()));
    let granted = match locks.client.execute(&renew, now).await {
        Ok((
            LeaseOutcome::Held {
                lease_id,
                server_date,
                ..
            },
            date,
        )) if lease_id == id => server_date
            .or(date)
            .ok_or_else(no_date)
            .and_then(checked_date)?,
        Ok(_) => return Ok(None),
        Err(e) if super::refused(&e) => return Ok(None),
        // A renew that may have landed only extended the holder's own lease.
        Err(e) => return Err(e),
    };
    if unix_secs(granted) >= claim.expires {
        return Ok(None);
    }
    let mut extended = claim.clone();
    extended.expires = expiry(granted, duration);
    let grant = if extended.expires > claim.expires {
        let mut metadata = grant.metadata.clone();
        extended.write(&mut metadata);
        let write = SetMetadata {
            container: locks.container().clone(),
            blob: blob.clone(),
            metadata: metadata.clone(),
            lease_id: Some(id),
            condition: Condition::IfMatch(etag.clone()),
        };
        match locks.client.execute(&write, now).await {
            Ok((WriteOutcome::Written(w), _)) => Grant {
                etag: w.etag,
                metadata,
                leased: true,
            },
            Ok((WriteOutcome::Refused(_), _)) => return Ok(None),
            Err(e) if super::refused(&e) => return Ok(None),
            Err(e) => return Err(e),
        }
    } else {
        grant.clone()
    };
    Ok(Some(Acquired {
        lease_id: id,
        fencing_token: Some(claim.token),
        expires_at: duration.as_duration().map(|d| granted + d),
        server_date: granted,
        since: at(claim.since),
        extended: true,
        marks: super::claim::marks_of(&grant.metadata),
        grant,
    }))
}

/// What [`take`] asks storage for: the lease id and where it came from, the claim to write
/// under it (`None`: none), and the tenure it continues or begins.
struct Taking {
    id: LeaseId,
    origin: IdOrigin,
    claim: Option<Claim>,
    tenure: Tenure,
}

/// How [`take`] went.
enum Take {
    /// Held, granted at this server time, with this tenure (a concurrent call of the same
    /// holder may have begun it: then its token, so that every call of one holder tells one),
    /// the blob as the claim left it.
    Granted(SystemTime, Tenure, Grant),
    /// Someone else took the lease since the blob was read (or broke ours before the claim).
    TakenMeanwhile,
    /// The acquire was refused (409): the blob is leased, and unchanged since it was read. The
    /// refusal's `Date`.
    Leased(Option<SystemTime>),
    /// The blob changed or vanished since it was read: read it again.
    Moved,
}

/// Acquires at the snapshot's ETag, then writes `claim` under the lease. A failure after
/// storage may have granted a new tenure gives the lease back only when this call generated
/// `id` ([`IdOrigin::Fresh`]), and it gives nothing back when the caller may have held the
/// lease before this call: an extension, or a blob leased when read without a live claim
/// (whose lease only storage knows: maybe the caller's own, left by a call that stopped between
/// its grant and its claim). Such a lease runs out on its own. An id the caller chose or
/// derived ([`IdOrigin::Known`]) may be held right now by another call with it (a client's
/// retry), so its lease is left too: acquiring again with the id settles it.
async fn take<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    snap: &Snapshot,
    duration: LeaseDuration,
    taking: Taking,
    now: SystemTime,
) -> Result<Take, Error> {
    let Taking {
        id,
        origin,
        claim,
        tenure,
    } = taking;
    let held_before = tenure.extended || snap.leased;
    let give_back_on_failure = origin == IdOrigin::Fresh && !held_before;
    let op = locks
        .lease_op(
            blob,
            LeaseAction::Acquire {
                duration,
                proposed: id,
            },
        )
        .with_condition(Condition::IfMatch(snap.etag.clone()));
    let granted = match locks.client.execute(&op, now).await {
        Ok((LeaseOutcome::Held { server_date, .. }, date)) => {
            match server_date
                .or(date)
                .ok_or_else(no_date)
                .and_then(checked_date)
            {
                Ok(t) => t,
                Err(e) => {
                    if give_back_on_failure {
                        give_back(locks, blob, id, now).await;
                    }
                    return Err(e);
                }
            }
        }
        // Leased by someone in between (a lease does not move the ETag).
        Ok((_, date)) => return Ok(Take::Leased(date)),
        Err(e) if e.class() == Some(ErrorClass::PreconditionFailed) || is_missing(&e) => {
            return Ok(Take::Moved)
        }
        Err(e) => {
            if may_have_granted(&e) && give_back_on_failure {
                give_back(locks, blob, id, now).await;
            }
            return Err(e);
        }
    };
    let Some(mut claim) = claim else {
        return Ok(Take::Granted(granted, tenure, Grant::default()));
    };
    claim.expires = expiry(granted, duration);
    match write_claim(locks, blob, snap, id, claim, now).await {
        Ok(Some((written, grant))) => Ok(Take::Granted(
            granted,
            Tenure {
                token: written.token,
                since: written.since,
                ..tenure
            },
            grant,
        )),
        // The lease was broken between the grant and the claim: not ours after all.
        Ok(None) => Ok(Take::TakenMeanwhile),
        Err(e) => {
            if give_back_on_failure {
                give_back(locks, blob, id, now).await;
            }
            Err(e)
        }
    }
}

/// Writes `claim` under the lease `id` was just granted, as a compare-and-swap on the blob's
/// ETag, and returns the claim the blob then holds and the blob as it left it (`None`: the
/// lease is not `id`'s any more).
///
/// A claim of the holder's that already says as much (same tenure, an expiry as late) is left
/// as it is: no write, so the ETag that other calls of the holder acquire at does not move
/// (16 calls of one holder at once would otherwise keep refusing each other's acquires).
///
/// Every write since the grant was made under this lease, so by a concurrent call of the same
/// holder: its claim is kept where it says more (a later expiry; a tenure it began with a
/// token at least as high, whose token and start this call then tells too), so that a claim's
/// expiry and token never go back and the calls of one holder tell one token. A claim of
/// another holder's with a higher token than this call's is never written over (whatever the
/// lease says now, the lock changed hands since this call read it): `None`, taken meanwhile.
async fn write_claim<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    snap: &Snapshot,
    id: LeaseId,
    mut claim: Claim,
    now: SystemTime,
) -> Result<Option<(Claim, Grant)>, Error> {
    let mut base: Option<Snapshot> = None;
    for _ in 0..MAX_ATTEMPTS {
        let current = base.as_ref().unwrap_or(snap);
        let there = &current.claim;
        let same_holder = there.holder == Some(id) && there.kind == claim.kind;
        if same_holder && base.is_some() {
            // A concurrent call of this holder wrote its claim since the grant.
            if there.token >= claim.token {
                claim.token = there.token;
                claim.since = there.since;
            }
            claim.expires = claim.expires.max(there.expires);
        }
        if !same_holder && there.token > claim.token {
            // Another holder's claim with a higher token: the lock was taken since this
            // call read it (whatever the lease is now). A token never goes back: no write.
            return Ok(None);
        }
        if same_holder
            && there.kind == claim.kind
            && there.token == claim.token
            && there.since == claim.since
            && there.label == claim.label
            && there.expires >= claim.expires
        {
            let grant = Grant {
                etag: Some(current.etag.clone()),
                metadata: current.metadata.clone(),
                leased: true,
            };
            return Ok(Some((there.clone(), grant)));
        }
        let metadata = current.with_claim(&claim);
        let write = SetMetadata {
            container: locks.container().clone(),
            blob: blob.clone(),
            metadata: metadata.clone(),
            lease_id: Some(id),
            condition: Condition::IfMatch(current.etag.clone()),
        };
        match locks.client.execute(&write, now).await? {
            (WriteOutcome::Written(w), _) => {
                let grant = Grant {
                    etag: w.etag,
                    metadata,
                    leased: true,
                };
                return Ok(Some((claim, grant)));
            }
            (WriteOutcome::Refused(Refusal::ConditionFailed), _) => {}
            (WriteOutcome::Refused(_), _) => return Ok(None),
        }
        base = match locks.read(blob, now).await? {
            Read::Found(found) if found.leased => Some(found),
            _ => return Ok(None),
        };
    }
    Err(super::gave_up("write the claim"))
}

/// Releases the native lease `id` holds on `blob`: one request.
pub(super) async fn release<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    id: LeaseId,
    now: SystemTime,
) -> Result<Release, Error> {
    match locks
        .client
        .execute(&locks.lease_op(blob, LeaseAction::Release(id)), now)
        .await
    {
        Ok((LeaseOutcome::Released, _)) => Ok(Release::Released),
        Ok(_) => Ok(Release::NotHeld),
        Err(e) if is_missing(&e) => Ok(Release::NotHeld),
        Err(e) => Err(e),
    }
}

/// Gives a lease back after a failure, best effort: the caller reports the original error.
pub(super) async fn give_back<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    id: LeaseId,
    now: SystemTime,
) {
    let _ = release(locks, blob, id, now).await;
}

/// Busy, with nothing to tell of the holder (its claim is not there, or not its own).
fn busy_unknown() -> Acquire {
    Acquire::Busy {
        retry_after: None,
        holder: None,
        stepped_down_until: None,
    }
}

/// A native claim's expiry: the grant's time plus the duration (0 for infinite leases).
fn expiry(granted: SystemTime, duration: LeaseDuration) -> u64 {
    duration
        .as_duration()
        .map_or(0, |d| unix_secs(granted) + d.as_secs())
}
