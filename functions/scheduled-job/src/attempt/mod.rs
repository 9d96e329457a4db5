//! One attempt of a reserved occurrence, steps 3 to 6 of a tick (`docs/timer-functions.md`,
//! "A tick, step by step"): skip it if settled, take the job's lease, write the outcome
//! `running`, log the start (which issues the token), call the job if its run can end in time,
//! release, record the result; or record why it did not run. The decisions are a plan
//! ([`plan::next`], pure); this module is its executor: it performs each step the plan names
//! through the blob client and hands the answer back.

use leasegate::lease::{Acquire, Acquired, Acquiring, HeldState, IdOrigin, Locks, Start};
use leasegate::ops::{Condition, SetMetadata, WriteOutcome};
use leasegate::BlobClient;
use leasegate::{LeaseId, LockName, Transport};
use leasegate_spin::timer::Tick;
use leasegate_spin::web::rfc3339;
use leasegate_spin::Context;
use std::time::SystemTime;

use crate::at;
use crate::error::JobError;
use crate::log::{
    append, read_log_dated, update, Append, KeepLock, LogEntry, LogRefusal, LogWrite,
};
use crate::reservation::{
    attempt_token, commit, head, outcome_of, restore, take_back, uncommit, Commit, OutcomeWrite,
    Reservation, RunStatus, META_RESERVED_BY, META_RUN, META_RUN_TICK, META_RUN_TOKEN,
};
use crate::run::{call_job, Decision};
use crate::settings::Settings;
use plan::{Answers, Committed, Failed, Keep, Knows, Lease, PutBack, Step};

/// An occurrence reserved and in range, as a tick (or a backfill, or a rerun) hands it on.
#[derive(Debug)]
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

/// The most steps an attempt takes (the longest path, a run, takes 11): a bound on the loop,
/// should a step ever leave its answer unrecorded.
const MAX_STEPS: usize = 24;

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
    let reservation = run.reservation;
    let nonce = (ctx.new_lease_id)().to_string();
    // The occurrence's own token for this attempt: one too far ahead fails the attempt, once
    // the plan has looked whether it is settled already.
    let token = attempt_token(run.occurrence, run.attempt);
    let entry = LogEntry {
        occurrence: rfc3339(at(run.occurrence)),
        occurrence_unix: run.occurrence,
        instance: settings.instance_id.clone(),
        reserved_at: rfc3339(run.reserved_at),
        status: RunStatus::Running,
        fencing_token: token.as_ref().ok().copied(),
        trigger: tick.source.as_str().into(),
        past_due: tick.past_due,
        finished_at: None,
        reason: None,
        attempt: Some(run.attempt),
    };
    let knows = Knows {
        settings,
        source: tick.source,
        occurrence: run.occurrence,
        attempt: run.attempt,
        now: ctx.now,
        server_now: run.server_now,
        reservation: &reservation,
        reserved_by: reservation.metadata.get(META_RESERVED_BY).cloned(),
        skip_late: run.skip_late,
        token_refused: token.is_err(),
        entry,
    };
    let locks = Locks::from_client(blobs.clone())
        .with_prefix(&leasegate_spin::record::job_prefix(&settings.job));
    let name = LockName::try_new(leasegate_spin::record::LOCK_BLOB)?;
    let mut executor = Executor {
        ctx,
        blobs,
        job,
        settings,
        reservation: &reservation,
        nonce,
        locks,
        name,
        lease_id: None,
        held: None,
        failure: token.err().map(JobError::from),
    };
    let mut answers = Answers::default();
    for _ in 0..MAX_STEPS {
        match plan::next(&knows, &answers) {
            Step::Done(decision, log) => return Ok((decision, log)),
            Step::Fail(Some(slow)) => return Err(JobError::Slow(slow)),
            Step::Fail(None) => return Err(executor.failure.take().unwrap_or_else(unfinished)),
            step => executor.perform(step, &knows, &mut answers).await?,
        }
    }
    Err(unfinished())
}

/// The error of a plan that named no answer (it never does: the plan's tests walk every path).
fn unfinished() -> JobError {
    JobError::Contended("the attempt's steps did not come to a decision".into())
}

/// What the executor holds besides the plan's answers: the clients, this attempt's nonce and
/// lease id, the job's lease as held (to release it), the failed step's error.
struct Executor<'a, T, S, J> {
    ctx: &'a Context<'a, T>,
    blobs: &'a BlobClient<&'a S>,
    job: &'a J,
    settings: &'a Settings,
    reservation: &'a Reservation,
    /// This tick's nonce on the outcome it writes.
    nonce: String,
    locks: Locks<&'a S>,
    name: LockName,
    lease_id: Option<LeaseId>,
    held: Option<Acquired>,
    failure: Option<JobError>,
}

impl<T, S: Transport, J: Transport> Executor<'_, T, S, J> {
    /// Keeps a failed step's error for the plan's [`Step::Fail`].
    fn failed(&mut self, e: impl Into<JobError>) -> Failed {
        self.failure = Some(e.into());
        Failed
    }

    /// Performs one step and records its answer.
    async fn perform(
        &mut self,
        step: Step,
        knows: &Knows<'_>,
        a: &mut Answers,
    ) -> Result<(), JobError> {
        let (ctx, blobs, settings, reservation) =
            (self.ctx, self.blobs, self.settings, self.reservation);
        let now = ctx.now;
        match step {
            Step::ReadLog => {
                a.log = Some(match read_log_dated(blobs, settings, now).await {
                    Ok((log, etag, date)) => {
                        Ok((LogWrite::read(log, etag, date.unwrap_or(now)), date))
                    }
                    Err(e) => Err(self.failed(e)),
                })
            }
            Step::Acquire(kept) => {
                let lease = self.acquire(knows.occurrence, kept).await;
                a.lease.push(lease);
            }
            Step::ReadReservation => {
                a.reread = Some(match head(blobs, &reservation.blob, now).await {
                    Ok((props, _)) => Ok(props.as_ref().and_then(|p| outcome_of(&p.metadata))),
                    Err(e) => Err(self.failed(e)),
                })
            }
            Step::Commit {
                outcome,
                attempt,
                over,
            } => {
                let write = OutcomeWrite {
                    outcome: &outcome,
                    attempt,
                    over,
                    nonce: &self.nonce,
                };
                a.committed = Some(match commit(blobs, reservation, &write, now).await {
                    Ok(Commit::Written(w)) => Ok(Committed::Written(w)),
                    Ok(Commit::Settled(run)) => Ok(Committed::Settled(run)),
                    Err(e) => Err(self.failed(e)),
                })
            }
            Step::Append { entry, known, keep } => {
                let keep = keep.as_ref().map(Keep::lock);
                let from = Append::from(known, keep, reservation);
                a.appended = Some(match append(blobs, settings, &entry, from, now).await {
                    Ok(appended) => Ok(appended),
                    Err(e) => Err(self.failed(e)),
                })
            }
            Step::Overwrite { written, outcome } => {
                let overwritten = overwrite_outcome(blobs, &written, &outcome, now).await;
                a.overwritten = Some(overwritten.map_err(|e| self.failed(e)));
            }
            Step::AppendAgain { entry, keep, on } => {
                let keep = keep.as_ref().map(Keep::lock);
                let from = Append::from(None, keep, &on);
                let appended = append(blobs, settings, &entry, from, now).await;
                a.appended_again = Some(appended.map(|_| ()).map_err(|e| self.failed(e)));
            }
            Step::CallJob(entry) => a.called = Some(call_job(self.job, settings, &entry).await),
            Step::Release => a.released = Some(self.release().await),
            Step::Update {
                entry,
                started,
                keep,
            } => {
                let over = Some(started.log.lock.clone());
                let keep = keep.as_ref().map(|state| KeepLock { state, over });
                let finished = update(blobs, settings, &entry, Some(started), keep, now).await;
                a.finished = Some(finished.ok());
            }
            Step::RecordResult {
                written,
                status,
                token,
            } => {
                record_result(blobs, &written, &status, token, &self.nonce, now).await;
                a.recorded = true;
            }
            Step::PutBack(how) => {
                match how {
                    PutBack::TakeBack => take_back(blobs, reservation, now).await,
                    PutBack::Restore(written) => restore(blobs, reservation, &written, now).await,
                    PutBack::Uncommit(written) => uncommit(blobs, reservation, &written, now).await,
                    PutBack::Undo(written, refusal) => {
                        undo(blobs, reservation, &written, &refusal, now).await
                    }
                }
                a.put_back = true;
            }
            Step::Done(..) | Step::Fail(_) => {}
        }
        Ok(())
    }

    /// The job's lease, labelled with the instance and the occurrence, from the state the log
    /// keeps (`kept`, with the read's `Date`) or from a read; one lease id for every try.
    async fn acquire(&mut self, occurrence: u64, kept: Option<(HeldState, SystemTime)>) -> Lease {
        let (ctx, settings) = (self.ctx, self.settings);
        let lease_id = *self.lease_id.get_or_insert_with(|| (ctx.new_lease_id)());
        let label = format!("{} {}", settings.instance_id, occurrence);
        let start = kept
            .as_ref()
            .map_or(Start::Read, |(kept, date)| Start::Kept(kept, *date));
        let how = Acquiring::new(settings.lease_term, lease_id)
            .origin(IdOrigin::Fresh)
            .label(&label)
            .start(start);
        match self.locks.acquire(&self.name, how, ctx.now).await {
            Ok(Acquire::Acquired(held)) => {
                let lease = Lease::Held {
                    expires_at: held.expires_at,
                    state: held.held_state(),
                };
                self.held = Some(held);
                lease
            }
            Ok(Acquire::Busy {
                retry_after,
                holder,
                ..
            }) => Lease::Busy {
                retry_after,
                holder,
            },
            // A lost answer or a 5xx: the core gave back what storage may have granted (a fresh
            // id's rule); the plan takes it once more, from a read, before the tick gives up.
            Err(e) => {
                let unknown = e.outcome_unknown();
                self.failure = Some(e.into());
                Lease::Failed { unknown }
            }
        }
    }

    /// The holder's own release: at the ETag its acquire left, no read first, answering the
    /// lease as the release left it (a record cleared at a new ETag), for the log to keep: the
    /// next run takes it from there with one write.
    async fn release(&self) -> Option<HeldState> {
        let held = self.held.as_ref()?;
        let from = Start::Acquired(held);
        let released = self
            .locks
            .release(&self.name, held.lease_id, from, self.ctx.now)
            .await;
        released.ok()?.1
    }
}

mod outcome;
mod plan;
pub(crate) mod skip;
use outcome::*;
