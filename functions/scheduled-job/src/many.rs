//! Every job of the component at once: one trigger's tick of the due jobs (the cron trigger,
//! an Azure Functions timer, `POST /api/jobs`), and the listing `GET /api/jobs`.

use futures::StreamExt;
use leasegate::{StatusCode, Transport};
use leasegate_spin::timer::Tick;
use leasegate_spin::web::rfc3339;
use leasegate_spin::Context;
use serde_json::{json, Value};
use std::time::{Instant, SystemTime};

use crate::due;
use crate::http::describe;
use crate::run::{self, Ask};
use crate::settings::Settings;
use crate::table::{Job, Jobs};

/// One trigger's tick of every job of the `jobs` table that is due, side by side (up to
/// `max_in_flight` at once): each job's
/// answer as [`describe`] gives it, under `ticks`; a job not due is only named (`notDue`, no
/// storage request), a job whose table is wrong answers `not_configured`. The status is the
/// first failing job's, else 200.
pub(crate) async fn tick_all<T: Transport>(
    ctx: &Context<'_, T>,
    jobs: &Jobs,
    tick: &Tick,
    started: Instant,
) -> (StatusCode, Value) {
    let mut not_due = Vec::new();
    let mut due_jobs = Vec::new();
    let mut broken = Vec::new();
    for job in &jobs.jobs {
        match &job.settings {
            Ok(s) if due::due(ctx.cache, s, tick.at) => due_jobs.push(s),
            Ok(s) => not_due.push(s.job.clone()),
            Err(e) => broken.push(not_configured(job, &e.0)),
        }
    }
    // At most `max_in_flight` jobs at once (the app's, every job's storage settings are one).
    let side_by_side = due_jobs
        .first()
        .map_or(1, |s| s.storage.max_in_flight.max(1));
    let ticks: Vec<(StatusCode, Value)> =
        futures::stream::iter(due_jobs.iter().map(|s| one(ctx, s, tick, started)))
            .buffered(side_by_side)
            .collect()
            .await;
    let mut status = StatusCode::OK;
    let mut answers = Vec::new();
    for (s, v) in ticks.into_iter().chain(broken) {
        if status.is_success() && !s.is_success() {
            status = s;
        }
        answers.push(v);
    }
    let failed: Vec<String> = answers
        .iter()
        .filter(|v| v.get("error").is_some())
        .map(|v| {
            format!(
                "{}: {}",
                v["job"].as_str().unwrap_or(""),
                v["message"].as_str().unwrap_or("")
            )
        })
        .collect();
    let mut v = json!({
        "trigger": tick.source.as_str(),
        "at": rfc3339(tick.at),
        "ticks": answers,
        "notDue": not_due,
        "durationMs": leasegate_spin::elapsed_ms(started),
    });
    if !failed.is_empty() {
        v["message"] = json!(failed.join("; "));
    }
    (status, v)
}

/// One due job's tick, and its note of when it needs the next.
async fn one<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    tick: &Tick,
    started: Instant,
) -> (StatusCode, Value) {
    let outcome = run::tick(ctx, settings, tick, Ask::default()).await;
    due::note(ctx.cache, settings, ctx.now, &outcome);
    describe(settings, tick, &outcome, started)
}

/// A job whose table cannot be used: `not_configured`, naming the job, the key and the field.
pub(crate) fn not_configured(job: &Job, message: &str) -> (StatusCode, Value) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"job": job.name, "error": "not_configured", "message": message}),
    )
}

/// `GET /api/jobs`: every job with its schedule and next occurrences (by this instance's
/// clock; no storage request), or why its settings cannot be used.
pub(crate) fn list(jobs: &Jobs, now: SystemTime) -> Value {
    let listed: Vec<Value> = jobs
        .jobs
        .iter()
        .map(|job| match &job.settings {
            Ok(s) => {
                let next: Vec<Value> = s
                    .schedule
                    .upcoming(now, 3)
                    .into_iter()
                    .map(|t| json!({"utc": rfc3339(t), "local": s.schedule.local_time(t)}))
                    .collect();
                json!({
                    "job": s.job,
                    "schedule": s.schedule.expression(),
                    "timeZone": s.schedule.zone(),
                    "periodSeconds": s.period.as_secs(),
                    "next": next,
                    "catchUp": s.catch_up.as_str(),
                    "overlap": s.overlap.as_str(),
                    "retries": s.retries,
                    "timeoutSeconds": s.timeout.as_secs(),
                    "path": url_path(&s.job_url),
                })
            }
            Err(e) => not_configured(job, &e.0).1,
        })
        .collect();
    json!({ "table": jobs.table, "jobs": listed })
}

/// The path of the job's URL, without its origin (deployment detail) or its query (a
/// function key, `?code=...`, is a credential).
fn url_path(url: &str) -> &str {
    let url = &url[..url.find(['?', '#']).unwrap_or(url.len())];
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    url[after_scheme..]
        .find('/')
        .map_or("/", |i| &url[after_scheme + i..])
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_listed_path_carries_no_query() {
        assert_eq!(super::url_path("https://h.example/run?code=S3cret"), "/run");
        assert_eq!(super::url_path("https://h.example?code=S3cret"), "/");
        assert_eq!(super::url_path("http://127.0.0.1:3001/job"), "/job");
    }
}
