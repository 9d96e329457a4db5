//! The timer functions and the example with Microsoft Entra ID tokens only, under the real
//! `spin up`: storage is the Azurite that checks bearer tokens (`--oauth basic`, over HTTPS
//! through the TLS proxy), tokens come from each app's own token server. scheduled-job runs an
//! occurrence once, leader elects one leader among two deployments, init-once runs once and
//! then answers done, ttl-sweeper deletes and moves expired blobs (the move's copy authorizing
//! its source with the token), the example ship-once ships an order once, and scheduled-job on
//! the real cron plugin runs its occurrences. Each checks what storage holds (read back by the
//! test with the development key through a plain proxy), every storage request the app's proxy
//! saw carried `Bearer`, one token served many invocations, and no secret shows.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{LockInfo, LockStatus, Locks};
use leasegate::ops::{CreateContainer, GetBlob, ListBlobs, Metadata, PutBlob};
use leasegate::{BlobName, ContainerName, LockName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{call, Answer, App, Entra, Manifest, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::entra::{assert_all_bearer, TokenKind};
use leasegate_tests::proxy::Seen;
use leasegate_tests::{unique_container, unix_now, wait_for};
use serde_json::{json, Value};

const JOB: &str = "example-job";
const JSON: (&str, &str) = ("content-type", "application/json");
const SHIP_AUTH: (&str, &str) = ("authorization", "Bearer test-ship-token-2a6f");

fn entra_app(tag: &str, entra: Entra, vars: &[(&str, &str)], setup: Setup) -> App {
    App::start_with(
        tag,
        vars,
        Setup {
            entra: Some(entra),
            ..setup
        },
    )
}

/// `METHOD comp path` of each request: never its headers' values (a copy's carries a token).
fn described(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .map(|s| format!("{} {} [{}]", s.describe(), s.path(), s.auth))
        .collect()
}

/// Every storage request the app ever sent carried a bearer token.
fn app_all_bearer(app: &App) {
    assert_all_bearer(&app.storage.seen());
}

/// The app's token server handed out exactly `n` tokens, each asked for with the right kind of
/// request and the credential it expects.
fn tokens_handed_out(app: &App, entra: Entra, n: usize) {
    let asked = app.tokens().requests();
    assert_eq!(app.tokens().token_count(), n, "{asked:#?}");
    let kind = match entra {
        Entra::ManagedIdentity => TokenKind::Identity,
        Entra::ClientSecret => TokenKind::ClientCredentials,
    };
    for r in &asked {
        assert_eq!(r.kind, kind, "{asked:#?}");
        assert_eq!(
            r.credential,
            leasegate_tests::entra::Credential::Matched,
            "{asked:#?}"
        );
        assert_eq!(r.status, 200, "{asked:#?}");
    }
}

fn inspect_locks(app: &App, container: &ContainerName, prefix: &str) -> Locks<NativeTransport> {
    Locks::new(
        NativeTransport::default(),
        app.inspect_account(),
        container.clone(),
    )
    .with_prefix(prefix)
}

fn inspect_lock(app: &App, prefix: &str, name: &str) -> LockInfo {
    let locks = inspect_locks(app, &app.container, prefix);
    block_on(locks.inspect(&LockName::try_new(name).unwrap(), SystemTime::now()))
        .expect("the test reads the lock")
}

/// A blob's content, `None` when it does not exist.
fn read_blob(app: &App, container: &ContainerName, name: &str) -> Option<Vec<u8>> {
    let locks = inspect_locks(app, container, "");
    let get = GetBlob {
        container: container.clone(),
        blob: BlobName::try_new(name).unwrap(),
    };
    let (blob, _) =
        block_on(locks.client().execute(&get, SystemTime::now())).expect("the test reads");
    blob.map(|b| b.body)
}

/// Every blob of a container (one page: the tests make few): name -> metadata.
fn list_blobs(app: &App, container: &ContainerName, prefix: &str) -> BTreeMap<String, Metadata> {
    let locks = inspect_locks(app, container, "");
    let op = ListBlobs {
        prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
        include_metadata: true,
        ..ListBlobs::new(container.clone())
    };
    match block_on(locks.client().execute(&op, SystemTime::now())) {
        Ok((page, _)) => {
            assert!(page.next_marker.is_none(), "more than one page");
            page.blobs
                .into_iter()
                .map(|b| (b.name, b.properties.metadata))
                .collect()
        }
        Err(e) if e.class() == Some(leasegate::ErrorClass::ContainerMissing) => BTreeMap::new(),
        Err(e) => panic!("the test lists {}: {e}", container.as_str()),
    }
}

fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
        .to_string()
}

/// A manual run (the admin token) of an occurrence the test chose: the tick token names only
/// the occurrence due now.
fn job_tick(app: &App, occurrence: u64) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/jobs/{JOB}/tick")),
        &[ADMIN_AUTH, JSON],
        json!({ "at": rfc3339(occurrence) }).to_string().as_bytes(),
    )
}

fn posts(app: &App, path: &str) -> Vec<Value> {
    app.sink
        .received()
        .into_iter()
        .filter(|r| r.path == path)
        .map(|r| r.body)
        .collect()
}

fn reservation(occurrence: u64) -> String {
    format!("jobs/{JOB}/occurrences/{occurrence:012}")
}

/// scheduled-job over HTTP ticks with a managed identity: an occurrence runs once (one job
/// call), a second tick for it is skipped naming the runner, the reservation and the log are in
/// storage; five more occurrences run once each on the one token.
#[test]
fn a_scheduled_job_runs_an_occurrence_once_with_tokens() {
    let app = entra_app(
        "entra-job",
        Entra::ManagedIdentity,
        &[("instance_id", "node-j"), ("job_early_seconds", "7200")],
        Setup::default(),
    );
    let base = (unix_now() / 60 + 5) * 60;
    let (ran, seen) = app.counted(|| job_tick(&app, base));
    assert_eq!(ran.status, 200, "{}", ran.text);
    assert_eq!(ran.json["decision"], "ran", "{}", ran.text);
    assert_all_bearer(&seen);
    assert_eq!(ran.json["storageRoundTrips"], seen.len(), "{}", ran.text);
    let calls = posts(&app, "/job");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["occurrenceUnix"], base, "{}", calls[0]);
    assert_eq!(calls[0]["instance"], "node-j", "{}", calls[0]);
    assert_eq!(calls[0]["job"], JOB, "{}", calls[0]);

    // The same occurrence again: skipped, naming the runner, not run.
    let (again, seen) = app.counted(|| job_tick(&app, base));
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["decision"], "skipped", "{}", again.text);
    assert_eq!(again.json["reservedBy"], "node-j", "{}", again.text);
    assert_all_bearer(&seen);
    assert_eq!(posts(&app, "/job").len(), 1);

    // What storage holds: the reservation, and the log naming the run.
    assert!(
        read_blob(&app, &app.container, &reservation(base)).is_some(),
        "no reservation for the occurrence"
    );
    let log: Value = serde_json::from_slice(
        &read_blob(&app, &app.container, &format!("jobs/{JOB}/log.json")).expect("the log"),
    )
    .expect("the log is JSON");
    let newest = &log["entries"][0];
    assert_eq!(newest["occurrenceUnix"], base, "{log}");
    assert_eq!(newest["instance"], "node-j", "{log}");
    assert_eq!(newest["status"], "succeeded", "{log}");

    // Five more occurrences, each once, on the one token.
    let mut answers = vec![ran, again];
    for i in 1..=5 {
        let occ = base + 60 * i;
        let a = job_tick(&app, occ);
        assert_eq!(a.json["decision"], "ran", "{}", a.text);
        let b = job_tick(&app, occ);
        assert_eq!(b.json["decision"], "skipped", "{}", b.text);
        answers.extend([a, b]);
    }
    let ran: Vec<u64> = posts(&app, "/job")
        .iter()
        .map(|p| p["occurrenceUnix"].as_u64().unwrap())
        .collect();
    assert_eq!(ran, (0..=5).map(|i| base + 60 * i).collect::<Vec<_>>());
    let status = call(
        "GET",
        &app.url(&format!("/api/jobs/{JOB}")),
        &[TIMER_AUTH],
        b"",
    );
    assert_eq!(status.status, 200, "{}", status.text);
    assert_eq!(
        status.json["reservations"][0]["occurrenceUnix"],
        base + 300,
        "{}",
        status.text
    );
    app_all_bearer(&app);
    tokens_handed_out(&app, Entra::ManagedIdentity, 1);
    answers.push(status);
    app.assert_no_secret(&answers.iter().collect::<Vec<_>>());
    app.assert_no_trap();
}

fn leader_tick(app: &App) -> Answer {
    call("POST", &app.url("/api/leader/tick"), &[TIMER_AUTH], b"")
}

/// leader with a managed identity: two deployments sharing a container (each its own token
/// server) tick in turn; one leads with one term, the other follows naming it, only the leader
/// sends heartbeats, and the lock in storage names the leader.
#[test]
fn two_leader_deployments_elect_one_leader_with_tokens() {
    let start = |instance: &str, container: Option<ContainerName>| {
        entra_app(
            "entra-leader",
            Entra::ManagedIdentity,
            &[("instance_id", instance), ("leader_lease_seconds", "15")],
            Setup {
                container,
                ..Setup::default()
            },
        )
    };
    let a = start("node-a", None);
    let b = start("node-b", Some(a.container.clone()));
    let (led, seen) = a.counted(|| leader_tick(&a));
    assert_eq!(led.status, 200, "{}", led.text);
    assert_eq!(led.json["role"], "leader", "{}", led.text);
    assert_all_bearer(&seen);
    let term = led.json["term"].as_u64().expect("a term");
    let mut answers = vec![led];
    for _ in 0..5 {
        let (f, seen) = b.counted(|| leader_tick(&b));
        assert_eq!(f.status, 200, "{}", f.text);
        assert_eq!(f.json["role"], "follower", "{}", f.text);
        assert_eq!(f.json["leader"], "node-a", "{}", f.text);
        assert_eq!(f.json["term"], term, "{}", f.text);
        assert_all_bearer(&seen);
        let l = leader_tick(&a);
        assert_eq!(l.json["role"], "leader", "{}", l.text);
        assert_eq!(l.json["term"], term, "{}", l.text);
        answers.extend([f, l]);
    }
    let status = call("GET", &b.url("/api/leader"), &[TIMER_AUTH], b"");
    assert_eq!(status.status, 200, "{}", status.text);
    assert_eq!(status.json["state"], "led", "{}", status.text);
    assert_eq!(status.json["leader"], "node-a", "{}", status.text);
    assert_eq!(status.json["term"], term, "{}", status.text);
    // Only the leader sent heartbeats, all with its term.
    let beats = posts(&a, "/heartbeat");
    assert_eq!(beats.len(), 6, "one per leader tick: {beats:?}");
    for beat in &beats {
        assert_eq!(beat["leader"], "node-a", "{beat}");
        assert_eq!(beat["term"], term, "{beat}");
    }
    assert!(posts(&b, "/heartbeat").is_empty());
    // The lock in storage: held, by node-a, its counter at the term.
    let info = inspect_lock(&a, "leader/", "example-group");
    match &info.status {
        LockStatus::Held { label, .. } => assert_eq!(label, "node-a", "{info:?}"),
        other => panic!("the leader lock is not held: {other:?}"),
    }
    assert_eq!(info.fencing_token, term, "{info:?}");
    for app in [&a, &b] {
        app_all_bearer(app);
        tokens_handed_out(app, Entra::ManagedIdentity, 1);
        app.assert_no_trap();
    }
    answers.push(status);
    let refs: Vec<&Answer> = answers.iter().collect();
    a.assert_no_secret(&refs);
    b.assert_no_secret(&[]);
}

fn init_post(app: &App, name: &str) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/init/{name}")),
        &[TIMER_AUTH],
        b"",
    )
}

fn init_state(app: &App, name: &str) -> Answer {
    call(
        "GET",
        &app.url(&format!("/api/init/{name}")),
        &[TIMER_AUTH],
        b"",
    )
}

/// init-once with a client secret: the first call runs the initialization (one call at its
/// webhook) and marks it done in storage; later calls answer done in one request each and run
/// nothing, on the one token. An admin reset (metadata written under a token) lets it run again,
/// once.
#[test]
fn init_once_runs_once_then_answers_done_with_tokens() {
    let app = entra_app(
        "entra-init",
        Entra::ClientSecret,
        &[("instance_id", "node-i")],
        Setup::default(),
    );
    let (first, seen) = app.counted(|| init_post(&app, "seed"));
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json["ran"], true, "{}", first.text);
    assert_eq!(first.json["state"], "done", "{}", first.text);
    assert_all_bearer(&seen);
    let token = first.json["fencingToken"]
        .as_u64()
        .expect("a fencing token");
    let runs = posts(&app, "/init");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["name"], "seed", "{}", runs[0]);
    assert_eq!(runs[0]["fencingToken"], token, "{}", runs[0]);
    // Marked done in storage, by this deployment, with the run's token.
    let info = inspect_lock(&app, "init/", "seed");
    assert_eq!(info.status, LockStatus::Available, "released: {info:?}");
    assert_eq!(
        info.marks.get("progress").map(String::as_str),
        Some("done"),
        "{info:?}"
    );
    assert_eq!(
        info.marks.get("done_by").map(String::as_str),
        Some("node-i"),
        "{info:?}"
    );
    assert_eq!(
        info.marks.get("done_token").map(String::as_str),
        Some(token.to_string().as_str()),
        "{info:?}"
    );
    let mut answers = vec![first];
    for _ in 0..10 {
        let (again, seen) = app.counted(|| init_post(&app, "seed"));
        assert_eq!(again.status, 200, "{}", again.text);
        assert_eq!(again.json["ran"], false, "{}", again.text);
        assert_eq!(again.json["state"], "done", "{}", again.text);
        assert_eq!(seen.len(), 1, "{:#?}", described(&seen));
        assert_all_bearer(&seen);
        answers.push(again);
    }
    let state = init_state(&app, "seed");
    assert_eq!(state.json["state"], "done", "{}", state.text);
    assert_eq!(state.json["doneBy"], "node-i", "{}", state.text);
    assert_eq!(state.json["doneToken"], token, "{}", state.text);
    assert_eq!(posts(&app, "/init").len(), 1);

    // Reset (the admin's): pending, and the next call runs it once more with a larger token.
    let reset = call("DELETE", &app.url("/api/init/seed"), &[ADMIN_AUTH], b"");
    assert_eq!(reset.status, 200, "{}", reset.text);
    assert!(
        !inspect_lock(&app, "init/", "seed")
            .marks
            .contains_key("progress"),
        "the reset forgot nothing"
    );
    assert_eq!(
        init_state(&app, "seed").json["state"],
        "pending",
        "after the reset"
    );
    let rerun = init_post(&app, "seed");
    assert_eq!(rerun.json["ran"], true, "{}", rerun.text);
    assert!(rerun.json["fencingToken"].as_u64().unwrap() > token);
    assert_eq!(init_post(&app, "seed").json["ran"], false);
    assert_eq!(posts(&app, "/init").len(), 2);
    app_all_bearer(&app);
    tokens_handed_out(&app, Entra::ClientSecret, 1);
    answers.extend([state, reset, rerun]);
    app.assert_no_secret(&answers.iter().collect::<Vec<_>>());
    app.assert_no_trap();
}

/// Creates `container` and puts `name` with `body` and `metadata`, as the test (the
/// development key).
fn put_blob(
    app: &App,
    container: &ContainerName,
    name: &str,
    body: &[u8],
    metadata: &[(&str, &str)],
) {
    let locks = inspect_locks(app, container, "");
    let now = SystemTime::now();
    block_on(locks.client().execute(
        &CreateContainer {
            container: container.clone(),
        },
        now,
    ))
    .expect("the test creates the container");
    let m: Metadata = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    block_on(
        locks.client().execute(
            &PutBlob::block(
                container.clone(),
                BlobName::try_new(name).unwrap(),
                body.to_vec(),
            )
            .with_metadata(m),
            now,
        ),
    )
    .expect("the test puts a blob");
}

fn mark(app: &App, container: &ContainerName, name: &str, body: Value) -> Answer {
    call(
        "PUT",
        &app.url(&format!("/api/ttl/{}/{name}", container.as_str())),
        &[ADMIN_AUTH, JSON],
        body.to_string().as_bytes(),
    )
}

/// ttl-sweeper with a managed identity: blobs marked through the API (metadata written under a
/// token) expire; a pass deletes one and moves the other into its dead-blob container (Copy Blob
/// under a bearer token: the copy names its source's authorization too), leaves the unexpired
/// one alone, and storage agrees.
#[test]
fn the_sweeper_deletes_and_moves_expired_blobs_with_tokens() {
    let data = unique_container("entra-ttl");
    let dead = unique_container("entra-dead");
    let app = entra_app(
        "entra-ttl",
        Entra::ManagedIdentity,
        &[
            ("instance_id", "node-t"),
            ("ttl_containers", data.as_str()),
            ("ttl_dead_containers", "*"),
        ],
        Setup::default(),
    );
    for name in ["expire-me", "move-me", "keep-me"] {
        put_blob(
            &app,
            &data,
            name,
            format!("content of {name}").as_bytes(),
            &[("owner", "team-e")],
        );
    }
    let dead_prefix = format!("{}/gone/", dead.as_str());
    let marks = [
        mark(&app, &data, "expire-me", json!({ "ttlSeconds": 1 })),
        mark(
            &app,
            &data,
            "move-me",
            json!({ "ttlSeconds": 1, "deadBlobContainer": dead_prefix }),
        ),
        mark(&app, &data, "keep-me", json!({ "ttlSeconds": 3600 })),
    ];
    for m in &marks {
        assert_eq!(m.status, 200, "{}", m.text);
    }
    let marked = list_blobs(&app, &data, "");
    assert_eq!(
        marked["move-me"]
            .get("deadblobcontainer")
            .map(String::as_str),
        Some(dead_prefix.as_str())
    );
    assert_eq!(
        marked["move-me"].get("owner").map(String::as_str),
        Some("team-e")
    );
    let expires = humantime::parse_rfc3339(marked["expire-me"].get("timetolive").unwrap())
        .expect("TimeToLive is a time");
    wait_for(
        "the marked blobs to expire",
        Duration::from_secs(10),
        || (SystemTime::now() > expires + Duration::from_secs(1)).then_some(()),
    );

    // Tick until a pass completes.
    let started = Instant::now();
    let before = app.storage.count();
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let mut answers: Vec<Answer> = marks.to_vec();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no pass completed"
        );
        let a = call("POST", &app.url("/api/sweeper/tick"), &[TIMER_AUTH], b"");
        assert_eq!(a.status, 200, "{}", a.text);
        for k in ["deleted", "moved", "notExpired", "errors"] {
            *totals.entry(k.into()).or_default() += a.json[k].as_u64().unwrap_or(0);
        }
        let done = a.json["passCompleted"] == true;
        answers.push(a);
        if done {
            break;
        }
    }
    // `deleted` counts every expired blob gone from its source, the moved one too.
    assert_eq!(totals["deleted"], 2, "{totals:?}");
    assert_eq!(totals["moved"], 1, "{totals:?}");
    assert_eq!(totals["notExpired"], 1, "{totals:?}");
    assert_eq!(totals["errors"], 0, "{totals:?}");
    let swept = app.storage.seen()[before..].to_vec();
    assert_all_bearer(&swept);
    // The move's copy: to the dead-blob container, naming its source, the source's
    // authorization a bearer token too (its value never printed).
    let copies: Vec<&Seen> = swept
        .iter()
        .filter(|s| s.method == "PUT" && s.header("x-ms-copy-source").is_some())
        .collect();
    assert!(!copies.is_empty(), "no copy: {:#?}", described(&swept));
    for c in &copies {
        assert!(
            c.path()
                .ends_with(&format!("/{}/gone/move-me", dead.as_str())),
            "{}",
            c.path()
        );
        let source = c.header("x-ms-copy-source").unwrap();
        assert!(
            source.ends_with(&format!("/{}/move-me", data.as_str())),
            "{source}"
        );
        let authorization = c.header("x-ms-copy-source-authorization");
        assert!(
            authorization.is_some_and(|v| v.starts_with("Bearer ") && v.len() > 20),
            "the copy to {} carries no bearer x-ms-copy-source-authorization",
            c.path()
        );
    }
    // Storage: the expired blobs are gone from their container, the kept one is untouched, the
    // moved one is in the dead-blob container with its content and metadata.
    let left: BTreeSet<String> = list_blobs(&app, &data, "").into_keys().collect();
    assert_eq!(left, BTreeSet::from(["keep-me".to_string()]));
    let moved = list_blobs(&app, &dead, "");
    assert_eq!(
        moved.keys().cloned().collect::<Vec<_>>(),
        vec!["gone/move-me".to_string()]
    );
    assert_eq!(
        moved["gone/move-me"].get("owner").map(String::as_str),
        Some("team-e")
    );
    assert_eq!(
        read_blob(&app, &dead, "gone/move-me").as_deref(),
        Some(b"content of move-me".as_slice())
    );
    let state = call("GET", &app.url("/api/sweeper"), &[TIMER_AUTH], b"");
    assert_eq!(state.status, 200, "{}", state.text);
    assert_eq!(state.json["passes"], 1, "{}", state.text);
    assert_eq!(state.json["purged"], 2, "{}", state.text);
    assert_eq!(state.json["moved"], 1, "{}", state.text);
    app_all_bearer(&app);
    tokens_handed_out(&app, Entra::ManagedIdentity, 1);
    answers.push(state);
    app.assert_no_secret(&answers.iter().collect::<Vec<_>>());
    app.assert_no_trap();
}

fn ship(app: &App, order: &str) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/orders/{order}/ship")),
        &[SHIP_AUTH],
        b"",
    )
}

/// The example ship-once with a client secret, two deployments sharing a container (each its
/// own token server): the same order asked of both at once ships once, later asks are refused,
/// another order ships on its own; the lock in storage holds the shipment's fencing token.
#[test]
fn the_example_ships_an_order_once_with_a_client_secret() {
    let a = entra_app(
        "entra-ship",
        Entra::ClientSecret,
        &[],
        Setup {
            manifest: Manifest::ShipOnce,
            ..Setup::default()
        },
    );
    let b = entra_app(
        "entra-ship",
        Entra::ClientSecret,
        &[("shipping_origin", &a.webhook.origin())],
        Setup {
            manifest: Manifest::ShipOnce,
            container: Some(a.container.clone()),
            ..Setup::default()
        },
    );
    let barrier = Barrier::new(2);
    let (first, second) = std::thread::scope(|s| {
        let one = s.spawn(|| {
            barrier.wait();
            ship(&a, "order-1")
        });
        let two = s.spawn(|| {
            barrier.wait();
            ship(&b, "order-1")
        });
        (one.join().unwrap(), two.join().unwrap())
    });
    let (won, lost) = if first.status == 200 {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(won.status, 200, "{}", won.text);
    assert_eq!(won.json["outcome"], "ran", "{}", won.text);
    assert_eq!(lost.status, 429, "{}", lost.text);
    let token = won.json["fencingToken"].as_u64().expect("a fencing token");
    let calls = a.sink.received();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0].path, "/ship");
    assert_eq!(calls[0].body["order"], "order-1");
    assert_eq!(calls[0].body["fencingToken"], token);
    assert!(b.sink.received().is_empty());
    // Asked again, either deployment refuses it; many refusals on one token each.
    let mut answers = vec![won, lost];
    for _ in 0..5 {
        for app in [&a, &b] {
            let r = ship(app, "order-1");
            assert_eq!(r.status, 429, "{}", r.text);
            answers.push(r);
        }
    }
    assert_eq!(a.sink.received().len(), 1);
    let other = ship(&b, "order-2");
    assert_eq!(other.status, 200, "{}", other.text);
    assert!(other.json["fencingToken"].as_u64().unwrap() > 0);
    assert_eq!(a.sink.received().len(), 2);
    // The lock in storage carries the shipment's token.
    let info = inspect_lock(&a, "orders/", "order-1");
    assert_eq!(info.fencing_token, token, "{info:?}");
    for app in [&a, &b] {
        app_all_bearer(app);
        tokens_handed_out(app, Entra::ClientSecret, 1);
        app.assert_no_trap();
    }
    answers.push(other);
    let refs: Vec<&Answer> = answers.iter().collect();
    a.assert_no_secret(&refs);
    b.assert_no_secret(&[]);
}

/// The decisions scheduled-job logged on the cron trigger: occurrence (Unix seconds) ->
/// decisions. (Spin's own output repeats the component's lines: the log file is read.)
fn cron_job_decisions(app: &App) -> BTreeMap<u64, Vec<String>> {
    let mut out: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let text = std::fs::read_to_string(app.spin.dir().join("logs/scheduled-job_stdout.txt"))
        .unwrap_or_default();
    for line in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        if line["fn"] != "scheduled-job" || line["trigger"] != "cron" {
            continue;
        }
        let Some(occurrence) = line["occurrence"]
            .as_str()
            .and_then(|o| humantime::parse_rfc3339(o).ok())
        else {
            continue;
        };
        let secs = occurrence
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        out.entry(secs)
            .or_default()
            .push(line["decision"].as_str().unwrap_or("").to_string());
    }
    out
}

/// scheduled-job on the real cron plugin (every 2 s) with a managed identity: at least four
/// occurrences run, each once (one job call each, its reservation in storage), every storage
/// request a bearer one, and the token server asked at most twice (once, unless the plugin's
/// first two firings overlap: it was seen firing twice at start).
#[test]
fn the_cron_plugin_runs_a_scheduled_job_with_tokens() {
    let app = entra_app(
        "entra-cron",
        Entra::ManagedIdentity,
        &[("instance_id", "cron-e"), ("job_period_seconds", "2")],
        Setup {
            manifest: Manifest::Cron,
            cron: vec![("scheduled-job", "*/2 * * * * *")],
            ..Setup::default()
        },
    );
    // Four occurrences run and their ticks logged (the strict checks are on these: the
    // instance is stopped at any moment, maybe in the middle of a later tick).
    let settled: BTreeSet<u64> = wait_for(
        "four occurrences run on the cron trigger and logged",
        Duration::from_secs(120),
        || {
            let posted: BTreeSet<u64> = posts(&app, "/job")
                .iter()
                .filter_map(|p| p["occurrenceUnix"].as_u64())
                .collect();
            let logged: BTreeSet<u64> = cron_job_decisions(&app)
                .into_iter()
                .filter(|(_, d)| d.iter().any(|d| d == "ran"))
                .map(|(occ, _)| occ)
                .filter(|occ| posted.contains(occ))
                .collect();
            (logged.len() >= 4).then_some(logged)
        },
    );
    app.spin.stop();
    let calls = posts(&app, "/job");
    let mut by_occurrence: BTreeMap<u64, usize> = BTreeMap::new();
    for p in &calls {
        assert_eq!(p["trigger"], "cron", "{p}");
        assert_eq!(p["instance"], "cron-e", "{p}");
        assert_eq!(p["job"], JOB, "{p}");
        *by_occurrence
            .entry(p["occurrenceUnix"].as_u64().unwrap())
            .or_default() += 1;
    }
    let twice: Vec<_> = by_occurrence.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "run more than once: {twice:?}");
    // Each settled run's tick logged `ran` once; any other tick of it `skipped`.
    let decisions = cron_job_decisions(&app);
    for occ in &settled {
        let d = decisions.get(occ).cloned().unwrap_or_default();
        assert_eq!(
            d.iter().filter(|d| *d == "ran").count(),
            1,
            "occurrence {occ}: {d:?}"
        );
        assert!(
            d.iter().all(|d| d == "ran" || d == "skipped"),
            "occurrence {occ}: {d:?}"
        );
    }
    // Storage holds the reservation of each run.
    let reserved: BTreeSet<u64> =
        list_blobs(&app, &app.container, &format!("jobs/{JOB}/occurrences/"))
            .keys()
            .map(|n| n.rsplit('/').next().unwrap().parse().unwrap())
            .collect();
    for occ in by_occurrence.keys() {
        assert!(reserved.contains(occ), "{occ} not in {reserved:?}");
    }
    app_all_bearer(&app);
    let handed = app.tokens().token_count();
    assert!(
        (1..=2).contains(&handed),
        "{handed} tokens for {} runs",
        calls.len()
    );
    tokens_handed_out(&app, Entra::ManagedIdentity, handed);
    app.assert_no_secret(&[]);
    app.assert_no_trap();
}
