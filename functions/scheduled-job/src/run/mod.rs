//! A tick, step by step, numbered as in `docs/timer-functions.md` ("A tick, step by step"):
//! 1 reserve, 2 refuse an occurrence out of range, 3 skip one settled already or take the
//! job's lease, 4 write the outcome, 5 log, 6 call the job, then release, record its result,
//! settle earlier occurrences left without an outcome and clean up.

use leasegate::BlobClient;
use leasegate::{Counting, Transport, TransportErrorKind};
use leasegate_spin::cache::{self, Cache};
use leasegate_spin::timer::{Source, Tick};
use leasegate_spin::web::{self};
use leasegate_spin::Context;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime};

use crate::attempt::run_reserved;
use crate::attempt::skip::Skip;
use crate::error::JobError;
use crate::log::{LogEntry, LogWrite};
use crate::reservation::{
    attempt_of, clean_up, commit, head, outcome_of, reserve, take_back, OutcomeWrite, Over,
    Reservation, Reserving, RunStatus,
};
use crate::settings::{CatchUp, Settings};
use crate::walk::{settle_earlier, settle_vanished, CatchUpReport};
use crate::{at, unix};
use plan::Step;

mod plan;

/// A tick may write `skipped_overlap` on an occurrence at most this far ahead of the storage
/// server's clock (its `Date` is whole seconds, so an occurrence due within the second reads
/// one second ahead).
pub(crate) const DUE_GRACE_SECS: u64 = 1;

/// What a tick came to.
#[derive(Debug, Clone)]
pub enum Decision {
    /// This instance ran the occurrence; the job answered 2xx.
    Ran {
        /// The run's log entry.
        entry: LogEntry,
    },
    /// Another instance reserved it (or this one did, on an earlier tick).
    Skipped {
        /// Who reserved it, as its reservation says.
        reserved_by: Option<String>,
        /// Why (its `Display` is the reason answers and logs give).
        reason: Skip,
    },
    /// This instance reserved it, but a previous run still holds the job's lease.
    Overlapped {
        /// The log entry.
        entry: LogEntry,
    },
    /// `job_overlap = buffer_one`: the previous run still holds the job's lease; the
    /// occurrence is kept `pending` and runs when that run ends.
    Buffered {
        /// The log entry.
        entry: LogEntry,
    },
    /// The job is paused: the occurrence is recorded `skipped_paused`, not run.
    Paused {
        /// The log entry.
        entry: LogEntry,
    },
    /// The occurrence was ticked late with `job_catch_up = none`: recorded `missed`, not run.
    Missed {
        /// The log entry.
        entry: LogEntry,
    },
    /// This instance ran it and the job failed (not retried).
    JobFailed {
        /// The run's log entry.
        entry: LogEntry,
    },
    /// This instance's lease for this occurrence is held (by another tick of it, or by a
    /// tick that failed before writing its outcome and could not release) and the reservation
    /// has no outcome: not settled, to be retried after `retry_after` (the lease's time left).
    InProgress {
        /// How long the lease has left.
        retry_after: Duration,
    },
    /// The occurrence is older than the retention (or than the log's clean-up): refused,
    /// whoever asks and however often.
    TooOld {
        /// The retention.
        retention: Duration,
    },
    /// The occurrence is further ahead of the storage server's clock than `job_early_seconds`:
    /// refused (a clock or a caller running ahead would take future occurrences).
    TooEarly {
        /// The tolerance.
        early: Duration,
    },
    /// A run of an earlier occurrence holds the job's lease and this occurrence is not due yet
    /// by the storage server's clock: nothing is recorded (no tick skips an occurrence before
    /// it is due); a tick once it is due decides.
    NotDue {
        /// How long until it is due.
        retry_after: Duration,
    },
}

impl Decision {
    /// `ran`, `skipped`, `overlapped`, `failed`, `missed`, `too_old`, `too_early`,
    /// `in_progress` or `not_due`.
    pub fn name(&self) -> &'static str {
        match self {
            Decision::Ran { .. } => "ran",
            Decision::Skipped { .. } => "skipped",
            Decision::Overlapped { .. } => "overlapped",
            Decision::JobFailed { .. } => "failed",
            Decision::Missed { .. } => "missed",
            Decision::Paused { .. } => "paused",
            Decision::Buffered { .. } => "buffered",
            Decision::TooOld { .. } => "too_old",
            Decision::TooEarly { .. } => "too_early",
            Decision::InProgress { .. } => "in_progress",
            Decision::NotDue { .. } => "not_due",
        }
    }
}

/// A tick's outcome: the occurrence, the decision (or the storage failure), the storage
/// requests it took.
#[derive(Debug)]
pub struct TickOutcome {
    /// The occurrence (Unix seconds).
    pub occurrence: u64,
    /// What happened.
    pub decision: Result<Decision, JobError>,
    /// Storage requests sent.
    pub round_trips: u32,
    /// What the tick did for earlier occurrences after its own (run them, record them missed).
    pub catch_up: CatchUpReport,
}

/// How [`run_tick`] treats its occurrence.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Asked {
    /// Record it missed instead of running it (late, and `job_catch_up = none` or beyond the
    /// window).
    pub(crate) skip_late: bool,
    /// A run now: only a fresh occurrence (one that exists is not touched).
    pub(crate) fresh_only: bool,
    /// Read the reservation found reserved already, to name its reserver.
    pub(crate) name_reserver: bool,
}

/// What the caller of a tick asked for, beyond the tick itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// An admin's tick naming an occurrence: run it whatever `job_catch_up` says.
    pub manual: bool,
    /// Name the instance that reserved an occurrence this tick finds reserved already (a read
    /// of the reservation, one storage request more): an HTTP tick's `"nameReserver": true`.
    pub name_reserver: bool,
}

/// Runs one tick: the occurrence due at the trigger time (reserve, lease, log, run, release,
/// log), then the earlier ones no tick settled (catch up or record them missed), then the
/// clean-up.
pub async fn tick<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    tick: &Tick,
    ask: Ask,
) -> TickOutcome {
    // The one due at the trigger time (0 when the schedule has none before it: refused as too
    // old).
    let occurrence = settings.occurrence_at(tick.at).unwrap_or(0);
    let asking = Asking {
        occurrence,
        ask,
        fresh_only: false,
    };
    run_occurrence(ctx, settings, tick, asking).await
}

/// `POST /api/jobs/{job}/run`: one run now, under the overlap policy, its own occurrence (the
/// second it was asked for, by this instance's clock), trigger `manual`.
pub async fn run_now<T: Transport>(ctx: &Context<'_, T>, settings: &Settings) -> TickOutcome {
    let tick = Tick {
        at: ctx.now,
        source: Source::Manual,
        past_due: false,
    };
    let ask = Ask {
        manual: true,
        name_reserver: false,
    };
    let asking = Asking {
        occurrence: unix(ctx.now),
        ask,
        fresh_only: true,
    };
    run_occurrence(ctx, settings, &tick, asking).await
}

/// What a run now answers when its second is an occurrence already.
pub(crate) const RUN_NOW_TAKEN: &str =
    "this second is an occurrence already (a scheduled one, or another run now): ask again in a second";

/// The occurrence a tick runs, and how it was asked.
struct Asking {
    occurrence: u64,
    ask: Ask,
    /// A run now: only a fresh occurrence (one that exists is not touched).
    fresh_only: bool,
}

async fn run_occurrence<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    tick: &Tick,
    asking: Asking,
) -> TickOutcome {
    let Asking {
        occurrence,
        ask,
        fresh_only,
    } = asking;
    let manual = ask.manual;
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let job_transport = (ctx.connect)(settings.timeout);
    // Late: this instance's clock is past the occurrence by more than the tick tolerance.
    let late = ctx.now > at(occurrence) + settings.tick_tolerance(at(occurrence));
    let this = Tick {
        at: at(occurrence),
        source: tick.source,
        past_due: tick.past_due || late,
    };
    // Late with `none`, or older than the catch-up window whatever the policy: not run
    // (recorded missed) unless an admin named it.
    let beyond_window = unix(ctx.now) > occurrence + settings.catch_up_window.as_secs();
    let skip_late = !manual && ((late && settings.catch_up == CatchUp::None) || beyond_window);
    let mut catch_up = CatchUpReport::default();
    let decision = match run_tick(
        ctx,
        &counting,
        &job_transport,
        settings,
        &this,
        occurrence,
        Asked {
            skip_late,
            fresh_only,
            name_reserver: ask.name_reserver,
        },
    )
    .await
    {
        // An operator's run (run now, an admin naming an occurrence) does not catch up: the
        // walk's runs are the scheduler's (paused, they wait), the next scheduled winner's.
        Ok((decision, Some(written))) if manual => {
            let blobs = settings.storage.blobs(&counting);
            if written.clean_up {
                let _ = clean_up(&blobs, settings, written.log.cleaned_before, ctx.now).await;
            }
            Ok(decision)
        }
        Ok((decision, Some(written))) => {
            let blobs = settings.storage.blobs(&counting);
            catch_up = settle_earlier(
                ctx,
                &blobs,
                &job_transport,
                settings,
                &this,
                occurrence,
                &written,
            )
            .await;
            if written.clean_up {
                let _ = clean_up(&blobs, settings, written.log.cleaned_before, ctx.now).await;
            }
            Ok(decision)
        }
        Ok((decision, None)) => Ok(decision),
        Err(e) => {
            if !manual {
                note_failed(ctx.cache, settings, occurrence);
            }
            Err(e)
        }
    };
    TickOutcome {
        occurrence,
        decision,
        round_trips: counting.sent(),
        catch_up,
    }
}

/// Steps 1 and 2 of a tick, then the attempt: performs each step [`plan::next`] names and hands
/// the answer back.
pub(crate) async fn run_tick<T, S: Transport, J: Transport>(
    ctx: &Context<'_, T>,
    storage: &S,
    job: &J,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
    asked: Asked,
) -> Result<(Decision, Option<LogWrite>), JobError> {
    let s = &settings.storage;
    let blobs = BlobClient::new(storage, s.account.clone(), s.container.clone());
    let blob = settings.reservation(occurrence)?;
    let nonce = (ctx.new_lease_id)().to_string();
    let now = ctx.now;
    let knows = plan::Knows {
        settings,
        source: tick.source,
        occurrence,
        blob: &blob,
        now,
        asked,
    };
    let mut a = plan::Answers::default();
    // The longest path reads first, reserves, reads, checks the log and settles: 6 steps.
    for _ in 0..12 {
        match plan::next(&knows, &a) {
            Step::ReadFirst => a.first = Some(head(&blobs, &blob, now).await?),
            Step::Reserve { late } => {
                let by = Reserving {
                    trigger: tick.source.as_str(),
                    late,
                    nonce: &nonce,
                };
                a.reserved = Some(reserve(&blobs, settings, occurrence, &by, now).await?);
            }
            Step::AskFailedHere => {
                a.failed_here = Some(failed_here(ctx.cache, settings, occurrence))
            }
            Step::Read => a.read = Some(head(&blobs, &blob, now).await?),
            Step::CheckLog { reservation, props } => {
                let finished =
                    finished_in_log(ctx, &blobs, settings, occurrence, &reservation, &props);
                a.finished_in_log = Some(finished.await?);
            }
            Step::SettleVanished(vanished) => {
                let settled = settle_vanished(ctx, &blobs, settings, tick, occurrence, &vanished);
                a.settled = Some(settled.await?.map(|e| e.reason.unwrap_or_default()));
            }
            Step::TakeBack(reservation) => {
                take_back(&blobs, &reservation, now).await;
                a.taken_back = true;
            }
            Step::Attempt(run) => return run_reserved(ctx, &blobs, job, settings, tick, run).await,
            Step::Done(decision) => return Ok((decision, None)),
        }
    }
    Err(JobError::Contended(
        "the tick's steps did not come to a decision".into(),
    ))
}

/// Why a tick that found its occurrence reserved already, and did not read the reservation,
/// skipped it.
pub(crate) const RESERVED_ALREADY: &str = "reserved already (by another deployment's tick, or \
     an earlier tick of this one); a tick with {\"nameReserver\": true} names the reserver";

/// The key-value entry (Spin's store `default`, this deployment's) where a tick that failed
/// notes its occurrence: the reservation it may have left (its create's answer lost, its
/// take-back failed too) is this deployment's, and the retry of its 503, on time, reads it to
/// resume it ([`failed_here`]). One entry a job, the latest failure's.
fn failed_tick_key(settings: &Settings) -> String {
    cache::Scope::of(&settings.storage).failed_tick_key(&settings.occurrences_prefix())
}

/// Notes that a tick of `occurrence` failed here (best effort).
pub(crate) fn note_failed(cache: &dyn Cache, settings: &Settings, occurrence: u64) {
    let _ = cache.set(
        &failed_tick_key(settings),
        occurrence.to_string().as_bytes(),
    );
}

/// Whether a tick of `occurrence` failed on this deployment (its latest failure), or the store
/// cannot tell: then a refused create reads the reservation, which may be this deployment's.
fn failed_here(cache: &dyn Cache, settings: &Settings, occurrence: u64) -> bool {
    match cache.get(&failed_tick_key(settings)) {
        Ok(Some(noted)) => noted == occurrence.to_string().as_bytes(),
        Ok(None) => false,
        Err(_) => true,
    }
}

/// The result the log records for an occurrence's attempt whose reservation still says
/// `running` (its runner's last write to the reservation failed, its log update did not):
/// `Some` when the log's entry for `occurrence` is that attempt, finished.
async fn logged_result<S: Transport>(
    blobs: &BlobClient<&S>,
    settings: &Settings,
    occurrence: u64,
    props: &leasegate::ops::BlobProperties,
    now: SystemTime,
) -> Result<Option<RunStatus>, JobError> {
    let attempt = attempt_of(&props.metadata);
    let (log, _, _) = crate::log::read_log(blobs, settings, now).await?;
    Ok(log
        .entries
        .iter()
        .find(|e| {
            e.occurrence_unix == occurrence
                && e.attempt.unwrap_or(1) == attempt
                && e.finished_at.is_some()
                && matches!(e.status, RunStatus::Succeeded | RunStatus::Failed)
        })
        .map(|e| e.status.clone()))
}

/// Before taking over a `running` reservation: if the log says its attempt finished, the
/// reservation is brought in line (the result written over `running`, by compare-and-swap) and
/// `true` is returned: nothing to take over (a failed one may still be retried by the rule).
pub(crate) async fn finished_in_log<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    settings: &Settings,
    occurrence: u64,
    reservation: &Reservation,
    props: &leasegate::ops::BlobProperties,
) -> Result<bool, JobError> {
    if outcome_of(&props.metadata) != Some(RunStatus::Running) {
        return Ok(false);
    }
    let Some(result) = logged_result(blobs, settings, occurrence, props, ctx.now).await? else {
        return Ok(false);
    };
    let attempt = attempt_of(&props.metadata);
    let nonce = (ctx.new_lease_id)().to_string();
    let write = OutcomeWrite {
        outcome: &result,
        attempt,
        over: Over::Attempt(attempt),
        nonce: &nonce,
    };
    let _ = commit(blobs, reservation, &write, ctx.now).await?;
    Ok(true)
}

/// What the job is POSTed: the occurrence, its fencing token and idempotency key, who runs it
/// and why.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JobRequest<'a> {
    job: &'a str,
    occurrence: &'a str,
    occurrence_unix: u64,
    fencing_token: Option<u64>,
    idempotency_key: &'a str,
    instance: &'a str,
    trigger: &'a str,
    past_due: bool,
    attempt: u32,
}

/// POSTs the occurrence to the job; `Err` says why it did not confirm (no URL, no secret).
pub(crate) async fn call_job<J: Transport>(
    job: &J,
    settings: &Settings,
    entry: &LogEntry,
) -> Result<(), String> {
    let key = idempotency_key(&settings.job, entry.occurrence_unix);
    let body = serde_json::to_vec(&JobRequest {
        job: &settings.job,
        occurrence: &entry.occurrence,
        occurrence_unix: entry.occurrence_unix,
        fencing_token: entry.fencing_token,
        idempotency_key: &key,
        instance: &settings.instance_id,
        trigger: &entry.trigger,
        past_due: entry.past_due,
        attempt: entry.attempt.unwrap_or(1),
    })
    .map_err(|e| format!("the job request could not be built: {e}"))?;
    let request = web::json_post(&settings.job_url, &key, body)
        .ok_or_else(|| "the job request could not be built".to_string())?;
    match job.send_for_status(request).await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("the job answered {}", r.status().as_u16())),
        Err(e) if e.kind == TransportErrorKind::Connect => {
            Err(format!("the job is unreachable: {}", e.message))
        }
        Err(e) => Err(format!("the job did not confirm: {}", e.message)),
    }
}

/// The idempotency key of an occurrence's run: the same for any resend of it, another for every
/// other occurrence or job.
pub fn idempotency_key(job: &str, occurrence: u64) -> String {
    let digest = Sha256::new()
        .chain_update(b"leasegate job v1\0")
        .chain_update(job.as_bytes())
        .chain_update(b"\0")
        .chain_update(occurrence.to_string().as_bytes())
        .finalize();
    leasegate_spin::web::hex(&digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reservation::ReservationBody;

    /// Issue 47, item 10: the job's request as docs/timer-functions.md documents it names every
    /// field the job receives (it lacked `attempt`).
    #[test]
    fn the_documented_job_request_has_every_field() {
        let docs = include_str!("../../../../docs/timer-functions.md");
        let line = docs
            .lines()
            .find(|l| l.contains("The run POSTs `{"))
            .expect("the job request's line");
        let documented = line.split("`{").nth(1).and_then(|s| s.split("}`").next());
        let documented: Vec<&str> = documented
            .unwrap_or_default()
            .split(',')
            .map(|f| f.trim().trim_matches('"'))
            .collect();
        let call = serde_json::to_value(JobRequest {
            job: "j",
            occurrence: "o",
            occurrence_unix: 1,
            fencing_token: Some(1),
            idempotency_key: "k",
            instance: "i",
            trigger: "cron",
            past_due: false,
            attempt: 1,
        })
        .unwrap();
        let sent: Vec<&str> = call
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(documented, sent, "docs: {line}");
    }

    #[test]
    fn records_keep_their_field_names() {
        let body = serde_json::to_string(&ReservationBody {
            job: Some("j".into()),
            occurrence: "1970-01-01T00:01:00Z".into(),
            instance: "i".into(),
        })
        .unwrap();
        assert_eq!(
            body,
            r#"{"job":"j","occurrence":"1970-01-01T00:01:00Z","instance":"i"}"#
        );
        let call = serde_json::to_string(&JobRequest {
            job: "j",
            occurrence: "1970-01-01T00:01:00Z",
            occurrence_unix: 60,
            fencing_token: Some(3_932_160),
            idempotency_key: "k",
            instance: "i",
            trigger: "http",
            past_due: false,
            attempt: 1,
        })
        .unwrap();
        assert_eq!(
            call,
            r#"{"job":"j","occurrence":"1970-01-01T00:01:00Z","occurrenceUnix":60,"fencingToken":3932160,"idempotencyKey":"k","instance":"i","trigger":"http","pastDue":false,"attempt":1}"#
        );
    }
}
