//! `POST /api/jobs/{job}/backfill`: runs the occurrences of a range that never ran, oldest
//! first, each at most once, within a call's bounds.

use std::time::Instant;

use leasegate::{Counting, Transport};
use leasegate_spin::timer::{Source, Tick};
use leasegate_spin::Context;

use crate::at;
use crate::attempt::{run_reserved, ReservedRun};
use crate::error::JobError;
use crate::log::{read_log, LogEntry};
use crate::reservation::{
    attempt_of, head, outcome_of, takeover, Reservation, RunStatus, Takeover,
};
use crate::run::Decision;
use crate::settings::Settings;
use crate::walk::{budget_spent, catch_up_one};

/// The most occurrences one backfill call looks at.
pub const BACKFILL_LOOK: usize = 200;

/// What a backfill call did.
#[derive(Debug, Default)]
pub struct BackfillReport {
    /// The occurrences it ran, oldest first: their entries.
    pub ran: Vec<LogEntry>,
    /// Occurrences in the range that ran already (or are running, or reserved by a tick at
    /// work): left alone.
    pub settled: u64,
    /// Occurrences it looked at.
    pub looked: u64,
    /// Where the next call should start (`from`), when the call's bounds stopped it.
    pub next: Option<u64>,
    /// Storage requests sent.
    pub round_trips: u32,
    /// Where the job's history begins, by its log (`None`: not known, a log of an older
    /// version; `Some(u64::MAX)`: no tick has begun it yet).
    pub history_from: Option<u64>,
    /// The range's `from` as asked, when the call moved it up to the job's history (nothing
    /// before a job's first tick is backfilled unless the call says `beforeHistory`).
    pub clamped_from: Option<u64>,
}

/// What a backfill asks: the range (Unix seconds, inclusive), and whether it runs occurrences
/// from before the job's history too (an operator who means it).
#[derive(Debug, Clone, Copy)]
pub struct BackfillAsk {
    /// The first second of the range.
    pub from: u64,
    /// The last second of the range.
    pub to: u64,
    /// Run occurrences before the job's history began too (`"beforeHistory": true`).
    pub before_history: bool,
}

/// `POST /api/jobs/{job}/backfill`: runs the schedule's occurrences from `from` to `to`
/// (inclusive, Unix seconds) that never ran (nobody reserved them, or they were recorded
/// `missed`, `skipped_paused` or `skipped_overlap`), oldest first, each at most once (the
/// reservation's compare-and-swap, as every run), `pastDue`, trigger `backfill`, none from
/// before the job's history unless asked. At most
/// [`CATCH_UP_RUNS`] runs and [`BACKFILL_LOOK`] occurrences a call, each run begun only if it
/// after the first can end within [`crate::walk::CATCH_UP_BUDGET`]; [`BackfillReport::next`]
/// says where to continue.
pub async fn backfill<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    ask: BackfillAsk,
    started: Instant,
) -> Result<BackfillReport, JobError> {
    let BackfillAsk { to, .. } = ask;
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let job = (ctx.connect)(settings.timeout);
    let blobs = settings.storage.blobs(&counting);
    let tick = Tick {
        at: ctx.now,
        source: Source::Backfill,
        past_due: true,
    };
    let mut report = BackfillReport::default();
    // The job's history bounds the range (a read of the log).
    let (log, _, _) = read_log(&blobs, settings, ctx.now).await?;
    report.history_from = match (log.history_begun(), log.history_from) {
        (false, _) => Some(u64::MAX),
        (true, 0) => None,
        (true, from) => Some(from),
    };
    let from = match report.history_from {
        Some(history) if history > ask.from && !ask.before_history => {
            report.clamped_from = Some(ask.from);
            history
        }
        _ => ask.from,
    };
    if from > to {
        // All of it before the history (or no history yet): nothing to look at.
        report.round_trips = counting.sent();
        return Ok(report);
    }
    let mut o = settings.next_occurrence(from.saturating_sub(1));
    while o <= to {
        if report.looked as usize == BACKFILL_LOOK
            || budget_spent(report.ran.len(), started, settings.timeout)
        {
            report.next = Some(o);
            break;
        }
        report.looked += 1;
        let blob = settings.reservation(o)?;
        let (props, date) = head(&blobs, &blob, ctx.now).await?;
        let entry = match props {
            None => catch_up_one(ctx, &blobs, &job, settings, &tick, o).await,
            Some(props) => {
                // (An attempt above the first means an earlier one ran.) A reservation left
                // without an outcome past its reserver's deadline (a tick whose log write
                // failed put it back so) never ran either.
                let server_now = date.unwrap_or(ctx.now);
                let abandoned = outcome_of(&props.metadata).is_none()
                    && takeover(&props, server_now, settings, false)
                        == Takeover::Run { attempt: 1 };
                let never_ran = attempt_of(&props.metadata) == 1
                    && (abandoned
                        || matches!(
                            outcome_of(&props.metadata),
                            Some(
                                RunStatus::Missed
                                    | RunStatus::SkippedPaused
                                    | RunStatus::SkippedOverlap
                                    | RunStatus::BeforeHistory
                            )
                        ));
                if never_ran {
                    let t = props.last_modified.unwrap_or(server_now);
                    let reservation = Reservation {
                        blob,
                        etag: props.etag,
                        metadata: props.metadata,
                        created: false,
                    };
                    let this = Tick {
                        at: at(o),
                        ..tick.clone()
                    };
                    let run = ReservedRun {
                        occurrence: o,
                        reserved_at: t,
                        server_now,
                        reservation,
                        skip_late: false,
                        attempt: 1,
                    };
                    match run_reserved(ctx, &blobs, &job, settings, &this, run).await? {
                        (Decision::Ran { entry } | Decision::JobFailed { entry }, _) => Some(entry),
                        _ => None,
                    }
                } else {
                    None
                }
            }
        };
        match entry {
            Some(entry) => report.ran.push(entry),
            None => report.settled += 1,
        }
        o = settings.next_occurrence(o);
    }
    report.round_trips = counting.sent();
    Ok(report)
}
