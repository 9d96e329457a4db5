//! The verbs "write this blob" and "commit this table batch" **fenced**: storage itself
//! refuses the write once a newer holder of the lock wrote, so a holder that was paused past
//! its lease (a garbage collection, a frozen VM, a slow batch) cannot overwrite its successor.
//!
//! A holder takes a lock (any verb that hands out a fencing token: [`crate::once`],
//! [`crate::leader`], or the core's [`leasegate::lease::Locks`]), makes its [`Fence`] from the
//! lock's key and its token ([`fence`]), and writes through [`write_blob`] and
//! [`table_batch`]. A refused write is [`Fenced::FencedOut`], an outcome: nothing of that call
//! landed, and the holder should write nothing more (its answer: 409 `fenced_out`). The rules
//! are the core's ([`leasegate::fence`]); docs/protocol.md gives them, their cost (nothing
//! extra on a blob write; one read of a partition's fence entity per tenure) and what they
//! do not cover (writes made without the fence, side effects outside storage).
//!
//! **Claim first.** Each blob and each partition keeps its own fence: write every blob and
//! claim every partition ([`claim_partition`]) the tenure will write before its first data
//! write, so that a newer holder's claims fence an older one out of all of them (the ledger
//! writes its blob first, then claims its partition).
//!
//! Each call writes one decision line ([`crate::log_decision`]) with the verb `fenced_write`,
//! `fenced_claim` or `fenced_batch`, the blob or partition as its key, `written`, `claimed`,
//! `fenced_out` or `refused` (a batch whose own operation storage refused), and the holder's
//! token.

use std::time::Instant;

use leasegate::lease::Locks;
use leasegate::ops::{PutBlob, Written};
use leasegate::table::{Batch, TableClient, TableName};
use leasegate::{BlobClient, Counting, Error, LockName, Transport};

pub use leasegate::fence::{BatchFenced, Fence, Fenced, TableFence, FENCING_TOKEN};

use crate::{log_verb, web, Context};

/// The fence of the holder of `lock` (in `locks`' container and prefix) with `token`: the
/// lock's key is its lock blob's container and path.
pub fn fence<T: Transport>(locks: &Locks<T>, lock: &LockName, token: u64) -> Fence {
    Fence::new(
        &format!("{}/{}", locks.container(), locks.lock_path(lock)),
        token,
    )
}

/// Writes `put` (a block blob with no condition of its own) fenced
/// ([`leasegate::fence::write_blob`]): refused once a newer holder of the fence's lock wrote
/// the blob fenced.
pub async fn write_blob<C, T: Transport>(
    ctx: &Context<'_, C>,
    blobs: &BlobClient<T>,
    fence: &Fence,
    put: PutBlob,
) -> Result<Fenced<Written>, Error> {
    let started = Instant::now();
    let counted = BlobClient::new(
        Counting::new(blobs.transport()),
        blobs.account().clone(),
        blobs.container().clone(),
    );
    let key = format!("{}/{}", put.container, put.blob.as_str());
    let outcome = leasegate::fence::write_blob(&counted, fence, put, ctx.now).await;
    let decision = match &outcome {
        Ok(Fenced::Written(_)) => "written",
        Ok(Fenced::FencedOut { .. }) => "fenced_out",
        Err(e) => web::storage_error_code(e),
    };
    log_verb(
        ctx.log_decisions,
        "fenced_write",
        &key,
        None,
        (decision, Some(fence.token())),
        counted.transport().sent(),
        started,
    );
    outcome
}

/// Advances the fence of a partition to the holder's token before its first data write there
/// ([`leasegate::fence::claim_partition`]): claim every partition, and write every blob, a
/// tenure will write before the first data write, so that a newer holder's claims fence this
/// holder out of all of them.
pub async fn claim_partition<C, T: Transport>(
    ctx: &Context<'_, C>,
    tables: &TableClient<T>,
    fence: &mut TableFence,
    table: &TableName,
    partition: &str,
) -> Result<Fenced<()>, Error> {
    let started = Instant::now();
    let counted =
        TableClient::try_new(Counting::new(tables.transport()), tables.account().clone())?;
    let outcome =
        leasegate::fence::claim_partition(&counted, fence, table, partition, ctx.now).await;
    let decision = match &outcome {
        Ok(Fenced::Written(())) => "claimed",
        Ok(Fenced::FencedOut { .. }) => "fenced_out",
        Err(e) => web::storage_error_code(e),
    };
    let key = format!("{}/{partition}", table.as_str());
    log_verb(
        ctx.log_decisions,
        "fenced_claim",
        &key,
        None,
        (decision, Some(fence.fence().token())),
        counted.transport().sent(),
        started,
    );
    outcome
}

/// Commits `batch` fenced ([`leasegate::fence::table_batch`]): the partition's fence entity
/// rides in the same transaction, so a stale holder's batch changes nothing. Keep one
/// [`TableFence`] for the holder's tenure.
pub async fn table_batch<C, T: Transport>(
    ctx: &Context<'_, C>,
    tables: &TableClient<T>,
    fence: &mut TableFence,
    batch: &Batch,
) -> Result<Fenced<BatchFenced>, Error> {
    let started = Instant::now();
    let counted =
        TableClient::try_new(Counting::new(tables.transport()), tables.account().clone())?;
    let outcome = leasegate::fence::table_batch(&counted, fence, batch, ctx.now).await;
    let decision = match &outcome {
        Ok(Fenced::Written(BatchFenced::Committed(_))) => "written",
        Ok(Fenced::Written(BatchFenced::Refused { .. })) => "refused",
        Ok(Fenced::FencedOut { .. }) => "fenced_out",
        Err(e) => web::storage_error_code(e),
    };
    let key = format!("{}/{}", batch.table().as_str(), batch.partition_key());
    log_verb(
        ctx.log_decisions,
        "fenced_batch",
        &key,
        None,
        (decision, Some(fence.fence().token())),
        counted.transport().sent(),
        started,
    );
    outcome
}
