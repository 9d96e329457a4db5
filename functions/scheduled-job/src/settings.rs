//! The job's settings: its schedule (a period and an offset), its timeouts, the overlap
//! policy, the retention, the tolerances of a tick, and the job's lease term.

use leasegate::lease::Term;
use leasegate::BlobName;
use leasegate_spin::config::{self, check_name, ConfigError, Storage, Variables};
use leasegate_spin::timer;
use std::time::{Duration, SystemTime};

use crate::LOG_ENTRIES;

/// Seconds added to the job's timeout for the lease: the lease outlives the call it guards.
pub(crate) const LEASE_MARGIN_SECS: u64 = 10;

/// Whether a run may start while the previous one still holds the job's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Skip the occurrence (and log it).
    Skip,
    /// Run anyway, under a lease of its own.
    Allow,
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
    /// Its period: occurrences are multiples of it (plus `offset`) since the Unix epoch.
    pub period: Duration,
    /// The occurrences' offset within the period (a nightly job at 02:00: 7200 s).
    pub offset: Duration,
    /// Where the job is POSTed.
    pub job_url: String,
    /// How long the job's call may take.
    pub timeout: Duration,
    /// Overlap policy.
    pub overlap: Overlap,
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
            let v = config::number(vars, name, default, range)?;
            if v.fract() != 0.0 {
                return Err(ConfigError(format!(
                    "variable {name} must be whole seconds"
                )));
            }
            Ok(Duration::from_secs(v as u64))
        };
        let period = whole("job_period_seconds", 60.0, 1..=31_536_000)?;
        let offset = whole("job_offset_seconds", 0.0, 0..=31_536_000)?;
        if offset >= period {
            return Err(ConfigError(
                "variable job_offset_seconds must be less than job_period_seconds".into(),
            ));
        }
        let timeout = whole("job_timeout_seconds", 30.0, 1..=3600)?;
        let default_retention = (period.as_secs() * LOG_ENTRIES as u64).max(3600) as f64;
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
            Some(_) => {
                return Err(ConfigError(
                    "variable job_overlap must be skip or allow".into(),
                ))
            }
        };
        let job_url = config::url(vars, "job_url")?;
        let storage = config::storage(vars)?;
        let lease_term = lease_term(timeout, storage.timeout)?;
        Ok(Settings {
            storage,
            lease_term,
            instance_id,
            job,
            period,
            offset,
            job_url,
            timeout,
            overlap,
            retention,
            early,
        })
    }

    /// How long a reservation's reserver has to write its outcome: the job's lease term (see
    /// [`abandoned`]).
    pub fn reservation_deadline(&self) -> Duration {
        term_length(self.lease_term)
    }

    /// How far the trigger time of a tick with the tick token may be from this instance's
    /// clock: `job_early_seconds`, but at most 10 s and half a period, so that the occurrence
    /// it names is the one due now (or, at a boundary, the one just before or after).
    pub fn tick_tolerance(&self) -> Duration {
        self.early.min(Duration::from_secs(10)).min(self.period / 2)
    }

    /// Whether a tick for trigger time `at` names the occurrence due at `now` (this instance's
    /// clock): the occurrence of a time within [`Settings::tick_tolerance`] of `now`.
    pub fn due_now(&self, at: SystemTime, now: SystemTime) -> bool {
        let named = timer::occurrence(at, self.period, self.offset);
        let tolerance = self.tick_tolerance();
        [
            now.checked_sub(tolerance).unwrap_or(now),
            now,
            now + tolerance,
        ]
        .iter()
        .any(|t| timer::occurrence(*t, self.period, self.offset) == named)
    }

    /// The first occurrence of the schedule after `t` (Unix seconds).
    pub(crate) fn next_occurrence(&self, t: u64) -> u64 {
        let (p, o) = (self.period.as_secs().max(1), self.offset.as_secs());
        if t < o {
            return o;
        }
        ((t - o) / p + 1).saturating_mul(p).saturating_add(o)
    }

    pub(crate) fn occurrences_prefix(&self) -> String {
        format!("jobs/{}/occurrences/", self.job)
    }

    pub(crate) fn reservation(&self, occurrence: u64) -> Result<BlobName, leasegate::Error> {
        BlobName::try_new(&format!("{}{occurrence:012}", self.occurrences_prefix()))
    }

    pub(crate) fn log_blob(&self) -> Result<BlobName, leasegate::Error> {
        BlobName::try_new(&format!("jobs/{}/log.json", self.job))
    }
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
/// (terms are whole seconds; `storage_timeout_ms = 5100` makes 60.4 s, taken as 61 s).
pub fn lease_term(timeout: Duration, storage_timeout: Duration) -> Result<Term, ConfigError> {
    let window = timeout + storage_timeout * 4 + Duration::from_secs(LEASE_MARGIN_SECS);
    let secs = window.as_secs() + u64::from(window.subsec_nanos() > 0);
    Term::for_window(Duration::from_secs(secs)).map_err(|e| {
        ConfigError(format!(
            "variables job_timeout_seconds and storage_timeout_ms: the job's lease term \
             (job_timeout_seconds + 4 x storage_timeout_ms + {LEASE_MARGIN_SECS} s = {secs} s) \
             is not usable: {e}"
        ))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::at;

    pub(crate) fn settings(period: u64, offset: u64, early: u64) -> Settings {
        let vars: std::collections::HashMap<String, String> = [
            ("instance_id", "node-u"),
            ("job_url", "http://127.0.0.1:9/job"),
            ("storage_origin", "http://127.0.0.1:10000"),
            ("storage_account", "devstoreaccount1"),
            ("storage_key", leasegate::account::DEV_ACCOUNT_KEY),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain([
            ("job_period_seconds".to_string(), period.to_string()),
            ("job_offset_seconds".to_string(), offset.to_string()),
            ("job_early_seconds".to_string(), early.to_string()),
        ])
        .collect();
        Settings::load(&vars).unwrap()
    }

    #[test]
    fn lease_terms_round_up_to_whole_seconds() {
        let secs = Duration::from_secs;
        // 30 + 4 x 5.1 + 10 = 60.4 s: a 61 s record, not an error.
        assert_eq!(
            lease_term(secs(30), Duration::from_millis(5100)).unwrap(),
            Term::Record(secs(61))
        );
        assert_eq!(
            lease_term(secs(30), Duration::from_millis(5000)).unwrap(),
            Term::Native(leasegate::LeaseDuration::Seconds(60))
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
        assert_eq!(s.tick_tolerance(), Duration::from_secs(10));
        let now = at(1_795_765_625); // 5 s past the minute 1_795_765_620
                                     // Exactly: the occurrence of now, or of a time within the tolerance of now.
        assert!(s.due_now(at(1_795_765_620), now));
        assert!(!s.due_now(at(1_795_765_680), now));
        assert!(!s.due_now(at(1_795_765_560), now));
        // Near a boundary (3 s before the half minute), the neighbour is due too.
        let edge = at(1_795_765_647);
        assert!(s.due_now(at(1_795_765_620), edge) && s.due_now(at(1_795_765_680), edge));
        // A per-5-second job: at most half a period of tolerance, so never two ahead.
        let fast = settings(5, 0, 300);
        assert_eq!(fast.tick_tolerance(), Duration::from_millis(2500));
        assert!(!fast.due_now(at(1_795_765_630), at(1_795_765_620)));
        // A small job_early_seconds is the tolerance.
        assert_eq!(settings(60, 0, 3).tick_tolerance(), Duration::from_secs(3));
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
