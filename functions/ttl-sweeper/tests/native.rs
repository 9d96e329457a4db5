//! The sweeper's tick run natively, as each deployment's cron trigger runs it, against the
//! in-memory storage (`leasegate-test-support`), with its default settings but the container
//! to sweep: blobs an application wrote with `TimeToLive` metadata are deleted once their time
//! has passed by storage's clock, kept before, and swept once when two sweepers tick at once.
//! What each case checks is what storage holds afterwards and what the ticks report.

use std::time::{Duration, Instant};

use leasegate::ops::{Metadata, PutBlob, WriteOutcome};
use leasegate::{Account, BlobClient, BlobName, ContainerName};
use leasegate_spin::timer::{Source, Tick, TimerFunction};
use leasegate_spin::web::rfc3339;
use leasegate_test_support::instance::Instance;
use leasegate_test_support::memory::{together, Memory, CONNECTION_STRING};
use serde_json::Value;
use ttl_sweeper::{Sweeper, EXPIRES_TAG};

/// 2026-11-19T14:00:00Z.
const START: u64 = 1_795_096_800;

/// A deployment sweeping the container `logs`.
fn sweeper(memory: &Memory, instance: &str) -> Instance {
    Instance::new(memory, instance, &[("ttl_containers", "logs")])
}

/// One cron tick of `instance` now: its status and answer.
async fn tick(instance: &Instance) -> (u16, Value) {
    let ctx = instance.context();
    let settings = Sweeper::load(instance.variables()).expect("the settings load");
    let t = Tick {
        at: ctx.now,
        source: Source::Cron,
        past_due: false,
    };
    let (status, answer) = Sweeper::tick(&ctx, &settings, &t, Instant::now()).await;
    (status.as_u16(), serde_json::to_value(answer).unwrap())
}

fn tick_now(instance: &Instance) -> (u16, Value) {
    pollster::block_on(tick(instance))
}

/// What an application writes (in its container `logs`, made by its set-up): blob `name`, to
/// live until `ttl` seconds from now (its `TimeToLive` metadata, RFC 3339), or unmarked.
fn write(memory: &Memory, name: &str, ttl: Option<u64>) {
    memory.storage_mut().create_container("logs");
    let container = ContainerName::try_new("logs").unwrap();
    let account = Account::from_connection_string(CONNECTION_STRING).unwrap();
    let blobs = BlobClient::new(memory.clone(), account, container.clone());
    let mut metadata = Metadata::new();
    if let Some(ttl) = ttl {
        let until = memory.now() + Duration::from_secs(ttl);
        metadata.insert("TimeToLive".into(), rfc3339(until));
    }
    let put = PutBlob::block(
        container,
        BlobName::try_new(name).unwrap(),
        b"line\n".to_vec(),
    )
    .with_metadata(metadata);
    let (outcome, _) = pollster::block_on(blobs.execute(&put, memory.now())).unwrap();
    assert!(matches!(outcome, WriteOutcome::Written(_)), "{outcome:?}");
}

fn exists(memory: &Memory, name: &str) -> bool {
    memory.storage().blob("logs", name).is_some()
}

/// The `leasegate_expires_at` tag of blob `name` of `logs`, if it has one.
fn expiry_tag(memory: &Memory, name: &str) -> Option<String> {
    let storage = memory.storage();
    storage.blob("logs", name)?.tags.get(EXPIRES_TAG).cloned()
}

/// The requests a tick sent from request `from` on, as `METHOD path?query` without the SAS.
fn sent_since(memory: &Memory, from: usize) -> Vec<String> {
    memory.sent()[from..]
        .iter()
        .map(|r| {
            let uri = r.uri.split_once("://").map_or("", |(_, u)| u);
            let target = uri.split("sv=").next().unwrap_or(uri);
            format!("{} {}", r.method, target.trim_end_matches(['&', '?']))
        })
        .collect()
}

#[test]
fn an_expired_blob_is_deleted_and_an_unexpired_one_kept() {
    let memory = Memory::new(START);
    write(&memory, "app/old.log", Some(60));
    write(&memory, "app/new.log", Some(3600));
    write(&memory, "app/kept.log", None);
    memory.advance(Duration::from_secs(61));
    let a = sweeper(&memory, "node-a");
    let (status, answer) = tick_now(&a);
    assert_eq!(status, 200, "{answer}");
    assert!(!exists(&memory, "app/old.log"), "{answer}");
    assert!(exists(&memory, "app/new.log"), "{answer}");
    assert!(exists(&memory, "app/kept.log"), "{answer}");
    assert_eq!(
        (
            &answer["deleted"],
            &answer["notExpired"],
            &answer["unmarked"]
        ),
        (&1.into(), &1.into(), &1.into()),
        "{answer}"
    );
    assert_eq!(answer["passCompleted"], true, "{answer}");
    assert!(answer.get("containersSkipped").is_none(), "{answer}");
    // The blob kept got its expiry tag, for the next passes' finds.
    let ttl = memory
        .storage()
        .blob("logs", "app/new.log")
        .unwrap()
        .metadata["timetolive"]
        .clone();
    assert_eq!(expiry_tag(&memory, "app/new.log"), Some(ttl));
    assert_eq!(expiry_tag(&memory, "app/kept.log"), None);
}

#[test]
fn a_blob_kept_is_found_by_its_tag_and_deleted_once_its_time_has_come() {
    let memory = Memory::new(START);
    write(&memory, "app/new.log", Some(120));
    let a = sweeper(&memory, "node-a");
    let (_, first) = tick_now(&a);
    assert_eq!(
        (&first["notExpired"], &first["tagged"]),
        (&1.into(), &1.into()),
        "{first}"
    );
    // A minute on, the next pass is due (ttl_pass_interval_seconds) but its time is not.
    memory.advance(Duration::from_secs(61));
    let (_, early) = tick_now(&a);
    assert_eq!(early["deleted"], 0, "{early}");
    assert!(exists(&memory, "app/new.log"));
    // Past its time: the pass after finds it by its tag (the container's listing is an hour
    // apart), reads it under a lease and deletes it.
    memory.advance(Duration::from_secs(61));
    let from = memory.sent().len();
    let (status, late) = tick_now(&a);
    assert_eq!((status, &late["deleted"]), (200, &1.into()), "{late}");
    assert!(!exists(&memory, "app/new.log"));
    let sent = sent_since(&memory, from);
    assert!(
        sent.iter().any(|r| r.starts_with(
            "GET 127.0.0.1:10000/devstoreaccount1/logs?restype=container&comp=blobs&where="
        )),
        "found by its tag: {sent:#?}"
    );
    assert!(
        !sent
            .iter()
            .any(|r| r.contains("/logs?restype=container&comp=list")),
        "not listed: {sent:#?}"
    );
}

#[test]
fn two_sweepers_at_once_delete_each_expired_blob_once() {
    let memory = Memory::new(START);
    for k in 0..12 {
        write(&memory, &format!("batch/{k:02}.log"), Some(60));
    }
    write(&memory, "batch/later.log", Some(3600));
    memory.advance(Duration::from_secs(61));
    let small = [("ttl_containers", "logs"), ("ttl_page_size", "3")];
    let a = Instance::new(&memory, "node-a", &small);
    let b = Instance::new(&memory, "node-b", &small);
    memory.take_turns(true);
    let ((sa, va), (sb, vb)) = together(tick(&a), tick(&b));
    assert_eq!((sa, sb), (200, 200), "{va} {vb}");
    let deleted = |v: &Value| v["deleted"].as_u64().unwrap();
    assert_eq!(deleted(&va) + deleted(&vb), 12, "{va} {vb}");
    for k in 0..12 {
        assert!(!exists(&memory, &format!("batch/{k:02}.log")));
    }
    assert!(exists(&memory, "batch/later.log"));
    // Each page went to one sweeper: every expired blob was asked to be deleted once.
    let deletes: Vec<String> = memory
        .sent()
        .iter()
        .filter(|r| r.method == "DELETE")
        .map(|r| r.path().to_string())
        .collect();
    let mut unique = deletes.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((deletes.len(), unique.len()), (12, 12), "{deletes:#?}");
    assert!(
        deleted(&va) > 0 && deleted(&vb) > 0,
        "both swept: {va} {vb}"
    );
}

#[test]
fn a_tick_before_the_next_pass_is_due_reads_the_state_alone() {
    let memory = Memory::new(START);
    write(&memory, "app/old.log", Some(30));
    let a = sweeper(&memory, "node-a");
    assert_eq!(tick_now(&a).1["passCompleted"], true);
    memory.advance(Duration::from_secs(40));
    // Past its time, but the pass interval (a minute) has not passed: nothing is done.
    let (from, state) = (
        memory.sent().len(),
        memory
            .storage()
            .blob("leasegate", "sweeper/state.json")
            .map(|b| b.etag),
    );
    let (status, resting) = tick_now(&a);
    assert_eq!(status, 200, "{resting}");
    assert!(
        resting["stopped"].as_str().unwrap().starts_with("resting"),
        "{resting}"
    );
    assert_eq!(
        sent_since(&memory, from),
        ["GET 127.0.0.1:10000/devstoreaccount1/leasegate/sweeper/state.json"]
    );
    assert_eq!(
        memory
            .storage()
            .blob("leasegate", "sweeper/state.json")
            .map(|b| b.etag),
        state
    );
    assert!(exists(&memory, "app/old.log"));
    // Once it has, the next tick sweeps it.
    memory.advance(Duration::from_secs(30));
    assert_eq!(tick_now(&a).1["deleted"], 1);
    assert!(!exists(&memory, "app/old.log"));
}
