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
use crate::log::{KeepLock, LogEntry, LogRefusal, LogWrite, Paused};
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
    /// The occurrence is too far ahead for a fencing token (the executor keeps the error).
    pub(crate) token_refused: bool,
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
    /// [`Step::Overwrite`]: whether the outcome was written over this attempt's own.
    pub(crate) overwritten: Option<Result<bool, Failed>>,
    /// [`Step::AppendAgain`]: the log took the entry that says why the occurrence did not run.
    pub(crate) appended_again: Option<Result<(), Failed>>,
}

/// What writing an outcome on the reservation came to.
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
    /// Write an outcome on the reservation by compare-and-swap (`running` over this attempt's
    /// predecessor; `missed`, `skipped_overlap` or `pending` over none).
    Commit {
        outcome: RunStatus,
        attempt: u32,
        over: Over,
    },
    /// Append the attempt's entry to the log (a run's start issues its token), starting from
    /// the log as read, keeping the lease's state.
    Append {
        entry: LogEntry,
        known: Option<LogWrite>,
        keep: Option<Keep>,
    },
    /// Write this outcome over the one this attempt wrote (`running` or `pending` that called
    /// nothing becomes `skipped_paused` or `skipped_overlap`).
    Overwrite {
        written: Reservation,
        outcome: RunStatus,
    },
    /// Append the entry that says why the occurrence did not run after all, from a fresh read
    /// of the log (`on`: the reservation it belongs to, as written).
    AppendAgain {
        entry: LogEntry,
        keep: Option<Keep>,
        on: Reservation,
    },
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

/// The job's lease for the log to keep: its state, kept only in place of `over` (the log's
/// `lock` as this tick read it; `None`: in place of anything).
#[derive(Debug, Clone)]
pub(crate) struct Keep {
    pub(crate) state: HeldState,
    pub(crate) over: Option<Option<serde_json::Value>>,
}

impl Keep {
    /// As the log's writes take it.
    pub(crate) fn lock(&self) -> KeepLock<'_> {
        KeepLock {
            state: &self.state,
            over: self.over.clone(),
        }
    }
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
    if k.token_refused {
        return Step::Fail(None);
    }
    if k.skip_late {
        let missed = |entry| Decision::Missed { entry };
        return record::not_run(k, a, record::missed_entry(k), None, missed);
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

/// `then`, once the job's lease (if this attempt holds one) is released: the holder's own
/// release comes before an answer, once.
fn release_then(a: &Answers, held: bool, then: Step) -> Step {
    if held && a.released.is_none() {
        return Step::Release;
    }
    then
}

/// `then`, once the reservation is put back as `how` says.
fn put_back_then(a: &Answers, how: PutBack, then: Step) -> Step {
    if a.put_back {
        then
    } else {
        Step::PutBack(how)
    }
}

/// A failure before the outcome `running` is written takes back the reservation this tick
/// created (a retry of the tick's 503 reserves afresh), then answers the error.
fn fail_before_outcome(k: &Knows, a: &Answers, slow: Option<String>) -> Step {
    if k.reservation.created && !a.put_back {
        return Step::PutBack(PutBack::TakeBack);
    }
    Step::Fail(slow)
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
        return record::buffer(k, a, known, &holder.label);
    }
    let overlapped = |entry| Decision::Overlapped { entry };
    record::not_run(k, a, record::overlap_entry(k), known, overlapped)
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

mod record;
mod run;
use run::run;

#[cfg(test)]
mod tests;
