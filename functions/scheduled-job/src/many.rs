//! Every job of the component at once: one trigger's tick of the due jobs (the cron trigger,
//! an Azure Functions timer, `POST /api/jobs`), and the listing `GET /api/jobs`.

use futures::StreamExt;
use leasegate::{StatusCode, Transport};
use leasegate_spin::timer::Tick;
use leasegate_spin::web::rfc3339;
use leasegate_spin::Context;
use serde_json::{json, Value};
use std::time::{Duration, Instant, SystemTime};

use crate::due;
use crate::http::describe;
use crate::run::{self, Ask};
use crate::settings::Settings;
use crate::table::{Job, Jobs};
use crate::unix;

/// One trigger's tick of every job of the `jobs` table that is due, side by side (up to
/// `max_in_flight` at once), each for the occurrence [`occurrence_by`] the time `by` names
/// (the trigger's, or an HTTP tick's), never before its second: each job's
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
            Ok(s) => {
                let named = occurrence_by(s, by, ctx.now);
                if due::due(ctx.cache, s, unix(named.occurrence), ctx.now) {
                    let at = named.occurrence;
                    due_jobs.push((s, Tick { at, ..*tick }, named.wait));
                } else {
                    not_due.push(s.job.clone());
                }
            }
            Err(e) => broken.push(not_configured(job, &e.0)),
        }
    }
    // At most `max_in_flight` jobs at once (the app's, every job's storage settings are one).
    let side_by_side = due_jobs
        .first()
        .map_or(1, |(s, _, _)| s.storage.max_in_flight.max(1));
    let ticks: Vec<(StatusCode, Value)> = futures::stream::iter(
        due_jobs
            .iter()
            .map(|(s, t, wait)| one(ctx, s, t, *wait, ask, started)),
    )
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

/// One due job's tick, and its note of when it needs the next: after `wait` (until its
/// occurrence's second begins, when the trigger fired a little before it). A job queued behind
/// others starts after the invocation did: its lateness and its note go by the clock when it
/// starts (the transport's, which dates its storage requests).
async fn one<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    tick: &Tick,
    wait: Duration,
    ask: Ask,
    started: Instant,
) -> (StatusCode, Value) {
    if !wait.is_zero() {
        (ctx.sleep)(wait).await;
    }
    let now = (ctx.connect)(settings.storage.timeout)
        .now()
        .unwrap_or(ctx.now);
    let ctx = &Context { now, ..*ctx };
    let outcome = run::tick(ctx, settings, tick, ask).await;
    due::note(ctx.cache, settings, ctx.now, &outcome);
    describe(settings, tick, &outcome, started)
}

/// How far ahead of this instance's clock a tick of every job may name an occurrence (at most
/// the job's tick tolerance): a trigger that fires a little before the second (an Azure timer a
/// few milliseconds early, a ticker whose clock leads this one by less than half a second)
/// names that second's occurrence, and its tick waits for the second to begin. Less than a
/// second: a tick that names a whole second never names the next one.
const SLACK: Duration = Duration::from_millis(500);

/// The occurrence a tick of every job names for a job, and how long the tick waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Named {
    /// The occurrence (the epoch when the schedule has none).
    pub(crate) occurrence: SystemTime,
    /// Until its second begins by this instance's clock (zero when it has).
    pub(crate) wait: Duration,
}

/// The occurrence a tick of every job at `by` (the trigger's time, or the one an HTTP tick
/// names) ticks a job for, this instance's clock reading `now`: the latest at or before `by`
/// give or take [`SLACK`], waited for when it is ahead of `now`; when it is further ahead (a
/// scheduler's clock running fast), the latest by `now`. Unlike a trigger of the job alone,
/// which may fire up to its tick tolerance early ([`Settings::occurrence_at`]), the table's
/// trigger fires at the finest cadence any job needs: no occurrence runs before its second.
pub(crate) fn occurrence_by(settings: &Settings, by: SystemTime, now: SystemTime) -> Named {
    let slack = SLACK.min(settings.tick_tolerance(by));
    let latest = |t: SystemTime| {
        settings
            .schedule
            .latest_at_or_before(t)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let named = latest(by + slack);
    match named.duration_since(now) {
        Err(_) => Named {
            occurrence: named,
            wait: Duration::ZERO,
        },
        Ok(ahead) if ahead <= slack => Named {
            occurrence: named,
            wait: ahead,
        },
        Ok(_) => Named {
            occurrence: latest(now),
            wait: Duration::ZERO,
        },
    }
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

    /// The occurrence a tick of every job names for a job: never one before its second; a
    /// trigger a little before the second names it and waits for it; a time further ahead (a
    /// scheduler's clock running fast) names the one due by this instance's clock.
    #[test]
    fn a_tick_of_every_job_never_runs_an_occurrence_before_its_second() {
        use super::{occurrence_by, Named};
        use std::time::Duration;
        let minute = 1_796_083_200; // 2026-12-01T00:00:00Z
        let ms = |t: u64, ms: u64| at(t) + Duration::from_millis(ms);
        for s in [
            settings_with(&[("job_schedule", "* * * * *")]),
            settings_with(&[("job_schedule", "* * * * *"), ("job_early_seconds", "1")]),
        ] {
            let named = |by, now| occurrence_by(&s, by, now);
            let at_once = |o: u64| Named {
                occurrence: at(o),
                wait: Duration::ZERO,
            };
            // On time, late: the latest.
            assert_eq!(named(at(minute), ms(minute, 400)), at_once(minute));
            assert_eq!(named(at(minute + 7), at(minute + 7)), at_once(minute));
            // 2 s before: the previous one (a tick of the table for another job).
            assert_eq!(named(at(minute - 2), at(minute - 2)), at_once(minute - 60));
            // 5 ms before the second (an Azure timer, a ticker's clock leading): the minute,
            // once its second begins.
            let early = Named {
                occurrence: at(minute),
                wait: Duration::from_millis(5),
            };
            assert_eq!(named(ms(minute - 1, 995), ms(minute - 1, 995)), early);
            assert_eq!(named(at(minute), ms(minute - 1, 995)), early);
            // A scheduler 8 s fast: the one due by this instance's clock.
            assert_eq!(named(at(minute + 3), at(minute - 5)), at_once(minute - 60));
        }
    }

    #[test]
    fn the_listed_path_carries_no_query() {
        assert_eq!(super::url_path("https://h.example/run?code=S3cret"), "/run");
        assert_eq!(super::url_path("https://h.example?code=S3cret"), "/");
        assert_eq!(super::url_path("http://127.0.0.1:3001/job"), "/job");
    }
}
