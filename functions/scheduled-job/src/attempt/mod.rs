//! One attempt of a reserved occurrence, steps 3 to 6 of a tick (`docs/timer-functions.md`,
//! "A tick, step by step"): skip it if settled, take the job's lease, write the outcome
//! `running`, log the start (which issues the token), call the job if its run can end in time,
//! release, record the result; or record why it did not run.

use leasegate::lease::{Acquire, Acquired, Acquiring, IdOrigin, Locks, Start};
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
use skip::Skip;

/// An occurrence reserved and in range, as a tick (or a backfill, or a rerun) hands it on.
pub(crate) struct ReservedRun {
    /// The occurrence (Unix seconds).
    pub(crate) occurrence: u64,
    /// When it was reserved, by this instance's clock.
    pub(crate) reserved_at: SystemTime,
    /// The storage server's clock then (its `Date`).
    pub(crate) server_now: SystemTime,
    /// The reservation as written or read.
    pub(crate) reservation: Reservation,
    /// Record it missed instead of running it (late, `job_catch_up = none`).
    pub(crate) skip_late: bool,
    /// The attempt (1 unless a retry).
    pub(crate) attempt: u32,
}

/// Steps 3 to 6 of a tick, once the occurrence is reserved and in range. With the decision,
/// the log as the run's end wrote it (`None`: this tick did not run the job).
pub(crate) async fn run_reserved<T, S: Transport, J: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    job: &J,
    settings: &Settings,
    tick: &Tick,
    run: ReservedRun,
) -> Result<(Decision, Option<LogWrite>), JobError> {
    let ReservedRun {
        occurrence,
        reserved_at,
        server_now,
        reservation,
        skip_late,
        attempt,
    } = run;
    let a = Attempt {
        ctx,
        blobs,
        settings,
        tick,
        occurrence,
        server_now,
        reserved_by: reservation.metadata.get(META_RESERVED_BY).cloned(),
        reservation,
        attempt,
        nonce: (ctx.new_lease_id)().to_string(),
    };
    // 3. A reservation with an outcome already is settled: `skipped` (a later attempt writes
    // over the previous one's, see 4).
    if let Some(run) = a.settled_already() {
        return Ok((a.settled(&run), None));
    }
    let entry = a.entry(reserved_at)?;
    if skip_late {
        return a.record_late(entry).await;
    }
    let mut lease = a.take_lease().await?;
    if let Some(busy) = lease.busy.take() {
        return a.when_busy(busy, entry, lease.prefetched).await;
    }
    a.run(job, entry, lease).await
}

/// One attempt of a reserved occurrence: what every step reads.
struct Attempt<'a, T, S> {
    ctx: &'a Context<'a, T>,
    blobs: &'a BlobClient<&'a S>,
    settings: &'a Settings,
    tick: &'a Tick,
    occurrence: u64,
    /// The storage server's clock when the reservation was created or read (at or before the
    /// outcome `running`).
    server_now: SystemTime,
    reservation: Reservation,
    reserved_by: Option<String>,
    attempt: u32,
    /// This tick's nonce on the outcome it writes.
    nonce: String,
}

/// The job's lease as a run holds it (none with `job_overlap = allow`) or held by another, the
/// log as read before it was taken, and the lock's name for the release.
struct Lease<'a, S> {
    held: Option<Acquired>,
    busy: Option<Busy>,
    prefetched: Option<LogWrite>,
    locks: Locks<&'a S>,
    name: LockName,
}

/// The job's lease held by another.
struct Busy {
    retry_after: Option<Duration>,
    holder: Option<leasegate::lease::Holder>,
}

impl<'a, T, S: Transport> Attempt<'a, T, S> {
    /// Skipped: settled already, with this outcome.
    fn settled(&self, run: &RunStatus) -> Decision {
        let mine = self.reserved_by.as_deref() == Some(self.settings.instance_id.as_str());
        let skip = if *run == RunStatus::Missed {
            Skip::MissedByDeadline
        } else if *run == RunStatus::BeforeHistory {
            Skip::BeforeHistoryRecorded
        } else if mine {
            Skip::SettledHere(run.clone())
        } else {
            Skip::SettledLate(run.clone())
        };
        skip.decision(self.reserved_by.clone())
    }

    /// The outcome that settles the occurrence before anything is written, if any: a first
    /// attempt finds none (or `pending`); a backfill runs one that never ran, a rerun one
    /// recorded `missed`.
    fn settled_already(&self) -> Option<RunStatus> {
        if self.attempt > 1 {
            return None;
        }
        match outcome_of(&self.reservation.metadata) {
            None | Some(RunStatus::Pending) => None,
            Some(
                RunStatus::Missed
                | RunStatus::SkippedPaused
                | RunStatus::SkippedOverlap
                | RunStatus::BeforeHistory,
            ) if self.tick.source == Source::Backfill => None,
            Some(RunStatus::Missed) if self.tick.source == Source::Rerun => None,
            Some(run) => Some(run),
        }
    }

    /// The outcome this attempt may write over.
    fn over(&self) -> Over {
        let source = self.tick.source;
        if source == Source::Backfill || (source == Source::Rerun && self.attempt == 1) {
            Over::NeverRan
        } else if self.attempt > 1 {
            Over::Attempt(self.attempt - 1)
        } else {
            Over::Nothing
        }
    }

    /// The attempt's log entry as it starts: `running`, with its occurrence's own token (the
    /// log issues the run's).
    fn entry(&self, reserved_at: SystemTime) -> Result<LogEntry, JobError> {
        Ok(LogEntry {
            occurrence: rfc3339(at(self.occurrence)),
            occurrence_unix: self.occurrence,
            instance: self.settings.instance_id.clone(),
            reserved_at: rfc3339(reserved_at),
            status: RunStatus::Running,
            fencing_token: Some(attempt_token(self.occurrence, self.attempt)?),
            trigger: self.tick.source.as_str().into(),
            past_due: self.tick.past_due,
            finished_at: None,
            reason: None,
            attempt: Some(self.attempt),
        })
    }

    /// `job_catch_up = none` and the tick is late: recorded missed (its outcome, then the log).
    async fn record_late(
        &self,
        mut entry: LogEntry,
    ) -> Result<(Decision, Option<LogWrite>), JobError> {
        let settings = self.settings;
        entry.status = RunStatus::Missed;
        entry.fencing_token = None;
        entry.finished_at = Some(rfc3339(self.server_now));
        let late_by = unix(self.ctx.now).saturating_sub(self.occurrence);
        entry.reason = Some(if late_by > settings.catch_up_window.as_secs() {
            format!(
                "ticked {late_by} s late, beyond job_catch_up_window_seconds ({} s): not run",
                settings.catch_up_window.as_secs()
            )
        } else {
            format!("ticked {late_by} s late and job_catch_up is none: not run")
        });
        let recorded = record_not_run(
            self.blobs,
            settings,
            &self.reservation,
            &entry,
            &self.nonce,
            None,
            self.ctx.now,
        );
        Ok(match recorded.await? {
            Err(NotRecorded::Settled(run)) => (self.settled(&run), None),
            Err(NotRecorded::Refused(refusal)) => (refused_by_log(settings, refusal), None),
            Ok(()) => (Decision::Missed { entry }, None),
        })
    }

    /// A storage failure before the outcome `running` is written takes back the reservation
    /// this tick created (at its create's ETag): a retry of the tick's 503 reserves afresh.
    async fn failed(&self, e: JobError) -> JobError {
        if self.reservation.created {
            take_back(self.blobs, &self.reservation, self.ctx.now).await;
        }
        e
    }

    /// Still 3: the job's lease (skip: one run at a time), labelled with the instance and the
    /// occurrence, taken from the state the log keeps (the log read first: its write starts
    /// from this read), with one more try after a lost answer.
    async fn take_lease(&self) -> Result<Lease<'a, S>, JobError> {
        let (ctx, settings) = (self.ctx, self.settings);
        let locks = Locks::from_client(self.blobs.clone())
            .with_prefix(&leasegate_spin::record::job_prefix(&settings.job));
        let name = LockName::try_new(leasegate_spin::record::LOCK_BLOB)?;
        if settings.overlap == Overlap::Allow {
            return Ok(Lease {
                held: None,
                busy: None,
                prefetched: None,
                locks,
                name,
            });
        }
        let (prefetched, dated) = match read_log_dated(self.blobs, settings, ctx.now).await {
            Ok((log, etag, date)) => (LogWrite::read(log, etag, date.unwrap_or(ctx.now)), date),
            Err(e) => return Err(self.failed(e).await),
        };
        let kept = prefetched.kept_lock().zip(dated);
        let label = format!("{} {}", settings.instance_id, self.occurrence);
        let lease_id = (ctx.new_lease_id)();
        let take = |start| {
            let how = Acquiring::new(settings.lease_term, lease_id)
                .origin(IdOrigin::Fresh)
                .label(&label)
                .start(start);
            locks.acquire(&name, how, ctx.now)
        };
        let start = kept
            .as_ref()
            .map_or(Start::Read, |(kept, date)| Start::Kept(kept, *date));
        let acquired = match take(start).await {
            // A lost answer or a 5xx: the core gave back what storage may have granted (a
            // fresh id's rule); taken once more, from a read, before the tick gives up.
            Err(e) if e.outcome_unknown() => take(Start::Read).await,
            taken => taken,
        };
        let (held, busy) = match acquired {
            Err(e) => return Err(self.failed(e.into()).await),
            Ok(Acquire::Acquired(held)) => (Some(held), None),
            Ok(Acquire::Busy {
                retry_after,
                holder,
                ..
            }) => (
                None,
                Some(Busy {
                    retry_after,
                    holder,
                }),
            ),
        };
        Ok(Lease {
            held,
            busy,
            prefetched: Some(prefetched),
            locks,
            name,
        })
    }

    /// The job's lease is held by another: wait (a later attempt; this occurrence's own run),
    /// buffer, or skip it as an overlap once it is due.
    async fn when_busy(
        &self,
        busy: Busy,
        mut entry: LogEntry,
        prefetched: Option<LogWrite>,
    ) -> Result<(Decision, Option<LogWrite>), JobError> {
        let (ctx, blobs, settings) = (self.ctx, self.blobs, self.settings);
        let Busy {
            holder,
            retry_after,
        } = busy;
        let in_progress = || {
            let wait = retry_after.unwrap_or(term_length(settings.lease_term));
            Decision::InProgress {
                retry_after: wait.max(Duration::from_secs(1)),
            }
        };
        // A later attempt that finds any run in the lease waits for it (a retry never records a
        // skip): not settled, a later tick retries.
        if self.attempt > 1 {
            return Ok((in_progress(), None));
        }
        let other = holder
            .as_ref()
            .filter(|h| label_occurrence(&h.label) != Some(self.occurrence));
        let Some(h) = other else {
            // This occurrence's lease (or one with no claim yet): settled only if the
            // reservation now shows an outcome. Else its holder may be dead (its outcome write
            // and its release failed): not settled, retried once the lease ends. A reservation
            // this tick created is taken back, so that none without an outcome is left where
            // no walk may look (an occurrence before the job's history).
            let (props, _) = head(blobs, &self.reservation.blob, ctx.now).await?;
            if let Some(run) = props.as_ref().and_then(|p| outcome_of(&p.metadata)) {
                return Ok((self.settled(&run), None));
            }
            if self.reservation.created {
                take_back(blobs, &self.reservation, ctx.now).await;
            }
            return Ok((in_progress(), None));
        };
        // Buffered already: it waits for the run going to end.
        if outcome_of(&self.reservation.metadata) == Some(RunStatus::Pending) {
            let skipped = Skip::BufferedAlready.decision(self.reserved_by.clone());
            return Ok((skipped, None));
        }
        // Another occurrence's run: this occurrence is skipped, once, but only once it is due
        // (by the storage server's clock, give or take its second): a tick ahead of it records
        // nothing, and a tick once it is due decides.
        let due_in = self.occurrence.saturating_sub(unix(self.server_now));
        if due_in > DUE_GRACE_SECS {
            if self.reservation.created {
                take_back(blobs, &self.reservation, ctx.now).await;
            }
            let retry_after = Duration::from_secs(due_in);
            return Ok((Decision::NotDue { retry_after }, None));
        }
        let (reservation, nonce) = (&self.reservation, &self.nonce);
        if settings.overlap == Overlap::BufferOne {
            let known = (reservation, prefetched);
            return buffer(ctx, blobs, settings, entry, known, nonce, &h.label).await;
        }
        entry.status = RunStatus::SkippedOverlap;
        entry.fencing_token = None;
        entry.reason = Some("the previous run still holds the job's lease".into());
        let recorded = record_not_run(
            blobs,
            settings,
            reservation,
            &entry,
            nonce,
            prefetched,
            ctx.now,
        );
        Ok(match recorded.await? {
            Err(NotRecorded::Settled(run)) => (self.settled(&run), None),
            Err(NotRecorded::Refused(refusal)) => (refused_by_log(settings, refusal), None),
            Ok(()) => (Decision::Overlapped { entry }, None),
        })
    }

    /// 4 to 6: the outcome `running`, the log's start (which issues the token), the job's call
    /// if its run can end in time, the release, the result in the log and on the reservation.
    async fn run<J: Transport>(
        &self,
        job: &J,
        mut entry: LogEntry,
        lease: Lease<'a, S>,
    ) -> Result<(Decision, Option<LogWrite>), JobError> {
        let (ctx, blobs, settings) = (self.ctx, self.blobs, self.settings);
        let occurrence = self.occurrence;
        // The holder's own release: at the ETag its acquire left, no read first, answering the
        // lease as the release left it (a record cleared at a new ETag), for the log to keep:
        // the next run takes it from there with one write.
        let release = || async {
            let held = lease.held.as_ref()?;
            let from = Start::Acquired(held);
            let released = lease
                .locks
                .release(&lease.name, held.lease_id, from, ctx.now)
                .await;
            released.ok()?.1
        };
        // 4. The outcome "running" on the reservation: the one tick that writes it runs the
        // job.
        let running = RunStatus::Running;
        let over = (self.attempt, self.over());
        let written = match commit(
            blobs,
            &self.reservation,
            &running,
            &self.nonce,
            over,
            ctx.now,
        )
        .await
        {
            Ok(Commit::Written(w)) => w,
            Ok(Commit::Settled(run)) => {
                release().await;
                return Ok((self.settled(&run), None));
            }
            Err(e) => {
                release().await;
                return Err(self.failed(e).await);
            }
        };
        // 5. Log the run before it starts, so a run that never ends still shows.
        let kept_lock = lease.held.as_ref().and_then(Acquired::held_state);
        // The job's lease as the log kept it when this tick read it.
        let read_lock = lease.prefetched.as_ref().map(|p| p.log.lock.clone());
        let keep = kept_lock
            .as_ref()
            .map(|state| KeepLock { state, over: None });
        let from = Append::from(lease.prefetched.clone(), keep, &self.reservation);
        let started_log = match append(blobs, settings, &entry, from, ctx.now).await {
            Ok(Ok(written)) => written,
            // Paused: not run. A retry is not an occurrence of its own: the previous attempt's
            // `failed` is put back and the retry waits for the resume.
            Ok(Err(LogRefusal::Paused(_))) if self.attempt > 1 => {
                uncommit(blobs, &self.reservation, &written, ctx.now).await;
                release().await;
                let skip = Skip::PausedRetry {
                    attempt: self.attempt,
                    job: settings.job.clone(),
                };
                return Ok((skip.decision(self.reserved_by.clone()), None));
            }
            // The outcome becomes `skipped_paused` (over this tick's `running`), the lease kept
            // in place of the state this tick acquired from, as read: a run that took the lease
            // since has kept a newer one.
            Ok(Err(LogRefusal::Paused(paused))) => {
                let left = release().await;
                let keep = left.as_ref().or(kept_lock.as_ref()).map(|state| KeepLock {
                    state,
                    over: Some(read_lock.flatten()),
                });
                return skip_paused(ctx, blobs, settings, entry, (&written, keep), &paused).await;
            }
            // Storage failed and the log may hold the run's start (a lost answer the read back
            // could not settle): the reservation is put back as it was before the outcome,
            // never deleted, for the takeover rule to settle with the log.
            Err(e) => {
                restore(blobs, &self.reservation, &written, ctx.now).await;
                release().await;
                return Err(e);
            }
            Ok(Err(refusal)) => {
                undo(blobs, (&self.reservation, &written), &refusal, ctx.now).await;
                release().await;
                return Ok((refused_by_log(settings, refusal), None));
            }
        };
        // 6. The job is called only if its run can end within the job's lease and the run's
        // deadline (when other ticks take it for vanished), by the storage server's clock:
        // slow storage before the call must not let it outlive them.
        if let Err(slow) = time_left(
            settings,
            lease.held.as_ref(),
            self.server_now,
            started_log.date,
        ) {
            restore(blobs, &self.reservation, &written, ctx.now).await;
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
        // Release first: the log keeps the lease as the release left it. Then the log (a
        // takeover reads it before acting), then the reservation.
        let left = release().await;
        let started_lock = started_log.log.lock.clone();
        let keep = left.as_ref().map(|state| KeepLock {
            state,
            over: Some(started_lock),
        });
        let finished = update(blobs, settings, &entry, (Some(started_log), keep), ctx.now).await;
        let result_of = (&status, entry.fencing_token);
        record_result(blobs, &written, result_of, &self.nonce, ctx.now).await;
        let log = finished.ok().inspect(|written| {
            // The end as the log records it, to the answer (the same instant).
            let end = written
                .log
                .entries
                .iter()
                .find(|e| e.occurrence_unix == occurrence);
            entry.finished_at = end
                .and_then(|e| e.finished_at.clone())
                .or_else(|| Some(rfc3339(written.date)));
        });
        let decision = match result {
            Ok(()) => Decision::Ran { entry },
            Err(_) => Decision::JobFailed { entry },
        };
        Ok((decision, log))
    }
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
                Skip::SettledByTick(run)
                    .decision(reservation.metadata.get(META_RESERVED_BY).cloned()),
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

mod outcome;
pub(crate) mod skip;
pub(crate) use outcome::refused_by_log;
use outcome::*;
