//! A job's own route, once the path named a job this component runs: its status, a tick, and
//! the operator's actions (pause, resume, run now, backfill, rerun), each a step of [`serve`].

use std::time::Instant;

use leasegate::{Request, Response, StatusCode, Transport};
use leasegate_spin::log_line;
use leasegate_spin::timer::{Source, Tick, TimerFunction};
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{auth, Context};
use serde_json::json;

use super::{answer, backfill_range, clamped, pause, rerun_occurrence, status, tick_ask};
use crate::attempt::skip::Skip;
use crate::backfill::{backfill, BACKFILL_LOOK};
use crate::log::read_log;
use crate::rerun::rerun;
use crate::run::{run_now, Ask, Decision, TickOutcome, RUN_NOW_TAKEN};
use crate::settings::Settings;
use crate::walk::CATCH_UP_RUNS;
use crate::{at, ScheduledJob};

/// A job's route, once the path named a job this component runs.
pub(super) async fn serve<T: Transport>(
    ctx: &Context<'_, T>,
    request: &Request,
    settings: &Settings,
    action: Option<&str>,
    note: Option<String>,
    power: auth::Power,
    started: Instant,
) -> Response {
    let method = request.method().clone();
    if method == leasegate::Method::GET {
        return job_status(ctx, settings).await;
    }
    match action {
        Some("backfill") => serve_backfill(ctx, request, settings, started).await,
        Some("rerun") => serve_rerun(ctx, request, settings, started).await,
        Some("pause") => pause(ctx, settings, Some(note)).await,
        Some("resume") => pause(ctx, settings, None).await,
        Some("run") => serve_run_now(ctx, settings, started).await,
        _ => serve_tick(ctx, request, settings, power, started).await,
    }
}

/// `GET /api/jobs/{job}`: the job's status, from its log.
async fn job_status<T: Transport>(ctx: &Context<'_, T>, settings: &Settings) -> Response {
    let transport = (ctx.connect)(settings.storage.timeout);
    let blobs = settings.storage.blobs(&transport);
    match read_log(&blobs, settings, ctx.now).await {
        Ok((log, _, server_now)) => web::json(StatusCode::OK, &status(settings, &log, server_now)),
        Err(e) => e.answer(),
    }
}

/// `POST /api/jobs/{job}/backfill`: the occurrences of a range run, as many as one call may.
async fn serve_backfill<T: Transport>(
    ctx: &Context<'_, T>,
    request: &Request,
    settings: &Settings,
    started: Instant,
) -> Response {
    let range = match backfill_range(request, settings, ctx.now) {
        Ok(range) => range,
        Err(m) => return web::error(StatusCode::BAD_REQUEST, "invalid_backfill", m),
    };
    match backfill(ctx, settings, range, started).await {
        Ok(report) => {
            // Moved up to the job's history (when it has begun), the range it looked at.
            let from = match report.history_from {
                Some(h) if report.clamped_from.is_some() && h != u64::MAX => h,
                _ => range.from,
            };
            let mut v = json!({
                "job": settings.job,
                "from": rfc3339(at(from)),
                "to": rfc3339(at(range.to)),
                "ran": report.ran,
                "alreadySettled": report.settled,
                "looked": report.looked,
                "more": report.next.is_some(),
                "continueFrom": report.next.map(|n| rfc3339(at(n))),
                "maxRunsPerCall": CATCH_UP_RUNS,
                "maxOccurrencesPerCall": BACKFILL_LOOK,
                "storageRoundTrips": report.round_trips,
                "durationMs": leasegate_spin::elapsed_ms(started),
            });
            if let Some(asked) = report.clamped_from {
                v["clamped"] = clamped(settings, asked, report.history_from);
            }
            log_line(json!({
                "fn": ScheduledJob::NAME,
                "job": settings.job,
                "instance": settings.instance_id,
                "action": "backfill",
                "ran": report.ran.len(),
                "more": report.next.is_some(),
            }));
            web::json(StatusCode::OK, &v)
        }
        Err(e) => e.answer(),
    }
}

/// `POST /api/jobs/{job}/rerun`: one more attempt of an occurrence, or why not.
async fn serve_rerun<T: Transport>(
    ctx: &Context<'_, T>,
    request: &Request,
    settings: &Settings,
    started: Instant,
) -> Response {
    let occurrence = match rerun_occurrence(request, settings, ctx.now) {
        Ok(o) => o,
        Err(m) => return web::error(StatusCode::BAD_REQUEST, "invalid_rerun", m),
    };
    let tick = Tick {
        at: at(occurrence),
        source: Source::Rerun,
        past_due: true,
    };
    match rerun(ctx, settings, occurrence).await {
        // Another tick acted on it meanwhile (a race lost, a run holding the job's lease):
        // nothing ran; said as a refusal, with why.
        Ok(TickOutcome {
            decision: Ok(Decision::Skipped { reason, .. }),
            ..
        }) => web::error(
            StatusCode::CONFLICT,
            "occurrence_changed",
            format!("the occurrence was not run again: {reason}"),
        ),
        Ok(TickOutcome {
            decision: Ok(Decision::InProgress { retry_after } | Decision::NotDue { retry_after }),
            ..
        }) => {
            let mut r = web::error(
                StatusCode::CONFLICT,
                "occurrence_running",
                "a run holds the job's lease: the occurrence was not run again; ask again \
                 once it ends",
            );
            r.headers_mut()
                .insert("retry-after", retry_after.as_secs().max(1).to_string());
            r
        }
        Ok(outcome) => answer(settings, &tick, &outcome, started),
        Err(r) => web::error(r.status, r.code, r.message),
    }
}

/// `POST /api/jobs/{job}/run`: the job run now, or 409 when this second's run is taken.
async fn serve_run_now<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    started: Instant,
) -> Response {
    let outcome = run_now(ctx, settings).await;
    if let Ok(Decision::Skipped { reason, .. }) = &outcome.decision {
        if *reason == Skip::RunNowTaken {
            let mut r = web::error(StatusCode::CONFLICT, "occurrence_exists", RUN_NOW_TAKEN);
            r.headers_mut().insert("retry-after", "1");
            return r;
        }
    }
    let tick = Tick {
        at: ctx.now,
        source: Source::Manual,
        past_due: false,
    };
    answer(settings, &tick, &outcome, started)
}

/// `POST /api/jobs/{job}/tick`: a tick of the occurrence due now, or (the admin token's) of the
/// occurrence the body names.
async fn serve_tick<T: Transport>(
    ctx: &Context<'_, T>,
    request: &Request,
    settings: &Settings,
    power: auth::Power,
    started: Instant,
) -> Response {
    let asked = match tick_ask(request) {
        Ok(asked) => asked,
        Err(m) => return web::error(StatusCode::BAD_REQUEST, "invalid_tick", m),
    };
    let at_time = asked.at.unwrap_or(ctx.now);
    // The tick token names only the occurrence due now by this instance's clock (give or take
    // the tick tolerance, never one more than that ahead); any other, past or future, is a
    // manual run: the admin token's.
    let (at_time, manual) = match settings.due_now(at_time, ctx.now) {
        Some(due) => (due, false),
        None => {
            if let Err(r) = auth::require_admin(
                ctx.variables,
                power,
                "a tick naming an occurrence other than the one due now (a manual run)",
            ) {
                return r;
            }
            (at_time, true)
        }
    };
    // An admin naming an occurrence is an operator's run: logged `manual`.
    let tick = Tick {
        at: at_time,
        source: if manual { Source::Manual } else { Source::Http },
        past_due: false,
    };
    let ask = Ask {
        manual,
        name_reserver: asked.name_reserver,
    };
    let outcome = crate::run::tick(ctx, settings, &tick, ask).await;
    answer(settings, &tick, &outcome, started)
}
