//! The expiry tag [`EXPIRES_TAG`]: the index beside the mark. The mark is the blob's
//! `TimeToLive` metadata; the tag says the same instant so that Find Blobs by Tags can find
//! the blob when it is due. Written by marking, by the migration, by the listing of
//! `ttl_find = both` (for marked blobs without it) and, under the sweeper's lease, by a find
//! that reads a blob whose metadata says otherwise (cleared, or set to the metadata's time).

use std::time::SystemTime;

use leasegate::ops::{GetBlobTags, SetBlobTags, Tags, WriteOutcome};
use leasegate::BlobClient;
use leasegate::{BlobName, ContainerName, LeaseId, Transport};

use crate::EXPIRES_TAG;

/// Sets the expiry tag to `value` (`None`: removes it), keeping the blob's other index tags:
/// `known`, when the caller knows them all (a listing with tags; a found blob whose only tag is
/// the one it was found by), else read first when `tag_count` counts any. Under `lease`, when
/// the caller holds the blob's lease. `false` when the tags already said so (nothing written).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn set_expiry_tag<S: Transport>(
    blobs: &BlobClient<S>,
    container: &ContainerName,
    blob: &BlobName,
    known: Option<Tags>,
    tag_count: Option<u32>,
    value: Option<&str>,
    lease: Option<LeaseId>,
    now: SystemTime,
) -> Result<bool, leasegate::Error> {
    let mut tags = match known {
        Some(tags) => tags,
        None if tag_count.unwrap_or(0) == 0 => Tags::new(),
        None => {
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
