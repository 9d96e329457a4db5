//! What the scheduled-job tests share: ticks of the test app's job, the Azure Functions timer
//! payload, the occurrence an answer names, the job calls the sinks received, the decisions an
//! instance logged, and the reservation log and reservations read back.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use leasegate::ops::{ListBlobs, Metadata};
use leasegate::BlobClient;
use leasegate_cli::{block_on, NativeTransport};
use serde_json::{json, Value};

use crate::app::{call, Answer, App, TIMER_AUTH};
use crate::sink::Received;

/// The test app's job (`job_name`'s default in spin.toml).
pub const JOB: &str = "example-job";

/// `POST /api/jobs/{JOB}/tick` with `auth`, for the time `at` (Unix seconds), or with no body
/// (now, by the instance's clock).
pub fn tick(app: &App, auth: (&str, &str), at: Option<u64>) -> Answer {
    let body = at
        .map(|at| json!({ "at": crate::rfc3339_secs(at) }).to_string())
        .unwrap_or_default();
    call(
        "POST",
        &app.url(&format!("/api/jobs/{JOB}/tick")),
        &[auth, ("content-type", "application/json")],
        body.as_bytes(),
    )
}

/// `tick` asking, when the occurrence is reserved already, who reserved it
/// (`"nameReserver": true`: a read of the reservation).
pub fn tick_naming_the_reserver(app: &App, auth: (&str, &str), at: Option<u64>) -> Answer {
    let mut body = json!({ "nameReserver": true });
    if let Some(at) = at {
        body["at"] = json!(crate::rfc3339_secs(at));
    }
    call(
        "POST",
        &app.url(&format!("/api/jobs/{JOB}/tick")),
        &[auth, ("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// A timer invocation's body as the Azure Functions host POSTs it to the custom handler
/// (`POST /scheduled-job`): the schedule status it kept (the occurrence it last ran, `last`, and
/// the one due now, `next`, Unix seconds), `IsPastDue`, and `UtcNow`, the host's clock when it
/// fired (`utc_now_ms`, Unix milliseconds).
pub fn azure_timer_payload(last: u64, next: u64, utc_now_ms: u64, past_due: bool) -> Vec<u8> {
    let rfc3339 = |secs| crate::rfc3339_millis(secs, 0);
    json!({
        "Data": {"timer": {
            "Schedule": {"AdjustForDST": true},
            "ScheduleStatus": {"Last": rfc3339(last), "Next": rfc3339(next), "LastUpdated": rfc3339(last)},
            "IsPastDue": past_due
        }},
        "Metadata": {"sys": {
            "MethodName": "scheduled-job",
            "UtcNow": crate::rfc3339_millis(utc_now_ms / 1000, utc_now_ms % 1000),
            "RandGuid": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
        }}
    })
    .to_string()
    .into_bytes()
}

/// The JSON lines scheduled-job wrote to its stdout (the file of Spin's `--log-dir`; Spin's
/// own output repeats them, so [`App::json_lines`] holds each twice).
pub fn job_log(app: &App) -> Vec<Value> {
    std::fs::read_to_string(app.spin.dir().join("logs/scheduled-job_stdout.txt"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// The decisions an instance logged (one JSON line per tick) for ticks from `trigger` (`cron`,
/// `http`, `azure`), by occurrence (Unix seconds): (decision, reservedBy).
pub fn decisions(app: &App, trigger: &str) -> BTreeMap<u64, Vec<(String, Option<String>)>> {
    let mut out: BTreeMap<u64, Vec<(String, Option<String>)>> = BTreeMap::new();
    for line in job_log(app) {
        if line["fn"] != "scheduled-job" || line["trigger"] != trigger {
            continue;
        }
        let Some(occurrence) = line["occurrence"]
            .as_str()
            .and_then(|o| humantime::parse_rfc3339(o).ok())
        else {
            continue;
        };
        out.entry(crate::unix_secs(occurrence)).or_default().push((
            line["decision"].as_str().unwrap_or("").to_string(),
            line["reservedBy"].as_str().map(str::to_string),
        ));
    }
    out
}

/// Every reservation of the job in `app`'s container, listed with its metadata (read from
/// storage): occurrence (Unix seconds) -> metadata (`leasegate_run`, `leasegate_reserved_by`,
/// `leasegate_trigger`, `leasegate_run_token`, ...).
pub fn reservations(app: &App) -> BTreeMap<u64, Metadata> {
    let transport = NativeTransport::new(Duration::from_secs(10));
    let blobs = BlobClient::new(&transport, app.inspect_account(), app.container.clone());
    let mut out = BTreeMap::new();
    let mut marker = None;
    loop {
        let list = ListBlobs {
            prefix: Some(format!("jobs/{JOB}/occurrences/")),
            include_metadata: true,
            marker: marker.clone(),
            ..ListBlobs::new(app.container.clone())
        };
        let (page, _) = block_on(blobs.execute(&list, SystemTime::now())).expect("list");
        for item in page.blobs {
            let o: u64 = item
                .name
                .rsplit('/')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("a reservation named by its occurrence: {}", item.name));
            out.insert(o, item.properties.metadata);
        }
        marker = page.next_marker;
        if marker.is_none() {
            return out;
        }
    }
}

/// The occurrence (Unix seconds) a tick's answer names.
pub fn occurrence_of(a: &Answer) -> u64 {
    let text = a.json["occurrence"]
        .as_str()
        .unwrap_or_else(|| panic!("no occurrence in {}", a.text));
    humantime::parse_rfc3339(text)
        .expect("RFC 3339")
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// The job calls the apps' sinks received for `occurrence`.
pub fn calls_of(apps: &[&App], occurrence: u64) -> Vec<Received> {
    apps.iter()
        .flat_map(|a| a.sink.received())
        .filter(|r| r.path == "/job" && r.body["occurrenceUnix"].as_u64() == Some(occurrence))
        .collect()
}

/// The job calls the apps' sinks received, counted per occurrence.
pub fn runs(apps: &[&App]) -> BTreeMap<u64, usize> {
    let mut runs = BTreeMap::new();
    for app in apps {
        for r in app.sink.received() {
            if r.path == "/job" {
                if let Some(o) = r.body["occurrenceUnix"].as_u64() {
                    *runs.entry(o).or_insert(0) += 1;
                }
            }
        }
    }
    runs
}

/// The job's status (`GET /api/jobs/{JOB}`, 200 asserted).
pub fn status(app: &App) -> Value {
    let a = call(
        "GET",
        &app.url(&format!("/api/jobs/{JOB}")),
        &[TIMER_AUTH],
        b"",
    );
    assert_eq!(a.status, 200, "{}", a.text);
    a.json
}

/// `POST /api/jobs/{JOB}/{action}` (`pause`, `resume`, `run`, `backfill`) with `auth` and a
/// JSON `body`.
pub fn post(app: &App, action: &str, auth: (&str, &str), body: &str) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/jobs/{JOB}/{action}")),
        &[auth, ("content-type", "application/json")],
        body.as_bytes(),
    )
}

/// Waits until the first `within_ms` of a period of `period` seconds (multiples of it since the
/// epoch, by this machine's clock), so that a tick names that period's occurrence; returns it.
pub fn early_in_a_period(period: u64, within_ms: u128) -> u64 {
    crate::wait_for(
        "the start of a period",
        std::time::Duration::from_secs(period + 5),
        || {
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_millis();
            (ms % (u128::from(period) * 1000) < within_ms)
                .then_some((ms / 1000) as u64 / period * period)
        },
    )
}

/// Waits for the first 400 ms of a period of `period` seconds after `last`'s (0: the next one
/// to start, or this one if it started less than 400 ms ago); returns its occurrence. A test
/// that ticks with the tick token right after it ticks on time, as a scheduler does.
pub fn next_period(period: u64, last: u64) -> u64 {
    loop {
        let o = early_in_a_period(period, 400);
        if o > last {
            return o;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Waits until, for the next `span` seconds, the clean-up watermark of a job whose retention
/// is `retention` (this machine's clock minus it) crosses no multiple of `stride` (the job's
/// clean-up stride: 16 occurrences' worth, at most half the retention): scheduled-job deletes
/// old reservations (a listing) only on a run whose end crosses one, so a test that counts a
/// run's requests exactly runs where none of its runs can.
pub fn clear_of_a_clean_up(retention: u64, stride: u64, span: u64) {
    assert!(
        span + 5 < stride,
        "a span of {span} s may always cross a stride of {stride} s"
    );
    crate::wait_for(
        "a time clear of a clean-up",
        std::time::Duration::from_secs(stride + 10),
        || {
            let into = crate::unix_now().saturating_sub(retention) % stride;
            (into >= 2 && into + span < stride).then_some(())
        },
    );
}

/// The reservation log's entry for `occurrence` (`GET /api/jobs/{JOB}`), `Null` when it has
/// none.
pub fn log_entry(app: &App, occurrence: u64) -> Value {
    status(app)["reservations"]
        .as_array()
        .and_then(|e| {
            e.iter()
                .find(|e| e["occurrenceUnix"].as_u64() == Some(occurrence))
                .cloned()
        })
        .unwrap_or(Value::Null)
}
