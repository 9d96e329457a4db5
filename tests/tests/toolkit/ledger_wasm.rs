//! The example `examples/ledger` (fenced writes), built as `.wasm` and served by two `spin up`
//! instances of its own `spin.toml` against one Azurite (blob and table): a holder frozen
//! (SIGSTOP) in the middle of its entries, whose lease ran out and whose book another
//! deployment took and wrote, is refused by storage itself when it wakes.

use std::time::{Duration, Instant, SystemTime};

use leasegate::fence::FENCING_TOKEN;
use leasegate::ops::GetBlob;
use leasegate::table::{string_literal, QueryEntities, StoredEntity, TableClient, TableName};
use leasegate::{BlobClient, BlobName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{bad, call, expect_clear_errors, Answer, App, Manifest, Setup};
use leasegate_tests::Azurite;

const AUTH: (&str, &str) = ("authorization", "Bearer test-ledger-token-4e7a");
const JSON: (&str, &str) = ("content-type", "application/json");

fn post(app: &App, book: &str, entries: u32, pause_ms: u64) -> Answer {
    let body = format!("{{\"entries\": {entries}, \"pauseMs\": {pause_ms}}}");
    call(
        "POST",
        &app.url(&format!("/api/ledger/{book}/post")),
        &[AUTH, JSON],
        body.as_bytes(),
    )
}

/// Two deployments of the ledger sharing one container and one table.
fn two_deployments(tag: &str) -> (App, App, TableName) {
    let rand = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let table = TableName::try_new(&format!("ledger{tag}{rand}")).unwrap();
    let setup = |container| Setup {
        manifest: Manifest::Ledger,
        container,
        ..Setup::default()
    };
    let vars = |instance| [("ledger_table", table.as_str()), ("instance_id", instance)];
    let a = App::start_with(tag, &vars("deployment-a"), setup(None));
    let b = App::start_with(tag, &vars("deployment-b"), setup(Some(a.container.clone())));
    (a, b, table)
}

fn entries(table: &TableName, book: &str) -> Vec<StoredEntity> {
    let tables = TableClient::try_new(
        NativeTransport::default(),
        Azurite::shared_table().account(),
    )
    .unwrap();
    let filter = format!("PartitionKey eq {}", string_literal(book));
    let mut query = Some(QueryEntities::new(table.clone()).with_filter(filter));
    let mut out = Vec::new();
    while let Some(q) = query {
        let Ok((page, _)) = block_on(tables.execute(&q, SystemTime::now())) else {
            return out; // the table is not there yet
        };
        query = q.next(&page);
        out.extend(page.entities);
    }
    out.retain(|e| {
        !e.entity
            .row_key
            .starts_with(leasegate::fence::FENCE_ROW_PREFIX)
    });
    out
}

fn token_of(e: &StoredEntity) -> u64 {
    e.entity
        .get(FENCING_TOKEN)
        .and_then(|v| v.as_i64())
        .unwrap() as u64
}

fn ledger_blob(app: &App, book: &str) -> serde_json::Value {
    let blobs = BlobClient::new(
        NativeTransport::default(),
        app.azurite().account(),
        app.container.clone(),
    );
    let get = GetBlob {
        container: app.container.clone(),
        blob: BlobName::try_new(&format!("ledger/{book}.json")).unwrap(),
    };
    let (content, _) = block_on(blobs.execute(&get, SystemTime::now())).unwrap();
    serde_json::from_slice(&content.expect("the ledger blob exists").body).unwrap()
}

/// Waits for `until`, with a deadline.
fn wait_for(what: &str, deadline: Duration, mut until: impl FnMut() -> bool) {
    let start = Instant::now();
    while !until() {
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Deployment A takes the book and is frozen after two of its six entries; its 15 s lease runs
/// out; B (told 429 while A held it) posts and writes; A is thawed: A answers `fenced_out`
/// with the entries it wrote, none of its entries is newer than B's first, and the blob holds
/// B's token.
#[test]
fn a_frozen_holder_is_fenced_out_when_it_wakes() {
    let (a, b, table) = two_deployments("frozen");
    let book = "acme";
    let started = Instant::now();
    std::thread::scope(|s| {
        let first = s.spawn(|| post(&a, book, 6, 700));
        wait_for("A's second entry", Duration::from_secs(30), || {
            entries(&table, book).len() >= 2
        });
        a.spin.pause();
        let frozen_at = Instant::now();
        let frozen_with = entries(&table, book).len();
        // While A's lease runs, B is told to come back.
        let refused = post(&b, book, 2, 0);
        assert_eq!(refused.status, 429, "{}", refused.text);
        let retry: u64 = refused.headers["retry-after"].parse().unwrap();
        assert!((1..=15).contains(&retry), "{retry}");
        assert_eq!(refused.json["error"], "busy");
        // Once A's lease ran out, B takes the book and writes.
        let mut second = refused;
        wait_for("B to take the book", Duration::from_secs(40), || {
            second = post(&b, book, 2, 0);
            second.status != 429
        });
        assert_eq!(second.status, 200, "{}", second.text);
        assert_eq!(second.json["written"], 2);
        let b_token = second.json[FENCING_TOKEN].as_u64().unwrap();
        let frozen_for = frozen_at.elapsed();
        a.spin.resume();
        let first = first.join().unwrap();
        assert_eq!(first.status, 409, "{}", first.text);
        assert_eq!(first.json["error"], "fenced_out");
        let a_token = first.json[FENCING_TOKEN].as_u64().unwrap();
        assert!(b_token > a_token, "{b_token} > {a_token}");
        let written = first.json["written"].as_u64().unwrap();
        let stored = entries(&table, book);
        let of = |t: u64| {
            stored
                .iter()
                .filter(|e| token_of(e) == t)
                .collect::<Vec<_>>()
        };
        let (of_a, of_b) = (of(a_token), of(b_token));
        assert_eq!(
            of_a.len() as u64,
            written,
            "A's entries are what A answered"
        );
        assert!(
            (2..6).contains(&of_a.len()) && of_a.len() <= frozen_with + 1,
            "A wrote {} entries, {frozen_with} when frozen",
            of_a.len()
        );
        assert_eq!(of_b.len(), 2);
        let b_first = of_b.iter().filter_map(|e| e.timestamp).min().unwrap();
        let a_last = of_a.iter().filter_map(|e| e.timestamp).max().unwrap();
        assert!(a_last <= b_first, "no entry of A's is newer than B's first");
        assert_eq!(stored.len(), of_a.len() + 2, "every entry is A's or B's");
        let blob = ledger_blob(&a, book);
        assert_eq!(blob[FENCING_TOKEN], b_token, "{blob}");
        assert_eq!(blob["instance"], "deployment-b");
        eprintln!(
            "frozen holder: A (token {a_token}) wrote {written} of 6 entries, frozen {:.1} s; \
             B (token {b_token}) wrote 2; whole test {:.1} s",
            frozen_for.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
    });
    a.assert_no_trap();
    b.assert_no_trap();
}

/// A post that holds the book alone writes every entry and the blob, and gives the book back:
/// the next post, on the other deployment, takes it at once with a larger token. Bad input
/// gets a clear 4xx.
#[test]
fn posts_take_turns_and_bad_input_is_named() {
    let (a, b, table) = two_deployments("turns");
    let one = post(&a, "books-2026", 3, 0);
    assert_eq!(one.status, 200, "{}", one.text);
    assert_eq!(one.json["written"], 3);
    let two = post(&b, "books-2026", 1, 0);
    assert_eq!(two.status, 200, "{}", two.text);
    assert!(two.json[FENCING_TOKEN].as_u64() > one.json[FENCING_TOKEN].as_u64());
    assert_eq!(entries(&table, "books-2026").len(), 4);
    assert_eq!(
        ledger_blob(&a, "books-2026")[FENCING_TOKEN],
        two.json[FENCING_TOKEN]
    );
    let body = br#"{"entries": 1}"#;
    let cases = [
        bad("POST", "/api/ledger/acme/post", &[JSON], body, 401),
        bad("GET", "/api/ledger/acme/post", &[AUTH], b"", 405),
        bad("POST", "/api/ledger/acme", &[AUTH, JSON], body, 404),
        bad("POST", "/api/ledger/a%2Fb/post", &[AUTH, JSON], body, 400),
        bad("POST", "/api/ledger/acme/post", &[AUTH], body, 415),
        bad(
            "POST",
            "/api/ledger/acme/post",
            &[AUTH, JSON],
            b"{\"entries\": 0}",
            400,
        ),
        bad(
            "POST",
            "/api/ledger/acme/post",
            &[AUTH, JSON],
            b"{\"entries\": 2, \"pauseMs\": -1}",
            400,
        ),
        bad(
            "POST",
            "/api/ledger/acme/post",
            &[AUTH, JSON],
            b"not json",
            400,
        ),
    ];
    expect_clear_errors(&a, &cases, &["test-ledger-token-4e7a"]);
}

/// A lost answer on each write of a post in turn (the blob's puts, the claim's and each entry's
/// batch): the
/// post asks once more, which the fence makes safe, and answers 200 with every entry written
/// once and the blob holding its token.
#[test]
fn a_lost_answer_on_any_write_of_a_post_writes_each_entry_once() {
    use leasegate_tests::proxy::Fault;
    let (a, _b, table) = two_deployments("lost");
    let tables = a.tables.as_ref().expect("the ledger's table proxy");
    // The post's writes: the blob ("posting"), the claim's batch, 3 entries' batches, the blob.
    let writes = [
        "blob 1", "batch 1", "batch 2", "batch 3", "batch 4", "blob 2",
    ];
    for (n, write) in writes.iter().enumerate() {
        let book = format!("lost-{n}");
        let (what, k) = write.split_once(' ').unwrap();
        let k: usize = k.parse().unwrap();
        match what {
            "blob" => a
                .storage
                .fault_nth(&format!("ledger/{book}.json"), Fault::LoseAnswer, k),
            _ => tables.fault_nth("$batch", Fault::LoseAnswer, k),
        }
        let answer = post(&a, &book, 3, 0);
        assert_eq!(
            answer.status, 200,
            "lost answer on {write}: {}",
            answer.text
        );
        assert_eq!(answer.json["written"], 3, "{write}");
        let token = answer.json[FENCING_TOKEN].as_u64().unwrap();
        let stored = entries(&table, &book);
        assert_eq!(stored.len(), 3, "{write}: each entry once");
        assert!(stored.iter().all(|e| token_of(e) == token), "{write}");
        assert_eq!(ledger_blob(&a, &book)[FENCING_TOKEN], token, "{write}");
        let applied = |p: &leasegate_tests::proxy::Proxy| -> usize {
            p.faults_applied().iter().map(|(_, k)| k).sum()
        };
        let lost = applied(&a.storage) + applied(tables);
        assert_eq!(lost, n + 1, "{write}: the fault was applied");
    }
}
