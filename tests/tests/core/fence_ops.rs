//! The core's fenced writes (`leasegate::fence`) against a real Azurite (blob and table
//! emulators from the pinned package): a stale holder's write is refused by storage itself,
//! read back from storage. Under the real Spin, `toolkit/ledger_wasm.rs` freezes a holder.

use std::time::SystemTime;

use leasegate::fence::{self, BatchFenced, Fence, Fenced, TableFence, FENCE_TAG, FENCING_TOKEN};
use leasegate::ops::{CreateContainer, GetBlob, GetBlobTags, PutBlob, Tags};
use leasegate::table::{
    Batch, BatchOperation, CreateTable, EdmValue, Entity, QueryEntities, TableClient, TableName,
    TableRefusal,
};
use leasegate::{BlobClient, BlobName, ContainerName, Counting};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::{unique_container, Azurite};

fn blobs() -> BlobClient<Counting<NativeTransport>> {
    let account = Azurite::shared().account();
    let container = unique_container("fence");
    let client = BlobClient::new(
        Counting::new(NativeTransport::default()),
        account,
        container,
    );
    let create = CreateContainer {
        container: client.container().clone(),
    };
    run(client.execute(&create, SystemTime::now())).unwrap();
    client
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    block_on(f)
}

fn put(c: &ContainerName, name: &str, body: &str) -> PutBlob {
    PutBlob::block(c.clone(), BlobName::try_new(name).unwrap(), body.into())
        .with_content_type("application/json")
}

fn write<T: leasegate::Transport>(
    client: &BlobClient<T>,
    fence: &Fence,
    name: &str,
    body: &str,
) -> Fenced<leasegate::ops::Written> {
    let op = put(client.container(), name, body);
    run(fence::write_blob(client, fence, op, SystemTime::now())).unwrap()
}

fn body<T: leasegate::Transport>(client: &BlobClient<T>, name: &str) -> String {
    let get = GetBlob {
        container: client.container().clone(),
        blob: BlobName::try_new(name).unwrap(),
    };
    let (content, _) = run(client.execute(&get, SystemTime::now())).unwrap();
    String::from_utf8(content.expect("the blob exists").body).unwrap()
}

fn tag<T: leasegate::Transport>(client: &BlobClient<T>, name: &str) -> Option<String> {
    let get = GetBlobTags {
        container: client.container().clone(),
        blob: BlobName::try_new(name).unwrap(),
    };
    let (tags, _) = run(client.execute(&get, SystemTime::now())).unwrap();
    tags.unwrap_or_default().get(FENCE_TAG).cloned()
}

const LOCK: &str = "leasegate/ledger/acme";

/// Holder 7 writes, holder 6 (paused while 7 took the lock) is refused, and the blob holds 7's
/// body; 7 writes again, 8 after it. Each landed write is one request.
#[test]
fn a_stale_holders_blob_write_is_refused_by_storage() {
    let client = blobs();
    let (six, seven, eight) = (
        Fence::new(LOCK, 6),
        Fence::new(LOCK, 7),
        Fence::new(LOCK, 8),
    );
    let name = "ledger/acme.json";
    // The blob's first write: the tag condition, then a create.
    let first = client.transport().sent();
    assert!(matches!(
        write(&client, &seven, name, "{\"t\":7}"),
        Fenced::Written(_)
    ));
    let first = client.transport().sent() - first;
    assert!(
        first <= 2,
        "a first write is at most 2 requests, took {first}"
    );
    let before = client.transport().sent();
    assert!(matches!(
        write(&client, &seven, name, "{\"t\":7,\"n\":2}"),
        Fenced::Written(_)
    ));
    assert_eq!(
        client.transport().sent() - before,
        1,
        "a fenced write rides on the put"
    );
    assert_eq!(
        write(&client, &six, name, "{\"t\":6}"),
        Fenced::FencedOut {
            newer_token: Some(7)
        }
    );
    assert_eq!(body(&client, name), "{\"t\":7,\"n\":2}");
    assert_eq!(tag(&client, name).as_deref(), Some("00000000000000000007"));
    assert!(matches!(
        write(&client, &eight, name, "{\"t\":8}"),
        Fenced::Written(_)
    ));
    assert_eq!(
        write(&client, &seven, name, "{}"),
        Fenced::FencedOut {
            newer_token: Some(8)
        }
    );
    assert_eq!(body(&client, name), "{\"t\":8}");
    // A holder of another lock cannot compare its token with this lock's: an error, not a write.
    let other = Fence::new("leasegate/ledger/other", 99);
    let op = put(client.container(), name, "{}");
    let refused = run(fence::write_blob(&client, &other, op, SystemTime::now()));
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(body(&client, name), "{\"t\":8}");
}

/// Two holders write a blob that does not exist yet at the same moment, many times over: the
/// blob always ends with the newer holder's body and token, whichever request came first.
#[test]
fn two_holders_first_writes_race_and_the_newer_one_stays() {
    let counted = blobs();
    // A client per holder, as two deployments have (the counting transport is not shared).
    let holder = || {
        let account = counted.account().clone();
        BlobClient::new(
            NativeTransport::default(),
            account,
            counted.container().clone(),
        )
    };
    let (client, a_client, b_client) = (holder(), holder(), holder());
    for round in 0..12u64 {
        let name = format!("race/{round}.json");
        let (older, newer) = (
            Fence::new(LOCK, 2 * round + 1),
            Fence::new(LOCK, 2 * round + 2),
        );
        let barrier = std::sync::Barrier::new(2);
        let outcomes = std::thread::scope(|s| {
            let a = s.spawn(|| {
                barrier.wait();
                write(&a_client, &older, &name, "older")
            });
            let b = s.spawn(|| {
                barrier.wait();
                write(&b_client, &newer, &name, "newer")
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        assert!(
            matches!(outcomes.1, Fenced::Written(_)),
            "round {round}: {outcomes:?}"
        );
        assert_eq!(body(&client, &name), "newer", "round {round}: {outcomes:?}");
        assert_eq!(tag(&client, &name), Some(fence::fence_value(newer.token())));
    }
}

/// A blob written before without the fence is not overwritten by a fenced write (which could
/// not tell whose it is): an error naming how to adopt it.
#[test]
fn an_unfenced_blob_is_not_overwritten() {
    let client = blobs();
    let name = "ledger/old.json";
    let plain = put(client.container(), name, "written by hand");
    run(client.execute(&plain, SystemTime::now())).unwrap();
    let op = put(client.container(), name, "fenced");
    let err = run(fence::write_blob(
        &client,
        &Fence::new(LOCK, 3),
        op,
        SystemTime::now(),
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("without a fence"), "{err}");
    assert_eq!(body(&client, name), "written by hand");
    // The caller's own tags ride with the fence's; the fence's names are refused.
    let mut tags = Tags::new();
    tags.insert("owner".into(), "billing".into());
    let op = put(client.container(), "tagged.json", "x").with_tags(tags);
    let written = run(fence::write_blob(
        &client,
        &Fence::new(LOCK, 3),
        op,
        SystemTime::now(),
    ));
    assert!(matches!(written, Ok(Fenced::Written(_))), "{written:?}");
    let mut tags = Tags::new();
    tags.insert(FENCE_TAG.into(), "x".into());
    let op = put(client.container(), "tagged.json", "x").with_tags(tags);
    let refused = run(fence::write_blob(
        &client,
        &Fence::new(LOCK, 3),
        op,
        SystemTime::now(),
    ));
    assert!(refused.is_err());
}

fn tables() -> (TableClient<Counting<NativeTransport>>, TableName) {
    let client = TableClient::try_new(
        Counting::new(NativeTransport::default()),
        Azurite::shared_table().account(),
    )
    .unwrap();
    let rand = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let table = TableName::try_new(&format!("ledger{rand}")).unwrap();
    let create = CreateTable {
        table: table.clone(),
    };
    run(client.execute(&create, SystemTime::now())).unwrap();
    (client, table)
}

fn entry(book: &str, row: &str, token: u64) -> BatchOperation {
    BatchOperation::Insert(
        Entity::new(book, row).with(FENCING_TOKEN, EdmValue::Int64(token as i64)),
    )
}

fn batch_of(table: &TableName, book: &str, ops: Vec<BatchOperation>) -> Batch {
    let mut batch = Batch::new(table.clone(), book).unwrap();
    for op in ops {
        batch.push(op).unwrap();
    }
    batch
}

fn rows(client: &TableClient<Counting<NativeTransport>>, table: &TableName) -> Vec<String> {
    let query = QueryEntities::new(table.clone());
    let (page, _) = run(client.execute(&query, SystemTime::now())).unwrap();
    page.entities
        .into_iter()
        .map(|e| e.entity.row_key)
        .filter(|r| !r.starts_with(fence::FENCE_ROW_PREFIX))
        .collect()
}

/// Holder 1 appends; holder 2 takes over and appends; holder 1's next batch (both of its
/// entities) is refused whole. One read of the fence entity per holder tenure.
#[test]
fn a_stale_holders_table_batch_changes_nothing() {
    let (client, table) = tables();
    let book = "acme";
    let mut one = TableFence::new(Fence::new(LOCK, 1));
    let mut two = TableFence::new(Fence::new(LOCK, 2));
    let send = |fence: &mut TableFence, ops| {
        let batch = batch_of(&table, book, ops);
        run(fence::table_batch(
            &client,
            fence,
            &batch,
            SystemTime::now(),
        ))
        .unwrap()
    };
    let before = client.transport().sent();
    let first = send(&mut one, vec![entry(book, "1-0", 1)]);
    assert!(
        matches!(first, Fenced::Written(BatchFenced::Committed(ref items)) if items.len() == 1)
    );
    assert_eq!(
        client.transport().sent() - before,
        2,
        "the fence's read, then the batch"
    );
    let before = client.transport().sent();
    assert!(matches!(
        send(&mut one, vec![entry(book, "1-1", 1)]),
        Fenced::Written(_)
    ));
    assert_eq!(
        client.transport().sent() - before,
        1,
        "the fence rides on the batch"
    );
    assert!(matches!(
        send(&mut two, vec![entry(book, "2-0", 2)]),
        Fenced::Written(_)
    ));
    let stale = send(&mut one, vec![entry(book, "1-2", 1), entry(book, "1-3", 1)]);
    assert_eq!(
        stale,
        Fenced::FencedOut {
            newer_token: Some(2)
        }
    );
    assert_eq!(rows(&client, &table), ["1-0", "1-1", "2-0"]);
    // A new tenure of the old token reads the fence and is refused before it sends a batch.
    let mut again = TableFence::new(Fence::new(LOCK, 1));
    let before = client.transport().sent();
    assert_eq!(
        send(&mut again, vec![entry(book, "1-4", 1)]),
        Fenced::FencedOut {
            newer_token: Some(2)
        }
    );
    assert_eq!(client.transport().sent() - before, 1);
    // The caller's own refusal is told apart from the fence's: the fence held.
    assert_eq!(
        send(&mut two, vec![entry(book, "2-1", 2), entry(book, "2-0", 2)]),
        Fenced::Written(BatchFenced::Refused {
            index: Some(1),
            refusal: TableRefusal::AlreadyExists
        })
    );
    assert_eq!(rows(&client, &table), ["1-0", "1-1", "2-0"]);
}

/// A fence entity deleted after this tenure wrote (a clean-up of the partition) is not
/// re-created by the older holder: it may have let a newer holder write. A claim advances the
/// fence with nothing else written, and the fence's own rows cannot be written by a caller.
#[test]
fn a_deleted_fence_fails_closed_and_a_claim_fences_first() {
    use leasegate::table::{DeleteEntity, IfMatch};
    let (client, table) = tables();
    let book = "acme";
    let mut six = TableFence::new(Fence::new(LOCK, 6));
    let mut seven = TableFence::new(Fence::new(LOCK, 7));
    let send = |fence: &mut TableFence, ops| {
        let batch = batch_of(&table, book, ops);
        run(fence::table_batch(
            &client,
            fence,
            &batch,
            SystemTime::now(),
        ))
        .unwrap()
    };
    assert!(matches!(
        send(&mut six, vec![entry(book, "6-0", 6)]),
        Fenced::Written(_)
    ));
    assert!(matches!(
        send(&mut seven, vec![entry(book, "7-0", 7)]),
        Fenced::Written(_)
    ));
    let delete = DeleteEntity {
        table: table.clone(),
        partition_key: book.into(),
        row_key: Fence::new(LOCK, 0).row_key(),
        if_match: IfMatch::Any,
    };
    run(client.execute(&delete, SystemTime::now())).unwrap();
    assert_eq!(
        send(&mut six, vec![entry(book, "6-1", 6)]),
        Fenced::FencedOut { newer_token: None }
    );
    assert_eq!(rows(&client, &table), ["6-0", "7-0"]);
    // A claim: the fence at 8 with no row of its own; 7's next batch is refused.
    let mut eight = TableFence::new(Fence::new(LOCK, 8));
    let claimed = run(fence::claim_partition(
        &client,
        &mut eight,
        &table,
        book,
        SystemTime::now(),
    ));
    assert_eq!(claimed.unwrap(), Fenced::Written(()));
    assert_eq!(
        send(&mut seven, vec![entry(book, "7-1", 7)]),
        Fenced::FencedOut {
            newer_token: Some(8)
        }
    );
    assert_eq!(rows(&client, &table), ["6-0", "7-0"]);
    let fence_row = Fence::new(LOCK, 0).row_key();
    let batch = batch_of(&table, book, vec![entry(book, &fence_row, 9)]);
    let refused = run(fence::table_batch(
        &client,
        &mut eight,
        &batch,
        SystemTime::now(),
    ));
    assert!(refused.is_err(), "{refused:?}");
}
