//! A tick, step by step, numbered as in `docs/timer-functions.md` ("A tick, step by step"):
//! 1 reserve, 2 refuse an occurrence out of range, 3 skip one settled already or take the
//! job's lease, 4 write the outcome, 5 log, 6 call the job, then release, record its result,
//! settle earlier occurrences left without an outcome and clean up.

use leasegate::lease::{Acquire, Acquired, IdOrigin, Locks};
use leasegate::ops::{BlobProperties, Condition, SetMetadata, WriteOutcome};
use leasegate::BlobClient;
use leasegate::{Counting, LockName, Transport, TransportErrorKind};
use leasegate_spin::cache::{self, Cache};
use leasegate_spin::timer::{Source, Tick};
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::Context;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime};

use crate::error::JobError;
use crate::log::{
    append, read_log_dated, update, Append, KeepLock, LogEntry, LogRefusal, LogWrite, Paused,
};
use crate::reservation::{
    attempt_of, attempt_token, clean_up, commit, head, label_occurrence, outcome_of, reserve,
    restore, take_back, takeover, uncommit, Commit, Over, Reservation, Reserved, RunStatus,
    Takeover, META_RESERVED_BY, META_RUN, META_RUN_TICK, META_RUN_TOKEN,
};
use crate::settings::{term_length, CatchUp, Overlap, Settings};
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
        /// Why.
        reason: String,
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
        (skip_late, fresh_only, ask.name_reserver),
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
    (skip_late, fresh_only, name_reserver): (bool, bool, bool),
) -> Result<(Decision, Option<LogWrite>), JobError> {
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
            Reserved::Exists if fresh_only => {
                return Ok((
                    Decision::Skipped {
                        reserved_by: None,
                        reason: RUN_NOW_TAKEN.into(),
                    },
                    None,
                ))
            }
            // Reserved already, on time: by another deployment's tick, or by an earlier tick
            // of this one. Its reservation is read only when the read could change the answer
            // (a takeover the tick tolerance leaves room for, an operator's tick) or the caller
            // asked who reserved it; otherwise the refused create is the tick's one request.
            Reserved::Exists
                if !read_when_reserved(settings, tick, name_reserver)
                    && !failed_here(ctx.cache, settings, occurrence) =>
            {
                return Ok((
                    Decision::Skipped {
                        reserved_by: None,
                        reason: RESERVED_ALREADY.into(),
                    },
                    None,
                ))
            }
            Reserved::Exists => Reserve::Found(Box::new(head(&blobs, &blob, ctx.now).await?)),
        },
    };
    let mut attempt = 1;
    let (reserved_at, server_now, reservation) = match reserved {
        Reserve::Created(r, t) => (t, t, r),
        Reserve::Found(found) => {
            let (props, date) = *found;
            let props = props.unwrap_or_default();
            let server_now = date.unwrap_or(ctx.now);
            let reserved_by = props.metadata.get(META_RESERVED_BY).cloned();
            let mine = reserved_by.as_deref() == Some(settings.instance_id.as_str());
            // This instance reserved it on an earlier tick (or another tick of it is at work
            // on it now); or the takeover rule lets any instance act: its reserver left it
            // without an outcome past its deadline, its runner vanished, or its run failed
            // with attempts left. The outcome's compare-and-swap lets one tick act.
            let decided = takeover(&props, server_now, settings, false);
            let r = Reservation {
                blob: blob.clone(),
                etag: props.etag.clone(),
                metadata: props.metadata.clone(),
                created: false,
            };
            if matches!(decided, Takeover::Run { .. } | Takeover::Settle(_))
                && finished_in_log(ctx, &blobs, settings, occurrence, &r, &props).await?
            {
                return Ok((
                    Decision::Skipped {
                        reserved_by,
                        reason: "its run finished (the log says so; its reservation was \
                                 brought in line)"
                            .into(),
                    },
                    None,
                ));
            }
            match decided {
                Takeover::Run { attempt: a } => attempt = a,
                Takeover::No if mine => {}
                Takeover::No => {
                    return Ok((
                        Decision::Skipped {
                            reserved_by,
                            reason: "another instance reserved it".into(),
                        },
                        None,
                    ))
                }
                Takeover::Wait(wait) => {
                    return Ok((
                        Decision::Skipped {
                            reserved_by,
                            reason: format!(
                                "attempt {} failed: attempt {} may start in {} s \
                                 (job_retry_delay_seconds)",
                                attempt_of(&props.metadata),
                                attempt_of(&props.metadata) + 1,
                                wait.as_secs().max(1)
                            ),
                        },
                        None,
                    ))
                }
                Takeover::Settle(status) => {
                    let entry = settle_vanished(
                        ctx, &blobs, settings, tick, occurrence, &r, &props, status, server_now,
                    )
                    .await?;
                    return Ok((
                        Decision::Skipped {
                            reserved_by,
                            reason: match entry {
                                Some(e) => e.reason.unwrap_or_default(),
                                None => "settled by another tick".into(),
                            },
                        },
                        None,
                    ));
                }
            }
            let t = props.last_modified.unwrap_or(ctx.now);
            let r = Reservation {
                blob,
                etag: props.etag,
                metadata: props.metadata,
                created: false,
            };
            (t, date.unwrap_or(ctx.now), r)
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
    run_reserved(
        ctx,
        &blobs,
        job,
        settings,
        tick,
        occurrence,
        (reserved_at, server_now),
        reservation,
        skip_late && attempt == 1,
        attempt,
    )
    .await
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

/// Steps 3 to 6 of [`run_tick`], once the occurrence is reserved and in range. With the
/// decision, the log as the run's end wrote it (`None`: this tick did not run the job).
/// `skip_late`: record the occurrence missed instead of running it (`job_catch_up = none`).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_reserved<T, S: Transport, J: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    job: &J,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
    (reserved_at, server_now): (SystemTime, SystemTime),
    reservation: Reservation,
    skip_late: bool,
    attempt: u32,
) -> Result<(Decision, Option<LogWrite>), JobError> {
    let reserved_by = reservation.metadata.get(META_RESERVED_BY).cloned();
    let settled = |run: &RunStatus| Decision::Skipped {
        reserved_by: reserved_by.clone(),
        reason: if *run == RunStatus::Missed {
            "it was recorded missed: its reserver wrote no outcome by its deadline".into()
        } else if *run == RunStatus::BeforeHistory {
            "it was due before the job's history began (its first tick): not run".into()
        } else if reserved_by.as_deref() == Some(settings.instance_id.as_str()) {
            format!("this instance settled it on an earlier tick ({run})")
        } else {
            format!("it was settled after its reserver's deadline ({run})")
        },
    };
    // 3. A reservation with an outcome already is settled: `skipped` (a later attempt writes
    // over the previous one's, see 4). Otherwise the job's lease (below).
    if attempt == 1 {
        match outcome_of(&reservation.metadata) {
            None | Some(RunStatus::Pending) => {}
            Some(
                RunStatus::Missed
                | RunStatus::SkippedPaused
                | RunStatus::SkippedOverlap
                | RunStatus::BeforeHistory,
            ) if tick.source == Source::Backfill => {}
            Some(RunStatus::Missed) if tick.source == Source::Rerun => {}
            Some(run) => return Ok((settled(&run), None)),
        }
    }
    // A backfill runs an occurrence that never ran (none, `missed`, `skipped_*`); a rerun's
    // first attempt, one recorded `missed`.
    let never_ran =
        tick.source == Source::Backfill || (tick.source == Source::Rerun && attempt == 1);
    let over = if never_ran {
        Over::NeverRan
    } else if attempt > 1 {
        Over::Attempt(attempt - 1)
    } else {
        Over::Nothing
    };
    let token = attempt_token(occurrence, attempt)?;
    let mut entry = LogEntry {
        occurrence: rfc3339(at(occurrence)),
        occurrence_unix: occurrence,
        instance: settings.instance_id.clone(),
        reserved_at: rfc3339(reserved_at),
        status: RunStatus::Running,
        fencing_token: Some(token),
        trigger: tick.source.as_str().into(),
        past_due: tick.past_due,
        finished_at: None,
        reason: None,
        attempt: Some(attempt),
    };
    let nonce = (ctx.new_lease_id)().to_string();
    // `job_catch_up = none` and the tick is late: recorded missed (its outcome, then the log).
    if skip_late {
        entry.status = RunStatus::Missed;
        entry.fencing_token = None;
        entry.finished_at = Some(rfc3339(server_now));
        let late_by = unix(ctx.now).saturating_sub(occurrence);
        entry.reason = Some(if late_by > settings.catch_up_window.as_secs() {
            format!(
                "ticked {late_by} s late, beyond job_catch_up_window_seconds ({} s): not run",
                settings.catch_up_window.as_secs()
            )
        } else {
            format!("ticked {late_by} s late and job_catch_up is none: not run")
        });
        return Ok(
            match record_not_run(blobs, settings, &reservation, &entry, &nonce, None, ctx.now)
                .await?
            {
                Err(NotRecorded::Settled(run)) => (settled(&run), None),
                Err(NotRecorded::Refused(refusal)) => (refused_by_log(settings, refusal), None),
                Ok(()) => (Decision::Missed { entry }, None),
            },
        );
    }
    // Still 3: the job's lease (skip: one run at a time), labelled with the instance and the
    // occurrence, so that a tick finding its own occurrence's run in it leaves that run alone.
    let job_locks =
        Locks::from_client(blobs.clone()).with_prefix(&format!("jobs/{}/", settings.job));
    let lock_name = LockName::try_new("lock")?;
    let label = format!("{} {occurrence}", settings.instance_id);
    let lease_id = (ctx.new_lease_id)();
    // A storage failure before the outcome `running` is written takes back the reservation
    // this tick created (at the ETag its create left: untouched since), so that a retry of
    // the tick's 503 reserves the occurrence afresh and runs it. (Where the take-back fails
    // too, the retry finds the reservation: `read_when_reserved` reads it after a failed tick
    // of this deployment.)
    let failed = |e: JobError| {
        let reservation = &reservation;
        async move {
            if reservation.created {
                take_back(blobs, reservation, ctx.now).await;
            }
            e
        }
    };
    // The log first, when there is a lease to take: the job's lease as the latest run's claim
    // left it is kept there, and the lease is acquired from it without a read of its own (a
    // lock blob written since costs the refused request and a read; a 409 tells whose it is).
    // The log's own write below starts from this read. Its `Date` dates the kept state (none:
    // the lease is acquired with a read first).
    let (prefetched, dated) = match settings.overlap {
        Overlap::Allow => (None, None),
        Overlap::Skip | Overlap::BufferOne => {
            match read_log_dated(blobs, settings, ctx.now).await {
                Ok((log, etag, date)) => (
                    Some(LogWrite::read(log, etag, date.unwrap_or(ctx.now))),
                    date,
                ),
                Err(e) => return Err(failed(e).await),
            }
        }
    };
    let kept = prefetched
        .as_ref()
        .and_then(|p| Some((p.kept_lock()?, dated?)));
    let take = |kept| {
        job_locks.acquire_from_kept(
            kept,
            &lock_name,
            settings.lease_term,
            lease_id,
            IdOrigin::Fresh,
            &label,
            ctx.now,
        )
    };
    let acquired = match settings.overlap {
        Overlap::Allow => None,
        Overlap::Skip | Overlap::BufferOne => {
            match take(kept.as_ref().map(|(kept, date)| (kept, *date))).await {
                // A lost answer or a 5xx: the core gave back what storage may have granted (a
                // fresh id's rule); taken once more, from a read, before the tick gives up.
                Err(e) if e.outcome_unknown() => Some(take(None).await),
                taken => Some(taken),
            }
        }
    };
    let held = match acquired {
        None => None,
        Some(Err(e)) => return Err(failed(e.into()).await),
        Some(Ok(acquired)) => match acquired {
            Acquire::Acquired(held) => Some(held),
            // A later attempt that finds any run in the lease waits for it (a retry never records
            // a skip): not settled, a later tick retries.
            Acquire::Busy { retry_after, .. } if attempt > 1 => {
                let wait = retry_after.unwrap_or(term_length(settings.lease_term));
                return Ok((
                    Decision::InProgress {
                        retry_after: wait.max(Duration::from_secs(1)),
                    },
                    None,
                ));
            }
            Acquire::Busy {
                holder: Some(h), ..
            } if label_occurrence(&h.label) != Some(occurrence) => {
                // Buffered already: it waits for the run going to end.
                if outcome_of(&reservation.metadata) == Some(RunStatus::Pending) {
                    return Ok((
                        Decision::Skipped {
                            reserved_by: reserved_by.clone(),
                            reason: "it is buffered (job_overlap = buffer_one): it runs when \
                                     the previous run ends"
                                .into(),
                        },
                        None,
                    ));
                }
                // Another occurrence's run: this occurrence is skipped, once, but only once it
                // is due (by the storage server's clock, give or take its second): a tick ahead
                // of it records nothing, and a tick once it is due decides.
                let due_in = occurrence.saturating_sub(unix(server_now));
                if due_in > DUE_GRACE_SECS {
                    if reservation.created {
                        take_back(blobs, &reservation, ctx.now).await;
                    }
                    return Ok((
                        Decision::NotDue {
                            retry_after: Duration::from_secs(due_in),
                        },
                        None,
                    ));
                }
                if settings.overlap == Overlap::BufferOne {
                    return buffer(
                        ctx,
                        blobs,
                        settings,
                        entry,
                        (&reservation, prefetched),
                        &nonce,
                        &h.label,
                    )
                    .await;
                }
                entry.status = RunStatus::SkippedOverlap;
                entry.fencing_token = None;
                entry.reason = Some("the previous run still holds the job's lease".into());
                let recorded = record_not_run(
                    blobs,
                    settings,
                    &reservation,
                    &entry,
                    &nonce,
                    prefetched,
                    ctx.now,
                )
                .await?;
                return Ok(match recorded {
                    Err(NotRecorded::Settled(run)) => (settled(&run), None),
                    Err(NotRecorded::Refused(refusal)) => (refused_by_log(settings, refusal), None),
                    Ok(()) => (Decision::Overlapped { entry }, None),
                });
            }
            Acquire::Busy { retry_after, .. } => {
                // This occurrence's lease (or one with no claim yet): settled only if the
                // reservation now shows an outcome. Else its holder may be dead (its outcome
                // write and its release failed): not settled, retried once the lease ends.
                let (props, _) = head(blobs, &reservation.blob, ctx.now).await?;
                if let Some(run) = props.as_ref().and_then(|p| outcome_of(&p.metadata)) {
                    return Ok((settled(&run), None));
                }
                // A reservation this tick created is taken back (at its create's ETag): the
                // retry reserves afresh, and no reservation without an outcome is left where
                // no walk may look (an occurrence before the job's history).
                if reservation.created {
                    take_back(blobs, &reservation, ctx.now).await;
                }
                let wait = retry_after.unwrap_or(term_length(settings.lease_term));
                return Ok((
                    Decision::InProgress {
                        retry_after: wait.max(Duration::from_secs(1)),
                    },
                    None,
                ));
            }
        },
    };
    // The holder's own release: at the ETag its acquire left, no read first. With the lease
    // as the release left it (a record cleared at a new ETag), for the log to keep: the next
    // run takes it from there with one write.
    let release = || {
        let (job_locks, lock_name, held) = (&job_locks, &lock_name, &held);
        async move {
            let held = held.as_ref()?;
            job_locks
                .release_keeping(lock_name, held, ctx.now)
                .await
                .ok()?
                .1
        }
    };
    // 4. The outcome "running" on the reservation: the one tick that writes it runs the job.
    let running = RunStatus::Running;
    let written = match commit(
        blobs,
        &reservation,
        &running,
        &nonce,
        (attempt, over),
        ctx.now,
    )
    .await
    {
        Ok(Commit::Written(w)) => w,
        Ok(Commit::Settled(run)) => {
            release().await;
            return Ok((settled(&run), None));
        }
        Err(e) => {
            release().await;
            return Err(failed(e).await);
        }
    };
    // 5. Log the run before it starts, so a run that never ends still shows; the log refuses an
    // occurrence below its clean-up watermark. Either refusal, or a storage failure, undoes
    // the outcome: the job was not called, and a later tick decides afresh.
    let kept_lock = held.as_ref().and_then(Acquired::held_state);
    // The job's lease as the log kept it when this tick read it.
    let read_lock = prefetched.as_ref().map(|p| p.log.lock.clone());
    let keep = kept_lock
        .as_ref()
        .map(|state| KeepLock { state, over: None });
    let started_log = match append(
        blobs,
        settings,
        &entry,
        Append::from(prefetched, keep, &reservation),
        ctx.now,
    )
    .await
    {
        Ok(Ok(written)) => written,
        // Paused: not run; the outcome becomes `skipped_paused` (over this tick's `running`).
        // A retry is not an occurrence of its own: the previous attempt's `failed` is put back
        // and the retry waits for the resume.
        Ok(Err(LogRefusal::Paused(_))) if attempt > 1 => {
            uncommit(blobs, &reservation, &written, ctx.now).await;
            release().await;
            return Ok((
                Decision::Skipped {
                    reserved_by,
                    reason: format!(
                        "the job is paused: attempt {attempt} waits for POST /api/jobs/{}/resume",
                        settings.job
                    ),
                },
                None,
            ));
        }
        Ok(Err(LogRefusal::Paused(paused))) => {
            // Kept in place of the state this tick acquired from, as read: a run that took the
            // lease since has kept a newer one.
            let left = release().await;
            let keep = left.as_ref().or(kept_lock.as_ref()).map(|state| KeepLock {
                state,
                over: Some(read_lock.flatten()),
            });
            return skip_paused(ctx, blobs, settings, entry, (&written, keep), &paused).await;
        }
        // Storage failed and the log may hold the run's start (a lost answer the read back
        // could not settle): the reservation is put back as it was before the outcome, never
        // deleted, for the takeover rule to settle with the log.
        Err(e) => {
            restore(blobs, &reservation, &written, ctx.now).await;
            release().await;
            return Err(e);
        }
        Ok(Err(refusal)) => {
            undo(blobs, (&reservation, &written), &refusal, ctx.now).await;
            release().await;
            return Ok((refused_by_log(settings, refusal), None));
        }
    };
    // 6. Call the job, release its lease, then record the result in the log (raising the
    // clean-up watermark) and on the reservation, settle earlier occurrences and clean up below
    // the watermark. The release goes first: the log keeps the lease as the release left it
    // (a record cleared at a new ETag), and the next run acquires from it with one write.
    // The job is called only if its run can end within the job's lease and the run's deadline
    // (when other ticks take it for vanished), by the storage server's clock: slow storage
    // before the call (retried writes, lost answers read back) must not let it outlive them.
    if let Err(slow) = time_left(settings, held.as_ref(), server_now, started_log.date) {
        restore(blobs, &reservation, &written, ctx.now).await;
        release().await;
        return Err(slow);
    }
    // The token the log's compare-and-swap issued: above every earlier run's.
    entry.fencing_token = started_log.log.token_of(occurrence).or(entry.fencing_token);
    let result = call_job(job, settings, &entry).await;
    let (status, reason) = match &result {
        Ok(()) => (RunStatus::Succeeded, None),
        Err(reason) => (RunStatus::Failed, Some(reason.clone())),
    };
    entry.status = status.clone();
    entry.reason = reason;
    let left = release().await;
    let started_lock = started_log.log.lock.clone();
    let keep = left.as_ref().map(|state| KeepLock {
        state,
        over: Some(started_lock),
    });
    // The log first (a takeover reads it before acting), then the reservation.
    let finished = update(blobs, settings, &entry, (Some(started_log), keep), ctx.now).await;
    record_result(
        blobs,
        &written,
        (&status, entry.fencing_token),
        &nonce,
        ctx.now,
    )
    .await;
    let log = match finished {
        Ok(written) => {
            // The end as the log records it, to the answer (the same instant).
            entry.finished_at = written
                .log
                .entries
                .iter()
                .find(|e| e.occurrence_unix == occurrence)
                .and_then(|e| e.finished_at.clone())
                .or_else(|| Some(rfc3339(written.date)));
            Some(written)
        }
        Err(_) => None,
    };
    let decision = match result {
        Ok(()) => Decision::Ran { entry },
        Err(_) => Decision::JobFailed { entry },
    };
    Ok((decision, log))
}

/// What a run's call needs ahead of it beyond the job's timeout: `Date` is whole seconds, and
/// the call leaves a moment after the log's answer.
const CALL_MARGIN: Duration = Duration::from_secs(2);

/// `Ok` if a run whose log entry was written at `logged` (the write's `Date`) can still end
/// within the job's lease (`held`, none with `job_overlap = allow`) and within the run's
/// deadline, counted from `reserved` (the reservation's time as this tick read or wrote it,
/// at or before its outcome `running`, so the deadline is never later than the one other
/// ticks count), all by the storage server's clock, with the job's timeout and a margin to
/// spare. Else the error the tick answers: the job is not called.
fn time_left(
    settings: &Settings,
    held: Option<&Acquired>,
    reserved: SystemTime,
    logged: SystemTime,
) -> Result<(), JobError> {
    let deadline = reserved + settings.run_deadline();
    let ends = held
        .and_then(|h| h.expires_at)
        .map_or(deadline, |lease| lease.min(deadline));
    let left = ends.duration_since(logged).unwrap_or_default();
    if left >= settings.timeout + CALL_MARGIN {
        return Ok(());
    }
    Err(JobError::Slow(format!(
        "storage was slow before the job's call: the job's lease or its run's deadline has {} s \
         left, less than job_timeout_seconds ({} s) and {} s, so the run could outlive it; the \
         reservation was put back as it was",
        left.as_secs(),
        settings.timeout.as_secs(),
        CALL_MARGIN.as_secs()
    )))
}

/// `job_overlap = buffer_one`: the previous run (`holder`) holds the job's lease when this
/// occurrence is due. It is kept `pending` (on its reservation and in the log) for the first
/// tick after that run ends; if another occurrence is pending already, it is skipped
/// (`skipped_overlap`) instead: one buffered at most.
async fn buffer<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    settings: &Settings,
    mut entry: LogEntry,
    (reservation, known): (&Reservation, Option<LogWrite>),
    nonce: &str,
    holder: &str,
) -> Result<(Decision, Option<LogWrite>), JobError> {
    let running = label_occurrence(holder)
        .map(|o| rfc3339(at(o)))
        .unwrap_or_default();
    entry.status = RunStatus::Pending;
    // No run, no token: the run that takes it up later is issued one.
    entry.fencing_token = None;
    entry.reason = Some(format!(
        "the previous run (occurrence {running}) still holds the job's lease: it runs when that \
         run ends (job_overlap = buffer_one)"
    ));
    let written = match commit(
        blobs,
        reservation,
        &entry.status,
        nonce,
        (1, Over::Nothing),
        ctx.now,
    )
    .await?
    {
        Commit::Settled(run) => {
            return Ok((
                Decision::Skipped {
                    reserved_by: reservation.metadata.get(META_RESERVED_BY).cloned(),
                    reason: format!("it was settled by another tick ({run})"),
                },
                None,
            ))
        }
        Commit::Written(w) => w,
    };
    match append(
        blobs,
        settings,
        &entry,
        Append::from(known, None, reservation),
        ctx.now,
    )
    .await
    {
        Ok(Ok(_)) => Ok((Decision::Buffered { entry }, None)),
        // The log must know what is buffered (one at most): undone, a later tick decides. The
        // reservation is put back, not deleted (the log may hold the entry).
        Err(e) => {
            restore(blobs, reservation, &written, ctx.now).await;
            Err(e)
        }
        Ok(Err(LogRefusal::Buffered(other))) => {
            // One is buffered already: this one is skipped (over this tick's `pending`).
            overwrite_outcome(blobs, &written, &RunStatus::SkippedOverlap, ctx.now).await?;
            entry.status = RunStatus::SkippedOverlap;
            entry.reason = Some(format!(
                "the previous run (occurrence {running}) still holds the job's lease and \
                 occurrence {} is buffered already (job_overlap = buffer_one keeps one)",
                rfc3339(at(other))
            ));
            let _ = append(
                blobs,
                settings,
                &entry,
                Append::from(None, None, reservation),
                ctx.now,
            )
            .await;
            Ok((Decision::Overlapped { entry }, None))
        }
        Ok(Err(refusal)) => {
            undo(blobs, (reservation, &written), &refusal, ctx.now).await;
            Ok((refused_by_log(settings, refusal), None))
        }
    }
}

/// Why [`record_not_run`] recorded nothing.
enum NotRecorded {
    /// Another tick wrote an outcome first: this one.
    Settled(RunStatus),
    /// The log refused the entry (the outcome was undone).
    Refused(LogRefusal),
}

/// Records an outcome that is not a run (`entry.status`: `missed`, `skipped_overlap`) on the
/// reservation by compare-and-swap, then in the log; a log refusal undoes the outcome. The
/// reservation holds the outcome: a log write that fails leaves it recorded there.
async fn record_not_run<S: Transport>(
    blobs: &BlobClient<&S>,
    settings: &Settings,
    reservation: &Reservation,
    entry: &LogEntry,
    nonce: &str,
    known: Option<LogWrite>,
    now: SystemTime,
) -> Result<Result<(), NotRecorded>, JobError> {
    let written = match commit(
        blobs,
        reservation,
        &entry.status,
        nonce,
        (1, Over::Nothing),
        now,
    )
    .await?
    {
        Commit::Settled(run) => return Ok(Err(NotRecorded::Settled(run))),
        Commit::Written(w) => w,
    };
    match append(
        blobs,
        settings,
        entry,
        Append::from(known, None, reservation),
        now,
    )
    .await
    {
        // At or below the watermark with no entry: a winner counted the occurrence settled,
        // perhaps by this very outcome on its reservation. The outcome stays (it is the record;
        // undoing it would lose the occurrence).
        Ok(Err(LogRefusal::Settled)) => Ok(Ok(())),
        Ok(Err(refusal)) => {
            undo(blobs, (reservation, &written), &refusal, now).await;
            Ok(Err(NotRecorded::Refused(refusal)))
        }
        Ok(Ok(_)) | Err(_) => Ok(Ok(())),
    }
}

/// Records an occurrence of a paused job `skipped_paused`: on its reservation (over the outcome
/// `running` this tick wrote, which called nothing) and in the log, with the job's lease as
/// this tick's release left it (`lock`; as its acquire left it if the release failed), for the
/// next tick.
async fn skip_paused<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    settings: &Settings,
    mut entry: LogEntry,
    (written, lock): (&Reservation, Option<KeepLock<'_>>),
    paused: &Paused,
) -> Result<(Decision, Option<LogWrite>), JobError> {
    overwrite_outcome(blobs, written, &RunStatus::SkippedPaused, ctx.now).await?;
    entry.status = RunStatus::SkippedPaused;
    entry.fencing_token = None;
    entry.attempt = None;
    entry.reason = Some(format!(
        "the job is paused since {}{}",
        paused.since,
        paused
            .note
            .as_deref()
            .map(|n| format!(": {n}"))
            .unwrap_or_default()
    ));
    let _ = append(
        blobs,
        settings,
        &entry,
        Append::from(None, lock, written),
        ctx.now,
    )
    .await?;
    Ok((Decision::Paused { entry }, None))
}

/// Undoes this tick's outcome after the log refused its entry: taken back
/// ([`crate::reservation::uncommit`]), except for an occurrence due before the job's history,
/// whose reservation is marked `before_history` (not recorded missed anywhere): a later tick
/// of it, late, stops at the read it makes first. Best effort.
async fn undo<S: Transport>(
    blobs: &BlobClient<&S>,
    (reservation, written): (&Reservation, &Reservation),
    refusal: &LogRefusal,
    now: SystemTime,
) {
    if let LogRefusal::BeforeHistory(_) = refusal {
        if let Ok(true) = overwrite_outcome(blobs, written, &RunStatus::BeforeHistory, now).await {
            return;
        }
    }
    uncommit(blobs, reservation, written, now).await;
}

/// Writes `status` over the outcome this tick wrote (`written`), by compare-and-swap: a
/// `running` or `pending` that called nothing becomes `skipped_paused` or `skipped_overlap`.
/// `Ok(false)`: refused (the reservation changed since).
async fn overwrite_outcome<S: Transport>(
    blobs: &BlobClient<&S>,
    written: &Reservation,
    status: &RunStatus,
    now: SystemTime,
) -> Result<bool, leasegate::Error> {
    let Some(etag) = written.etag.clone() else {
        return Ok(false);
    };
    let mut metadata = written.metadata.clone();
    metadata.insert(META_RUN.into(), status.to_string());
    let write = SetMetadata {
        container: blobs.container().clone(),
        blob: written.blob.clone(),
        metadata,
        lease_id: None,
        condition: Condition::IfMatch(etag),
    };
    let (outcome, _) = blobs.execute(&write, now).await?;
    Ok(matches!(outcome, WriteOutcome::Written(_)))
}

/// Writes a run's result (and its fencing token) over its own `running` (the reservation as
/// this tick wrote it, its `nonce`), retried after a failure or a lost answer while the reservation still holds this
/// tick's `running`: a result left unwritten would look like a vanished runner to the takeover
/// rule. Should every try fail, the log still records the result and the takeover rule reads it
/// there ([`logged_result`]).
async fn record_result<S: Transport>(
    blobs: &BlobClient<&S>,
    written: &Reservation,
    (status, token): (&RunStatus, Option<u64>),
    nonce: &str,
    now: SystemTime,
) {
    let mut seen = written.clone();
    for _ in 0..3 {
        if let Some(token) = token {
            seen.metadata
                .insert(META_RUN_TOKEN.into(), token.to_string());
        }
        if seen.etag.is_none()
            || matches!(overwrite_outcome(blobs, &seen, status, now).await, Ok(true))
        {
            return;
        }
        // Failed, refused or lost: read it back; go on only while it is this tick's `running`.
        let Ok((Some(props), _)) = head(blobs, &seen.blob, now).await else {
            continue;
        };
        let mine = props.metadata.get(META_RUN_TICK).map(String::as_str) == Some(nonce);
        if !mine || outcome_of(&props.metadata) != Some(RunStatus::Running) {
            return;
        }
        seen.etag = props.etag;
        seen.metadata = props.metadata;
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

/// The decision when the log refused an occurrence's entry.
fn refused_by_log(settings: &Settings, refusal: LogRefusal) -> Decision {
    match refusal {
        LogRefusal::TooOld => Decision::TooOld {
            retention: settings.retention,
        },
        LogRefusal::Settled => Decision::Skipped {
            reserved_by: None,
            reason: "it was recorded missed: no deployment ticked it in time".into(),
        },
        // Handled where the run is decided (recorded `skipped_overlap`).
        LogRefusal::Buffered(_) => Decision::Skipped {
            reserved_by: None,
            reason: "another occurrence is buffered".into(),
        },
        // Handled where the run is decided (recorded `skipped_paused`).
        LogRefusal::Paused(_) => Decision::Skipped {
            reserved_by: None,
            reason: "the job is paused".into(),
        },
        LogRefusal::BeforeHistory(from) => Decision::Skipped {
            reserved_by: None,
            reason: format!(
                "it was due before the job's history began ({}, its first tick, less the tick \
                 tolerance): not run, not recorded missed; POST /api/jobs/{}/backfill with \
                 \"beforeHistory\": true runs it on purpose",
                rfc3339(at(from)),
                settings.job
            ),
        },
        LogRefusal::Finished(run) => Decision::Skipped {
            reserved_by: None,
            reason: format!(
                "another tick settled this attempt while this one was at work ({run}): not run"
            ),
        },
    }
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
            job: "j".into(),
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
