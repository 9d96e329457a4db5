//! scheduled-job and the timer routes' tokens, as release `.wasm` served by the real `spin up`:
//! exactly once per occurrence whatever interleaving one instance's ticks take (two `App`s with
//! the same `instance_id` sharing a container, slowed at the fault proxies), a retried tick
//! after the reservation log moved on, fencing tokens that rise with the occurrence, a storage
//! timeout whose lease term is not whole seconds, and the tick token versus the admin token.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use leasegate::lease::Locks;
use leasegate::ops::{Condition, CreateContainer, PutBlob};
use leasegate::{BlobName, ContainerName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{
    call, expect_clear_errors, Answer, App, BadCase, Setup, ADMIN_AUTH, ADMIN_TOKEN, TIMER_AUTH,
    TIMER_TOKEN,
};
use leasegate_tests::proxy::Fault;
use leasegate_tests::{rfc3339_secs as rfc3339, unix_now};
use leasegate_tests::{unique_container, Azurite};
use serde_json::{json, Value};

const JOB: &str = "example-job";

/// An HTTP scheduler's tick for the time `at`, with `auth`.
fn tick_with(app: &App, auth: (&str, &str), at: u64) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/jobs/{JOB}/tick")),
        &[auth, ("content-type", "application/json")],
        json!({ "at": rfc3339(at) }).to_string().as_bytes(),
    )
}

/// A tick for a time the test chose: a manual run (the admin token), since the tick token
/// names only the occurrence due now.
fn tick_at(app: &App, at: u64) -> Answer {
    tick_with(app, ADMIN_AUTH, at)
}

/// The job POSTs every app's sink received, counted per occurrence.
fn runs(apps: &[&App]) -> BTreeMap<u64, usize> {
    let mut runs = BTreeMap::new();
    for app in apps {
        for r in app.sink.received() {
            if r.path == "/job" {
                if let Some(o) = r.body["occurrenceUnix"].as_u64() {
                    *runs.entry(o).or_insert(0) += 1;
                }
            }
        }
    }
    runs
}

fn log_entry(app: &App, occurrence: u64) -> Value {
    let a = call(
        "GET",
        &app.url(&format!("/api/jobs/{JOB}")),
        &[TIMER_AUTH],
        b"",
    );
    assert_eq!(a.status, 200, "{}", a.text);
    a.json["reservations"]
        .as_array()
        .and_then(|e| {
            e.iter()
                .find(|e| e["occurrenceUnix"].as_u64() == Some(occurrence))
                .cloned()
        })
        .unwrap_or(Value::Null)
}

/// Two deployments that share one `instance_id` (replicas, a retried HTTP tick, a manual tick
/// beside the timer), on one container.
fn twins(tag: &str, vars: &[(&str, &str)]) -> (App, App) {
    let mut all = vec![
        ("instance_id", "node-twin"),
        ("storage_timeout_ms", "15000"),
    ];
    all.extend_from_slice(vars);
    let a = App::start(tag, &all);
    let b = App::start_with(
        tag,
        &all,
        Setup {
            container: Some(a.container.clone()),
            ..Setup::default()
        },
    );
    (a, b)
}

/// The lock blob's HEAD, the first request of taking the job's lease.
fn lock_head(app: &App) -> String {
    format!(
        "HEAD /devstoreaccount1/{}/jobs/{JOB}/lock",
        app.container.as_str()
    )
}

fn wait_seen(app: &App, part: &str) {
    leasegate_tests::wait_for(
        &format!("a request {part}"),
        Duration::from_secs(30),
        || {
            app.storage
                .seen()
                .iter()
                .any(|s| format!("{} {}", s.method, s.target).contains(part))
                .then_some(())
        },
    );
}

/// A reserves the occurrence and is held up before it takes the job's lease; B (the same
/// instance id) takes the lease, runs the occurrence and releases it; then A goes on. The job
/// runs once, and A says the occurrence was settled by an earlier tick.
#[test]
fn a_tick_held_up_after_reserving_does_not_run_the_occurrence_again() {
    let (a, b) = twins("twinrun", &[]);
    // First use of the container, the lock blob and the log.
    let warm = (unix_now() / 60 + 1) * 60;
    assert_eq!(tick_at(&a, warm).json["decision"], "ran");
    let occ = warm + 60;
    a.storage
        .fault_on(&lock_head(&a), Fault::Delay(Duration::from_secs(8)));
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(|| tick_at(&a, occ));
        // A's reservation is written once its lease step begins.
        wait_seen(&a, &lock_head(&a));
        let second = tick_at(&b, occ);
        (first.join().unwrap(), second)
    });
    a.storage.set_fault(None);
    assert_eq!(second.json["decision"], "ran", "B: {}", second.text);
    assert_eq!(first.status, 200, "A: {}", first.text);
    assert_eq!(first.json["decision"], "skipped", "A: {}", first.text);
    let runs = runs(&[&a, &b]);
    assert_eq!(
        runs.get(&occ),
        Some(&1),
        "job POSTs per occurrence: {runs:?}"
    );
    let entry = log_entry(&a, occ);
    assert_eq!(entry["status"], "succeeded", "{entry}");
    // Retried once more, by either: settled.
    for app in [&a, &b] {
        let again = tick_at(app, occ);
        assert_eq!(again.json["decision"], "skipped", "{}", again.text);
    }
    assert_eq!(runs_of(&[&a, &b], occ), 1);
    a.assert_no_trap();
    b.assert_no_trap();
}

fn runs_of(apps: &[&App], occ: u64) -> usize {
    runs(apps).get(&occ).copied().unwrap_or(0)
}

/// A reserves the occurrence and is held up; B (same instance id) takes the lease and runs a
/// slow job; A's lease step lands while B holds the lease. A must not record the occurrence
/// as `skipped_overlap` over B's run, nor run it: the log keeps B's run with its token.
#[test]
fn a_tick_that_finds_its_own_run_holding_the_lease_leaves_the_run_alone() {
    let (a, b) = twins("twinhold", &[]);
    let warm = (unix_now() / 60 + 1) * 60;
    assert_eq!(tick_at(&a, warm).json["decision"], "ran");
    let occ = warm + 60;
    a.storage
        .fault_on(&lock_head(&a), Fault::Delay(Duration::from_secs(6)));
    // B's job call is slow: it holds the lease well past A's lease step.
    b.webhook
        .set_fault(Some(Fault::Delay(Duration::from_secs(12))));
    let (first, second, during) = std::thread::scope(|s| {
        let first = s.spawn(|| tick_at(&a, occ));
        wait_seen(&a, &lock_head(&a));
        let second = s.spawn(|| tick_at(&b, occ));
        let first = first.join().unwrap();
        // A answered while B's job call is still under way: the log as it is now.
        let during = log_entry(&a, occ);
        (first, second.join().unwrap(), during)
    });
    a.storage.set_fault(None);
    b.webhook.set_fault(None);
    assert_eq!(second.json["decision"], "ran", "B: {}", second.text);
    assert_eq!(first.status, 200, "A: {}", first.text);
    assert_eq!(first.json["decision"], "skipped", "A: {}", first.text);
    assert_ne!(
        during["status"], "skipped_overlap",
        "A overwrote B's running entry: {during}"
    );
    let entry = log_entry(&a, occ);
    assert_eq!(entry["status"], "succeeded", "{entry}");
    assert_eq!(
        entry["fencingToken"], second.json["entry"]["fencingToken"],
        "{entry}"
    );
    assert_eq!(runs_of(&[&a, &b], occ), 1);
}

/// The reservation log keeps 10 entries, retention keeps an hour: a retried tick for an
/// occurrence after 11 later ones ran finds it settled on its reservation, and does not run it
/// again.
#[test]
fn a_retried_tick_after_eleven_later_runs_does_not_run_again() {
    let app = App::start(
        "retry11",
        &[("instance_id", "node-r"), ("job_period_seconds", "10")],
    );
    let base = (unix_now() / 10 + 1) * 10;
    for k in 0..12 {
        let a = tick_at(&app, base + 10 * k);
        assert_eq!(a.json["decision"], "ran", "{}", a.text);
    }
    let retry = tick_at(&app, base);
    assert_eq!(retry.status, 200, "{}", retry.text);
    assert_eq!(retry.json["decision"], "skipped", "{}", retry.text);
    let runs = runs(&[&app]);
    assert_eq!(runs.len(), 12, "{runs:?}");
    assert!(
        runs.values().all(|n| *n == 1),
        "job POSTs per occurrence: {runs:?}"
    );
}

/// The outcome written on the reservation is the commit point: when its answer is lost, the
/// tick reads the reservation back, finds its own write and runs the job (once); a storage
/// failure before it leaves the occurrence to the retry.
#[test]
fn the_outcome_write_survives_a_lost_answer_and_a_failure_before_it_is_retried() {
    let app = App::start("commit", &[("instance_id", "node-c")]);
    let base = (unix_now() / 60 + 1) * 60;
    assert_eq!(tick_at(&app, base).json["decision"], "ran");
    // The outcome writes of that occurrence (not its creation).
    let metadata = format!("occurrences/{:012}?comp=metadata", base + 60);
    app.storage.fault_on(&metadata, Fault::LoseAnswer);
    let lost = tick_at(&app, base + 60);
    app.storage.set_fault(None);
    let applied = |f: Fault| {
        app.storage
            .seen()
            .iter()
            .any(|s| s.fault == Some(f.clone()))
    };
    assert!(applied(Fault::LoseAnswer), "no answer was lost");
    assert_eq!(lost.json["decision"], "ran", "{}", lost.text);
    // The log failing after the outcome was written: undone, so the retry runs it.
    let log = format!(
        "PUT /devstoreaccount1/{}/jobs/{JOB}/log.json",
        app.container.as_str()
    );
    app.storage.fault_on(&log, Fault::Status(503));
    let failed = tick_at(&app, base + 120);
    app.storage.set_fault(None);
    assert!(applied(Fault::Status(503)));
    assert_eq!(failed.status, 503, "{}", failed.text);
    let retry = tick_at(&app, base + 120);
    assert_eq!(retry.json["decision"], "ran", "{}", retry.text);
    for occ in [base + 60, base + 120] {
        let again = tick_at(&app, occ);
        assert_eq!(again.json["decision"], "skipped", "{}", again.text);
        assert_eq!(runs_of(&[&app], occ), 1, "occurrence {occ}");
    }
}

/// Fencing tokens rise with the occurrence, whatever `job_overlap` says: occurrences run in
/// order get rising tokens, and a late run of an older occurrence gets a lower token than the
/// newer occurrence's run (so the job's resource refuses the late writer).
#[test]
fn fencing_tokens_rise_with_the_occurrence() {
    for policy in ["skip", "allow"] {
        let app = App::start(
            "tokens",
            &[("instance_id", "node-t"), ("job_overlap", policy)],
        );
        let base = (unix_now() / 60 + 1) * 60;
        let token = |a: &Answer| {
            assert_eq!(a.json["decision"], "ran", "{policy}: {}", a.text);
            a.json["entry"]["fencingToken"]
                .as_u64()
                .unwrap_or_else(|| panic!("{policy}: no token: {}", a.text))
        };
        // In order, quickly (several in one second).
        let t0 = token(&tick_at(&app, base));
        let t1 = token(&tick_at(&app, base + 60));
        assert!(t0 < t1, "{policy}: {t0} then {t1}");
        // The newer first, then the older late.
        let newer = token(&tick_at(&app, base + 180));
        let older = token(&tick_at(&app, base + 120));
        assert!(
            t1 < older && older < newer,
            "{policy}: occurrence +120 got {older}, +180 got {newer} (+60 got {t1})"
        );
        let sent: Vec<(u64, u64)> = app
            .sink
            .received()
            .iter()
            .filter_map(|r| {
                Some((
                    r.body["occurrenceUnix"].as_u64()?,
                    r.body["fencingToken"].as_u64()?,
                ))
            })
            .collect();
        let mut by_occurrence = sent.clone();
        by_occurrence.sort();
        assert!(
            by_occurrence.windows(2).all(|w| w[0].1 < w[1].1),
            "{policy}: tokens the job received, by occurrence: {by_occurrence:?}"
        );
    }
}

/// `storage_timeout_ms = 5100` makes the lease term 30 + 4 x 5.1 + 10 = 60.4 s: rounded up to
/// whole seconds, the job runs; nothing is reserved and left behind by a refused term.
#[test]
fn a_storage_timeout_that_is_not_whole_seconds_runs_the_job() {
    let app = App::start(
        "timeout5100",
        &[("instance_id", "node-s"), ("storage_timeout_ms", "5100")],
    );
    let occ = (unix_now() / 60 + 1) * 60;
    let a = tick_at(&app, occ);
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["decision"], "ran", "{}", a.text);
    let b = tick_at(&app, occ + 60);
    assert_eq!(b.json["decision"], "ran", "{}", b.text);
    assert_eq!(runs(&[&app]).len(), 2);
}

fn create_blob(container: &ContainerName, name: &str) {
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        container.clone(),
    );
    let _ = block_on(locks.client().execute(
        &CreateContainer {
            container: container.clone(),
        },
        SystemTime::now(),
    ));
    block_on(
        locks.client().execute(
            &PutBlob::block(
                container.clone(),
                BlobName::try_new(name).unwrap(),
                b"data".to_vec(),
            )
            .with_condition(Condition::IfNotExists),
            SystemTime::now(),
        ),
    )
    .unwrap();
}

/// The destructive routes of the four timer functions, as `(method, path, body)`.
fn destructive(data: &ContainerName, past: u64) -> Vec<(&'static str, String, Vec<u8>)> {
    vec![
        (
            "PUT",
            format!("/api/ttl/{}/old.txt", data.as_str()),
            json!({"ttlSeconds": 3600}).to_string().into_bytes(),
        ),
        ("DELETE", "/api/init/example-init".into(), Vec::new()),
        ("DELETE", "/api/leader".into(), Vec::new()),
        (
            "POST",
            format!("/api/jobs/{JOB}/tick"),
            json!({"at": rfc3339(past)}).to_string().into_bytes(),
        ),
    ]
}

/// The tick token (what a scheduler needs) ticks and reads; marking blobs, resetting an
/// initialization, a leader's step-down and a manual run of a past occurrence need the admin
/// token (403 with the tick token); with no admin token those routes refuse to serve (503
/// `not_configured` naming `admin_token`).
#[test]
fn the_tick_token_ticks_and_the_admin_token_does_the_rest() {
    let data = unique_container("ttldata");
    create_blob(&data, "old.txt");
    let vars = [
        ("instance_id", "node-adm"),
        ("ttl_containers", data.as_str()),
        ("admin_token", ADMIN_TOKEN),
    ];
    // (The harness sets ADMIN_TOKEN by default too; named here for the reader.)
    let app = App::start("admin", &vars);
    let now = unix_now();
    let past = (now - 1200) / 60 * 60;
    let json_ct = ("content-type", "application/json");
    // The tick token: 403 on each destructive route, with a JSON error, no secret anywhere.
    let cases: Vec<BadCase> = destructive(&data, past)
        .into_iter()
        .map(|(method, path, body)| BadCase {
            method,
            path,
            headers: vec![TIMER_AUTH, json_ct],
            body,
            status: 403,
        })
        .collect();
    expect_clear_errors(&app, &cases, &[TIMER_TOKEN, ADMIN_TOKEN]);
    assert!(runs(&[&app]).is_empty(), "a past occurrence ran");
    // What a scheduler needs still works with it: a tick of the occurrence due now.
    let current = unix_now();
    for (method, path, body) in [
        (
            "POST",
            format!("/api/jobs/{JOB}/tick"),
            json!({"at": rfc3339(current)}).to_string().into_bytes(),
        ),
        ("POST", format!("/api/jobs/{JOB}/tick"), Vec::new()),
        ("GET", format!("/api/jobs/{JOB}"), Vec::new()),
        ("POST", "/api/leader/tick".into(), Vec::new()),
        ("GET", "/api/leader".into(), Vec::new()),
        ("POST", "/api/init/example-init".into(), Vec::new()),
        ("GET", "/api/init/example-init".into(), Vec::new()),
        ("POST", "/api/sweeper/tick".into(), Vec::new()),
        ("GET", "/api/sweeper".into(), Vec::new()),
    ] {
        let a = call(method, &app.url(&path), &[TIMER_AUTH, json_ct], &body);
        assert!(
            a.status < 300,
            "{method} {path} with the tick token: {} {}",
            a.status,
            a.text
        );
    }
    // The admin token: each destructive route is served.
    for (method, path, body) in destructive(&data, past) {
        let a = call(method, &app.url(&path), &[ADMIN_AUTH, json_ct], &body);
        assert_eq!(
            a.status, 200,
            "{method} {path} with the admin token: {}",
            a.text
        );
    }
    assert_eq!(runs(&[&app]).get(&past), Some(&1), "the manual run");
    // A wrong token is still a 401, on every route.
    let wrong = ("authorization", "Bearer not-a-token");
    for (method, path, body) in destructive(&data, past) {
        let a = call(method, &app.url(&path), &[wrong, json_ct], &body);
        assert_eq!(a.status, 401, "{method} {path}: {}", a.text);
    }

    // No admin token: the destructive routes refuse to serve, whoever asks.
    let bare = App::start("noadmin", &[vars[0], vars[1], ("admin_token", "")]);
    for (method, path, body) in destructive(&data, past) {
        let a = call(method, &bare.url(&path), &[TIMER_AUTH, json_ct], &body);
        assert_eq!(a.status, 503, "{method} {path}: {}", a.text);
        assert_eq!(a.json["error"], "not_configured", "{}", a.text);
        assert!(
            a.json["message"]
                .as_str()
                .unwrap_or("")
                .contains("admin_token"),
            "{}",
            a.text
        );
    }
    // An admin token equal to the tick token is no admin token.
    let same = App::start(
        "sameadmin",
        &[vars[0], vars[1], ("admin_token", TIMER_TOKEN)],
    );
    let (method, path, body) = destructive(&data, past).swap_remove(2);
    let a = call(method, &same.url(&path), &[TIMER_AUTH], &body);
    assert_eq!(a.status, 503, "{method} {path}: {}", a.text);
}
