//! scheduled-job on a fleet: four deployments on the real cron plugin, their clocks 1.5 s
//! apart at the extremes (`faketime`), ticking a per-5-second calendar schedule
//! (`*/5 * * * * *`) for two minutes while one of them is stopped and started again. Every
//! occurrence in that time is run exactly once (or recorded missed), none twice, read back from
//! the job calls the sinks received and from every reservation in storage.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use leasegate_tests::app::{App, Manifest, Setup};
use leasegate_tests::jobs::reservations;
use leasegate_tests::sink::Received;
use leasegate_tests::{unique_container, unix_now};

const RUN_FOR: Duration = Duration::from_secs(120);

fn deploy(instance: &str, offset_ms: i64, container: &leasegate::ContainerName) -> App {
    App::start_with(
        "fleet",
        &[
            ("instance_id", instance),
            ("job_schedule", "*/5 * * * * *"),
            ("job_timeout_seconds", "3"),
        ],
        Setup {
            manifest: Manifest::Cron,
            cron: vec![("scheduled-job", "*/5 * * * * *")],
            clock_offset_ms: offset_ms,
            container: Some(container.clone()),
            ..Setup::default()
        },
    )
}

#[test]
fn four_deployments_a_second_and_a_half_apart_run_each_occurrence_once() {
    let container = unique_container("fleet");
    let offsets = [-1500, -500, 500, 1500];
    let mut apps: Vec<Option<App>> = offsets
        .iter()
        .enumerate()
        .map(|(i, ms)| Some(deploy(&format!("fleet-{i}"), *ms, &container)))
        .collect();
    let started = Instant::now();
    let first = unix_now();
    let mut gone: Vec<Received> = Vec::new();
    // A third of the way in, node 1 stops; a third later it starts again (a new `spin up` with
    // the same identity).
    std::thread::sleep(RUN_FOR / 3);
    let stopped = apps[1].take().unwrap();
    gone.extend(stopped.sink.received());
    drop(stopped);
    std::thread::sleep(RUN_FOR / 3);
    apps[1] = Some(deploy("fleet-1", offsets[1], &container));
    let remaining = RUN_FOR.saturating_sub(started.elapsed());
    std::thread::sleep(remaining);
    let last = unix_now();
    // Let the last ticks end.
    std::thread::sleep(Duration::from_secs(6));
    let live: Vec<&App> = apps.iter().flatten().collect();
    let mut runs: BTreeMap<u64, usize> = BTreeMap::new();
    for r in live
        .iter()
        .flat_map(|a| a.sink.received())
        .chain(gone.iter().cloned())
    {
        if r.path == "/job" {
            *runs
                .entry(r.body["occurrenceUnix"].as_u64().unwrap())
                .or_insert(0) += 1;
        }
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "occurrences run more than once: {twice:?}"
    );
    let stored = reservations(live[0]);
    // Each occurrence from the first full one to the last: run once, or recorded missed.
    let occurrences: Vec<u64> = ((first / 5 + 2) * 5..last.saturating_sub(5))
        .step_by(5)
        .collect();
    let mut missed = 0;
    for o in &occurrences {
        let run = stored
            .get(o)
            .map(|m| m.get("leasegate_run").map_or("none", String::as_str));
        match (runs.get(o), run) {
            (Some(1), Some("succeeded")) => {}
            (None, Some("missed")) => missed += 1,
            other => panic!("occurrence {o}: {other:?} (runs, reservation)"),
        }
    }
    println!(
        "fleet: {} occurrences over {} s, {} run once, {missed} missed, 0 twice",
        occurrences.len(),
        last - first,
        occurrences.len() - missed
    );
    // Three deployments are up at any time: none is missed.
    assert_eq!(missed, 0, "{stored:?}");
}
