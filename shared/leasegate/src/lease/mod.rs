//! The lease rules for stateless callers: acquire (which also extends), release, break,
//! inspect and step down, with fencing tokens, over native blob leases ([`native`]) or lease
//! records ([`record`]), on lock blobs kept through a [`BlobClient`].
//!
//! **At no moment do two lease ids hold one lock, whatever [`Term`] each caller asks for**:
//! every call first reads the lock blob (one HEAD), or starts from the blob as a kept state
//! says its last write left it ([`HeldState`]), and every grant is conditional on what that
//! read or state saw (its ETag), so storage refuses one that would make a second holder. Every new holder of a lock
//! gets a fencing token strictly larger than any before it of that lock (the rule is in
//! `lease/claim.rs`; tokens are per lock, two locks may issue the same one), and a holder that
//! extends keeps its own.
//!
//! Every call takes `now` only to date its requests when the transport has no clock of its
//! own ([`Transport::now`]); every expiry is judged by the storage server's `Date`. The rules,
//! what a failure leaves taken, and the storage round trips of each decision are written once,
//! in [docs/protocol.md](https://github.com/leasegate/leasegate/blob/main/docs/protocol.md).

mod claim;
pub mod native;
pub mod record;
mod snapshot;
mod steps;
mod types;

use steps::{gave_up, is_missing, may_have_granted, no_date, own_marks, refused, with_marks};
pub use types::*;

use std::time::{Duration, SystemTime};

use crate::names::{BlobName, ContainerName, LockName};
use crate::ops::{Condition, Lease, LeaseAction, Metadata, SetMetadata, WriteOutcome};
use crate::types::{unix_secs, LeaseDuration, LeaseId};
use crate::{Account, Counting, Error, Transport};

use crate::blob::BlobClient;
use claim::{Claim, Kind};
pub use claim::{MAX_LABEL_BYTES, MAX_TOKEN};
use snapshot::Read;

/// How many times a step that lost a race (a concurrent create, a compare-and-swap, an ETag
/// that moved) is tried again before giving up.
const MAX_ATTEMPTS: usize = 6;

/// The most step-down bars one lock blob keeps (see [`Locks::step_down`]).
pub const MAX_STEPPED_DOWN: usize = 8;

/// The longest window, in seconds (365 days).
pub const MAX_WINDOW_SECS: u64 = 365 * 24 * 3600;

/// Locks in one container, under one name prefix, reached through a [`Transport`].
#[derive(Debug, Clone)]
pub struct Locks<T> {
    client: BlobClient<T>,
    prefix: String,
}

impl<T: Transport> Locks<T> {
    /// Locks kept in `container` below the prefix `locks/`.
    pub fn new(transport: T, account: Account, container: ContainerName) -> Self {
        Locks::from_client(BlobClient::new(transport, account, container))
    }

    /// Locks kept in the client's container below the prefix `locks/`.
    pub fn from_client(client: BlobClient<T>) -> Self {
        Locks {
            client,
            prefix: "locks/".into(),
        }
    }

    /// Uses another blob name prefix (for example `gates/`).
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_string();
        self
    }

    /// The blob client the locks are kept through (for plain blob work beside them).
    pub fn client(&self) -> &BlobClient<T> {
        &self.client
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        self.client.transport()
    }

    /// The same locks (container and prefix) through a transport that counts the requests
    /// sent: a decision's storage round trips, for its log line.
    pub fn counting(&self) -> Locks<Counting<&T>> {
        Locks {
            client: BlobClient::new(
                Counting::new(self.client.transport()),
                self.client.account().clone(),
                self.client.container().clone(),
            ),
            prefix: self.prefix.clone(),
        }
    }

    /// The account.
    pub fn account(&self) -> &Account {
        self.client.account()
    }

    /// The container.
    pub fn container(&self) -> &ContainerName {
        self.client.container()
    }

    /// The blob that holds `lock`.
    pub fn blob_name(&self, lock: &LockName) -> Result<BlobName, Error> {
        lock.blob_name(&self.prefix)
    }

    /// Takes `lock` (or extends it, keeping its token, if `how.lease_id` holds it already) for
    /// `how.term`, starting from `how.start` (a read of its own, one the caller made, or a state
    /// kept of an earlier call), and returns the fencing token and what the caller may keep
    /// ([`Acquired::held_state`]). The rules and the round trips of each start are in
    /// docs/protocol.md (linked from the [module](self)); [`Acquiring`] says what each option
    /// changes.
    pub async fn acquire(
        &self,
        lock: &LockName,
        how: Acquiring<'_>,
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        let (term, lease_id, start) = (how.term, how.lease_id, how.start);
        let from_read = (None, false);
        let from = match start {
            Start::Read => from_read,
            Start::Seen(info) => (info.seen.clone(), false),
            Start::Held(held) => return self.extend_held(lock, how, held, now).await,
            Start::Acquired(acquired) => match acquired.held_state() {
                Some(held) => return self.extend_held(lock, how, &held, now).await,
                None => from_read,
            },
            Start::Kept(kept, date) => {
                // A record is taken from the kept state only when that state names nobody
                // (its holder's release left it so): one that names a holder is read first,
                // whether live (its release may have landed unanswered) or run out by `date`
                // (a date ahead of storage's would take it live). A state of the caller's own
                // holding reads first too (an extension keeps its token).
                let usable = !kept.is_held_by(lease_id)
                    && Claim::read(&kept.grant.metadata).is_ok_and(|c| match term {
                        Term::Native(_) => matches!(c.kind, Kind::Native(_)),
                        Term::Record(_) => c.kind == Kind::Record && c.holder.is_none(),
                    });
                match usable.then(|| kept.snapshot(date)).flatten() {
                    Some(seen) => (Some(seen), true),
                    None => from_read,
                }
            }
        };
        self.acquire_from(lock, &how, from, now).await
    }

    /// An extension from `held`, what the holder kept of its last call: the renew and the
    /// claim's new expiry, each conditional on `held`'s ETag; where that cannot tell the
    /// extension exactly (a stale state, a lease released, broken or run out), it acquires
    /// from a read, after the one refused request.
    async fn extend_held(
        &self,
        lock: &LockName,
        how: Acquiring<'_>,
        held: &HeldState,
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        let blob = self.blob_name(lock)?;
        let (id, label) = (how.lease_id, how.label);
        let extended = match how.term {
            Term::Native(duration) => {
                native::extend_at(self, &blob, duration, id, label, &held.grant, now).await
            }
            Term::Record(length) => {
                record::extend_at(self, &blob, length, id, label, &held.grant, now).await
            }
        };
        match extended.map_err(|e| self.name_lock(lock, e))? {
            Some(acquired) => Ok(Acquire::Acquired(acquired)),
            None => self.acquire_from(lock, &how, (None, false), now).await,
        }
    }

    async fn acquire_from(
        &self,
        lock: &LockName,
        how: &Acquiring<'_>,
        (seen, kept): (Option<Read>, bool),
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        let label = how.label;
        if label.len() > MAX_LABEL_BYTES || !label.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(Error::InvalidArgument(format!(
                "a holder label is at most {} printable ASCII characters",
                claim::MAX_LABEL_BYTES
            )));
        }
        let blob = self.blob_name(lock)?;
        let outcome = match how.term {
            Term::Native(duration) => {
                native::acquire(self, &blob, duration, how, (seen, kept), now).await
            }
            Term::Record(length) => record::acquire(self, &blob, length, how, seen, now).await,
        };
        outcome.map_err(|e| self.name_lock(lock, e))
    }

    /// The lock's path in its container as people name it (and the `leasegate` CLI takes it):
    /// the prefix and the lock name as given, e.g. `gates/tenant-a/lock`.
    pub fn lock_path(&self, lock: &LockName) -> String {
        format!("{}{}", self.prefix, lock.as_str())
    }

    /// A [`Error::CorruptLock`] about `lock` becomes an [`Error::UnusableLock`] naming it.
    fn name_lock(&self, lock: &LockName, e: Error) -> Error {
        match e {
            Error::CorruptLock(reason) => Error::UnusableLock {
                lock: self.lock_path(lock),
                container: self.client.container().as_str().to_string(),
                reason,
            },
            e => e,
        }
    }

    /// Sets marks on `lock` (metadata entries beside the claim, such as `progress=done`) if
    /// `lease_id` holds it: only its holder can, and only while it does. Other marks and the
    /// claim are kept; an empty value removes a mark. Returns whether they were written (`false`:
    /// not held, or held no more). Two requests: a HEAD and the write.
    pub async fn set_marks(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        marks: &Metadata,
        now: SystemTime,
    ) -> Result<bool, Error> {
        self.set_marks_of(lock, lease_id, marks, now)
            .await
            .map_err(|e| self.name_lock(lock, e))
    }

    async fn set_marks_of(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        marks: &Metadata,
        now: SystemTime,
    ) -> Result<bool, Error> {
        own_marks(marks)?;
        let blob = self.blob_name(lock)?;
        let snap = match self.read(&blob, now).await? {
            Read::Found(snap) => snap,
            Read::Missing { .. } => return Ok(false),
        };
        if !snap.held_by(lease_id) {
            return Ok(false);
        }
        let write = SetMetadata {
            container: self.client.container().clone(),
            blob,
            metadata: with_marks(&snap.metadata, marks),
            lease_id: snap.leased.then_some(lease_id),
            condition: Condition::IfMatch(snap.etag.clone()),
        };
        match self.client.execute(&write, now).await? {
            (WriteOutcome::Written(_), _) => Ok(true),
            (WriteOutcome::Refused(_), _) => Ok(false),
        }
    }

    /// [`Locks::set_marks`] by the holder that took `held` in this call: one request, the
    /// write conditional on the ETag its own last write left (the blob's metadata it wrote is
    /// known), instead of a HEAD and the write. If the blob changed since (or that ETag is not
    /// known), storage refuses and it goes as [`Locks::set_marks`] does. `held` then names the
    /// blob as this write left it, for a release from [`Start::Acquired`] after it.
    pub async fn set_marks_held(
        &self,
        lock: &LockName,
        held: &mut Acquired,
        marks: &Metadata,
        now: SystemTime,
    ) -> Result<bool, Error> {
        own_marks(marks)?;
        let grant = std::mem::take(&mut held.grant);
        if let Some(etag) = grant.etag {
            let metadata = with_marks(&grant.metadata, marks);
            let write = SetMetadata {
                container: self.client.container().clone(),
                blob: self.blob_name(lock)?,
                metadata: metadata.clone(),
                lease_id: grant.leased.then_some(held.lease_id),
                condition: Condition::IfMatch(etag),
            };
            match self.client.execute(&write, now).await {
                Ok((WriteOutcome::Written(w), _)) => {
                    held.marks = with_marks(&held.marks, marks);
                    held.grant = Grant {
                        etag: w.etag,
                        metadata,
                        leased: grant.leased,
                    };
                    return Ok(true);
                }
                // Changed since (or the lease is gone): read, as a holder without it does.
                Ok((WriteOutcome::Refused(_), _)) => {}
                Err(e) if is_missing(&e) => {}
                Err(e) => return Err(self.name_lock(lock, e)),
            }
        }
        self.set_marks(lock, held.lease_id, marks, now).await
    }

    /// Gives `lock` up like [`Locks::release`], and bars `lease_id` from taking it again for
    /// `bar` (by the server's clock): its acquires answer [`Acquire::Busy`] with
    /// `stepped_down_until` meanwhile, so another holder can take over. The bar is kept in the
    /// lock blob's metadata (`leasegate_stepped_down`, written under the lease before it is
    /// let go), so a holder with no memory between invocations keeps it too. Other ids'
    /// unexpired bars are kept (at most [`MAX_STEPPED_DOWN`], the latest).
    ///
    /// Round trips: three (a HEAD and the metadata write, then the release at the ETag that
    /// write left; the release reads first, +1, if the blob changed since).
    pub async fn step_down(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        bar: Duration,
        now: SystemTime,
    ) -> Result<Release, Error> {
        self.step_down_of(lock, lease_id, bar, now)
            .await
            .map_err(|e| self.name_lock(lock, e))
    }

    async fn step_down_of(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        bar: Duration,
        now: SystemTime,
    ) -> Result<Release, Error> {
        let blob = self.blob_name(lock)?;
        for _ in 0..MAX_ATTEMPTS {
            let snap = match self.read(&blob, now).await? {
                Read::Found(snap) => snap,
                Read::Missing { .. } => return Ok(Release::NotHeld),
            };
            if !snap.held_by(lease_id) {
                return Ok(Release::NotHeld);
            }
            let server_now = snap.server_secs();
            let mut bars: Vec<(LeaseId, u64)> = snap
                .stepped_down
                .iter()
                .copied()
                .filter(|(who, until)| *who != lease_id && *until > server_now)
                .collect();
            bars.push((lease_id, server_now.saturating_add(bar.as_secs().max(1))));
            let skip = bars.len().saturating_sub(MAX_STEPPED_DOWN);
            let mut metadata = snap.metadata.clone();
            claim::write_stepped_down(&bars[skip..], &mut metadata);
            let write = SetMetadata {
                container: self.client.container().clone(),
                blob: blob.clone(),
                metadata: metadata.clone(),
                lease_id: snap.leased.then_some(lease_id),
                condition: Condition::IfMatch(snap.etag.clone()),
            };
            match self.client.execute(&write, now).await? {
                (WriteOutcome::Written(w), _) => {
                    // The release at the ETag the bar's write left, no read first; not when
                    // the lock is a lease and a record both (a term switch whose lease could
                    // not be let go): the release reads and frees both.
                    let both = snap.leased && snap.record_of(lease_id).is_some();
                    let grant = Grant {
                        etag: w.etag.filter(|_| !both),
                        metadata,
                        leased: snap.leased,
                    };
                    return match self.release_at(&blob, lease_id, &grant, now).await? {
                        Some((released, _)) => Ok(released),
                        None => self.release_of(lock, lease_id, now).await,
                    };
                }
                (WriteOutcome::Refused(_), _) => continue,
            }
        }
        Err(gave_up("step down"))
    }

    /// Gives `lock` up if `lease_id` holds it, whichever term it was taken for (a native lease,
    /// a record, or both after a term switch whose lease could not be let go), starting from
    /// `start`. Safe to retry: a lock not held (any more) by `lease_id` answers
    /// [`Release::NotHeld`].
    ///
    /// From [`Start::Read`] (or [`Start::Seen`], [`Start::Kept`]): two requests, a HEAD and
    /// the release of the lease or the compare-and-swap of the record. From what the holder
    /// kept ([`Start::Held`]) or acquired in this call ([`Start::Acquired`]): one, conditional
    /// on that state's ETag; when storage refuses it, a read and the release as from a read.
    /// Also answers the lock blob as the release left it when that one request landed (a
    /// record cleared at a new ETag, a lease released at the same one): what the next holder
    /// may start from ([`Start::Kept`]); `None` when the release went by a read.
    pub async fn release(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        start: Start<'_>,
        now: SystemTime,
    ) -> Result<(Release, Option<HeldState>), Error> {
        let grant = match start {
            Start::Held(held) if held.is_held_by(lease_id) => Some(&held.grant),
            Start::Acquired(acquired) => Some(&acquired.grant),
            _ => None,
        };
        if let Some(grant) = grant {
            let blob = self.blob_name(lock)?;
            let landed = self
                .release_at(&blob, lease_id, grant, now)
                .await
                .map_err(|e| self.name_lock(lock, e))?;
            if let Some((released, grant)) = landed {
                return Ok((released, Some(HeldState { grant })));
            }
        }
        let released = self
            .release_of(lock, lease_id, now)
            .await
            .map_err(|e| self.name_lock(lock, e))?;
        Ok((released, None))
    }

    /// Releases `id`'s lock on `blob` with one request conditional on the ETag `grant` names:
    /// the lease's release, or the record's clearing, with the blob as it left it. `None` when
    /// storage refused it (the blob changed since, the lease is not ours) or the ETag is not
    /// known: read first, as a release does. A failure that may have landed is the answer (a
    /// read after it could not tell).
    async fn release_at(
        &self,
        blob: &BlobName,
        id: LeaseId,
        grant: &Grant,
        now: SystemTime,
    ) -> Result<Option<(Release, Grant)>, Error> {
        let Some(etag) = &grant.etag else {
            return Ok(None);
        };
        let condition = Condition::IfMatch(etag.clone());
        if grant.leased {
            let op = self
                .lease_op(blob, LeaseAction::Release(id))
                .with_condition(condition);
            // Storage also releases a lease that ran out untouched (it keeps an expired lease's
            // id until the blob is modified or leased again): held only if the release landed
            // while the claim still counted (through the second it names), as a read would say.
            return Ok(match self.client.execute(&op, now).await {
                Ok((crate::ops::LeaseOutcome::Released, date)) => {
                    let claim = Claim::read(&grant.metadata)?;
                    let landed = date.map_or(u64::MAX, unix_secs);
                    let infinite = claim.kind == Kind::Native(LeaseDuration::Infinite);
                    let left = Grant {
                        leased: false,
                        ..grant.clone()
                    };
                    Some(if infinite || landed <= claim.expires {
                        (Release::Released, left)
                    } else {
                        (Release::NotHeld, left)
                    })
                }
                Ok(_) => None,
                Err(e) if refused(&e) => None,
                // It may have landed (a lost answer, a 5xx): a read after it could not tell a
                // release of ours from a lock not held, so the failure is the answer.
                Err(e) => return Err(e),
            });
        }
        let claim = Claim::read(&grant.metadata)?;
        let mut metadata = grant.metadata.clone();
        claim.released().write(&mut metadata);
        let write = SetMetadata {
            container: self.client.container().clone(),
            blob: blob.clone(),
            metadata: metadata.clone(),
            lease_id: None,
            condition,
        };
        // Released if the record was live when the clearing landed (an expired one, untouched
        // since, is cleared all the same: not held, as a read would say).
        Ok(match self.client.execute(&write, now).await {
            Ok((WriteOutcome::Written(w), date)) => {
                let landed = w.server_date.or(date).map_or(u64::MAX, unix_secs);
                let left = Grant {
                    etag: w.etag,
                    metadata,
                    leased: false,
                };
                Some(if landed < claim.expires {
                    (Release::Released, left)
                } else {
                    (Release::NotHeld, left)
                })
            }
            Ok((WriteOutcome::Refused(_), _)) => None,
            Err(e) if refused(&e) => None,
            Err(e) => return Err(e),
        })
    }

    async fn release_of(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> Result<Release, Error> {
        let blob = self.blob_name(lock)?;
        let snap = match self.read(&blob, now).await? {
            Read::Found(snap) => snap,
            Read::Missing { .. } => return Ok(Release::NotHeld),
        };
        let mut released = false;
        if snap.leased {
            // Only the id that holds the lease can release it, whatever the claim says.
            released = native::release(self, &blob, lease_id, now).await? == Release::Released;
        }
        if snap.record_of(lease_id).is_some() && (released || !snap.leased) {
            released |= record::clear_at(self, &blob, &snap, now).await?;
        }
        Ok(if released {
            Release::Released
        } else {
            Release::NotHeld
        })
    }

    /// Ends whoever holds `lock`: breaks a native lease after `period` (0 to 60 s) and clears a
    /// live record at once. For operators and tests; holders should release.
    pub async fn break_lock(
        &self,
        lock: &LockName,
        period: u8,
        now: SystemTime,
    ) -> Result<(), Error> {
        let blob = self.blob_name(lock)?;
        let op = Lease::new(
            self.client.container().clone(),
            blob.clone(),
            LeaseAction::Break {
                period: Some(period),
            },
        );
        match self.client.execute(&op, now).await {
            Ok(_) => {}
            Err(e) if is_missing(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
        record::clear_any(self, &blob, now).await
    }

    /// Reads `lock`'s state with one HEAD, judged by the server's clock.
    pub async fn inspect(&self, lock: &LockName, now: SystemTime) -> Result<LockInfo, Error> {
        self.inspect_of(lock, now)
            .await
            .map_err(|e| self.name_lock(lock, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ETag;

    #[test]
    fn a_held_state_is_kept_as_json_and_read_back() {
        let state = HeldState {
            grant: Grant {
                etag: Some(ETag::new("\"0x8DC1\"")),
                metadata: [("leasegate_token", "7"), ("owner", "a \"b\"\tc")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                leased: true,
            },
        };
        assert_eq!(HeldState::from_json(&state.to_json()), None, "no holder");
        let id = LeaseId::from_random_bytes([7; 16]);
        let mut metadata = state.grant.metadata.clone();
        Claim {
            holder: Some(id),
            kind: Kind::Record,
            since: 1,
            expires: 2,
            token: 7,
            label: "node-a".into(),
        }
        .write(&mut metadata);
        let state = HeldState {
            grant: Grant {
                metadata,
                ..state.grant
            },
        };
        let kept = HeldState::from_json(&state.to_json()).unwrap();
        assert_eq!(kept, state);
        assert!(kept.is_held_by(id));
        assert!(!kept.is_held_by(LeaseId::from_random_bytes([8; 16])));
        // Its Debug (a log line's `{:?}`) names the claim but not the holder's lease id.
        let shown = format!("{kept:?}");
        assert!(!shown.contains(&id.to_string()), "{shown}");
        assert!(
            shown.contains("node-a") && shown.contains("<redacted>"),
            "{shown}"
        );
        let good = serde_json::from_str::<serde_json::Value>(&state.to_json()).unwrap();
        let with = |path: &str, v: serde_json::Value| {
            let mut bad = good.clone();
            *bad.pointer_mut(path).unwrap() = v;
            bad.to_string()
        };
        for bad in [
            "".to_string(),
            "{}".into(),
            "[1]".into(),
            with("/etag", serde_json::Value::Null),
            with("/etag", "a\"b".into()),
            with("/etag", "".into()),
            with("/leased", "yes".into()),
            with("/metadata/owner", 1.into()),
            with("/metadata/owner", "line\nbreak".into()),
            with("/metadata/leasegate_token", "seven".into()),
        ] {
            assert_eq!(HeldState::from_json(&bad), None, "{bad}");
        }
        let mut bad = good.clone();
        bad["metadata"]["bad name"] = "x".into();
        assert_eq!(HeldState::from_json(&bad.to_string()), None);
        // A record its holder released names nobody: kept all the same (a native claim
        // naming nobody is not).
        let mut metadata = state.grant.metadata.clone();
        Claim::read(&metadata)
            .unwrap()
            .released()
            .write(&mut metadata);
        let released = HeldState {
            grant: Grant {
                metadata,
                leased: false,
                ..state.grant.clone()
            },
        };
        let kept = HeldState::from_json(&released.to_json()).unwrap();
        assert_eq!(kept, released);
        assert!(!kept.is_held_by(id));
        let native = with("/metadata/leasegate_term", "30".into());
        let native = native.replace(&id.to_string(), "");
        assert_eq!(HeldState::from_json(&native), None, "{native}");
    }
}
