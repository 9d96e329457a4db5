//! scheduled-job, as release `.wasm` served by the real `spin up`: which occurrence a tick may
//! name (review #3). The tick token (`timer_token`) names only the occurrence due now by the
//! instance's clock; naming any other, past or future, is a manual run and needs the admin
//! token. And no tick, whatever its token, records `skipped_overlap` on an occurrence that is
//! not due yet by the storage server's clock: it records nothing and answers 503
//! `occurrence_not_due` with `Retry-After`, and the occurrence runs once it is due.

use std::time::Duration;

use leasegate_tests::app::{App, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::jobs::{calls_of, log_entry, occurrence_of, tick};
use leasegate_tests::sink::Behaviour;
use leasegate_tests::{unique_container, unix_now};

fn runs_of(apps: &[&App], occurrence: u64) -> usize {
    calls_of(apps, occurrence).len()
}

/// A per-minute job: the tick token runs the occurrence due now (a trigger time a second or two
/// off included), and is refused (403, nothing sent to storage) for the next occurrence, for
/// one minutes ahead within `job_early_seconds` (300 s), and for a past one. The admin token
/// may name them.
#[test]
fn the_tick_token_names_only_the_occurrence_due_now() {
    let app = App::start(
        "due-token",
        &[("instance_id", "node-t"), ("job_period_seconds", "5")],
    );
    let now = unix_now();
    for (at, what) in [
        (now + 60, "the next occurrence"),
        (now + 240, "an occurrence four minutes ahead"),
        (now - 120, "a past occurrence"),
    ] {
        let (a, sent) = app.storage_requests(|| tick(&app, TIMER_AUTH, Some(at)));
        assert_eq!(a.status, 403, "{what}: {}", a.text);
        assert_eq!(a.json["error"], "forbidden", "{what}: {}", a.text);
        assert!(
            a.json["message"]
                .as_str()
                .unwrap_or("")
                .contains("other than the one due now"),
            "{what}: {}",
            a.text
        );
        assert_eq!(sent, 0, "{what}: storage was asked");
    }
    assert!(app.sink.received().is_empty());
    // The one due now, named with a trigger time a second off, by a scheduler on time (a job's
    // history begins at its first tick).
    leasegate_tests::jobs::next_period(5, 0);
    let due = tick(&app, TIMER_AUTH, Some(unix_now() + 1));
    assert_eq!(due.status, 200, "{}", due.text);
    assert_eq!(due.json["decision"], "ran", "{}", due.text);
    // The admin token may run the next one by hand.
    let next = occurrence_of(&due) + 5;
    let manual = tick(&app, ADMIN_AUTH, Some(next));
    assert_eq!(manual.status, 200, "{}", manual.text);
    assert_eq!(manual.json["decision"], "ran", "{}", manual.text);
    assert_eq!(runs_of(&[&app], next), 1);
}

/// node-a's run of the current occurrence holds the job's lease for a few seconds. Meanwhile a
/// manual tick on node-b names the next occurrence, not due for many seconds: it records
/// nothing (no `skipped_overlap`, no reservation, no log entry) and answers 503
/// `occurrence_not_due` with a `Retry-After` up to its due time. Once it is due, node-b's
/// scheduler tick runs it.
#[test]
fn no_tick_skips_an_occurrence_before_it_is_due() {
    let container = unique_container("due-overlap");
    let start = |instance: &str| {
        App::start_with(
            "due-overlap",
            &[
                ("instance_id", instance),
                ("job_period_seconds", "20"),
                ("job_timeout_seconds", "10"),
            ],
            Setup {
                container: Some(container.clone()),
                ..Setup::default()
            },
        )
    };
    let (a, b) = (start("node-a"), start("node-b"));
    a.sink.behave(Behaviour::Late(Duration::from_secs(4), 204));
    let (current, early) = std::thread::scope(|s| {
        let run = s.spawn(|| tick(&a, TIMER_AUTH, None));
        leasegate_tests::wait_for("node-a's run", Duration::from_secs(30), || {
            (!a.sink.received().is_empty()).then_some(())
        });
        let x = a.sink.received()[0].body["occurrenceUnix"]
            .as_u64()
            .unwrap();
        let early = tick(&b, ADMIN_AUTH, Some(x + 20));
        (run.join().unwrap(), early)
    });
    assert_eq!(current.json["decision"], "ran", "{}", current.text);
    let x = occurrence_of(&current);
    assert_eq!(early.status, 503, "{}", early.text);
    assert_eq!(early.json["error"], "occurrence_not_due", "{}", early.text);
    assert_eq!(early.json["decision"], "not_due", "{}", early.text);
    let wait: u64 = early.headers["retry-after"].parse().unwrap();
    assert!((2..=30).contains(&wait), "Retry-After {wait}");
    assert!(
        log_entry(&b, x + 20).is_null(),
        "the early tick wrote a log entry"
    );
    // The reservation it made was taken back: the due tick creates it and runs.
    leasegate_tests::wait_for("the next occurrence", Duration::from_secs(40), || {
        (unix_now() >= x + 20).then_some(())
    });
    let due = tick(&b, TIMER_AUTH, None);
    assert_eq!(occurrence_of(&due), x + 20, "{}", due.text);
    assert_eq!(due.json["decision"], "ran", "{}", due.text);
    assert_eq!(runs_of(&[&a, &b], x + 20), 1);
    assert_eq!(runs_of(&[&a, &b], x), 1);
}
