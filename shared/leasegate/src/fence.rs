//! Fenced writes: storage itself refuses the write of a holder whose lock a newer holder took.
//!
//! A fencing token protects only a receiver that keeps the highest token it has seen. A blob
//! or a table partition in the lock's own account can keep it for the holder, and compare in
//! the same request as the write:
//!
//! * **A blob** ([`write_blob`]): the Put Blob carries `x-ms-if-tags` (the blob's fence tag is
//!   at most the holder's token, and names the same lock) and `x-ms-tags` (the fence tag set to
//!   the holder's token). Tags compare as strings, so the token is zero-padded to
//!   [`TOKEN_WIDTH`] digits. A blob that does not exist yet has no tag to compare: its first
//!   write is a create (`If-None-Match: *`) carrying the tags, and whoever loses that race
//!   writes through the tag condition, or is refused by it. The fence rides on the write: no
//!   request more while nothing refuses it.
//! * **A table partition** ([`table_batch`]): an entity group transaction that updates the
//!   partition's fence entity (`If-Match` the ETag read while its token was at most the
//!   holder's) together with the caller's operations. The batch is atomic, so a stale holder's
//!   batch changes nothing. One read of the fence entity per holder tenure ([`TableFence`]).
//!
//! The rule (per lock, per resource): once a holder's fenced write landed on a blob or a
//! partition, no fenced write of an older holder (a smaller token) lands there. Claim every
//! resource a tenure will write before its first data write ([`claim_partition`], a blob's
//! first write) so that a newer holder's claims fence an older one out of all of them. What it
//! does not cover: writes made without the fence, side effects outside storage, a fenced blob
//! or table deleted (its fence goes with it), two tenures of the same token. A refused write is [`Fenced::FencedOut`], not an error:
//! nothing of that call landed. docs/protocol.md gives the rule, its cost and Azurite's
//! differences from Azure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::ops::{Condition, GetBlobTags, IfTags, PutBlob, Refusal, Tags, WriteOutcome, Written};
use crate::table::{
    Batch, BatchItem, BatchOperation, BatchOutcome, EdmValue, Entity, EntityTag, GetEntity,
    IfMatch, TableClient, TableName, TableRefusal,
};
use crate::{BlobClient, Error, StatusCode, Transport};

/// The index tag holding the token of the newest holder that wrote a fenced blob.
pub const FENCE_TAG: &str = "leasegate_fence";
/// The index tag naming (by a digest) the lock that fences a blob: tokens of one lock compare.
pub const FENCE_LOCK_TAG: &str = "leasegate_fence_lock";
/// The fence entity's RowKey in a partition: this prefix and the lock's digest.
pub const FENCE_ROW_PREFIX: &str = "leasegate-fence-";
/// The fence entity's property holding the newest holder's token (an `Edm.Int64`), also the
/// name the ledger example gives each entity's token.
pub const FENCING_TOKEN: &str = "fencingToken";
/// Digits of a token in a fence tag: every `u64` fits, so string order is number order.
pub const TOKEN_WIDTH: usize = 20;

/// A token as a fence tag holds it: zero-padded to [`TOKEN_WIDTH`] digits.
pub fn fence_value(token: u64) -> String {
    format!("{token:0width$}", width = TOKEN_WIDTH)
}

/// One holder's fence: the lock it holds (its key) and its fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    lock: String,
    token: u64,
}

impl Fence {
    /// The fence of the holder of the lock whose key is `lock_key` (the lock blob's path in
    /// its container, [`crate::lease::Locks::lock_path`], with the container) with `token`.
    /// Only the key's digest reaches storage.
    pub fn new(lock_key: &str, token: u64) -> Fence {
        let digest = Sha256::digest(lock_key.as_bytes());
        let lock = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        Fence { lock, token }
    }

    /// The holder's token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lock's digest, as the blob's [`FENCE_LOCK_TAG`] and the fence entity's RowKey hold it.
    pub fn lock_digest(&self) -> &str {
        &self.lock
    }

    /// The condition of a fenced write: the blob is this lock's, its token at most ours.
    fn tag_condition(&self) -> String {
        format!(
            "\"{FENCE_LOCK_TAG}\" = '{}' AND \"{FENCE_TAG}\" <= '{}'",
            self.lock,
            fence_value(self.token)
        )
    }

    /// The fence entity's RowKey.
    pub fn row_key(&self) -> String {
        format!("{FENCE_ROW_PREFIX}{}", self.lock)
    }
}

/// What became of a fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fenced<T> {
    /// The write landed.
    Written(T),
    /// Storage refused it: a newer holder of the lock wrote (its token, where storage said).
    /// Nothing of this call landed.
    FencedOut {
        /// The token the blob or the partition's fence holds now.
        newer_token: Option<u64>,
    },
}

/// Writes `put` (a block blob, with no condition of its own) fenced by `fence`: storage
/// refuses it once a newer holder of the lock wrote the blob fenced. The blob's tags become
/// `put`'s and the fence's two. One request when the blob is this lock's; a first write (no
/// blob yet) costs one more; a refused one, up to three more (the last reads the tags, to
/// tell a newer holder from a blob that was never fenced, which is an error).
pub async fn write_blob<T: Transport>(
    client: &BlobClient<T>,
    fence: &Fence,
    put: PutBlob,
    now: SystemTime,
) -> Result<Fenced<Written>, Error> {
    if put.condition != Condition::None {
        return Err(Error::InvalidArgument(
            "a fenced write carries no condition of its own (Azurite would check only that one)"
                .into(),
        ));
    }
    if put.tags.contains_key(FENCE_TAG) || put.tags.contains_key(FENCE_LOCK_TAG) {
        return Err(Error::InvalidArgument(format!(
            "the tags {FENCE_TAG} and {FENCE_LOCK_TAG} are the fence's"
        )));
    }
    let mut tags: Tags = put.tags.clone();
    tags.insert(FENCE_TAG.into(), fence_value(fence.token));
    tags.insert(FENCE_LOCK_TAG.into(), fence.lock.clone());
    let (container, blob) = (put.container.clone(), put.blob.clone());
    let put = put.with_tags(tags);
    // The tag condition rides alone: Azurite checks only the other condition when two ride.
    let tagged = IfTags {
        op: put.clone(),
        condition: fence.tag_condition(),
    };
    let create = put.with_condition(Condition::IfNotExists);
    if let Some(w) = written(client.execute(&tagged, now).await?.0)? {
        return Ok(Fenced::Written(w));
    }
    // Refused: a newer holder's blob, another lock's, an unfenced one, or (on Azure) none yet.
    match client.execute(&create, now).await?.0 {
        WriteOutcome::Written(w) => return Ok(Fenced::Written(w)),
        WriteOutcome::Refused(Refusal::AlreadyExists) => {}
        WriteOutcome::Refused(other) => return Err(leased(other)),
    }
    // The blob exists: another holder's first write may have just made it.
    if let Some(w) = written(client.execute(&tagged, now).await?.0)? {
        return Ok(Fenced::Written(w));
    }
    let (tags, _) = client
        .execute(&GetBlobTags { container, blob }, now)
        .await?;
    let tags = tags.unwrap_or_default();
    let newer = tags.get(FENCE_TAG).and_then(|t| t.parse::<u64>().ok());
    match (tags.get(FENCE_LOCK_TAG), newer) {
        (Some(lock), Some(newer)) if *lock == fence.lock && newer > fence.token => {
            Ok(Fenced::FencedOut {
                newer_token: Some(newer),
            })
        }
        (Some(lock), Some(_)) if *lock == fence.lock => Err(Error::unexpected(
            StatusCode::PRECONDITION_FAILED,
            "the blob's fence moved during the write; nothing was written, ask again",
        )),
        (Some(_), _) => Err(Error::InvalidArgument(
            "the blob is fenced by another lock; nothing was written".into(),
        )),
        (None, _) => Err(Error::InvalidArgument(format!(
            "the blob exists without a fence (written without one); nothing was written: \
             delete it, or tag it {FENCE_TAG}={} {FENCE_LOCK_TAG}={} once",
            fence_value(0),
            fence.lock
        ))),
    }
}

/// A tag-conditioned write's outcome: `None` when the tag condition refused it.
fn written(outcome: WriteOutcome) -> Result<Option<Written>, Error> {
    match outcome {
        WriteOutcome::Written(w) => Ok(Some(w)),
        WriteOutcome::Refused(Refusal::ConditionFailed) => Ok(None),
        WriteOutcome::Refused(other) => Err(leased(other)),
    }
}

fn leased(refusal: Refusal) -> Error {
    Error::InvalidArgument(format!(
        "the blob refused the write ({refusal:?}): a fenced blob is not leased"
    ))
}

/// A holder's table fences for one tenure: per partition, the fence entity's ETag since this
/// holder last read or wrote it. Keep one for the tenure (an invocation), so that the fence
/// entity is read once per partition.
#[derive(Debug, Clone)]
pub struct TableFence {
    fence: Fence,
    seen: BTreeMap<(String, String), Seen>,
    /// The partitions whose fence entity this tenure saw at its token or wrote: one found
    /// missing since was deleted (a reset this holder must not take for a fresh partition).
    touched: BTreeSet<(String, String)>,
}

#[derive(Debug, Clone)]
enum Seen {
    /// No fence entity yet: the batch inserts it.
    Absent,
    /// The fence entity at this ETag, its token at most the holder's.
    At(EntityTag),
}

/// What became of a fenced batch whose fence held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchFenced {
    /// Every operation of the caller's batch was applied: their answers, in order.
    Committed(Vec<BatchItem>),
    /// One of the caller's operations was refused (its index in the caller's batch), so
    /// nothing was applied; the fence held.
    Refused {
        /// The caller's operation storage named.
        index: Option<usize>,
        /// Why.
        refusal: TableRefusal,
    },
}

impl TableFence {
    /// `fence`'s table fences, none read yet.
    pub fn new(fence: Fence) -> TableFence {
        TableFence {
            fence,
            seen: BTreeMap::new(),
            touched: BTreeSet::new(),
        }
    }

    /// The holder's fence.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }
}

/// Commits `batch` (at most 99 operations: the fence entity's update is the hundredth) only
/// while no newer holder of `fence`'s lock has written the partition fenced. One request (and
/// a read of the fence entity first, once per partition per tenure).
pub async fn table_batch<T: Transport>(
    client: &TableClient<T>,
    fence: &mut TableFence,
    batch: &Batch,
    now: SystemTime,
) -> Result<Fenced<BatchFenced>, Error> {
    let table = batch.table().clone();
    let partition = batch.partition_key().to_string();
    let key = (table.as_str().to_string(), partition.clone());
    let row = fence.fence.row_key();
    if batch
        .operations()
        .iter()
        .any(|op| op.row_key().starts_with(FENCE_ROW_PREFIX))
    {
        return Err(Error::InvalidArgument(format!(
            "RowKeys starting {FENCE_ROW_PREFIX} are the fences'"
        )));
    }
    // Twice at most: a fence that moved since it was read is read again (a newer holder:
    // fenced out; the holder's own write whose answer was lost: go on from it).
    for _ in 0..2 {
        let seen = match fence.seen.remove(&key) {
            Some(seen) => seen,
            None => {
                let read = read_fence(client, &table, &partition, &row, now).await?;
                let reset = read.token.is_none() && fence.touched.contains(&key);
                if reset || read.token.is_some_and(|t| t > fence.fence.token) {
                    // A newer holder's fence, or this tenure's own deleted since (whoever
                    // deleted it may have let a newer holder write): fail closed.
                    return Ok(Fenced::FencedOut {
                        newer_token: read.token,
                    });
                }
                if read.token.is_some() {
                    fence.touched.insert(key.clone());
                }
                read.seen
            }
        };
        let entity = Entity::new(partition.clone(), row.clone()).with(
            FENCING_TOKEN,
            EdmValue::Int64(token_i64(fence.fence.token)?),
        );
        let fence_op = match &seen {
            Seen::Absent => BatchOperation::Insert(entity),
            Seen::At(etag) => BatchOperation::Update(entity, IfMatch::ETag(etag.clone())),
        };
        let mut fenced = Batch::new(table.clone(), partition.clone())?.with(fence_op)?;
        for op in batch.operations() {
            fenced.push(op.clone())?;
        }
        match client.execute(&fenced, now).await?.0 {
            BatchOutcome::Committed(mut items) => {
                let fence_item = items.remove(0);
                fence.touched.insert(key.clone());
                if let Some(etag) = fence_item.etag {
                    fence.seen.insert(key, Seen::At(etag));
                }
                return Ok(Fenced::Written(BatchFenced::Committed(items)));
            }
            BatchOutcome::Refused {
                index: Some(index),
                refusal,
            } if index > 0 => {
                // Nothing applied: the fence is where it was.
                fence.seen.insert(key, seen);
                return Ok(Fenced::Written(BatchFenced::Refused {
                    index: Some(index - 1),
                    refusal,
                }));
            }
            // The fence's operation (or one storage did not name): read the fence again.
            BatchOutcome::Refused { .. } => continue,
        }
    }
    Err(Error::unexpected(
        StatusCode::PRECONDITION_FAILED,
        "the partition's fence kept moving; nothing was written, ask again",
    ))
}

/// Advances the fence of `partition` in `table` to `fence`'s token, writing nothing else: a
/// batch of the fence entity's update alone (with its read, 2 requests; the tenure's later
/// batches then cost 1). Claim every partition (and write every blob) a tenure will write
/// **before its first data write**, so that a newer holder's first write anywhere fences this
/// holder everywhere: otherwise the rule holds per partition and per blob, and a holder paused
/// between two resources still writes the second after a newer holder wrote the first.
pub async fn claim_partition<T: Transport>(
    client: &TableClient<T>,
    fence: &mut TableFence,
    table: &TableName,
    partition: &str,
    now: SystemTime,
) -> Result<Fenced<()>, Error> {
    let nothing = Batch::new(table.clone(), partition)?;
    Ok(match table_batch(client, fence, &nothing, now).await? {
        Fenced::Written(_) => Fenced::Written(()),
        Fenced::FencedOut { newer_token } => Fenced::FencedOut { newer_token },
    })
}

/// The fence entity as read: absent, or at an ETag with a token.
struct Read {
    seen: Seen,
    token: Option<u64>,
}

async fn read_fence<T: Transport>(
    client: &TableClient<T>,
    table: &TableName,
    partition: &str,
    row: &str,
    now: SystemTime,
) -> Result<Read, Error> {
    let get = GetEntity {
        table: table.clone(),
        partition_key: partition.to_string(),
        row_key: row.to_string(),
        select: vec![FENCING_TOKEN.to_string()],
    };
    let Some(stored) = client.execute(&get, now).await?.0 else {
        return Ok(Read {
            seen: Seen::Absent,
            token: None,
        });
    };
    let token = match stored.entity.get(FENCING_TOKEN) {
        Some(EdmValue::Int64(t)) => u64::try_from(*t).ok(),
        Some(EdmValue::String(s)) => s.parse().ok(),
        _ => None,
    };
    match (token, stored.etag) {
        (Some(token), Some(etag)) => Ok(Read {
            seen: Seen::At(etag),
            token: Some(token),
        }),
        _ => Err(Error::unexpected(
            StatusCode::OK,
            format!("the partition's fence entity has no {FENCING_TOKEN} or no ETag"),
        )),
    }
}

fn token_i64(token: u64) -> Result<i64, Error> {
    i64::try_from(token).map_err(|_| {
        Error::InvalidArgument("a fencing token above i64::MAX cannot fence a table".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_pad_so_that_string_order_is_number_order() {
        assert_eq!(fence_value(7), "00000000000000000007");
        assert_eq!(fence_value(u64::MAX).len(), TOKEN_WIDTH);
        let mut tokens = [9u64, 10, 65_536, 1, u64::MAX, 0];
        let mut padded: Vec<String> = tokens.iter().map(|t| fence_value(*t)).collect();
        tokens.sort();
        padded.sort();
        let back: Vec<u64> = padded.iter().map(|p| p.parse().unwrap()).collect();
        assert_eq!(back, tokens);
    }

    #[test]
    fn a_fence_names_its_lock_by_a_digest_only() {
        let a = Fence::new("leasegate/ledger/acme", 7);
        let b = Fence::new("leasegate/ledger/other", 7);
        assert_ne!(a.lock_digest(), b.lock_digest());
        assert_eq!(a.lock_digest().len(), 32);
        assert!(!a.tag_condition().contains("acme"));
        assert_eq!(
            a.tag_condition(),
            format!(
                "\"leasegate_fence_lock\" = '{}' AND \"leasegate_fence\" <= '00000000000000000007'",
                a.lock_digest()
            )
        );
        assert!(a.row_key().starts_with(FENCE_ROW_PREFIX));
        crate::table::entity::check_key("RowKey", &a.row_key()).unwrap();
        crate::ops::check_tag(FENCE_LOCK_TAG, a.lock_digest()).unwrap();
    }
}
