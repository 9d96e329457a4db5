//! scheduled-job across both daylight-saving transitions of America/New_York, under the real
//! `spin up`, the real cron plugin (ticking every second) and `faketime`: Spin, its plugin and
//! Azurite all start a little before the transition (occurrences are judged by the storage
//! server's clock, so its clock is shifted too), two deployments share one container.
//!
//! The rule (docs/timer-functions.md, "Daylight saving time"): a fixed-time schedule whose
//! local time does not exist that day (02:30 when clocks spring forward) runs once, at the
//! first instant after the gap (03:00 EDT, 07:00 UTC); one whose local time happens twice
//! (01:30 when clocks fall back) runs once, at its first instant (01:30 EDT, 05:30 UTC), and
//! not at the second (01:30 EST, 06:30 UTC).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasegate_tests::app::{build_components, App, Manifest, Setup};
use leasegate_tests::jobs::{runs, status};
use leasegate_tests::{offset_to, unique_container, wait_for};

fn unix(rfc3339: &str) -> u64 {
    humantime::parse_rfc3339(rfc3339)
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Two deployments of a job at `schedule` in New York, on the cron plugin every second, with
/// their clocks (and storage's) at `start` when they start. `job_catch_up = none`: the
/// previous day's occurrence, long past, is recorded missed rather than run, so the only run
/// is the one at the transition. And a third deployment of the HTTP app on the same clock and
/// storage that ticks nothing: the status is read there (the cron app serves no HTTP).
fn two_deployments(tag: &str, schedule: &str, start: &str) -> (App, App, App) {
    build_components();
    let container = unique_container(tag);
    let offset = offset_to(unix(start));
    let deploy = |instance: &str, manifest: Manifest| {
        App::start_with(
            tag,
            &[
                ("instance_id", instance),
                ("job_schedule", schedule),
                ("job_time_zone", "America/New_York"),
                ("job_catch_up", "none"),
                ("job_early_seconds", "2"),
            ],
            Setup {
                cron: if manifest == Manifest::Cron {
                    vec![("scheduled-job", "* * * * * *")]
                } else {
                    Vec::new()
                },
                manifest,
                clock_offset_ms: offset,
                azurite_same_clock: true,
                container: Some(container.clone()),
                ..Setup::default()
            },
        )
    };
    (
        deploy("dst-a", Manifest::Cron),
        deploy("dst-b", Manifest::Cron),
        deploy("dst-observer", Manifest::default()),
    )
}

/// The job calls the two deployments' sinks received, as (occurrence, pastDue).
fn job_calls(apps: &[&App]) -> Vec<(u64, bool)> {
    apps.iter()
        .flat_map(|a| a.sink.received())
        .filter(|r| r.path == "/job")
        .map(|r| {
            (
                r.body["occurrenceUnix"].as_u64().unwrap(),
                r.body["pastDue"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Waits (real time) until the shifted clock, started at `start` about now, has passed `until`.
fn until_shifted(started: SystemTime, start: &str, until: &str) {
    let wait = Duration::from_secs(unix(until) - unix(start));
    wait_for(until, wait + Duration::from_secs(5), || {
        (started.elapsed().unwrap_or_default() >= wait).then_some(())
    });
}

/// Spring forward, 2026-03-08: 02:30 does not exist in New York; the job at 02:30 runs once, at
/// 03:00 EDT (07:00:00 UTC), by one of the two deployments.
#[test]
fn a_local_time_skipped_by_spring_forward_runs_once_just_after_the_gap() {
    let start = "2026-03-08T06:59:40Z";
    let real = SystemTime::now();
    let (a, b, observer) = two_deployments("dst-spring", "30 2 * * *", start);
    let transition = unix("2026-03-08T07:00:00Z");
    let calls = wait_for("the run at 07:00 UTC", Duration::from_secs(60), || {
        let calls = job_calls(&[&a, &b]);
        calls.iter().any(|(o, _)| *o == transition).then_some(calls)
    });
    assert_eq!(calls, [(transition, false)], "one run, on time");
    // The cron plugin keeps ticking both deployments: still one run.
    until_shifted(real, start, "2026-03-08T07:00:15Z");
    assert_eq!(runs(&[&a, &b]).get(&transition), Some(&1));
    assert_eq!(job_calls(&[&a, &b]).len(), 1);
    let s = status(&observer);
    let ran = s["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["occurrenceUnix"] == transition)
        .cloned()
        .unwrap_or_else(|| panic!("no entry for 07:00Z: {s}"));
    assert_eq!(ran["status"], "succeeded", "{s}");
    // The next is 02:30 EDT the day after: 06:30 UTC.
    assert_eq!(s["next"][0]["utc"], "2026-03-09T06:30:00Z", "{s}");
    assert_eq!(s["next"][0]["local"], "2026-03-09T02:30:00-04:00", "{s}");
    assert_eq!(s["timeZone"], "America/New_York", "{s}");
}

/// Fall back, 2026-11-01: 01:30 happens twice in New York; the job at 01:30 runs once, at the
/// first (01:30 EDT, 05:30:00 UTC).
#[test]
fn a_local_time_repeated_by_fall_back_runs_once_at_its_first_instant() {
    let start = "2026-11-01T05:29:40Z";
    let real = SystemTime::now();
    let (a, b, observer) = two_deployments("dst-fall1", "30 1 * * *", start);
    let first = unix("2026-11-01T05:30:00Z");
    wait_for("the run at 05:30 UTC", Duration::from_secs(60), || {
        job_calls(&[&a, &b])
            .iter()
            .any(|(o, _)| *o == first)
            .then_some(())
    });
    until_shifted(real, start, "2026-11-01T05:30:10Z");
    assert_eq!(job_calls(&[&a, &b]), [(first, false)]);
    let s = status(&observer);
    // The next is not the second 01:30 (06:30 UTC) but the next day's (01:30 EST).
    assert_eq!(s["next"][0]["utc"], "2026-11-02T06:30:00Z", "{s}");
    assert_eq!(s["next"][0]["local"], "2026-11-02T01:30:00-05:00", "{s}");
}

/// ... and at the second 01:30 (01:30 EST, 06:30:00 UTC) nothing runs: deployments ticking then
/// find the first one, an hour past, no new one. These deployments are new: their first ticks
/// begin the job's history, so the first 01:30, due before it, is not recorded either.
#[test]
fn the_second_pass_of_a_repeated_local_time_runs_nothing() {
    let start = "2026-11-01T06:29:45Z";
    let real = SystemTime::now();
    let (a, b, observer) = two_deployments("dst-fall2", "30 1 * * *", start);
    until_shifted(real, start, "2026-11-01T06:30:10Z");
    let second = unix("2026-11-01T06:30:00Z");
    let calls = job_calls(&[&a, &b]);
    assert!(calls.iter().all(|(o, _)| *o != second), "{calls:?}");
    assert!(calls.is_empty(), "{calls:?}");
    let s = status(&observer);
    let entries = s["reservations"].as_array().unwrap();
    assert!(entries.iter().all(|e| e["occurrenceUnix"] != second), "{s}");
    // The one the ticks named: the first 01:30, an hour before the job's history began (its
    // first tick): neither run nor recorded missed.
    let first = unix("2026-11-01T05:30:00Z");
    assert!(entries.iter().all(|e| e["occurrenceUnix"] != first), "{s}");
    assert_eq!(s["counters"]["missed"], 0, "{s}");
    let history = s["historyFrom"].as_str().unwrap_or_else(|| panic!("{s}"));
    assert!(history > "2026-11-01T06:29", "{s}");
}
