//! After a winning tick's own run: the earlier occurrences no tick settled (a buffered one run,
//! the missed ones caught up or recorded `missed`, a vanished reserver's or runner's settled by
//! the takeover rule), oldest first, within a tick's bounds.

use std::time::Instant;

use leasegate::BlobClient;
use leasegate::Transport;
use leasegate_spin::timer::Tick;
use leasegate_spin::web::rfc3339;
use leasegate_spin::Context;
use std::time::{Duration, SystemTime};

use crate::attempt::{run_reserved, ReservedRun};
use crate::error::JobError;
use crate::log::{advance_settled, change_log, change_log_from, open, Log, LogEntry, LogWrite};
use crate::reservation::{
    attempt_of, attempt_token, commit, head, outcome_of, reserve, reserved_on_time, takeover,
    Commit, OutcomeWrite, Over, Reservation, Reserved, Reserving, RunStatus, Takeover,
    META_RESERVED_BY,
};
use crate::run::{finished_in_log, Decision};
use crate::settings::{CatchUp, Settings};
use crate::{at, unix};

/// Earlier occurrences a winning tick looks at at most (each costs a read, and a write when its
/// reserver left it without an outcome, or a run when it is caught up).
pub(crate) const SETTLE_MAX: usize = 32;

/// Missed occurrences a tick runs at most (`job_catch_up = all`), one after another.
pub const CATCH_UP_RUNS: usize = 8;

/// After the tick's own run, its walk begins a further run (a retry, a takeover, a caught-up
/// occurrence) only if that run can end (the job's timeout) within this long of the walk's
/// start, the first such run excepted: it is begun whatever the job's timeout, so every tick
/// makes progress. Well inside an Azure Functions invocation's default limit (5 minutes) and
/// an HTTP scheduler's patience; a backfill call keeps to it from its own start.
pub(crate) const CATCH_UP_BUDGET: Duration = Duration::from_secs(120);

/// Whether a walk (or a backfill call) that began at `since` and has made `runs` runs stops
/// before another: at [`CATCH_UP_RUNS`], or when the next could not end within
/// [`CATCH_UP_BUDGET`]; never before its first.
pub(crate) fn budget_spent(runs: usize, since: Instant, timeout: Duration) -> bool {
    runs > 0 && (runs >= CATCH_UP_RUNS || since.elapsed() + timeout > CATCH_UP_BUDGET)
}

/// What a winning tick did for the occurrences before its own that no tick had settled.
#[derive(Debug, Default)]
pub struct CatchUpReport {
    /// The earlier occurrences it ran for the first time (missed ones with `job_catch_up =
    /// all`, a buffered one), oldest first: their entries.
    pub ran: Vec<LogEntry>,
    /// The later attempts it ran (`job_retries`: a failed attempt retried, a vanished run
    /// taken over), oldest first: their entries.
    pub retried: Vec<LogEntry>,
    /// How many it recorded `missed`.
    pub missed: u64,
    /// Whether some are left for the next ticks (its bounds were reached).
    pub more: bool,
}

impl CatchUpReport {
    /// The runs it made.
    fn runs(&self) -> usize {
        self.ran.len() + self.retried.len()
    }
}

/// An occurrence the walk settled, for the log: recorded `missed`, or a run's result brought
/// in line from its reservation.
struct Missed {
    /// Its entry.
    entry: LogEntry,
    /// The walk wrote `missed` on its reservation (the compare-and-swap of every outcome): a
    /// `running` or `pending` entry of it in the log is stale (its tick undid its outcome, or
    /// vanished before the job) and is replaced.
    settled: bool,
    /// Nobody reserved it; the log's entry for it when the walk looked: a `running` one still
    /// the same (no tick logged it since) is stale too.
    seen: Option<LogEntry>,
}

impl Missed {
    /// Records it in `log` (the log as read for the change); whether it did. An entry a tick
    /// wrote meanwhile (its clock behind: it ran) is left.
    fn record(&self, log: &mut crate::log::Log) -> bool {
        let o = self.entry.occurrence_unix;
        match log.entries.iter().position(|e| e.occurrence_unix == o) {
            None => {
                log.entries.push(self.entry.clone());
                true
            }
            Some(k) => {
                let e = &log.entries[k];
                let open = matches!(e.status, RunStatus::Running | RunStatus::Pending);
                let stale = open && (self.settled || self.seen.as_ref() == Some(e));
                if stale {
                    log.entries[k] = self.entry.clone();
                }
                stale
            }
        }
    }
}

/// Settles the occurrences between the log's `settled_through` and `occurrence` (this tick's,
/// which it ran) that have no entry in the log, oldest first, at most [`SETTLE_MAX`]:
/// * one nobody reserved (no deployment ticked it): with `job_catch_up = all` and within
///   `job_catch_up_window_seconds`, reserved and run now (`pastDue`, at most [`CATCH_UP_RUNS`]
///   a tick, each after the first begun only if it can end within [`CATCH_UP_BUDGET`]);
///   otherwise recorded
///   `missed` in the log (the log then refuses any later tick of it);
/// * a reservation its reserver left without an outcome past its deadline ([`takeover`]):
///   the outcome `missed` (by the same compare-and-swap as any outcome, so a reserver that
///   comes back late finds it settled) and an entry in the log;
/// * one with an outcome: settled as it is.
///
/// The first one still within its reserver's deadline (or `running`) stops the walk: a later
/// winner looks again. Nothing is read when the watermark is at the occurrence before this
/// one, as it is whenever every occurrence has a winner.
pub(crate) async fn settle_earlier<T, S: Transport, J: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    job: &J,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
    written: &LogWrite,
) -> CatchUpReport {
    let log = &written.log;
    let mut walk = Walk {
        ctx,
        blobs,
        job,
        settings,
        tick,
        // The budget counts from here, after the tick's own run.
        started: Instant::now(),
        report: CatchUpReport::default(),
        wrote: false,
        missed: Vec::new(),
        through: 0,
        extended: Vec::new(),
    };
    walk.run_buffered(log, occurrence).await;
    let candidates = walk.candidates(log, occurrence);
    if candidates.is_empty() {
        return walk.report;
    }
    for o in candidates {
        match walk.look_at(log, o).await {
            Flow::Settled => walk.through = o,
            Flow::Stop => break,
        }
    }
    walk.finish(written, occurrence).await
}

/// After one earlier occurrence: on to the next (this one settled), or stop (a later winner
/// looks again).
enum Flow {
    Settled,
    Stop,
}

/// A winner's walk over the earlier occurrences: what it reads, and what it found so far.
struct Walk<'a, T, S, J> {
    ctx: &'a Context<'a, T>,
    blobs: &'a BlobClient<&'a S>,
    job: &'a J,
    settings: &'a Settings,
    tick: &'a Tick,
    started: Instant,
    report: CatchUpReport,
    /// Whether the walk may have written the log since the tick's own last write (a run, a
    /// settled reservation brought in line): then the final change reads it first.
    wrote: bool,
    /// What it settled for the log: recorded missed, or brought in line.
    missed: Vec<Missed>,
    /// Every occurrence up to this one is settled.
    through: u64,
    /// Occurrences before the job's history that a tick reserved on time: in it after all.
    extended: Vec<u64>,
}

impl<'a, T, S: Transport, J: Transport> Walk<'a, T, S, J> {
    /// A buffered occurrence (`job_overlap = buffer_one`) waited for a run: this one, or one
    /// before it. Run now, `pastDue`.
    async fn run_buffered(&mut self, log: &Log, occurrence: u64) {
        let (ctx, blobs, settings) = (self.ctx, self.blobs, self.settings);
        let buffered: Vec<u64> = log
            .entries
            .iter()
            .filter(|e| e.status == RunStatus::Pending && e.occurrence_unix != occurrence)
            .map(|e| e.occurrence_unix)
            .collect();
        for o in buffered {
            self.wrote = true;
            match run_existing(ctx, blobs, self.job, settings, self.tick, o).await {
                Existing::Ran(entry) => self.report.ran.push(entry),
                Existing::NotNow => {}
                // Its reservation is gone (undone after a lost answer, cleaned up) or says
                // otherwise: the log's `pending` is brought in line, so it holds nothing.
                Existing::Other(outcome) => {
                    let _ = change_log(blobs, settings, ctx.now, |log, _| {
                        for e in log.entries.iter_mut() {
                            if e.occurrence_unix == o && e.status == RunStatus::Pending {
                                e.status = outcome.clone().unwrap_or(RunStatus::Missed);
                                if outcome.is_none() {
                                    e.reason = Some(
                                        "it was buffered, then its reservation was undone: \
                                         not run"
                                            .into(),
                                    );
                                    log.counters.missed += 1;
                                }
                            }
                        }
                        Ok::<(), ()>(())
                    })
                    .await;
                }
            }
        }
    }

    /// The occurrences between the watermark and `occurrence` without a settled entry, at
    /// most [`SETTLE_MAX`] (`more` when there are others).
    fn candidates(&mut self, log: &Log, occurrence: u64) -> Vec<u64> {
        let settings = self.settings;
        let mut candidates = Vec::new();
        let mut next = settings.next_occurrence(log.settled_through);
        while log.settled_through != 0 && next < occurrence {
            if candidates.len() == SETTLE_MAX {
                self.report.more = true;
                break;
            }
            let entry = log.entries.iter().find(|e| e.occurrence_unix == next);
            let settled = entry.is_some_and(|e| !open(e, settings));
            // (One the log dropped, with no entry now, was logged once: settled.)
            let trimmed = entry.is_none() && next <= log.trimmed_through;
            if next >= log.cleaned_before && !settled && !trimmed {
                candidates.push(next);
            }
            next = settings.next_occurrence(next);
        }
        candidates
    }

    /// One earlier occurrence: its reservation read, then settled by the rules.
    async fn look_at(&mut self, log: &Log, o: u64) -> Flow {
        let Ok(blob) = self.settings.reservation(o) else {
            return Flow::Stop;
        };
        let Ok((props, date)) = head(self.blobs, &blob, self.ctx.now).await else {
            return Flow::Stop;
        };
        let server_now = date.unwrap_or(self.ctx.now);
        // Before the job's history (the one before its first logged occurrence, which the walk
        // looks at once): nothing to settle, unless a tick reserved it on time (the first
        // tick, which vanished before any log existed): then it is in the history. A late
        // tick's reservation there is the clean-up's.
        if o < log.history_from {
            match &props {
                Some(p) if reserved_on_time(&p.metadata) => self.extended.push(o),
                _ => return Flow::Settled,
            }
        }
        match props {
            None => self.unreserved(log, o, server_now).await,
            Some(props) => self.reserved(log, o, blob, props, server_now).await,
        }
    }

    /// Nobody reserved it: caught up (`job_catch_up = all`, within the window) or recorded
    /// missed; nothing yet if it is not due.
    async fn unreserved(&mut self, log: &Log, o: u64, server_now: SystemTime) -> Flow {
        let settings = self.settings;
        // Not due yet by the storage server's clock (give or take the tick tolerance: a tick
        // this winner ran ahead, an admin's): nothing to say yet.
        if o + settings.tick_tolerance(at(o)).as_secs() >= unix(server_now) {
            return Flow::Stop;
        }
        // No deployment ticked it.
        let in_window = o + settings.catch_up_window.as_secs() >= unix(server_now);
        if settings.catch_up == CatchUp::All && in_window {
            if budget_spent(self.report.runs(), self.started, settings.timeout) {
                self.report.more = true;
                return Flow::Stop;
            }
            self.wrote = true;
            let (ctx, blobs) = (self.ctx, self.blobs);
            return match catch_up_one(ctx, blobs, self.job, settings, self.tick, o).await {
                Some(entry) => {
                    self.report.ran.push(entry);
                    Flow::Settled
                }
                None => Flow::Stop,
            };
        }
        let reason = if in_window {
            format!(
                "no deployment ticked it; job_catch_up is {}: recorded by {}",
                settings.catch_up.as_str(),
                settings.instance_id
            )
        } else {
            format!(
                "no deployment ticked it and it is older than job_catch_up_window_seconds \
                 ({} s): recorded by {}",
                settings.catch_up_window.as_secs(),
                settings.instance_id
            )
        };
        // A `running` entry in the log with no reservation: a run's start that a tick of an
        // older version logged before it deleted the reservation (its first log write's answer
        // lost). Replaced when recorded if still as seen.
        let seen = log.entries.iter().find(|e| e.occurrence_unix == o).cloned();
        self.missed.push(Missed {
            seen,
            settled: false,
            entry: LogEntry {
                occurrence: rfc3339(at(o)),
                occurrence_unix: o,
                instance: String::new(),
                reserved_at: rfc3339(server_now),
                status: RunStatus::Missed,
                fencing_token: None,
                trigger: self.tick.source.as_str().into(),
                past_due: false,
                finished_at: Some(rfc3339(server_now)),
                reason: Some(reason),
                attempt: None,
            },
        });
        Flow::Settled
    }

    /// Reserved: the takeover rule says what this winner may do.
    async fn reserved(
        &mut self,
        log: &Log,
        o: u64,
        blob: leasegate::BlobName,
        props: leasegate::ops::BlobProperties,
        server_now: SystemTime,
    ) -> Flow {
        let (ctx, blobs, settings) = (self.ctx, self.blobs, self.settings);
        let reservation = Reservation {
            blob,
            etag: props.etag.clone(),
            metadata: props.metadata.clone(),
            created: false,
        };
        let decided = takeover(&props, server_now, settings, true);
        if matches!(decided, Takeover::Run { .. } | Takeover::Settle(_)) {
            self.wrote = true;
            match finished_in_log(ctx, blobs, settings, o, &reservation, &props).await {
                // Its run finished (a result write was lost): brought in line, settled.
                Ok(true) => return Flow::Settled,
                Ok(false) => {}
                Err(_) => return Flow::Stop,
            }
        }
        match decided {
            // `running` (its runner within its deadline, or its log write on its way), or
            // reserved and within its reserver's deadline: a later winner looks again.
            Takeover::No => match outcome_of(&props.metadata) {
                Some(RunStatus::Running) | None => Flow::Stop,
                // Settled. A log entry still open for it (its run's end write was lost) is
                // brought in line with the reservation.
                Some(outcome) => {
                    let open = log.entries.iter().find(|e| {
                        e.occurrence_unix == o
                            && matches!(e.status, RunStatus::Running | RunStatus::Pending)
                    });
                    if let Some(open) = open {
                        let mut entry = open.clone();
                        entry.status = outcome;
                        entry.attempt = Some(attempt_of(&props.metadata));
                        entry.finished_at = Some(rfc3339(server_now));
                        self.missed.push(Missed {
                            entry,
                            settled: true,
                            seen: None,
                        });
                    }
                    Flow::Settled
                }
            },
            Takeover::Wait(_) => Flow::Stop,
            Takeover::Settle(status) => {
                let vanished = Vanished {
                    reservation,
                    props,
                    status,
                    server_now,
                };
                match settle_vanished(ctx, blobs, settings, self.tick, o, &vanished).await {
                    Ok(Some(entry)) => {
                        if entry.status == RunStatus::Missed {
                            self.missed.push(Missed {
                                seen: None,
                                settled: true,
                                entry,
                            });
                        }
                        Flow::Settled
                    }
                    // Another tick acted first (took it over, settled it): a later winner
                    // looks again.
                    Ok(None) | Err(_) => Flow::Stop,
                }
            }
            Takeover::Run { attempt } => {
                if budget_spent(self.report.runs(), self.started, settings.timeout) {
                    self.report.more = true;
                    return Flow::Stop;
                }
                let this = Tick {
                    at: at(o),
                    source: self.tick.source,
                    past_due: true,
                };
                let run = ReservedRun {
                    occurrence: o,
                    reserved_at: props.last_modified.unwrap_or(server_now),
                    server_now,
                    reservation,
                    skip_late: false,
                    attempt,
                };
                let ran = run_reserved(ctx, blobs, self.job, settings, &this, run).await;
                let Ok((Decision::Ran { entry } | Decision::JobFailed { entry }, _)) = ran else {
                    return Flow::Stop;
                };
                let open = entry.status == RunStatus::Failed && attempt <= settings.retries;
                match entry.attempt.unwrap_or(1) {
                    1 => self.report.ran.push(entry),
                    _ => self.report.retried.push(entry),
                }
                // Failed again with attempts left: a later winner retries after the delay.
                if open {
                    Flow::Stop
                } else {
                    Flow::Settled
                }
            }
        }
    }

    /// Records what the walk settled in the log, in one compare-and-swap (from the tick's own
    /// last write when the walk wrote nothing since), and moves the watermark.
    async fn finish(mut self, written: &LogWrite, occurrence: u64) -> CatchUpReport {
        if self.through == 0 && self.extended.is_empty() {
            return self.report;
        }
        let (settings, through) = (self.settings, self.through);
        let (missed, extended) = (&self.missed, &self.extended);
        let known = (!self.wrote).then(|| written.clone());
        let changed = change_log_from(self.blobs, settings, self.ctx.now, known, |log, read_at| {
            for m in missed {
                if m.record(log) {
                    log.counters.count(&m.entry.status);
                }
            }
            for o in extended {
                extend_history(log, settings, *o);
            }
            advance_settled(log, settings, occurrence, through, read_at);
            Ok::<(), ()>(())
        })
        .await;
        if let Ok(Ok(_)) = changed {
            self.report.missed = missed
                .iter()
                .filter(|m| m.entry.status == RunStatus::Missed)
                .count() as u64;
        }
        self.report
    }
}

/// Begins the job's history at `o` (before it, a reservation a tick made on time was found).
fn extend_history(log: &mut crate::log::Log, settings: &Settings, o: u64) {
    let tolerance = settings.tick_tolerance(at(o)).as_secs();
    log.history_from = log.history_from.min(o.saturating_sub(tolerance).max(1));
}

mod catch_up;
mod settle;
pub(crate) use catch_up::catch_up_one;
use catch_up::{run_existing, Existing};
pub(crate) use settle::{settle_vanished, Vanished};
