//! Why a tick skipped an occurrence: one enum, rendered in one place (its `Display` gives
//! the reason `Decision::Skipped` carries, in answers and logs).

use std::fmt;

use crate::reservation::RunStatus;
use crate::run::{RESERVED_ALREADY, RUN_NOW_TAKEN};

/// Why an occurrence was skipped.
#[derive(Debug, Clone, PartialEq)]
pub enum Skip {
    /// A run now found its second taken.
    RunNowTaken,
    /// The create of the reservation was refused and the reservation not read.
    ReservedAlready,
    /// Its run finished, as the log says.
    FinishedInLog,
    /// Another instance reserved it.
    ReservedByOther,
    /// An attempt failed; the next may start in `wait_secs`.
    RetryWait {
        /// The attempt that failed.
        failed: u32,
        /// Seconds until the next may start.
        wait_secs: u64,
    },
    /// Settled by another tick (a vanished runner's outcome was written elsewhere).
    SettledElsewhere,
    /// Settled by this tick: the reason its log entry gives.
    Logged(String),
    /// Recorded missed by its reserver's deadline.
    MissedByDeadline,
    /// Settled before the job's history began.
    BeforeHistoryRecorded,
    /// This instance settled it on an earlier tick.
    SettledHere(RunStatus),
    /// Settled after its reserver's deadline.
    SettledLate(RunStatus),
    /// Buffered already (`job_overlap = buffer_one`).
    BufferedAlready,
    /// Paused: a retry waits for a resume.
    PausedRetry {
        /// The attempt that waits.
        attempt: u32,
        /// The job's name.
        job: String,
    },
    /// The commit found it settled by another tick.
    SettledByTick(RunStatus),
    /// The log recorded it missed.
    MissedInLog,
    /// Another occurrence is buffered.
    OtherBuffered,
    /// The job is paused.
    Paused,
    /// Due before the job's history began (`from`: the history's start, RFC 3339).
    BeforeHistory {
        /// The history's start (RFC 3339).
        from: String,
        /// The job's name.
        job: String,
    },
    /// Another tick settled this attempt while this one was at work.
    FinishedMeanwhile(RunStatus),
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skip::RunNowTaken => f.write_str(RUN_NOW_TAKEN),
            Skip::ReservedAlready => f.write_str(RESERVED_ALREADY),
            Skip::FinishedInLog => f.write_str(
                "its run finished (the log says so; its reservation was brought in line)",
            ),
            Skip::ReservedByOther => f.write_str("another instance reserved it"),
            Skip::RetryWait { failed, wait_secs } => write!(
                f,
                "attempt {failed} failed: attempt {} may start in {} s (job_retry_delay_seconds)",
                failed + 1,
                (*wait_secs).max(1)
            ),
            Skip::SettledElsewhere => f.write_str("settled by another tick"),
            Skip::Logged(reason) => f.write_str(reason),
            Skip::MissedByDeadline => {
                f.write_str("it was recorded missed: its reserver wrote no outcome by its deadline")
            }
            Skip::BeforeHistoryRecorded => {
                f.write_str("it was due before the job's history began (its first tick): not run")
            }
            Skip::SettledHere(run) => {
                write!(f, "this instance settled it on an earlier tick ({run})")
            }
            Skip::SettledLate(run) => {
                write!(f, "it was settled after its reserver's deadline ({run})")
            }
            Skip::BufferedAlready => f.write_str(
                "it is buffered (job_overlap = buffer_one): it runs when the previous run ends",
            ),
            Skip::PausedRetry { attempt, job } => write!(
                f,
                "the job is paused: attempt {attempt} waits for POST /api/jobs/{job}/resume"
            ),
            Skip::SettledByTick(run) => write!(f, "it was settled by another tick ({run})"),
            Skip::MissedInLog => {
                f.write_str("it was recorded missed: no deployment ticked it in time")
            }
            Skip::OtherBuffered => f.write_str("another occurrence is buffered"),
            Skip::Paused => f.write_str("the job is paused"),
            Skip::BeforeHistory { from, job } => write!(
                f,
                "it was due before the job's history began ({from}, its first tick, less the tick \
                 tolerance): not run, not recorded missed; POST /api/jobs/{job}/backfill with \
                 \"beforeHistory\": true runs it on purpose"
            ),
            Skip::FinishedMeanwhile(run) => write!(
                f,
                "another tick settled this attempt while this one was at work ({run}): not run"
            ),
        }
    }
}

impl Skip {
    /// The skipped decision with this reason.
    pub(crate) fn decision(self, reserved_by: Option<String>) -> crate::run::Decision {
        crate::run::Decision::Skipped {
            reserved_by,
            reason: self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each reason renders exactly as the tick answered before the enum.
    #[test]
    fn reasons_render_as_before() {
        let settled = format!("it was settled by another tick ({})", RunStatus::Succeeded);
        let cases: Vec<(Skip, &str)> = vec![
            (Skip::ReservedByOther, "another instance reserved it"),
            (
                Skip::RetryWait {
                    failed: 1,
                    wait_secs: 0,
                },
                "attempt 1 failed: attempt 2 may start in 1 s (job_retry_delay_seconds)",
            ),
            (
                Skip::RetryWait {
                    failed: 2,
                    wait_secs: 30,
                },
                "attempt 2 failed: attempt 3 may start in 30 s (job_retry_delay_seconds)",
            ),
            (Skip::SettledElsewhere, "settled by another tick"),
            (Skip::Logged("x y".into()), "x y"),
            (
                Skip::BufferedAlready,
                "it is buffered (job_overlap = buffer_one): it runs when the previous run ends",
            ),
            (
                Skip::PausedRetry {
                    attempt: 2,
                    job: "nightly".into(),
                },
                "the job is paused: attempt 2 waits for POST /api/jobs/nightly/resume",
            ),
            (Skip::SettledByTick(RunStatus::Succeeded), &settled),
            (Skip::OtherBuffered, "another occurrence is buffered"),
            (Skip::Paused, "the job is paused"),
            (Skip::RunNowTaken, RUN_NOW_TAKEN),
            (Skip::ReservedAlready, RESERVED_ALREADY),
        ];
        for (skip, want) in cases {
            assert_eq!(skip.to_string(), want, "{skip:?}");
        }
    }

    #[test]
    fn before_history_names_the_job_and_its_start() {
        let s = Skip::BeforeHistory {
            from: "2026-01-01T00:00:00Z".into(),
            job: "j".into(),
        }
        .to_string();
        assert!(s.starts_with("it was due before the job's history began (2026-01-01T00:00:00Z, its first tick, less the tick tolerance): not run"));
        assert!(
            s.contains("POST /api/jobs/j/backfill with \"beforeHistory\": true runs it on purpose")
        );
    }
}
