//! `POST /api/jobs/{job}/rerun {"occurrence": "..."}`: one more attempt of a `failed` or
//! `missed` occurrence, on purpose: the same idempotency key, a new fencing token (above every
//! earlier one of the job), trigger `rerun`, at most once per attempt like every run.

use std::time::SystemTime;

use leasegate::ops::BlobProperties;
use leasegate::{BlobClient, BlobName, Counting, StatusCode, Transport};
use leasegate_spin::timer::{Source, Tick};
use leasegate_spin::web::rfc3339;
use leasegate_spin::Context;

use crate::attempt::{run_reserved, ReservedRun};
use crate::error::JobError;
use crate::log::read_log;
use crate::reservation::{
    attempt_of, head, outcome_of, reserve, takeover, Reservation, Reserved, Reserving, RunStatus,
    Takeover, MAX_ATTEMPTS,
};
use crate::run::{Decision, TickOutcome};
use crate::settings::Settings;
use crate::walk::CatchUpReport;
use crate::{at, unix};

/// Why a rerun was refused: its answer's status, error code and message.
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

fn refused<T, E: From<Refused>>(code: &'static str, message: String) -> Result<T, E> {
    Err(Refused {
        status: StatusCode::CONFLICT,
        code,
        message,
    }
    .into())
}

/// The attempt a rerun makes: the reservation it runs under, its number, and when the
/// occurrence was reserved.
struct Again {
    reservation: Reservation,
    attempt: u32,
    reserved_at: SystemTime,
}

/// Why a step of a rerun stopped short of a run: a refusal, or a storage request that failed
/// (answered as a tick's failure).
enum Stop {
    Refused(Refused),
    Failed(JobError),
}

impl From<Refused> for Stop {
    fn from(r: Refused) -> Stop {
        Stop::Refused(r)
    }
}

/// What a rerun of an occurrence came to: a run (its outcome, as a tick's), or a refusal (the
/// occurrence succeeded, is running, never ran, is too old or before the job's history).
pub(crate) async fn rerun<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    occurrence: u64,
) -> Result<TickOutcome, Refused> {
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let job = (ctx.connect)(settings.timeout);
    let blobs = settings.storage.blobs(&counting);
    let outcome = |decision: Result<Decision, JobError>| TickOutcome {
        occurrence,
        decision,
        round_trips: counting.sent(),
        catch_up: CatchUpReport::default(),
    };
    let tick = Tick {
        at: at(occurrence),
        source: Source::Rerun,
        past_due: true,
    };
    let when = rfc3339(at(occurrence));
    let blob = match settings.reservation(occurrence) {
        Ok(blob) => blob,
        Err(e) => return Ok(outcome(Err(e.into()))),
    };
    let (props, date) = match head(&blobs, &blob, ctx.now).await {
        Ok(read) => read,
        Err(e) => return Ok(outcome(Err(e.into()))),
    };
    let server_now = date.unwrap_or(ctx.now);
    if occurrence < unix(server_now).saturating_sub(settings.retention.as_secs()) {
        return refused(
            "occurrence_too_old",
            format!(
                "occurrence {when} is older than job_retention_seconds ({} s): its reservation \
                 may be gone, so it is not run again",
                settings.retention.as_secs()
            ),
        );
    }
    let again = match props {
        Some(props) => reserved_again(settings, blob, props, server_now, &when).map_err(Stop::from),
        None => reserve_missed(ctx, &blobs, settings, occurrence, &when).await,
    };
    let Again {
        reservation,
        attempt,
        reserved_at,
    } = match again {
        Ok(again) => again,
        Err(Stop::Refused(r)) => return Err(r),
        Err(Stop::Failed(e)) => return Ok(outcome(Err(e))),
    };
    let run = ReservedRun {
        occurrence,
        reserved_at,
        server_now,
        reservation,
        skip_late: false,
        attempt,
    };
    let ran = run_reserved(ctx, &blobs, &job, settings, &tick, run).await;
    Ok(outcome(ran.map(|(decision, _)| decision)))
}

/// The next attempt of an occurrence whose reservation `props` read: one after a failed
/// attempt, the first of one missed or abandoned (left without an outcome past its reserver's
/// deadline: it never ran); a refusal for any other.
fn reserved_again(
    settings: &Settings,
    blob: BlobName,
    props: BlobProperties,
    server_now: SystemTime,
    when: &str,
) -> Result<Again, Refused> {
    // Left without an outcome past its reserver's deadline: it never ran.
    let abandoned = outcome_of(&props.metadata).is_none()
        && takeover(&props, server_now, settings, false) == Takeover::Run { attempt: 1 };
    let attempt = match outcome_of(&props.metadata) {
        Some(RunStatus::Failed) => attempt_of(&props.metadata).saturating_add(1),
        Some(RunStatus::Missed) => 1,
        None if abandoned => 1,
        Some(RunStatus::Succeeded) => {
            return refused(
                "occurrence_succeeded",
                format!(
                    "occurrence {when} succeeded: a rerun is for one that failed or was missed"
                ),
            )
        }
        Some(status @ (RunStatus::SkippedPaused | RunStatus::SkippedOverlap)) => {
            return refused(
                "occurrence_not_run",
                format!(
                    "occurrence {when} never ran ({status}): POST /api/jobs/{}/backfill \
                     runs it",
                    settings.job
                ),
            )
        }
        other => {
            return refused(
                "occurrence_running",
                format!(
                    "occurrence {when} is {}: its run is going or its reserver is at \
                     work, and the takeover rule settles it if they vanished",
                    other.map_or("reserved, without an outcome yet".into(), |s| s.to_string())
                ),
            )
        }
    };
    if attempt > MAX_ATTEMPTS {
        return refused(
            "occurrence_attempts_spent",
            format!("occurrence {when} has had {MAX_ATTEMPTS} attempts, the most it may"),
        );
    }
    let reserved_at = props.last_modified.unwrap_or(server_now);
    let reservation = Reservation {
        blob,
        etag: props.etag,
        metadata: props.metadata,
        created: false,
    };
    Ok(Again {
        reservation,
        attempt,
        reserved_at,
    })
}

/// The first attempt of an occurrence with no reservation, reserved here, when the log says
/// it was missed (an entry, or below its watermark); a refusal when it is not decided yet or
/// was due before the job's history.
async fn reserve_missed<T: Transport, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<S>,
    settings: &Settings,
    occurrence: u64,
    when: &str,
) -> Result<Again, Stop> {
    // No reservation: recorded missed in the log (an entry, or below its watermark),
    // or not decided yet, or before the job's history.
    let log = match read_log(blobs, settings, ctx.now).await {
        Ok((log, _, _)) => log,
        Err(e) => return Err(Stop::Failed(e)),
    };
    let entry = log.entries.iter().find(|e| e.occurrence_unix == occurrence);
    let missed = match entry {
        Some(e) => e.status == RunStatus::Missed,
        None => {
            log.history_begun()
                && occurrence <= log.settled_through
                && occurrence >= log.cleaned_before
                && occurrence >= log.history_from
        }
    };
    if !missed {
        let why = match entry {
            Some(e) => format!("the log records it {}", e.status),
            None if !log.history_begun() || occurrence < log.history_from => format!(
                "it was due before the job's history began: POST /api/jobs/{}/backfill \
                 with \"beforeHistory\": true runs it",
                settings.job
            ),
            None => "it is not settled yet (no winner has looked at it)".into(),
        };
        return refused(
            "occurrence_not_missed",
            format!("occurrence {when} has no reservation and {why}"),
        );
    }
    let nonce = (ctx.new_lease_id)().to_string();
    let by = Reserving {
        trigger: "rerun",
        late: true,
        nonce: &nonce,
    };
    let reserved = reserve(blobs, settings, occurrence, &by, ctx.now);
    match reserved.await {
        Ok(Reserved::Created(reservation, t)) => Ok(Again {
            reservation,
            attempt: 1,
            reserved_at: t,
        }),
        Ok(Reserved::Exists) => refused(
            "occurrence_running",
            format!("occurrence {when} was reserved meanwhile: ask again to see it"),
        ),
        Err(e) => Err(Stop::Failed(e)),
    }
}
