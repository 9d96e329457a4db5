//! A tick's first steps as a plan (1 reserve, 2 refuse an occurrence out of range, and the
//! takeover rule for a reservation found): a pure function from what the tick knows and the
//! answers so far to its next step. The executor (`super::run_tick`) performs each step and
//! hands the reserved occurrence on to the attempt's plan (`crate::attempt`). The rules:
//! `docs/timer-functions.md`, "A tick, step by step".

use leasegate::ops::BlobProperties;
use leasegate::BlobName;
use leasegate_spin::timer::Source;
use std::time::SystemTime;

use super::{Asked, Decision};
use crate::attempt::skip::Skip;
use crate::attempt::ReservedRun;
use crate::reservation::{attempt_of, takeover, Reservation, Reserved, Takeover, META_RESERVED_BY};
use crate::settings::{Overlap, Settings};
use crate::walk::Vanished;
use crate::{at, unix};

/// What the tick knows before its first step.
pub(crate) struct Knows<'a> {
    pub(crate) settings: &'a Settings,
    /// What started the tick.
    pub(crate) source: Source,
    /// The occurrence (Unix seconds).
    pub(crate) occurrence: u64,
    /// Its reservation's name.
    pub(crate) blob: &'a BlobName,
    /// This instance's clock when the tick began.
    pub(crate) now: SystemTime,
    /// How the caller asked.
    pub(crate) asked: Asked,
}

/// A reservation as read: its properties (`None`: not there) and the read's `Date`.
pub(crate) type Read = (Option<BlobProperties>, Option<SystemTime>);

/// What the tick's steps answered so far (`None`: not asked yet).
#[derive(Default)]
pub(crate) struct Answers {
    /// [`Step::ReadFirst`]: the reservation as a late tick read it first.
    pub(crate) first: Option<Read>,
    /// [`Step::Reserve`]: created, or there already.
    pub(crate) reserved: Option<Reserved>,
    /// [`Step::AskFailedHere`]: whether a tick of this occurrence failed on this deployment (or
    /// the key-value store cannot tell).
    pub(crate) failed_here: Option<bool>,
    /// [`Step::Read`]: the reservation as read after its create was refused.
    pub(crate) read: Option<Read>,
    /// [`Step::CheckLog`]: whether the log says the running attempt finished (the reservation
    /// brought in line).
    pub(crate) finished_in_log: Option<bool>,
    /// [`Step::SettleVanished`]: the reason the log's entry gives (`None`: settled elsewhere).
    pub(crate) settled: Option<Option<String>>,
    /// [`Step::TakeBack`]: done (best effort).
    pub(crate) taken_back: bool,
}

/// What the executor does next.
#[derive(Debug)]
pub(crate) enum Step {
    /// Read the reservation before creating it (a late tick: most likely reserved already).
    ReadFirst,
    /// Create the reservation (`late`: later than the tick tolerance).
    Reserve { late: bool },
    /// Ask the key-value store whether a tick of this occurrence failed here.
    AskFailedHere,
    /// Read the reservation its create found there.
    Read,
    /// Before taking over a `running` reservation: whether the log says its attempt finished.
    CheckLog {
        reservation: Reservation,
        props: BlobProperties,
    },
    /// Settle a reservation whose runner vanished with no attempts left (or whose reserver
    /// left it without an outcome) with this outcome, in the log too.
    SettleVanished(Vanished),
    /// Delete the reservation this tick created (the occurrence is refused).
    TakeBack(Reservation),
    /// Reserved and in range: the attempt's plan takes it from here.
    Attempt(ReservedRun),
    /// The tick came to this.
    Done(Decision),
}

/// The tick's next step.
pub(crate) fn next(k: &Knows, a: &Answers) -> Step {
    let (settings, occurrence) = (k.settings, k.occurrence);
    // A tick later than the tick tolerance names an occurrence that is most likely reserved
    // already (every tick between two occurrences, when the trigger is more frequent than the
    // schedule): its reservation is read first, one request where a refused create and the read
    // are two. One the read does not find is created as on time.
    let late = k.now > at(occurrence) + settings.tick_tolerance(at(occurrence));
    if late && !k.asked.fresh_only {
        match &a.first {
            None => return Step::ReadFirst,
            Some((Some(props), date)) => return found(k, a, Some(props), *date),
            Some((None, _)) => {}
        }
    }
    // 1. Reserve.
    match &a.reserved {
        None => Step::Reserve { late },
        Some(Reserved::Created(r, t)) => in_range(k, a, reserved(k, *t, *t, r.clone(), 1)),
        // A run now is an occurrence of its own: one that exists (a scheduled one at this
        // second, another run now) is not touched.
        Some(Reserved::Exists) if k.asked.fresh_only => {
            Step::Done(Skip::RunNowTaken.decision(None))
        }
        // Reserved already, on time: by another deployment's tick, or by an earlier tick of
        // this one. Its reservation is read only when the read could change the answer or the
        // caller asked who reserved it; otherwise the refused create is the tick's one request.
        Some(Reserved::Exists) => {
            if !read_when_reserved(settings, k.source, k.asked.name_reserver) {
                match a.failed_here {
                    None => return Step::AskFailedHere,
                    Some(false) => return Step::Done(Skip::ReservedAlready.decision(None)),
                    Some(true) => {}
                }
            }
            match &a.read {
                None => Step::Read,
                Some((props, date)) => found(k, a, props.as_ref(), *date),
            }
        }
    }
}

/// Whether a tick whose create of the reservation was refused reads the reservation (one
/// request more): when the caller asked who reserved it, when an operator ticked it (a manual
/// tick acts on what it finds), and when a takeover could be due within the tick tolerance: a
/// buffered occurrence waiting for the previous run to end (`job_overlap = buffer_one`) or a
/// failed attempt waiting for its retry (`job_retries`). A tick later than the tolerance reads
/// first anyway. An on-time tick otherwise leaves a reserver that vanished to the takeover rule
/// of the later ticks (docs/timer-functions.md).
fn read_when_reserved(settings: &Settings, source: Source, name_reserver: bool) -> bool {
    name_reserver
        || matches!(source, Source::Manual | Source::Backfill)
        || settings.overlap == Overlap::BufferOne
        || settings.retries > 0
}

/// Step 1's end for a reservation that exists: the takeover rule says whether this tick acts,
/// and on which attempt. This instance reserved it on an earlier tick (or another tick of it
/// is at work on it now); or the rule lets any instance act: its reserver left it without an
/// outcome past its deadline, its runner vanished, or its run failed with attempts left. The
/// outcome's compare-and-swap lets one tick act.
fn found(k: &Knows, a: &Answers, props: Option<&BlobProperties>, date: Option<SystemTime>) -> Step {
    let props = props.cloned().unwrap_or_default();
    let server_now = date.unwrap_or(k.now);
    let reserved_by = props.metadata.get(META_RESERVED_BY).cloned();
    let mine = reserved_by.as_deref() == Some(k.settings.instance_id.as_str());
    let skipped = |skip: Skip| Step::Done(skip.decision(reserved_by.clone()));
    let decided = takeover(&props, server_now, k.settings, false);
    let reservation = Reservation {
        blob: k.blob.clone(),
        etag: props.etag.clone(),
        metadata: props.metadata.clone(),
        created: false,
    };
    if matches!(decided, Takeover::Run { .. } | Takeover::Settle(_)) {
        match a.finished_in_log {
            None => return Step::CheckLog { reservation, props },
            Some(true) => return skipped(Skip::FinishedInLog),
            Some(false) => {}
        }
    }
    let attempt = match decided {
        Takeover::Run { attempt } => attempt,
        Takeover::No if mine => 1,
        Takeover::No => return skipped(Skip::ReservedByOther),
        Takeover::Wait(wait) => {
            let failed = attempt_of(&props.metadata);
            let wait_secs = wait.as_secs();
            return skipped(Skip::RetryWait { failed, wait_secs });
        }
        Takeover::Settle(status) => {
            return match &a.settled {
                None => Step::SettleVanished(Vanished {
                    reservation,
                    props,
                    status,
                    server_now,
                }),
                Some(Some(reason)) => skipped(Skip::Logged(reason.clone())),
                Some(None) => skipped(Skip::SettledElsewhere),
            }
        }
    };
    let reserved_at = props.last_modified.unwrap_or(k.now);
    in_range(
        k,
        a,
        reserved(k, reserved_at, server_now, reservation, attempt),
    )
}

/// The occurrence as reserved: `reserved_at` (this instance's clock), `server_now` (the storage
/// server's clock then), on `attempt`.
fn reserved(
    k: &Knows,
    reserved_at: SystemTime,
    server_now: SystemTime,
    reservation: Reservation,
    attempt: u32,
) -> ReservedRun {
    ReservedRun {
        occurrence: k.occurrence,
        reserved_at,
        server_now,
        reservation,
        skip_late: k.asked.skip_late && attempt == 1,
        attempt,
    }
}

/// Step 2: occurrences too far from the storage server's clock are refused, every time: the
/// reservation this tick made is taken back. Else the attempt starts.
fn in_range(k: &Knows, a: &Answers, run: ReservedRun) -> Step {
    let settings = k.settings;
    let server_now = unix(run.server_now);
    let refusal = if server_now.saturating_sub(settings.retention.as_secs()) > k.occurrence {
        Some(Decision::TooOld {
            retention: settings.retention,
        })
    } else if k.occurrence > server_now.saturating_add(settings.early.as_secs()) {
        Some(Decision::TooEarly {
            early: settings.early,
        })
    } else {
        None
    };
    match refusal {
        Some(_) if run.reservation.created && !a.taken_back => Step::TakeBack(run.reservation),
        Some(refusal) => Step::Done(refusal),
        None => Step::Attempt(run),
    }
}

#[cfg(test)]
mod tests;
