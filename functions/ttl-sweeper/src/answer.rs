//! What a tick answers and logs: its report (what became of the blobs it listed, the
//! containers it skipped, the unusable names it found) and the failure that ended it.

use std::collections::BTreeMap;
use std::time::Instant;

use leasegate::StatusCode;
use serde::Serialize;

use leasegate_spin::elapsed_ms;
use leasegate_spin::timer::Source;

use crate::error::SweepError;
use crate::settings::Settings;

/// What one tick did (the answer and the log line; never stored).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Report {
    /// Pages claimed and processed.
    pub(crate) pages: u64,
    /// Blobs listed.
    pub(crate) scanned: u64,
    /// Blobs with no `TimeToLive`.
    pub(crate) unmarked: u64,
    /// Marked blobs whose time has not come.
    pub(crate) not_expired: u64,
    /// Of those, blobs given their expiry tag (a listing of `ttl_find = both` that found a
    /// marked blob without it, or a find that read a later `TimeToLive` than its tag).
    pub(crate) tagged: u64,
    /// Expired blobs deleted (moved ones included).
    pub(crate) deleted: u64,
    /// Of those, moved to a dead-blob container first.
    pub(crate) moved: u64,
    /// Lock blobs removed.
    pub(crate) locks_removed: u64,
    /// Blobs left alone, by reason.
    pub(crate) skipped: BTreeMap<String, u64>,
    /// Requests that failed (the blob is left as it was; a later pass retries it).
    pub(crate) errors: u64,
    /// Whether this tick completed a pass.
    pub(crate) pass_completed: bool,
    /// Why the tick stopped: `budget`, `pass complete`, `state busy`.
    pub(crate) stopped: String,
    /// Swept containers whose listing failed for good this pass (a 403, a 400): skipped until
    /// the next pass, the others swept.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) containers_skipped: Vec<SkippedContainer>,
    /// Marked blobs whose names cannot be swept (a `.` or `..` segment), each reported once
    /// (the state remembers them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) unusable_names: Vec<UnusableName>,
    /// Unusable names found past the [`MAX_UNUSABLE`](crate::state::MAX_UNUSABLE) the state
    /// remembers: counted on every pass that lists them, not named.
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) unusable_names_not_remembered: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A marked blob whose name cannot be swept, as a tick reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct UnusableName {
    /// Its container.
    pub(crate) container: String,
    /// Its name.
    pub(crate) name: String,
}

/// A swept container skipped for this pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SkippedContainer {
    /// The container.
    pub(crate) container: String,
    /// The prefix swept.
    pub(crate) prefix: String,
    /// Storage's status, when storage answered (`null` otherwise).
    pub(crate) storage_status: Option<u16>,
    /// Storage's error code, when it sent one (`null` otherwise).
    pub(crate) storage_error_code: Option<String>,
    /// What failed.
    pub(crate) message: String,
}

impl Report {
    pub(crate) fn skip(&mut self, reason: &str) {
        self.skip_n(reason, 1);
    }

    /// Counts `n` blobs left alone for `reason`.
    pub(crate) fn skip_n(&mut self, reason: &str, n: u64) {
        *self.skipped.entry(reason.to_string()).or_default() += n;
    }
}

/// The answer of a tick (and, with `fn`, its log line): its report, and the failure that
/// ended it if one did.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TickAnswer {
    #[serde(flatten)]
    pub(crate) report: Report,
    instance: String,
    trigger: &'static str,
    storage_round_trips: u32,
    duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
}

pub(crate) fn describe(
    settings: &Settings,
    source: Source,
    report: Report,
    failure: Option<&SweepError>,
    round_trips: u32,
    started: Instant,
) -> (StatusCode, TickAnswer) {
    let mut answer = TickAnswer {
        report,
        instance: settings.instance_id.clone(),
        trigger: source.as_str(),
        storage_round_trips: round_trips,
        duration_ms: elapsed_ms(started),
        error: None,
        message: None,
    };
    match failure {
        None => (StatusCode::OK, answer),
        Some(e) => {
            answer.error = Some(e.code());
            answer.message = Some(e.message("the sweep state could not be used"));
            (e.status(), answer)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::tests::settings;
    use crate::Sweeper;
    use leasegate_spin::timer::{self, TimerFunction};
    use serde_json::json;

    /// A tick's answer keeps its field names and forms: the report's, then the tick's; options
    /// of a container skipped without a storage answer are `null`; `fn` ends the log line.
    #[test]
    fn a_tick_answer_keeps_its_fields() {
        let s = settings(&[("ttl_containers", "xxx")]).unwrap();
        let mut report = Report {
            pages: 2,
            stopped: "budget".into(),
            ..Report::default()
        };
        report.skip("leased");
        report.skip_n("leased", 2);
        report.containers_skipped.push(SkippedContainer {
            container: "xxx".into(),
            prefix: String::new(),
            storage_status: None,
            storage_error_code: None,
            message: "listing failed".into(),
        });
        let (status, answer) = describe(&s, Source::Http, report.clone(), None, 7, Instant::now());
        assert_eq!(status, StatusCode::OK);
        let v = serde_json::to_value(&answer).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "pages",
                "scanned",
                "unmarked",
                "notExpired",
                "tagged",
                "deleted",
                "moved",
                "locksRemoved",
                "skipped",
                "errors",
                "passCompleted",
                "stopped",
                "containersSkipped",
                "instance",
                "trigger",
                "storageRoundTrips",
                "durationMs"
            ]
        );
        assert_eq!(v["skipped"], json!({"leased": 3}));
        assert_eq!(v["containersSkipped"][0]["storageStatus"], json!(null));
        assert_eq!(v["containersSkipped"][0]["storageErrorCode"], json!(null));
        assert_eq!(v["storageRoundTrips"], 7);
        let line = timer::with_fn(&answer, Sweeper::NAME);
        assert_eq!(line["fn"], "ttl-sweeper");
        assert_eq!(line.as_object().unwrap().keys().next_back().unwrap(), "fn");
        assert_eq!(line["pages"], 2);
        let failed = SweepError::from(leasegate::Error::CorruptLock("x".into()));
        let (status, answer) = describe(&s, Source::Cron, report, Some(&failed), 7, Instant::now());
        assert!(!status.is_success());
        let v = serde_json::to_value(&answer).unwrap();
        assert_eq!(v["error"], "state_unusable");
        assert!(v["message"].is_string());
    }
}
