//! The reservation log, `jobs/{job}/log.json`: a view of the last 10 outcomes, newest first,
//! changed by compare-and-swap on its ETag, with its clean-up and settled-through watermarks.

use leasegate::ops::{Condition, GetBlob, PutBlob, WriteOutcome};
use leasegate::BlobClient;
use leasegate::Transport;
use leasegate_spin::storage::execute_creating_container;
use leasegate_spin::timer::{self, Source};
use leasegate_spin::web::rfc3339;
use std::convert::Infallible;
use std::time::{Instant, SystemTime};

use crate::error::JobError;
use crate::reservation::RunStatus;
use crate::settings::Settings;
use crate::{unix, LOG_ENTRIES};

/// How many times a compare-and-swap of the log is tried before giving up.
pub(crate) const LOG_ATTEMPTS: usize = 8;

// The log's schema (the log, its entries, its counters, a pause) is the toolkit's `record`,
// shared with the CLI.
pub use leasegate_spin::record::{Counters, Log, LogEntry, Paused};

/// Reads the log: its content, its ETag (`None`: no log yet) and the server's `Date` (`now`
/// when the answer carried none).
pub async fn read_log<T: Transport>(
    blobs: &BlobClient<T>,
    settings: &Settings,
    now: SystemTime,
) -> Result<(Log, Option<leasegate::ETag>, SystemTime), JobError> {
    let (log, etag, date) = read_log_dated(blobs, settings, now).await?;
    Ok((log, etag, date.unwrap_or(now)))
}

/// [`read_log`], with the server's `Date` as the answer carried it.
pub(crate) async fn read_log_dated<T: Transport>(
    blobs: &BlobClient<T>,
    settings: &Settings,
    now: SystemTime,
) -> Result<(Log, Option<leasegate::ETag>, Option<SystemTime>), JobError> {
    let get = GetBlob {
        container: blobs.container().clone(),
        blob: settings.log_blob()?,
    };
    // A container not made yet (no tick has run): no log yet.
    let (blob, date) = match blobs.execute(&get, now).await {
        Err(e) if e.class() == Some(leasegate::ErrorClass::ContainerMissing) => (None, None),
        other => other?,
    };
    match blob {
        None => Ok((
            Log {
                job: settings.job.clone(),
                ..Log::default()
            },
            None,
            date,
        )),
        Some(content) => {
            let log: Log = serde_json::from_slice(&content.body).map_err(|_| {
                JobError::UnreadableLog(format!(
                    "the reservation log of job {} is not valid JSON",
                    settings.job
                ))
            })?;
            Ok((log, content.properties.etag, date))
        }
    }
}

/// The log as a write of this call left it: the server's `Date` of the write, the log as
/// written, its new ETag, and when the answer came (this instance's monotonic clock). A later
/// change in the same call starts from it instead of reading the log again
/// ([`change_log_from`]).
#[derive(Debug, Clone)]
pub(crate) struct LogWrite {
    /// The storage server's `Date` of the write.
    pub date: SystemTime,
    /// The log as written.
    pub log: Log,
    /// Whether this write moved the clean-up watermark across a multiple of
    /// [`Settings::clean_up_stride`]: the reservations below it are deleted now (set by
    /// [`update`], the end of a run).
    pub clean_up: bool,
    etag: Option<leasegate::ETag>,
    answered: Instant,
}

impl LogWrite {
    /// The log as this call read it (`read_log`): a change starts from it, at its ETag.
    pub(crate) fn read(log: Log, etag: Option<leasegate::ETag>, date: SystemTime) -> LogWrite {
        LogWrite {
            date,
            log,
            clean_up: false,
            etag,
            answered: Instant::now(),
        }
    }

    /// The job's lease as the log keeps it (`None`: not kept, or unusable).
    pub(crate) fn kept_lock(&self) -> Option<leasegate::lease::HeldState> {
        let lock = self.log.lock.as_ref()?;
        leasegate::lease::HeldState::from_json(&lock.to_string())
    }

    /// The log as this write left it, its ETag, and the storage server's time now as far as
    /// this instance can tell without a request: the write's `Date` plus the time since its
    /// answer, in whole seconds (rounded down, as a `Date` is). `None` without an ETag.
    fn start(self) -> Option<(Log, Option<leasegate::ETag>, SystemTime)> {
        let etag = self.etag?;
        let now = timer::server_time_since(self.date, self.answered);
        Some((self.log, Some(etag), now))
    }
}

/// Changes the log with `change` (given the server's time of the read) by compare-and-swap,
/// retrying lost races. `change` may refuse (`Err`): nothing is written. Returns the log as
/// written.
pub(crate) async fn change_log<T: Transport, R>(
    blobs: &BlobClient<T>,
    settings: &Settings,
    now: SystemTime,
    change: impl Fn(&mut Log, SystemTime) -> Result<(), R>,
) -> Result<Result<LogWrite, R>, JobError> {
    change_log_from(blobs, settings, now, None, change).await
}

/// [`change_log`], starting from `known`, the log as this call's own last write left it,
/// instead of reading it: no request whose answer the call already knows. The
/// compare-and-swap is on that write's ETag, so storage refuses it if anyone wrote the log
/// since; then the log is read and the change made again, as [`change_log`] does.
pub(crate) async fn change_log_from<T: Transport, R>(
    blobs: &BlobClient<T>,
    settings: &Settings,
    now: SystemTime,
    known: Option<LogWrite>,
    change: impl Fn(&mut Log, SystemTime) -> Result<(), R>,
) -> Result<Result<LogWrite, R>, JobError> {
    let mut known = known.and_then(LogWrite::start);
    for _ in 0..LOG_ATTEMPTS {
        let (mut log, etag, read_at) = match known.take() {
            Some(start) => start,
            None => read_log(blobs, settings, now).await?,
        };
        if let Err(refusal) = change(&mut log, read_at) {
            return Ok(Err(refusal));
        }
        // Newest first (a stable sort: entries of one occurrence keep their order).
        log.entries
            .sort_by_key(|e| std::cmp::Reverse(e.occurrence_unix));
        trim(&mut log, settings);
        // Strings, integers and booleans in maps and lists: serializing cannot fail.
        let body = serde_json::to_vec_pretty(&log).expect("a reservation log serializes");
        let sent_at = etag.clone();
        let condition = match etag {
            Some(e) => Condition::IfMatch(e),
            None => Condition::IfNotExists,
        };
        let put = PutBlob::block(blobs.container().clone(), settings.log_blob()?, body)
            .with_content_type("application/json")
            .with_condition(condition);
        let container = blobs.container().clone();
        match execute_creating_container(blobs, &container, &put, now).await {
            Ok((WriteOutcome::Written(w), date)) => {
                return Ok(Ok(LogWrite {
                    date: w.server_date.or(date).unwrap_or(now),
                    log,
                    clean_up: false,
                    etag: w.etag,
                    answered: Instant::now(),
                }))
            }
            Ok((WriteOutcome::Refused(_), _)) => continue,
            Err(e) if e.outcome_unknown() => {
                match read_back(blobs, settings, &log, sent_at, now).await {
                    ReadBack::Landed(written) => return Ok(Ok(written)),
                    // Not written: the change is made again on the log as read.
                    ReadBack::NotLanded(start) => known = Some(start),
                    ReadBack::Unknown => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(JobError::Contended(format!(
        "the reservation log of job {} kept changing: gave up after {LOG_ATTEMPTS} tries",
        settings.job
    )))
}

/// What a read after a write whose answer was lost (or a 5xx) tells of it.
enum ReadBack {
    /// The log holds what the write wrote: it landed (or someone wrote the same), as read.
    Landed(LogWrite),
    /// The log is as the write found it (the ETag it was sent at; no log, for a create): it did
    /// not land. The log as read, to change again.
    NotLanded((Log, Option<leasegate::ETag>, SystemTime)),
    /// The log changed since, to something else (or the read failed): whether the write landed
    /// before that is not known.
    Unknown,
}

/// Reads the log after a write of `written` at `sent_at` (`None`: a create) lost its answer:
/// one request, on that rare path, so that a lost answer to any write of the log is known for
/// what it was instead of failing the call (a tick that wrote its run's start and then gave up
/// would leave the log saying `running` for a run that never happens).
async fn read_back<T: Transport>(
    blobs: &BlobClient<T>,
    settings: &Settings,
    written: &Log,
    sent_at: Option<leasegate::ETag>,
    now: SystemTime,
) -> ReadBack {
    let Ok((log, etag, read_at)) = read_log(blobs, settings, now).await else {
        return ReadBack::Unknown;
    };
    if etag.is_some() && log == *written {
        return ReadBack::Landed(LogWrite::read(log, etag, read_at));
    }
    if etag == sent_at {
        return ReadBack::NotLanded((log, etag, read_at));
    }
    ReadBack::Unknown
}

/// Keeps the last [`LOG_ENTRIES`] entries (newest first), and any older one still open (a run
/// going, a buffered one, a failed one with retries left) above the clean-up watermark: the
/// log is where they are known, and they hold the settled-through watermark. What it drops
/// raises `trimmedThrough` (the newest occurrence ever dropped).
pub(crate) fn trim(log: &mut Log, settings: &Settings) {
    let mut kept = 0;
    let (cleaned_before, mut trimmed) = (log.cleaned_before, log.trimmed_through);
    log.entries.retain(|e| {
        kept += 1;
        let keep =
            kept <= LOG_ENTRIES || (open(e, settings) && e.occurrence_unix >= cleaned_before);
        if !keep {
            trimmed = trimmed.max(e.occurrence_unix);
        }
        keep
    });
    log.trimmed_through = trimmed;
}

/// Why the log refused an entry.
#[derive(Debug, Clone)]
pub(crate) enum LogRefusal {
    /// The occurrence is before the log's clean-up watermark.
    TooOld,
    /// Another occurrence is buffered already (`job_overlap = buffer_one`): this one is
    /// skipped.
    Buffered(u64),
    /// The occurrence is at or below the settled-through watermark with no entry: it was
    /// recorded missed (no deployment ticked it in time), so it is not run.
    Settled,
    /// The job is paused (since when, why): the occurrence is not run (a manual run or a
    /// backfill is).
    Paused(Paused),
    /// The occurrence was due before the job's history began (at this time, Unix seconds):
    /// not run, not recorded.
    BeforeHistory(u64),
    /// The log records this attempt of the occurrence finished (this outcome): another tick
    /// settled it while this one was at work (its runner taken for vanished), so it is not
    /// run.
    Finished(RunStatus),
}

/// The job's lease for the log to keep ([`Log::lock`]), for the next run to start from.
pub(crate) struct KeepLock<'a> {
    /// The lease as this tick's acquire or release left it.
    pub(crate) state: &'a leasegate::lease::HeldState,
    /// Kept only in place of this (the log's `lock` as the tick read it: nobody kept a newer
    /// state since); `None`: in place of anything (a run's start: its holder is the newest).
    pub(crate) over: Option<Option<serde_json::Value>>,
}

impl KeepLock<'_> {
    /// Keeps the state in `log`, where its rule allows.
    fn keep(&self, log: &mut Log) {
        let Ok(state) = serde_json::from_str::<serde_json::Value>(&self.state.to_json()) else {
            return;
        };
        if self.over.as_ref().is_none_or(|over| *over == log.lock) {
            log.lock = Some(state);
        }
    }
}

/// Adds the run's entry (in place of any entry for its occurrence), unless the occurrence is
/// before the clean-up watermark, or was settled without an entry (recorded missed). Starts
/// from `known` (the log as this call last read or wrote it) when given. `lock`: the job's
/// lease as this run's acquire (or, for a tick that ran nothing, its release) left it, kept
/// in the log for the next run. Returns the log as written.
pub(crate) async fn append<T: Transport>(
    blobs: &BlobClient<T>,
    settings: &Settings,
    entry: &LogEntry,
    from: Append<'_>,
    now: SystemTime,
) -> Result<Result<LogWrite, LogRefusal>, JobError> {
    let Append {
        known,
        lock,
        reserved_on_time,
    } = from;
    let occurrence = entry.occurrence_unix;
    let before = std::cell::Cell::new(None);
    let written = change_log_from(blobs, settings, now, known, |log, read_at| {
        before.set(None);
        if occurrence < log.cleaned_before {
            return Err(LogRefusal::TooOld);
        }
        // An operator's run (`manual`: an admin naming an occurrence, a run now; `backfill`,
        // `rerun`) is run while paused, and below the settled-through watermark; only a
        // backfill or a rerun runs one recorded missed.
        let trigger = entry.trigger.as_str();
        let backfill = trigger == Source::Backfill.as_str() || trigger == Source::Rerun.as_str();
        let operator = trigger == Source::Manual.as_str() || backfill;
        if !log.history_begun() {
            let from = history_start(settings, occurrence, reserved_on_time, read_at);
            log.history_from = from;
            // Winners look from one occurrence further back than this one: a tick that
            // reserved it on time and vanished before any log existed left it there, and it is
            // then in the history (walk.rs settles it); one nobody reserved is passed over.
            log.settled_through = settings
                .previous_occurrence(settings.previous_occurrence(occurrence))
                .max(1);
            if occurrence < from && !operator {
                // Due before the job's history: the log begins it, and records nothing of this
                // occurrence (everything up to it is before the history, so no winner counts it
                // missed).
                log.job = settings.job.clone();
                before.set(Some(from));
                return Ok(());
            }
        }
        if let Some(paused) = log.paused.as_ref().filter(|_| !operator) {
            if entry.status == RunStatus::Running {
                return Err(LogRefusal::Paused(paused.clone()));
            }
        }
        let prior = log
            .entries
            .iter()
            .find(|e| e.occurrence_unix == entry.occurrence_unix);
        let recorded_missed = prior.is_some_and(|e| e.status == RunStatus::Missed);
        if entry.status == RunStatus::Pending {
            if let Some(other) = log.entries.iter().find(|e| {
                e.status == RunStatus::Pending && e.occurrence_unix != entry.occurrence_unix
            }) {
                return Err(LogRefusal::Buffered(other.occurrence_unix));
            }
        }
        // (A later attempt's reservation shows the occurrence ran: it was never recorded missed.)
        let settled_before = entry.occurrence_unix <= log.settled_through
            && prior.is_none()
            && entry.attempt.unwrap_or(1) == 1;
        if (recorded_missed && !backfill) || (settled_before && !operator) {
            return Err(LogRefusal::Settled);
        }
        // A run's start never reopens an occurrence the log says succeeded, nor its own
        // attempt once it failed, nor goes back behind a later attempt (another tick took its
        // runner for vanished).
        if let Some(prior) = prior.filter(|p| {
            let (mine, theirs) = (entry.attempt.unwrap_or(1), p.attempt.unwrap_or(1));
            entry.status == RunStatus::Running
                && (p.status == RunStatus::Succeeded
                    || theirs > mine
                    || (theirs == mine && p.status == RunStatus::Failed))
        }) {
            return Err(LogRefusal::Finished(prior.status.clone()));
        }
        // A later attempt of an occurrence the watermark passed (its failure was final then):
        // the watermark goes back before it, so winners look at it again until it settles.
        if entry.status == RunStatus::Running
            && entry.attempt.unwrap_or(1) > 1
            && occurrence <= log.settled_through
        {
            log.settled_through = settings.previous_occurrence(occurrence).max(1);
        }
        let mut entry = entry.clone();
        if entry.status == RunStatus::Running {
            entry.fencing_token = Some(log.issue_token(entry.fencing_token.unwrap_or(0)));
        } else {
            log.counters.count(&entry.status);
        }
        log.job = settings.job.clone();
        log.entries
            .retain(|e| e.occurrence_unix != entry.occurrence_unix);
        log.entries.push(entry);
        advance_settled(log, settings, occurrence, 0, read_at);
        if let Some(lock) = &lock {
            lock.keep(log);
        }
        Ok(())
    })
    .await?;
    Ok(match (written, before.get()) {
        (Ok(_), Some(from)) => Err(LogRefusal::BeforeHistory(from)),
        (Ok(written), None) => Ok(written),
        (Err(refusal), _) => Err(refusal),
    })
}

/// Where a job's history begins when the first log write of it is for `occurrence`, at
/// `read_at` (the storage server's clock of the log's read): that time less the tick tolerance,
/// so that the occurrence due within the tolerance of the first tick is in it; or, when the
/// occurrence was reserved on time (its tick was the first, and vanished or is slow), from the
/// occurrence less the tolerance.
fn history_start(settings: &Settings, occurrence: u64, on_time: bool, read_at: SystemTime) -> u64 {
    let first = match on_time {
        true => read_at.min(crate::at(occurrence)),
        false => read_at,
    };
    unix(first)
        .saturating_sub(settings.tick_tolerance(first).as_secs())
        .max(1)
}

/// What [`append`] starts from besides its entry.
pub(crate) struct Append<'a> {
    /// The log as this call last read or wrote it, if it did.
    pub(crate) known: Option<LogWrite>,
    /// The job's lease for the log to keep.
    pub(crate) lock: Option<KeepLock<'a>>,
    /// Whether the entry's occurrence was reserved on time (where a first log write begins the
    /// job's history).
    pub(crate) reserved_on_time: bool,
}

impl<'a> Append<'a> {
    /// From `known` and `lock`, for an occurrence reserved as `reservation` says.
    pub(crate) fn from(
        known: Option<LogWrite>,
        lock: Option<KeepLock<'a>>,
        reservation: &crate::reservation::Reservation,
    ) -> Self {
        Append {
            known,
            lock,
            reserved_on_time: crate::reservation::reserved_on_time(&reservation.metadata),
        }
    }
}

/// Moves the log's `settled_through` watermark up: over the occurrences that have an entry,
/// and up to `through` (occurrences `settle_earlier` found settled). A log without one (new,
/// or rewritten by an older version) starts just before its oldest entry, so the gaps between
/// its entries are looked at once (a new log: just before `newest`). The watermark never lags
/// more than [`Settings::lookback`] behind `server_now` (the storage server's clock).
pub(crate) fn advance_settled(
    log: &mut Log,
    settings: &Settings,
    newest: u64,
    through: u64,
    server_now: SystemTime,
) {
    if log.settled_through == 0 {
        log.settled_through = log
            .entries
            .iter()
            .map(|e| e.occurrence_unix)
            .min()
            .unwrap_or(newest)
            .saturating_sub(1)
            .min(settings.previous_occurrence(newest))
            .max(1);
    }
    // Never past an occurrence the log shows still open (running, buffered, failed with
    // retries left): its run is not settled yet.
    let open_before = log
        .entries
        .iter()
        .filter(|e| open(e, settings) && e.occurrence_unix >= log.cleaned_before)
        .map(|e| e.occurrence_unix.saturating_sub(1))
        .min()
        .unwrap_or(u64::MAX);
    let floor = unix(server_now)
        .saturating_sub(settings.lookback().as_secs())
        .min(open_before);
    if floor > log.settled_through.max(through) {
        // Occurrences older than the lookback that the log does not know: no winner since
        // looked at them (each looks at the ones before its own, a few a tick): counted
        // missed, in one entry.
        let (count, first, last) = unlogged_between(log, settings, log.settled_through, floor);
        if count > 0 {
            log.counters.missed += count;
            log.entries.push(LogEntry {
                occurrence: rfc3339(crate::at(last)),
                occurrence_unix: last,
                instance: String::new(),
                reserved_at: rfc3339(server_now),
                status: RunStatus::Missed,
                fencing_token: None,
                trigger: String::new(),
                past_due: false,
                finished_at: Some(rfc3339(server_now)),
                reason: Some(format!(
                    "{count} occurrence(s) from {} to {} are not in the log and are older than \
                     the lookback ({} s): no deployment ticked them, or none settled them in \
                     time; not caught up",
                    rfc3339(crate::at(first)),
                    rfc3339(crate::at(last)),
                    settings.lookback().as_secs()
                )),
                attempt: None,
            });
        }
    }
    log.settled_through = log.settled_through.max(through).max(floor);
    loop {
        let next = settings.next_occurrence(log.settled_through);
        let settled = next < log.cleaned_before
            || log
                .entries
                .iter()
                .any(|e| e.occurrence_unix == next && !open(e, settings));
        if next > newest || !settled {
            break;
        }
        log.settled_through = next;
    }
}

/// Whether a logged occurrence may still change: `running` (its run going, or its runner
/// vanished), or `failed` with attempts left (`job_retries`).
pub(crate) fn open(entry: &LogEntry, settings: &Settings) -> bool {
    match entry.status {
        RunStatus::Running | RunStatus::Pending => true,
        RunStatus::Failed => entry.attempt.unwrap_or(1) <= settings.retries,
        _ => false,
    }
}

/// The occurrences after `after` up to `through` with no entry in the log: how many (at most
/// [`COUNT_MAX`] looked at), the first and the last.
fn unlogged_between(log: &Log, settings: &Settings, after: u64, through: u64) -> (u64, u64, u64) {
    let (mut count, mut first, mut last) = (0, 0, 0);
    let mut next = settings.next_occurrence(after);
    let mut looked = 0;
    while next <= through && looked < COUNT_MAX {
        let unknown = next > log.trimmed_through
            && next >= log.cleaned_before
            && next >= log.history_from
            && !log.entries.iter().any(|e| e.occurrence_unix == next);
        if unknown {
            count += 1;
            if first == 0 {
                first = next;
            }
            last = next;
        }
        next = settings.next_occurrence(next);
        looked += 1;
    }
    (count, first, last)
}

/// The most occurrences counted between two watermarks.
pub(crate) const COUNT_MAX: u64 = 10_000;

/// Records the run's result, its end stamped with the server's clock, and moves the clean-up
/// watermark up to the retention. `before`: the log as the run's start wrote it ([`append`]),
/// so that the end reads the log only if something else wrote it during the run. Returns the
/// log as written, and whether the watermark crossed a multiple of the clean-up stride
/// ([`Settings::clean_up_stride`]): then the reservations below it are deleted, in one batch,
/// instead of a listing after every run. `lock`: the job's lease as this run's release left
/// it, kept in place of the state this run's start kept (never over a later run's).
pub(crate) async fn update<T: Transport>(
    blobs: &BlobClient<T>,
    settings: &Settings,
    entry: &LogEntry,
    before: Option<LogWrite>,
    lock: Option<KeepLock<'_>>,
    now: SystemTime,
) -> Result<LogWrite, JobError> {
    let crossed = std::cell::Cell::new(false);
    let written = change_log_from(blobs, settings, now, before, |log, read_at| {
        if let Some(lock) = &lock {
            lock.keep(log);
        }
        // The run's own entry (added again if the log lost it: the reservation holds the
        // outcome, the log shows it).
        log.entries
            .retain(|e| e.occurrence_unix != entry.occurrence_unix);
        let mut done = entry.clone();
        done.finished_at = Some(rfc3339(read_at));
        log.counters.count(&done.status);
        if done.attempt.unwrap_or(1) > 1 {
            log.counters.retried += 1;
        }
        log.entries.push(done);
        let cutoff = unix(read_at).saturating_sub(settings.retention.as_secs());
        let stride = settings.clean_up_stride(read_at).as_secs().max(1);
        crossed.set(cutoff / stride > log.cleaned_before / stride);
        log.cleaned_before = log.cleaned_before.max(cutoff);
        advance_settled(log, settings, entry.occurrence_unix, 0, read_at);
        Ok::<(), Infallible>(())
    })
    .await?;
    let Ok(written) = written;
    Ok(LogWrite {
        clean_up: crossed.get(),
        ..written
    })
}

#[cfg(test)]
mod tests;
