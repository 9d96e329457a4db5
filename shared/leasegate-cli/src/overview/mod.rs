//! `leasegate status` without a job: the app's container as storage holds it, read with the
//! account's credential (no app, no token of the app): each leader group's leader and term,
//! each job's last runs and reservations, the held gates, and the TTL sweeper's passes and
//! progress. [`gather`] reads it into a JSON value (the shape `--json` prints, documented in
//! docs/functions.md and kept stable: fields are added, never renamed), and [`format_overview`]
//! makes the table from that value.
//!
//! What it reads, in this order (every listing with metadata, pages of `--page-size` blobs):
//! * `leader/` (a listing): each blob is a group's lock (`leader/{group}`);
//! * `jobs/` (a listing): `jobs/{job}/log.json` names a job and is then read (Get Blob),
//!   `jobs/{job}/lock` is a run in progress, `jobs/{job}/occurrences/{n}` its reservations;
//! * `gates/` and `alerts/` (listings): the gate API's and device-alerts' locks;
//! * `sweeper/state.json` (Get Blob): the TTL sweeper's state.
//!
//! Locks are judged from the listing ([`LockInfo::from_properties`]) by the storage server's
//! clock (the page's `Date`), as a HEAD of each would be. A job's schedule is not kept in the
//! container (it is the app's `job_schedule`): its next occurrences are not known here, and the
//! overview says so (`leasegate status JOB --app URL` asks the app).
//!
//! A listing of many blobs reports its progress on stderr ([`Progress`]); nothing of it goes to
//! stdout. Stored words reach the terminal cleaned (`status::clean`): escape sequences are shown,
//! never obeyed.

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{LockInfo, LockStatus};
use leasegate::ops::{BlobItem, GetBlob, ListBlobs};
use leasegate::{BlobClient, BlobName, ErrorClass, LockName, Transport};
use leasegate_spin::record::{self, Log};
use serde_json::{json, Value};

mod jobs;
mod terminal;

pub use jobs::add_next;
use jobs::Job;
pub use terminal::format_overview;

/// The shape of `--json`: raised only if a field changes meaning or goes away.
pub const FORMAT: u64 = 1;
/// Storage's largest (and default) List Blobs page.
pub const MAX_PAGE: u32 = 5000;
/// How often a long listing reports its progress, when `LEASEGATE_PROGRESS_MS` does not say.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// The variable that sets how often (milliseconds; 0: after every page).
pub const PROGRESS_MS: &str = "LEASEGATE_PROGRESS_MS";
/// The lock prefixes counted as gates: the gate API's and device-alerts'.
pub const GATE_PREFIXES: [&str; 2] = ["gates/", "alerts/"];
/// The sweeper's state blob in the app's container.
pub const SWEEPER_STATE: &str = "sweeper/state.json";

/// Progress lines on stderr while blobs are listed: one when `every` has passed since the last
/// (or since the start), so a short listing prints none; and a last one when any was printed.
pub struct Progress<'a> {
    every: Duration,
    started: Instant,
    last: Instant,
    listed: u64,
    printed: bool,
    out: Box<dyn FnMut(&str) + 'a>,
}

impl<'a> Progress<'a> {
    /// Reports through `out` (a line without its newline) at most once per `every`.
    pub fn new(every: Duration, out: impl FnMut(&str) + 'a) -> Self {
        let now = Instant::now();
        Progress {
            every,
            started: now,
            last: now,
            listed: 0,
            printed: false,
            out: Box::new(out),
        }
    }

    /// A page of `n` blobs under `prefix` was listed (`under`: listed there so far).
    fn page(&mut self, prefix: &str, n: usize, under: u64) {
        self.listed += n as u64;
        if self.last.elapsed() >= self.every {
            self.last = Instant::now();
            self.printed = true;
            let line = format!(
                "leasegate: listing... {} blobs so far ({under} under {prefix}), {:.1} s",
                self.listed,
                self.started.elapsed().as_secs_f64()
            );
            (self.out)(&line);
        }
    }

    /// The listings are done: says so if a progress line was printed.
    fn done(&mut self) {
        if self.printed {
            let line = format!(
                "leasegate: listed {} blobs in {:.1} s",
                self.listed,
                self.started.elapsed().as_secs_f64()
            );
            (self.out)(&line);
        }
    }
}

/// How often to report progress, from [`PROGRESS_MS`] (read through `var`).
pub fn progress_every(
    var: impl Fn(&str) -> Result<Option<String>, String>,
) -> Result<Duration, String> {
    match var(PROGRESS_MS)? {
        None => Ok(PROGRESS_EVERY),
        Some(ms) => ms
            .trim()
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| format!("{PROGRESS_MS} takes whole milliseconds (0: every page)")),
    }
}

/// Reads the container's state: the JSON value `--json` prints. `explain` turns a storage
/// error into the operator's words (see `environment::explain`). A container that does not
/// exist is an error; one without a blob of a kind leaves that part empty.
pub async fn gather<T: Transport>(
    blobs: &BlobClient<T>,
    page_size: u32,
    progress: &mut Progress<'_>,
    explain: &dyn Fn(leasegate::Error) -> String,
    now: SystemTime,
) -> Result<Value, String> {
    let container = blobs.container().as_str().to_string();
    let missing = |e: leasegate::Error| {
        if e.class() == Some(ErrorClass::ContainerMissing) {
            format!(
                "the container {container} does not exist on this account: no function has \
                 written to it yet, or the app's `container` is another (--container NAME)"
            )
        } else {
            explain(e)
        }
    };
    let mut unreadable = Vec::new();
    let mut server_time = None;

    // Leaders: one lock blob per group.
    let mut leaders = Vec::new();
    list(blobs, "leader/", page_size, progress, now, |item, date| {
        server_time = server_time.or(Some(date));
        let Some(lock) = LockName::from_blob_name(&item.name, "leader/") else {
            unreadable.push(unreadable_blob(&item.name, "not a lock blob's name"));
            return;
        };
        match LockInfo::from_properties(item.properties, date) {
            Ok(info) => leaders.push(leader(lock.as_str(), &info, date)),
            Err(e) => unreadable.push(unreadable_blob(&item.name, &e.to_string())),
        }
    })
    .await
    .map_err(missing)?;

    // Jobs: their logs, their locks, their reservations.
    let mut jobs: std::collections::BTreeMap<String, Job> = Default::default();
    list(
        blobs,
        record::JOBS,
        page_size,
        progress,
        now,
        |item, date| {
            server_time = server_time.or(Some(date));
            let Some((job, rest)) = item.name[record::JOBS.len()..].split_once('/') else {
                return;
            };
            let entry = jobs.entry(job.to_string()).or_default();
            match rest {
                record::LOG_BLOB => entry.log = true,
                record::LOCK_BLOB => match LockInfo::from_properties(item.properties, date) {
                    Ok(info) => entry.lock = Some((info, date)),
                    Err(e) => unreadable.push(unreadable_blob(&item.name, &e.to_string())),
                },
                _ => {
                    if let Some(n) = rest
                        .strip_prefix(record::OCCURRENCES)
                        .and_then(|n| n.parse::<u64>().ok())
                    {
                        entry.reservation(n, &item.properties.metadata);
                    }
                }
            }
        },
    )
    .await
    .map_err(missing)?;
    let mut job_values = Vec::new();
    for (name, job) in &jobs {
        let log = if job.log {
            let blob = blob_name(&record::job_log(name))?;
            match read_json::<Log, _>(blobs, blob, "a job log", now)
                .await
                .map_err(&missing)?
            {
                Some(Ok(log)) => Some(log),
                Some(Err(e)) => {
                    unreadable.push(unreadable_blob(&record::job_log(name), &e));
                    None
                }
                None => None,
            }
        } else {
            None
        };
        job_values.push(job.value(name, log.as_ref()));
    }

    // Gates: held ones counted, the longest-held named.
    let mut gates = Vec::new();
    for prefix in GATE_PREFIXES {
        let mut g = Gates::default();
        list(blobs, prefix, page_size, progress, now, |item, date| {
            server_time = server_time.or(Some(date));
            g.blobs += 1;
            let Some(lock) = LockName::from_blob_name(&item.name, "") else {
                unreadable.push(unreadable_blob(&item.name, "not a lock blob's name"));
                return;
            };
            match LockInfo::from_properties(item.properties, date) {
                Ok(info) => g.add(lock.as_str(), &info, date),
                Err(e) => unreadable.push(unreadable_blob(&item.name, &e.to_string())),
            }
        })
        .await
        .map_err(missing)?;
        gates.push(g.value(prefix));
    }
    progress.done();

    // The sweeper's state.
    let sweeper = match read_json(blobs, blob_name(SWEEPER_STATE)?, "JSON", now)
        .await
        .map_err(&missing)?
    {
        Some(Ok(state)) => sweeper(&state),
        Some(Err(e)) => {
            unreadable.push(unreadable_blob(SWEEPER_STATE, &e));
            Value::Null
        }
        None => Value::Null,
    };

    Ok(json!({
        "format": FORMAT,
        "container": container,
        "serverTime": server_time.map(rfc3339),
        "leaders": leaders,
        "jobs": job_values,
        "gates": gates,
        "sweeper": sweeper,
        "unreadable": unreadable,
    }))
}

/// Lists `prefix` (with metadata) page by page, giving each blob and its page's `Date` to
/// `each`, and each page to `progress`.
async fn list<T: Transport>(
    blobs: &BlobClient<T>,
    prefix: &str,
    page_size: u32,
    progress: &mut Progress<'_>,
    now: SystemTime,
    mut each: impl FnMut(BlobItem, SystemTime),
) -> Result<(), leasegate::Error> {
    let mut marker = None;
    let mut under = 0u64;
    loop {
        let op = ListBlobs {
            prefix: Some(prefix.to_string()),
            marker: marker.take(),
            max_results: Some(page_size),
            include_metadata: true,
            ..ListBlobs::new(blobs.container().clone())
        };
        let (page, date) = blobs.execute(&op, now).await?;
        // Without the server's `Date`, this machine's clock judges (as `show` never does): a
        // listing answer always carries one.
        let date = date.unwrap_or(now);
        under += page.blobs.len() as u64;
        progress.page(prefix, page.blobs.len(), under);
        for item in page.blobs {
            each(item, date);
        }
        match page.next_marker {
            Some(next) => marker = Some(next),
            None => return Ok(()),
        }
    }
}

/// A blob's content read as JSON into `V` (`what` it should be, for the error): `None` when it
/// does not exist, `Some(Err)` when it is not JSON, or JSON that is not `what` (a job log the
/// record schema cannot read: the function refuses it too).
async fn read_json<V: serde::de::DeserializeOwned, T: Transport>(
    blobs: &BlobClient<T>,
    blob: BlobName,
    what: &str,
    now: SystemTime,
) -> Result<Option<Result<V, String>>, leasegate::Error> {
    let get = GetBlob {
        container: blobs.container().clone(),
        blob,
    };
    let (content, _) = blobs.execute(&get, now).await?;
    Ok(content.map(|c| parse_json(&c.body, what)))
}

/// `body` read as JSON into `V`, or why not: not JSON, or not `what`.
fn parse_json<V: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<V, String> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => format!("not {what} ({e})"),
        _ => format!("not JSON ({e})"),
    })
}

fn blob_name(name: &str) -> Result<BlobName, String> {
    BlobName::try_new(name).map_err(|e| e.to_string())
}

fn unreadable_blob(blob: &str, error: &str) -> Value {
    json!({ "blob": blob, "error": error })
}

use leasegate::time::rfc3339;

fn unix_rfc3339(secs: u64) -> Option<String> {
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_secs(secs))
        .map(rfc3339)
}

/// Whole seconds from `from` to `to` (0 when `to` is earlier).
fn secs_between(from: SystemTime, to: SystemTime) -> u64 {
    to.duration_since(from).map_or(0, |d| d.as_secs())
}

/// A held lock as the overview shows it: holder, token, since, until, held for, left.
fn held(lock: &str, info: &LockInfo, date: SystemTime) -> Option<Value> {
    let LockStatus::Held {
        expires_at,
        since,
        label,
        ..
    } = &info.status
    else {
        return None;
    };
    Some(json!({
        "lock": lock,
        "holder": (!label.is_empty()).then_some(label),
        "fencingToken": info.fencing_token,
        "since": since.map(rfc3339),
        "expiresAt": expires_at.map(rfc3339),
        "heldSeconds": since.map(|s| secs_between(s, date)),
        "leftSeconds": expires_at.map(|e| secs_between(date, e)),
    }))
}

/// A leader group: `led` (its leader, term, since, until, lease left) or `vacant` (the last
/// term).
fn leader(group: &str, info: &LockInfo, date: SystemTime) -> Value {
    match held(group, info, date) {
        Some(h) => json!({
            "group": group,
            "state": "led",
            "leader": h["holder"],
            "term": info.fencing_token,
            "since": h["since"],
            "expiresAt": h["expiresAt"],
            "leftSeconds": h["leftSeconds"],
        }),
        None => json!({
            "group": group,
            "state": "vacant",
            "leader": null,
            "term": info.fencing_token,
            "since": null,
            "expiresAt": null,
            "leftSeconds": null,
        }),
    }
}

/// The locks under one gate prefix: how many, how many held, the longest-held.
#[derive(Default)]
struct Gates {
    blobs: u64,
    held: u64,
    /// The longest-held so far: its tenure's start, and the lock as shown.
    longest: Option<(SystemTime, Value)>,
}

impl Gates {
    fn add(&mut self, lock: &str, info: &LockInfo, date: SystemTime) {
        let Some(h) = held(lock, info, date) else {
            return;
        };
        self.held += 1;
        // A holder whose claim is not written yet has no start: it is the newest.
        let since = match &info.status {
            LockStatus::Held {
                since: Some(since), ..
            } => *since,
            _ => date,
        };
        if self.longest.as_ref().is_none_or(|(s, _)| since < *s) {
            self.longest = Some((since, h));
        }
    }

    fn value(&self, prefix: &str) -> Value {
        json!({
            "prefix": prefix,
            "blobs": self.blobs,
            "held": self.held,
            "longestHeld": self.longest.as_ref().map(|(_, v)| v.clone()),
        })
    }
}

/// The sweeper's state as the overview shows it: the passes, the current pass's progress per
/// container, the counters and the recent ticks.
fn sweeper(state: &Value) -> Value {
    let n = |key: &str| state[key].as_u64().unwrap_or(0);
    let containers: Vec<Value> = state["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({
                "container": c["container"],
                "prefix": c["prefix"].as_str().unwrap_or(""),
                "kind": c["kind"],
                "status": c["status"],
                "morePages": !c["marker"].is_null(),
                "off": c["off"].as_bool().unwrap_or(false),
            })
        })
        .collect();
    let ticks = state["ticks"].as_array().cloned().unwrap_or_default();
    let active = ticks
        .iter()
        .filter(|t| t["active"].as_bool() == Some(true))
        .count();
    json!({
        "passes": n("passes"),
        "lastPassCompletedAt": state["lastPassCompletedAt"],
        "purged": n("purged"),
        "moved": n("moved"),
        "locksRemoved": n("locksRemoved"),
        "pages": n("pages"),
        "containers": containers,
        "activeTicks": active,
        "ticks": ticks,
        "unusable": state["unusable"].as_array().map_or(0, Vec::len),
    })
}

#[cfg(test)]
mod tests {
    use super::terminal::{format_job, format_sweeper};
    use super::*;
    use leasegate::ops::Metadata;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// A lock blob's properties as a listing gives them: a claim of `label`, held or not.
    fn listed(label: &str, since: u64, expires: u64, token: u64, leased: bool) -> LockInfo {
        let metadata: Metadata = [
            ("leasegate_holder", "0f8fad5b-d9cb-469f-a165-70867728950e"),
            ("leasegate_term", "record"),
            ("leasegate_since", &since.to_string()),
            ("leasegate_expires", &expires.to_string()),
            ("leasegate_token", &token.to_string()),
            ("leasegate_label", label),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let props = leasegate::ops::BlobProperties {
            etag: Some(leasegate::ETag::new("0x1")),
            lease_state: Some(if leased {
                leasegate::LeaseState::Leased
            } else {
                leasegate::LeaseState::Available
            }),
            metadata,
            ..Default::default()
        };
        LockInfo::from_properties(props, at(2_000_000_100)).unwrap()
    }

    fn sample() -> Value {
        let now = at(2_000_000_100);
        let running = listed(
            "node-b 2033-05-18T03:33:00Z",
            2_000_000_090,
            2_000_000_150,
            7,
            false,
        );
        let mut job = Job {
            log: true,
            lock: Some((running, now)),
            ..Job::default()
        };
        let mut reserved = Metadata::new();
        reserved.insert("leasegate_reserved_by".into(), "node-b".into());
        reserved.insert("leasegate_run".into(), "running".into());
        job.reservation(2_000_000_000, &reserved);
        reserved.insert("leasegate_run".into(), "succeeded".into());
        job.reservation(1_999_999_940, &reserved);
        let log: Log = serde_json::from_value(json!({
            "job": "nightly",
            "entries": [{"occurrence": "2033-05-18T03:33:20Z", "occurrenceUnix": 2_000_000_000u64,
                         "instance": "node-b", "reservedAt": "2033-05-18T03:33:20Z",
                         "status": "running", "fencingToken": 131_072_000_000_000u64,
                         "trigger": "cron", "pastDue": false, "attempt": 1}],
            "counters": {"ran": 3, "missed": 1},
            "paused": {"since": "2033-05-18T03:00:00Z", "note": "db\u{1b}[2J move"},
            "settledThrough": 1_999_999_940u64
        }))
        .unwrap();
        let mut gates = Gates::default();
        for (i, (label, since)) in [("w-1", 2_000_000_050), ("w-\u{7}2", 2_000_000_010)]
            .into_iter()
            .enumerate()
        {
            gates.blobs += 1;
            let info = listed(label, since, 2_000_000_700, 10 + i as u64, false);
            gates.add(&format!("gates/k{i}"), &info, now);
        }
        gates.blobs += 1;
        gates.add("gates/free", &listed("w-3", 1_000, 2_000, 5, false), now);
        json!({
            "format": FORMAT,
            "container": "leasegate",
            "serverTime": rfc3339(now),
            "leaders": [
                leader("blue", &listed("node-a", 2_000_000_000, 2_000_000_130, 99, false), now),
                leader("green", &listed("node-c", 1_000, 2_000, 42, false), now),
            ],
            "jobs": [job.value("nightly", Some(&log))],
            "gates": [gates.value("gates/"), Gates::default().value("alerts/")],
            "sweeper": sweeper(&json!({
                "containers": [
                    {"container": "docs", "prefix": "", "kind": "ttl", "status": "last"},
                    {"container": "logs", "prefix": "app/", "kind": "ttl", "status": "current",
                     "marker": "2!8!x"},
                    {"container": "old", "kind": "ttl", "status": "init", "off": true}
                ],
                "passes": 4, "lastPassCompletedAt": "2033-05-18T03:00:00Z",
                "purged": 120, "moved": 3, "locksRemoved": 7, "pages": 30,
                "ticks": [{"id": "t", "instance": "node-a", "since": "2033-05-18T03:34:50Z",
                           "active": true, "purged": 2}],
                "unusable": [{"container": "docs", "name": "x", "pass": 4}]
            })),
            "unreadable": [{"blob": "gates/%ZZ", "error": "not a lock blob's name"}],
        })
    }

    #[test]
    fn the_table() {
        let text = format_overview(&sample());
        let want = "\
container leasegate (storage time 2033-05-18T03:35:00Z)

leaders
  GROUP  STATE   LEADER  TERM  SINCE                 LEASE LEFT
  blue   led     node-a  99    2033-05-18T03:33:20Z  30 s
  green  vacant  -       42    -                     -

jobs
  nightly
    state        paused since 2033-05-18T03:00:00Z: db\\u{1b}[2J move
    running now  by node-b 2033-05-18T03:33:00Z since 2033-05-18T03:34:50Z, lease 50 s left
    next         not stored in the container (the schedule is the app's job_schedule): add --app URL
    reservations 2, newest 2033-05-18T03:33:20Z; 1 without a final outcome: 2033-05-18T03:33:20Z running by node-b
    settled      through 2033-05-18T03:32:20Z
    counters     ran 3, failed 0, retried 0, skipped (overlap) 0, skipped (paused) 0, missed 1
    last runs (newest first):
    OCCURRENCE            STATUS   ATTEMPT  INSTANCE  TRIGGER  PAST DUE  FENCING TOKEN    REASON
    2033-05-18T03:33:20Z  running  1        node-b    cron     no        131072000000000  -

gates (held lock blobs)
  PREFIX   BLOBS  HELD  LONGEST HELD
  gates/   3      2     gates/k1 by w-\\u{7}2 for 90 s (1m 30s) (since 2033-05-18T03:33:30Z, 600 s (10m) left, token 11)
  alerts/  0      0     -

sweeper
  passes    4 completed, the last at 2033-05-18T03:00:00Z
  progress  pass 5 under way: 1 of 2 targets listed to the end
            docs (ttl): listed to the end
            logs/app/ (ttl): in progress, more pages
            old (ttl): off (no longer configured)
  counters  purged 120, moved 3, locks removed 7, pages 30
  unusable  1 marked blob(s) whose names cannot be swept
  recent ticks (1 active):
  INSTANCE  LAST WRITE            ACTIVE  PURGED  MOVED  LOCKS REMOVED
  node-a    2033-05-18T03:34:50Z  yes     2       0      0

unreadable blobs (left out above)
  gates/%ZZ: not a lock blob's name
";
        assert_eq!(text, want, "\n{text}");
        assert!(!text.contains('\u{1b}') && !text.contains('\u{7}'));
    }

    #[test]
    fn an_empty_view_and_a_pass_not_started() {
        let v = json!({
            "format": FORMAT, "container": "c", "serverTime": null, "leaders": [], "jobs": [],
            "gates": [Gates::default().value("gates/")], "sweeper": null, "unreadable": []
        });
        assert_eq!(
            format_overview(&v),
            "container c\n\nleaders\n  none (no leader/ lock blob)\n\njobs\n  none (no jobs/ blob)\n\n\
             gates (held lock blobs)\n  PREFIX  BLOBS  HELD  LONGEST HELD\n  gates/  0      0     -\n\n\
             sweeper\n  no state yet (sweeper/state.json: the sweeper has not ticked)\n"
        );
        let s = sweeper(&json!({"containers": [{"container": "docs", "kind": "ttl",
                                                "status": "init"}], "passes": 1}));
        let mut out = String::new();
        format_sweeper(&mut out, &s);
        assert!(out.contains("progress  pass 2 not started yet\n"), "{out}");
        // A job with a log only and one with no log yet.
        let mut out = String::new();
        format_job(&mut out, &Job::default().value("j", None));
        assert!(out.contains("state        no log yet"), "{out}");
        assert!(out.contains("reservations 0\n"), "{out}");
        assert!(out.ends_with("    no runs recorded yet\n"), "{out}");
    }

    #[test]
    fn next_occurrences_from_the_app() {
        let mut v = sample();
        v["jobs"] = json!([
            Job::default().value("a", None),
            Job::default().value("b", None),
            Job::default().value("c", None)
        ]);
        add_next(&mut v, |job| match job {
            "a" => Ok(
                json!({"schedule": "0 9 * * *", "timeZone": "Europe/Berlin", "next": [
                {"utc": "2033-05-19T07:00:00Z", "local": "2033-05-19T09:00:00+02:00"},
                {"utc": "2033-05-20T07:00:00Z", "local": "2033-05-20T09:00:00+02:00"}]}),
            ),
            "b" => Ok(json!({"periodSeconds": 60})),
            _ => {
                Err("the app answered 404 Not Found: unknown_job: this component runs job a".into())
            }
        });
        assert_eq!(v["jobs"][0]["schedule"], "0 9 * * * (Europe/Berlin)");
        assert_eq!(v["jobs"][0]["next"][1]["utc"], "2033-05-20T07:00:00Z");
        assert!(v["jobs"][0]["nextError"].is_null());
        assert_eq!(v["jobs"][1]["schedule"], "every 60 s");
        assert!(v["jobs"][1]["next"].is_null());
        assert!(v["jobs"][2]["nextError"]
            .as_str()
            .unwrap()
            .contains("unknown_job"));
        let text = format_overview(&v);
        assert!(
            text.contains(
                "    schedule     0 9 * * * (Europe/Berlin)\n    next         \
                 2033-05-19T07:00:00Z  local 2033-05-19T09:00:00+02:00\n                 \
                 2033-05-20T07:00:00Z  local 2033-05-20T09:00:00+02:00\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "    schedule     every 60 s\n    next         not known: the app's answer"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "    next         not known: the app answered 404 Not Found: unknown_job"
            ),
            "{text}"
        );
    }

    /// A log the record schema cannot read is unreadable, as one that is not JSON: the
    /// function refuses both.
    #[test]
    fn logs_the_schema_cannot_read() {
        let log = parse_json::<Log>(
            br#"{"job": "j", "entries": [], "addedLater": 1}"#,
            "a job log",
        );
        assert_eq!(log.unwrap().job, "j");
        let e = parse_json::<Log>(b"{\"job\": ", "a job log").unwrap_err();
        assert!(e.starts_with("not JSON ("), "{e}");
        let e = parse_json::<Log>(br#"{"entries": []}"#, "a job log").unwrap_err();
        assert!(e.starts_with("not a job log (missing field `job`"), "{e}");
        let e = parse_json::<Log>(br#"{"job": "j", "entries": [{}]}"#, "a job log").unwrap_err();
        assert!(e.starts_with("not a job log ("), "{e}");
        assert!(parse_json::<Value>(b"[1]", "JSON").is_ok());
    }

    #[test]
    fn progress_lines() {
        let mut lines = Vec::new();
        let mut p = Progress::new(Duration::ZERO, |l| lines.push(l.to_string()));
        p.page("gates/", 10, 10);
        p.page("gates/", 5, 15);
        p.page("alerts/", 0, 0);
        p.done();
        drop(p);
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines[0].starts_with("leasegate: listing... 10 blobs so far (10 under gates/), "));
        assert!(lines[1].starts_with("leasegate: listing... 15 blobs so far (15 under gates/), "));
        assert!(
            lines[3].starts_with("leasegate: listed 15 blobs in "),
            "{lines:?}"
        );

        // Quick listings print nothing, not even the last line.
        let mut lines = Vec::new();
        let mut p = Progress::new(Duration::from_secs(3600), |l| lines.push(l.to_string()));
        p.page("gates/", 5000, 5000);
        p.done();
        drop(p);
        assert!(lines.is_empty(), "{lines:?}");

        let var = |v: &'static str| move |_: &str| Ok(Some(v.to_string()));
        assert_eq!(progress_every(var("0")).unwrap(), Duration::ZERO);
        assert_eq!(
            progress_every(var(" 250 ")).unwrap(),
            Duration::from_millis(250)
        );
        assert!(progress_every(var("1s")).unwrap_err().contains(PROGRESS_MS));
        assert_eq!(progress_every(|_: &str| Ok(None)).unwrap(), PROGRESS_EVERY);
    }
}
