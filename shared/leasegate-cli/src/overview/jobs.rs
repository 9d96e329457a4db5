//! A job's part of the overview: what the `jobs/{job}/` listing says of it (its reservations,
//! its lease), its log as the record schema reads it, and the next occurrences the app names.

use std::time::SystemTime;

use leasegate::lease::LockInfo;
use leasegate_spin::record::{self, Log, RunStatus};
use serde_json::{json, Value};

use super::{held, unix_rfc3339};

/// How many open reservations of a job are listed (the count says how many there are).
const OPEN_SHOWN: usize = 10;

/// What the `jobs/{job}/` listing says of a job.
#[derive(Default)]
pub(super) struct Job {
    pub(super) log: bool,
    pub(super) lock: Option<(LockInfo, SystemTime)>,
    pub(super) reservations: u64,
    pub(super) newest: Option<u64>,
    /// Reservations without a final outcome (none yet, `running`, `pending`), oldest first.
    pub(super) open: Vec<Value>,
}

impl Job {
    pub(super) fn reservation(&mut self, occurrence: u64, metadata: &leasegate::ops::Metadata) {
        self.reservations += 1;
        self.newest = self.newest.max(Some(occurrence));
        let status = record::outcome(metadata);
        if matches!(status, None | Some(RunStatus::Running | RunStatus::Pending)) {
            self.open.push(json!({
                "occurrence": unix_rfc3339(occurrence),
                "occurrenceUnix": occurrence,
                "instance": metadata.get(record::META_RESERVED_BY),
                "status": status.as_ref().map_or("reserved", RunStatus::as_str),
            }));
        }
    }

    pub(super) fn value(&self, name: &str, log: Option<&Log>) -> Value {
        let paused = log.and_then(|l| l.paused.as_ref());
        let running = self.lock.as_ref().and_then(|(info, date)| {
            let lock = format!("{}{}", record::job_prefix(name), record::LOCK_BLOB);
            held(&lock, info, *date)
        });
        let open_count = self.open.len();
        // Counters as the log keeps them: none until something is counted.
        let counters = log
            .filter(|l| !l.counters.is_zero())
            .map_or(Value::Object(Default::default()), |l| json!(l.counters));
        json!({
            "job": name,
            "log": log.is_some(),
            "paused": paused.is_some(),
            "pausedSince": paused.map(|p| &p.since),
            "pauseNote": paused.and_then(|p| p.note.as_ref()),
            "counters": counters,
            "settledThrough": log.map(|l| l.settled_through).filter(|s| *s > 0).and_then(unix_rfc3339),
            "runs": log.map_or(&[][..], |l| &l.entries),
            "running": running,
            "reservations": {
                "count": self.reservations,
                "newest": self.newest.and_then(unix_rfc3339),
                "open": open_count,
                "openShown": self.open.iter().take(OPEN_SHOWN).cloned().collect::<Vec<_>>(),
            },
            "schedule": null,
            "next": null,
            "nextError": null,
        })
    }
}

/// Adds each job's schedule and next occurrences to `view` (from [`gather`](super::gather))
/// from the app's answer about it (`ask`: `GET /api/jobs/{job}`, see
/// [`crate::status::fetch`]); where the app does not answer, its error is the job's
/// `nextError`, and the rest of the view stands.
pub fn add_next(view: &mut Value, ask: impl Fn(&str) -> Result<Value, String>) {
    let Some(jobs) = view["jobs"].as_array_mut() else {
        return;
    };
    for job in jobs {
        let Some(name) = job["job"].as_str().map(str::to_string) else {
            continue;
        };
        match ask(&name) {
            Ok(answer) => {
                let schedule = match (answer["schedule"].as_str(), answer["timeZone"].as_str()) {
                    (Some(s), Some(zone)) => json!(format!("{s} ({zone})")),
                    (Some(s), None) => json!(s),
                    // An interval: every N seconds.
                    _ => answer["periodSeconds"]
                        .as_u64()
                        .map_or(Value::Null, |p| json!(format!("every {p} s"))),
                };
                job["schedule"] = schedule;
                job["next"] = match answer["next"].as_array() {
                    Some(next) => Value::Array(next.clone()),
                    None => Value::Null,
                };
                if job["next"].is_null() {
                    job["nextError"] =
                        json!("the app's answer has no next occurrences (an older version)");
                }
            }
            Err(e) => job["nextError"] = json!(e),
        }
    }
}
