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
        vec![(
            "scheduled-job",
            &*Box::leak(table_trigger(JOBS).into_boxed_str()),
        )]
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

/// The cron trigger `scripts/cron_manifest.py --jobs` writes for scheduled-job with `jobs`.
fn table_trigger(jobs: &str) -> String {
    let dir = std::env::temp_dir().join(format!("jobs-table-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let file = dir.join("jobs.toml");
    std::fs::write(&file, jobs).expect("write jobs.toml");
    let out = std::process::Command::new("python3")
        .arg(leasegate_tests::app::root().join("scripts/cron_manifest.py"))
        .arg("--jobs")
        .arg(&file)
        .args(["-o", "-"])
        .output()
        .expect("run python3");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: toml::Table = String::from_utf8_lossy(&out.stdout)
        .parse()
        .expect("the manifest parses");
    manifest["trigger"]["cron"]
        .as_array()
        .expect("cron triggers")
        .iter()
        .find(|t| t["component"].as_str() == Some("scheduled-job"))
        .and_then(|t| t["cron_expression"].as_str())
        .expect("scheduled-job's trigger")
        .to_string()
}

/// The finest cadence a table's jobs need: a superset of every job's occurrences (zoned
/// calendar jobs every minute at their seconds, intervals every gcd(period, 60) s from their offset).
#[test]
fn cron_manifest_writes_the_finest_cadence_the_table_needs() {
    assert_eq!(table_trigger(JOBS), "*/5 * * * * *");
    let two = "[invoice-export]\nschedule = \"30 6 * * MON-FRI\"\ntime_zone = \"Europe/Berlin\"\n\
               [fast-sync]\nschedule = \"*/10 * * * * *\"\n[p90]\nperiod_seconds = 90\n";
    assert_eq!(table_trigger(two), "*/10 * * * * *");
    let utc = "[a]\nschedule = \"0 30 6 * * *\"\n[b]\nschedule = \"15 */20 * * * *\"\n";
    assert_eq!(table_trigger(utc), "0,15 0,20,30,40 * * * *");
    let interval = "[p90]\nperiod_seconds = 90\noffset_seconds = 7\n";
    assert_eq!(table_trigger(interval), "7,37 * * * * *");
    // A zoned schedule with seconds keeps them (zones are whole minutes off UTC).
    let zoned = "[k]\nschedule = \"*/10 * * * * *\"\ntime_zone = \"Asia/Kolkata\"\n";
    assert_eq!(table_trigger(zoned), "*/10 * * * * *");
    let berlin = "[b]\nschedule = \"30 0 6 * * *\"\ntime_zone = \"Europe/Berlin\"\n";
    assert_eq!(table_trigger(berlin), "30 * * * * *");
}

/// The Azure Functions package's one timer ticks every job: `assemble.py --jobs` gives it the
/// trigger cron_manifest.py derives (NCRONTAB has the same six fields).
#[test]
fn the_azure_functions_timer_fires_at_the_tables_cadence() {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys; sys.path.insert(0, 'deploy/azure-functions'); import assemble; \
             print(assemble.job_timer_schedule(sys.stdin.read()))",
        ])
        .current_dir(leasegate_tests::app::root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(JOBS.as_bytes())?;
            child.wait_with_output()
        })
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        table_trigger(JOBS)
    );
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
    // two deployments, none before its time; nothing else was called.
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
            let early = (std::time::UNIX_EPOCH + Duration::from_secs(o))
                .duration_since(r.received_at)
                .ok();
            assert!(
                early.is_none(),
                "{job} at {o} ran {early:?} early: {}",
                r.body
            );
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

    // A name no job can have (job names are lowercase): 400, naming the jobs there are.
    let (status, v) = get(&app, "/api/jobs/Invoice-Export");
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"], "invalid_job");
    let message = v["message"].as_str().unwrap_or("");
    assert!(
        message.contains("lowercase") && message.contains("fast-sync"),
        "{message}"
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

    // `leasegate status` lists every job of the container, each with its next runs from the
    // app (`--app`).
    let a = call(
        "POST",
        &app.url("/api/jobs/fast-sync/tick"),
        &[TIMER_AUTH],
        b"",
    );
    assert!([200, 409].contains(&a.status), "{}", a.text);
    let out = std::process::Command::new(leasegate_tests::app::cli_binary())
        .args(["status", "--json", "--container", app.container.as_str()])
        .args(["--app", &app.url("")])
        .env(
            "LEASEGATE_CONNECTION_STRING",
            leasegate_tests::Azurite::shared().connection_string(),
        )
        .env_remove("LEASEGATE_BLOB_ENDPOINT")
        .env("LEASEGATE_TIMER_TOKEN", leasegate_tests::app::TIMER_TOKEN)
        .output()
        .expect("run the CLI");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let overview: Value = serde_json::from_str(&text).expect("--json");
    let listed: BTreeMap<&str, &Value> = overview["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| (j["job"].as_str().unwrap_or(""), j))
        .collect();
    for job in ["every-fifteen", "fast-sync"] {
        let j = listed
            .get(job)
            .unwrap_or_else(|| panic!("{job}: {overview}"));
        assert!(j["next"][0]["utc"].is_string(), "{job}'s next runs: {j}");
    }

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

/// Two jobs on the same 5 s schedule (a tick tolerance of 2.5 s, half the gap), and the app's
/// `max_in_flight` of 1: a tick of every job runs them one after the other.
const QUEUED: &str = r#"
[a-export]
schedule = "*/5 * * * * *"
path = "/export"

[b-report]
schedule = "*/5 * * * * *"
path = "/report"
"#;

fn deploy_queued(instance: &str) -> App {
    App::start_with(
        "jobs-queued",
        &[
            ("instance_id", instance),
            ("jobs", QUEUED),
            ("max_in_flight", "1"),
        ],
        Setup {
            manifest: Manifest::Http,
            ..Setup::default()
        },
    )
}

/// Sleeps until `ms` past a multiple of 5 s; the Unix second then.
fn at_five_plus(ms: u64) -> u64 {
    let target = (millis_now() / 5000 + 1) * 5000 + ms;
    while millis_now() < target {
        std::thread::sleep(Duration::from_millis(10));
    }
    target / 1000
}

/// An HTTP scheduler whose clock runs 3 s fast names a time 3 s ahead, 2 s before an
/// occurrence: a tick of every job ticks each job for its latest occurrence by the component's
/// clock, never runs one early nor answers `too_early`.
#[test]
fn a_tick_of_every_job_from_a_fast_clock_runs_nothing_early() {
    let app = deploy_queued("node-a");
    let now = at_five_plus(3100); // 2 s before the next occurrence
    let (status, v) = tick_all(&app, now + 3);
    assert_eq!(status, 200, "{v}");
    let ticks = v["ticks"].as_array().cloned().unwrap_or_default();
    assert_eq!(ticks.len(), 2, "{v}");
    for t in &ticks {
        assert_eq!(
            t["occurrence"],
            leasegate_tests::rfc3339_secs(now - 3),
            "the one due now: {t}"
        );
        assert_ne!(t["decision"], "too_early", "{t}");
    }
    let early: Vec<_> = app
        .sink
        .received()
        .into_iter()
        .filter(|r| r.body["occurrenceUnix"].as_u64() > Some(now))
        .collect();
    assert!(
        early.is_empty(),
        "an occurrence ran early: {:?}",
        early[0].body
    );
}

/// A job queued behind a long one starts after its tolerance: it runs (`job_catch_up`
/// latest), and its run says it started late (`pastDue`), by the clock when it started, not
/// when the invocation did.
#[test]
fn a_job_queued_behind_a_long_one_is_late_by_its_own_start() {
    let app = deploy_queued("node-a");
    // The jobs' first occurrences, on time: their history begins.
    let first = at_five_plus(100);
    let (status, v) = tick_all(&app, first);
    assert_eq!(status, 200, "{v}");
    app.sink.wait_for(2, Duration::from_secs(10));
    // Then the webhook of each takes 4 s.
    app.sink.behave(leasegate_tests::sink::Behaviour::Late(
        Duration::from_secs(4),
        204,
    ));
    let now = at_five_plus(100);
    let (status, v) = tick_all(&app, now);
    assert_eq!(status, 200, "{v}");
    let calls: Vec<_> = app
        .sink
        .wait_for(4, Duration::from_secs(10))
        .into_iter()
        .filter(|r| r.body["occurrenceUnix"] == now)
        .collect();
    let by_job = |job: &str| {
        calls
            .iter()
            .find(|r| r.body["job"] == job)
            .unwrap_or_else(|| panic!("{job} ran: {v}"))
            .body
            .clone()
    };
    assert_eq!(by_job("a-export")["pastDue"], false, "on time");
    assert_eq!(
        by_job("b-report")["pastDue"],
        true,
        "3 s after its occurrence"
    );
    assert_eq!(by_job("b-report")["occurrenceUnix"], now);
}

/// A job of the table whose run fails, ticked over HTTP every second (SpinKube's ticker): its
/// retry runs once the retry delay has passed by the component's clock, within the same
/// occurrence, not at the job's next occurrence; and no attempt starts before the occurrence.
#[test]
fn a_failed_job_of_the_table_is_retried_after_its_delay_over_http() {
    const RETRIED: &str = r#"
[nightly-export]
schedule = "*/30 * * * * *"
path = "/export"
retries = 1
retry_delay_seconds = 3
"#;
    let app = App::start_with(
        "jobs-retried",
        &[("instance_id", "pod-a"), ("jobs", RETRIED)],
        Setup {
            manifest: Manifest::Http,
            ..Setup::default()
        },
    );
    app.sink.answer(500);
    // From 4 s before an occurrence to 12 s after it, a tick every second.
    let occurrence = (unix_now() + 5).div_ceil(30) * 30;
    for second in occurrence - 4..occurrence + 12 {
        while millis_now() < second * 1000 + 100 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let (status, v) = tick_all(&app, second);
        assert!([200, 502].contains(&status), "{status} {v}");
        if app.sink.received().len() == 1 {
            app.sink.answer(204);
        }
    }
    let calls: Vec<_> = app
        .sink
        .received()
        .into_iter()
        .filter(|r| r.body["occurrenceUnix"] == occurrence)
        .collect();
    let attempts: Vec<(u64, u64)> = calls
        .iter()
        .map(|r| {
            let at = r.received_at.duration_since(std::time::UNIX_EPOCH).unwrap();
            (r.body["attempt"].as_u64().unwrap_or(0), at.as_secs())
        })
        .collect();
    assert_eq!(attempts.len(), 2, "two attempts: {attempts:?}");
    assert_eq!(attempts[0].0, 1);
    assert!(attempts[0].1 >= occurrence, "not early: {attempts:?}");
    assert_eq!(attempts[1].0, 2);
    assert!(
        (occurrence + 3..=occurrence + 6).contains(&attempts[1].1),
        "the retry 3 s after the failure: {attempts:?}"
    );
}

/// `POST /api/jobs` with `{"nameReserver": true}`, from a deployment that finds each job's
/// occurrence reserved by another: every job's answer names the reserver, as a tick of the job
/// alone asking it would.
#[test]
fn a_tick_of_every_job_names_the_reserver_when_asked() {
    let a = deploy_queued("node-a");
    let b = App::start_with(
        "jobs-queued",
        &[("instance_id", "node-b"), ("jobs", QUEUED)],
        Setup {
            manifest: Manifest::Http,
            container: Some(a.container.clone()),
            ..Setup::default()
        },
    );
    let now = at_five_plus(100);
    let (status, v) = tick_all(&a, now);
    assert_eq!(status, 200, "{v}");
    let body = json!({ "at": leasegate_tests::rfc3339_secs(now), "nameReserver": true });
    let answer = call(
        "POST",
        &b.url("/api/jobs"),
        &[TIMER_AUTH, ("content-type", "application/json")],
        body.to_string().as_bytes(),
    );
    assert_eq!(answer.status, 200, "{}", answer.text);
    let ticks = answer.json["ticks"].as_array().cloned().unwrap_or_default();
    assert_eq!(ticks.len(), 2, "{}", answer.text);
    for t in &ticks {
        assert_eq!(t["decision"], "skipped", "{t}");
        assert_eq!(t["reservedBy"], "node-a", "{t}");
    }
}

/// A ticker whose clock leads the component's by 150 ms names each second a little before it
/// begins here: each job's occurrence of that second is ticked on that tick, once its second
/// has begun by the component's clock (neither early nor a tick late).
#[test]
fn a_ticker_a_little_ahead_ticks_each_occurrence_at_its_second() {
    let app = deploy_queued("node-a");
    let first = at_five_plus(0) + 5;
    for occurrence in [first, first + 5] {
        while millis_now() < occurrence * 1000 - 150 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (status, v) = tick_all(&app, occurrence);
        assert_eq!(status, 200, "{v}");
        let ticks = v["ticks"].as_array().cloned().unwrap_or_default();
        assert_eq!(ticks.len(), 2, "both jobs ticked: {v}");
        for t in ticks {
            assert_eq!(
                t["occurrence"],
                leasegate_tests::rfc3339_secs(occurrence),
                "{t}"
            );
            assert_eq!(t["decision"], "ran", "{t}");
        }
    }
    for r in app.sink.received() {
        let o = r.body["occurrenceUnix"].as_u64().unwrap_or(0);
        let early = (std::time::UNIX_EPOCH + Duration::from_secs(o))
            .duration_since(r.received_at)
            .ok();
        assert!(early.is_none(), "ran {early:?} early: {}", r.body);
        assert_eq!(r.body["pastDue"], false, "{}", r.body);
    }
}
