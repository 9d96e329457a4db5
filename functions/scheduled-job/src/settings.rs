//! The job's settings: its schedule (a calendar expression in a zone, or a period and an
//! offset), its timeouts, the catch-up and overlap policies, the retention, the tolerances of a
//! tick, and the job's lease term.

use leasegate::lease::Term;
use leasegate::BlobName;
use leasegate_spin::config::{self, check_name, ConfigError, Storage, Variables};
use leasegate_spin::record;
use leasegate_spin::schedule::Schedule;
use leasegate_spin::timer;
use std::time::{Duration, SystemTime};

use crate::{at, unix, LOG_ENTRIES};

/// How many occurrences back the log's settled-through watermark may lag at most (see
/// [`Settings::lookback`]).
pub(crate) const SETTLE_LOOKBACK: u64 = 64;

/// Seconds added to the job's timeout for the lease: the lease outlives the call it guards.
pub(crate) const LEASE_MARGIN_SECS: u64 = 10;

/// Whether a run may start while the previous one still holds the job's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Skip the occurrence (and log it).
    Skip,
    /// Run anyway, under a lease of its own.
    Allow,
    /// Keep it pending and run it as soon as the previous run ends (`pastDue`); a further one
    /// arriving meanwhile is skipped.
    BufferOne,
}

impl Overlap {
    /// The setting's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
            Overlap::BufferOne => "buffer_one",
        }
    }
}

/// What becomes of occurrences no deployment ticked (all were down): `job_catch_up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// The latest occurrence due runs (`pastDue` when late); earlier ones are recorded missed.
    Latest,
    /// Each runs, the one due now first, then the missed ones oldest first, within a tick's
    /// bounds (the rest on the next ticks).
    All,
    /// Only an occurrence ticked on time runs; the others are recorded missed.
    None,
}

impl CatchUp {
    /// The setting's word.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Latest => "latest",
            CatchUp::All => "all",
            CatchUp::None => "none",
        }
    }
}

/// The scheduled-job settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Storage.
    pub storage: Storage,
    /// This deployment's identity.
    pub instance_id: String,
    /// The job's name.
    pub job: String,
    /// When its occurrences are: `job_schedule` in `job_time_zone`, or every
    /// `job_period_seconds` plus `job_offset_seconds`.
    pub schedule: Schedule,
    /// The longest time between two occurrences: an interval's period; a calendar schedule's
    /// longest gap among its next 32 occurrences when the settings load. Sizes the retention
    /// and the log's lookback.
    pub period: Duration,
    /// What becomes of occurrences no deployment ticked.
    pub catch_up: CatchUp,
    /// Occurrences older than this (by the storage server's clock) are never caught up, only
    /// recorded missed.
    pub catch_up_window: Duration,
    /// Where the job is POSTed.
    pub job_url: String,
    /// How long the job's call may take.
    pub timeout: Duration,
    /// Overlap policy.
    pub overlap: Overlap,
    /// Attempts after the first for a failed run, or a run whose runner vanished
    /// (`job_retries`, default 0: at most once).
    pub retries: u32,
    /// How long after a failed attempt the next may start (`job_retry_delay_seconds`).
    pub retry_delay: Duration,
    /// Reservations are kept this long; older occurrences are refused.
    pub retention: Duration,
    /// How far ahead of the storage server's clock an occurrence may be; later ones are
    /// refused (a clock or a caller running ahead). Also how far behind this instance's
    /// clock an HTTP tick with the tick token may name an occurrence.
    pub early: Duration,
    /// The job's lease term (`job_overlap = skip`): the job's timeout, plus the storage steps
    /// around it (4 storage timeouts), plus a margin, rounded up to whole seconds; checked when
    /// the settings load.
    pub lease_term: Term,
}

/// A job name: 1 to 63 lowercase letters, digits, `-`, `_` or `.`, starting with a letter or
/// digit (it appears in blob names, URLs and Azure Functions function names).
pub fn check_job_name(name: &str) -> Result<(), String> {
    check_name(name, "job name")
}

impl Settings {
    /// Reads the settings from variables.
    pub fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        let instance_id = timer::instance_id(vars)?;
        let job = config::var(vars, "job_name").unwrap_or_else(|| "job".into());
        check_job_name(&job).map_err(|e| ConfigError(format!("variable job_name: {e}")))?;
        let whole = |name: &str, default: f64, range: std::ops::RangeInclusive<i64>| {
            whole_seconds(vars, name, default, range)
        };
        let schedule = schedule(vars)?;
        let period = longest_gap(&schedule);
        let timeout = whole("job_timeout_seconds", 30.0, 1..=3600)?;
        let catch_up = match config::var(vars, "job_catch_up").as_deref() {
            None | Some("latest") => CatchUp::Latest,
            Some("all") => CatchUp::All,
            Some("none") => CatchUp::None,
            Some(_) => {
                return Err(ConfigError(
                    "variable job_catch_up must be latest, all or none".into(),
                ))
            }
        };
        // Ten periods, at least an hour (as the retention's default): kept in reach of the
        // reservations, which are the guard against a second run.
        let ten_periods = (period.as_secs() * LOG_ENTRIES as u64).max(3600) as f64;
        let catch_up_window = whole("job_catch_up_window_seconds", ten_periods, 1..=31_536_000)?;
        let default_retention = ten_periods.max(catch_up_window.as_secs() as f64);
        let retention = whole("job_retention_seconds", default_retention, 60..=31_536_000)?;
        if retention < period {
            return Err(ConfigError(
                "variable job_retention_seconds must be at least one period".into(),
            ));
        }
        let early = whole("job_early_seconds", 300.0, 1..=31_536_000)?;
        let overlap = match config::var(vars, "job_overlap").as_deref() {
            None | Some("skip") => Overlap::Skip,
            Some("allow") => Overlap::Allow,
            Some("buffer_one") => Overlap::BufferOne,
            Some(_) => {
                return Err(ConfigError(
                    "variable job_overlap must be skip, allow or buffer_one".into(),
                ))
            }
        };
        let retries = config::number(vars, "job_retries", 0.0, 0..=100)?;
        if retries.fract() != 0.0 {
            return Err(ConfigError(
                "variable job_retries must be a whole number".into(),
            ));
        }
        let retries = retries as u32;
        let retry_delay = whole("job_retry_delay_seconds", 60.0, 0..=86_400)?;
        let job_url = config::url(vars, "job_url")?;
        let storage = config::storage(vars)?;
        let lease_term = lease_term(timeout, storage.timeout)?;
        // Reservations are kept past their reserver's deadline (the lease term) by a period at
        // least, so that one left without an outcome is settled before the clean-up deletes it:
        // the default grows to that, a setting below it is refused.
        // ... and past the last retry's start (`job_retries` x (the delay + a run's deadline)),
        // so a failed occurrence's retries find its reservation.
        let retry_span = (retry_delay + term_length(lease_term) + Duration::from_secs(2)) * retries;
        let keep = (term_length(lease_term) + period).max(retry_span + period);
        let retention = match config::var(vars, "job_retention_seconds") {
            None => retention.max(keep),
            Some(_) if retention < keep => {
                return Err(ConfigError(format!(
                    "variable job_retention_seconds must be at least the job's lease term plus \
                     one period, and the span of its retries (job_retries x \
                     (job_retry_delay_seconds + the lease term + 2 s)) plus one period ({} s)",
                    keep.as_secs()
                )))
            }
            Some(_) => retention,
        };
        // An occurrence is caught up only while its reservation (the guard against a second
        // run) is kept: the window is at most the retention.
        let catch_up_window = match config::var(vars, "job_catch_up_window_seconds") {
            None => catch_up_window.min(retention),
            Some(_) if catch_up_window > retention => {
                return Err(ConfigError(format!(
                    "variable job_catch_up_window_seconds must be at most the retention \
                     (job_retention_seconds: {} s): an older occurrence's reservation may be gone",
                    retention.as_secs()
                )))
            }
            Some(_) => catch_up_window,
        };
        Ok(Settings {
            storage,
            lease_term,
            instance_id,
            job,
            schedule,
            period,
            catch_up,
            catch_up_window,
            job_url,
            timeout,
            overlap,
            retries,
            retry_delay,
            retention,
            early,
        })
    }

    /// How long a reservation's reserver has to write its outcome: the job's lease term (see
    /// `reservation::takeover`).
    pub fn reservation_deadline(&self) -> Duration {
        term_length(self.lease_term)
    }

    /// How long a run may go without its outcome after the outcome `running` was written: the
    /// job's lease term (the job's timeout, the storage requests after it and a margin), and 2 s
    /// more (`Last-Modified` is whole seconds, so the lease it took just before has ended too).
    /// Past it, its runner has vanished, and any instance takes the occurrence over.
    pub fn run_deadline(&self) -> Duration {
        term_length(self.lease_term) + Duration::from_secs(2)
    }

    /// How far the clean-up watermark moves between two clean-ups, near `at`: 16 occurrences'
    /// worth (the shortest gap between occurrences there), at most half the retention, at least
    /// a second. A run whose end moves the watermark across a multiple of this deletes the
    /// reservations below it (a listing and a delete each, 16 a page, up to 8 pages: many times
    /// a stride's reservations, so a batch missed, or one grown by runs now and backfills, is
    /// caught up by the next); the other runs list nothing.
    pub fn clean_up_stride(&self, at: SystemTime) -> Duration {
        (self.schedule.shortest_gap_near(at) * 16)
            .min(self.retention / 2)
            .max(Duration::from_secs(1))
    }

    /// How early a trigger may fire for an occurrence, and how far the trigger time of a tick
    /// with the tick token may be from this instance's clock: `job_early_seconds`, but at most
    /// 10 s and half the shortest gap between occurrences near `at`, so that a time names one
    /// occurrence.
    pub fn tick_tolerance(&self, at: SystemTime) -> Duration {
        self.early
            .min(Duration::from_secs(10))
            .min(self.schedule.shortest_gap_near(at) / 2)
    }

    /// The occurrence a trigger at `at` stands for: the latest one due at `at`, counting one
    /// up to [`Settings::tick_tolerance`] ahead as due (a trigger that fires a little early).
    /// `None`: no occurrence since 1970.
    pub fn occurrence_at(&self, at: SystemTime) -> Option<u64> {
        let tolerance = self.tick_tolerance(at);
        self.schedule.latest_at_or_before(at + tolerance).map(unix)
    }

    /// The occurrence a tick with the tick token names for trigger time `at`, when `at` is
    /// within [`Settings::tick_tolerance`] of `now` (this instance's clock): the one due at
    /// `at` ([`Settings::occurrence_at`]), unless that is more than the tolerance ahead of
    /// `now`, then the one before it (the one due now). `None`: `at` is further from `now` (a
    /// manual run: the admin token's). So the tick token never names an occurrence more than
    /// the tolerance ahead of the clock.
    pub fn due_now(&self, at: SystemTime, now: SystemTime) -> Option<SystemTime> {
        let tolerance = self.tick_tolerance(now);
        let near = match at.duration_since(now) {
            Ok(ahead) => ahead <= tolerance,
            Err(behind) => behind.duration() <= tolerance,
        };
        if !near {
            return None;
        }
        let named = crate::at(self.occurrence_at(at)?);
        if named > now + tolerance {
            return self.schedule.previous(named);
        }
        Some(named)
    }

    /// How far behind the storage server's clock the log's settled-through watermark may lag
    /// at most: 64 occurrences, and at least the job's lease term (a reserver's deadline) plus
    /// two periods, so that it never passes a reservation before its deadline; with
    /// `job_catch_up = all`, at least the catch-up window (each missed one in it is run).
    pub(crate) fn lookback(&self) -> Duration {
        let lookback = (self.period * SETTLE_LOOKBACK as u32)
            .max(self.reservation_deadline() + self.period * 2)
            .max((self.retry_delay + self.run_deadline()) * self.retries + self.period * 2);
        match self.catch_up {
            CatchUp::All => lookback.max(self.catch_up_window),
            CatchUp::Latest | CatchUp::None => lookback,
        }
    }

    /// The first occurrence of the schedule after `t` (Unix seconds; `u64::MAX`: none).
    pub(crate) fn next_occurrence(&self, t: u64) -> u64 {
        self.schedule
            .next_after(at(t))
            .map(unix)
            .unwrap_or(u64::MAX)
    }

    /// The occurrence before `occurrence` (Unix seconds; 0: none).
    pub(crate) fn previous_occurrence(&self, occurrence: u64) -> u64 {
        self.schedule
            .previous(at(occurrence))
            .map(unix)
            .unwrap_or(0)
    }

    /// The prefix of the job's reservations, `jobs/{job}/occurrences/` (blob names: the
    /// toolkit's [`leasegate_spin::record`]).
    pub(crate) fn occurrences_prefix(&self) -> String {
        record::job_occurrences(&self.job)
    }

    pub(crate) fn reservation(&self, occurrence: u64) -> Result<BlobName, leasegate::Error> {
        BlobName::try_new(&record::reservation(&self.occurrences_prefix(), occurrence))
    }

    pub(crate) fn log_blob(&self) -> Result<BlobName, leasegate::Error> {
        BlobName::try_new(&record::job_log(&self.job))
    }
}

/// A variable of whole seconds, with its default and range.
fn whole_seconds(
    vars: &dyn Variables,
    name: &str,
    default: f64,
    range: std::ops::RangeInclusive<i64>,
) -> Result<Duration, ConfigError> {
    let v = config::number(vars, name, default, range)?;
    if v.fract() != 0.0 {
        return Err(ConfigError(format!(
            "variable {name} must be whole seconds"
        )));
    }
    Ok(Duration::from_secs(v as u64))
}

/// The schedule: `job_schedule` (in `job_time_zone`), or `job_period_seconds` and
/// `job_offset_seconds` (an interval: today's occurrences); not both kinds.
fn schedule(vars: &dyn Variables) -> Result<Schedule, ConfigError> {
    let whole = |name: &str, default: f64, range: std::ops::RangeInclusive<i64>| {
        whole_seconds(vars, name, default, range)
    };
    let interval_set = ["job_period_seconds", "job_offset_seconds"]
        .into_iter()
        .find(|name| config::var(vars, name).is_some());
    let Some(expression) = config::var(vars, "job_schedule") else {
        if config::var(vars, "job_time_zone").is_some() {
            return Err(ConfigError(
                "variable job_time_zone applies to job_schedule, which is not set (an interval \
                 schedule is in UTC)"
                    .into(),
            ));
        }
        let period = whole("job_period_seconds", 60.0, 1..=31_536_000)?;
        let offset = whole("job_offset_seconds", 0.0, 0..=31_536_000)?;
        if offset >= period {
            return Err(ConfigError(
                "variable job_offset_seconds must be less than job_period_seconds".into(),
            ));
        }
        return Schedule::interval(period, offset)
            .map_err(|e| ConfigError(format!("variable job_period_seconds: {e}")));
    };
    if let Some(name) = interval_set {
        return Err(ConfigError(format!(
            "variables job_schedule and {name} are both set: a job has one schedule (a cron \
             expression, or a period and an offset)"
        )));
    }
    let zone = config::var(vars, "job_time_zone").unwrap_or_else(|| "UTC".into());
    let schedule = Schedule::parse(&expression, &zone).map_err(|e| {
        let name = if e.0.starts_with("the time zone") {
            "job_time_zone"
        } else {
            "job_schedule"
        };
        ConfigError(format!("variable {name}: {e}"))
    })?;
    if schedule.next_after(SystemTime::now()).is_none() {
        return Err(ConfigError(format!(
            "variable job_schedule: the expression `{}` never occurs (no date matches it)",
            schedule.expression()
        )));
    }
    Ok(schedule)
}

/// The longest time between two of the schedule's next 32 occurrences (at least 1 s).
fn longest_gap(schedule: &Schedule) -> Duration {
    if let Some((period, _)) = schedule.period_and_offset() {
        return period;
    }
    let times = schedule.upcoming(SystemTime::now(), 32);
    times
        .windows(2)
        .filter_map(|w| w[1].duration_since(w[0]).ok())
        .max()
        .unwrap_or(Duration::from_secs(60))
        .max(Duration::from_secs(1))
}

/// The length of a lease term.
pub(crate) fn term_length(term: Term) -> Duration {
    match term {
        Term::Native(leasegate::LeaseDuration::Seconds(s)) => Duration::from_secs(u64::from(s)),
        Term::Record(d) => d,
        Term::Native(_) => Duration::from_secs(60),
    }
}

/// The job's lease term: `timeout + 4 x storage_timeout + 10 s`, rounded up to whole seconds
/// (terms are whole seconds; `storage_timeout_ms = 5100` makes 60.4 s, taken as 61 s). Always a
/// lease record, whatever its length: a record is taken with its claim in one write and given
/// back with another, whose new ETag the run's log keeps for the next run to start from, where
/// a native lease takes a lease request and a claim's write (docs/protocol.md, "Requests").
pub fn lease_term(timeout: Duration, storage_timeout: Duration) -> Result<Term, ConfigError> {
    let window = timeout + storage_timeout * 4 + Duration::from_secs(LEASE_MARGIN_SECS);
    let secs = window.as_secs() + u64::from(window.subsec_nanos() > 0);
    match Term::for_window(Duration::from_secs(secs)) {
        Ok(_) => Ok(Term::Record(Duration::from_secs(secs))),
        Err(e) => Err(ConfigError(format!(
            "variables job_timeout_seconds and storage_timeout_ms: the job's lease term \
             (job_timeout_seconds + 4 x storage_timeout_ms + {LEASE_MARGIN_SECS} s = {secs} s) \
             is not usable: {e}"
        ))),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::at;

    fn vars(period: u64, offset: u64, early: u64) -> std::collections::HashMap<String, String> {
        [
            ("instance_id", "node-u"),
            ("job_url", "http://127.0.0.1:9/job"),
            ("storage_origin", "http://127.0.0.1:10000"),
            ("storage_account", "devstoreaccount1"),
            ("storage_key", leasegate::DEV_ACCOUNT_KEY),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain([
            ("job_period_seconds".to_string(), period.to_string()),
            ("job_offset_seconds".to_string(), offset.to_string()),
            ("job_early_seconds".to_string(), early.to_string()),
        ])
        .collect()
    }

    /// The settings of a test deployment with `extra` variables (no period set unless given).
    pub(crate) fn settings_with(extra: &[(&str, &str)]) -> Settings {
        let mut v = vars(60, 0, 300);
        v.remove("job_period_seconds");
        v.remove("job_offset_seconds");
        v.remove("job_early_seconds");
        v.extend(
            extra
                .iter()
                .map(|(k, val)| (k.to_string(), val.to_string())),
        );
        Settings::load(&v).unwrap()
    }

    pub(crate) fn settings(period: u64, offset: u64, early: u64) -> Settings {
        Settings::load(&vars(period, offset, early)).unwrap()
    }

    #[test]
    fn the_clean_up_stride_is_sixteen_occurrences_at_most_half_the_retention() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_359_300);
        let every = |period: &str, retention: &str| {
            settings_with(&[
                ("job_period_seconds", period),
                ("job_retention_seconds", retention),
            ])
            .clean_up_stride(at)
        };
        assert_eq!(every("10", "3600"), Duration::from_secs(160));
        assert_eq!(every("60", "86400"), Duration::from_secs(960));
        assert_eq!(every("600", "7200"), Duration::from_secs(3600));
        let cron = settings_with(&[
            ("job_schedule", "*/5 * * * * *"),
            ("job_retention_seconds", "3600"),
        ]);
        assert_eq!(cron.clean_up_stride(at), Duration::from_secs(80));
    }

    #[test]
    fn lease_terms_round_up_to_whole_seconds() {
        let secs = Duration::from_secs;
        // 30 + 4 x 5.1 + 10 = 60.4 s: a 61 s record, not an error.
        assert_eq!(
            lease_term(secs(30), Duration::from_millis(5100)).unwrap(),
            Term::Record(secs(61))
        );
        // A record however short (one write to take it with its claim).
        assert_eq!(
            lease_term(secs(30), Duration::from_millis(5000)).unwrap(),
            Term::Record(secs(60))
        );
        // Every setting in range gives a usable term (storage_timeout_ms: 100..=60000).
        for t in [1, 30, 3600] {
            for ms in [100, 101, 5100, 33_333, 60_000] {
                assert!(
                    lease_term(secs(t), Duration::from_millis(ms)).is_ok(),
                    "{t} {ms}"
                );
            }
        }
    }

    #[test]
    fn the_tick_token_names_the_occurrence_due_now() {
        // A per-minute job with the default job_early_seconds (300): 10 s of tolerance.
        let s = settings(60, 0, 300);
        assert_eq!(s.tick_tolerance(at(N)), Duration::from_secs(10));
        const N: u64 = 1_795_765_620; // a minute
        let due = |t: u64, now: u64| s.due_now(at(t), at(now)).map(crate::unix);
        // The occurrence due now, named with the instance's time or a time a few seconds off.
        assert_eq!(due(N + 5, N + 5), Some(N));
        assert_eq!(due(N, N + 5), Some(N));
        assert_eq!(due(N + 1, N - 2), Some(N));
        // A time further off is a manual run: the next minute, a past one, one 40 s ahead.
        assert_eq!(due(N + 60, N + 5), None);
        assert_eq!(due(N - 60, N + 5), None);
        assert_eq!(due(N, N - 40), None);
        // A tick at N - 25 rounds to N, 25 s ahead: the one due is the minute before.
        assert_eq!(due(N - 25, N - 25), Some(N - 60));
        // Never more than the tolerance ahead of the clock.
        for now in (N - 60..N + 60).step_by(1) {
            for t in now - 10..=now + 10 {
                if let Some(o) = due(t, now) {
                    assert!(o <= now + 10, "{t} at {now}: {o}");
                }
            }
        }
        // A per-20-second job: the next occurrence, a period ahead, is a manual run.
        let twenty = settings(20, 0, 300);
        assert_eq!(twenty.due_now(at(N + 20), at(N)), None);
        // A per-5-second job: at most half a period of tolerance, so never two ahead.
        let fast = settings(5, 0, 300);
        assert_eq!(fast.tick_tolerance(at(N)), Duration::from_millis(2500));
        assert_eq!(fast.due_now(at(N + 10), at(N)), None);
        // A small job_early_seconds is the tolerance.
        assert_eq!(
            settings(60, 0, 3).tick_tolerance(at(N)),
            Duration::from_secs(3)
        );
    }

    #[test]
    fn retention_covers_a_reservers_deadline() {
        // A 330 s lease term (300 + 4 x 5 + 10) and a 5 s period: kept at least 335 s.
        let mut v = vars(5, 0, 300);
        v.insert("job_timeout_seconds".into(), "300".into());
        let s = Settings::load(&v).unwrap();
        assert_eq!(s.reservation_deadline(), Duration::from_secs(330));
        assert!(s.retention >= Duration::from_secs(3600));
        v.insert("job_timeout_seconds".into(), "3600".into());
        let s = Settings::load(&v).unwrap();
        assert_eq!(s.retention, Duration::from_secs(3600 + 30 + 5));
        v.insert("job_retention_seconds".into(), "600".into());
        let e = Settings::load(&v).unwrap_err().to_string();
        assert!(
            e.contains(
                "job_retention_seconds must be at least the job's lease term plus one period"
            ) && e.contains("(3635 s)"),
            "{e}"
        );
        // The lookback never passes a reservation before its deadline.
        v.insert("job_retention_seconds".into(), "7200".into());
        v.insert("job_timeout_seconds".into(), "300".into());
        let s = Settings::load(&v).unwrap();
        assert!(s.lookback() >= s.reservation_deadline() + s.period * 2);
    }

    #[test]
    fn next_occurrences_follow_period_and_offset() {
        let s = settings(60, 7, 300);
        assert_eq!(s.next_occurrence(0), 7);
        assert_eq!(s.next_occurrence(7), 67);
        assert_eq!(s.next_occurrence(66), 67);
        assert_eq!(s.next_occurrence(100), 127);
        // Off the grid (a period changed): the next point of today's grid.
        assert_eq!(settings(5, 0, 300).next_occurrence(61), 65);
    }
}
