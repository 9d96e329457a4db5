//! The occurrence record as stored: an occurrence's reservation blob and a job's log, one schema
//! for every writer and reader ([`crate::occurrence::once_per_occurrence`], leasegate's
//! `scheduled-job` function and the `leasegate` CLI).
//!
//! * The **reservation** of an occurrence is the blob `{prefix}{unix:012}` ([`reservation`]),
//!   created only if absent. Ticks read its metadata (the `META_*` names below; its outcome,
//!   [`META_RUN`], a [`RunStatus`]); its body ([`ReservationBody`]) is for people.
//! * scheduled-job's **log** of a job, `jobs/{job}/log.json` ([`job_log`]): a view of the last
//!   [`LOG_ENTRIES`] outcomes ([`Log`], [`LogEntry`]), its counters and its watermarks, written
//!   as indented JSON.
//!
//! These are stored records: a field is added, never renamed; fields a reader does not know are
//! ignored, so deployments of older and newer versions read each other's records. What each
//! field means to a tick is in docs/timer-functions.md ("A tick, step by step").
//!
//! ```
//! use leasegate_spin::record::{Log, RunStatus};
//!
//! let stored = r#"{"job": "nightly", "entries": [{"occurrence": "2026-11-21T14:55:00Z",
//!   "occurrenceUnix": 1795359300, "instance": "node-a", "reservedAt": "2026-11-21T14:55:00Z",
//!   "status": "succeeded", "trigger": "cron", "pastDue": false}], "cleanedBefore": 0}"#;
//! let log: Log = serde_json::from_str(stored).unwrap();
//! assert_eq!(log.entries[0].status, RunStatus::Succeeded);
//! assert_eq!(log.token_of(1_795_359_300), None);
//! ```

use leasegate::ops::Metadata;
use serde::{Deserialize, Serialize};

/// Reservation metadata: the instance that reserved the occurrence (its `instance`).
pub const META_RESERVED_BY: &str = "leasegate_reserved_by";

/// Reservation metadata: the tick's source (`cron`, `azure`, `http`, `manual`, `backfill`,
/// `rerun`; scheduled-job's).
pub const META_TRIGGER: &str = "leasegate_trigger";

/// Reservation metadata: a nonce of the tick that created the reservation, to recognise its own
/// create after a lost answer.
pub const META_RESERVE_TICK: &str = "leasegate_reserve_tick";

/// Reservation metadata, `true` when the tick that created the reservation came later than the
/// tick tolerance (by its instance's clock): absent, it reserved the occurrence on time, so the
/// occurrence is in the job's history whoever begins the log.
pub const META_PAST_DUE: &str = "leasegate_past_due";

/// Reservation metadata: the occurrence's outcome, a [`RunStatus`] as stored (`running`,
/// `succeeded`, `failed`, `skipped_overlap`, ...; [`once_per_occurrence`] writes [`SUCCEEDED`]
/// or [`FAILED`]): the one record that says whether the occurrence ran, kept as long as the
/// reservation. scheduled-job writes it by compare-and-swap before the job is called.
///
/// [`once_per_occurrence`]: crate::occurrence::once_per_occurrence
pub const META_RUN: &str = "leasegate_run";

/// Reservation metadata: a nonce of the tick that wrote the outcome (to recognise one's own
/// write after a lost answer).
pub const META_RUN_TICK: &str = "leasegate_run_tick";

/// Reservation metadata: the run's fencing token (written with its result: the log's
/// compare-and-swap issues it when the run starts).
pub const META_RUN_TOKEN: &str = "leasegate_run_token";

/// Reservation metadata: the attempt the outcome belongs to (1 when absent: the first, as every
/// run of the versions before retries).
pub const META_ATTEMPT: &str = "leasegate_attempt";

/// [`META_RUN`] of a work that returned `Ok` (a job that answered 2xx).
pub const SUCCEEDED: &str = "succeeded";
/// [`META_RUN`] of a work that returned `Err` (a job that answered otherwise).
pub const FAILED: &str = "failed";

/// Entries a job's log keeps (and any older one still open).
pub const LOG_ENTRIES: usize = 10;

/// The reservation blob of the occurrence at `unix` under `prefix`: `{prefix}{unix:012}`
/// (scheduled-job's prefix: [`job_occurrences`]).
pub fn reservation(prefix: &str, unix: u64) -> String {
    format!("{prefix}{unix:012}")
}

/// Where scheduled-job keeps a job's blobs: `jobs/{job}/` (the log, the job's lease `lock`, the
/// reservations).
pub fn job_prefix(job: &str) -> String {
    format!("{JOBS}{job}/")
}

/// The prefix of every job's blobs.
pub const JOBS: &str = "jobs/";
/// A job's log, under [`job_prefix`].
pub const LOG_BLOB: &str = "log.json";
/// The job's lease (its lock blob), under [`job_prefix`].
pub const LOCK_BLOB: &str = "lock";
/// A job's reservations, under [`job_prefix`].
pub const OCCURRENCES: &str = "occurrences/";

/// A job's log blob: `jobs/{job}/log.json`.
pub fn job_log(job: &str) -> String {
    format!("{}{LOG_BLOB}", job_prefix(job))
}

/// The prefix of a job's reservations: `jobs/{job}/occurrences/`.
pub fn job_occurrences(job: &str) -> String {
    format!("{}{OCCURRENCES}", job_prefix(job))
}

/// The occurrence's own fencing token: its Unix seconds times 2^16 (the scale of the lease
/// tokens, which are server seconds times 2^16). [`once_per_occurrence`] hands its work this
/// token; scheduled-job issues it to an on-time run (a run that starts after a later
/// occurrence's is issued one above that run's instead: [`Log::issue_token`]).
///
/// [`once_per_occurrence`]: crate::occurrence::once_per_occurrence
pub fn occurrence_token(occurrence: u64) -> Result<u64, leasegate::Error> {
    occurrence
        .checked_mul(1 << 16)
        .filter(|t| *t <= leasegate::lease::MAX_TOKEN)
        .ok_or_else(|| {
            leasegate::Error::InvalidArgument(format!(
                "occurrence {occurrence} is too far ahead for a fencing token"
            ))
        })
}

/// The outcome a reservation's metadata records ([`META_RUN`]), if any.
pub fn outcome(metadata: &Metadata) -> Option<RunStatus> {
    metadata.get(META_RUN).map(|v| RunStatus::parse(v))
}

/// The attempt a reservation's outcome belongs to ([`META_ATTEMPT`]; 1 when it does not say).
pub fn attempt(metadata: &Metadata) -> u32 {
    metadata
        .get(META_ATTEMPT)
        .and_then(|a| a.parse().ok())
        .filter(|a| *a >= 1)
        .unwrap_or(1)
}

/// Whether the tick that reserved an occurrence did so on time (see [`META_PAST_DUE`]).
pub fn reserved_on_time(metadata: &Metadata) -> bool {
    metadata.get(META_PAST_DUE).map(String::as_str) != Some("true")
}

/// The body of a reservation blob, compact JSON: `{"job","occurrence","instance"}` from
/// scheduled-job, `{"occurrence","instance"}` from [`once_per_occurrence`]. What is in it is for
/// people; the metadata is what ticks read. A stored record: no field renamed.
///
/// [`once_per_occurrence`]: crate::occurrence::once_per_occurrence
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationBody {
    /// The job (scheduled-job's reservations only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The occurrence (RFC 3339).
    pub occurrence: String,
    /// The instance that reserved it.
    pub instance: String,
}

/// What became of an occurrence: the outcome on its reservation ([`META_RUN`]) and the status
/// of its log entry, written as `running`, `succeeded`, `failed`, `skipped_overlap` or `missed`.
/// A value this version does not know (a newer version's) is kept as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStatus {
    /// The job was called (or is being called) by the tick that wrote it.
    Running,
    /// The job answered 2xx.
    Succeeded,
    /// The job answered otherwise, or did not answer.
    Failed,
    /// A run of an earlier occurrence held the job's lease when this one was due.
    SkippedOverlap,
    /// Not run: no deployment ticked it in time (or its reserver wrote no outcome by its
    /// deadline), and it was not caught up.
    Missed,
    /// The job was paused when it was due: not run.
    SkippedPaused,
    /// Kept for later (`job_overlap = buffer_one`): the previous run still held the job's lease
    /// when it was due; the first tick after that run ends runs it.
    Pending,
    /// Due before the job's history began (its first tick came later): not run, not recorded
    /// missed; kept on the reservation only, so that later ticks of it stop at one read.
    BeforeHistory,
    /// Another value (a newer version's), kept as written.
    Other(String),
}

impl RunStatus {
    /// The value as stored.
    pub fn as_str(&self) -> &str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => SUCCEEDED,
            RunStatus::Failed => FAILED,
            RunStatus::SkippedOverlap => "skipped_overlap",
            RunStatus::Missed => "missed",
            RunStatus::SkippedPaused => "skipped_paused",
            RunStatus::Pending => "pending",
            RunStatus::BeforeHistory => "before_history",
            RunStatus::Other(other) => other,
        }
    }

    /// The status a stored value stands for.
    pub fn parse(value: &str) -> RunStatus {
        match value {
            "running" => RunStatus::Running,
            SUCCEEDED => RunStatus::Succeeded,
            FAILED => RunStatus::Failed,
            "skipped_overlap" => RunStatus::SkippedOverlap,
            "missed" => RunStatus::Missed,
            "skipped_paused" => RunStatus::SkippedPaused,
            "pending" => RunStatus::Pending,
            "before_history" => RunStatus::BeforeHistory,
            other => RunStatus::Other(other.to_string()),
        }
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RunStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RunStatus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| RunStatus::parse(&s))
    }
}

/// One entry of the reservation log. A stored record: unknown fields are ignored and none is
/// renamed, so deployments of older and newer versions read each other's logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogEntry {
    /// The occurrence (RFC 3339).
    pub occurrence: String,
    /// The occurrence in Unix seconds (what entries are ordered by).
    pub occurrence_unix: u64,
    /// The instance that reserved it.
    pub instance: String,
    /// When it was reserved, by the storage server's clock.
    pub reserved_at: String,
    /// `running`, `succeeded`, `failed`, `skipped_overlap`.
    pub status: RunStatus,
    /// The run's fencing token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<u64>,
    /// `cron`, `azure` or `http`.
    pub trigger: String,
    /// Azure's `IsPastDue`.
    #[serde(default)]
    pub past_due: bool,
    /// When the run ended, by the storage server's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Why it failed or was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The run's attempt (1: the first; absent in entries of older versions and of
    /// occurrences not run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

/// The reservation log blob, written as indented JSON. A stored record, like [`LogEntry`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Log {
    /// The job.
    pub job: String,
    /// The last reservations, newest (latest occurrence) first.
    #[serde(default)]
    pub entries: Vec<LogEntry>,
    /// Reservations of occurrences before this one (Unix seconds) may have been deleted: a
    /// tick for them is refused, whatever retention its deployment has.
    #[serde(default)]
    pub cleaned_before: u64,
    /// Every occurrence of the schedule up to this one (Unix seconds) is settled: it has an
    /// outcome, or nobody reserved it. A winning tick looks at the occurrences after it
    /// (bounded) and settles a reservation its reserver left without an outcome
    /// (`settle_earlier`). 0: not known yet (a log written by an older version).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub settled_through: u64,
    /// What the log has recorded since it began counting (a log of an older version: since
    /// this version first wrote it).
    #[serde(default, skip_serializing_if = "Counters::is_zero")]
    pub counters: Counters,
    /// The newest occurrence whose entry was dropped from the log (0: none): an occurrence at
    /// or below it without an entry may have been logged once, so it is not counted missed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub trimmed_through: u64,
    /// Set while the job is paused (`POST /api/jobs/{job}/pause`): its occurrences are
    /// recorded `skipped_paused`, not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Paused>,
    /// Where the job's history begins (Unix seconds): the first tick's time by the storage
    /// server's clock, less the tick tolerance, or the time its occurrence was reserved if
    /// earlier. The scheduler runs, catches up, counts and backfills no occurrence before it
    /// (an operator's run, or a backfill told `beforeHistory`, may). 0: not known (a log of a
    /// version before it: the history began before everything the log holds).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_from: u64,
    /// The highest fencing token issued to a run of the job (0: none known yet; then the
    /// highest in the entries counts): each run's start is issued one above it, or its
    /// occurrence's own (`occurrence x 2^16 + attempt - 1`) if that is higher, by the same
    /// compare-and-swap that logs the start, so every run's token is above every earlier
    /// run's, in the order they start.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub highest_token: u64,
    /// The job's lease as the latest run's release left it ([`leasegate::lease::HeldState`];
    /// as its acquire left it while the run goes on, or if its release failed): the next run,
    /// which reads the log first, takes it from there without a read of its own
    /// ([`leasegate::lease::Start::Kept`]). It names the run's lease id while it
    /// holds, as the lock blob's own metadata does; the status answer does not show it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<serde_json::Value>,
}

/// A pause: since when (the storage server's clock) and the operator's note.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Paused {
    /// When it was paused.
    pub since: String,
    /// Why (the pause request's `note`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Counts of what became of occurrences, kept in the log (a stored record: fields added, never
/// renamed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Counters {
    /// Runs that ended: the job was called and answered 2xx or failed.
    pub ran: u64,
    /// Of those, runs that failed.
    pub failed: u64,
    /// Attempts after a first one (`job_retries`).
    pub retried: u64,
    /// Occurrences skipped because a previous run held the job's lease.
    pub skipped_overlap: u64,
    /// Occurrences skipped while the job was paused.
    pub skipped_paused: u64,
    /// Occurrences recorded missed: no deployment ticked them (or their reserver vanished),
    /// and they were not caught up.
    pub missed: u64,
}

impl Counters {
    /// Whether nothing is counted yet (a log leaves its counters out then).
    pub fn is_zero(&self) -> bool {
        *self == Counters::default()
    }

    /// Counts an outcome recorded in the log.
    pub fn count(&mut self, status: &RunStatus) {
        match status {
            RunStatus::Succeeded => self.ran += 1,
            RunStatus::Failed => {
                self.ran += 1;
                self.failed += 1;
            }
            RunStatus::SkippedOverlap => self.skipped_overlap += 1,
            RunStatus::SkippedPaused => self.skipped_paused += 1,
            RunStatus::Missed => self.missed += 1,
            RunStatus::Running
            | RunStatus::Pending
            | RunStatus::BeforeHistory
            | RunStatus::Other(_) => {}
        }
    }
}

impl Log {
    /// Whether a tick has begun the job's history: a log no tick wrote (none yet, or one only
    /// paused) has not.
    pub fn history_begun(&self) -> bool {
        self.history_from != 0
            || self.settled_through != 0
            || self.cleaned_before != 0
            || !self.entries.is_empty()
    }

    /// Issues the fencing token of a run starting now: `base` (its occurrence's,
    /// `occurrence x 2^16 + attempt - 1`) or one above every token issued before, whichever is
    /// higher. A log of a version before this field knows the highest from its entries.
    pub fn issue_token(&mut self, base: u64) -> u64 {
        let issued = self
            .entries
            .iter()
            .filter_map(|e| e.fencing_token)
            .fold(self.highest_token, u64::max);
        let token = base.max(issued.saturating_add(1).min(leasegate::lease::MAX_TOKEN));
        self.highest_token = token;
        token
    }

    /// The fencing token the log's entry for `occurrence` carries.
    pub fn token_of(&self, occurrence: u64) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| e.occurrence_unix == occurrence)
            .and_then(|e| e.fencing_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log as the versions before serde wrote it (their own JSON writer): a run, a failure,
    /// an overlap skip (no fencing token, no end).
    const OLD_LOG: &str = r#"{
  "job": "nightly",
  "entries": [
    {
      "occurrence": "2026-11-21T14:55:00Z",
      "occurrenceUnix": 1795359300,
      "instance": "node-a",
      "reservedAt": "2026-11-21T14:55:00.412Z",
      "status": "succeeded",
      "fencingToken": 117660667084800,
      "trigger": "cron",
      "pastDue": false,
      "finishedAt": "2026-11-21T14:55:01.020Z"
    },
    {
      "occurrence": "2026-11-21T14:54:00Z",
      "occurrenceUnix": 1795359240,
      "instance": "node-b",
      "reservedAt": "2026-11-21T14:54:00.101Z",
      "status": "failed",
      "fencingToken": 117660663152640,
      "trigger": "azure",
      "pastDue": true,
      "finishedAt": "2026-11-21T14:54:30.500Z",
      "reason": "the job answered 500"
    },
    {
      "occurrence": "2026-11-21T14:53:00Z",
      "occurrenceUnix": 1795359180,
      "instance": "node-a",
      "reservedAt": "2026-11-21T14:53:00.007Z",
      "status": "skipped_overlap",
      "trigger": "http",
      "pastDue": false,
      "reason": "the previous run still holds the job's lease"
    }
  ],
  "cleanedBefore": 1795355700
}"#;

    #[test]
    fn old_logs_read_and_are_written_back_byte_for_byte() {
        let log: Log = serde_json::from_str(OLD_LOG).unwrap();
        assert_eq!(log.job, "nightly");
        assert_eq!(log.cleaned_before, 1_795_355_700);
        assert_eq!(log.entries.len(), 3);
        assert_eq!(
            log.entries[1],
            LogEntry {
                occurrence: "2026-11-21T14:54:00Z".into(),
                occurrence_unix: 1_795_359_240,
                instance: "node-b".into(),
                reserved_at: "2026-11-21T14:54:00.101Z".into(),
                status: RunStatus::Failed,
                fencing_token: Some(occurrence_token(1_795_359_240).unwrap()),
                trigger: "azure".into(),
                past_due: true,
                finished_at: Some("2026-11-21T14:54:30.500Z".into()),
                reason: Some("the job answered 500".into()),
                attempt: None,
            }
        );
        assert_eq!(log.entries[2].fencing_token, None);
        assert_eq!(log.entries[2].finished_at, None);
        // What this version writes is what the old one wrote (and reads).
        let written = serde_json::to_vec_pretty(&log).unwrap();
        assert_eq!(String::from_utf8(written).unwrap(), OLD_LOG);
        let empty = Log {
            job: "x".into(),
            ..Log::default()
        };
        assert_eq!(
            serde_json::to_string_pretty(&empty).unwrap(),
            "{\n  \"job\": \"x\",\n  \"entries\": [],\n  \"cleanedBefore\": 0\n}"
        );
    }

    #[test]
    fn logs_of_other_versions_read() {
        // The first versions wrote no watermark; a newer one may add fields; absent options
        // and nulls are absent.
        let log: Log = serde_json::from_str(
            r#"{"job": "j", "addedLater": [1], "entries": [{"occurrence": "1970-01-01T00:01:00Z",
              "occurrenceUnix": 60, "instance": "i", "reservedAt": "1970-01-01T00:01:00Z",
              "status": "running", "trigger": "cron", "reason": null, "note": "new"}]}"#,
        )
        .unwrap();
        assert_eq!(log.cleaned_before, 0);
        let e = &log.entries[0];
        assert_eq!((e.occurrence_unix, e.past_due), (60, false));
        assert_eq!((&e.fencing_token, &e.reason), (&None, &None));
        // A log without its job or with a broken entry is refused, not half read.
        assert!(serde_json::from_str::<Log>(r#"{"entries": []}"#).is_err());
        assert!(serde_json::from_str::<Log>(r#"{"job": "j", "entries": [{}]}"#).is_err());
    }

    /// A log as scheduled-job writes it today (`serde_json::to_vec_pretty`), every field set:
    /// read and written back byte for byte.
    const FULL_LOG: &str = r#"{
  "job": "nightly",
  "entries": [
    {
      "occurrence": "2026-11-21T14:55:00Z",
      "occurrenceUnix": 1795359300,
      "instance": "node-a",
      "reservedAt": "2026-11-21T14:55:00Z",
      "status": "succeeded",
      "fencingToken": 117660667084801,
      "trigger": "cron",
      "pastDue": false,
      "finishedAt": "2026-11-21T14:55:02Z",
      "attempt": 2
    },
    {
      "occurrence": "2026-11-21T14:54:00Z",
      "occurrenceUnix": 1795359240,
      "instance": "",
      "reservedAt": "2026-11-21T14:56:00Z",
      "status": "missed",
      "trigger": "",
      "pastDue": false,
      "finishedAt": "2026-11-21T14:56:00Z",
      "reason": "1 occurrence(s) from 2026-11-21T14:54:00Z to 2026-11-21T14:54:00Z are not in the log"
    }
  ],
  "cleanedBefore": 1795355700,
  "settledThrough": 1795359300,
  "counters": {
    "ran": 1,
    "failed": 0,
    "retried": 1,
    "skippedOverlap": 0,
    "skippedPaused": 0,
    "missed": 1
  },
  "trimmedThrough": 1795358000,
  "paused": {
    "since": "2026-11-21T15:00:00Z",
    "note": "db migration"
  },
  "historyFrom": 1795350000,
  "highestToken": 117660667084801,
  "lock": {
    "v": 1,
    "leaseId": "0f8fad5b-d9cb-469f-a165-70867728950e"
  }
}"#;

    #[test]
    fn a_full_log_round_trips_byte_for_byte() {
        let log: Log = serde_json::from_str(FULL_LOG).unwrap();
        assert_eq!(log.entries.len(), 2);
        assert_eq!(log.entries[0].attempt, Some(2));
        assert_eq!(log.entries[1].status, RunStatus::Missed);
        assert_eq!(log.counters.retried, 1);
        assert_eq!(
            log.paused.as_ref().unwrap().note.as_deref(),
            Some("db migration")
        );
        assert!(log.history_begun());
        assert_eq!(log.token_of(1_795_359_300), Some(117_660_667_084_801));
        let written = serde_json::to_string_pretty(&log).unwrap();
        assert_eq!(written, FULL_LOG);
    }

    #[test]
    fn run_statuses_keep_their_stored_words_and_newer_ones() {
        for (word, status) in [
            ("running", RunStatus::Running),
            ("succeeded", RunStatus::Succeeded),
            ("failed", RunStatus::Failed),
            ("skipped_overlap", RunStatus::SkippedOverlap),
            ("missed", RunStatus::Missed),
            ("skipped_paused", RunStatus::SkippedPaused),
            ("pending", RunStatus::Pending),
            ("before_history", RunStatus::BeforeHistory),
            ("paused_by_v9", RunStatus::Other("paused_by_v9".into())),
        ] {
            assert_eq!(RunStatus::parse(word), status);
            assert_eq!(status.as_str(), word);
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{word}\""));
            assert_eq!(serde_json::from_str::<RunStatus>(&json).unwrap(), status);
        }
    }

    #[test]
    fn reservation_bodies_of_both_writers() {
        // scheduled-job's (run.rs wrote it so before) and once_per_occurrence's.
        let job = ReservationBody {
            job: Some("j".into()),
            occurrence: "1970-01-01T00:01:00Z".into(),
            instance: "i".into(),
        };
        let job_json = r#"{"job":"j","occurrence":"1970-01-01T00:01:00Z","instance":"i"}"#;
        assert_eq!(serde_json::to_string(&job).unwrap(), job_json);
        assert_eq!(
            serde_json::from_str::<ReservationBody>(job_json).unwrap(),
            job
        );
        let once = ReservationBody { job: None, ..job };
        let once_json = r#"{"occurrence":"1970-01-01T00:01:00Z","instance":"i"}"#;
        assert_eq!(serde_json::to_string(&once).unwrap(), once_json);
        assert_eq!(
            serde_json::from_str::<ReservationBody>(once_json).unwrap(),
            once
        );
    }

    #[test]
    fn names_and_metadata() {
        assert_eq!(reservation("digest/", 1_795_762_800), "digest/001795762800");
        assert_eq!(job_log("nightly"), "jobs/nightly/log.json");
        assert_eq!(job_occurrences("nightly"), "jobs/nightly/occurrences/");
        assert_eq!(
            reservation(&job_occurrences("n"), 60),
            "jobs/n/occurrences/000000000060"
        );
        let mut m = Metadata::new();
        assert_eq!(
            (outcome(&m), attempt(&m), reserved_on_time(&m)),
            (None, 1, true)
        );
        m.insert(META_RUN.into(), "paused_by_v9".into());
        m.insert(META_ATTEMPT.into(), "3".into());
        m.insert(META_PAST_DUE.into(), "true".into());
        assert_eq!(outcome(&m), Some(RunStatus::Other("paused_by_v9".into())));
        assert_eq!((attempt(&m), reserved_on_time(&m)), (3, false));
        m.insert(META_ATTEMPT.into(), "0".into());
        assert_eq!(attempt(&m), 1);
        assert_eq!(occurrence_token(60).unwrap(), 60 << 16);
        assert!(occurrence_token(u64::MAX / 2).is_err());
    }
}
