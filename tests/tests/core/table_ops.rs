//! Every Table operation of the core against a real Azurite table emulator (`azurite-table`
//! from the pinned package): each request is built and signed by `leasegate::table`, sent by
//! the native transport, and its outcome read back from storage.

use std::path::Path;
use std::time::SystemTime;

use leasegate::table::{
    Batch, BatchOperation, BatchOutcome, CreateTable, DeleteEntity, EdmValue, Entity,
    EntityDeleteOutcome, EntityTag, EntityWriteOutcome, GetEntity, IfMatch, InsertEntity,
    MergeEntity, QueryEntities, StoredEntity, TableClient, TableCreated, TableName, TableOperation,
    TableRefusal, UpdateEntity, UpsertEntity, UpsertMode, MAX_BATCH_OPERATIONS,
};
use leasegate::{Counting, ErrorClass, Transport};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::Azurite;

fn client() -> TableClient<Counting<NativeTransport>> {
    TableClient::try_new(
        Counting::new(NativeTransport::default()),
        Azurite::shared_table().account(),
    )
    .expect("the account has a table endpoint")
}

fn exec<O: TableOperation, T: Transport>(
    tables: &TableClient<T>,
    op: &O,
) -> Result<O::Output, leasegate::Error> {
    block_on(tables.execute(op, SystemTime::now())).map(|(output, _date)| output)
}

/// A new table with a name of its own.
fn new_table(tables: &TableClient<impl Transport>, tag: &str) -> TableName {
    let rand = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let table = TableName::try_new(&format!("t{tag}{rand}")).unwrap();
    let created = exec(
        tables,
        &CreateTable {
            table: table.clone(),
        },
    )
    .unwrap();
    assert_eq!(created, TableCreated::Created);
    table
}

fn read(
    tables: &TableClient<impl Transport>,
    table: &TableName,
    pk: &str,
    rk: &str,
) -> Option<StoredEntity> {
    let get = GetEntity {
        table: table.clone(),
        partition_key: pk.into(),
        row_key: rk.into(),
        select: vec![],
    };
    exec(tables, &get).unwrap()
}

fn etag_of(outcome: EntityWriteOutcome) -> EntityTag {
    match outcome {
        EntityWriteOutcome::Written(w) => w.etag.expect("a write answers its ETag"),
        other => panic!("expected a write, got {other:?}"),
    }
}

/// Two of the signing vectors, sent exactly as recorded (the port aside, which is not signed):
/// Azurite takes their signatures, and refuses one with a changed signature (so it checks).
#[test]
fn the_signing_vectors_are_accepted_by_azurite() {
    let azurite = Azurite::shared_table();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/leasegate/tests/table-vectors");
    let transport = NativeTransport::default();
    let vector = |case: &str| {
        let read = |file: &str| std::fs::read_to_string(dir.join(case).join(file)).unwrap();
        let text = read("request.http").replace("127.0.0.1:10002", &azurite.authority());
        let (head, body) = text.split_once("\n\n").unwrap();
        let mut lines = head.lines();
        let (method, url) = lines.next().unwrap().split_once(' ').unwrap();
        let mut request = leasegate::Request::new(method.parse().unwrap(), url);
        for line in lines {
            let (name, value) = line.split_once(':').unwrap();
            request = request.with_header(name.trim(), value.trim());
        }
        request
            .with_header("authorization", read("authorization.txt").trim_end())
            .with_body(body.as_bytes().to_vec())
    };
    let created = transport
        .send_blocking(vector("create-table-path-style"))
        .unwrap();
    assert_eq!(created.status().as_u16(), 204, "create table: {created:?}");
    let listed = transport
        .send_blocking(vector("query-tables-path-style"))
        .unwrap();
    assert_eq!(listed.status().as_u16(), 200, "query tables: {listed:?}");
    let names = String::from_utf8_lossy(listed.body()).to_string();
    assert!(names.contains("\"vectortable\""), "{names}");
    // A wrong signature is refused: Azurite does check them.
    let mut forged = vector("query-tables-path-style");
    let auth = forged
        .headers()
        .get("authorization")
        .unwrap()
        .replace(':', ":A");
    forged.headers_mut().insert("authorization", auth);
    let refused = transport.send_blocking(forged).unwrap();
    assert_eq!(refused.status().as_u16(), 403, "{refused:?}");
}

#[test]
fn create_table_twice_is_already_exists() {
    let tables = client();
    let table = new_table(&tables, "twice");
    let again = exec(&tables, &CreateTable { table }).unwrap();
    assert_eq!(again, TableCreated::AlreadyExists);
}

#[test]
fn entity_writes_and_their_conditions() {
    let tables = client();
    let table = new_table(&tables, "writes");
    let entity = Entity::new("book-1", "0001")
        .with("amount", 42)
        .with("note", "o'brien");
    let insert = InsertEntity {
        table: table.clone(),
        entity: entity.clone(),
    };
    let first = etag_of(exec(&tables, &insert).unwrap());
    assert_eq!(
        exec(&tables, &insert).unwrap(),
        EntityWriteOutcome::Refused(TableRefusal::AlreadyExists)
    );
    let stored = read(&tables, &table, "book-1", "0001").expect("inserted");
    assert_eq!(stored.entity, entity);
    assert_eq!(
        stored.etag.as_ref(),
        Some(&first),
        "a read gives the write's ETag"
    );

    // Merge (If-Match *) sets one property and keeps the others.
    let merge = MergeEntity {
        table: table.clone(),
        entity: Entity::new("book-1", "0001").with("checked", true),
        if_match: IfMatch::Any,
    };
    let merged = etag_of(exec(&tables, &merge).unwrap());
    assert_ne!(merged, first);
    let stored = read(&tables, &table, "book-1", "0001").unwrap();
    assert_eq!(stored.entity.get("amount"), Some(&EdmValue::Int32(42)));
    assert_eq!(stored.entity.get("checked"), Some(&EdmValue::Boolean(true)));

    // Update (replace) If-Match the first ETag: it moved on, refused, nothing changed.
    let replace = |if_match| UpdateEntity {
        table: table.clone(),
        entity: Entity::new("book-1", "0001").with("amount", 43),
        if_match,
    };
    assert_eq!(
        exec(&tables, &replace(IfMatch::ETag(first.clone()))).unwrap(),
        EntityWriteOutcome::Refused(TableRefusal::ConditionNotMet)
    );
    assert_eq!(
        read(&tables, &table, "book-1", "0001")
            .unwrap()
            .entity
            .get("amount"),
        Some(&EdmValue::Int32(42))
    );
    let replaced = etag_of(exec(&tables, &replace(IfMatch::ETag(merged))).unwrap());
    let stored = read(&tables, &table, "book-1", "0001").unwrap();
    assert_eq!(
        stored.entity,
        Entity::new("book-1", "0001").with("amount", 43),
        "replaced whole"
    );

    // Update or merge of an entity that is not there.
    let missing = UpdateEntity {
        table: table.clone(),
        entity: Entity::new("book-1", "missing"),
        if_match: IfMatch::Any,
    };
    assert_eq!(
        exec(&tables, &missing).unwrap(),
        EntityWriteOutcome::Refused(TableRefusal::NotFound)
    );
    let merge_missing = MergeEntity {
        table: table.clone(),
        entity: Entity::new("book-1", "missing"),
        if_match: IfMatch::Any,
    };
    assert_eq!(
        exec(&tables, &merge_missing).unwrap(),
        EntityWriteOutcome::Refused(TableRefusal::NotFound)
    );
    assert_eq!(read(&tables, &table, "book-1", "missing"), None);

    // Upserts: merge keeps, replace drops; either creates.
    let upsert = |entity: Entity, mode| UpsertEntity {
        table: table.clone(),
        entity,
        mode,
    };
    etag_of(
        exec(
            &tables,
            &upsert(
                Entity::new("book-1", "0001").with("x", 1),
                UpsertMode::Merge,
            ),
        )
        .unwrap(),
    );
    let stored = read(&tables, &table, "book-1", "0001").unwrap();
    assert_eq!(
        (stored.entity.get("amount"), stored.entity.get("x")),
        (Some(&EdmValue::Int32(43)), Some(&EdmValue::Int32(1)))
    );
    etag_of(
        exec(
            &tables,
            &upsert(
                Entity::new("book-1", "0001").with("y", 2),
                UpsertMode::Replace,
            ),
        )
        .unwrap(),
    );
    let stored = read(&tables, &table, "book-1", "0001").unwrap();
    assert_eq!(stored.entity, Entity::new("book-1", "0001").with("y", 2));
    etag_of(
        exec(
            &tables,
            &upsert(Entity::new("book-1", "0002"), UpsertMode::Merge),
        )
        .unwrap(),
    );
    etag_of(
        exec(
            &tables,
            &upsert(Entity::new("book-1", "0003"), UpsertMode::Replace),
        )
        .unwrap(),
    );
    assert!(read(&tables, &table, "book-1", "0002").is_some());
    assert!(read(&tables, &table, "book-1", "0003").is_some());

    // Delete: a stale ETag is refused, the current one deletes, a second delete finds nothing.
    let delete = |if_match| DeleteEntity {
        table: table.clone(),
        partition_key: "book-1".into(),
        row_key: "0001".into(),
        if_match,
    };
    assert_eq!(
        exec(&tables, &delete(IfMatch::ETag(replaced))).unwrap(),
        EntityDeleteOutcome::Refused(TableRefusal::ConditionNotMet)
    );
    assert!(read(&tables, &table, "book-1", "0001").is_some());
    let current = read(&tables, &table, "book-1", "0001")
        .unwrap()
        .etag
        .unwrap();
    assert_eq!(
        exec(&tables, &delete(IfMatch::ETag(current))).unwrap(),
        EntityDeleteOutcome::Deleted
    );
    assert_eq!(read(&tables, &table, "book-1", "0001"), None);
    assert_eq!(
        exec(&tables, &delete(IfMatch::Any)).unwrap(),
        EntityDeleteOutcome::Refused(TableRefusal::NotFound)
    );
}

#[test]
fn a_point_read_of_a_missing_entity_or_table() {
    let tables = client();
    let table = new_table(&tables, "missing");
    assert_eq!(read(&tables, &table, "p", "nothing here"), None);
    let nowhere = GetEntity {
        table: TableName::try_new("tNoSuchTable").unwrap(),
        partition_key: "p".into(),
        row_key: "r".into(),
        select: vec![],
    };
    let err = exec(&tables, &nowhere).unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::TableMissing), "{err}");
}

/// Keys with quotes, spaces, commas and non-ASCII text are addressed (and signed) as sent.
#[test]
fn keys_that_need_quoting_and_encoding() {
    let tables = client();
    let table = new_table(&tables, "keys");
    for (pk, rk) in [
        ("o'brien", "a b,c"),
        ("caf\u{e9} = 1", "'quoted' (x)"),
        ("", "%41+&"),
    ] {
        let entity = Entity::new(pk, rk).with("n", 1);
        etag_of(
            exec(
                &tables,
                &InsertEntity {
                    table: table.clone(),
                    entity: entity.clone(),
                },
            )
            .unwrap(),
        );
        let stored = read(&tables, &table, pk, rk).unwrap_or_else(|| panic!("{pk:?}/{rk:?}"));
        assert_eq!(stored.entity, entity);
        let gone = DeleteEntity {
            table: table.clone(),
            partition_key: pk.into(),
            row_key: rk.into(),
            if_match: IfMatch::Any,
        };
        assert_eq!(
            exec(&tables, &gone).unwrap(),
            EntityDeleteOutcome::Deleted,
            "{pk:?}/{rk:?}"
        );
    }
}

/// A fencing token is an Int64: above 2^53 (where a JSON number stops being exact in many
/// readers) it round-trips exactly, and a `$filter` compares it as an Int64.
#[test]
fn int64_round_trips_above_2_pow_53() {
    let tables = client();
    let table = new_table(&tables, "int64");
    let tokens = [(1_i64 << 53) + 1, i64::MAX, -(1_i64 << 60) - 3];
    for (i, token) in tokens.iter().enumerate() {
        let entity = Entity::new("p", format!("{i}")).with("fencingToken", *token);
        etag_of(
            exec(
                &tables,
                &InsertEntity {
                    table: table.clone(),
                    entity,
                },
            )
            .unwrap(),
        );
    }
    for (i, token) in tokens.iter().enumerate() {
        let stored = read(&tables, &table, "p", &i.to_string()).unwrap();
        assert_eq!(
            stored.entity.get("fencingToken"),
            Some(&EdmValue::Int64(*token))
        );
    }
    let above = QueryEntities::new(table.clone()).with_filter(format!(
        "fencingToken gt {}",
        leasegate::table::int64_literal(1_i64 << 53)
    ));
    let page = exec(&tables, &above).unwrap();
    let found: Vec<i64> = page
        .entities
        .iter()
        .map(|e| {
            e.entity
                .get("fencingToken")
                .and_then(EdmValue::as_i64)
                .unwrap()
        })
        .collect();
    assert_eq!(found, vec![(1_i64 << 53) + 1, i64::MAX]);
}

#[test]
fn a_query_continues_over_pages() {
    let tables = client();
    let table = new_table(&tables, "pages");
    let mut batch = Batch::new(table.clone(), "book-1").unwrap();
    for i in 0..7 {
        let entity = Entity::new("book-1", format!("{i:04}"))
            .with("n", i)
            .with("odd", i % 2 == 1);
        batch.push(BatchOperation::Insert(entity)).unwrap();
    }
    assert!(
        matches!(exec(&tables, &batch).unwrap(), BatchOutcome::Committed(items) if items.len() == 7)
    );
    let other = Entity::new("book-2", "0000").with("n", 100);
    etag_of(
        exec(
            &tables,
            &InsertEntity {
                table: table.clone(),
                entity: other,
            },
        )
        .unwrap(),
    );

    let mut query = Some(
        QueryEntities::new(table.clone())
            .with_filter(format!(
                "PartitionKey eq {}",
                leasegate::table::string_literal("book-1")
            ))
            .with_select(&["n"])
            .with_top(3),
    );
    let (mut rows, mut pages) = (Vec::new(), 0);
    while let Some(q) = query {
        let page = exec(&tables, &q).unwrap();
        assert!(page.entities.len() <= 3);
        pages += 1;
        for e in &page.entities {
            assert_eq!(
                e.entity.properties.len(),
                1,
                "$select returns n only: {e:?}"
            );
            rows.push((e.entity.row_key.clone(), e.entity.get("n").cloned()));
        }
        query = q.next(&page);
    }
    assert_eq!(pages, 3, "7 entities in pages of 3");
    let want: Vec<_> = (0..7)
        .map(|i| (format!("{i:04}"), Some(EdmValue::Int32(i))))
        .collect();
    assert_eq!(rows, want);
}

#[test]
fn a_batch_commits_every_operation() {
    let tables = client();
    let table = new_table(&tables, "commit");
    let fence = etag_of(
        exec(
            &tables,
            &InsertEntity {
                table: table.clone(),
                entity: Entity::new("book-1", "fence").with("fencingToken", 5_i64),
            },
        )
        .unwrap(),
    );
    etag_of(
        exec(
            &tables,
            &InsertEntity {
                table: table.clone(),
                entity: Entity::new("book-1", "old"),
            },
        )
        .unwrap(),
    );
    let batch = Batch::new(table.clone(), "book-1")
        .unwrap()
        .with(BatchOperation::Update(
            Entity::new("book-1", "fence").with("fencingToken", 7_i64),
            IfMatch::ETag(fence),
        ))
        .unwrap()
        .with(BatchOperation::Insert(
            Entity::new("book-1", "0001").with("fencingToken", 7_i64),
        ))
        .unwrap()
        .with(BatchOperation::Upsert(
            Entity::new("book-1", "0002").with("fencingToken", 7_i64),
            UpsertMode::Merge,
        ))
        .unwrap()
        .with(BatchOperation::Merge(
            Entity::new("book-1", "old").with("seen", true),
            IfMatch::Any,
        ))
        .unwrap()
        .with(BatchOperation::Delete {
            row_key: "old2".into(),
            if_match: IfMatch::Any,
        })
        .unwrap();
    // The delete's entity exists too.
    etag_of(
        exec(
            &tables,
            &InsertEntity {
                table: table.clone(),
                entity: Entity::new("book-1", "old2"),
            },
        )
        .unwrap(),
    );
    let items = match exec(&tables, &batch).unwrap() {
        BatchOutcome::Committed(items) => items,
        other => panic!("{other:?}"),
    };
    assert_eq!(items.len(), 5);
    let fence = read(&tables, &table, "book-1", "fence").unwrap();
    assert_eq!(fence.entity.get("fencingToken"), Some(&EdmValue::Int64(7)));
    assert_eq!(
        items[0].etag.as_ref(),
        fence.etag.as_ref(),
        "the answer's ETag is the entity's"
    );
    assert!(read(&tables, &table, "book-1", "0001").is_some());
    assert!(read(&tables, &table, "book-1", "0002").is_some());
    assert_eq!(
        read(&tables, &table, "book-1", "old")
            .unwrap()
            .entity
            .get("seen"),
        Some(&EdmValue::Boolean(true))
    );
    assert_eq!(read(&tables, &table, "book-1", "old2"), None);
}

/// The fence: a holder read the fence entity under token 5; a newer holder wrote it since. The
/// stale holder's batch (its fence update `If-Match` the ETag it read, and its data) is refused
/// at the fence's index, and its data is not written (the batch is atomic).
#[test]
fn a_batch_whose_fence_moved_on_writes_nothing() {
    let tables = client();
    let table = new_table(&tables, "fence");
    let read_by_stale = etag_of(
        exec(
            &tables,
            &InsertEntity {
                table: table.clone(),
                entity: Entity::new("book-1", "fence").with("fencingToken", 5_i64),
            },
        )
        .unwrap(),
    );
    let newer = UpdateEntity {
        table: table.clone(),
        entity: Entity::new("book-1", "fence").with("fencingToken", 6_i64),
        if_match: IfMatch::ETag(read_by_stale.clone()),
    };
    etag_of(exec(&tables, &newer).unwrap());

    for (fence_at, batch) in [
        (0, vec![fence_update(&read_by_stale), data("0001")]),
        (
            2,
            vec![data("0001"), data("0002"), fence_update(&read_by_stale)],
        ),
    ] {
        let mut b = Batch::new(table.clone(), "book-1").unwrap();
        for op in batch {
            b.push(op).unwrap();
        }
        assert_eq!(
            exec(&tables, &b).unwrap(),
            BatchOutcome::Refused {
                index: Some(fence_at),
                refusal: TableRefusal::ConditionNotMet
            },
        );
        assert_eq!(
            read(&tables, &table, "book-1", "0001"),
            None,
            "no data of the stale batch"
        );
        assert_eq!(
            read(&tables, &table, "book-1", "0002"),
            None,
            "no data of the stale batch"
        );
        let fence = read(&tables, &table, "book-1", "fence").unwrap();
        assert_eq!(fence.entity.get("fencingToken"), Some(&EdmValue::Int64(6)));
    }
}

fn fence_update(etag: &EntityTag) -> BatchOperation {
    BatchOperation::Update(
        Entity::new("book-1", "fence").with("fencingToken", 7_i64),
        IfMatch::ETag(etag.clone()),
    )
}

fn data(row: &str) -> BatchOperation {
    BatchOperation::Insert(Entity::new("book-1", row).with("fencingToken", 7_i64))
}

#[test]
fn a_batch_insert_of_an_existing_entity_names_it() {
    let tables = client();
    let table = new_table(&tables, "exists");
    etag_of(
        exec(
            &tables,
            &InsertEntity {
                table: table.clone(),
                entity: Entity::new("p", "b"),
            },
        )
        .unwrap(),
    );
    let batch = Batch::new(table.clone(), "p")
        .unwrap()
        .with(BatchOperation::Insert(Entity::new("p", "a")))
        .unwrap()
        .with(BatchOperation::Insert(Entity::new("p", "b")))
        .unwrap()
        .with(BatchOperation::Insert(Entity::new("p", "c")))
        .unwrap();
    assert_eq!(
        exec(&tables, &batch).unwrap(),
        BatchOutcome::Refused {
            index: Some(1),
            refusal: TableRefusal::AlreadyExists
        }
    );
    assert_eq!(read(&tables, &table, "p", "a"), None);
    assert_eq!(read(&tables, &table, "p", "c"), None);
}

/// 100 operations is a batch storage takes; the 101st is refused while the batch is built,
/// so nothing is sent.
#[test]
fn the_100_operation_limit_is_kept_before_sending() {
    let tables = client();
    let table = new_table(&tables, "limit");
    let mut batch = Batch::new(table.clone(), "p").unwrap();
    for i in 0..MAX_BATCH_OPERATIONS {
        batch
            .push(BatchOperation::Insert(Entity::new("p", format!("{i:03}"))))
            .unwrap();
    }
    let sent = tables.transport().sent();
    let err = batch
        .push(BatchOperation::Insert(Entity::new("p", "100")))
        .unwrap_err();
    assert!(err.to_string().contains("at most 100 operations"), "{err}");
    assert_eq!(tables.transport().sent(), sent, "nothing was sent");
    assert!(
        matches!(exec(&tables, &batch).unwrap(), BatchOutcome::Committed(items) if items.len() == 100)
    );
    let mut query = Some(QueryEntities::new(table.clone()));
    let mut count = 0;
    while let Some(q) = query {
        let page = exec(&tables, &q).unwrap();
        count += page.entities.len();
        query = q.next(&page);
    }
    assert_eq!(count, 100);
    assert_eq!(read(&tables, &table, "p", "100"), None);
}

/// A batch to a table that does not exist is an error naming the operation, not a refusal.
#[test]
fn a_batch_to_a_missing_table_is_an_error() {
    let tables = client();
    let batch = Batch::new(TableName::try_new("tNoSuchBatchTable").unwrap(), "p")
        .unwrap()
        .with(BatchOperation::Insert(Entity::new("p", "a")))
        .unwrap();
    match exec(&tables, &batch) {
        Err(leasegate::Error::Batch { index, error }) => {
            assert_eq!(index, Some(0));
            assert_eq!(error.class, ErrorClass::TableMissing, "{error}");
            assert_eq!(error.status.as_u16(), 404);
        }
        other => panic!("{other:?}"),
    }
}
