//! The model's storage, checked through the core's own requests and parsers: what the core
//! builds, the model answers, and the core reads the answer as it reads Azure's. Blob index
//! tags (`x-ms-tags`, `x-ms-if-tags`, Get and Set Blob Tags) and the Table service (entity
//! writes, the point read, the entity group transaction, all or none).

use leasegate::ops::{
    Condition, GetBlob, GetBlobTags, IfTags, Operation, PutBlob, Refusal, SetBlobTags, Tags,
    WriteOutcome,
};
use leasegate::table::{
    Batch, BatchOperation, BatchOutcome, CreateTable, EdmValue, Entity, EntityTag, GetEntity,
    IfMatch, InsertEntity, MergeEntity, TableCreated, TableName, TableOperation, TableRefusal,
};
use leasegate::{Account, BlobName, ContainerName};
use leasegate_model::storage::Storage;
use leasegate_model::wire::WireRequest;
use leasegate_model::world::{CONNECTION_STRING_WITH_TABLES, START};

fn account() -> Account {
    Account::from_connection_string(CONNECTION_STRING_WITH_TABLES).unwrap()
}

/// A blob operation through the model: the core's request, the model's answer, the core's
/// reading of it; `tags` sets `x-ms-tags` as written here (`PutBlob::with_tags` is checked
/// once, below, for its own encoding).
fn blob<O: Operation>(storage: &mut Storage, op: &O, tags: Option<&str>) -> O::Output {
    let mut request = WireRequest::from(&op.request(&account()).unwrap());
    if let Some(tags) = tags {
        request.set_header("x-ms-tags", tags.to_string());
    }
    let answer = storage.handle(&request);
    op.parse(&answer.to_response()).unwrap()
}

fn table<O: TableOperation>(storage: &mut Storage, op: &O) -> O::Output {
    let request = WireRequest::from(&op.request(&account()).unwrap());
    let answer = storage.handle_table(&request);
    op.parse(&answer.to_response()).unwrap()
}

fn put(body: &str) -> PutBlob {
    PutBlob::block(
        ContainerName::try_new("data").unwrap(),
        BlobName::try_new("ledger/book.json").unwrap(),
        body.as_bytes().to_vec(),
    )
}

fn fence(token: u64) -> String {
    format!("leasegate_fence={token:020}")
}

fn at_most(token: u64) -> String {
    format!("\"leasegate_fence\" <= '{token:020}'")
}

fn if_tags(op: PutBlob, condition: String) -> IfTags<PutBlob> {
    IfTags { op, condition }
}

fn written(outcome: &WriteOutcome) -> bool {
    matches!(outcome, WriteOutcome::Written(_))
}

#[test]
fn a_tag_condition_refuses_a_lower_token_after_a_higher_one_wrote() {
    let mut s = Storage::new(START);
    s.create_container("data");
    // No blob: a tag condition cannot hold (nothing to compare), refused as a condition.
    let first = blob(&mut s, &if_tags(put("7"), at_most(7)), Some(&fence(7)));
    assert_eq!(first, WriteOutcome::Refused(Refusal::ConditionFailed));
    assert!(s.blob("data", "ledger/book.json").is_none());
    // Azurite's answer instead: the put lands, its condition unchecked.
    let mut azurite = s.clone();
    azurite.if_tags_unchecked_on_missing_blob = true;
    let landed = blob(
        &mut azurite,
        &if_tags(put("7"), at_most(7)),
        Some(&fence(7)),
    );
    assert!(written(&landed));
    assert_eq!(
        blob(
            &mut azurite,
            &if_tags(put("6"), at_most(6)),
            Some(&fence(6))
        ),
        WriteOutcome::Refused(Refusal::ConditionFailed)
    );
    // The first write: a create.
    let create = put("7").with_condition(Condition::IfNotExists);
    assert!(written(&blob(&mut s, &create, Some(&fence(7)))));
    assert_eq!(
        blob(&mut s, &create, Some(&fence(7))),
        WriteOutcome::Refused(Refusal::AlreadyExists)
    );
    // Token 8 lands (the tag is at most 8), then token 7 is refused, and 9 lands.
    assert!(written(&blob(
        &mut s,
        &if_tags(put("8"), at_most(8)),
        Some(&fence(8))
    )));
    let stale = blob(&mut s, &if_tags(put("7"), at_most(7)), Some(&fence(7)));
    assert_eq!(stale, WriteOutcome::Refused(Refusal::ConditionFailed));
    assert!(written(&blob(
        &mut s,
        &if_tags(put("9"), at_most(9)),
        Some(&fence(9))
    )));
    let b = s.blob("data", "ledger/book.json").unwrap();
    assert_eq!(b.body, b"9");
    assert_eq!(
        b.tags.get("leasegate_fence").map(String::as_str),
        Some("00000000000000000009")
    );
    // Get Blob Tags reads them back; Get Blob under a condition that fails is refused.
    let get_tags = GetBlobTags {
        container: ContainerName::try_new("data").unwrap(),
        blob: BlobName::try_new("ledger/book.json").unwrap(),
    };
    let tags = blob(&mut s, &get_tags, None).unwrap();
    assert_eq!(tags.len(), 1);
    let get = GetBlob {
        container: ContainerName::try_new("data").unwrap(),
        blob: BlobName::try_new("ledger/book.json").unwrap(),
    };
    let mut read = WireRequest::from(&get.request(&account()).unwrap());
    read.set_header("x-ms-if-tags", at_most(8));
    assert_eq!(s.handle(&read).status, 412);
    // The core's own `x-ms-tags` (percent-encoded) sets them too.
    let tagged = put("10").with_tags(Tags::from([(
        "leasegate_fence".to_string(),
        "00000000000000000010".to_string(),
    )]));
    assert!(written(&blob(&mut s, &if_tags(tagged, at_most(10)), None)));
    assert_eq!(
        s.blob("data", "ledger/book.json")
            .unwrap()
            .tags
            .get("leasegate_fence"),
        Some(&"00000000000000000010".to_string())
    );
    // A put without tags replaces them with none: the fence is gone with it.
    assert!(written(&blob(&mut s, &put("x"), None)));
    assert!(s.blob("data", "ledger/book.json").unwrap().tags.is_empty());
    assert_eq!(
        blob(&mut s, &if_tags(put("9"), at_most(9)), Some(&fence(9))),
        WriteOutcome::Refused(Refusal::ConditionFailed)
    );
}

#[test]
fn tag_conditions_are_strings_and_join_with_and() {
    let mut s = Storage::new(START);
    s.create_container("data");
    assert!(written(&blob(&mut s, &put("a"), Some("n=7&k=b"))));
    let cases = [
        ("\"n\" = '7' AND \"k\" = 'b'", true),
        ("\"n\" = '7' AND \"k\" <> 'b'", false),
        // As strings: "7" is above "10".
        ("\"n\" < '10'", false),
        ("\"n\" > '10'", true),
        ("\"n\" >= '7'", true),
        ("\"missing\" <> 'x'", false),
    ];
    for (condition, lands) in cases {
        let outcome = blob(
            &mut s,
            &if_tags(put("b"), condition.into()),
            Some("n=7&k=b"),
        );
        assert_eq!(written(&outcome), lands, "{condition}");
    }
    // Beside If-None-Match: both are evaluated (Azure; Azurite would ignore the tags).
    let both = if_tags(
        put("c").with_condition(Condition::IfNotExists),
        "\"n\" = '7'".into(),
    );
    assert_eq!(
        blob(&mut s, &both, None),
        WriteOutcome::Refused(Refusal::AlreadyExists)
    );
    // Set Blob Tags replaces them, and keeps the ETag.
    let etag = s.blob("data", "ledger/book.json").unwrap().etag;
    let set = SetBlobTags {
        container: ContainerName::try_new("data").unwrap(),
        blob: BlobName::try_new("ledger/book.json").unwrap(),
        tags: Tags::from([("n".to_string(), "8".to_string())]),
        lease_id: None,
    };
    assert!(written(&blob(&mut s, &set, None)));
    let b = s.blob("data", "ledger/book.json").unwrap();
    assert_eq!(b.etag, etag);
    assert_eq!(b.tags, Tags::from([("n".to_string(), "8".to_string())]));
    // A condition the model cannot read is a 400 (an error, not a refusal).
    let mut r = WireRequest::from(&put("d").request(&account()).unwrap());
    r.set_header("x-ms-if-tags", "n = 8".into());
    assert_eq!(s.handle(&r).status, 400);
}

fn ledger() -> TableName {
    TableName::try_new("ledger").unwrap()
}

fn entry(row: &str, token: i64) -> Entity {
    Entity::new("book-1", row).with("fencingToken", token)
}

fn fence_entity(token: i64) -> Entity {
    entry("leasegate-fence", token)
}

fn read_fence(s: &mut Storage) -> Option<(i64, EntityTag)> {
    let get = GetEntity {
        table: ledger(),
        partition_key: "book-1".into(),
        row_key: "leasegate-fence".into(),
        select: vec![],
    };
    let stored = table(s, &get)?;
    let token = stored
        .entity
        .get("fencingToken")
        .and_then(EdmValue::as_i64)?;
    Some((token, stored.etag?))
}

fn batch(ops: Vec<BatchOperation>) -> Batch {
    let mut b = Batch::new(ledger(), "book-1").unwrap();
    for op in ops {
        b.push(op).unwrap();
    }
    b
}

#[test]
fn a_batch_commits_all_or_nothing_and_names_the_refused_operation() {
    let mut s = Storage::new(START);
    assert_eq!(
        table(&mut s, &CreateTable { table: ledger() }),
        TableCreated::Created
    );
    assert_eq!(
        table(&mut s, &CreateTable { table: ledger() }),
        TableCreated::AlreadyExists
    );
    assert_eq!(read_fence(&mut s), None);
    // Holder 7's first batch: the fence inserted, with its entry.
    let first = batch(vec![
        BatchOperation::Insert(fence_entity(7)),
        BatchOperation::Insert(entry("e-7-0", 7)),
    ]);
    let BatchOutcome::Committed(items) = table(&mut s, &first) else {
        panic!("the first batch is refused");
    };
    assert_eq!(items.len(), 2);
    let (token, tag) = read_fence(&mut s).unwrap();
    assert_eq!(token, 7);
    assert_eq!(items[0].etag.as_ref(), Some(&tag));
    assert!(tag
        .as_str()
        .starts_with("W/\"datetime'2026-11-19T14%3A00%3A00."));
    // Holder 8 moves the fence on at the ETag it read.
    let eight = batch(vec![
        BatchOperation::Update(fence_entity(8), IfMatch::ETag(tag.clone())),
        BatchOperation::Insert(entry("e-8-0", 8)),
    ]);
    assert!(matches!(table(&mut s, &eight), BatchOutcome::Committed(_)));
    // Holder 7 again, at the ETag it read before: refused at operation 0, its entry unwritten.
    let stale = batch(vec![
        BatchOperation::Update(fence_entity(7), IfMatch::ETag(tag)),
        BatchOperation::Insert(entry("e-7-1", 7)),
    ]);
    assert_eq!(
        table(&mut s, &stale),
        BatchOutcome::Refused {
            index: Some(0),
            refusal: TableRefusal::ConditionNotMet
        }
    );
    assert!(s.tables.row("ledger", "book-1", "e-7-1").is_none());
    // An insert of an entity that exists, at operation 1: operation 0 is not applied either.
    let (_, tag) = read_fence(&mut s).unwrap();
    let again = batch(vec![
        BatchOperation::Update(fence_entity(9), IfMatch::ETag(tag.clone())),
        BatchOperation::Insert(entry("e-8-0", 9)),
    ]);
    assert_eq!(
        table(&mut s, &again),
        BatchOutcome::Refused {
            index: Some(1),
            refusal: TableRefusal::AlreadyExists
        }
    );
    assert_eq!(read_fence(&mut s), Some((8, tag.clone())));
    assert_eq!(
        s.tables
            .row("ledger", "book-1", "e-8-0")
            .and_then(|r| r.int64("fencingToken")),
        Some(8)
    );
    // A delete of an entity that is not there: 404, a refusal.
    let missing = batch(vec![BatchOperation::Delete {
        row_key: "nope".into(),
        if_match: IfMatch::Any,
    }]);
    assert_eq!(
        table(&mut s, &missing),
        BatchOutcome::Refused {
            index: Some(0),
            refusal: TableRefusal::NotFound
        }
    );
    let rows: Vec<&str> = s
        .tables
        .partition("ledger", "book-1")
        .map(|(r, _)| r)
        .collect();
    assert_eq!(rows, ["e-7-0", "e-8-0", "leasegate-fence"]);
}

#[test]
fn entity_writes_alone_insert_merge_and_refuse() {
    let mut s = Storage::new(START);
    s.tables.create("ledger");
    let insert = InsertEntity {
        table: ledger(),
        entity: entry("r", 5).with("note", "a"),
    };
    let leasegate::table::EntityWriteOutcome::Written(w) = table(&mut s, &insert) else {
        panic!("not written");
    };
    assert_eq!(
        table(&mut s, &insert),
        leasegate::table::EntityWriteOutcome::Refused(TableRefusal::AlreadyExists)
    );
    let merge = MergeEntity {
        table: ledger(),
        entity: Entity::new("book-1", "r").with("fencingToken", 6_i64),
        if_match: IfMatch::ETag(w.etag.clone().unwrap()),
    };
    assert!(matches!(
        table(&mut s, &merge),
        leasegate::table::EntityWriteOutcome::Written(_)
    ));
    // At the old ETag again: refused.
    assert_eq!(
        table(&mut s, &merge),
        leasegate::table::EntityWriteOutcome::Refused(TableRefusal::ConditionNotMet)
    );
    let get = GetEntity {
        table: ledger(),
        partition_key: "book-1".into(),
        row_key: "r".into(),
        select: vec![],
    };
    let stored = table(&mut s, &get).unwrap();
    assert_eq!(stored.entity.get("fencingToken"), Some(&EdmValue::Int64(6)));
    assert_eq!(stored.entity.get("note"), Some(&EdmValue::from("a")));
    // A table nobody created: an error, not a refusal.
    let other = InsertEntity {
        table: TableName::try_new("other").unwrap(),
        entity: entry("r", 1),
    };
    let request = WireRequest::from(&other.request(&account()).unwrap());
    let answer = s.handle_table(&request).to_response();
    assert!(other.parse(&answer).is_err());
}
