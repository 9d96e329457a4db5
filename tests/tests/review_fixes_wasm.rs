//! Fixes from the adversarial review, as release `.wasm` served by the real `spin up`:
//! scheduled-job's retried tick that finds its own occurrence's lease but no outcome on the
//! reservation (review finding 2).

use std::time::Duration;

use leasegate_tests::app::{call, Answer, App, ADMIN_AUTH};
use leasegate_tests::proxy::Fault;
use leasegate_tests::{rfc3339_secs as rfc3339, unix_now};
use serde_json::json;

const JOB: &str = "example-job";

fn tick_at(app: &App, at: u64) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/jobs/{JOB}/tick")),
        &[ADMIN_AUTH, ("content-type", "application/json")],
        json!({ "at": rfc3339(at) }).to_string().as_bytes(),
    )
}

fn job_runs(app: &App, occurrence: u64) -> usize {
    app.sink
        .received()
        .iter()
        .filter(|r| r.path == "/job" && r.body["occurrenceUnix"].as_u64() == Some(occurrence))
        .count()
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
            &format!("PUT /devstoreaccount1/{c}/jobs/{JOB}/lock?comp=lease"),
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
            .any(|s| s.describe() == "lease release" && s.fault == Some(Fault::Status(503))),
        "the release was not refused"
    );
    assert_eq!(job_runs(&app, occurrence), 0);
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
    assert_eq!(job_runs(&app, occurrence), 1);
    let again = tick_at(&app, occurrence);
    assert_eq!(again.json["decision"], "skipped", "{}", again.text);
    assert_eq!(job_runs(&app, occurrence), 1);
}
