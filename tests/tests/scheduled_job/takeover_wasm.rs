//! scheduled-job, as release `.wasm` served by the real `spin up`: retries and takeover
//! (`job_retries`, `job_retry_delay_seconds`). A failed run is attempted again by a later tick,
//! up to the limit and no further, with the same idempotency key, an `attempt` number and a
//! fencing token above every earlier attempt's and below the next occurrence's. A run whose
//! deployment is killed mid-job (SIGKILL of its `spin`) is taken over by another deployment
//! after the run's deadline; with no attempts left it is recorded `failed`, never run twice.

use std::collections::BTreeSet;
use std::time::Duration;

use leasegate_tests::app::{App, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::jobs::{calls_of, early_in_a_period, log_entry, occurrence_of, status, tick};
use leasegate_tests::sink::Behaviour;
use leasegate_tests::{unique_container, unix_now, wait_for};

/// `job_retries = 2`: a job that keeps failing is called 3 times for one occurrence (a tick
/// each, at least `job_retry_delay_seconds` apart), with one idempotency key, attempts 1, 2, 3
/// and tokens `occurrence x 2^16 + 0, 1, 2`; the tick after the last attempt calls nothing.
/// Before the delay has passed, a tick waits.
#[test]
fn a_failed_run_is_retried_up_to_the_limit_and_no_further() {
    let app = App::start(
        "retries",
        &[
            ("instance_id", "node-r"),
            ("job_retries", "2"),
            ("job_retry_delay_seconds", "2"),
        ],
    );
    app.sink.behave(Behaviour::Answer(500));
    // Within the tick tolerance (10 s) of the occurrence: a fresh job's first tick later than
    // that finds it before the job's history.
    early_in_a_period(60, 5_000);
    let first = tick(&app, TIMER_AUTH, None);
    assert_eq!(first.status, 502, "{}", first.text);
    assert_eq!(first.json["decision"], "failed", "{}", first.text);
    let o = occurrence_of(&first);
    // Within the delay: no attempt.
    let early = tick(&app, TIMER_AUTH, None);
    assert_eq!(early.json["decision"], "skipped", "{}", early.text);
    assert!(
        early.json["reason"]
            .as_str()
            .unwrap()
            .contains("attempt 2 may start in"),
        "{}",
        early.text
    );
    assert_eq!(calls_of(&[&app], o).len(), 1);
    for attempt in [2, 3] {
        std::thread::sleep(Duration::from_millis(2100));
        let a = tick(&app, TIMER_AUTH, None);
        assert_eq!(occurrence_of(&a), o, "{}", a.text);
        assert_eq!(
            a.json["decision"], "failed",
            "attempt {attempt}: {}",
            a.text
        );
        assert_eq!(a.json["entry"]["attempt"], attempt, "{}", a.text);
    }
    std::thread::sleep(Duration::from_millis(2100));
    let after = tick(&app, TIMER_AUTH, None);
    assert_eq!(after.json["decision"], "skipped", "{}", after.text);
    let calls = calls_of(&[&app], o);
    assert_eq!(calls.len(), 3, "three attempts, no more");
    let keys: BTreeSet<_> = calls.iter().map(|c| c.idempotency_key.clone()).collect();
    assert_eq!(keys.len(), 1, "one idempotency key: {keys:?}");
    let attempts: Vec<u64> = calls
        .iter()
        .map(|c| c.body["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 2, 3]);
    let tokens: Vec<u64> = calls
        .iter()
        .map(|c| c.body["fencingToken"].as_u64().unwrap())
        .collect();
    assert_eq!(tokens, [o << 16, (o << 16) + 1, (o << 16) + 2]);
    assert!(tokens[2] < (o + 60) << 16, "below the next occurrence's");
    let entry = log_entry(&app, o);
    assert_eq!(entry["status"], "failed", "{entry}");
    assert_eq!(entry["attempt"], 3, "{entry}");
    let s = status(&app);
    assert_eq!(s["counters"]["failed"], 3, "{s}");
    assert_eq!(s["counters"]["retried"], 2, "{s}");
    // A job that recovers: the next occurrence runs normally.
}

/// A retry that succeeds ends the attempts: `succeeded`, attempt 2.
#[test]
fn a_retry_that_succeeds_settles_the_occurrence() {
    let app = App::start(
        "retry-ok",
        &[
            ("instance_id", "node-r2"),
            ("job_retries", "3"),
            ("job_retry_delay_seconds", "1"),
        ],
    );
    app.sink.behave(Behaviour::Answer(503));
    // Within the tick tolerance (10 s) of the occurrence: a fresh job's first tick later than
    // that finds it before the job's history.
    early_in_a_period(60, 5_000);
    let first = tick(&app, TIMER_AUTH, None);
    assert_eq!(first.json["decision"], "failed", "{}", first.text);
    let o = occurrence_of(&first);
    app.sink.behave(Behaviour::Answer(204));
    std::thread::sleep(Duration::from_millis(1100));
    let second = tick(&app, TIMER_AUTH, None);
    assert_eq!(second.json["decision"], "ran", "{}", second.text);
    assert_eq!(second.json["entry"]["attempt"], 2, "{}", second.text);
    std::thread::sleep(Duration::from_millis(1100));
    let third = tick(&app, TIMER_AUTH, None);
    assert_eq!(third.json["decision"], "skipped", "{}", third.text);
    assert_eq!(calls_of(&[&app], o).len(), 2);
    assert_eq!(log_entry(&app, o)["status"], "succeeded");
}

/// Two deployments; node-a's run is mid-job (the job answers after 60 s) when its `spin` is
/// killed (SIGKILL). After the run's deadline (the job's lease term, 5 + 4 x 1 + 10 = 19 s, and
/// 2 s)
/// node-b takes the occurrence over with attempt 2, a higher token and the same idempotency
/// key: an idempotent receiver (one effect per key) records the effect once. With
/// `job_retries = 0` the same loss is recorded `failed` and nothing runs again.
#[test]
fn a_run_whose_deployment_is_killed_is_taken_over_after_its_deadline() {
    for retries in ["1", "0"] {
        let container = unique_container("takeover");
        let start = |instance: &str| {
            App::start_with(
                "takeover",
                &[
                    ("instance_id", instance),
                    ("job_retries", retries),
                    ("job_retry_delay_seconds", "0"),
                    ("job_timeout_seconds", "5"),
                    ("storage_timeout_ms", "1000"),
                ],
                Setup {
                    container: Some(container.clone()),
                    ..Setup::default()
                },
            )
        };
        let (a, b) = (start("node-a"), start("node-b"));
        a.sink.behave(Behaviour::Late(Duration::from_secs(60), 204));
        // On time: within the tick tolerance of the occurrence (a job's history begins at its
        // first tick, and a first tick later than that runs nothing).
        early_in_a_period(60, 5_000);
        let o = unix_now() / 60 * 60;
        std::thread::scope(|s| {
            // node-a's tick hangs in the job call; its answer is lost with it.
            s.spawn(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    tick(&a, TIMER_AUTH, None)
                }))
            });
            wait_for("node-a's job call", Duration::from_secs(20), || {
                (!a.sink.received().is_empty()).then_some(())
            });
            a.spin.kill();
        });
        // Within the run's deadline node-b leaves it alone.
        let within = tick(&b, ADMIN_AUTH, Some(o));
        assert_eq!(within.json["decision"], "skipped", "{}", within.text);
        assert_eq!(calls_of(&[&b], o).len(), 0);
        // After it, node-b takes it over.
        let taken = wait_for("the run's deadline", Duration::from_secs(40), || {
            let t = tick(&b, ADMIN_AUTH, Some(o));
            // (An on-time tick finds the occurrence reserved and reads no further: "reserved
            // already"; a later one reads it, and waits for the deadline too.)
            let reason = t.json["reason"].as_str().unwrap_or("");
            let waiting = t.json["decision"] == "in_progress"
                || (t.json["decision"] == "skipped"
                    && (reason.contains("another instance")
                        || reason.starts_with("reserved already")));
            (!waiting).then_some(t)
        });
        let calls = calls_of(&[&a, &b], o);
        if retries == "1" {
            assert_eq!(taken.json["decision"], "ran", "{}", taken.text);
            assert_eq!(calls.len(), 2, "{retries}");
            assert_eq!(calls[1].body["attempt"], 2);
            let (t1, t2) = (
                calls[0].body["fencingToken"].as_u64().unwrap(),
                calls[1].body["fencingToken"].as_u64().unwrap(),
            );
            assert!(t1 < t2 && t2 < (o + 60) << 16, "{t1} then {t2}");
            let keys: BTreeSet<_> = calls.iter().map(|c| c.idempotency_key.clone()).collect();
            assert_eq!(
                keys.len(),
                1,
                "an idempotent receiver sees one effect: {keys:?}"
            );
            assert_eq!(log_entry(&b, o)["status"], "succeeded");
        } else {
            assert_eq!(taken.json["decision"], "skipped", "{}", taken.text);
            assert!(
                taken.json["reason"]
                    .as_str()
                    .unwrap()
                    .contains("wrote no outcome within the run's deadline"),
                "{}",
                taken.text
            );
            assert_eq!(calls.len(), 1, "not run again");
            let entry = log_entry(&b, o);
            assert_eq!(entry["status"], "failed", "{entry}");
        }
        // And never again.
        let again = tick(&b, ADMIN_AUTH, Some(o));
        assert_eq!(again.json["decision"], "skipped", "{}", again.text);
        assert_eq!(calls_of(&[&a, &b], o).len(), calls.len());
    }
}

/// Review: the run's result never reaches its reservation (storage answers 503 to every
/// metadata write while the job is answering), but the log records `succeeded`. After the
/// run's deadline a tick of the occurrence does not take it for a vanished run (with a retry
/// allowed it would call the job again): the log says the attempt finished, the reservation is
/// brought in line, and the job was called once.
#[test]
fn a_lost_result_write_is_not_taken_for_a_vanished_run() {
    let app = App::start(
        "lostresult",
        &[
            ("instance_id", "node-l"),
            ("job_retries", "1"),
            ("job_retry_delay_seconds", "0"),
            ("job_timeout_seconds", "5"),
            ("storage_timeout_ms", "1000"),
        ],
    );
    app.sink
        .behave(Behaviour::Late(Duration::from_secs(2), 204));
    // Within the tick tolerance (10 s) of the occurrence: a fresh job's first tick later than
    // that finds it before the job's history.
    early_in_a_period(60, 5_000);
    let o = unix_now() / 60 * 60;
    let ran = std::thread::scope(|s| {
        let run = s.spawn(|| tick(&app, TIMER_AUTH, None));
        wait_for("the job call", Duration::from_secs(20), || {
            (!app.sink.received().is_empty()).then_some(())
        });
        app.storage
            .fault_on("?comp=metadata", leasegate_tests::proxy::Fault::Status(503));
        run.join().unwrap()
    });
    app.storage.set_fault(None);
    assert_eq!(ran.json["decision"], "ran", "{}", ran.text);
    assert_eq!(occurrence_of(&ran), o);
    assert_eq!(log_entry(&app, o)["status"], "succeeded");
    // Past the run's deadline (5 + 4 x 1 + 10 + 2 = 21 s).
    std::thread::sleep(Duration::from_secs(22));
    let after = tick(&app, ADMIN_AUTH, Some(o));
    assert_eq!(after.json["decision"], "skipped", "{}", after.text);
    assert_eq!(calls_of(&[&app], o).len(), 1, "called again");
    let again = tick(&app, ADMIN_AUTH, Some(o));
    assert_eq!(again.json["decision"], "skipped", "{}", again.text);
    assert_eq!(calls_of(&[&app], o).len(), 1);
    assert_eq!(log_entry(&app, o)["status"], "succeeded");
}
