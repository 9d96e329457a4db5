//! Lease records: windows of any whole number of seconds, sharing each lock with native leases.
//!
//! The record is the holder's claim in the lock blob's metadata, with an expiry
//! in the storage server's seconds. To take a lock: read the blob (HEAD), or start from a kept
//! state of a record its holder released ([`super::Start::Kept`]); if nobody
//! holds it (no lease, no live record of another), write the record with `If-Match` on the ETag read and
//! **without a lease id**: a record written in between moves the ETag, and a lease taken in
//! between makes storage refuse a write without its id, so either way the write fails and
//! nobody is granted twice. Extending one's own record moves its expiry and keeps its token.
//!
//! A record only gives time if the write lands before the expiry it wrote: when the
//! compare-and-swap's own `Date` is at or past it (a 1 s record behind a slow answer), the
//! caller is not told it acquired.

use std::time::{Duration, SystemTime};

use super::claim;
use super::snapshot::{at, checked_date, Read, Snapshot, Tenure};
use super::{
    is_missing, may_have_granted, no_date, Acquire, Acquired, Acquiring, Claim, Grant, IdOrigin,
    Kind, Locks, MAX_ATTEMPTS, MAX_WINDOW_SECS,
};
use crate::names::BlobName;
use crate::ops::{Condition, Metadata, Refusal, SetMetadata, WriteOutcome};
use crate::types::{unix_secs, ETag, LeaseId};
use crate::{Error, Transport};

/// Takes or extends a record of `length` on `blob` for `id`, starting from `seen` (a read the
/// caller already made) or from a HEAD of its own.
pub(super) async fn acquire<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    length: Duration,
    how: &Acquiring<'_>,
    mut seen: Option<Read>,
    now: SystemTime,
) -> Result<Acquire, Error> {
    let (id, origin, label) = (how.lease_id, how.origin, how.label);
    let secs = length.as_secs();
    if length.subsec_nanos() != 0 || !(1..=MAX_WINDOW_SECS).contains(&secs) {
        return Err(Error::InvalidArgument(format!(
            "a record lasts a whole number of seconds from 1 to {MAX_WINDOW_SECS} (got {length:?})"
        )));
    }
    for _ in 0..MAX_ATTEMPTS {
        let read = match seen.take() {
            Some(read) => read,
            None => locks.read(blob, now).await?,
        };
        let (snap, tenure) = match read {
            Read::Found(snap) => {
                if let Some(busy) = snap.busy_for(id) {
                    return Ok(busy);
                }
                let tenure = snap.tenure_for(id)?;
                (snap, tenure)
            }
            Read::Missing {
                date,
                container_missing,
            } => {
                // First use: create the blob with the first token in it but no holder (as the
                // native path does), then take the record below with the compare-and-swap at
                // the new blob's ETag. A create whose answer is lost so grants nothing, however
                // late it lands: there is nothing to clear.
                match locks
                    .create_first(blob, Kind::Record, (date, container_missing), None, now)
                    .await?
                {
                    Some(created) => created,
                    None => continue,
                }
            }
        };
        let claim = Claim {
            holder: Some(id),
            kind: Kind::Record,
            since: tenure.since,
            expires: snap.server_secs() + secs,
            token: tenure.token,
            label: label.to_string(),
        };
        // Its own record says as much already (a concurrent call of the same holder wrote it
        // this very second): nothing to write, so the ETag the holder's other calls write at
        // does not move under them.
        if let Some(own) = snap.record_of(id).filter(|_| !snap.leased) {
            if own.expires == claim.expires && own.label == claim.label {
                let grant = Grant {
                    etag: Some(snap.etag.clone()),
                    metadata: snap.metadata.clone(),
                    leased: false,
                };
                return Ok(granted(id, &claim, tenure, snap.server_date, &snap, grant));
            }
        }
        // The blob is leased by the caller itself (it is switching from a native lease, or a
        // switch could not let the lease go): the record is written under that lease, and the
        // lease let go.
        let switching = snap.leased && snap.held_by(id);
        let metadata = snap.with_claim(&claim);
        let write = SetMetadata {
            container: locks.container().clone(),
            blob: blob.clone(),
            metadata: metadata.clone(),
            lease_id: switching.then_some(id),
            condition: Condition::IfMatch(snap.etag.clone()),
        };
        match locks.client.execute(&write, now).await {
            Ok((WriteOutcome::Written(w), date)) => {
                // The blob as the write left it. After a switch, only if the lease was let go:
                // a lease left behind (best effort: it runs out on its own, and a release
                // frees both, see `Locks::release`) makes the holder read before it writes.
                let let_go =
                    !switching || super::native::release(locks, blob, id, now).await.is_ok();
                let grant = Grant {
                    etag: w.etag.clone().filter(|_| let_go),
                    metadata,
                    leased: false,
                };
                let written = checked_date(w.server_date.or(date).ok_or_else(no_date)?)?;
                return Ok(granted(id, &claim, tenure, written, &snap, grant));
            }
            // The ETag moved, or (switching) the caller's lease ran out meanwhile: read again.
            Ok((WriteOutcome::Refused(Refusal::ConditionFailed | Refusal::LeaseLost), _)) => {
                continue
            }
            // Leased by someone since the read.
            Ok((WriteOutcome::Refused(_), _)) => {
                return Ok(Acquire::Busy {
                    retry_after: None,
                    holder: None,
                    stepped_down_until: None,
                })
            }
            Err(e) if is_missing(&e) => continue,
            Err(e) => {
                // A new holder gives back what storage may have granted it, when this call
                // generated its id; a holder that was extending or switching keeps the lock it
                // held before this call, and a known id may be another call's by now (the
                // same id acquiring again settles it).
                if may_have_granted(&e) && !tenure.extended && origin == IdOrigin::Fresh {
                    let _ = clear_if_held(locks, blob, id, now).await;
                }
                return Err(e);
            }
        }
    }
    Err(super::gave_up("acquire"))
}

/// Extends `id`'s record of `length` from `grant`, the blob as the holder's own last write left
/// it, without a read: one compare-and-swap at that write's ETag, its expiry reckoned from the
/// caller's clock (`now`). Storage's `Date` on the write then checks what a read first would
/// have decided: when the old record had run out by then (a new tenure is due) or the expiry
/// reckoned is off storage's (clocks that disagree), the record is written again as a read
/// first would have written it, at the ETag the first write left: 2 requests. `None` when this
/// cannot be told so, and the caller acquires as usual (a read first):
/// * the grant is not of a record of `id`'s with `label`, or its ETag is unknown;
/// * by the caller's clock the record has less than [`MARGIN_SECS`] left (likely run out:
///   nothing is written);
/// * storage refuses a write (the blob changed or was leased since).
pub(super) async fn extend_at<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    length: Duration,
    id: LeaseId,
    label: &str,
    grant: &Grant,
    now: SystemTime,
) -> Result<Option<Acquired>, Error> {
    let secs = length.as_secs();
    let Some(etag) = grant.etag.as_ref().filter(|_| !grant.leased) else {
        return Ok(None);
    };
    let Ok(kept) = Claim::read(&grant.metadata) else {
        return Ok(None);
    };
    if kept.holder != Some(id)
        || kept.kind != Kind::Record
        || kept.label != label
        || length.subsec_nanos() != 0
        || !(1..=MAX_WINDOW_SECS).contains(&secs)
        || unix_secs(now) + MARGIN_SECS >= kept.expires
    {
        return Ok(None);
    }
    // Never shorter than the kept record: a clock behind storage's must not make the record
    // look run out to others between this write and its correction.
    let guess = Claim {
        expires: (unix_secs(now) + secs).max(kept.expires),
        ..kept.clone()
    };
    let Some((etag, metadata, written)) =
        write_at(locks, blob, &grant.metadata, &guess, etag, now).await?
    else {
        return Ok(None);
    };
    // What a read first would have written: the read's `Date` at most a second before the
    // write's.
    let landed = unix_secs(written);
    let lapsed = landed >= kept.expires;
    let exact = (landed + secs - 1..=landed + secs).contains(&guess.expires);
    let (claim, etag, metadata, written) = if !lapsed && exact {
        (guess, etag, metadata, written)
    } else {
        let claim = Claim {
            token: if lapsed {
                claim::next_token(kept.token, written)?
            } else {
                kept.token
            },
            since: if lapsed { landed } else { kept.since },
            expires: landed + secs,
            ..kept.clone()
        };
        match write_at(locks, blob, &metadata, &claim, &etag, now).await? {
            Some((etag, metadata, written)) => (claim, etag, metadata, written),
            None => return Ok(None),
        }
    };
    if unix_secs(written) >= claim.expires {
        return Ok(None);
    }
    Ok(Some(Acquired {
        lease_id: id,
        fencing_token: Some(claim.token),
        expires_at: Some(at(claim.expires)),
        server_date: written,
        since: at(claim.since),
        extended: claim.since == kept.since && claim.token == kept.token,
        marks: claim::marks_of(&metadata),
        grant: Grant {
            etag: etag.into(),
            metadata,
            leased: false,
        },
    }))
}

/// By the caller's clock, a kept record with less than this left is not extended from what was
/// kept: it may have run out at storage.
pub const MARGIN_SECS: u64 = 2;

/// Writes `claim` into `metadata` with a compare-and-swap at `etag`, no lease: the new ETag,
/// the metadata written and storage's `Date`; `None` when storage refuses it.
async fn write_at<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    metadata: &Metadata,
    claim: &Claim,
    etag: &ETag,
    now: SystemTime,
) -> Result<Option<(ETag, Metadata, SystemTime)>, Error> {
    let mut metadata = metadata.clone();
    claim.write(&mut metadata);
    let write = SetMetadata {
        container: locks.container().clone(),
        blob: blob.clone(),
        metadata: metadata.clone(),
        lease_id: None,
        condition: Condition::IfMatch(etag.clone()),
    };
    match locks.client.execute(&write, now).await {
        Ok((WriteOutcome::Written(w), date)) => {
            let Some(etag) = w.etag else {
                return Ok(None);
            };
            let written = checked_date(w.server_date.or(date).ok_or_else(no_date)?)?;
            Ok(Some((etag, metadata, written)))
        }
        Ok((WriteOutcome::Refused(_), _)) => Ok(None),
        Err(e) if is_missing(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The answer for a record written at `written` (the write's server `Date`) over `snap`, the
/// blob as `grant`: acquired, unless the record had already run out when it landed.
fn granted(
    id: LeaseId,
    claim: &Claim,
    tenure: Tenure,
    written: SystemTime,
    snap: &Snapshot,
    grant: Grant,
) -> Acquire {
    if unix_secs(written) >= claim.expires {
        return Acquire::Busy {
            retry_after: Some(Duration::ZERO),
            holder: None,
            stepped_down_until: None,
        };
    }
    Acquire::Acquired(Acquired {
        lease_id: id,
        fencing_token: Some(claim.token),
        expires_at: Some(at(claim.expires)),
        server_date: written,
        since: at(tenure.since),
        extended: tenure.extended,
        marks: snap.marks(),
        grant,
    })
}

/// Clears `blob`'s live record (keeping its token) if `id` holds it: a HEAD and a
/// compare-and-swap. Whether it did.
async fn clear_if_held<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    id: LeaseId,
    now: SystemTime,
) -> Result<bool, Error> {
    match locks.read(blob, now).await? {
        Read::Found(snap) if snap.record_of(id).is_some() && !snap.leased => {
            clear_at(locks, blob, &snap, now).await
        }
        _ => Ok(false),
    }
}

/// Clears the snapshot's record (keeping its token) with a compare-and-swap on its ETag.
/// Whether it did (a blob that moved since the read is left alone).
pub(super) async fn clear_at<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    snap: &Snapshot,
    now: SystemTime,
) -> Result<bool, Error> {
    let write = SetMetadata {
        container: locks.container().clone(),
        blob: blob.clone(),
        metadata: snap.with_claim(&snap.claim.released()),
        lease_id: None,
        condition: Condition::IfMatch(snap.etag.clone()),
    };
    match locks.client.execute(&write, now).await {
        Ok((WriteOutcome::Written(_), _)) => Ok(true),
        Ok((WriteOutcome::Refused(_), _)) => Ok(false),
        Err(e) if is_missing(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Clears whoever's live record `blob` holds (keeping its token): for a break. A HEAD and a
/// compare-and-swap, retried if the record moves meanwhile.
pub(super) async fn clear_any<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    now: SystemTime,
) -> Result<(), Error> {
    for _ in 0..MAX_ATTEMPTS {
        let snap = match locks.read(blob, now).await? {
            Read::Found(snap) => snap,
            Read::Missing { .. } => return Ok(()),
        };
        if snap.live_record().is_none() {
            return Ok(());
        }
        if clear_at(locks, blob, &snap, now).await? {
            return Ok(());
        }
    }
    Err(super::gave_up("clear the lease record"))
}
