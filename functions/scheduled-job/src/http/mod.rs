//! The HTTP API, `POST /api/jobs/{job}/tick` and `GET /api/jobs/{job}`, and a tick's answer.

use leasegate::{Request, Response, StatusCode, Transport};
use leasegate_spin::log_line;
use leasegate_spin::timer::{self, Source, Tick};
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{auth, elapsed_ms, Context};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Instant, SystemTime};

use crate::backfill::BackfillAsk;
use crate::log::{change_log, Log, LogWrite, Paused};
use crate::many;
use crate::run::{Ask, Decision, TickOutcome};
use crate::settings::{check_job_name, Settings};
use crate::table::{Job, Jobs};
use crate::{at, ScheduledJob, MAX_BODY_BYTES};
use leasegate_spin::timer::TimerFunction;

mod bodies;
mod job;
pub(crate) use bodies::*;
use job::serve;

/// The answer for a tick: its status (2xx when the occurrence is settled: run here, run
/// elsewhere, skipped on purpose) and a JSON value with the decision.
pub fn describe(
    settings: &Settings,
    tick: &Tick,
    outcome: &TickOutcome,
    started: Instant,
) -> (StatusCode, Value) {
    let mut v = json!({
        "job": settings.job,
        "instance": settings.instance_id,
        "occurrence": rfc3339(at(outcome.occurrence)),
        "trigger": tick.source.as_str(),
        "storageRoundTrips": outcome.round_trips,
        "durationMs": elapsed_ms(started),
    });
    let status = match &outcome.decision {
        Ok(d) => {
            v["decision"] = json!(d.name());
            match d {
                Decision::Ran { entry }
                | Decision::Overlapped { entry }
                | Decision::Missed { entry }
                | Decision::Paused { entry }
                | Decision::Buffered { entry } => {
                    v["entry"] = json!(entry);
                    StatusCode::OK
                }
                Decision::JobFailed { entry } => {
                    v["entry"] = json!(entry);
                    v["error"] = json!("job_failed");
                    let attempt = entry.attempt.unwrap_or(1);
                    let reason = entry.reason.clone().unwrap_or_default();
                    // A scheduled occurrence's retry comes with a later tick; an operator's
                    // run of its own second is not one (nothing ticks it again).
                    let retried_later = attempt <= settings.retries
                        && !(tick.source == Source::Manual
                            && settings
                                .schedule
                                .latest_at_or_before(at(outcome.occurrence))
                                != Some(at(outcome.occurrence)));
                    v["message"] = json!(if retried_later {
                        format!(
                            "{reason}; attempt {attempt} of {}: a later tick retries it after \
                             job_retry_delay_seconds ({} s)",
                            settings.retries + 1,
                            settings.retry_delay.as_secs()
                        )
                    } else if settings.retries > 0 {
                        format!("{reason}; that was the last attempt: the next occurrence runs normally")
                    } else {
                        format!("{reason}; it is not retried: the next occurrence runs normally")
                    });
                    StatusCode::BAD_GATEWAY
                }
                Decision::Skipped {
                    reserved_by,
                    reason,
                } => {
                    v["reservedBy"] = json!(reserved_by);
                    v["reason"] = json!(reason.to_string());
                    StatusCode::OK
                }
                Decision::InProgress { retry_after } => {
                    v["error"] = json!("occurrence_in_progress");
                    v["message"] = json!(format!(
                        "this instance's lease for the occurrence is held but the occurrence has no outcome yet: retry in {} s (once the lease ends, a tick runs it)",
                        retry_after.as_secs()
                    ));
                    v["retryAfterSeconds"] = json!(retry_after.as_secs());
                    StatusCode::SERVICE_UNAVAILABLE
                }
                Decision::NotDue { retry_after } => {
                    v["error"] = json!("occurrence_not_due");
                    v["message"] = json!(format!(
                        "a run of an earlier occurrence holds the job's lease and this occurrence is not due for {} s by the storage server's clock: nothing was recorded; a tick once it is due decides",
                        retry_after.as_secs()
                    ));
                    v["retryAfterSeconds"] = json!(retry_after.as_secs());
                    StatusCode::SERVICE_UNAVAILABLE
                }
                Decision::TooEarly { early } => {
                    v["error"] = json!("occurrence_too_early");
                    // An operator's time came from the caller; a scheduler's, from this
                    // instance's clock.
                    let whose = match tick.source {
                        Source::Manual => "the time the tick named (at) is ahead",
                        _ => "is this instance's clock ahead?",
                    };
                    v["message"] = json!(format!(
                        "the occurrence is more than {} s ahead of the storage server's clock (job_early_seconds): {whose}",
                        early.as_secs()
                    ));
                    StatusCode::CONFLICT
                }
                Decision::TooOld { retention } => {
                    v["error"] = json!("occurrence_too_old");
                    v["message"] = json!(format!(
                        "the occurrence is more than {} s old (job_retention_seconds): it may have run, so it is not run",
                        retention.as_secs()
                    ));
                    StatusCode::CONFLICT
                }
            }
        }
        Err(e) => {
            v["decision"] = json!("storage_unavailable");
            v["error"] = json!(e.code());
            v["message"] = json!(e.message("the job did not run"));
            e.status()
        }
    };
    let c = &outcome.catch_up;
    if !c.ran.is_empty() || !c.retried.is_empty() || c.missed > 0 || c.more {
        v["catchUp"] = json!({
            "ran": c.ran,
            "retried": c.retried,
            "missed": c.missed,
            "more": c.more,
        });
    }
    (status, v)
}

pub(crate) async fn api<T: Transport>(
    ctx: &Context<'_, T>,
    request: &Request,
    rest: &str,
    power: auth::Power,
    started: Instant,
) -> Response {
    if rest.trim_end_matches('/').is_empty() {
        return every_job(ctx, request, started).await;
    }
    let (job, action) = match rest.trim_end_matches('/').split_once('/') {
        Some((job, action)) => (job, Some(action)),
        None => (rest.trim_end_matches('/'), None),
    };
    // A name no job can have (`Invoice-Export`): 400, with the jobs there are.
    if let Err(m) = check_job_name(job) {
        let there = match Jobs::load(ctx.variables) {
            Ok(jobs) => format!(" (this component's jobs: {})", jobs.names()),
            Err(_) => String::new(),
        };
        return web::error(
            StatusCode::BAD_REQUEST,
            "invalid_job",
            format!("{m}{there}"),
        );
    }
    let method = request.method().clone();
    match (action, &method) {
        (None, &leasegate::Method::GET) => {}
        (
            Some("tick" | "pause" | "resume" | "run" | "backfill" | "rerun"),
            &leasegate::Method::POST,
        ) => {}
        (None, _) => return web::method_not_allowed("GET"),
        (Some("tick" | "pause" | "resume" | "run" | "backfill" | "rerun"), _) => {
            return web::method_not_allowed("POST")
        }
        (Some(_), _) => {
            return web::error(
                StatusCode::NOT_FOUND,
                "not_found",
                "routes: GET /api/jobs/{job}, POST /api/jobs/{job}/tick, /pause, /resume, /run, \
                 /backfill, /rerun",
            )
        }
    }
    // Pause, resume and run now are an operator's: the admin token.
    let admin_action = match action {
        Some("pause") => Some("pausing a job"),
        Some("resume") => Some("resuming a job"),
        Some("run") => Some("running a job now"),
        Some("backfill") => Some("backfilling a job's occurrences"),
        Some("rerun") => Some("running an occurrence again"),
        _ => None,
    };
    if let Some(what) = admin_action {
        if let Err(r) = auth::require_admin(ctx.variables, power, what) {
            return r;
        }
    }
    // Their bodies are read before any setting, so a bad one costs nothing.
    let note = match action {
        Some("pause") => match pause_note(request) {
            Ok(note) => note,
            Err(m) => return web::error(StatusCode::BAD_REQUEST, "invalid_pause", m),
        },
        Some("resume" | "run") if !empty_body(request) => {
            return web::error(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                "this route takes no body (or {})",
            )
        }
        _ => None,
    };
    let jobs = match Jobs::load(ctx.variables) {
        Ok(jobs) => jobs,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    let settings = match find(&jobs, job) {
        Ok(settings) => settings,
        Err(r) => return r,
    };
    serve(ctx, request, settings, action, note, power, started).await
}

/// The job named in the path, or the answer: 404 `unknown_job`, 503 `not_configured`.
fn find<'j>(jobs: &'j Jobs, job: &str) -> Result<&'j Settings, Response> {
    match jobs.get(job) {
        Some(Job {
            settings: Ok(s), ..
        }) => Ok(s),
        Some(Job {
            settings: Err(e), ..
        }) => Err(web::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_configured",
            &e.0,
        )),
        None if !jobs.table => Err(web::error(
            StatusCode::NOT_FOUND,
            "unknown_job",
            format!("this component runs job {}", jobs.names()),
        )),
        None => Err(web::error(
            StatusCode::NOT_FOUND,
            "unknown_job",
            format!(
                "no job {job} in the jobs table: its jobs are {}",
                jobs.names()
            ),
        )),
    }
}

/// `GET /api/jobs`: the jobs and their next occurrences; `POST /api/jobs`: a tick of every
/// job that is due (an HTTP scheduler's, SpinKube's ticker's), for the time in an optional
/// body `{"at": ...}` within 10 s of this instance's clock (else now): each job is ticked for
/// its latest occurrence by that time, never one before its second ([`many::occurrence_by`]).
async fn every_job<T: Transport>(
    ctx: &Context<'_, T>,
    request: &Request,
    started: Instant,
) -> Response {
    let method = request.method().clone();
    if method != leasegate::Method::GET && method != leasegate::Method::POST {
        return web::method_not_allowed("GET, POST");
    }
    let asked = if method == leasegate::Method::POST {
        match tick_ask(request) {
            Ok(asked) => Some(asked),
            Err(m) => return web::error(StatusCode::BAD_REQUEST, "invalid_tick", m),
        }
    } else {
        None
    };
    let jobs = match Jobs::load(ctx.variables) {
        Ok(jobs) => jobs,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    let Some(asked) = asked else {
        return web::json(StatusCode::OK, &many::list(&jobs, ctx.now));
    };
    let at_time = asked.at.unwrap_or(ctx.now);
    let off = match at_time.duration_since(ctx.now) {
        Ok(ahead) => ahead,
        Err(behind) => behind.duration(),
    };
    if off > EVERY_JOB_TOLERANCE {
        return web::error(
            StatusCode::BAD_REQUEST,
            "invalid_tick",
            format!(
                "a tick of every job names a time within {} s of this instance's clock: name \
                 another occurrence on the job's own route, POST /api/jobs/{{job}}/tick",
                EVERY_JOB_TOLERANCE.as_secs()
            ),
        );
    }
    let tick = Tick {
        at: at_time,
        source: Source::Http,
        past_due: false,
    };
    // A time ahead of this instance's clock (a scheduler's clock running fast) ticks what is
    // due by this instance's: no job runs early.
    let by = at_time.min(ctx.now);
    let ask = Ask {
        manual: false,
        name_reserver: asked.name_reserver,
    };
    let (status, v) = many::tick_all(ctx, &jobs, &tick, by, ask, started).await;
    ScheduledJob::log(&v);
    web::json(status, &v)
}

/// How far from this instance's clock `POST /api/jobs` may name its time.
const EVERY_JOB_TOLERANCE: std::time::Duration = std::time::Duration::from_secs(10);

/// A tick's (or a run's) answer, logged.
fn answer(settings: &Settings, tick: &Tick, outcome: &TickOutcome, started: Instant) -> Response {
    let (status, v) = describe(settings, tick, outcome, started);
    ScheduledJob::log(&v);
    let mut r = web::json(status, &v);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        let wait = v["retryAfterSeconds"].as_u64().unwrap_or(1).to_string();
        r.headers_mut().insert("retry-after", &wait);
    }
    r
}

/// Pauses (`Some(note)`) or resumes (`None`) the job: the log's `paused`, by compare-and-swap.
async fn pause<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    pausing: Option<Option<String>>,
) -> Response {
    let transport = (ctx.connect)(settings.storage.timeout);
    let blobs = settings.storage.blobs(&transport);
    // What the pause replaced, for the answer (a note replaced is said, never silent).
    let before = std::cell::RefCell::new(None);
    let changed = change_log(&blobs, settings, ctx.now, |log, read_at| {
        log.job = settings.job.clone();
        *before.borrow_mut() = log.paused.clone();
        log.paused = match &pausing {
            Some(note) => Some(Paused {
                since: log
                    .paused
                    .as_ref()
                    .map(|p| p.since.clone())
                    .unwrap_or_else(|| rfc3339(read_at)),
                note: note.clone(),
            }),
            None => None,
        };
        Ok::<(), ()>(())
    })
    .await;
    match changed {
        Ok(Ok(LogWrite { log, .. })) => {
            let mut v = json!({
                "job": settings.job,
                "paused": log.paused.is_some(),
                "since": log.paused.as_ref().map(|p| p.since.clone()),
                "note": log.paused.as_ref().and_then(|p| p.note.clone()),
            });
            let before = before.borrow().clone();
            match (&pausing, before) {
                // Paused already: kept since then, its note replaced by this one.
                (Some(_), Some(was)) => {
                    v["alreadyPaused"] = json!(true);
                    v["previousNote"] = json!(was.note);
                }
                (Some(_), None) => v["alreadyPaused"] = json!(false),
                (None, was) => v["wasPaused"] = json!(was.is_some()),
            }
            log_line(json!({
                "fn": ScheduledJob::NAME,
                "job": settings.job,
                "instance": settings.instance_id,
                "action": if log.paused.is_some() { "pause" } else { "resume" },
            }));
            web::json(StatusCode::OK, &v)
        }
        Ok(Err(())) => web::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
            "the log was not changed",
        ),
        Err(e) => e.answer(),
    }
}

/// The job's status: its schedule and zone, the next 3 occurrences (UTC and local), its
/// policies, the last runs (the log's entries) and the counters.
pub(crate) fn status(settings: &Settings, log: &Log, server_now: SystemTime) -> Value {
    let next: Vec<Value> = settings
        .schedule
        .upcoming(server_now, 3)
        .into_iter()
        .map(|t| json!({"utc": rfc3339(t), "local": settings.schedule.local_time(t)}))
        .collect();
    json!({
        "job": settings.job,
        "schedule": settings.schedule.expression(),
        "timeZone": settings.schedule.zone(),
        "periodSeconds": settings.period.as_secs(),
        "next": next,
        "catchUp": settings.catch_up.as_str(),
        "catchUpWindowSeconds": settings.catch_up_window.as_secs(),
        "overlap": settings.overlap.as_str(),
        "counters": log.counters,
        "paused": log.paused.is_some(),
        "pausedSince": log.paused.as_ref().map(|p| p.since.clone()),
        "pauseNote": log.paused.as_ref().and_then(|p| p.note.clone()),
        "retries": settings.retries,
        "retryDelaySeconds": settings.retry_delay.as_secs(),
        "settledThrough": (log.settled_through != 0).then(|| rfc3339(at(log.settled_through))),
        "historyFrom": (log.history_from != 0).then(|| rfc3339(at(log.history_from))),
        "reservations": log.entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick_body(body: &str) -> Result<Option<SystemTime>, String> {
        tick_asked(body).map(|ask| ask.at)
    }

    fn tick_asked(body: &str) -> Result<TickAsk, String> {
        let request = Request::new(leasegate::Method::POST, "/api/jobs/j/tick")
            .with_body(body.as_bytes().to_vec());
        tick_ask(&request)
    }

    /// Issue 47, item 10: a too-early occurrence an admin named by `at` is said to come from
    /// the caller's time, not from this instance's clock.
    #[test]
    fn a_too_early_answer_says_whose_time_was_ahead() {
        let s = crate::settings::tests::settings(60, 0, 300);
        let outcome = TickOutcome {
            occurrence: 1_800_000_000,
            decision: Ok(Decision::TooEarly {
                early: std::time::Duration::from_secs(300),
            }),
            round_trips: 1,
            catch_up: Default::default(),
        };
        let message = |source| {
            let tick = Tick {
                at: at(1_800_000_000),
                source,
                past_due: false,
            };
            let (status, v) = describe(&s, &tick, &outcome, Instant::now());
            assert_eq!(status, StatusCode::CONFLICT);
            v["message"].as_str().unwrap().to_string()
        };
        assert!(message(Source::Manual).contains("the time the tick named (at) is ahead"));
        assert!(!message(Source::Manual).contains("this instance's clock"));
        assert!(message(Source::Cron).contains("is this instance's clock ahead?"));
    }

    /// Review of issue 47: times before 1970 in a rerun's or a tick's body are a clear 400,
    /// not a trap (formatting them panicked).
    #[test]
    fn times_before_1970_are_refused_not_a_trap() {
        let s = crate::settings::tests::settings(60, 0, 300);
        let body = |b: &str| {
            Request::new(leasegate::Method::POST, "/api/jobs/j/rerun")
                .with_body(b.as_bytes().to_vec())
        };
        for b in [
            r#"{"occurrence":"1970-01-01T00:00:30+01:00"}"#,
            r#"{"occurrence":"1969-12-31T23:59:00Z"}"#,
        ] {
            let e = rerun_occurrence(&body(b), &s, at(1_800_000_000)).unwrap_err();
            assert!(e.contains("RFC 3339"), "{b}: {e}");
        }
        assert!(tick_body(r#"{"at": "1969-12-31T23:59:00Z"}"#).is_err());
        assert_eq!(
            leasegate_spin::web::rfc3339(
                SystemTime::UNIX_EPOCH - std::time::Duration::from_secs(9)
            ),
            "1970-01-01T00:00:00Z"
        );
    }

    #[test]
    fn backfill_bodies() {
        let s = crate::settings::tests::settings(60, 0, 300);
        // 2027-01-15T08:00:00Z; the retention is an hour.
        let now = at(1_800_000_000);
        let range = |body: &str| {
            let request = Request::new(leasegate::Method::POST, "/api/jobs/j/backfill")
                .with_body(body.as_bytes().to_vec());
            backfill_range(&request, &s, now)
        };
        let asked = |body: &str| range(body).map(|a| (a.from, a.to, a.before_history));
        assert_eq!(
            asked(r#"{"from": "2027-01-15T07:30:00Z", "to": "2027-01-15T07:40:00Z"}"#),
            Ok((1_799_998_200, 1_799_998_800, false))
        );
        assert_eq!(
            asked(
                r#"{"from": "2027-01-15T07:30:00Z", "to": "2027-01-15T07:40:00Z",
                    "beforeHistory": true}"#
            ),
            Ok((1_799_998_200, 1_799_998_800, true))
        );
        for (body, words) in [
            (r#"{"from": "2027-01-15T07:30:00Z"}"#, "to is required"),
            (r#"{"to": "2027-01-15T07:30:00Z"}"#, "from is required"),
            (
                r#"{"from": "2027-01-15T07:40:00Z", "to": "2027-01-15T07:30:00Z"}"#,
                "from must be at or before to",
            ),
            (
                r#"{"from": "2027-01-15T07:40:00Z", "to": "2027-01-15T09:00:00Z"}"#,
                "to is ahead of now",
            ),
            (
                r#"{"from": "2027-01-15T06:00:00Z", "to": "2027-01-15T07:30:00Z"}"#,
                "older than the retention",
            ),
            (
                r#"{"from": "yesterday", "to": "2027-01-15T07:30:00Z"}"#,
                "RFC 3339",
            ),
            (r#"{"from": 1, "to": 2}"#, "the body must be"),
            (
                r#"{"from": "2027-01-15T07:30:00Z", "to": "2027-01-15T07:40:00Z", "x": 1}"#,
                "the body must be",
            ),
            ("", "the body must be"),
            ("[]", "the body must be"),
        ] {
            let e = range(body).unwrap_err();
            assert!(e.contains(words), "{body}: {e}");
        }
    }

    #[test]
    fn tick_bodies() {
        assert_eq!(tick_body(""), Ok(None));
        assert_eq!(tick_body(" \n"), Ok(None));
        assert_eq!(tick_body("{}"), Ok(None));
        assert_eq!(tick_body(r#"{"at": null}"#), Ok(None));
        assert_eq!(
            tick_body(r#"{"at": "1970-01-01T00:01:00Z"}"#),
            Ok(Some(at(60)))
        );
        for (body, names) in [
            (r#"{"at": "yesterday"}"#, "RFC 3339"),
            (r#"{"at": 60}"#, "at must be a string"),
            (r#"{"at": {}}"#, "at must be a string"),
            (
                r#"{"when": "1970-01-01T00:01:00Z"}"#,
                "unknown field `when`",
            ),
            (r#"["1970-01-01T00:01:00Z"]"#, r#"a JSON object {"at""#),
            ("at=60", "not valid JSON"),
            (r#"{"at": "1970-01-01T00:01:00Z"} x"#, "trailing characters"),
            (
                r#"{"nameReserver": "yes"}"#,
                "nameReserver must be true or false",
            ),
            (
                r#"{"nameReserver": 1}"#,
                "nameReserver must be true or false",
            ),
            (
                r#"{"name_reserver": true}"#,
                "unknown field `name_reserver`",
            ),
        ] {
            let e = tick_body(body).unwrap_err();
            assert!(e.contains(names), "{body}: {e}");
        }
        assert_eq!(
            tick_asked(r#"{"nameReserver": true}"#).map(|a| a.name_reserver),
            Ok(true)
        );
        assert_eq!(
            tick_asked(r#"{"at": "1970-01-01T00:01:00Z", "nameReserver": false}"#),
            Ok(TickAsk {
                at: Some(at(60)),
                name_reserver: false
            })
        );
        assert_eq!(
            tick_asked(r#"{"nameReserver": null}"#),
            Ok(TickAsk::default())
        );
        // A long stray field is not repeated whole.
        let long = format!(r#"{{"{}": 1}}"#, "a".repeat(10_000));
        let e = tick_body(&long).unwrap_err();
        assert!(e.len() < 300 && e.ends_with("..."), "{e}");
    }
}
