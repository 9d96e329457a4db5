//! scheduled-job, as release `.wasm` served by the real `spin up`: calendar schedules in a
//! time zone (`job_schedule`, `job_time_zone`), the job's status (`GET /api/jobs/{job}`), bad
//! schedules refused before any storage request, and the catch-up of occurrences no deployment
//! ticked (`job_catch_up = latest | all | none`): each missed one is run or recorded `missed`,
//! none twice.

use std::time::Duration;

use leasegate_tests::app::{App, Setup, TIMER_AUTH};
use leasegate_tests::jobs::{calls_of, early_in_a_period, occurrence_of, runs, status, tick};
use leasegate_tests::{unique_container, unix_now, wait_for};
use serde_json::Value;

/// A 6-field expression in Europe/Berlin: a tick runs the occurrence due (a multiple of 5 s),
/// and the status gives the schedule, the zone, the next 3 occurrences in UTC and local time
/// (CET in November: +01:00), the policies and the counters.
#[test]
fn a_cron_schedule_in_a_zone_runs_and_its_status_shows_the_next_occurrences() {
    let app = App::start(
        "sched-zone",
        &[
            ("instance_id", "node-z"),
            ("job_schedule", "*/5 * * * * *"),
            ("job_time_zone", "Europe/Berlin"),
        ],
    );
    let a = tick(&app, TIMER_AUTH, None);
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["decision"], "ran", "{}", a.text);
    let o = occurrence_of(&a);
    assert_eq!(o % 5, 0, "{}", a.text);
    assert!(o.abs_diff(unix_now()) <= 5, "{}", a.text);
    assert_eq!(calls_of(&[&app], o).len(), 1);
    let s = status(&app);
    assert_eq!(s["schedule"], "*/5 * * * * *", "{s}");
    assert_eq!(s["timeZone"], "Europe/Berlin", "{s}");
    assert_eq!(s["catchUp"], "latest", "{s}");
    let next = s["next"].as_array().unwrap();
    assert_eq!(next.len(), 3, "{s}");
    for n in next {
        let local = n["local"].as_str().unwrap();
        let utc = n["utc"].as_str().unwrap();
        assert!(utc.ends_with('Z'), "{s}");
        // 2026-11-27T10:00:05Z is 2026-11-27T11:00:05+01:00 in Berlin.
        let offset = if local.ends_with("+01:00") { 1 } else { 2 };
        assert!(local.ends_with(":00") && local.len() == 25, "{s}");
        let hour = |t: &str| t[11..13].parse::<u32>().unwrap();
        assert_eq!((hour(utc) + offset) % 24, hour(local), "{s}");
    }
    assert_eq!(s["counters"]["ran"], 1, "{s}");
    assert_eq!(s["reservations"][0]["occurrenceUnix"], o, "{s}");
}

/// A bad expression, an unknown zone, both kinds of schedule, a catch-up word or window out of
/// range: 503 `not_configured` naming the variable (and the field and what was expected), and
/// no storage request.
#[test]
fn bad_schedules_are_refused_before_any_storage_request() {
    for (vars, words) in [
        (
            vec![("job_schedule", "0 25 * * *")],
            "variable job_schedule: field 2 (hour) of `0 25 * * *` is `25`: expected 0-23",
        ),
        (
            vec![("job_schedule", "0 0 * FOO *")],
            "field 4 (month) of `0 0 * FOO *` is `FOO`: expected 1-12 or JAN-DEC",
        ),
        (
            vec![("job_schedule", "* * *")],
            "variable job_schedule: the expression `* * *` has 3 fields",
        ),
        (
            vec![
                ("job_schedule", "0 9 * * *"),
                ("job_time_zone", "Europe/Atlantis"),
            ],
            "variable job_time_zone: the time zone `Europe/Atlantis` is not an IANA zone",
        ),
        (
            vec![("job_schedule", "0 9 * * *"), ("job_period_seconds", "60")],
            "variables job_schedule and job_period_seconds are both set",
        ),
        (vec![("job_schedule", "0 0 30 2 *")], "never occurs"),
        (
            vec![("job_catch_up", "sometimes")],
            "variable job_catch_up must be latest, all or none",
        ),
        (
            vec![
                ("job_catch_up_window_seconds", "999999"),
                ("job_retention_seconds", "3600"),
            ],
            "variable job_catch_up_window_seconds must be at most the retention",
        ),
    ] {
        let mut all = vec![("instance_id", "node-bad")];
        all.extend(vars.iter().copied());
        let app = App::start("sched-bad", &all);
        let (a, sent) = app.storage_requests(|| tick(&app, TIMER_AUTH, None));
        assert_eq!(a.status, 503, "{vars:?}: {}", a.text);
        assert_eq!(a.json["error"], "not_configured", "{vars:?}: {}", a.text);
        let message = a.json["message"].as_str().unwrap_or("");
        assert!(message.contains(words), "{vars:?}: {message}");
        assert_eq!(sent, 0, "{vars:?}: storage was asked");
        assert!(app.sink.received().is_empty());
    }
}

/// Two deployments of a per-5-second job tick one occurrence, then all stop ticking for about
/// 17 s (3 occurrences or so), then one ticks again. Returns the first occurrence, the tick's
/// answer after the gap, and the apps.
fn gap_of_three(tag: &str, catch_up: &str) -> (u64, Value, App, App) {
    let container = unique_container(tag);
    let start = |instance: &str| {
        App::start_with(
            tag,
            &[
                ("instance_id", instance),
                ("job_schedule", "*/5 * * * * *"),
                ("job_catch_up", catch_up),
                ("job_timeout_seconds", "5"),
            ],
            Setup {
                container: Some(container.clone()),
                ..Setup::default()
            },
        )
    };
    let (a, b) = (start("node-a"), start("node-b"));
    early_in_a_period(5, 1000);
    let first = tick(&a, TIMER_AUTH, None);
    assert_eq!(first.json["decision"], "ran", "{}", first.text);
    let o1 = occurrence_of(&first);
    let skipped = tick(&b, TIMER_AUTH, Some(o1));
    assert_eq!(skipped.json["decision"], "skipped", "{}", skipped.text);
    // Nobody ticks o1 + 5, o1 + 10, o1 + 15.
    wait_for("three occurrences to pass", Duration::from_secs(30), || {
        (unix_now() >= o1 + 20).then_some(())
    });
    early_in_a_period(5, 1000);
    let after = tick(&b, TIMER_AUTH, None);
    assert_eq!(after.status, 200, "{}", after.text);
    assert_eq!(after.json["decision"], "ran", "{}", after.text);
    (o1, after.json, a, b)
}

/// The missed occurrences between `o1` and the tick's own.
fn missed_between(o1: u64, answer: &Value) -> Vec<u64> {
    let o = humantime::parse_rfc3339(answer["occurrence"].as_str().unwrap())
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(o >= o1 + 20, "{answer}");
    (o1 + 5..o).step_by(5).collect()
}

/// `latest` (the default): the tick runs the occurrence due now; the ones nobody ticked are
/// recorded `missed`, in the log and the counters, and never run.
#[test]
fn catch_up_latest_runs_the_one_due_and_records_the_missed_ones() {
    let (o1, answer, a, b) = gap_of_three("sched-latest", "latest");
    let missed = missed_between(o1, &answer);
    assert_eq!(answer["catchUp"]["missed"], missed.len(), "{answer}");
    assert_eq!(
        answer["catchUp"]["ran"].as_array().unwrap().len(),
        0,
        "{answer}"
    );
    let s = status(&a);
    assert_eq!(s["counters"]["missed"], missed.len(), "{s}");
    assert_eq!(s["counters"]["ran"], 2, "{s}");
    for m in &missed {
        let e = s["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["occurrenceUnix"] == *m)
            .unwrap_or_else(|| panic!("no entry for {m}: {s}"));
        assert_eq!(e["status"], "missed", "{s}");
        assert!(
            e["reason"]
                .as_str()
                .unwrap()
                .contains("no deployment ticked it"),
            "{s}"
        );
        assert!(calls_of(&[&a, &b], *m).is_empty());
    }
    // A tick naming a missed one later (an admin's) is refused: it was recorded missed.
    let late = tick(&a, leasegate_tests::app::ADMIN_AUTH, Some(missed[0]));
    assert_eq!(late.json["decision"], "skipped", "{}", late.text);
    assert!(calls_of(&[&a, &b], missed[0]).is_empty());
    assert!(runs(&[&a, &b]).values().all(|n| *n == 1));
}

/// `all`: the tick runs the occurrence due now, then each missed one, oldest first, `pastDue`,
/// each once; nothing is recorded missed.
#[test]
fn catch_up_all_runs_each_missed_occurrence_once_oldest_first() {
    let (o1, answer, a, b) = gap_of_three("sched-all", "all");
    let missed = missed_between(o1, &answer);
    let ran: Vec<u64> = answer["catchUp"]["ran"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["occurrenceUnix"].as_u64().unwrap())
        .collect();
    assert_eq!(ran, missed, "{answer}");
    assert_eq!(answer["catchUp"]["missed"], 0, "{answer}");
    // Each caught-up run's token is above the run before it (tokens rise in the order runs
    // start: the tick's own run first, then the missed ones, oldest first).
    let mut previous = answer["entry"]["fencingToken"].as_u64().unwrap();
    for m in &missed {
        let calls = calls_of(&[&a, &b], *m);
        assert_eq!(calls.len(), 1, "{m}");
        assert_eq!(calls[0].body["pastDue"], true, "{m}");
        let token = calls[0].body["fencingToken"].as_u64().unwrap();
        assert!(token > previous, "{m}: {token} after {previous}");
        previous = token;
    }
    let s = status(&a);
    assert_eq!(s["counters"]["ran"], 2 + missed.len(), "{s}");
    assert_eq!(s["counters"]["missed"], 0, "{s}");
    // Ticking the next occurrence catches up nothing more.
    let current = missed.last().unwrap() + 5;
    wait_for("the next occurrence", Duration::from_secs(15), || {
        (unix_now() >= current + 5).then_some(())
    });
    early_in_a_period(5, 1000);
    let again = tick(&a, TIMER_AUTH, None);
    assert_eq!(again.json["decision"], "ran", "{}", again.text);
    assert!(again.json.get("catchUp").is_none(), "{}", again.text);
    assert!(runs(&[&a, &b]).values().all(|n| *n == 1));
}

/// `none`: the missed ones are recorded `missed`; the one ticked on time runs.
#[test]
fn catch_up_none_records_the_missed_ones() {
    let (o1, answer, a, b) = gap_of_three("sched-none", "none");
    let missed = missed_between(o1, &answer);
    assert_eq!(answer["catchUp"]["missed"], missed.len(), "{answer}");
    for m in &missed {
        assert!(calls_of(&[&a, &b], *m).is_empty());
    }
    let s = status(&b);
    assert_eq!(s["counters"]["missed"], missed.len(), "{s}");
    assert_eq!(s["catchUp"], "none", "{s}");
}
