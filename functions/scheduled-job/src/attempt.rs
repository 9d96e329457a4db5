//! One attempt of a reserved occurrence, steps 3 to 6 of a tick (`docs/timer-functions.md`,
//! "A tick, step by step"): skip it if settled, take the job's lease, write the outcome
//! `running`, log the start (which issues the token), call the job if its run can end in time,
//! release, record the result; or record why it did not run.

use leasegate::lease::{Acquire, Acquired, IdOrigin, Locks};
use leasegate::ops::{Condition, SetMetadata, WriteOutcome};
use leasegate::BlobClient;
use leasegate::{LockName, Transport};
use leasegate_spin::timer::{Source, Tick};
use leasegate_spin::web::rfc3339;
use leasegate_spin::Context;
use std::time::{Duration, SystemTime};

use crate::error::JobError;
use crate::log::{
    append, read_log_dated, update, Append, KeepLock, LogEntry, LogRefusal, LogWrite, Paused,
};
use crate::reservation::{
    attempt_token, commit, head, label_occurrence, outcome_of, restore, take_back, uncommit,
    Commit, Over, Reservation, RunStatus, META_RESERVED_BY, META_RUN, META_RUN_TICK,
    META_RUN_TOKEN,
};
use crate::run::{call_job, Decision, DUE_GRACE_SECS};
use crate::settings::{term_length, Overlap, Settings};
use crate::{at, unix};

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

/// The decision when the log refused an occurrence's entry.
pub(crate) fn refused_by_log(settings: &Settings, refusal: LogRefusal) -> Decision {
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
