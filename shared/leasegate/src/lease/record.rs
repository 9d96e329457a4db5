//! Lease records: windows of any whole number of seconds, sharing each lock with native leases.
//!
//! The record is the holder's [claim](super::claim) in the lock blob's metadata, with an expiry
//! in the storage server's seconds. To take a lock: read the blob (HEAD); if nobody holds it (no
//! lease, no live record of another), write the record with `If-Match` on the ETag read and
//! **without a lease id**: a record written in between moves the ETag, and a lease taken in
//! between makes storage refuse a write without its id, so either way the write fails and
//! nobody is granted twice. Extending one's own record moves its expiry and keeps its token.
//!
//! A record only gives time if the write lands before the expiry it wrote: when the
//! compare-and-swap's own `Date` is at or past it (a 1 s record behind a slow answer), the
//! caller is not told it acquired.

use std::time::{Duration, SystemTime};

use super::claim::first_token;
use super::{
    at, is_missing, may_have_granted, no_date, Acquire, Acquired, Claim, Kind, Locks, Read,
    Release, Snapshot, Tenure, MAX_ATTEMPTS, MAX_WINDOW_SECS,
};
use crate::names::BlobName;
use crate::ops::{Condition, Refusal, SetMetadata, WriteOutcome};
use crate::types::{unix_secs, LeaseId};
use crate::{Error, Transport};

/// Takes or extends a record of `length` on `blob` for `id`.
pub(super) async fn acquire<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    length: Duration,
    id: LeaseId,
    now: SystemTime,
) -> Result<Acquire, Error> {
    let secs = length.as_secs();
    if length.subsec_nanos() != 0 || !(1..=MAX_WINDOW_SECS).contains(&secs) {
        return Err(Error::InvalidArgument(format!(
            "a record lasts a whole number of seconds from 1 to {MAX_WINDOW_SECS} (got {length:?})"
        )));
    }
    for _ in 0..MAX_ATTEMPTS {
        let snap = match locks.read(blob, now).await? {
            Read::Found(snap) => snap,
            Read::Missing(date) => {
                let start = unix_secs(date);
                let claim = Claim {
                    holder: Some(id),
                    kind: Kind::Record,
                    since: start,
                    expires: start + secs,
                    token: first_token(date)?,
                };
                match locks.create(blob, claim, now).await? {
                    Some(created) => {
                        let tenure = Tenure {
                            token: claim.token,
                            since: start,
                            extended: false,
                        };
                        return Ok(granted(id, claim, tenure, created.server_date));
                    }
                    None => continue,
                }
            }
        };
        if let Some(busy) = snap.busy_for(id) {
            return Ok(busy);
        }
        let tenure = snap.tenure_for(id)?;
        let claim = Claim {
            holder: Some(id),
            kind: Kind::Record,
            since: tenure.since,
            expires: snap.server_secs() + secs,
            token: tenure.token,
        };
        // The caller's own native lease holds the blob: it switches to a record under that
        // lease, then lets the lease go.
        let switching = snap.native_claim().is_some();
        let write = SetMetadata {
            container: locks.container.clone(),
            blob: blob.clone(),
            metadata: snap.with_claim(&claim),
            lease_id: switching.then_some(id),
            condition: Condition::IfMatch(snap.etag.clone()),
        };
        match locks.execute(&write, now).await {
            Ok((WriteOutcome::Written(w), date)) => {
                if switching {
                    super::native::give_back(locks, blob, id, now).await;
                }
                let written = w.server_date.or(date).ok_or_else(no_date)?;
                return Ok(granted(id, claim, tenure, written));
            }
            Ok((WriteOutcome::Refused(Refusal::ConditionFailed), _)) => continue,
            // Leased by someone since the read.
            Ok((WriteOutcome::Refused(_), _)) => return Ok(Acquire::Busy { retry_after: None }),
            Err(e) if is_missing(&e) => continue,
            Err(e) => {
                if may_have_granted(&e) {
                    let _ = clear(locks, blob, Some(id), now).await;
                }
                return Err(e);
            }
        }
    }
    Err(super::gave_up("acquire"))
}

/// The answer for a record written at `written` (the write's server `Date`): acquired, unless
/// the record had already run out when it landed.
fn granted(id: LeaseId, claim: Claim, tenure: Tenure, written: SystemTime) -> Acquire {
    if unix_secs(written) >= claim.expires {
        return Acquire::Busy {
            retry_after: Some(Duration::ZERO),
        };
    }
    Acquire::Acquired(Acquired {
        lease_id: id,
        fencing_token: Some(claim.token),
        expires_at: Some(at(claim.expires)),
        server_date: written,
        since: at(tenure.since),
        extended: tenure.extended,
    })
}

/// Clears the live record of `blob` (keeping its token) if `holder` holds it, or whoever does
/// when `holder` is `None`: a HEAD and a compare-and-swap.
pub(super) async fn clear<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    holder: Option<LeaseId>,
    now: SystemTime,
) -> Result<Release, Error> {
    for _ in 0..MAX_ATTEMPTS {
        let snap: Snapshot = match locks.read(blob, now).await? {
            Read::Found(snap) => snap,
            Read::Missing(_) => return Ok(Release::NotHeld),
        };
        let Some(live) = snap.live_record() else {
            return Ok(Release::NotHeld);
        };
        if holder.is_some() && live.holder != holder {
            return Ok(Release::NotHeld);
        }
        let write = SetMetadata {
            container: locks.container.clone(),
            blob: blob.clone(),
            metadata: snap.with_claim(&live.released()),
            lease_id: None,
            condition: Condition::IfMatch(snap.etag.clone()),
        };
        match locks.execute(&write, now).await {
            Ok((WriteOutcome::Written(_), _)) => return Ok(Release::Released),
            Ok((WriteOutcome::Refused(Refusal::ConditionFailed), _)) => continue,
            Ok((WriteOutcome::Refused(_), _)) => return Ok(Release::NotHeld),
            Err(e) if is_missing(&e) => return Ok(Release::NotHeld),
            Err(e) => return Err(e),
        }
    }
    Err(super::gave_up("clear the lease record"))
}
