//! Many jobs in one component (issue 50): a `jobs` table of three jobs with different schedules
//! and zones (and one broken), served by scheduled-job under the real `spin up` on two
//! deployments sharing a container: one on Spin's cron trigger (the real plugin, ticking at the
//! finest cadence any job needs), one ticked over HTTP (`POST /api/jobs`, every second). Every
//! occurrence of every job runs exactly once, on its own path; the broken job and an unknown
//! name get their answers; a tick in which no job is due costs no storage request.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use leasegate_tests::app::{call, App, Manifest, Setup, TIMER_AUTH};
use leasegate_tests::unix_now;
use serde_json::{json, Value};

/// The table a user writes (the keys are the `job_*` variables without the prefix).
const JOBS: &str = r#"
[fast-sync]
schedule = "*/5 * * * * *"
path = "/sync"
timeout_seconds = 3

[kolkata-report]
schedule = "*/10 * * * * *"
time_zone = "Asia/Kolkata"
path = "/report"

[every-fifteen]
period_seconds = 15
offset_seconds = 5
path = "/fifteen"
retries = 1

[broken]
schedule = "0 61 * * * *"
path = "/never"
"#;

/// A job of the table: its name, its path, and whether `t` (Unix seconds) is one of its
/// occurrences.
type Job = (&'static str, &'static str, fn(u64) -> bool);

/// The jobs that run.
fn jobs() -> Vec<Job> {
    vec![
        ("fast-sync", "/sync", |t| t % 5 == 0),
        ("kolkata-report", "/report", |t| t % 10 == 0),
        ("every-fifteen", "/fifteen", |t| t % 15 == 5),
    ]
}

fn deploy(instance: &str, manifest: Manifest, container: Option<&leasegate::ContainerName>) -> App {
    let cron = if manifest == Manifest::Cron {
        // What cron_manifest.py derives for this table: every 5 s covers every job.
        vec![("scheduled-job", "*/5 * * * * *")]
    } else {
        Vec::new()
    };
    App::start_with(
        "jobs-table",
        &[("instance_id", instance), ("jobs", JOBS)],
        Setup {
            manifest,
            cron,
            container: container.cloned(),
            ..Setup::default()
        },
    )
}

fn millis_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

fn get(app: &App, path: &str) -> (u16, Value) {
    let a = call("GET", &app.url(path), &[TIMER_AUTH], b"");
    (a.status, a.json.clone())
}

/// `POST /api/jobs` for the second `at`.
fn tick_all(app: &App, at: u64) -> (u16, Value) {
    let body = json!({ "at": leasegate_tests::rfc3339_secs(at) }).to_string();
    let a = call(
        "POST",
        &app.url("/api/jobs"),
        &[TIMER_AUTH, ("content-type", "application/json")],
        body.as_bytes(),
    );
    (a.status, a.json.clone())
}

#[test]
fn every_job_of_the_table_runs_each_occurrence_once_on_its_own_path() {
    let cron = deploy("cron-node", Manifest::Cron, None);
    let ticked = deploy("http-node", Manifest::Http, Some(&cron.container));

    // The listing: every job with its next occurrences; the broken one says why.
    let (status, list) = get(&ticked, "/api/jobs");
    assert_eq!(status, 200, "{list}");
    let listed: BTreeMap<String, &Value> = list["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| (j["job"].as_str().unwrap_or("").to_string(), j))
        .collect();
    assert_eq!(
        listed.keys().map(String::as_str).collect::<Vec<_>>(),
        ["broken", "every-fifteen", "fast-sync", "kolkata-report"]
    );
    assert_eq!(listed["kolkata-report"]["timeZone"], "Asia/Kolkata");
    assert_eq!(listed["every-fifteen"]["periodSeconds"], 15);
    assert_eq!(
        listed["fast-sync"]["next"].as_array().map(Vec::len),
        Some(3)
    );
    assert_eq!(listed["broken"]["error"], "not_configured");

    // The HTTP deployment ticked every second for 40 s, the cron one by its trigger.
    let start = unix_now() + 1;
    let end = start + 40;
    let mut no_job_due = Vec::new();
    for second in start..end {
        // In turns of 5 s: on time (ahead of the cron plugin, which fires 0.3 to 0.5 s after
        // the second on this machine), then 0.9 s late (after it), so each deployment wins some.
        let late_ms = if (second / 5) % 2 == 0 { 0 } else { 900 };
        while millis_now() < second * 1000 + late_ms {
            std::thread::sleep(Duration::from_millis(20));
        }
        let before = ticked.storage.count();
        let (status, answer) = tick_all(&ticked, second);
        let ticks = answer["ticks"].as_array().cloned().unwrap_or_default();
        // The broken job answers 503 on every tick, so the status is its.
        assert_eq!(status, 503, "{answer}");
        assert!(
            ticks.iter().any(|t| t["job"] == "broken"),
            "the broken job is named: {answer}"
        );
        let due: Vec<&str> = ticks
            .iter()
            .filter_map(|t| t["job"].as_str())
            .filter(|j| *j != "broken")
            .collect();
        if due.is_empty() && second > start {
            no_job_due.push((second, ticked.storage.count() - before));
        }
    }
    // Let the last runs finish and be recorded.
    std::thread::sleep(Duration::from_secs(4));

    // Every occurrence inside the window ran exactly once, on its job's path, by one of the
    // two deployments; nothing else was called.
    let mut calls: BTreeMap<(String, u64), Vec<String>> = BTreeMap::new();
    for app in [&cron, &ticked] {
        for r in app.sink.received() {
            let job = r.body["job"].as_str().unwrap_or("?").to_string();
            let o = r.body["occurrenceUnix"].as_u64().unwrap_or(0);
            let path = jobs()
                .iter()
                .find(|(name, _, _)| *name == job)
                .map(|(_, path, _)| *path)
                .unwrap_or("?");
            assert_eq!(r.path, path, "job {job} called on its own path: {}", r.body);
            calls
                .entry((job, o))
                .or_default()
                .push(r.body["instance"].as_str().unwrap_or("").to_string());
        }
    }
    let mut winners = BTreeSet::new();
    for (job, _, occurs) in jobs() {
        for t in (start + 1..end - 1).filter(|t| occurs(*t)) {
            let ran = calls
                .get(&(job.to_string(), t))
                .cloned()
                .unwrap_or_default();
            assert_eq!(ran.len(), 1, "{job} at {t}: run by {ran:?}");
            winners.insert(ran[0].clone());
        }
    }
    for ((job, o), ran) in &calls {
        assert_eq!(ran.len(), 1, "{job} at {o} ran more than once: {ran:?}");
        assert!(job != "broken", "the broken job never runs");
    }
    assert_eq!(
        winners.into_iter().collect::<Vec<_>>(),
        ["cron-node", "http-node"],
        "each deployment ran some"
    );

    // A second in which no job is due costs no storage request.
    assert!(no_job_due.len() >= 10, "{no_job_due:?}");
    for (second, requests) in &no_job_due {
        assert_eq!(*requests, 0, "second {second}: no job due");
    }
}

#[test]
fn an_unknown_or_broken_job_is_named_and_the_others_answer() {
    let app = deploy("node-a", Manifest::Http, None);
    let (status, v) = get(&app, "/api/jobs/invoice-export");
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"], "unknown_job");
    let message = v["message"].as_str().unwrap_or("");
    assert!(
        message.contains("invoice-export") && message.contains("fast-sync"),
        "names the job asked and the jobs there are: {message}"
    );

    let a = call(
        "POST",
        &app.url("/api/jobs/broken/tick"),
        &[TIMER_AUTH],
        b"",
    );
    assert_eq!(a.status, 503, "{}", a.text);
    let v = a.json.clone();
    assert_eq!(v["error"], "not_configured");
    let message = v["message"].as_str().unwrap_or("");
    assert!(
        message.contains("job broken")
            && message.contains("key schedule")
            && message.contains("(minute)"),
        "names the job, the key and the field: {message}"
    );

    // The other jobs answer on their own routes: a tick of one, its log read back.
    let a = call(
        "POST",
        &app.url("/api/jobs/every-fifteen/tick"),
        &[TIMER_AUTH],
        b"",
    );
    assert!(
        [200, 409].contains(&a.status),
        "a job of the table ticks: {} {}",
        a.status,
        a.text
    );
    assert_eq!(a.json["job"], "every-fifteen");
    let (status, v) = get(&app, "/api/jobs/fast-sync");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["schedule"], "*/5 * * * * *");

    // A tick of every job naming a time far from the instance's clock is refused.
    let (status, v) = tick_all(&app, unix_now() - 3600);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"], "invalid_tick");
}

#[test]
fn a_table_that_is_not_toml_stops_every_job_with_a_clear_answer() {
    let app = App::start_with(
        "jobs-table-bad",
        &[
            ("instance_id", "node-b"),
            ("jobs", "[fast-sync\nschedule = 1"),
        ],
        Setup::default(),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let (status, v) = loop {
        let got = get(&app, "/api/jobs");
        if got.0 != 0 || Instant::now() > deadline {
            break got;
        }
    };
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"], "not_configured");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or("")
            .contains("variable jobs is not TOML (one table per job, `[name]` then its keys): line 1: unclosed table"),
        "{v}"
    );
}
