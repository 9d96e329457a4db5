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
use crate::unix;

/// One trigger's tick of every job of the `jobs` table that is due, side by side (up to
/// `max_in_flight` at once), each for the occurrence [`occurrence_by`] the time `by` names
/// (the trigger's; an HTTP tick's, never past this instance's clock): each job's
/// answer as [`describe`] gives it, under `ticks`; a job not due is only named (`notDue`, no
/// storage request), a job whose table is wrong answers `not_configured`. The status is the
/// first failing job's, else 200.
pub(crate) async fn tick_all<T: Transport>(
    ctx: &Context<'_, T>,
    jobs: &Jobs,
    tick: &Tick,
    by: SystemTime,
    ask: Ask,
    started: Instant,
) -> (StatusCode, Value) {
    let mut not_due = Vec::new();
    let mut due_jobs = Vec::new();
    let mut broken = Vec::new();
    for job in &jobs.jobs {
        match &job.settings {
            Ok(s) if due::due(ctx.cache, s, unix(occurrence_by(s, by)), ctx.now) => {
                due_jobs.push((
                    s,
                    Tick {
                        at: occurrence_by(s, by),
                        ..*tick
                    },
                ))
            }
            Ok(s) => not_due.push(s.job.clone()),
            Err(e) => broken.push(not_configured(job, &e.0)),
        }
    }
    // At most `max_in_flight` jobs at once (the app's, every job's storage settings are one).
    let side_by_side = due_jobs
        .first()
        .map_or(1, |(s, _)| s.storage.max_in_flight.max(1));
    let ticks: Vec<(StatusCode, Value)> =
        futures::stream::iter(due_jobs.iter().map(|(s, t)| one(ctx, s, t, ask, started)))
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

/// One due job's tick, and its note of when it needs the next. A job queued behind others
/// starts after the invocation did: its lateness and its note go by the clock when it starts
/// (the transport's, which dates its storage requests).
async fn one<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    tick: &Tick,
    ask: Ask,
    started: Instant,
) -> (StatusCode, Value) {
    let now = (ctx.connect)(settings.storage.timeout)
        .now()
        .unwrap_or(ctx.now);
    let ctx = &Context { now, ..*ctx };
    let outcome = run::tick(ctx, settings, tick, ask).await;
    due::note(ctx.cache, settings, ctx.now, &outcome);
    describe(settings, tick, &outcome, started)
}

/// The occurrence a tick of every job at `by` ticks a job for: its latest at or before `by`
/// (the epoch when none). Unlike a trigger of the job alone (which fires at the job's own
/// occurrences, a little early at most: [`Settings::occurrence_at`]), the table's trigger fires
/// at the finest cadence any job needs, so an occurrence ahead of it is never counted due: it
/// is ticked when the trigger reaches its second.
pub(crate) fn occurrence_by(settings: &Settings, by: SystemTime) -> SystemTime {
    settings
        .schedule
        .latest_at_or_before(by)
        .unwrap_or(SystemTime::UNIX_EPOCH)
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
    use crate::at;
    use crate::settings::tests::settings_with;

    /// The occurrence a tick of every job names for a job: never one ahead of its time, whatever
    /// the job's tolerance (the trigger fires at the finest cadence a table needs: 2 s before
    /// a job's minute, a tick for another job is not a tick for it).
    #[test]
    fn a_tick_of_every_job_never_counts_an_occurrence_ahead_as_due() {
        let minute = 1_796_083_200; // 2026-12-01T00:00:00Z
        for s in [
            settings_with(&[("job_schedule", "* * * * *")]),
            settings_with(&[("job_schedule", "* * * * *"), ("job_early_seconds", "1")]),
        ] {
            let ticked = |by: u64| crate::unix(super::occurrence_by(&s, at(by)));
            assert_eq!(ticked(minute - 2), minute - 60);
            assert_eq!(ticked(minute), minute);
            assert_eq!(ticked(minute + 7), minute);
        }
    }

    #[test]
    fn the_listed_path_carries_no_query() {
        assert_eq!(super::url_path("https://h.example/run?code=S3cret"), "/run");
        assert_eq!(super::url_path("https://h.example?code=S3cret"), "/");
        assert_eq!(super::url_path("http://127.0.0.1:3001/job"), "/job");
    }
}
