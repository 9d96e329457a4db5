//! scheduled-job, as release `.wasm` served by the real `spin up`: a retried or concurrent
//! tick of one instance never runs an occurrence twice nor loses it. Two `App`s with the same
//! `instance_id` share a container, slowed at the fault proxies, so that one instance's ticks
//! interleave as a replica's, a retried HTTP tick or a manual tick beside the timer would; a tick retried after the reservation log moved on finds its
//! occurrence settled; the outcome written on the reservation is the commit point (a lost
//! answer, a failure before it); a retry that finds its own lease but no outcome waits for the
//! lease to end, then runs the occurrence once.

use std::time::Duration;

use leasegate_tests::app::{call, Answer, App, Setup, ADMIN_AUTH};
use leasegate_tests::jobs::{log_entry, runs};
use leasegate_tests::proxy::Fault;
use leasegate_tests::{rfc3339_secs as rfc3339, unix_now};
use serde_json::json;

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

/// The job's lease record's write, the first request of taking the job's lease (from the
/// lease as the previous run's release left it, which the log keeps).
fn lock_write(app: &App) -> String {
    format!(
        "PUT /devstoreaccount1/{}/jobs/{JOB}/lock?comp=metadata",
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
        .fault_on(&lock_write(&a), Fault::Delay(Duration::from_secs(8)));
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(|| tick_at(&a, occ));
        // A's reservation is written once its lease step begins.
        wait_seen(&a, &lock_write(&a));
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
        .fault_on(&lock_write(&a), Fault::Delay(Duration::from_secs(6)));
    // B's job call is slow: it holds the lease well past A's lease step.
    b.webhook
        .set_fault(Some(Fault::Delay(Duration::from_secs(12))));
    let (first, second, during) = std::thread::scope(|s| {
        let first = s.spawn(|| tick_at(&a, occ));
        wait_seen(&a, &lock_write(&a));
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

/// A tick reserves the occurrence and takes the job's lease, then its outcome write fails and
/// so does the release of the lease: it answers 503. The retry finds its own occurrence's
/// lease and no outcome on the reservation: nobody is running the job, so it must not answer
/// 200 "skipped" (the scheduler would stop retrying and the occurrence would be lost). It
/// answers 503 `occurrence_in_progress` with a Retry-After until the lease ends; a tick after
/// that runs the occurrence, once.
#[test]
fn a_retry_that_finds_its_own_lease_but_no_outcome_is_not_settled() {
    // A 15 s lease term: job_timeout 1 s + 4 x 1 s + 10 s.
    let app = App::start(
        "review-job",
        &[
            ("instance_id", "node-r"),
            ("job_timeout_seconds", "1"),
            ("storage_timeout_ms", "1000"),
        ],
    );
    let base = (unix_now() / 60 + 1) * 60;
    assert_eq!(tick_at(&app, base).json["decision"], "ran");
    let occurrence = base + 60;
    let c = app.container.as_str();
    // The reservation's path, learnt from the first occurrence's.
    let first = format!("{base:012}");
    let reservation = app
        .storage
        .seen()
        .iter()
        .find(|s| s.method == "PUT" && s.path().ends_with(&first))
        .map(|s| s.path().replace(&first, &format!("{occurrence:012}")))
        .expect("the first occurrence's reservation was written");
    // The outcome write fails; its read-back is slow (time to break the release too).
    app.storage.fault_on(
        &format!("PUT {reservation}?comp=metadata"),
        Fault::Status(503),
    );
    app.storage.fault_on(
        &format!("HEAD {reservation}"),
        Fault::Delay(Duration::from_millis(700)),
    );
    let failed = std::thread::scope(|s| {
        let tick = s.spawn(|| tick_at(&app, occurrence));
        leasegate_tests::wait_for("the outcome write", Duration::from_secs(30), || {
            app.storage
                .seen()
                .iter()
                .any(|s| s.fault == Some(Fault::Status(503)))
                .then_some(())
        });
        app.storage.fault_on(
            &format!("PUT /devstoreaccount1/{c}/jobs/{JOB}/lock?comp=metadata"),
            Fault::Status(503),
        );
        tick.join().unwrap()
    });
    app.storage.set_fault(None);
    assert_eq!(failed.status, 503, "{}", failed.text);
    assert!(
        app.storage
            .seen()
            .iter()
            .any(|s| s.path().ends_with("/lock")
                && s.describe() == "PUT metadata"
                && s.fault == Some(Fault::Status(503))),
        "the release was not refused"
    );
    assert_eq!(runs_of(&[&app], occurrence), 0);
    // The retry: the lease is still this occurrence's, the reservation has no outcome.
    let retry = tick_at(&app, occurrence);
    assert_eq!(retry.status, 503, "{}", retry.text);
    assert_eq!(
        retry.json["error"], "occurrence_in_progress",
        "{}",
        retry.text
    );
    let wait: u64 = retry
        .headers
        .get("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After: {retry:?}"));
    assert!((1..=16).contains(&wait), "Retry-After {wait}");
    // Once the lease has ended, a tick runs it.
    let ran = leasegate_tests::wait_for("the occurrence to run", Duration::from_secs(40), || {
        let a = tick_at(&app, occurrence);
        (a.status != 503).then_some(a)
    });
    assert_eq!(ran.json["decision"], "ran", "{}", ran.text);
    assert_eq!(runs_of(&[&app], occurrence), 1);
    let again = tick_at(&app, occurrence);
    assert_eq!(again.json["decision"], "skipped", "{}", again.text);
    assert_eq!(runs_of(&[&app], occurrence), 1);
}

/// The job calls `app`'s sink received for `occurrence`: their attempts, in order.
fn attempts_of(app: &App, occurrence: u64) -> Vec<u64> {
    leasegate_tests::jobs::calls_of(&[app], occurrence)
        .iter()
        .filter_map(|r| r.body["attempt"].as_u64())
        .collect()
}

/// Issue 47, item 2: a job longer than a tick's catch-up budget (120 s; `job_timeout_seconds`
/// is allowed up to 3600) ticked once per occurrence, as the cron trigger and Azure timers tick:
/// each later tick still makes progress after its own run. Its failed attempt is retried by the
/// next tick (`job_retries = 1`, the job answering 500 once), and the occurrences no tick came
/// for are caught up (`job_catch_up = all`), one a tick; the answers say more is left.
#[test]
fn a_job_longer_than_the_budget_is_retried_and_caught_up() {
    const PERIOD: u64 = 3;
    let app = App::start(
        "longjob",
        &[
            ("instance_id", "node-long"),
            ("job_period_seconds", "3"),
            ("job_timeout_seconds", "150"),
            ("job_retries", "1"),
            ("job_retry_delay_seconds", "0"),
            ("job_catch_up", "all"),
        ],
    );
    let tick_now = || leasegate_tests::jobs::tick(&app, leasegate_tests::app::TIMER_AUTH, None);
    let o1 = leasegate_tests::jobs::next_period(PERIOD, 0);
    app.sink.answer(500);
    let failed = tick_now();
    app.sink.answer(204);
    assert_eq!(failed.json["decision"], "failed", "{}", failed.text);
    // Two occurrences nobody ticks (all deployments down), then one a period.
    let o4 = leasegate_tests::jobs::next_period(PERIOD, o1 + 2 * PERIOD);
    let first = tick_now();
    assert_eq!(first.json["decision"], "ran", "{}", first.text);
    assert_eq!(
        attempts_of(&app, o1),
        vec![1, 2],
        "O1's retry: {}",
        first.text
    );
    assert_eq!(first.json["catchUp"]["more"], true, "{}", first.text);
    // Reported as a retry, not as a caught-up run (issue 47, item 10).
    let retried = &first.json["catchUp"]["retried"];
    assert_eq!(retried.as_array().map(Vec::len), Some(1), "{}", first.text);
    assert_eq!(retried[0]["attempt"], 2, "{}", first.text);
    assert_eq!(first.json["catchUp"]["ran"], json!([]), "{}", first.text);
    // The answer's end is the log's (item 10: they differed by a second).
    assert_eq!(
        first.json["entry"]["finishedAt"],
        log_entry(&app, o4)["finishedAt"],
        "{}",
        first.text
    );
    let o5 = leasegate_tests::jobs::next_period(PERIOD, o4);
    let second = tick_now();
    assert_eq!(
        attempts_of(&app, o1 + PERIOD),
        vec![1],
        "caught up: {}",
        second.text
    );
    leasegate_tests::jobs::next_period(PERIOD, o5);
    let third = tick_now();
    assert_eq!(
        attempts_of(&app, o1 + 2 * PERIOD),
        vec![1],
        "caught up: {}",
        third.text
    );
    for o in [o1, o1 + PERIOD, o1 + 2 * PERIOD, o4, o5] {
        let entry = log_entry(&app, o);
        assert_eq!(entry["status"], "succeeded", "{o}: {entry}");
    }
    app.assert_no_trap();
}

/// Issue 47, item 2, for a backfill: with a job longer than the budget, each call runs one
/// occurrence and says where to go on, instead of `ran: []` from the same place forever.
#[test]
fn a_backfill_of_a_job_longer_than_the_budget_makes_progress() {
    const PERIOD: u64 = 3;
    let app = App::start(
        "longfill",
        &[
            ("instance_id", "node-long"),
            ("job_period_seconds", "3"),
            ("job_timeout_seconds", "150"),
        ],
    );
    let tick_now = || leasegate_tests::jobs::tick(&app, leasegate_tests::app::TIMER_AUTH, None);
    let o1 = leasegate_tests::jobs::next_period(PERIOD, 0);
    assert_eq!(tick_now().json["decision"], "ran");
    // Two occurrences nobody ticks, recorded missed by the next winner.
    leasegate_tests::jobs::next_period(PERIOD, o1 + 2 * PERIOD);
    let next = tick_now();
    assert_eq!(next.json["catchUp"]["missed"], 2, "{}", next.text);
    let (o2, o3) = (o1 + PERIOD, o1 + 2 * PERIOD);
    let fill = |from: u64| {
        leasegate_tests::jobs::post(
            &app,
            "backfill",
            ADMIN_AUTH,
            &json!({"from": rfc3339(from), "to": rfc3339(o3)}).to_string(),
        )
    };
    let first = fill(o2);
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(
        first.json["ran"].as_array().map(Vec::len),
        Some(1),
        "{}",
        first.text
    );
    assert_eq!(first.json["continueFrom"], rfc3339(o3), "{}", first.text);
    let second = fill(o3);
    assert_eq!(
        second.json["ran"].as_array().map(Vec::len),
        Some(1),
        "{}",
        second.text
    );
    assert_eq!(second.json["more"], false, "{}", second.text);
    assert_eq!(attempts_of(&app, o2), vec![1]);
    assert_eq!(attempts_of(&app, o3), vec![1]);
    app.assert_no_trap();
}

/// Issue 47, item 6: every run's fencing token is above every earlier run's of the job, in the
/// order the job is called, so a receiver that keeps the highest token and refuses a lower one
/// refuses none of them: an on-time run, a retry of an older occurrence after it, and a
/// backfill of two occurrences older still. (Tokens by occurrence alone gave the retry and
/// the backfilled runs lower tokens.) The idempotency key, not the token, tells occurrences
/// apart.
#[test]
fn tokens_rise_in_the_order_the_job_is_called() {
    const PERIOD: u64 = 3;
    let app = App::start(
        "runorder",
        &[
            ("instance_id", "node-order"),
            ("job_period_seconds", "3"),
            ("job_retries", "1"),
            ("job_retry_delay_seconds", "0"),
        ],
    );
    let tick_now = || leasegate_tests::jobs::tick(&app, leasegate_tests::app::TIMER_AUTH, None);
    let o1 = leasegate_tests::jobs::next_period(PERIOD, 0);
    app.sink.answer(500);
    assert_eq!(tick_now().json["decision"], "failed");
    app.sink.answer(204);
    // O2 and O3 nobody ticks (recorded missed); O4 runs, then its walk retries O1.
    leasegate_tests::jobs::next_period(PERIOD, o1 + 2 * PERIOD);
    let o4 = tick_now();
    assert_eq!(o4.json["decision"], "ran", "{}", o4.text);
    assert_eq!(attempts_of(&app, o1), vec![1, 2], "{}", o4.text);
    let fill = leasegate_tests::jobs::post(
        &app,
        "backfill",
        ADMIN_AUTH,
        &json!({"from": rfc3339(o1 + PERIOD), "to": rfc3339(o1 + 2 * PERIOD)}).to_string(),
    );
    assert_eq!(
        fill.json["ran"].as_array().map(Vec::len),
        Some(2),
        "{}",
        fill.text
    );
    let calls: Vec<(u64, u64)> = app
        .sink
        .received()
        .iter()
        .filter(|r| r.path == "/job")
        .map(|r| {
            (
                r.body["occurrenceUnix"].as_u64().unwrap(),
                r.body["fencingToken"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(calls.len(), 5, "{calls:?}");
    assert!(
        calls.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens in the order the job was called: {calls:?}"
    );
    // An on-time run keeps its occurrence's token (as before this rule).
    assert_eq!(calls[0].1, o1 << 16);
    // The counters count what happened, each event once (docs/timer-functions.md, "Status"):
    // O2 and O3 were recorded missed, then ran when backfilled; O1 failed, then its retry ran.
    let counters = leasegate_tests::jobs::status(&app)["counters"].clone();
    assert_eq!(
        counters,
        json!({"ran": 5, "failed": 1, "retried": 1, "skippedOverlap": 0, "skippedPaused": 0, "missed": 2}),
        "{counters}"
    );
    // Each run's entry in the log holds the token the job received.
    for (o, token) in &calls[1..] {
        let entry = log_entry(&app, *o);
        assert_eq!(entry["fencingToken"].as_u64(), Some(*token), "{entry}");
    }
    app.assert_no_trap();
}
