//! The fence protocol: the core's own fenced writes (`leasegate::fence::write_blob`, a Put
//! Blob under `x-ms-if-tags` that sets the fence tag, and `leasegate::fence::table_batch`, an
//! entity group transaction that moves the partition's fence entity on `If-Match` the ETag
//! read), run by several holders of one lock over the model's storage and network.
//!
//! The lock itself is not run: holder `k` is simply given its token (as the lock hands tokens
//! out, rising), and every holder runs at once, in every interleaving. That is the fence's
//! worst case: each holder but the newest is a holder paused past its lease that wakes at any
//! step, while the newer ones write; what the fence must keep is that storage refuses a stale
//! holder's write once a newer holder's fenced write landed, whatever the order.
//!
//! Each check explores both answers to a tag condition on a blob that does not exist yet:
//! Azure's 412 (the first write is then the create) and Azurite's letting the put through.

use std::time::{Duration, SystemTime};

use leasegate::fence::{self, BatchFenced, Fence, Fenced, TableFence};
use leasegate::ops::PutBlob;
use leasegate::table::{Batch, BatchOperation, Entity, TableClient, TableName};
use leasegate::{Account, BlobClient, BlobName, ContainerName};
use stateright::Property;

use crate::storage::Storage;
use crate::table;
use crate::wire::{WireRequest, WireResponse};
use crate::world::{
    Io, Protocol, Run, State, Status, World, CONNECTION_STRING_WITH_TABLES, START, STORAGE_HOST,
    TABLE_HOST,
};

/// The container of the fenced blob.
pub const CONTAINER: &str = "data";

/// The fenced blob.
pub const BLOB: &str = "ledger/book.json";

/// The table.
pub const TABLE: &str = "ledger";

/// The partition every batch writes.
pub const PARTITION: &str = "book-1";

/// The lock's key (its blob's path, with the container): the fence names the lock by its
/// digest, in the blob's lock tag and the fence entity's RowKey.
pub const LOCK_KEY: &str = "leasegate/locks/book-1";

/// The fence of the holder of `token`.
pub fn fence_of(token: u64) -> Fence {
    Fence::new(LOCK_KEY, token)
}

/// The RowKey of the partition's fence entity.
pub fn fence_row() -> String {
    fence_of(0).row_key()
}

/// The blob's tags as a fenced write of `token` sets them (`x-ms-tags`).
fn fence_tags(token: u64) -> String {
    format!(
        "{}={}&{}={}",
        fence::FENCE_TAG,
        fence::fence_value(token),
        fence::FENCE_LOCK_TAG,
        fence_of(token).lock_digest()
    )
}

/// One fenced write of a holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Write {
    /// A fenced Put Blob of [`BLOB`], its body naming the holder's token and step.
    Blob,
    /// A fenced batch inserting one entity (RowKey `e-{token}-{step}`, its `fencingToken` the
    /// holder's).
    Table,
}

/// A holder: its token and its writes, in order.
#[derive(Debug, Clone)]
pub struct Holder {
    /// Its fencing token.
    pub token: u64,
    /// What it writes.
    pub writes: Vec<Write>,
}

/// How a fenced write ended, as its caller was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Written.
    Written,
    /// `fenced_out`: a newer holder wrote; nothing of this call landed.
    FencedOut,
    /// The fence held and storage refused one of the caller's own operations (an insert of
    /// an entity that exists).
    Refused,
    /// An error (a fault): it may or may not have landed.
    Failed,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Note {
    /// A holder's write `step` ended so.
    Ended {
        /// The holder's token.
        token: u64,
        /// Which of its writes.
        step: usize,
        /// How.
        outcome: Outcome,
    },
    /// A write of the blob landed (noted on storage's side when it is applied, whether or not
    /// its answer arrives): its token and step, read from its body.
    BlobLanded {
        /// The token.
        token: u64,
        /// The step.
        step: usize,
    },
    /// A batch inserting the entity of this token and step was committed.
    EntityLanded {
        /// The token.
        token: u64,
        /// The step.
        step: usize,
    },
}

/// A planted mistake (tests only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mistake {
    /// The fence condition left out: the blob's put sent without `x-ms-if-tags`, the batch's
    /// fence entity update without its `If-Match` (an upsert then).
    FenceLeftOut,
}

/// The fence protocol under check.
#[derive(Debug, Clone)]
pub struct FenceProtocol {
    /// The holders.
    pub holders: Vec<Holder>,
    /// Fault budget.
    pub faults: u8,
    /// Storage starts with the blob and the fence entity written by an earlier holder (token
    /// 0), instead of neither (the first writes create them).
    pub seeded: bool,
    /// A planted mistake, or none.
    pub mistake: Option<Mistake>,
}

impl FenceProtocol {
    /// A bound CI checks: holders of tokens 1 and 2, each writing the blob, a batch, then the
    /// blob again, from nothing (the race of two first writes, of the blob and of the fence
    /// entity); one fault (any kind, on any request: a lost answer, a request landing late).
    /// With a batch more each: `scripts/dev.sh check --deep`.
    pub fn bounded() -> Self {
        let writes = vec![Write::Blob, Write::Table, Write::Blob];
        FenceProtocol {
            holders: vec![
                Holder {
                    token: 1,
                    writes: writes.clone(),
                },
                Holder { token: 2, writes },
            ],
            faults: 1,
            seeded: false,
            mistake: None,
        }
    }

    /// Another bound CI checks: holders of tokens 1 and 2, each a batch then a write of the
    /// blob, then a batch again, over storage an earlier holder wrote; one fault (any kind, on
    /// any request: a lost answer, a request landing late).
    pub fn faulty() -> Self {
        let writes = vec![Write::Table, Write::Blob, Write::Table];
        FenceProtocol {
            holders: vec![
                Holder {
                    token: 1,
                    writes: writes.clone(),
                },
                Holder { token: 2, writes },
            ],
            faults: 1,
            seeded: true,
            mistake: None,
        }
    }

    /// Another: holders of tokens 1 and 2, each a batch then a write of the blob, over storage
    /// an earlier holder wrote; two faults.
    pub fn two_faults() -> Self {
        let mut p = FenceProtocol::faulty().only(Write::Table, 1);
        for h in &mut p.holders {
            h.writes.push(Write::Blob);
        }
        FenceProtocol { faults: 2, ..p }
    }

    /// Three holders (tokens 1, 2, 3), each one batch and one write of the blob, from
    /// nothing; no fault (`faults` 1: a deeper check).
    pub fn three() -> Self {
        let holder = |token| Holder {
            token,
            writes: vec![Write::Table, Write::Blob],
        };
        FenceProtocol {
            holders: vec![holder(1), holder(2), holder(3)],
            faults: 0,
            seeded: false,
            mistake: None,
        }
    }

    /// Each holder doing only `write`, `n` times.
    pub fn only(mut self, write: Write, n: usize) -> Self {
        for h in &mut self.holders {
            h.writes = vec![write; n];
        }
        self
    }

    /// With a planted mistake.
    pub fn with_mistake(mut self, mistake: Mistake) -> Self {
        self.mistake = Some(mistake);
        self
    }
}

fn body(token: u64, step: usize) -> Vec<u8> {
    format!("token={token};step={step}").into_bytes()
}

/// A blob body's token and step.
fn parse_body(body: &[u8]) -> Option<(u64, usize)> {
    let text = std::str::from_utf8(body).ok()?;
    let (token, step) = text.strip_prefix("token=")?.split_once(";step=")?;
    Some((token.parse().ok()?, step.parse().ok()?))
}

fn row_key(token: u64, step: usize) -> String {
    format!("e-{token}-{step}")
}

fn parse_row_key(row: &str) -> Option<(u64, usize)> {
    let (token, step) = row.strip_prefix("e-")?.split_once('-')?;
    Some((token.parse().ok()?, step.parse().ok()?))
}

async fn run_holder(holder: Holder, io: Io<Note>) {
    let account =
        Account::from_connection_string(CONNECTION_STRING_WITH_TABLES).expect("a valid account");
    let container = ContainerName::try_new(CONTAINER).expect("a valid name");
    let blobs = BlobClient::new(io.clone(), account.clone(), container.clone());
    let tables = TableClient::try_new(io.clone(), account).expect("a table endpoint");
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(START);
    let token = holder.token;
    let fence = fence_of(token);
    let mut table_fence = TableFence::new(fence.clone());
    for (step, write) in holder.writes.iter().enumerate() {
        let outcome = match write {
            Write::Blob => {
                let put = PutBlob::block(
                    container.clone(),
                    BlobName::try_new(BLOB).expect("a valid name"),
                    body(token, step),
                );
                match fence::write_blob(&blobs, &fence, put, now).await {
                    Ok(Fenced::FencedOut { .. }) => Outcome::FencedOut,
                    Ok(Fenced::Written(_)) => Outcome::Written,
                    Err(_) => Outcome::Failed,
                }
            }
            Write::Table => {
                let entity =
                    Entity::new(PARTITION, row_key(token, step)).with("fencingToken", token as i64);
                let batch = Batch::new(TableName::try_new(TABLE).expect("a valid name"), PARTITION)
                    .and_then(|b| b.with(BatchOperation::Insert(entity)))
                    .expect("a valid batch");
                match fence::table_batch(&tables, &mut table_fence, &batch, now).await {
                    Ok(Fenced::FencedOut { .. }) => Outcome::FencedOut,
                    Ok(Fenced::Written(BatchFenced::Committed(_))) => Outcome::Written,
                    Ok(Fenced::Written(BatchFenced::Refused { .. })) => Outcome::Refused,
                    Err(_) => Outcome::Failed,
                }
            }
        };
        io.note(Note::Ended {
            token,
            step,
            outcome,
        });
    }
}

/// A write of the fenced blob (Put Blob, whatever its conditions).
fn is_blob_put(request: &WireRequest) -> bool {
    request.host() == STORAGE_HOST
        && request.method == "PUT"
        && request.path().ends_with(&format!("/{CONTAINER}/{BLOB}"))
        && request.query("comp").is_none()
}

fn is_batch(request: &WireRequest) -> bool {
    request.host() == TABLE_HOST && request.method == "POST" && request.path().ends_with("/$batch")
}

impl Protocol for FenceProtocol {
    type Note = Note;

    fn callers(&self) -> usize {
        self.holders.len()
    }

    fn run(&self, i: usize, io: Io<Note>) -> Run {
        Box::pin(run_holder(self.holders[i].clone(), io))
    }

    fn storage(&self) -> Storage {
        let mut storage = Storage::new(START);
        storage.create_container(CONTAINER);
        storage.tables.create(TABLE);
        if self.seeded {
            let mut seed = WireRequest {
                method: "PUT".into(),
                uri: format!("http://{STORAGE_HOST}/devstoreaccount1/{CONTAINER}/{BLOB}"),
                headers: vec![
                    ("x-ms-blob-type".into(), "BlockBlob".into()),
                    ("x-ms-tags".into(), fence_tags(0)),
                ],
                body: body(0, 0),
            };
            assert_eq!(storage.handle(&seed).status, 201, "the seed blob");
            seed.uri = format!("http://{TABLE_HOST}/devstoreaccount1/{TABLE}");
            seed.method = "POST".into();
            seed.headers = vec![("content-type".into(), "application/json".into())];
            seed.body = serde_json::json!({
                "PartitionKey": PARTITION,
                "RowKey": fence_row(),
                "fencingToken": "0",
                "fencingToken@odata.type": "Edm.Int64",
            })
            .to_string()
            .into_bytes();
            assert_eq!(storage.handle_table(&seed).status, 201, "the seed fence");
        }
        storage
    }

    /// Both answers to a tag condition on a blob that does not exist yet: Azure's refusal (412),
    /// and Azurite's letting the put through unchecked (the first write is then that put).
    fn storages(&self) -> Vec<Storage> {
        let azure = self.storage();
        let mut azurite = azure.clone();
        azurite.if_tags_unchecked_on_missing_blob = true;
        vec![azure, azurite]
    }

    fn budgets(&self) -> (u8, u8, u8) {
        (self.faults, 0, 0)
    }

    fn advances(&self) -> &[u64] {
        &[]
    }

    fn mutate(&self, request: &mut WireRequest) {
        if self.mistake != Some(Mistake::FenceLeftOut) {
            return;
        }
        if is_blob_put(request) {
            request.remove_header("x-ms-if-tags");
        }
        if is_batch(request) {
            table::strip_if_match(request, &fence_row());
        }
    }

    /// Writes that landed, in the order storage applied them.
    fn observe(
        &self,
        i: usize,
        request: &WireRequest,
        response: &WireResponse,
        _before: Option<Vec<u8>>,
        log: &mut Vec<(usize, Note)>,
    ) {
        if is_blob_put(request) && response.status == 201 {
            if let Some((token, step)) = parse_body(&request.body) {
                log.push((i, Note::BlobLanded { token, step }));
            }
        }
        if is_batch(request) && table::committed(response) {
            for row in table::inserted_rows(request) {
                if let Some((token, step)) = parse_row_key(&row) {
                    log.push((i, Note::EntityLanded { token, step }));
                }
            }
        }
    }

    fn properties() -> Vec<Property<World<Self>>> {
        vec![
            Property::always(
                "no write of the blob lands after a newer holder's fenced write",
                |_, s| rising(s, |n| matches!(n, Note::BlobLanded { .. })),
            ),
            Property::always(
                "no entity of the partition is inserted after a newer holder's fenced batch",
                |_, s| rising(s, |n| matches!(n, Note::EntityLanded { .. })),
            ),
            Property::always("a write answered fenced_out wrote nothing", |_, s| {
                fenced_out_wrote_nothing(s)
            }),
            Property::always(
                "at the end the blob and the fence entity hold the highest token that wrote",
                |_, s| !ended(s) || highest_holds(s),
            ),
        ]
    }
}

fn landed(note: &Note) -> Option<(u64, usize)> {
    match note {
        Note::BlobLanded { token, step } | Note::EntityLanded { token, step } => {
            Some((*token, *step))
        }
        Note::Ended { .. } => None,
    }
}

/// In the order storage applied them, the tokens of the writes `kind` picks never go down.
fn rising(state: &State<Note>, kind: impl Fn(&Note) -> bool) -> bool {
    let tokens: Vec<u64> = state
        .log
        .iter()
        .filter(|(_, n)| kind(n))
        .filter_map(|(_, n)| landed(n).map(|(t, _)| t))
        .collect();
    tokens.windows(2).all(|w| w[0] <= w[1])
}

/// No write of a call answered `fenced_out` ever lands (before the answer, or after it: a
/// request of its still in flight).
fn fenced_out_wrote_nothing(state: &State<Note>) -> bool {
    state.log.iter().all(|(_, n)| match n {
        Note::Ended {
            token,
            step,
            outcome: Outcome::FencedOut,
        } => !state
            .log
            .iter()
            .any(|(_, m)| landed(m) == Some((*token, *step))),
        _ => true,
    })
}

/// Every holder has finished and no request is in flight.
fn ended(state: &State<Note>) -> bool {
    state.in_flight.is_empty()
        && state
            .callers
            .iter()
            .all(|c| !matches!(c.status, Status::Waiting(_)))
}

/// The blob's fence tag and body are the highest token whose blob write landed, and the fence
/// entity's `fencingToken` the highest whose batch committed.
fn highest_holds(state: &State<Note>) -> bool {
    let highest = |kind: fn(&Note) -> bool| {
        state
            .log
            .iter()
            .filter(|(_, n)| kind(n))
            .filter_map(|(_, n)| landed(n).map(|(t, _)| t))
            .max()
    };
    let blob_ok = match highest(|n| matches!(n, Note::BlobLanded { .. })) {
        None => true,
        Some(top) => state.storage.blob(CONTAINER, BLOB).is_some_and(|b| {
            b.tags.get(fence::FENCE_TAG) == Some(&fence::fence_value(top))
                && parse_body(&b.body).map(|(t, _)| t) == Some(top)
        }),
    };
    let table_ok = match highest(|n| matches!(n, Note::EntityLanded { .. })) {
        None => true,
        Some(top) => {
            state
                .storage
                .tables
                .row(TABLE, PARTITION, &fence_row())
                .and_then(|r| r.int64("fencingToken"))
                == Some(top as i64)
        }
    };
    blob_ok && table_ok
}
