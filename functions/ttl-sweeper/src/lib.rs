//! `ttl-sweeper`: blobs marked with a time-to-live are deleted (or moved to a dead-blob
//! container first) exactly once, by several workers sweeping at the same time.
//!
//! **Marking.** A blob carries metadata `TimeToLive` (an RFC 3339 UTC time) and optionally
//! `DeadBlobContainer` (`container`, `container/` or `container/prefix/`). Applications set them
//! themselves, or through `PUT /api/ttl/{container}/{blob}` with `{"expiresAt": "..."}` or
//! `{"ttlSeconds": N}` (from the storage server's clock) and an optional `"deadBlobContainer"`
//! (`null` removes it): a compare-and-swap on the blob's ETag that keeps its other metadata.
//!
//! **Sweeping.** The sweep state is a JSON blob (`sweeper/state.json`): the containers (from
//! `ttl_containers`), each with a prefix, a status (`init`, `current`, `last`, `off`) and its
//! continuation marker, plus the pass count, the last completed pass time and counters. One
//! worker's tick loops until its time budget is spent: it takes the state's lease
//! (`sweeper/lock`), claims the next page (List Blobs with `include=metadata` from the stored
//! marker), writes the new marker back and **releases the lease at once**; then it processes
//! the page concurrently. Each blob whose `TimeToLive` has passed by the storage server's clock
//! is copied to its dead-blob container (the version listed only, metadata kept minus
//! `TimeToLive`, plus `SourceUri`; waiting for the copy), then deleted **only if unchanged since
//! listing** (`If-Match` on the listed ETag) and not leased. A pass ends when every container
//! has given its last page; the next tick starts the next pass from the beginning.
//!
//! A blob changed or re-marked after listing is left alone; a failed copy leaves the source; a
//! crash between copy and delete leaves a duplicate in the dead-blob container, never a lost
//! blob. Each page is claimed by one worker, so each blob is deleted once.
//!
//! **The app's own lock blobs** (`alerts/`, `gates/` of the app's container, or
//! `ttl_lock_prefixes`) are swept too, unless `ttl_lock_retention_seconds` is `off` (default a
//! day): a lock blob
//! free for longer than that (not leased, no live claim, no marks, not written since) is
//! deleted with `If-Match`; tokens stay increasing (a re-created lock blob starts above).
#![deny(missing_docs)]
// Helpers return `Err(Response)`: the finished 4xx answer, once per request.
#![allow(clippy::result_large_err)]

use std::time::{Duration, Instant, SystemTime};

/// `ttl_lock_retention_seconds` when it is not set: a day.
pub const DEFAULT_LOCK_RETENTION_SECS: u64 = 86_400;

use futures::StreamExt;
use leasegate::lease::{Acquire, IdOrigin, Locks, Term};
use leasegate::ops::{
    public_blob_url, BlobItem, Condition, CopyBlob, CopyOutcome, CopyStatus, CreateContainer,
    DeleteBlob, DeleteBlobAndSnapshots, DeleteOutcome, GetBlob, GetProperties, ListBlobs,
    ListBlobsPage, PutBlob, Refusal, SetMetadata, WriteOutcome,
};
use leasegate::{BlobName, ContainerName, Counting, LeaseState, LockName, Transport};
use leasegate::{Request, Response, StatusCode};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::json;
use std::collections::BTreeMap;

use leasegate_spin::auth::Power;
use leasegate_spin::config::{self, ConfigError, Storage, Variables};
use leasegate_spin::storage::execute_creating_container;
use leasegate_spin::timer::{self, Source, Tick, TimerFunction};
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{auth, elapsed_ms, log_line, Context};

/// Metadata name of the time-to-live (as storage keeps it: lowercase).
pub const TIME_TO_LIVE: &str = "timetolive";
/// Metadata name of the dead-blob container.
pub const DEAD_BLOB_CONTAINER: &str = "deadblobcontainer";
/// The sweep state blob.
pub const STATE_BLOB: &str = "sweeper/state.json";
/// The longest time-to-live the marking API accepts (10 years).
pub const MAX_TTL_SECS: u64 = 10 * 365 * 24 * 3600;
/// How long a worker waits for a busy state lease before ending its tick.
const CLAIM_PATIENCE: Duration = Duration::from_secs(5);
/// The pause between two tries of a busy state lease.
const CLAIM_PAUSE: Duration = Duration::from_millis(40);
/// How often a pending copy is polled.
const COPY_POLL: Duration = Duration::from_millis(250);
/// How long a pending copy is waited for before the source is left alone.
const COPY_WAIT: Duration = Duration::from_secs(5);
/// The storage requests one expired blob can make at most, each bounded by the storage
/// timeout: copy, create the dead-blob container, copy again (3); HEAD of a taken name (1);
/// the same for the second name (3); the last poll of a pending copy or the HEAD of a taken
/// name (1); the delete (1). A pending copy adds [`COPY_WAIT`] and one [`COPY_POLL`].
const BLOB_REQUESTS: u32 = 9;
/// The most unusable names the state remembers (each reported once).
const MAX_UNUSABLE: usize = 100;
/// The variable that allows dead-blob containers.
const DEAD_CONTAINERS_VAR: &str = "ttl_dead_containers";

/// What a sweep entry sweeps (`"ttl"` or `"locks"` in the state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Blobs marked with a time-to-live.
    Ttl,
    /// The app's own lock blobs, free for longer than the retention.
    Locks,
}

// The state blob (`sweeper/state.json`) is JSON with camelCase keys, written pretty; absent
// options, an empty `unusable` and `off: false` are left out. It stays readable both ways
// during a rolling upgrade: unknown fields are ignored (a newer writer's), missing counters
// and lists read as 0 and empty, and no field is renamed.

/// One swept container (and prefix) in the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The container.
    pub container: String,
    /// The prefix swept (empty: all).
    #[serde(default)]
    pub prefix: String,
    /// What it sweeps.
    pub kind: Kind,
    /// `init` (the pass has not reached it), `current` (pages left) or `last` (its last page
    /// was claimed this pass).
    pub status: String,
    /// Where the next page starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marker: Option<String>,
    /// No longer configured: skipped, its progress kept.
    #[serde(default, skip_serializing_if = "is_false")]
    pub off: bool,
}

/// The sweep state blob.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// The swept containers, in order.
    pub containers: Vec<Entry>,
    /// Passes completed.
    #[serde(default)]
    pub passes: u64,
    /// When the last pass completed (server clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pass_completed_at: Option<String>,
    /// Blobs deleted (moved ones included) since the state began.
    #[serde(default)]
    pub purged: u64,
    /// Of those, moved to a dead-blob container.
    #[serde(default)]
    pub moved: u64,
    /// Lock blobs removed.
    #[serde(default)]
    pub locks_removed: u64,
    /// Pages claimed.
    #[serde(default)]
    pub pages: u64,
    /// The ticks of the last minutes (see [`TickEntry`]).
    #[serde(default)]
    pub ticks: Vec<TickEntry>,
    /// Marked blobs whose names cannot be swept: reported once, forgotten when a pass no
    /// longer lists them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unusable: Vec<Unusable>,
}

/// A marked blob whose name cannot be swept, as the state remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unusable {
    /// Its container.
    pub container: String,
    /// Its name.
    pub name: String,
    /// The pass that last listed it.
    #[serde(default)]
    pub pass: u64,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The sweeper's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Storage (its container holds the state and the app's lock blobs).
    pub storage: Storage,
    /// This deployment's identity.
    pub instance_id: String,
    /// What to sweep: (kind, container, prefix).
    pub targets: Vec<(Kind, ContainerName, String)>,
    /// Blobs per page.
    pub page_size: u32,
    /// How long one tick may sweep.
    pub budget: Duration,
    /// Lock blobs free for longer than this are removed (`None`: never).
    pub lock_retention: Option<Duration>,
    /// A new pass starts no sooner than this after the last one ended.
    pub pass_interval: Duration,
    /// The containers blobs may be moved to (`ttl_dead_containers`).
    pub dead_containers: DeadContainers,
}

/// Where `DeadBlobContainer` may send a blob (`ttl_dead_containers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadContainers {
    /// These containers only (none: blobs asking to be moved are left alone).
    Only(Vec<ContainerName>),
    /// `*`: any container but the app's own and the swept ones.
    Any,
}

/// Parses `container`, `container/` or `container/prefix/` (a dead-blob container, a swept
/// container): the container and the prefix (empty, or ending in `/`).
pub fn parse_location(s: &str) -> Result<(ContainerName, String), String> {
    let s = s.trim();
    let (container, prefix) = s.split_once('/').unwrap_or((s, ""));
    let container = ContainerName::try_new(container).map_err(|e| e.to_string())?;
    if !prefix.is_empty() {
        if !prefix.ends_with('/') {
            return Err(format!("the prefix '{prefix}' must end with '/'"));
        }
        BlobName::try_new(prefix.trim_end_matches('/')).map_err(|e| format!("the prefix: {e}"))?;
    }
    Ok((container, prefix.to_string()))
}

impl Settings {
    /// Reads the settings from variables.
    pub fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        let storage = config::storage(vars)?;
        let instance_id = timer::instance_id(vars)?;
        let mut targets = Vec::new();
        for entry in config::var(vars, "ttl_containers")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let (c, p) = parse_location(entry)
                .map_err(|e| ConfigError(format!("variable ttl_containers: {e}")))?;
            if c == storage.container {
                return Err(ConfigError(format!(
                    "variable ttl_containers: {c} is the app's own container (its lock blobs are swept by ttl_lock_retention_seconds)"
                )));
            }
            targets.push((Kind::Ttl, c, p));
        }
        let page_size = config::number(vars, "ttl_page_size", 100.0, 1..=5000)? as u32;
        let budget_ms = config::number(vars, "ttl_time_budget_ms", 10_000.0, 100..=600_000)?;
        // On by default (a day): every new device or gate key leaves a lock blob behind, and
        // only the sweeper removes them. `off` keeps them.
        let lock_retention = match config::var(vars, "ttl_lock_retention_seconds").as_deref() {
            Some("off") => None,
            _ => {
                // At least 2 s: a lock blob removed then is re-created in a later second than its
                // last token, so its tokens go on increasing.
                let secs = config::number(
                    vars,
                    "ttl_lock_retention_seconds",
                    DEFAULT_LOCK_RETENTION_SECS as f64,
                    2..=31_536_000,
                )?;
                Some(Duration::from_secs(secs as u64))
            }
        };
        if lock_retention.is_some() {
            let prefixes =
                config::var(vars, "ttl_lock_prefixes").unwrap_or_else(|| "alerts/,gates/".into());
            for p in prefixes.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                if !p.ends_with('/') || BlobName::try_new(p.trim_end_matches('/')).is_err() {
                    return Err(ConfigError(format!(
                        "variable ttl_lock_prefixes: '{p}' must be a blob name prefix ending in '/'"
                    )));
                }
                if ["init/", "sweeper/", "jobs/", "leader/"]
                    .iter()
                    .any(|k| p.starts_with(k))
                {
                    return Err(ConfigError(format!(
                        "variable ttl_lock_prefixes: '{p}' holds state that is not a lock (init marks, the sweep state, job logs) or a leader's term"
                    )));
                }
                targets.push((Kind::Locks, storage.container.clone(), p.to_string()));
            }
        }
        if targets.is_empty() {
            return Err(ConfigError(
                "nothing to sweep: set ttl_containers (container[/prefix/], comma-separated) or ttl_lock_retention_seconds".into(),
            ));
        }
        let pass_interval =
            config::number(vars, "ttl_pass_interval_seconds", 60.0, 0..=31_536_000)?;
        let dead_containers = match config::var(vars, DEAD_CONTAINERS_VAR)
            .as_deref()
            .map(str::trim)
        {
            Some("*") => DeadContainers::Any,
            list => {
                let mut allowed = Vec::new();
                for c in list
                    .unwrap_or("")
                    .split(',')
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                {
                    let c = ContainerName::try_new(c).map_err(|e| {
                        ConfigError(format!("variable {DEAD_CONTAINERS_VAR}: {e} (container names, comma-separated, or *)"))
                    })?;
                    if c == storage.container {
                        return Err(ConfigError(format!(
                            "variable {DEAD_CONTAINERS_VAR}: {c} is the app's own container (it holds the locks and the sweep state)"
                        )));
                    }
                    allowed.push(c);
                }
                DeadContainers::Only(allowed)
            }
        };
        Ok(Settings {
            storage,
            instance_id,
            targets,
            page_size,
            budget: Duration::from_millis(budget_ms as u64),
            lock_retention,
            pass_interval: Duration::from_secs(pass_interval as u64),
            dead_containers,
        })
    }

    /// Why a blob may not be moved to `container`/`prefix`, if it may not.
    pub fn dead_refusal(&self, container: &ContainerName, prefix: &str) -> Option<&'static str> {
        if *container == self.storage.container {
            return Some("DeadBlobContainer is the app's own container");
        }
        let allowed = match &self.dead_containers {
            DeadContainers::Any => true,
            DeadContainers::Only(list) => list.contains(container),
        };
        if !allowed {
            return Some("DeadBlobContainer is not allowed (ttl_dead_containers)");
        }
        // A moved blob keeps its metadata (TimeToLive included): moved into a swept place, it
        // would be moved again on every pass.
        let swept = self.targets.iter().any(|(k, c, p)| {
            *k == Kind::Ttl
                && c == container
                && (prefix.starts_with(p.as_str()) || p.starts_with(prefix))
        });
        swept.then_some("DeadBlobContainer is a swept container and prefix")
    }

    /// The longest one expired blob's work can take once begun: [`BLOB_REQUESTS`] storage
    /// timeouts, and a pending copy's wait and last pause.
    pub fn blob_worst_case(&self) -> Duration {
        BLOB_REQUESTS * self.storage.timeout + COPY_WAIT + COPY_POLL
    }

    /// The longest a tick can take: blobs are begun until [`Settings::work_deadline`], and one
    /// begun then ends within [`Settings::blob_worst_case`] (10 s more for clocks and the last
    /// write). A tick's entry older than this is no longer active.
    pub fn tick_bound(&self) -> Duration {
        self.work_deadline() + self.blob_worst_case() + Duration::from_secs(10)
    }

    /// Pages are claimed until the budget is spent; the blobs of the last page are begun until
    /// this long after the tick started (the budget again, at least 5 s more).
    pub fn work_deadline(&self) -> Duration {
        self.budget + self.budget.max(Duration::from_secs(5))
    }

    fn state_blob(&self) -> Result<BlobName, leasegate::Error> {
        BlobName::try_new(STATE_BLOB)
    }
}

/// What one tick did (the answer and the log line; never stored).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Pages claimed and processed.
    pub pages: u64,
    /// Blobs listed.
    pub scanned: u64,
    /// Blobs with no `TimeToLive`.
    pub unmarked: u64,
    /// Marked blobs whose time has not come.
    pub not_expired: u64,
    /// Expired blobs deleted (moved ones included).
    pub deleted: u64,
    /// Of those, moved to a dead-blob container first.
    pub moved: u64,
    /// Lock blobs removed.
    pub locks_removed: u64,
    /// Blobs left alone, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Requests that failed (the blob is left as it was; a later pass retries it).
    pub errors: u64,
    /// Whether this tick completed a pass.
    pub pass_completed: bool,
    /// Why the tick stopped: `budget`, `pass complete`, `state busy`.
    pub stopped: String,
    /// Swept containers whose listing failed for good this pass (a 403, a 400): skipped until
    /// the next pass, the others swept.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub containers_skipped: Vec<SkippedContainer>,
    /// Marked blobs whose names cannot be swept (a `.` or `..` segment), each reported once
    /// (the state remembers them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unusable_names: Vec<UnusableName>,
    /// Unusable names found past the [`MAX_UNUSABLE`] the state remembers: counted on every
    /// pass that lists them, not named.
    #[serde(skip_serializing_if = "is_zero")]
    pub unusable_names_not_remembered: u64,
}

/// A marked blob whose name cannot be swept, as a tick reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnusableName {
    /// Its container.
    pub container: String,
    /// Its name.
    pub name: String,
}

/// A swept container skipped for this pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedContainer {
    /// The container.
    pub container: String,
    /// The prefix swept.
    pub prefix: String,
    /// Storage's status, when storage answered (`null` otherwise).
    pub storage_status: Option<u16>,
    /// Storage's error code, when it sent one (`null` otherwise).
    pub storage_error_code: Option<String>,
    /// What failed.
    pub message: String,
}

impl Report {
    fn skip(&mut self, reason: &str) {
        self.skip_n(reason, 1);
    }

    /// Counts `n` blobs left alone for `reason`.
    fn skip_n(&mut self, reason: &str, n: u64) {
        *self.skipped.entry(reason.to_string()).or_default() += n;
    }
}

/// A claimed page.
struct Claimed {
    kind: Kind,
    container: ContainerName,
    page: ListBlobsPage,
    server_now: SystemTime,
}

/// Counters kept in the state (a tick's entry holds them as its own fields; missing ones are
/// 0).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Counters {
    /// Blobs deleted (moved ones included).
    pub purged: u64,
    /// Of those, moved to a dead-blob container.
    pub moved: u64,
    /// Lock blobs removed.
    pub locks_removed: u64,
}

impl Counters {
    fn of(report: &Report) -> Counters {
        Counters {
            purged: report.deleted,
            moved: report.moved,
            locks_removed: report.locks_removed,
        }
    }

    fn is_zero(&self) -> bool {
        *self == Counters::default()
    }

    fn plus(self, o: Counters) -> Counters {
        Counters {
            purged: self.purged.saturating_add(o.purged),
            moved: self.moved.saturating_add(o.moved),
            locks_removed: self.locks_removed.saturating_add(o.locks_removed),
        }
    }

    fn minus(self, o: Counters) -> Counters {
        Counters {
            purged: self.purged.saturating_sub(o.purged),
            moved: self.moved.saturating_sub(o.moved),
            locks_removed: self.locks_removed.saturating_sub(o.locks_removed),
        }
    }
}

/// A tick as the state knows it: while it is `active` it may still be processing a page it
/// claimed, and the pass does not end; `credited` is what it has added to the state's counters
/// so far. A tick leaves it inactive when it is done; entries of other ticks are dropped once
/// older than [`Settings::tick_bound`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TickEntry {
    /// The tick's random id.
    pub id: String,
    /// Its instance.
    pub instance: String,
    /// When it last wrote the state (server clock).
    pub since: String,
    /// Whether it may still be processing a page.
    pub active: bool,
    /// What it has added to the counters (`purged`, `moved`, `locksRemoved`).
    #[serde(flatten)]
    pub credited: Counters,
}

/// One tick's bookkeeping.
struct Bookkeeping {
    id: String,
    /// Counters written to the state (as far as this tick knows).
    credited: Counters,
    /// Counters of processed pages not yet written.
    pending: Counters,
    /// The state may show this tick active.
    maybe_active: bool,
    /// Containers skipped by this tick's claims (see [`Report::containers_skipped`]).
    containers_skipped: Vec<SkippedContainer>,
    /// Unusable names this tick's claims found first.
    unusable_names: Vec<UnusableName>,
    /// Unusable names this tick's claims found that the state had no room to remember.
    unusable_overflow: u64,
}

/// One tick: claim and process pages until the budget is spent or the pass completes. The
/// report stands even when the tick ends on a storage failure.
pub async fn sweep<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    started: Instant,
) -> (Report, Option<leasegate::Error>, u32) {
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let locks = settings.storage.locks(&counting, "sweeper/");
    let mut tick = Bookkeeping {
        id: (ctx.new_lease_id)().to_string(),
        credited: Counters::default(),
        pending: Counters::default(),
        maybe_active: false,
        containers_skipped: Vec::new(),
        unusable_names: Vec::new(),
        unusable_overflow: 0,
    };
    let mut report = Report::default();
    let mut failure = None;
    loop {
        if started.elapsed() >= settings.budget {
            report.stopped = "budget".into();
            break;
        }
        let claimed = match claim(ctx, &locks, settings, &mut tick, Some(started)).await {
            Ok(Claim::Page(p)) => p,
            Ok(Claim::PassComplete) => {
                report.pass_completed = true;
                report.stopped = "pass complete".into();
                break;
            }
            Ok(Claim::Finishing) => {
                report.stopped =
                    "no pages left: the pass ends when the other workers finish theirs".into();
                break;
            }
            Ok(Claim::Resting) => {
                report.stopped = "resting until ttl_pass_interval_seconds has passed".into();
                break;
            }
            // (`Done` answers only the last write.)
            Ok(Claim::Busy | Claim::Done) => {
                report.stopped = "state busy".into();
                break;
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let page_report = process(ctx, &locks, settings, &claimed, started).await;
        tick.pending = tick.pending.plus(Counters::of(&page_report));
        report = merge(report, &page_report);
        report.pages += 1;
    }
    // The last write: the counters not yet written, and this tick no longer active.
    if tick.maybe_active || !tick.pending.is_zero() {
        match claim(ctx, &locks, settings, &mut tick, None).await {
            Ok(Claim::Done) => {}
            Ok(_) => report
                .stopped
                .push_str("; the state could not be updated (busy)"),
            Err(e) => {
                report
                    .stopped
                    .push_str("; the state could not be updated (storage)");
                failure.get_or_insert(e);
            }
        }
    }
    report.containers_skipped = std::mem::take(&mut tick.containers_skipped);
    report.unusable_names = std::mem::take(&mut tick.unusable_names);
    report.unusable_names_not_remembered = tick.unusable_overflow;
    (report, failure, counting.sent())
}

fn merge(mut into: Report, page: &Report) -> Report {
    into.scanned += page.scanned;
    into.unmarked += page.unmarked;
    into.not_expired += page.not_expired;
    into.deleted += page.deleted;
    into.moved += page.moved;
    into.locks_removed += page.locks_removed;
    into.errors += page.errors;
    for (k, v) in &page.skipped {
        into.skip_n(k, *v);
    }
    into
}

enum Claim {
    /// A page to process.
    Page(Claimed),
    /// This claim completed the pass.
    PassComplete,
    /// Every page of the pass is claimed; other ticks still process theirs.
    Finishing,
    /// The last pass ended less than `ttl_pass_interval_seconds` ago.
    Resting,
    /// Another worker held the state, or wrote it meanwhile: nothing was written.
    Busy,
    /// The last write of a tick landed.
    Done,
}

/// Reads the state (content and ETag); a missing state is empty.
async fn read_state<S: Transport>(
    locks: &Locks<S>,
    settings: &Settings,
    now: SystemTime,
) -> Result<(State, Option<leasegate::ETag>, SystemTime), leasegate::Error> {
    let (blob, date) = locks
        .execute(
            &GetBlob {
                container: settings.storage.container.clone(),
                blob: settings.state_blob()?,
            },
            now,
        )
        .await?;
    let date = date.unwrap_or(now);
    match blob {
        None => Ok((State::default(), None, date)),
        Some(b) => {
            let state: State = serde_json::from_slice(&b.body).map_err(|e| {
                leasegate::Error::CorruptLock(format!(
                    "the sweep state {STATE_BLOB} is not a sweep state ({e}; delete it to start over)"
                ))
            })?;
            Ok((state, b.properties.etag, date))
        }
    }
}

async fn write_state<S: Transport>(
    locks: &Locks<S>,
    settings: &Settings,
    state: &State,
    etag: Option<leasegate::ETag>,
    now: SystemTime,
) -> Result<bool, leasegate::Error> {
    // Serializing the state cannot fail (string keys, integers); pretty, as it always was.
    let body = serde_json::to_vec_pretty(state).expect("the state serializes");
    let put = PutBlob::block(
        settings.storage.container.clone(),
        settings.state_blob()?,
        body,
    )
    .with_content_type("application/json")
    .with_condition(etag.map_or(Condition::IfNotExists, Condition::IfMatch));
    Ok(matches!(
        execute_creating_container(locks, &put, now).await?.0,
        WriteOutcome::Written(_)
    ))
}

/// The configured targets, with the state's progress where it has some. A target no longer
/// configured is kept `off` with its progress; configured again, it goes on from there.
fn reconcile(state: &mut State, settings: &Settings) {
    for e in &mut state.containers {
        if e.status == "off" {
            // (A state written before `off` became a flag.)
            e.status = "init".into();
            e.off = true;
        }
        e.off = !settings
            .targets
            .iter()
            .any(|(k, c, p)| e.kind == *k && e.container == c.as_str() && e.prefix == *p);
    }
    for (kind, container, prefix) in &settings.targets {
        let known = state
            .containers
            .iter()
            .any(|e| e.kind == *kind && e.container == container.as_str() && e.prefix == *prefix);
        if !known {
            state.containers.push(Entry {
                container: container.to_string(),
                prefix: prefix.clone(),
                kind: *kind,
                status: "init".into(),
                marker: None,
                off: false,
            });
        }
    }
}

/// Takes the state lease, settles the tick's counters, claims the next page (or, when
/// `started` is `None`, only records the tick as done), writes the state and releases the lease.
async fn claim<T, S: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<S>,
    settings: &Settings,
    tick: &mut Bookkeeping,
    started: Option<Instant>,
) -> Result<Claim, leasegate::Error> {
    let lock = LockName::try_new("lock")?;
    let id = (ctx.new_lease_id)();
    let term = Term::for_window(Duration::from_secs(30))?;
    let waited = Instant::now();
    loop {
        match locks
            .acquire_with(
                &lock,
                term,
                id,
                IdOrigin::Fresh,
                &settings.instance_id,
                ctx.now,
            )
            .await?
        {
            Acquire::Acquired(_) => break,
            Acquire::Busy { .. }
                if waited.elapsed() < CLAIM_PATIENCE
                    && started.is_none_or(|s| s.elapsed() < settings.budget) =>
            {
                (ctx.sleep)(CLAIM_PAUSE).await;
            }
            Acquire::Busy { .. } => return Ok(Claim::Busy),
        }
    }
    let claimed = claim_held(locks, settings, tick, started.is_some(), ctx.now).await;
    let _ = locks.release(&lock, id, ctx.now).await;
    claimed
}

async fn claim_held<S: Transport>(
    locks: &Locks<S>,
    settings: &Settings,
    tick: &mut Bookkeeping,
    page_wanted: bool,
    now: SystemTime,
) -> Result<Claim, leasegate::Error> {
    let (mut state, etag, server_now) = read_state(locks, settings, now).await?;
    reconcile(&mut state, settings);
    // A write whose answer was lost may have landed: this tick's entry says what did.
    if let Some(e) = state.ticks.iter().find(|t| t.id == tick.id) {
        let landed = e.credited.minus(tick.credited);
        tick.pending = tick.pending.minus(landed);
        tick.credited = e.credited;
    }
    let credited = tick.credited.plus(tick.pending);
    let c = credited.minus(tick.credited);
    state.purged = state.purged.saturating_add(c.purged);
    state.moved = state.moved.saturating_add(c.moved);
    state.locks_removed = state.locks_removed.saturating_add(c.locks_removed);
    let bound = settings.tick_bound();
    state.ticks.retain(|t| {
        t.id != tick.id
            && timer::parse_time(&t.since).is_some_and(|since| since + bound > server_now)
    });
    let others_active = state.ticks.iter().any(|t| t.active);
    let mut entry = TickEntry {
        id: tick.id.clone(),
        instance: settings.instance_id.clone(),
        since: rfc3339(server_now),
        active: false,
        credited,
    };
    let mut page = None;
    let mut skipped = Vec::new();
    let mut unusable_new = Vec::new();
    let mut unusable_overflow = 0;
    let outcome = if !page_wanted {
        Claim::Done
    } else if resting(&state, settings, server_now) {
        Claim::Resting
    } else {
        let mut found = None;
        while let Some(index) = state
            .containers
            .iter()
            .position(|e| !e.off && (e.status == "init" || e.status == "current"))
        {
            match list_page(locks, settings, &state.containers[index], now).await {
                Ok(listed) => {
                    found = Some((index, listed));
                    break;
                }
                // A listing storage refuses for good (a SAS without list rights there, a bad
                // request) would stop every pass here: the container is skipped until the next
                // pass, and reported.
                Err(e) if refuses_for_good(&e) => {
                    let entry = &mut state.containers[index];
                    let (storage_status, storage_error_code) = match &e {
                        leasegate::Error::Storage(s) => (Some(s.status.as_u16()), s.code.clone()),
                        _ => (None, None),
                    };
                    skipped.push(SkippedContainer {
                        container: entry.container.clone(),
                        prefix: entry.prefix.clone(),
                        storage_status,
                        storage_error_code,
                        message: format!("listing failed: {e}"),
                    });
                    entry.status = "last".into();
                    entry.marker = None;
                }
                Err(e) => return Err(e),
            }
        }
        if let Some((index, listed)) = found {
            if listed.kind == Kind::Ttl {
                unusable_overflow = remember_unusable(&mut state, &listed, &mut unusable_new);
            }
            let e = &mut state.containers[index];
            e.marker = listed.page.next_marker.clone();
            e.status = if e.marker.is_some() {
                "current"
            } else {
                "last"
            }
            .into();
            state.pages += 1;
            entry.active = true;
            page = Some(listed);
            Claim::Busy
        } else if others_active {
            Claim::Finishing
        } else {
            // Every page of the pass is claimed and processed: it is complete.
            for e in &mut state.containers {
                e.status = "init".into();
                e.marker = None;
            }
            // Unusable names this pass did not list again are gone (or renamed).
            let this_pass = state.passes;
            state.unusable.retain(|u| u.pass == this_pass);
            state.passes += 1;
            state.last_pass_completed_at = Some(rfc3339(server_now));
            Claim::PassComplete
        }
    };
    let active = entry.active;
    state.ticks.push(entry);
    // If this write's answer is lost, the next claim's read settles the counters.
    tick.maybe_active |= active;
    if !write_state(locks, settings, &state, etag, now).await? {
        // The state moved although we hold its lease (someone wrote it without): nothing
        // was written, nothing is claimed.
        return Ok(Claim::Busy);
    }
    tick.credited = credited;
    tick.pending = Counters::default();
    tick.maybe_active = active;
    tick.containers_skipped.extend(skipped);
    tick.unusable_names.extend(unusable_new);
    tick.unusable_overflow += unusable_overflow;
    Ok(page.map_or(outcome, Claim::Page))
}

/// Whether a listing error will not go away by asking again this pass: storage refused the
/// request (4xx but a timeout or throttling), or the request could not be built.
fn refuses_for_good(e: &leasegate::Error) -> bool {
    match e {
        leasegate::Error::Storage(s) => {
            s.status.is_client_error()
                && !matches!(
                    s.status,
                    StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS
                )
        }
        leasegate::Error::InvalidName { .. } | leasegate::Error::InvalidArgument(_) => true,
        _ => false,
    }
}

/// Records the page's marked blobs whose names cannot be swept (a `.` or `..` segment, a
/// control character) in the state, and puts those it did not know into `new`: each is
/// reported once, not on every pass. Past [`MAX_UNUSABLE`] a name cannot be remembered, so it
/// is not named (it would be on every pass): the answer is how many such names the page had.
fn remember_unusable(state: &mut State, listed: &Claimed, new: &mut Vec<UnusableName>) -> u64 {
    let pass = state.passes;
    let mut overflow = 0;
    for item in &listed.page.blobs {
        if !item.properties.metadata.contains_key(TIME_TO_LIVE)
            || BlobName::try_new(&item.name).is_ok()
        {
            continue;
        }
        let container = listed.container.as_str();
        match state
            .unusable
            .iter_mut()
            .find(|u| u.container == container && u.name == item.name)
        {
            Some(known) => known.pass = pass,
            None => {
                if state.unusable.len() < MAX_UNUSABLE {
                    state.unusable.push(Unusable {
                        container: container.to_string(),
                        name: item.name.clone(),
                        pass,
                    });
                    new.push(UnusableName {
                        container: container.to_string(),
                        name: item.name.clone(),
                    });
                } else {
                    overflow += 1;
                }
            }
        }
    }
    overflow
}

/// Whether a new pass must wait: the last one ended less than `ttl_pass_interval_seconds` ago
/// and this one has not started.
fn resting(state: &State, settings: &Settings, server_now: SystemTime) -> bool {
    let fresh = state.containers.iter().all(|e| e.off || e.status == "init");
    fresh
        && state
            .last_pass_completed_at
            .as_deref()
            .and_then(timer::parse_time)
            .is_some_and(|t| t + settings.pass_interval > server_now)
}

/// Lists the next page of `entry`.
async fn list_page<S: Transport>(
    locks: &Locks<S>,
    settings: &Settings,
    entry: &Entry,
    now: SystemTime,
) -> Result<Claimed, leasegate::Error> {
    let container = ContainerName::try_new(&entry.container)?;
    let list = ListBlobs {
        prefix: (!entry.prefix.is_empty()).then(|| entry.prefix.clone()),
        marker: entry.marker.clone(),
        max_results: Some(settings.page_size),
        include_metadata: true,
        ..ListBlobs::new(container.clone())
    };
    let (page, date) = match locks.execute(&list, now).await {
        Ok((page, date)) => (page, date),
        // A swept container that does not exist (yet) has no blobs.
        Err(e) if e.class() == Some(leasegate::ErrorClass::ContainerMissing) => {
            (ListBlobsPage::default(), None)
        }
        Err(e) => return Err(e),
    };
    Ok(Claimed {
        kind: entry.kind,
        container,
        page,
        server_now: date.unwrap_or(now),
    })
}

/// Processes a claimed page concurrently (at most `max_in_flight` blobs at a time).
async fn process<T, S: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<S>,
    settings: &Settings,
    claimed: &Claimed,
    started: Instant,
) -> Report {
    let outcomes: Vec<Outcome> = futures::stream::iter(claimed.page.blobs.iter())
        .map(|item| async move {
            // Late in the tick no blob is begun: it stays within `tick_bound`.
            if started.elapsed() >= settings.work_deadline() {
                return Outcome::Skipped("the tick's time ran out (the next pass takes it)");
            }
            match claimed.kind {
                Kind::Ttl => sweep_blob(ctx, locks, settings, claimed, item).await,
                Kind::Locks => sweep_lock(ctx, locks, settings, claimed, item).await,
            }
        })
        .buffer_unordered(settings.storage.max_in_flight)
        .collect()
        .await;
    let mut report = Report::default();
    for o in outcomes {
        report.scanned += 1;
        match o {
            Outcome::Unmarked => report.unmarked += 1,
            Outcome::NotExpired => report.not_expired += 1,
            Outcome::Deleted => report.deleted += 1,
            Outcome::Moved => {
                report.deleted += 1;
                report.moved += 1;
            }
            Outcome::LockRemoved => report.locks_removed += 1,
            Outcome::Skipped(reason) => report.skip(reason),
            // Reported once, by the claim that first listed it.
            Outcome::Unusable => {}
            Outcome::Error => report.errors += 1,
        }
    }
    report
}

/// What became of one listed blob.
enum Outcome {
    Unmarked,
    NotExpired,
    Deleted,
    Moved,
    LockRemoved,
    Skipped(&'static str),
    /// A name that cannot be swept (see [`remember_unusable`]).
    Unusable,
    Error,
}

async fn sweep_blob<T, S: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<S>,
    settings: &Settings,
    claimed: &Claimed,
    item: &BlobItem,
) -> Outcome {
    let props = &item.properties;
    let Some(ttl) = props.metadata.get(TIME_TO_LIVE) else {
        return Outcome::Unmarked;
    };
    let Some(expires) = timer::parse_time(ttl) else {
        return Outcome::Skipped("TimeToLive is not a time");
    };
    if expires > claimed.server_now {
        return Outcome::NotExpired;
    }
    let dead = match props.metadata.get(DEAD_BLOB_CONTAINER) {
        None => None,
        Some(d) if d.trim().is_empty() => None,
        Some(d) => match parse_location(d) {
            Ok(loc) => Some(loc),
            Err(_) => return Outcome::Skipped("DeadBlobContainer is not container[/prefix/]"),
        },
    };
    if props
        .lease_state
        .is_some_and(|s| matches!(s, LeaseState::Leased | LeaseState::Breaking))
    {
        return Outcome::Skipped("leased");
    }
    let Ok(source) = BlobName::try_new(&item.name) else {
        return Outcome::Unusable;
    };
    let Some(etag) = props.etag.clone() else {
        return Outcome::Skipped("listed without an ETag");
    };
    let container = &claimed.container;
    if let Some((dead_container, prefix)) = &dead {
        // The owner asked for a move: a move that is not allowed leaves the blob where it is.
        if let Some(reason) = settings.dead_refusal(dead_container, prefix) {
            return Outcome::Skipped(reason);
        }
        // The copy keeps the source's metadata: never carry a claim of this app's elsewhere.
        if props.metadata.keys().any(|k| k.starts_with("leasegate_")) {
            return Outcome::Skipped("the blob carries leasegate claim metadata (never moved)");
        }
        if let Err(reason) = move_blob(
            ctx,
            locks,
            settings,
            claimed,
            item,
            &etag,
            dead_container,
            prefix,
        )
        .await
        {
            return reason;
        }
    }
    // With its snapshots (a plain delete of a blob with snapshots is refused, every pass).
    let delete = DeleteBlobAndSnapshots(DeleteBlob {
        container: container.clone(),
        blob: source,
        lease_id: None,
        condition: Condition::IfMatch(etag),
    });
    match locks.execute(&delete, ctx.now).await {
        Ok((DeleteOutcome::Deleted, _)) => {
            if dead.is_some() {
                Outcome::Moved
            } else {
                Outcome::Deleted
            }
        }
        Ok((DeleteOutcome::NotFound, _)) => Outcome::Skipped("already gone"),
        Ok((DeleteOutcome::Refused(Refusal::LeaseHeld), _)) => Outcome::Skipped("leased"),
        Ok((DeleteOutcome::Refused(_), _)) => Outcome::Skipped("changed since listing"),
        Err(_) => Outcome::Error,
    }
}

/// Whether `copy` holds the very content of `listed`: both carry a `Content-MD5` (storage
/// computes it for a Put Blob, and a copy keeps its source's) and they and the lengths agree.
/// A copy made in the same second as the listed version was written cannot be told from a
/// copy of an earlier version by its time; by its content it can.
fn same_content(
    copy: &leasegate::ops::BlobProperties,
    listed: &leasegate::ops::BlobProperties,
) -> bool {
    copy.content_md5.is_some()
        && copy.content_md5 == listed.content_md5
        && copy.content_length.is_some()
        && copy.content_length == listed.content_length
}

/// Whether a successful copy of this source, written at `copied` (seconds), holds the version
/// listed as written at `listed`: one written in a later second does; one written in the same
/// second does only with the very content (`same_content`). An earlier copy never does, even
/// with the same content: the source's metadata may have changed since (same MD5).
fn holds_listed_version(copied: Option<u64>, listed: Option<u64>, same_content: bool) -> bool {
    match (copied, listed) {
        (Some(copied), Some(listed)) => copied > listed || (copied == listed && same_content),
        _ => false,
    }
}

/// Copies the listed version of `item` to its dead-blob container, never over another blob:
/// to `{prefix}{name}`, or, when that name is taken by another blob, `{prefix}{name}.{etag}`.
/// The copy sends no metadata, so storage keeps the source's exactly (names' case and values).
/// A destination that already holds this version (copied from this source, successfully, and
/// either written in a later second than the listed version or, in the same second, holding
/// the listed version's very content, by `Content-MD5` and length: an earlier move that did
/// not get to delete the source) counts as copied; an earlier copy never does. `Err` is the outcome of a blob that must stay where it is.
#[allow(clippy::too_many_arguments)]
async fn move_blob<T, S: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<S>,
    settings: &Settings,
    claimed: &Claimed,
    item: &BlobItem,
    etag: &leasegate::ETag,
    dead_container: &ContainerName,
    prefix: &str,
) -> Result<(), Outcome> {
    let source =
        BlobName::try_new(&item.name).map_err(|_| Outcome::Skipped("the name is not usable"))?;
    let source_uri = public_blob_url(&settings.storage.account, &claimed.container, &source);
    let version = etag.as_str().trim_matches('"').to_string();
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .ok()
    };
    let listed_at = item.properties.last_modified.map(secs);
    for name in [
        format!("{prefix}{}", item.name),
        format!("{prefix}{}.{version}", item.name),
    ] {
        let target = BlobName::try_new(&name)
            .map_err(|_| Outcome::Skipped("the dead blob's name is too long"))?;
        let copy = CopyBlob {
            condition: Condition::IfNotExists,
            source_etag: Some(etag.clone()),
            metadata: None,
            ..CopyBlob::new(
                claimed.container.clone(),
                source.clone(),
                dead_container.clone(),
                target.clone(),
            )
        };
        match copy_creating(locks, &copy, dead_container, ctx.now).await {
            Ok(CopyOutcome::Started {
                status: CopyStatus::Success,
                ..
            }) => return Ok(()),
            Ok(CopyOutcome::Started {
                status: CopyStatus::Pending,
                copy_id,
                ..
            }) => {
                return if wait_for_copy(ctx, locks, dead_container, &target, copy_id.as_deref())
                    .await
                {
                    Ok(())
                } else {
                    Err(Outcome::Skipped("the copy did not finish"))
                };
            }
            Ok(CopyOutcome::Refused(Refusal::ConditionFailed)) => {
                return Err(Outcome::Skipped("changed since listing"))
            }
            // The name is taken (or leased): by this very version, or by another blob.
            Ok(CopyOutcome::Refused(_)) => {
                let head = GetProperties {
                    container: dead_container.clone(),
                    blob: target.clone(),
                };
                match locks.execute(&head, ctx.now).await {
                    Ok((Some(p), _))
                        if p.copy_status.as_deref() == Some("success")
                            && p.copy_source.as_deref().and_then(|s| s.split('?').next())
                                == Some(source_uri.as_str())
                            && holds_listed_version(
                                p.last_modified.and_then(secs),
                                listed_at.flatten(),
                                same_content(&p, &item.properties),
                            ) =>
                    {
                        return Ok(())
                    }
                    Ok(_) => continue,
                    Err(_) => return Err(Outcome::Error),
                }
            }
            Err(_) => return Err(Outcome::Error),
        }
    }
    Err(Outcome::Skipped("the dead blob's name is taken"))
}

/// Copies, creating the dead-blob container if it is missing.
async fn copy_creating<S: Transport>(
    locks: &Locks<S>,
    copy: &CopyBlob,
    dead_container: &ContainerName,
    now: SystemTime,
) -> Result<CopyOutcome, leasegate::Error> {
    match locks.execute(copy, now).await {
        Err(e) if e.class() == Some(leasegate::ErrorClass::ContainerMissing) => {
            locks
                .execute(
                    &CreateContainer {
                        container: dead_container.clone(),
                    },
                    now,
                )
                .await?;
            Ok(locks.execute(copy, now).await?.0)
        }
        other => other.map(|(o, _)| o),
    }
}

/// Polls a pending copy's destination until this copy succeeds (`true`), or fails, is
/// replaced, or takes longer than [`COPY_WAIT`].
async fn wait_for_copy<T, S: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<S>,
    container: &ContainerName,
    blob: &BlobName,
    copy_id: Option<&str>,
) -> bool {
    let waited = Instant::now();
    while waited.elapsed() < COPY_WAIT {
        (ctx.sleep)(COPY_POLL).await;
        let head = GetProperties {
            container: container.clone(),
            blob: blob.clone(),
        };
        match locks.execute(&head, ctx.now).await {
            Ok((Some(p), _)) if copy_id.is_none_or(|id| p.copy_id.as_deref() == Some(id)) => {
                match p.copy_status.as_deref() {
                    Some("success") => return true,
                    Some("pending") => continue,
                    _ => return false,
                }
            }
            _ => return false,
        }
    }
    false
}

/// A lock blob free for longer than the retention (not leased, no live claim, no marks, not
/// written since) is deleted with `If-Match` on its listed ETag.
async fn sweep_lock<T, S: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<S>,
    settings: &Settings,
    claimed: &Claimed,
    item: &BlobItem,
) -> Outcome {
    let Some(retention) = settings.lock_retention else {
        return Outcome::NotExpired;
    };
    let props = &item.properties;
    if props.blob_type.as_deref() != Some("PageBlob") || props.content_length.unwrap_or(0) != 0 {
        return Outcome::Skipped("not a lock blob");
    }
    if props
        .lease_state
        .is_some_and(|s| matches!(s, LeaseState::Leased | LeaseState::Breaking))
    {
        return Outcome::NotExpired;
    }
    if props.metadata.keys().any(|k| !k.starts_with("leasegate_")) {
        return Outcome::Skipped("a lock with marks");
    }
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    };
    let cutoff = secs(claimed.server_now).saturating_sub(retention.as_secs());
    // A record counts until it expires; a native claim only while its lease is held (it is not).
    let record = props
        .metadata
        .get("leasegate_term")
        .is_none_or(|t| t == "record");
    let expires: u64 = props
        .metadata
        .get("leasegate_expires")
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    let written = props.last_modified.map(secs).unwrap_or(u64::MAX);
    if (record && expires > cutoff) || written > cutoff {
        return Outcome::NotExpired;
    }
    let (Ok(blob), Some(etag)) = (BlobName::try_new(&item.name), props.etag.clone()) else {
        return Outcome::Skipped("the name is not usable");
    };
    let delete = DeleteBlob {
        container: claimed.container.clone(),
        blob,
        lease_id: None,
        condition: Condition::IfMatch(etag),
    };
    match locks.execute(&delete, ctx.now).await {
        Ok((DeleteOutcome::Deleted, _)) => Outcome::LockRemoved,
        Ok((DeleteOutcome::NotFound, _)) => Outcome::Skipped("already gone"),
        // Taken or written since it was listed: in use again.
        Ok((DeleteOutcome::Refused(_), _)) => Outcome::NotExpired,
        Err(_) => Outcome::Error,
    }
}

/// The answer of a tick (and, with `fn`, its log line): its report, and the failure that
/// ended it if one did.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TickAnswer {
    #[serde(flatten)]
    report: Report,
    instance: String,
    trigger: &'static str,
    storage_round_trips: u32,
    duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

fn describe(
    settings: &Settings,
    source: Source,
    report: Report,
    failure: Option<&leasegate::Error>,
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
            answer.error = Some(
                if matches!(
                    e,
                    leasegate::Error::CorruptLock(_) | leasegate::Error::UnusableLock { .. }
                ) {
                    "state_unusable"
                } else {
                    web::storage_error_code(e)
                },
            );
            answer.message = Some(web::storage_failed(e, "the sweep state could not be used"));
            (web::storage_status(e), answer)
        }
    }
}

/// The largest request body the routes read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Route prefix of the marking API.
pub const TTL_ROUTE: &str = "/api/ttl/";
/// Route of the sweeper's HTTP forms.
pub const SWEEPER_ROUTE: &str = "/api/sweeper";

/// The TTL sweeper as a timer function: a pass ticked by Spin's cron trigger, an Azure Functions
/// timer, or `POST /api/sweeper/tick`; blobs marked by `PUT /api/ttl/{container}/{blob}`.
pub struct Sweeper;

impl TimerFunction for Sweeper {
    const NAME: &'static str = "ttl-sweeper";
    const ROUTES: &'static [&'static str] = &["/api/ttl", SWEEPER_ROUTE];
    type Settings = Settings;
    type Answer = TickAnswer;

    fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        Settings::load(vars)
    }

    /// One pass of the sweep: `Err` to the cron trigger when the sweep state could not be
    /// used.
    async fn tick<T: Transport>(
        ctx: &Context<'_, T>,
        settings: &Settings,
        tick: &Tick,
        started: Instant,
    ) -> (StatusCode, TickAnswer) {
        let (report, failure, trips) = sweep(ctx, settings, started).await;
        describe(
            settings,
            tick.source,
            report,
            failure.as_ref(),
            trips,
            started,
        )
    }

    fn failure(answer: &TickAnswer) -> String {
        answer
            .message
            .clone()
            .unwrap_or_else(|| "the sweep failed".to_string())
    }

    fn summary(settings: &Settings, answer: &TickAnswer) -> String {
        let report = &answer.report;
        format!(
            "ttl-sweeper on {}: {} pages, {} deleted, {} moved",
            settings.instance_id, report.pages, report.deleted, report.moved
        )
    }

    /// `PUT /api/ttl/{container}/{blob}` (marking: bearer `admin_token` only), `POST
    /// /api/sweeper/tick` and `GET /api/sweeper` (the state: bearer `timer_token` or
    /// `admin_token`).
    async fn api<T: Transport>(
        ctx: &Context<'_, T>,
        request: &Request,
        power: Power,
        started: Instant,
    ) -> Response {
        let path = request.path();
        if path.starts_with(TTL_ROUTE)
            || path.trim_end_matches('/') == TTL_ROUTE.trim_end_matches('/')
        {
            if let Err(r) = auth::require_admin(ctx.variables, power, "marking a blob") {
                return r;
            }
            return mark(ctx, request).await;
        }
        let action = path[SWEEPER_ROUTE.len()..].trim_matches('/');
        let method = request.method().clone();
        match (action, &method) {
            ("", &leasegate::Method::GET) | ("tick", &leasegate::Method::POST) => {}
            ("", _) => return web::method_not_allowed("GET"),
            ("tick", _) => return web::method_not_allowed("POST"),
            _ => return web::error(
                StatusCode::NOT_FOUND,
                "not_found",
                "routes: GET /api/sweeper, POST /api/sweeper/tick, PUT /api/ttl/{container}/{blob}",
            ),
        }
        if !request.body().iter().all(u8::is_ascii_whitespace) {
            return web::error(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                "this route takes no body",
            );
        }
        let settings = match Settings::load(ctx.variables) {
            Ok(s) => s,
            Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
        };
        if method == leasegate::Method::GET {
            let transport = (ctx.connect)(settings.storage.timeout);
            // Counted like the other paths: one instance of the lease code per component.
            let transport = Counting::new(&transport);
            let locks = settings.storage.locks(&transport, "sweeper/");
            return match read_state(&locks, &settings, ctx.now).await {
                Ok((state, _, _)) => web::json(StatusCode::OK, &state),
                Err(e) => web::storage_unavailable(&e),
            };
        }
        let tick = Tick {
            at: ctx.now,
            source: Source::Http,
            past_due: false,
        };
        let (status, answer) = Self::tick(ctx, &settings, &tick, started).await;
        Self::log(&answer);
        web::json(status, &answer)
    }
}

/// The body of a marking request: `expiresAt` or `ttlSeconds` (`null` counts as missing), and
/// `deadBlobContainer` (`Some(None)` for an explicit `null`, `None` when missing); no other
/// field (a stray one is the caller's mistake).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Marking {
    #[serde(default, deserialize_with = "expires_at")]
    expires_at: Option<String>,
    #[serde(default, deserialize_with = "ttl_seconds")]
    ttl_seconds: Option<u64>,
    #[serde(default, deserialize_with = "dead_blob_container")]
    dead_blob_container: Option<Option<String>>,
}

/// The longest part of serde's error text that a refused marking repeats (it quotes what it
/// refuses: a stray key as long as the body).
const MAX_ERROR_CHARS: usize = 200;

impl Marking {
    /// Reads a marking from a request body, which must be a JSON object (serde alone would
    /// also take a struct from an array of its fields). A wrong type is named in fixed words;
    /// any other error is cut to [`MAX_ERROR_CHARS`].
    fn from_body(body: &[u8]) -> Result<Marking, String> {
        let shown = |e: serde_json::Error| {
            let mut e = e.to_string();
            if let Some((cut, _)) = e.char_indices().nth(MAX_ERROR_CHARS) {
                e.truncate(cut);
                e.push_str("...");
            }
            e
        };
        let fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(body).map_err(shown)?;
        serde_json::from_value(serde_json::Value::Object(fields)).map_err(shown)
    }
}

/// A field of type `T` (`null` is `None`); any other type is refused with `message` (serde's
/// own would quote the caller's value, however long, and not name the field).
fn field<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    message: &str,
) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d).map_err(|_| D::Error::custom(message))
}

fn expires_at<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    field(d, "expiresAt must be a string")
}

fn ttl_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    field(d, "ttlSeconds must be a whole number from 0 to 2^64 - 1")
}

/// `deadBlobContainer`: there (`null` included: `Some(None)`); `default` gives `None` when it
/// is missing.
fn dead_blob_container<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<String>>, D::Error> {
    field(d, "deadBlobContainer must be a string").map(Some)
}

/// `PUT /api/ttl/{container}/{blob}`: sets `TimeToLive` (and `DeadBlobContainer`) on an
/// existing blob of a swept container, keeping its other metadata (compare-and-swap).
async fn mark<T: Transport>(ctx: &Context<'_, T>, request: &Request) -> Response {
    if request.method() != leasegate::Method::PUT {
        return web::method_not_allowed("PUT");
    }
    let bad = |code: &str, m: String| web::error(StatusCode::BAD_REQUEST, code, m);
    let raw = request.path()[TTL_ROUTE.len().min(request.path().len())..].to_string();
    let decoded = match percent_encoding::percent_decode_str(&raw).decode_utf8() {
        Ok(d) => d.into_owned(),
        Err(_) => {
            return bad(
                "invalid_path",
                "the path is not UTF-8 once percent-decoded".into(),
            )
        }
    };
    let Some((container, blob)) = decoded.split_once('/') else {
        return bad(
            "invalid_path",
            "the path must name a container and a blob: /api/ttl/{container}/{blob}".into(),
        );
    };
    let container = match ContainerName::try_new(container) {
        Ok(c) => c,
        Err(e) => return bad("invalid_container", e.to_string()),
    };
    let blob = match BlobName::try_new(blob) {
        Ok(b) => b,
        Err(e) => return bad("invalid_blob", e.to_string()),
    };
    if let Err(r) = web::require_json(request) {
        return r;
    }
    let marking = match Marking::from_body(request.body()) {
        Ok(m) => m,
        Err(e) => return bad("invalid_body", format!("the body is not a marking: {e}")),
    };
    let expires_at = match (&marking.expires_at, marking.ttl_seconds) {
        (Some(_), Some(_)) | (None, None) => {
            return bad(
                "invalid_body",
                "give exactly one of expiresAt (RFC 3339) and ttlSeconds".into(),
            )
        }
        (Some(t), None) => match timer::parse_time(t) {
            Some(t) => Some(t),
            None => {
                return bad(
                    "invalid_body",
                    "expiresAt must be an RFC 3339 time (2026-11-21T14:00:00Z)".into(),
                )
            }
        },
        (None, Some(n)) if (1..=MAX_TTL_SECS).contains(&n) => None,
        (None, Some(_)) => {
            return bad(
                "invalid_body",
                format!("ttlSeconds must be 1 to {MAX_TTL_SECS}"),
            )
        }
    };
    let mut dead = None;
    if let Some(Some(d)) = &marking.dead_blob_container {
        // Stored as metadata, whose values are ASCII.
        if !d.chars().all(|c| c.is_ascii_graphic()) {
            return bad(
                "invalid_body",
                "deadBlobContainer must be printable ASCII without spaces (it is stored as metadata)".into(),
            );
        }
        match parse_location(d) {
            Ok(location) => dead = Some(location),
            Err(e) => {
                return bad(
                    "invalid_body",
                    format!(
                        "deadBlobContainer must be container, container/ or container/prefix/: {e}"
                    ),
                )
            }
        }
    }
    let settings = match Settings::load(ctx.variables) {
        Ok(s) => s,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    if let Some((c, prefix)) = &dead {
        if let Some(reason) = settings.dead_refusal(c, prefix) {
            let message = if *c == settings.storage.container {
                "deadBlobContainer cannot be the app's own container (it holds the locks and the sweep state)".to_string()
            } else if reason.contains(DEAD_CONTAINERS_VAR) {
                format!("deadBlobContainer {c} is not allowed: blobs are moved only into the containers named by {DEAD_CONTAINERS_VAR}")
            } else {
                format!("deadBlobContainer {c}/{prefix} is swept (ttl_containers): a moved blob would be moved again")
            };
            return bad("invalid_body", message);
        }
    }
    let swept = settings.targets.iter().any(|(k, c, p)| {
        *k == Kind::Ttl && *c == container && blob.as_str().starts_with(p.as_str())
    });
    if !swept {
        return web::error(
            StatusCode::FORBIDDEN,
            "not_swept",
            "the blob is not in a swept container and prefix (ttl_containers)",
        );
    }
    let transport = (ctx.connect)(settings.storage.timeout);
    // Counted like the other paths: one instance of the lease code per component.
    let transport = Counting::new(&transport);
    let locks = settings.storage.locks(&transport, "sweeper/");
    for _ in 0..4 {
        let head = GetProperties {
            container: container.clone(),
            blob: blob.clone(),
        };
        let (props, date) = match locks.execute(&head, ctx.now).await {
            Ok((Some(p), date)) => (p, date),
            Ok((None, _)) => {
                return web::error(StatusCode::NOT_FOUND, "blob_not_found", "no such blob")
            }
            Err(e) => return web::storage_unavailable(&e),
        };
        let expires = expires_at.unwrap_or_else(|| {
            date.unwrap_or(ctx.now) + Duration::from_secs(marking.ttl_seconds.unwrap_or(0))
        });
        let mut metadata = props.metadata.clone();
        metadata.insert(TIME_TO_LIVE.into(), rfc3339(expires));
        match &marking.dead_blob_container {
            Some(Some(d)) => {
                metadata.insert(DEAD_BLOB_CONTAINER.into(), d.trim().to_string());
            }
            Some(None) => {
                metadata.remove(DEAD_BLOB_CONTAINER);
            }
            None => {}
        }
        let Some(etag) = props.etag else {
            return web::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
                "the blob has no ETag",
            );
        };
        let write = SetMetadata {
            container: container.clone(),
            blob: blob.clone(),
            metadata: metadata.clone(),
            lease_id: None,
            condition: Condition::IfMatch(etag),
        };
        match locks.execute(&write, ctx.now).await {
            Ok((WriteOutcome::Written(_), _)) => {
                log_line(
                    json!({"fn": "ttl-sweeper", "decision": "marked", "container": container.as_str(), "expiresAt": rfc3339(expires)}),
                );
                return web::json(
                    StatusCode::OK,
                    &json!({
                        "container": container.as_str(),
                        "blob": blob.as_str(),
                        "expiresAt": rfc3339(expires),
                        "deadBlobContainer": metadata.get(DEAD_BLOB_CONTAINER),
                    }),
                );
            }
            Ok((WriteOutcome::Refused(Refusal::ConditionFailed), _)) => continue,
            Ok((WriteOutcome::Refused(_), _)) => {
                return web::error(
                    StatusCode::CONFLICT,
                    "leased",
                    "the blob is leased: mark it while it is free",
                )
            }
            // The other metadata goes back exactly as storage gave it; a value that cannot (not
            // a header value) or that storage now refuses is the blob's problem, not storage's.
            Err(leasegate::Error::InvalidArgument(m)) => {
                return web::error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "metadata_unwritable",
                    format!(
                    "the blob's metadata cannot be written back as it is, nothing was changed: {m}"
                ),
                )
            }
            Err(leasegate::Error::Storage(e)) if e.status == StatusCode::BAD_REQUEST => {
                let names: Vec<&str> = metadata.keys().map(|k| k.as_str()).collect();
                return web::error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "metadata_unwritable",
                    format!(
                        "storage refused the blob's metadata as it is ({} {}), nothing was changed; names: {}",
                        e.status,
                        e.code.as_deref().unwrap_or("without a code"),
                        names.join(", ")
                    ),
                );
            }
            Err(e) => return web::storage_unavailable(&e),
        }
    }
    web::error(
        StatusCode::CONFLICT,
        "changed",
        "the blob kept changing while it was marked; try again",
    )
}

// The Spin entry points.
#[cfg(target_arch = "wasm32")]
#[spin_sdk::http_component]
async fn handle_request(
    request: spin_sdk::http::IncomingRequest,
    out: spin_sdk::http::ResponseOutparam,
) {
    use leasegate_spin::{spin, timer};
    spin::serve(
        request,
        out,
        MAX_BODY_BYTES,
        timer::handle_http::<Sweeper, _>,
    )
    .await
}
#[cfg(target_arch = "wasm32")]
leasegate_spin::cron_export!(leasegate_spin::timer::handle_cron::<crate::Sweeper, _>);

#[cfg(test)]
mod tests {
    /// Past the names the state can remember, an unusable name is not reported by name (it
    /// would be reported again on every pass): only counted.
    #[test]
    fn unusable_names_past_the_cap_are_counted_not_reported_every_pass() {
        use super::*;
        let mut state = State::default();
        for k in 0..MAX_UNUSABLE {
            state.unusable.push(Unusable {
                container: "c".into(),
                name: format!("old/{k}/.."),
                pass: 0,
            });
        }
        let mut properties = leasegate::ops::BlobProperties::default();
        properties.metadata.insert(TIME_TO_LIVE.into(), "60".into());
        let listed = Claimed {
            kind: Kind::Ttl,
            container: ContainerName::try_new("logs").unwrap(),
            page: ListBlobsPage {
                blobs: vec![leasegate::ops::BlobItem {
                    name: "a/../b".into(),
                    properties,
                }],
                ..ListBlobsPage::default()
            },
            server_now: SystemTime::UNIX_EPOCH,
        };
        for _pass in 0..2 {
            let mut new = Vec::new();
            let overflow = remember_unusable(&mut state, &listed, &mut new);
            assert!(new.is_empty(), "{new:?}");
            assert_eq!(overflow, 1);
            assert_eq!(state.unusable.len(), MAX_UNUSABLE);
        }
    }

    /// A dead-blob copy written before the listed version is an older version (its metadata
    /// may differ with the same content): never counted as copied; a later one is; one of the
    /// same second is when its content is the listed one.
    #[test]
    fn only_a_copy_from_the_listed_second_on_counts_as_copied() {
        use super::holds_listed_version as holds;
        assert!(!holds(Some(99), Some(100), true), "an older copy, same MD5");
        assert!(!holds(Some(99), Some(100), false));
        assert!(holds(Some(101), Some(100), false));
        assert!(holds(Some(100), Some(100), true));
        assert!(!holds(Some(100), Some(100), false));
        assert!(!holds(None, Some(100), true), "a copy of unknown age");
        assert!(!holds(Some(100), None, true));
    }

    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let mut v: HashMap<String, String> = HashMap::from([
            ("instance_id".to_string(), "node-a".to_string()),
            ("container".to_string(), "leasegate".to_string()),
            (
                "storage_account".to_string(),
                "devstoreaccount1".to_string(),
            ),
            (
                "storage_key".to_string(),
                leasegate::account::DEV_ACCOUNT_KEY.to_string(),
            ),
            (
                "storage_origin".to_string(),
                "http://127.0.0.1:10000".to_string(),
            ),
        ]);
        for (k, val) in vars {
            v.insert(k.to_string(), val.to_string());
        }
        // Lock-blob clean-up is on by default: these tests name it when they want it.
        v.entry("ttl_lock_retention_seconds".to_string())
            .or_insert_with(|| "off".to_string());
        Settings::load(&v)
    }

    #[test]
    fn a_container_dropped_from_the_configuration_keeps_its_progress() {
        let both = settings(&[("ttl_containers", "xxx,yyy/logs/")]).unwrap();
        let only_x = settings(&[("ttl_containers", "xxx")]).unwrap();
        let mut state = State::default();
        reconcile(&mut state, &both);
        assert_eq!(state.containers.len(), 2);
        state.containers[1].status = "current".into();
        state.containers[1].marker = Some("m-7".into());
        // A deployment still on the old configuration: y is off, its progress kept.
        reconcile(&mut state, &only_x);
        let y = &state.containers[1];
        assert!(y.off && y.status == "current" && y.marker.as_deref() == Some("m-7"));
        assert!(!resting(&state, &only_x, SystemTime::UNIX_EPOCH));
        // Configured again: it goes on from its marker.
        reconcile(&mut state, &both);
        let y = &state.containers[1];
        assert!(!y.off && y.status == "current" && y.marker.as_deref() == Some("m-7"));
        assert_eq!(y.prefix, "logs/");
        // A state written when `off` was a status.
        state.containers[1].status = "off".into();
        reconcile(&mut state, &both);
        assert!(!state.containers[1].off && state.containers[1].status == "init");
    }

    #[test]
    fn settings_refuse_what_would_sweep_state() {
        for (vars, want) in [
            (vec![], "nothing to sweep"),
            (vec![("ttl_containers", "leasegate")], "app's own container"),
            (vec![("ttl_containers", "xxx/logs")], "must end with '/'"),
            (vec![("ttl_containers", "Bad_Name")], "ttl_containers"),
            (
                vec![("ttl_lock_retention_seconds", "1")],
                "ttl_lock_retention_seconds",
            ),
            (
                vec![
                    ("ttl_lock_retention_seconds", "60"),
                    ("ttl_lock_prefixes", "leader/"),
                ],
                "leader",
            ),
            (
                vec![
                    ("ttl_lock_retention_seconds", "60"),
                    ("ttl_lock_prefixes", "jobs/x/"),
                ],
                "job logs",
            ),
        ] {
            let e = settings(&vars).unwrap_err().to_string();
            assert!(e.contains(want), "{vars:?}: {e}");
        }
        let s = settings(&[("ttl_lock_retention_seconds", "60")]).unwrap();
        let prefixes: Vec<&str> = s.targets.iter().map(|t| t.2.as_str()).collect();
        assert_eq!(prefixes, ["alerts/", "gates/"]);
        // Not set at all: on, a day.
        let mut v: HashMap<String, String> = HashMap::new();
        for (k, val) in [
            ("instance_id", "node-a"),
            ("storage_account", "devstoreaccount1"),
            ("storage_key", leasegate::account::DEV_ACCOUNT_KEY),
            ("storage_origin", "http://127.0.0.1:10000"),
        ] {
            v.insert(k.into(), val.into());
        }
        let s = Settings::load(&v).unwrap();
        assert_eq!(s.lock_retention, Some(Duration::from_secs(86_400)));
        assert_eq!(s.targets.len(), 2);
        // A tick's work ends within its bound: twice the budget (or 5 s more), a copy's wait
        // and a few storage timeouts.
        let s = settings(&[("ttl_containers", "xxx"), ("ttl_time_budget_ms", "1000")]).unwrap();
        assert_eq!(s.work_deadline(), Duration::from_secs(6));
    }

    /// Correctness #9: one blob begun at the work deadline can make `BLOB_REQUESTS` storage
    /// requests (copy, create, copy; HEAD; copy, create, copy; last poll or HEAD; delete), each
    /// up to the storage timeout, plus a pending copy's wait: the tick bound covers it for
    /// every allowed `storage_timeout_ms`, so no pass ends while a straggler still moves a blob.
    #[test]
    fn the_tick_bound_covers_a_blobs_worst_case() {
        for ms in ["100", "5000", "10000", "12000", "30000", "60000"] {
            let s = settings(&[
                ("ttl_containers", "xxx"),
                ("ttl_time_budget_ms", "100"),
                ("storage_timeout_ms", ms),
            ])
            .unwrap();
            let t = s.storage.timeout;
            let worst = 9 * t + COPY_WAIT + COPY_POLL;
            assert!(
                s.tick_bound() >= s.work_deadline() + worst,
                "storage_timeout_ms {ms}: bound {:?} < {:?}",
                s.tick_bound(),
                s.work_deadline() + worst
            );
        }
    }

    #[test]
    fn dead_containers_are_allowed_by_name_or_star() {
        let none = settings(&[("ttl_containers", "xxx/logs/")]).unwrap();
        let dead = ContainerName::try_new("dead").unwrap();
        let own = ContainerName::try_new("leasegate").unwrap();
        let swept = ContainerName::try_new("xxx").unwrap();
        assert!(none
            .dead_refusal(&dead, "")
            .unwrap()
            .contains("ttl_dead_containers"));
        let listed = settings(&[
            ("ttl_containers", "xxx/logs/"),
            ("ttl_dead_containers", "dead, other"),
        ])
        .unwrap();
        assert_eq!(listed.dead_refusal(&dead, "a/"), None);
        assert!(listed.dead_refusal(&swept, "dead/").is_some());
        let star = settings(&[
            ("ttl_containers", "xxx/logs/"),
            ("ttl_dead_containers", "*"),
        ])
        .unwrap();
        assert_eq!(star.dead_refusal(&dead, ""), None);
        assert_eq!(
            star.dead_refusal(&swept, "dead/"),
            None,
            "another prefix of a swept container"
        );
        assert!(star.dead_refusal(&swept, "logs/old/").is_some());
        assert!(star.dead_refusal(&swept, "").is_some());
        assert!(star.dead_refusal(&own, "").is_some());
        for bad in ["leasegate", "Bad_Name"] {
            let e =
                settings(&[("ttl_containers", "xxx"), ("ttl_dead_containers", bad)]).unwrap_err();
            assert!(e.to_string().contains("ttl_dead_containers"), "{e}");
        }
    }

    #[test]
    fn counters_settle_what_a_lost_answer_wrote() {
        let c = |p, m| Counters {
            purged: p,
            moved: m,
            locks_removed: 0,
        };
        // Credited 3, pending 2; the state shows 5 credited: the lost write landed.
        let landed = c(5, 1).minus(c(3, 1));
        assert_eq!(c(2, 0).minus(landed), Counters::default());
        assert_eq!(c(u64::MAX, 0).plus(c(1, 0)).purged, u64::MAX);
        assert!(Counters::default().is_zero());
    }

    #[test]
    fn locations() {
        assert_eq!(parse_location("dead").unwrap().1, "");
        assert_eq!(parse_location(" dead/ ").unwrap().1, "");
        assert_eq!(parse_location("dead/a/b/").unwrap().1, "a/b/");
        for bad in ["", "Dead", "dead/a", "d", "dead//"] {
            assert!(parse_location(bad).is_err(), "{bad}");
        }
    }

    /// A sweep state as the hand-written JSON writer wrote it (pretty, camelCase, options and
    /// `off: false` left out), with a field from a newer writer and an entry of a tick without
    /// counters: it reads, and written back it is the same text but the unknown field.
    #[test]
    fn an_old_state_reads_and_writes_back_the_same() {
        let old = r#"{
  "containers": [
    {
      "container": "logs",
      "prefix": "",
      "kind": "ttl",
      "status": "current",
      "marker": "m-7"
    },
    {
      "container": "leasegate",
      "prefix": "gates/",
      "kind": "locks",
      "status": "init",
      "off": true
    }
  ],
  "passes": 3,
  "lastPassCompletedAt": "2026-11-21T14:00:00Z",
  "purged": 12,
  "moved": 2,
  "locksRemoved": 5,
  "pages": 40,
  "ticks": [
    {
      "id": "t-1",
      "instance": "node-a",
      "since": "2026-11-21T14:00:01Z",
      "active": true,
      "purged": 4,
      "moved": 1,
      "locksRemoved": 0
    }
  ],
  "unusable": [
    {
      "container": "logs",
      "name": "a/../b",
      "pass": 3
    }
  ]
}"#;
        let state: State = serde_json::from_str(old).unwrap();
        assert_eq!(state.containers.len(), 2);
        assert_eq!(state.containers[0].marker.as_deref(), Some("m-7"));
        assert!(state.containers[1].off && state.containers[1].kind == Kind::Locks);
        assert_eq!(
            (state.passes, state.purged, state.locks_removed),
            (3, 12, 5)
        );
        assert_eq!(
            state.ticks[0].credited,
            Counters {
                purged: 4,
                moved: 1,
                locks_removed: 0
            }
        );
        assert_eq!(state.unusable[0].name, "a/../b");
        assert_eq!(serde_json::to_string_pretty(&state).unwrap(), old);

        // A newer writer's field is ignored; missing counters and lists read as 0 and empty.
        let sparse = r#"{"containers": [{"container": "logs", "kind": "ttl", "status": "init",
            "since": "a newer field"}], "ticks": [{"id": "t", "instance": "i",
            "since": "2026-11-21T14:00:01Z", "active": false}], "shards": 4}"#;
        let state: State = serde_json::from_str(sparse).unwrap();
        assert_eq!(state.containers[0].prefix, "");
        assert_eq!(state.ticks[0].credited, Counters::default());
        assert_eq!((state.passes, state.unusable.len()), (0, 0));
        let written = serde_json::to_string(&state).unwrap();
        assert!(!written.contains("lastPassCompletedAt") && !written.contains("unusable"));

        // Not a state: refused, never a panic.
        for bad in [r#"{}"#, r#"{"containers": [{"kind": "ttl"}]}"#, "[]", "{"] {
            assert!(serde_json::from_str::<State>(bad).is_err(), "{bad}");
        }
    }

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
        let failed = leasegate::Error::CorruptLock("x".into());
        let (status, answer) = describe(&s, Source::Cron, report, Some(&failed), 7, Instant::now());
        assert!(!status.is_success());
        let v = serde_json::to_value(&answer).unwrap();
        assert_eq!(v["error"], "state_unusable");
        assert!(v["message"].is_string());
    }

    /// Marking bodies: the fields callers send, `null` for `deadBlobContainer` apart from a
    /// missing one; a stray field, a wrong type or a fraction is an error naming the problem.
    #[test]
    fn marking_bodies() {
        let m = Marking::from_body(br#"{"ttlSeconds": 60}"#).unwrap();
        assert_eq!((m.ttl_seconds, m.dead_blob_container), (Some(60), None));
        let m = Marking::from_body(
            br#"{"expiresAt": "2030-01-01T00:00:00Z", "deadBlobContainer": null}"#,
        )
        .unwrap();
        assert_eq!(m.expires_at.as_deref(), Some("2030-01-01T00:00:00Z"));
        assert_eq!(m.dead_blob_container, Some(None));
        let m =
            Marking::from_body(br#"{"ttlSeconds": null, "deadBlobContainer": "dead/a/"}"#).unwrap();
        assert_eq!(m.ttl_seconds, None);
        assert_eq!(m.dead_blob_container, Some(Some("dead/a/".into())));
        for (bad, names) in [
            (r#"{"ttlSeconds": 5, "colour": 1}"#, "colour"),
            (
                r#"{"ttlSeconds": 1e12}"#,
                "ttlSeconds must be a whole number",
            ),
            (r#"{"ttlSeconds": -5}"#, "ttlSeconds must be a whole number"),
            (
                r#"{"ttlSeconds": "5"}"#,
                "ttlSeconds must be a whole number",
            ),
            (
                r#"{"deadBlobContainer": 3}"#,
                "deadBlobContainer must be a string",
            ),
            ("[]", "expected a map"),
            ("[null, 60]", "expected a map"),
            ("{", "EOF"),
            ("{} {}", "trailing characters"),
        ] {
            let e = Marking::from_body(bad.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(names), "{bad}: {e}");
        }
    }

    /// A refused marking names the field in fixed words, and never repeats a long value or
    /// key whole.
    #[test]
    fn marking_errors_name_the_field_and_stay_short() {
        let long = format!(r#"{{"ttlSeconds": "{}"}}"#, "A".repeat(60_000));
        let e = Marking::from_body(long.as_bytes()).unwrap_err().to_string();
        assert!(e.len() < 300, "{} bytes", e.len());
        assert!(e.contains("ttlSeconds must be a whole number"), "{e}");
        for bad in ["-1", "1.5", r#""x""#, "true", "[]"] {
            let body = format!(r#"{{"ttlSeconds": {bad}}}"#);
            let e = Marking::from_body(body.as_bytes()).unwrap_err().to_string();
            assert!(
                e.contains("ttlSeconds must be a whole number"),
                "{bad}: {e}"
            );
        }
        for bad in ["5", "{}", "false"] {
            let body = format!(r#"{{"deadBlobContainer": {bad}}}"#);
            let e = Marking::from_body(body.as_bytes()).unwrap_err().to_string();
            assert!(
                e.contains("deadBlobContainer must be a string"),
                "{bad}: {e}"
            );
        }
        let e = Marking::from_body(br#"{"expiresAt": 5}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("expiresAt must be a string"), "{e}");
        // A long stray key, or long text after the object, is cut.
        let key = format!(r#"{{"{}": 1}}"#, "k".repeat(60_000));
        let e = Marking::from_body(key.as_bytes()).unwrap_err().to_string();
        assert!(
            e.len() < 300 && e.contains("unknown field"),
            "{} bytes",
            e.len()
        );
        let trailing = format!(r#"{{}} "{}""#, "é".repeat(60_000));
        let e = Marking::from_body(trailing.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.len() < 300, "{} bytes", e.len());
    }
}
