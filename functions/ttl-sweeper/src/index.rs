//! The expiry tag [`EXPIRES_TAG`]: the index beside the mark. The mark is the blob's
//! `TimeToLive` metadata; the tag says the same instant so that Find Blobs by Tags can find
//! the blob when it is due. Written by marking, by the migration, by the listing of
//! `ttl_find = both` (for marked blobs without it) and, under the sweeper's lease, by a find
//! that reads a blob whose metadata says otherwise (cleared, or set to the metadata's time).

use std::time::SystemTime;

use leasegate::ops::{tag_equals, GetBlobTags, IfTags, Refusal, SetBlobTags, Tags, WriteOutcome};
use leasegate::BlobClient;
use leasegate::{BlobName, ContainerName, LeaseId, Transport};

use crate::EXPIRES_TAG;

/// A blob's index tags as its caller knows them.
pub(crate) enum Existing {
    /// All of them (a listing with tags; a found blob whose only tag is the one it was found
    /// by).
    Known(Tags),
    /// Only how many there are (`None`: not even that): read first when there are any.
    Counted(Option<u32>),
}

impl Existing {
    /// `tags` when known, else their count.
    pub(crate) fn of(tags: Option<Tags>, count: Option<u32>) -> Existing {
        match tags {
            Some(tags) => Existing::Known(tags),
            None => Existing::Counted(count),
        }
    }
}

/// Sets the expiry tag to `value` (`None`: removes it), keeping the blob's other index tags
/// (`existing`). Under `lease`, when the caller holds the blob's lease. `false` when the tags
/// already said so (nothing written).
pub(crate) async fn set_expiry_tag<S: Transport>(
    blobs: &BlobClient<S>,
    container: &ContainerName,
    blob: &BlobName,
    existing: Existing,
    value: Option<&str>,
    lease: Option<LeaseId>,
    now: SystemTime,
) -> Result<bool, leasegate::Error> {
    let mut tags = match existing {
        Existing::Known(tags) => tags,
        Existing::Counted(count) if count.unwrap_or(0) == 0 => Tags::new(),
        Existing::Counted(_) => {
            let get = GetBlobTags {
                container: container.clone(),
                blob: blob.clone(),
            };
            blobs.execute(&get, now).await?.0.unwrap_or_default()
        }
    };
    if tags.get(EXPIRES_TAG).map(String::as_str) == value {
        return Ok(false);
    }
    match value {
        Some(v) => tags.insert(EXPIRES_TAG.to_string(), v.to_string()),
        None => tags.remove(EXPIRES_TAG),
    };
    let set = SetBlobTags {
        container: container.clone(),
        blob: blob.clone(),
        tags,
        lease_id: lease,
    };
    match blobs.execute(&set, now).await?.0 {
        WriteOutcome::Written(_) => Ok(true),
        WriteOutcome::Refused(r) => Err(leasegate::Error::InvalidArgument(format!(
            "storage refused the expiry tag ({r:?})"
        ))),
    }
}

/// Removes the expiry tag of `blob` (keeping its other tags) unless it changed since it was
/// read: the write carries `x-ms-if-tags` on the value read, so a re-mark that landed meanwhile
/// (its tag written after this unmark's metadata) is kept, not undone. `Ok(true)`: removed;
/// `Ok(false)`: there was none, or a re-mark won.
pub(crate) async fn clear_expiry_tag_unless_remarked<S: Transport>(
    blobs: &BlobClient<S>,
    container: &ContainerName,
    blob: &BlobName,
    tag_count: Option<u32>,
    now: SystemTime,
) -> Result<bool, leasegate::Error> {
    if tag_count == Some(0) {
        return Ok(false);
    }
    let get = GetBlobTags {
        container: container.clone(),
        blob: blob.clone(),
    };
    let mut tags = blobs.execute(&get, now).await?.0.unwrap_or_default();
    let Some(read) = tags.remove(EXPIRES_TAG) else {
        return Ok(false);
    };
    let set = IfTags {
        op: SetBlobTags {
            container: container.clone(),
            blob: blob.clone(),
            tags,
            lease_id: None,
        },
        condition: tag_equals(EXPIRES_TAG, &read)?,
    };
    match blobs.execute(&set, now).await?.0 {
        WriteOutcome::Written(_) => Ok(true),
        WriteOutcome::Refused(Refusal::ConditionFailed) => Ok(false),
        WriteOutcome::Refused(r) => Err(leasegate::Error::InvalidArgument(format!(
            "storage refused the expiry tag ({r:?})"
        ))),
    }
}
