//! A tick, step by step, numbered as in `docs/timer-functions.md` ("A tick, step by step"):
//! 1 reserve, 2 refuse an occurrence out of range, 3 skip one settled already or take the
//! job's lease, 4 write the outcome, 5 log, 6 call the job, then release, record its result,
//! settle earlier occurrences left without an outcome and clean up.

use leasegate::ops::BlobProperties;
use leasegate::BlobClient;
use leasegate::{Counting, Transport, TransportErrorKind};
use leasegate_spin::cache::{self, Cache};
use leasegate_spin::timer::{Source, Tick};
use leasegate_spin::web::{self};
use leasegate_spin::Context;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime};

use crate::attempt::skip::Skip;
use crate::attempt::{run_reserved, ReservedRun};
use crate::error::JobError;
use crate::log::{LogEntry, LogWrite};
use crate::reservation::{
    attempt_of, clean_up, commit, head, outcome_of, reserve, take_back, takeover, Over,
    Reservation, Reserved, RunStatus, Takeover, META_RESERVED_BY,
};
use crate::settings::{CatchUp, Overlap, Settings};
use crate::walk::{settle_earlier, settle_vanished, CatchUpReport};
use crate::{at, unix};

/// A tick may write `skipped_overlap` on an occurrence at most this far ahead of the storage
/// server's clock (its `Date` is whole seconds, so an occurrence due within the second reads
/// one second ahead).
pub(crate) const DUE_GRACE_SECS: u64 = 1;

/// What a tick came to.
#[derive(Debug)]
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
    run_occurrence(ctx, settings, tick, occurrence, (ask, false)).await
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
    run_occurrence(ctx, settings, &tick, unix(ctx.now), (ask, true)).await
}

/// What a run now answers when its second is an occurrence already.
pub(crate) const RUN_NOW_TAKEN: &str =
    "this second is an occurrence already (a scheduled one, or another run now): ask again in a second";

async fn run_occurrence<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
    (ask, fresh_only): (Ask, bool),
) -> TickOutcome {
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

pub(crate) async fn run_tick<T, S: Transport, J: Transport>(
    ctx: &Context<'_, T>,
    storage: &S,
    job: &J,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
    asked: Asked,
) -> Result<(Decision, Option<LogWrite>), JobError> {
    let Asked {
        skip_late,
        fresh_only,
        name_reserver,
    } = asked;
    let s = &settings.storage;
    let blobs = BlobClient::new(storage, s.account.clone(), s.container.clone());
    let blob = settings.reservation(occurrence)?;
    // 1. Reserve.
    let nonce = (ctx.new_lease_id)().to_string();
    // A tick later than the tick tolerance names an occurrence that is most likely reserved
    // already (every tick between two occurrences, when the trigger is more frequent than the
    // schedule): its reservation is read first, one request where a refused create and the
    // read are two. A reservation the read does not find is created as on time (one request
    // more, for an occurrence no deployment ticked on time).
    let late = ctx.now > at(occurrence) + settings.tick_tolerance(at(occurrence));
    let found = if late && !fresh_only {
        match head(&blobs, &blob, ctx.now).await? {
            (Some(props), date) => Some((Some(props), date)),
            (None, _) => None,
        }
    } else {
        None
    };
    let reserved = match found {
        Some(found) => Reserve::Found(Box::new(found)),
        None => match reserve(
            &blobs,
            settings,
            occurrence,
            (tick.source.as_str(), late),
            &nonce,
            ctx.now,
        )
        .await?
        {
            Reserved::Created(r, at) => Reserve::Created(r, at),
            // A run now is an occurrence of its own: one that exists (a scheduled one at this
            // second, another run now) is not touched.
            Reserved::Exists if fresh_only => return Ok((Skip::RunNowTaken.decision(None), None)),
            // Reserved already, on time: by another deployment's tick, or by an earlier tick
            // of this one. Its reservation is read only when the read could change the answer
            // (a takeover the tick tolerance leaves room for, an operator's tick) or the caller
            // asked who reserved it; otherwise the refused create is the tick's one request.
            Reserved::Exists
                if !read_when_reserved(settings, tick, name_reserver)
                    && !failed_here(ctx.cache, settings, occurrence) =>
            {
                return Ok((Skip::ReservedAlready.decision(None), None))
            }
            Reserved::Exists => Reserve::Found(Box::new(head(&blobs, &blob, ctx.now).await?)),
        },
    };
    let (reserved_at, server_now, reservation, attempt) = match reserved {
        Reserve::Created(r, t) => (t, t, r, 1),
        Reserve::Found(found) => {
            let (props, date) = *found;
            match found_reserved(ctx, &blobs, settings, tick, occurrence, props, date).await? {
                Ok(found) => found,
                Err(decision) => return Ok((decision, None)),
            }
        }
    };
    // 2. Occurrences too far from the storage server's clock are refused, every time: the
    // reservation this tick made is taken back.
    let refusal = if unix(server_now).saturating_sub(settings.retention.as_secs()) > occurrence {
        Some(Decision::TooOld {
            retention: settings.retention,
        })
    } else if occurrence > unix(server_now).saturating_add(settings.early.as_secs()) {
        Some(Decision::TooEarly {
            early: settings.early,
        })
    } else {
        None
    };
    if let Some(refusal) = refusal {
        if reservation.created {
            take_back(&blobs, &reservation, ctx.now).await;
        }
        return Ok((refusal, None));
    }
    let run = ReservedRun {
        occurrence,
        reserved_at,
        server_now,
        reservation,
        skip_late: skip_late && attempt == 1,
        attempt,
    };
    run_reserved(ctx, &blobs, job, settings, tick, run).await
}

/// Step 1's end for a reservation that exists (read, or refused and then read): the takeover
/// rule says whether this tick acts, and on which attempt. `Ok(Err)`: the decision, nothing
/// more to do.
async fn found_reserved<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
    props: Option<BlobProperties>,
    date: Option<SystemTime>,
) -> Result<Result<(SystemTime, SystemTime, Reservation, u32), Decision>, JobError> {
    let props = props.unwrap_or_default();
    let server_now = date.unwrap_or(ctx.now);
    let reserved_by = props.metadata.get(META_RESERVED_BY).cloned();
    let mine = reserved_by.as_deref() == Some(settings.instance_id.as_str());
    let skipped = |skip: Skip| Ok(Err(skip.decision(reserved_by.clone())));
    // This instance reserved it on an earlier tick (or another tick of it is at work on it
    // now); or the takeover rule lets any instance act: its reserver left it without an
    // outcome past its deadline, its runner vanished, or its run failed with attempts left.
    // The outcome's compare-and-swap lets one tick act.
    let decided = takeover(&props, server_now, settings, false);
    let r = Reservation {
        blob: settings.reservation(occurrence)?,
        etag: props.etag.clone(),
        metadata: props.metadata.clone(),
        created: false,
    };
    if matches!(decided, Takeover::Run { .. } | Takeover::Settle(_))
        && finished_in_log(ctx, blobs, settings, occurrence, &r, &props).await?
    {
        return skipped(Skip::FinishedInLog);
    }
    let attempt = match decided {
        Takeover::Run { attempt } => attempt,
        Takeover::No if mine => 1,
        Takeover::No => return skipped(Skip::ReservedByOther),
        Takeover::Wait(wait) => {
            let failed = attempt_of(&props.metadata);
            return skipped(Skip::RetryWait {
                failed,
                wait_secs: wait.as_secs(),
            });
        }
        Takeover::Settle(status) => {
            let entry = settle_vanished(
                ctx, blobs, settings, tick, occurrence, &r, &props, status, server_now,
            )
            .await?;
            return skipped(match entry {
                Some(e) => Skip::Logged(e.reason.unwrap_or_default()),
                None => Skip::SettledElsewhere,
            });
        }
    };
    let reserved_at = props.last_modified.unwrap_or(ctx.now);
    Ok(Ok((reserved_at, server_now, r, attempt)))
}

/// Why a tick that found its occurrence reserved already, and did not read the reservation,
/// skipped it.
pub(crate) const RESERVED_ALREADY: &str = "reserved already (by another deployment's tick, or \
     an earlier tick of this one); a tick with {\"nameReserver\": true} names the reserver";

/// Whether a tick whose create of the reservation was refused reads the reservation (one
/// request more): when the caller asked who reserved it, when an operator ticked it (a manual
/// tick acts on what it finds), and when a takeover could be due within the tick tolerance: a
/// buffered occurrence waiting for the previous run to end (`job_overlap = buffer_one`) or a
/// failed attempt waiting for its retry (`job_retries`). A tick later than the tolerance reads
/// first anyway. An on-time tick otherwise leaves a reserver that vanished to the takeover rule
/// of the later ticks (docs/timer-functions.md).
fn read_when_reserved(settings: &Settings, tick: &Tick, name_reserver: bool) -> bool {
    name_reserver
        || matches!(tick.source, Source::Manual | Source::Backfill)
        || settings.overlap == Overlap::BufferOne
        || settings.retries > 0
}

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

/// How [`run_tick`] found the occurrence's reservation.
enum Reserve {
    /// This tick created it: as written, and the storage server's time of the write.
    Created(Reservation, SystemTime),
    /// It exists (its properties as read, `None` if it vanished since the create was refused),
    /// and the read's `Date`.
    Found(Box<(Option<BlobProperties>, Option<SystemTime>)>),
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
    let _ = commit(
        blobs,
        reservation,
        &result,
        &nonce,
        (attempt, Over::Attempt(attempt)),
        ctx.now,
    )
    .await?;
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
        let docs = include_str!("../../../docs/timer-functions.md");
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
