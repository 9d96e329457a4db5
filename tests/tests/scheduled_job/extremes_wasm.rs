//! scheduled-job's edges, as `.wasm` served by the real `spin up` against Azurite: the
//! routes' authentication, odd times, occurrences far ahead or long past, retried ticks,
//! retention across deployments, contention on the reservation log, fencing tokens that rise
//! in the order runs start (a late run of an older one included), extreme settings (a storage
//! timeout whose lease term is not whole seconds among them).

use std::time::{Duration, SystemTime};

use leasegate::lease::Locks;
use leasegate::ops::ListBlobs;
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{call, Answer, App, Manifest, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::jobs::runs;
use leasegate_tests::proxy::Fault;
use leasegate_tests::wait_for;
use leasegate_tests::Azurite;
use leasegate_tests::{rfc3339_secs as rfc3339, unix_now};
use serde_json::{json, Value};

const JOB: &str = "example-job";

/// An Azure Functions timer invocation body with this `UtcNow`.
fn azure_payload(utc_now: &str) -> Vec<u8> {
    json!({
        "Data": {"timer": {"Schedule": {"AdjustForDST": true}, "ScheduleStatus": null, "IsPastDue": false}},
        "Metadata": {"sys": {"MethodName": "scheduled-job", "UtcNow": utc_now, "RandGuid": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"}}
    })
    .to_string()
    .into_bytes()
}

fn start(tag: &str, vars: &[(&str, &str)], manifest: Manifest, container: Option<&App>) -> App {
    App::start_with(
        tag,
        vars,
        Setup {
            manifest,
            container: container.map(|a| a.container.clone()),
            ..Setup::default()
        },
    )
}

/// An HTTP tick for a time `at` the test chose: a manual run (the admin token), since the
/// tick token names only the occurrence due now.
fn tick_at(app: &App, at: u64) -> Answer {
    tick_as(app, at, ADMIN_AUTH)
}

/// A tick for `at` with the `auth` header: the admin token's for any occurrence but the one
/// due now (a manual run).
fn tick_as(app: &App, at: u64, auth: (&'static str, &'static str)) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/jobs/{JOB}/tick")),
        &[auth, ("content-type", "application/json")],
        json!({ "at": rfc3339(at) }).to_string().as_bytes(),
    )
}

/// The occurrences the job was POSTed for, by this app.
fn job_posts(app: &App) -> Vec<u64> {
    app.sink
        .received()
        .into_iter()
        .filter(|r| r.path == "/job")
        .filter_map(|r| r.body["occurrenceUnix"].as_u64())
        .collect()
}

fn log_entries(app: &App) -> Vec<Value> {
    let a = call(
        "GET",
        &app.url(&format!("/api/jobs/{JOB}")),
        &[TIMER_AUTH],
        b"",
    );
    assert_eq!(a.status, 200, "{}", a.text);
    a.json["reservations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn reservations(app: &App) -> Vec<u64> {
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    );
    let list = ListBlobs {
        prefix: Some(format!("jobs/{JOB}/occurrences/")),
        ..ListBlobs::new(app.container.clone())
    };
    let (page, _) = block_on(locks.client().execute(&list, SystemTime::now())).unwrap();
    page.blobs
        .iter()
        .filter_map(|b| b.name.rsplit('/').next()?.parse().ok())
        .collect()
}

/// Promise: the `/api/jobs` routes need the bearer token, and the Azure Functions channel
/// (`POST /{FunctionName}`) exists only in the Azure Functions deployment. But Spin's wildcard
/// route `/api/jobs/...` also matches `/api/jobs` itself, which does not start with
/// `/api/jobs/`, so `handle_http` sends it to the unauthenticated Azure timer handler: anyone
/// can run the job, for any occurrence up to the year 9000 (pre-empting the real ones).
#[test]
fn api_jobs_without_a_slash_needs_the_token_too() {
    let app = start(
        "revbypass",
        &[("instance_id", "node-h")],
        Manifest::Http,
        None,
    );
    // The documented route refuses an anonymous caller...
    let refused = call(
        "POST",
        &app.url(&format!("/api/jobs/{JOB}/tick")),
        &[("content-type", "application/json")],
        b"",
    );
    assert_eq!(refused.status, 401, "{}", refused.text);
    // ...but the same component at /api/jobs runs an anonymous Azure-shaped tick, for an
    // occurrence the caller picks (tomorrow here).
    let tomorrow = (unix_now() / 60 + 24 * 60) * 60;
    let anon = call(
        "POST",
        &app.url("/api/jobs"),
        &[("content-type", "application/json")],
        &azure_payload(&rfc3339(tomorrow)),
    );
    let posts = job_posts(&app);
    // Tomorrow's real tick is then skipped: the occurrence already "ran".
    let real = tick_at(&app, tomorrow);
    assert!(
        anon.status == 401 || anon.status == 404,
        "anonymous POST /api/jobs answered {}: {}\njob POSTs: {posts:?}\ntomorrow's real tick: {}",
        anon.status,
        anon.text,
        real.text
    );
    assert!(
        posts.is_empty(),
        "the job ran for an anonymous caller: {posts:?}"
    );
}

/// Promise: bad input gets a clear 4xx, never a trap. `parse_time` splits the text 6 bytes
/// from its end with `str::split_at`, which panics inside a multi-byte character: an
/// (unauthenticated) Azure invocation or an HTTP tick with such a time traps the guest (500).
#[test]
fn a_time_with_a_multibyte_character_is_a_clear_400() {
    let app = start(
        "revtrap",
        &[("instance_id", "node-t")],
        Manifest::Azure,
        None,
    );
    let bad = "2026-11-21T14:55:00\u{20ac}00:00"; // '€' where the offset sign goes
    let azure = call(
        "POST",
        &app.url("/scheduled-job"),
        &[("content-type", "application/json")],
        &azure_payload(bad),
    );
    let http = call(
        "POST",
        &app.url(&format!("/api/jobs/{JOB}/tick")),
        &[TIMER_AUTH, ("content-type", "application/json")],
        json!({ "at": bad }).to_string().as_bytes(),
    );
    let panics: Vec<String> = app
        .log_lines()
        .into_iter()
        .filter(|l| l.contains("panicked") || l.contains("wasm trap"))
        .collect();
    assert!(
        azure.status == 400 && http.status == 400,
        "Azure invocation: {} {}\nHTTP tick: {} {}\nguest output: {panics:#?}",
        azure.status,
        azure.text,
        http.status,
        http.text
    );
}

/// An Azure Functions timer that never ran before arrives with .NET's `DateTime.MinValue` as
/// `ScheduleStatus.Last` (`0001-01-01T00:00:00`, no time here): with `UtcNow` there, only
/// `UtcNow` is read and the occurrence runs.
#[test]
fn a_first_azure_invocation_with_a_never_ran_last_runs() {
    let app = start(
        "revnever",
        &[("instance_id", "node-n"), ("job_period_seconds", "5")],
        Manifest::Azure,
        None,
    );
    // The host invokes at the occurrence (the job's first tick, which begins its history).
    let now = leasegate_tests::jobs::next_period(5, 0);
    let body = json!({
        "Data": {"timer": {
            "Schedule": {"AdjustForDST": true},
            "ScheduleStatus": {"Last": "0001-01-01T00:00:00", "Next": rfc3339(now), "LastUpdated": "0001-01-01T00:00:00"},
            "IsPastDue": false
        }},
        "Metadata": {"sys": {"MethodName": "scheduled-job", "UtcNow": rfc3339(now), "RandGuid": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"}}
    });
    let a = call(
        "POST",
        &app.url("/scheduled-job"),
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["ReturnValue"]["trigger"], "azure", "{}", a.text);
    assert_eq!(job_posts(&app), [now]);
    app.assert_no_trap();
}

/// The log keeps the last 10 reservations, newest first, and loses no entry: occurrences far
/// ahead of the storage server's clock (an HTTP tick with a future `at`, a deployment whose
/// clock runs ahead) are refused, every time, so they cannot push current runs out of it.
#[test]
fn future_occurrences_are_refused_and_cannot_crowd_the_log() {
    let app = start(
        "revfuture",
        &[("instance_id", "node-u")],
        Manifest::Http,
        None,
    );
    let next_week = (unix_now() / 60 + 7 * 24 * 60) * 60;
    for k in 0..10 {
        for _ in 0..2 {
            let a = tick_at(&app, next_week + 60 * k);
            assert_eq!(a.status, 409, "{}", a.text);
            assert_eq!(a.json["decision"], "too_early", "{}", a.text);
        }
    }
    assert!(job_posts(&app).is_empty());
    let current = (unix_now() / 60 + 2) * 60;
    let a = tick_at(&app, current);
    assert_eq!(a.json["decision"], "ran", "{}", a.text);
    let logged: Vec<u64> = log_entries(&app)
        .iter()
        .filter_map(|e| e["occurrenceUnix"].as_u64())
        .collect();
    assert_eq!(logged, vec![current]);
}

/// A storage failure after the reservation was written (its answer lost, or the lease step
/// failing) answers 503 with `Retry-After: 1`; the retry by the same instance resumes the
/// occurrence it reserved and runs it (once), rather than report it settled.
#[test]
fn a_retried_tick_resumes_the_occurrence_it_reserved() {
    let app = start(
        "revlost",
        &[("instance_id", "node-l")],
        Manifest::Http,
        None,
    );
    let base = (unix_now() / 60 + 2) * 60;
    // First use (the container, the job's lock blob and the log exist afterwards): a past
    // occurrence, run by an operator (the admin token).
    assert_eq!(
        tick_as(&app, base - 600, ADMIN_AUTH).json["decision"],
        "ran"
    );
    let mut problems = Vec::new();
    for (i, (part, fault)) in [
        (format!("/jobs/{JOB}/occurrences/"), Fault::LoseAnswer),
        (format!("/jobs/{JOB}/lock"), Fault::Status(503)),
    ]
    .into_iter()
    .enumerate()
    {
        let occ = base + 60 * i as u64;
        app.storage.fault_on(&part, fault.clone());
        let first = tick_at(&app, occ);
        app.storage.set_fault(None);
        assert_eq!(first.status, 503, "{fault:?}: {}", first.text);
        assert_eq!(
            first.headers.get("retry-after").map(String::as_str),
            Some("1")
        );
        let retry = tick_at(&app, occ);
        let ran = job_posts(&app).contains(&occ);
        let logged = log_entries(&app)
            .iter()
            .any(|e| e["occurrenceUnix"].as_u64() == Some(occ));
        if retry.status < 300 && !ran {
            problems.push(format!(
                "{fault:?}: the retry answered {} {} although the job never ran (in the log: {logged})",
                retry.status, retry.text
            ));
        }
        assert_eq!(retry.json["decision"], "ran", "{fault:?}: {}", retry.text);
        assert!(logged);
        // Retried again: it ran, so now it is settled.
        let again = tick_at(&app, occ);
        assert_eq!(again.json["decision"], "skipped", "{}", again.text);
        let posts = job_posts(&app).iter().filter(|o| **o == occ).count();
        assert_eq!(posts, 1, "{fault:?}");
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Promise: old reservations are cleaned up without allowing a re-run. The too-old check uses
/// each deployment's own retention, and the default retention follows `job_period_seconds`
/// (10 periods, at least an hour). During a rollout of a new period (60 s -> 600 s), the old
/// deployment deletes reservations after an hour while the new one still accepts ticks 100
/// minutes old: a late tick (an HTTP scheduler's retry or backfill) runs the occurrence again.
#[test]
fn a_period_change_between_deployments_never_runs_an_occurrence_twice() {
    let old = start(
        "revperiod",
        &[("instance_id", "node-old")],
        Manifest::Http,
        None,
    );
    let new = start(
        "revperiod",
        &[("instance_id", "node-new"), ("job_period_seconds", "600")],
        Manifest::Http,
        Some(&old),
    );
    let now = unix_now();
    // A multiple of 600 between 83 and 73 minutes ago: within the new retention (6000 s),
    // beyond the old one (3600 s).
    let late = (now - 5000).div_ceil(600) * 600;
    // Ticks that late are an operator's backfill (the admin token).
    let first = tick_as(&new, late, ADMIN_AUTH);
    assert_eq!(first.json["decision"], "ran", "{}", first.text);
    // The old deployment runs a current occurrence, and cleans up after it.
    let current = tick_at(&old, (now / 60 + 2) * 60);
    assert_eq!(current.json["decision"], "ran", "{}", current.text);
    let left = reservations(&old);
    assert!(!left.contains(&late), "not cleaned up: {left:?}");
    // The same late tick again, on the new deployment.
    let again = tick_as(&new, late, ADMIN_AUTH);
    let runs = job_posts(&new).iter().filter(|o| **o == late).count();
    assert_eq!(
        runs, 1,
        "occurrence {late} was POSTed {runs} times; second tick: {}",
        again.text
    );
}

/// Promise (README): "a tick for an occurrence that old is refused (409 occurrence_too_old)".
/// The too-old tick creates its reservation before it is refused, so the same tick again is
/// answered 200 `skipped` ("this instance reserved it on an earlier tick"): the occurrence is
/// reported settled by this instance, which never ran it.
#[test]
fn a_too_old_tick_is_refused_every_time() {
    let app = start("revold", &[("instance_id", "node-o")], Manifest::Http, None);
    let ancient = (unix_now() - 3 * 3600) / 60 * 60;
    // An occurrence that old is a manual run's (the admin token).
    let first = tick_as(&app, ancient, ADMIN_AUTH);
    assert_eq!(first.status, 409, "{}", first.text);
    let second = tick_as(&app, ancient, ADMIN_AUTH);
    assert_eq!(second.status, 409, "second tick: {}", second.text);
    assert!(job_posts(&app).is_empty());
}

/// Promise: the log "is one JSON blob updated by compare-and-swap on its ETag, so no entry is
/// lost under contention". The compare-and-swap gives up after 8 tries; 20 winners appending
/// at once (slow log reads make every try a race) still all land (this test passes: sound).
#[test]
fn twenty_concurrent_winners_keep_their_log_entries() {
    const WRITERS: u64 = 20;
    let app = start(
        "revcas",
        &[("instance_id", "node-c"), ("job_early_seconds", "7200")],
        Manifest::Http,
        None,
    );
    // Create the log first (so every writer reads an existing blob). The occurrences are past
    // ones, run by hand, so that every one is due (none is skipped before it is due).
    let base = (unix_now() / 60 - 30) * 60;
    assert_eq!(tick_at(&app, base).json["decision"], "ran");
    app.storage.fault_on(
        &format!(
            "GET /devstoreaccount1/{}/jobs/{JOB}/log.json",
            app.container.as_str()
        ),
        Fault::Delay(Duration::from_millis(400)),
    );
    let answers: Vec<(u64, Answer)> = std::thread::scope(|s| {
        let handles: Vec<_> = (1..=WRITERS)
            .map(|k| {
                let app = &app;
                s.spawn(move || (k, tick_at(app, base + 60 * k)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    app.storage.set_fault(None);
    // A tick that found the job's lease taken by a run whose claim was not written yet cannot
    // tell whose it is: 503 occurrence_in_progress with a Retry-After, and its retry settles it.
    let answers: Vec<Answer> = answers
        .into_iter()
        .map(|(k, a)| {
            if a.status != 503 || a.json["error"] != "occurrence_in_progress" {
                return a;
            }
            assert!(a.headers.contains_key("retry-after"), "{}", a.text);
            wait_for(
                "the retried tick to settle",
                Duration::from_secs(120),
                || {
                    let r = tick_at(&app, base + 60 * k);
                    (r.json["error"] != "occurrence_in_progress").then_some(r)
                },
            )
        })
        .collect();
    // Every tick has answered, so every storage request of theirs has reached the proxy. Two
    // log writes conditioned on the same ETag prove a race: at most one of them was written.
    let mut conditions: Vec<String> = app
        .storage
        .seen()
        .iter()
        .filter(|o| o.method == "PUT" && o.path().ends_with("/log.json"))
        .filter_map(|o| o.header("if-match").map(str::to_string))
        .collect();
    let writes = conditions.len();
    conditions.sort();
    conditions.dedup();
    let lost = writes - conditions.len();
    println!("log compare-and-swaps: {writes}, of which lost races: {lost}");
    assert!(lost > 0, "no contention was produced");
    let failed: Vec<String> = answers
        .iter()
        .filter(|a| a.status != 200)
        .map(|a| format!("{} {}", a.status, a.json["message"]))
        .collect();
    let stale: Vec<Value> = log_entries(&app)
        .into_iter()
        .filter(|e| e["status"] == "running")
        .collect();
    assert!(
        failed.is_empty() && stale.is_empty(),
        "failed ticks: {failed:#?}\nruns left 'running' in the log: {stale:#?}"
    );
}

/// Sound (expected to pass): extreme trigger times and variables answer errors, never trap;
/// allow-overlap with a long timeout (no lease: the reservation alone decides) runs once.
///
/// The old test fired cron events at Unix seconds 0, 1, `u64::MAX`, 9000-01-01 and one second
/// after it; the real cron plugin fires only at its schedule's times, so these times go through
/// the HTTP tick (the same tick code, from another source). Not covered any more: a cron event
/// at `u64::MAX` (RFC 3339 cannot carry it) and the cron handler's own range check (the HTTP
/// tick's is its time parser's).
#[test]
fn extremes_do_not_trap() {
    let app = start(
        "revext",
        &[
            ("instance_id", "node-e"),
            ("job_period_seconds", "31536000"),
            ("job_offset_seconds", "31535999"),
            ("job_timeout_seconds", "3600"),
        ],
        Manifest::Http,
        None,
    );
    for (at, status, decision) in [
        ("1970-01-01T00:00:00Z", 409, "too_old"),
        ("1970-01-01T00:00:01Z", 409, "too_old"),
        // 221_845_392_000: the latest trigger time accepted.
        ("9000-01-01T00:00:00Z", 409, "too_early"),
        // 221_845_392_001: out of range.
        ("9000-01-01T00:00:01Z", 400, ""),
        ("9999-12-31T23:59:59Z", 400, ""),
    ] {
        // The admin token: the times long past are manual runs.
        let a = call(
            "POST",
            &app.url(&format!("/api/jobs/{JOB}/tick")),
            &[ADMIN_AUTH, ("content-type", "application/json")],
            json!({ "at": at }).to_string().as_bytes(),
        );
        assert_eq!(a.status, status, "{at}: {}", a.text);
        if decision.is_empty() {
            assert_eq!(a.json["error"], "invalid_tick", "{at}: {}", a.text);
        } else {
            assert_eq!(a.json["decision"], decision, "{at}: {}", a.text);
        }
    }
    app.assert_no_trap();
    assert!(job_posts(&app).is_empty());
    let a = start(
        "revallow",
        &[
            ("instance_id", "node-a1"),
            ("job_overlap", "allow"),
            ("job_timeout_seconds", "100"),
        ],
        Manifest::Http,
        None,
    );
    let b = start(
        "revallow",
        &[
            ("instance_id", "node-a2"),
            ("job_overlap", "allow"),
            ("job_timeout_seconds", "100"),
        ],
        Manifest::Http,
        Some(&a),
    );
    let occ = (unix_now() / 60 + 3) * 60;
    let (x, y) = std::thread::scope(|s| {
        let x = s.spawn(|| tick_at(&a, occ));
        let y = s.spawn(|| tick_at(&b, occ));
        (x.join().unwrap(), y.join().unwrap())
    });
    let decisions = [x.json["decision"].clone(), y.json["decision"].clone()];
    assert!(
        decisions.contains(&json!("ran")) && decisions.contains(&json!("skipped")),
        "{}\n{}",
        x.text,
        y.text
    );
    assert_eq!(job_posts(&a).len() + job_posts(&b).len(), 1);
}

/// Fencing tokens rise in the order runs start, whatever `job_overlap` says: occurrences run in
/// order get their occurrence's tokens (`occurrence x 2^16`), and an operator's late run of an
/// older occurrence after a newer one's gets a token above the newer's (issue 47, item 6: a
/// receiver that keeps the highest token refuses no run it is sent; a holder whose lease ran
/// out is still refused, its token being older than its successor's).
#[test]
fn fencing_tokens_rise_in_the_order_runs_start() {
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
        assert_eq!((t0, t1), (base << 16, (base + 60) << 16), "{policy}");
        // The newer first, then the older late.
        let newer = token(&tick_at(&app, base + 180));
        let older = token(&tick_at(&app, base + 120));
        assert_eq!(newer, (base + 180) << 16, "{policy}");
        assert_eq!(
            older,
            newer + 1,
            "{policy}: occurrence +120, run after +180, is issued the next token"
        );
        let sent: Vec<u64> = app
            .sink
            .received()
            .iter()
            .filter_map(|r| r.body["fencingToken"].as_u64())
            .collect();
        assert!(
            sent.windows(2).all(|w| w[0] < w[1]),
            "{policy}: tokens the job received, in order: {sent:?}"
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
