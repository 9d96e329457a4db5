//! An attempt's decisions (steps 3 to 6 of a tick) as a plan: a pure function from what the
//! attempt knows and the answers so far to its next step. No IO, no clock: the executor
//! (`super::run_reserved`) performs each step through the blob client, records its answer,
//! and asks again, until the plan answers [`Step::Done`] or [`Step::Fail`]. The rules:
//! `docs/timer-functions.md`, "A tick, step by step".

use leasegate::lease::{HeldState, Holder};
use leasegate_spin::timer::Source;
use leasegate_spin::web::rfc3339;
use std::time::{Duration, SystemTime};

use super::skip::Skip;
use crate::log::{LogEntry, LogRefusal, LogWrite, Paused};
use crate::reservation::{label_occurrence, outcome_of, Over, Reservation, RunStatus};
use crate::run::{Decision, DUE_GRACE_SECS};
use crate::settings::{term_length, Overlap, Settings};
use crate::{at, unix};

/// What the attempt knows before its first step.
pub(crate) struct Knows<'a> {
    pub(crate) settings: &'a Settings,
    /// What started the tick (`cron`, `http`, `manual`, a backfill, a rerun).
    pub(crate) source: Source,
    /// The occurrence (Unix seconds).
    pub(crate) occurrence: u64,
    /// The attempt (1 unless a retry).
    pub(crate) attempt: u32,
    /// This instance's clock when the tick began.
    pub(crate) now: SystemTime,
    /// The storage server's clock when the reservation was created or read.
    pub(crate) server_now: SystemTime,
    /// The reservation as created or read.
    pub(crate) reservation: &'a Reservation,
    /// Who reserved it, as its metadata says.
    pub(crate) reserved_by: Option<String>,
    /// Record it missed instead of running it (late, `job_catch_up = none`).
    pub(crate) skip_late: bool,
    /// The attempt's log entry as it starts: `running`, with its occurrence's own token.
    pub(crate) entry: LogEntry,
}

/// A step that failed: the executor keeps its error, the plan decides what to put back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failed;

/// The job's lease as the plan sees it (the executor keeps the lease itself, to release it).
#[derive(Debug, Clone)]
pub(crate) enum Lease {
    /// This attempt holds it: when it runs out (storage's clock), its state for the log to keep.
    Held {
        expires_at: Option<SystemTime>,
        state: Option<HeldState>,
    },
    /// Another run holds it.
    Busy {
        retry_after: Option<Duration>,
        holder: Option<Holder>,
    },
    /// The acquire failed; `unknown`: its answer was lost or a 5xx (storage may have granted).
    Failed { unknown: bool },
}

/// What the attempt's steps answered so far (`None`: not asked yet).
#[derive(Debug, Default)]
pub(crate) struct Answers {
    /// [`Step::ReadLog`]: the log as read (an append starts from it) and the read's `Date`.
    pub(crate) log: Option<Result<(LogWrite, Option<SystemTime>), Failed>>,
    /// [`Step::Acquire`]: each try (a second after a lost answer).
    pub(crate) lease: Vec<Lease>,
    /// [`Step::ReadReservation`]: the reservation's outcome now.
    pub(crate) reread: Option<Result<Option<RunStatus>, Failed>>,
    /// [`Step::Commit`]: the reservation as this attempt wrote it `running`, or the outcome
    /// found there.
    pub(crate) committed: Option<Result<Committed, Failed>>,
    /// [`Step::Append`]: the log with the run's start, or why it refused the entry.
    pub(crate) appended: Option<Result<Result<LogWrite, LogRefusal>, Failed>>,
    /// [`Step::CallJob`]: `Err`: why the job did not confirm.
    pub(crate) called: Option<Result<(), String>>,
    /// [`Step::Release`]: the lease as the release left it (`None`: not answered).
    pub(crate) released: Option<Option<HeldState>>,
    /// [`Step::PutBack`]: done (best effort).
    pub(crate) put_back: bool,
    /// [`Step::Update`]: the log with the run's end (`None`: the write failed).
    pub(crate) finished: Option<Option<LogWrite>>,
    /// [`Step::RecordResult`]: done (best effort).
    pub(crate) recorded: bool,
    /// [`Step::RecordNotRun`]: what recording the skip came to.
    pub(crate) not_run: Option<Result<NotRun, Failed>>,
    /// [`Step::Buffer`], [`Step::SkipPaused`]: the decision they came to.
    pub(crate) decided: Option<Result<Decision, Failed>>,
}

/// What recording an outcome that is not a run came to.
#[derive(Debug, Clone)]
pub(crate) enum NotRun {
    /// Recorded (on the reservation; in the log unless its write failed).
    Recorded,
    /// Another tick wrote an outcome first: this one.
    Settled(RunStatus),
    /// The log refused the entry (the outcome was undone).
    Refused(LogRefusal),
}

/// What writing the outcome `running` came to.
#[derive(Debug, Clone)]
pub(crate) enum Committed {
    /// Written: the reservation as written.
    Written(Reservation),
    /// A tick before this one wrote this outcome.
    Settled(RunStatus),
}

/// What the executor does next.
#[derive(Debug)]
pub(crate) enum Step {
    /// Read the job's log: the lease's kept state, the append's start.
    ReadLog,
    /// Take the job's lease, from the state the log keeps (and its `Date`) or from a read.
    Acquire(Option<(HeldState, SystemTime)>),
    /// Read the reservation again (whether it shows an outcome now).
    ReadReservation,
    /// Write the outcome `running` on the reservation, over this attempt's predecessor.
    Commit { attempt: u32, over: Over },
    /// Record an outcome that is not a run (`missed`, `skipped_overlap`): on the reservation,
    /// then in the log, starting from the log as read.
    RecordNotRun {
        entry: LogEntry,
        known: Option<LogWrite>,
    },
    /// `job_overlap = buffer_one`: keep the occurrence `pending` behind the previous run.
    Buffer(Buffering),
    /// Append the run's start to the log (which issues its token), keeping the lease's state.
    Append {
        entry: LogEntry,
        known: Option<LogWrite>,
        keep: Option<HeldState>,
    },
    /// The job is paused: record `skipped_paused` over this attempt's `running`.
    SkipPaused(Pausing),
    /// Call the job.
    CallJob(LogEntry),
    /// Release the job's lease.
    Release,
    /// Write the run's end in the log, keeping the lease as the release left it.
    Update {
        entry: LogEntry,
        started: LogWrite,
        keep: Option<HeldState>,
    },
    /// Write the run's result over this attempt's `running`.
    RecordResult {
        written: Reservation,
        status: RunStatus,
        token: Option<u64>,
    },
    /// Put the reservation back as it was before this attempt wrote on it.
    PutBack(PutBack),
    /// The attempt came to this (with the log as the run's end wrote it).
    Done(Decision, Option<LogWrite>),
    /// The attempt failed: answer the failed step's error, or this one.
    Fail(Option<String>),
}

/// An occurrence to keep `pending` behind the previous run (`job_overlap = buffer_one`).
#[derive(Debug)]
pub(crate) struct Buffering {
    /// The attempt's entry (made `pending` by the step).
    pub(crate) entry: LogEntry,
    /// The log as read (the append starts from it).
    pub(crate) known: Option<LogWrite>,
    /// The previous run's lease label (`{instance} {occurrence}`).
    pub(crate) holder: String,
}

/// An occurrence of a paused job to record `skipped_paused`.
#[derive(Debug)]
pub(crate) struct Pausing {
    /// The attempt's entry (made `skipped_paused` by the step).
    pub(crate) entry: LogEntry,
    /// The reservation as this attempt wrote it `running` (what the skip writes over).
    pub(crate) written: Reservation,
    /// The job's lease for the log to keep, in place of the log's `lock` as read.
    pub(crate) keep: Option<(HeldState, Option<serde_json::Value>)>,
    /// The pause.
    pub(crate) paused: Paused,
}

/// How a reservation is put back.
#[derive(Debug, Clone)]
pub(crate) enum PutBack {
    /// Deleted: this tick created it and wrote no outcome (a retry reserves afresh).
    TakeBack,
    /// Its `running` taken back to what it was (`written`: as this attempt wrote it).
    Restore(Reservation),
    /// Its `running` undone (a retry waiting for a resume keeps its `failed`).
    Uncommit(Reservation),
    /// The log refused the entry: undone, or marked `before_history`.
    Undo(Reservation, LogRefusal),
}

/// The attempt's next step.
pub(crate) fn next(k: &Knows, a: &Answers) -> Step {
    // 3. A reservation with an outcome already is settled.
    if let Some(run) = settled_already(k) {
        return Step::Done(settled(k, &run), None);
    }
    if k.skip_late {
        let entry = missed_entry(k);
        return match &a.not_run {
            None => Step::RecordNotRun { entry, known: None },
            Some(answer) => after_not_run(k, answer, entry, |entry| Decision::Missed { entry }),
        };
    }
    if k.settings.overlap == Overlap::Allow {
        return run(k, a, None);
    }
    // Still 3: the job's lease, from the state the log keeps, one more try after a lost answer.
    let log = match &a.log {
        None => return Step::ReadLog,
        Some(Err(Failed)) => return fail_before_outcome(k, a, None),
        Some(Ok(log)) => log,
    };
    match a.lease.last() {
        None => Step::Acquire(log.0.kept_lock().zip(log.1)),
        Some(Lease::Failed { unknown: true }) if a.lease.len() == 1 => Step::Acquire(None),
        Some(Lease::Failed { .. }) => fail_before_outcome(k, a, None),
        Some(Lease::Busy {
            retry_after,
            holder,
        }) => when_busy(k, a, &log.0, *retry_after, holder.as_ref()),
        Some(Lease::Held { expires_at, state }) => {
            run(k, a, Some((*expires_at, state.as_ref(), &log.0)))
        }
    }
}

/// The decision a buffering or a paused skip came to, if it was taken.
fn decided(a: &Answers) -> Option<Step> {
    Some(match a.decided.as_ref()? {
        Ok(decision) => Step::Done(decision.clone(), None),
        Err(Failed) => Step::Fail(None),
    })
}

/// A failure before the outcome `running` is written takes back the reservation this tick
/// created (a retry of the tick's 503 reserves afresh), then answers the error.
fn fail_before_outcome(k: &Knows, a: &Answers, slow: Option<String>) -> Step {
    if k.reservation.created && !a.put_back {
        return Step::PutBack(PutBack::TakeBack);
    }
    Step::Fail(slow)
}

/// The answer once an outcome that is not a run was recorded (`done`: the decision then).
fn after_not_run(
    k: &Knows,
    answer: &Result<NotRun, Failed>,
    entry: LogEntry,
    done: fn(LogEntry) -> Decision,
) -> Step {
    match answer {
        Err(Failed) => Step::Fail(None),
        Ok(NotRun::Settled(run)) => Step::Done(settled(k, run), None),
        Ok(NotRun::Refused(refusal)) => {
            Step::Done(refused_by_log(k.settings, refusal.clone()), None)
        }
        Ok(NotRun::Recorded) => Step::Done(done(entry), None),
    }
}

/// The job's lease is held by another: wait (a later attempt; this occurrence's own run),
/// buffer, or skip it as an overlap once it is due.
fn when_busy(
    k: &Knows,
    a: &Answers,
    log: &LogWrite,
    retry_after: Option<Duration>,
    holder: Option<&Holder>,
) -> Step {
    let in_progress = || {
        let wait = retry_after.unwrap_or(term_length(k.settings.lease_term));
        Decision::InProgress {
            retry_after: wait.max(Duration::from_secs(1)),
        }
    };
    // A later attempt that finds any run in the lease waits for it (a retry never records a
    // skip): not settled, a later tick retries.
    if k.attempt > 1 {
        return Step::Done(in_progress(), None);
    }
    let other = holder.filter(|h| label_occurrence(&h.label) != Some(k.occurrence));
    let Some(holder) = other else {
        // This occurrence's lease (or one with no claim yet): settled only if the reservation
        // now shows an outcome. Else its holder may be dead (its outcome write and its release
        // failed): not settled, retried once the lease ends. A reservation this tick created is
        // taken back, so that none without an outcome is left where no walk may look.
        return match &a.reread {
            None => Step::ReadReservation,
            Some(Err(Failed)) => Step::Fail(None),
            Some(Ok(Some(run))) => Step::Done(settled(k, run), None),
            Some(Ok(None)) if k.reservation.created && !a.put_back => {
                Step::PutBack(PutBack::TakeBack)
            }
            Some(Ok(None)) => Step::Done(in_progress(), None),
        };
    };
    // Buffered already: it waits for the run going to end.
    if outcome_of(&k.reservation.metadata) == Some(RunStatus::Pending) {
        return Step::Done(Skip::BufferedAlready.decision(k.reserved_by.clone()), None);
    }
    // Another occurrence's run: this occurrence is skipped, once, but only once it is due (by
    // the storage server's clock, give or take its second).
    let due_in = k.occurrence.saturating_sub(unix(k.server_now));
    if due_in > DUE_GRACE_SECS {
        if k.reservation.created && !a.put_back {
            return Step::PutBack(PutBack::TakeBack);
        }
        let retry_after = Duration::from_secs(due_in);
        return Step::Done(Decision::NotDue { retry_after }, None);
    }
    let known = Some(log.clone());
    if k.settings.overlap == Overlap::BufferOne {
        if let Some(step) = decided(a) {
            return step;
        }
        return Step::Buffer(Buffering {
            entry: k.entry.clone(),
            known,
            holder: holder.label.clone(),
        });
    }
    let mut entry = k.entry.clone();
    entry.status = RunStatus::SkippedOverlap;
    entry.fencing_token = None;
    entry.reason = Some("the previous run still holds the job's lease".into());
    match &a.not_run {
        None => Step::RecordNotRun { entry, known },
        Some(answer) => after_not_run(k, answer, entry, |entry| Decision::Overlapped { entry }),
    }
}

/// The lease as this attempt holds it: when it runs out, its state, the log as read before.
type Held<'a> = (Option<SystemTime>, Option<&'a HeldState>, &'a LogWrite);

/// 4 to 6: the outcome `running`, the log's start (which issues the token), the job's call if
/// its run can end in time, the release, the result in the log and on the reservation.
/// `held`: the job's lease (none with `job_overlap = allow`).
fn run(k: &Knows, a: &Answers, held: Option<Held>) -> Step {
    // The holder's own release comes before an answer, once (none without a lease).
    let release_then = |then: Step| match held {
        Some(_) if a.released.is_none() => Step::Release,
        _ => then,
    };
    let put_back_then = |how: PutBack, then: Step| {
        if a.put_back {
            then
        } else {
            Step::PutBack(how)
        }
    };
    // 4. The outcome "running" on the reservation: the one tick that writes it runs the job.
    let written = match &a.committed {
        None => {
            let (attempt, over) = (k.attempt, over(k));
            return Step::Commit { attempt, over };
        }
        Some(Err(Failed)) => return release_then(fail_before_outcome(k, a, None)),
        Some(Ok(Committed::Settled(run))) => {
            return release_then(Step::Done(settled(k, run), None))
        }
        Some(Ok(Committed::Written(w))) => w,
    };
    // 5. Log the run before it starts, so a run that never ends still shows.
    let (expires_at, kept, read) = match held {
        Some((expires_at, kept, read)) => (expires_at, kept, Some(read)),
        None => (None, None, None),
    };
    let started = match &a.appended {
        None => {
            return Step::Append {
                entry: k.entry.clone(),
                known: read.cloned(),
                keep: kept.cloned(),
            }
        }
        // Storage failed and the log may hold the run's start: the reservation is put back as
        // it was before the outcome, never deleted, for the takeover rule to settle with the log.
        Some(Err(Failed)) => {
            let restore = PutBack::Restore(written.clone());
            return put_back_then(restore, release_then(Step::Fail(None)));
        }
        // Paused: not run. A retry is not an occurrence of its own: the previous attempt's
        // `failed` is put back and the retry waits for the resume.
        Some(Ok(Err(LogRefusal::Paused(_)))) if k.attempt > 1 => {
            let skip = Skip::PausedRetry {
                attempt: k.attempt,
                job: k.settings.job.clone(),
            };
            let done = Step::Done(skip.decision(k.reserved_by.clone()), None);
            return put_back_then(PutBack::Uncommit(written.clone()), release_then(done));
        }
        // The outcome becomes `skipped_paused`, the lease kept in place of the state this tick
        // acquired from, as read: a run that took the lease since has kept a newer one.
        Some(Ok(Err(LogRefusal::Paused(paused)))) => {
            if let Some(step) = decided(a) {
                return step;
            }
            let left = a.released.clone().flatten();
            let state = left.or_else(|| kept.cloned());
            let over = read.and_then(|r| r.log.lock.clone());
            return release_then(Step::SkipPaused(Pausing {
                entry: k.entry.clone(),
                written: written.clone(),
                keep: state.map(|s| (s, over)),
                paused: paused.clone(),
            }));
        }
        Some(Ok(Err(refusal))) => {
            let done = Step::Done(refused_by_log(k.settings, refusal.clone()), None);
            let undo = PutBack::Undo(written.clone(), refusal.clone());
            return put_back_then(undo, release_then(done));
        }
        Some(Ok(Ok(started))) => started,
    };
    // 6. The job is called only if its run can end within the job's lease and the run's
    // deadline, by the storage server's clock.
    if let Err(slow) = time_left(k.settings, expires_at, k.server_now, started.date) {
        let restore = PutBack::Restore(written.clone());
        return put_back_then(restore, release_then(Step::Fail(Some(slow))));
    }
    // The token the log's compare-and-swap issued: above every earlier run's.
    let mut entry = k.entry.clone();
    entry.fencing_token = started.log.token_of(k.occurrence).or(entry.fencing_token);
    let Some(result) = &a.called else {
        return Step::CallJob(entry);
    };
    (entry.status, entry.reason) = match result {
        Ok(()) => (RunStatus::Succeeded, None),
        Err(reason) => (RunStatus::Failed, Some(reason.clone())),
    };
    // Release first: the log keeps the lease as the release left it. Then the log (a takeover
    // reads it before acting), then the reservation.
    let Some(finished) = &a.finished else {
        let keep = a.released.clone().flatten();
        return release_then(Step::Update {
            entry,
            started: started.clone(),
            keep,
        });
    };
    if !a.recorded {
        return Step::RecordResult {
            written: written.clone(),
            status: entry.status.clone(),
            token: entry.fencing_token,
        };
    }
    if let Some(written) = finished {
        // The end as the log records it, to the answer (the same instant).
        let end = written
            .log
            .entries
            .iter()
            .find(|e| e.occurrence_unix == k.occurrence);
        entry.finished_at = end
            .and_then(|e| e.finished_at.clone())
            .or_else(|| Some(rfc3339(written.date)));
    }
    let decision = match result {
        Ok(()) => Decision::Ran { entry },
        Err(_) => Decision::JobFailed { entry },
    };
    Step::Done(decision, finished.clone())
}

/// Skipped: settled already, with this outcome.
pub(crate) fn settled(k: &Knows, run: &RunStatus) -> Decision {
    let mine = k.reserved_by.as_deref() == Some(k.settings.instance_id.as_str());
    let skip = if *run == RunStatus::Missed {
        Skip::MissedByDeadline
    } else if *run == RunStatus::BeforeHistory {
        Skip::BeforeHistoryRecorded
    } else if mine {
        Skip::SettledHere(run.clone())
    } else {
        Skip::SettledLate(run.clone())
    };
    skip.decision(k.reserved_by.clone())
}

/// The outcome that settles the occurrence before anything is written, if any: a first attempt
/// finds none (or `pending`); a backfill runs one that never ran, a rerun one recorded `missed`.
fn settled_already(k: &Knows) -> Option<RunStatus> {
    if k.attempt > 1 {
        return None;
    }
    match outcome_of(&k.reservation.metadata) {
        None | Some(RunStatus::Pending) => None,
        Some(
            RunStatus::Missed
            | RunStatus::SkippedPaused
            | RunStatus::SkippedOverlap
            | RunStatus::BeforeHistory,
        ) if k.source == Source::Backfill => None,
        Some(RunStatus::Missed) if k.source == Source::Rerun => None,
        Some(run) => Some(run),
    }
}

/// The outcome this attempt may write over.
fn over(k: &Knows) -> Over {
    if k.source == Source::Backfill || (k.source == Source::Rerun && k.attempt == 1) {
        Over::NeverRan
    } else if k.attempt > 1 {
        Over::Attempt(k.attempt - 1)
    } else {
        Over::Nothing
    }
}

/// `job_catch_up = none` and the tick is late (or beyond the catch-up window): the entry that
/// records it missed.
fn missed_entry(k: &Knows) -> LogEntry {
    let settings = k.settings;
    let mut entry = k.entry.clone();
    entry.status = RunStatus::Missed;
    entry.fencing_token = None;
    entry.finished_at = Some(rfc3339(k.server_now));
    let late_by = unix(k.now).saturating_sub(k.occurrence);
    entry.reason = Some(if late_by > settings.catch_up_window.as_secs() {
        format!(
            "ticked {late_by} s late, beyond job_catch_up_window_seconds ({} s): not run",
            settings.catch_up_window.as_secs()
        )
    } else {
        format!("ticked {late_by} s late and job_catch_up is none: not run")
    });
    entry
}

/// The decision when the log refused an occurrence's entry.
pub(crate) fn refused_by_log(settings: &Settings, refusal: LogRefusal) -> Decision {
    match refusal {
        LogRefusal::TooOld => Decision::TooOld {
            retention: settings.retention,
        },
        LogRefusal::Settled => Skip::MissedInLog.decision(None),
        // Handled where the run is decided (recorded `skipped_overlap`).
        LogRefusal::Buffered(_) => Skip::OtherBuffered.decision(None),
        // Handled where the run is decided (recorded `skipped_paused`).
        LogRefusal::Paused(_) => Skip::Paused.decision(None),
        LogRefusal::BeforeHistory(from) => Skip::BeforeHistory {
            from: rfc3339(at(from)),
            job: settings.job.clone(),
        }
        .decision(None),
        LogRefusal::Finished(run) => Skip::FinishedMeanwhile(run).decision(None),
    }
}

/// What a run's call needs ahead of it beyond the job's timeout: `Date` is whole seconds, and
/// the call leaves a moment after the log's answer.
const CALL_MARGIN: Duration = Duration::from_secs(2);

/// `Ok` if a run whose log entry was written at `logged` (the write's `Date`) can still end
/// within the job's lease (running out at `lease`; none with `job_overlap = allow`) and within
/// the run's deadline, counted from `reserved` (the reservation's time as this tick read or
/// wrote it, at or before its outcome `running`, so the deadline is never later than the one
/// other ticks count), all by the storage server's clock, with the job's timeout and a margin
/// to spare. Else why not: the job is not called.
fn time_left(
    settings: &Settings,
    lease: Option<SystemTime>,
    reserved: SystemTime,
    logged: SystemTime,
) -> Result<(), String> {
    let deadline = reserved + settings.run_deadline();
    let ends = lease.map_or(deadline, |lease| lease.min(deadline));
    let left = ends.duration_since(logged).unwrap_or_default();
    if left >= settings.timeout + CALL_MARGIN {
        return Ok(());
    }
    Err(format!(
        "storage was slow before the job's call: the job's lease or its run's deadline has {} s \
         left, less than job_timeout_seconds ({} s) and {} s, so the run could outlive it; the \
         reservation was put back as it was",
        left.as_secs(),
        settings.timeout.as_secs(),
        CALL_MARGIN.as_secs()
    ))
}

#[cfg(test)]
mod tests;
