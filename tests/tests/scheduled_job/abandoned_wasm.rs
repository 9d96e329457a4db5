//! scheduled-job, as release `.wasm` served by the real `spin up`: a reservation whose reserver
//! failed before writing its outcome is settled by another deployment once the reserver's
//! deadline (the reservation's time plus the job's lease term) has passed. A tick naming that
//! occurrence runs it (once: the outcome's compare-and-swap decides); the winner of a later
//! occurrence records it `missed`. Two deployments share one container; the failure enters at
//! the fault proxy in front of the reserver's storage (review #2).

use std::time::Duration;

use leasegate_tests::app::{App, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::jobs::{
    calls_of, log_entry, occurrence_of, tick, tick_naming_the_reserver, JOB,
};
use leasegate_tests::proxy::Fault;
use leasegate_tests::{unique_container, unix_now, wait_for};

/// job_timeout 1 s + 4 x storage_timeout 1 s + 10 s: the job's lease term, and so how long a
/// reserver has to write its outcome.
const DEADLINE_SECS: u64 = 15;

/// The job calls of `occurrence`: (instance, idempotency key, fencing token).
fn runs_of(apps: &[&App], occurrence: u64) -> Vec<(String, String, u64)> {
    calls_of(apps, occurrence)
        .into_iter()
        .map(|r| {
            (
                r.body["instance"].as_str().unwrap_or("").to_string(),
                r.idempotency_key.unwrap_or_default(),
                r.body["fencingToken"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// Two deployments of one job on one container: node-a and node-b.
fn pair(tag: &str, period: u64, offset: u64) -> (App, App) {
    let container = unique_container(tag);
    let vars = |instance: &'static str| {
        [
            ("instance_id", instance.to_string()),
            ("job_period_seconds", period.to_string()),
            ("job_offset_seconds", offset.to_string()),
            ("job_timeout_seconds", "1".to_string()),
            ("storage_timeout_ms", "1000".to_string()),
        ]
    };
    let start = |instance| {
        let v = vars(instance);
        let refs: Vec<(&str, &str)> = v.iter().map(|(k, v)| (*k, v.as_str())).collect();
        App::start_with(
            tag,
            &refs,
            Setup {
                container: Some(container.clone()),
                ..Setup::default()
            },
        )
    };
    (start("node-a"), start("node-b"))
}

/// Every request node-a sends for the job's lease fails: it reserves the occurrence, then
/// cannot write its outcome. Its take-back of the reservation fails too (as when the instance
/// stops before it), so the reservation stays without an outcome.
fn break_the_lease(app: &App) {
    let c = app.container.as_str();
    app.storage.fault_on(
        &format!("/devstoreaccount1/{c}/jobs/{JOB}/lock"),
        Fault::Status(503),
    );
    app.storage.fault_on(
        &format!("DELETE /devstoreaccount1/{c}/jobs/{JOB}/occurrences/"),
        Fault::Status(503),
    );
}

/// Waits until the instance's clock is at or past `t` (Unix seconds).
fn wait_until(t: u64) {
    while unix_now() < t {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// node-a reserves the occurrence and fails before its outcome (503). node-b's tick of the same
/// occurrence is skipped while node-a's deadline runs; after it, node-b's tick runs the
/// occurrence, once, and node-a's retry finds it settled.
#[test]
fn a_tick_after_the_reservers_deadline_runs_the_occurrence() {
    // A two-minute period whose occurrence lands a little after the apps are up: every tick of
    // the next minute names it.
    let x = unix_now() + 20;
    let (a, b) = pair("abandon-run", 120, x % 120);
    wait_until(x);
    break_the_lease(&a);
    let failed = tick(&a, TIMER_AUTH, None);
    assert_eq!(failed.status, 503, "{}", failed.text);
    assert_eq!(occurrence_of(&failed), x, "{}", failed.text);
    a.storage.set_fault(None);

    // node-b's tick, asking who reserved it (a read of the reservation: an on-time tick that
    // does not ask reads nothing, and is skipped as well).
    let early = tick_naming_the_reserver(&b, TIMER_AUTH, None);
    assert_eq!(early.status, 200, "{}", early.text);
    assert_eq!(early.json["decision"], "skipped", "{}", early.text);
    assert_eq!(early.json["reservedBy"], "node-a", "{}", early.text);
    assert!(runs_of(&[&a, &b], x).is_empty());

    // Past the deadline (storage's clock, not the test's: a tick until it runs).
    let ran = wait_for(
        "node-b to take the occurrence over",
        Duration::from_secs(DEADLINE_SECS + 20),
        || {
            let t = tick(&b, TIMER_AUTH, None);
            assert_eq!(occurrence_of(&t), x, "{}", t.text);
            (t.json["decision"] != "skipped").then_some(t)
        },
    );
    assert!(unix_now() >= x + DEADLINE_SECS - 1, "taken over too early");
    assert_eq!(ran.status, 200, "{}", ran.text);
    assert_eq!(ran.json["decision"], "ran", "{}", ran.text);
    assert_eq!(ran.json["entry"]["instance"], "node-b", "{}", ran.text);
    let runs = runs_of(&[&a, &b], x);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].0, "node-b");

    // node-a's retry, and node-b's again: settled, not run again.
    for (app, who) in [(&a, "node-a"), (&b, "node-b")] {
        let again = tick(app, TIMER_AUTH, None);
        assert_eq!(again.status, 200, "{who}: {}", again.text);
        assert_eq!(again.json["decision"], "skipped", "{who}: {}", again.text);
    }
    assert_eq!(runs_of(&[&a, &b], x).len(), 1);
    assert_eq!(log_entry(&b, x)["status"], "succeeded");
    a.assert_no_trap();
    b.assert_no_trap();
}

/// node-a reserves an occurrence and its tick fails (503) before the job is called; the
/// occurrence still runs once, on time:
/// * a 503 on the job's lease, or on the outcome `running`: node-a takes its reservation back
///   (a delete `If-Match` its create's ETag), so node-b's on-time tick, which would not read a
///   reservation it finds (it names nobody), reserves the occurrence afresh and runs it;
/// * the create's answer lost, or a 503 on the log's read with the take-back failing too: the
///   reservation stays, and node-a's retry of its 503 (on time, the tick token) reads it, since
///   node-a noted its failed tick in its key-value store, finds it its own and runs it.
///
/// Each time the other deployment's tick after it is skipped, and the occurrence ran once.
#[test]
fn a_tick_that_fails_before_its_outcome_leaves_the_occurrence_to_run_on_time() {
    let x = unix_now() + 20;
    let (a, b) = pair("abandon-retry", 20, x % 20);
    let c = a.container.as_str().to_string();
    let occurrence = |o: u64| format!("/devstoreaccount1/{c}/jobs/{JOB}/occurrences/{o:012}");
    // (The occurrence, the faults on node-a's tick, whether node-a's retry runs it.)
    type Case = (u64, Vec<(String, Fault)>, bool);
    let cases: [Case; 4] = [
        (
            x,
            vec![(
                format!("/devstoreaccount1/{c}/jobs/{JOB}/lock"),
                Fault::Status(503),
            )],
            false,
        ),
        (
            x + 20,
            vec![(
                format!("{}?comp=metadata", occurrence(x + 20)),
                Fault::Status(503),
            )],
            false,
        ),
        (
            x + 40,
            // The create's answer lost and its read-back refused too (a lost answer alone is
            // read back and run in the same tick: scheduled_job/lost_answers_wasm.rs).
            vec![
                (format!("PUT {}", occurrence(x + 40)), Fault::LoseAnswer),
                (format!("HEAD {}", occurrence(x + 40)), Fault::Status(503)),
            ],
            true,
        ),
        (
            x + 60,
            vec![
                (
                    format!("GET /devstoreaccount1/{c}/jobs/{JOB}/log.json"),
                    Fault::Status(503),
                ),
                (format!("DELETE {}", occurrence(x + 60)), Fault::Status(503)),
            ],
            true,
        ),
    ];
    for (o, faults, retried) in cases {
        wait_until(o);
        for (part, fault) in &faults {
            a.storage.fault_on(part, fault.clone());
        }
        let failed = tick(&a, TIMER_AUTH, None);
        a.storage.set_fault(None);
        assert_eq!(failed.status, 503, "{faults:?}: {}", failed.text);
        assert_eq!(occurrence_of(&failed), o, "{}", failed.text);
        assert!(runs_of(&[&a, &b], o).is_empty());

        let (runner, other) = if retried { (&a, &b) } else { (&b, &a) };
        let ran = tick(runner, TIMER_AUTH, None);
        assert!(
            unix_now() < o + 10,
            "the tick was late: it would read first"
        );
        assert_eq!(ran.status, 200, "{faults:?}: {}", ran.text);
        assert_eq!(ran.json["decision"], "ran", "{faults:?}: {}", ran.text);
        assert_eq!(occurrence_of(&ran), o, "{}", ran.text);
        let skipped = tick(other, TIMER_AUTH, None);
        assert_eq!(skipped.json["decision"], "skipped", "{}", skipped.text);
        let runs = runs_of(&[&a, &b], o);
        assert_eq!(runs.len(), 1, "{faults:?}: {runs:?}");
        assert_eq!(runs[0].0, if retried { "node-a" } else { "node-b" });
    }
    a.assert_no_trap();
    b.assert_no_trap();
}

/// A per-5-second job: node-a reserves one occurrence and fails before its outcome; node-b
/// wins the next ones. Once node-a's deadline has passed, node-b's winning tick records the
/// abandoned occurrence `missed` (on its reservation and in the log): an operator sees the
/// gap, and node-a's late retry finds it settled. Nothing ran it, nothing ran twice.
#[test]
fn a_later_winner_records_an_abandoned_occurrence_as_missed() {
    let (a, b) = pair("abandon-miss", 5, 0);
    // A run first: the log exists and is settled up to it.
    let first = tick(&b, TIMER_AUTH, None);
    assert_eq!(first.json["decision"], "ran", "{}", first.text);
    let y0 = occurrence_of(&first);

    let x = y0 + 5;
    wait_until(x);
    break_the_lease(&a);
    let failed = tick(&a, TIMER_AUTH, None);
    assert_eq!(failed.status, 503, "{}", failed.text);
    assert_eq!(occurrence_of(&failed), x, "{}", failed.text);
    a.storage.set_fault(None);

    // node-b ticks every occurrence after it, as its scheduler would.
    let mut next = x + 5;
    let missed = wait_for(
        "the abandoned occurrence to be recorded missed",
        Duration::from_secs(DEADLINE_SECS + 30),
        || {
            wait_until(next);
            let t = tick(&b, TIMER_AUTH, None);
            assert_eq!(t.status, 200, "{}", t.text);
            assert_eq!(t.json["decision"], "ran", "{}", t.text);
            next = occurrence_of(&t) + 5;
            Some(log_entry(&b, x)).filter(|e| e["status"] == "missed")
        },
    );
    assert_eq!(missed["instance"], "node-a", "{missed}");
    assert!(
        missed["reason"].as_str().unwrap_or("").contains("node-a"),
        "{missed}"
    );
    assert!(
        runs_of(&[&a, &b], x).is_empty(),
        "the abandoned occurrence ran"
    );
    // node-a's late retry of it (a manual tick) finds it settled.
    let retry = tick(&a, ADMIN_AUTH, Some(x));
    assert_eq!(retry.status, 200, "{}", retry.text);
    assert_eq!(retry.json["decision"], "skipped", "{}", retry.text);
    assert!(runs_of(&[&a, &b], x).is_empty());
    // Every other occurrence ran once.
    for o in (y0..next).step_by(5).filter(|o| *o != x) {
        assert_eq!(runs_of(&[&a, &b], o).len(), 1, "occurrence {o}");
    }
    a.assert_no_trap();
    b.assert_no_trap();
}
