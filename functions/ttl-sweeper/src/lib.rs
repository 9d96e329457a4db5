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
use leasegate_spin::json::Value;

use leasegate_spin::config::{self, ConfigError, Storage, Variables};
use leasegate_spin::json;
use leasegate_spin::json::{Fields, ToJson};
use leasegate_spin::storage::execute_creating_container;
use leasegate_spin::timer::{self, Source};
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

/// What a sweep entry sweeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Blobs marked with a time-to-live.
    Ttl,
    /// The app's own lock blobs, free for longer than the retention.
    Locks,
}

/// One swept container (and prefix) in the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The container.
    pub container: String,
    /// The prefix swept (empty: all).
    pub prefix: String,
    /// What it sweeps.
    pub kind: Kind,
    /// `init` (the pass has not reached it), `current` (pages left) or `last` (its last page
    /// was claimed this pass).
    pub status: String,
    /// Where the next page starts.
    pub marker: Option<String>,
    /// No longer configured: skipped, its progress kept.
    pub off: bool,
}

/// The sweep state blob.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// The swept containers, in order.
    pub containers: Vec<Entry>,
    /// Passes completed.
    pub passes: u64,
    /// When the last pass completed (server clock).
    pub last_pass_completed_at: Option<String>,
    /// Blobs deleted (moved ones included) since the state began.
    pub purged: u64,
    /// Of those, moved to a dead-blob container.
    pub moved: u64,
    /// Lock blobs removed.
    pub locks_removed: u64,
    /// Pages claimed.
    pub pages: u64,
    /// The ticks of the last minutes (see [`TickEntry`]).
    pub ticks: Vec<TickEntry>,
    /// Marked blobs whose names cannot be swept, as (container, name, the pass that last
    /// listed them): reported once, forgotten when a pass no longer lists them.
    pub unusable: Vec<(String, String, u64)>,
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

/// What one tick did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
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
    pub skipped: Vec<(String, u64)>,
    /// Requests that failed (the blob is left as it was; a later pass retries it).
    pub errors: u64,
    /// Whether this tick completed a pass.
    pub pass_completed: bool,
    /// Why the tick stopped: `budget`, `pass complete`, `state busy`.
    pub stopped: String,
    /// Swept containers whose listing failed for good this pass (a 403, a 400): skipped until
    /// the next pass, the others swept.
    pub containers_skipped: Vec<SkippedContainer>,
    /// Marked blobs whose names cannot be swept (a `.` or `..` segment), each reported once
    /// (the state remembers them): (container, name).
    pub unusable_names: Vec<(String, String)>,
    /// Unusable names found past the [`MAX_UNUSABLE`] the state remembers: counted on every
    /// pass that lists them, not named.
    pub unusable_not_remembered: u64,
}

/// A swept container skipped for this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedContainer {
    /// The container.
    pub container: String,
    /// The prefix swept.
    pub prefix: String,
    /// Storage's status, when storage answered.
    pub status: Option<u16>,
    /// Storage's error code, when it sent one.
    pub code: Option<String>,
    /// What failed.
    pub message: String,
}

impl Report {
    fn skip(&mut self, reason: &str) {
        self.skip_n(reason, 1);
    }

    /// Counts `n` blobs left alone for `reason` (a handful of reasons: a list, not a map).
    fn skip_n(&mut self, reason: &str, n: u64) {
        match self.skipped.iter_mut().find(|(r, _)| r == reason) {
            Some((_, count)) => *count += n,
            None => self.skipped.push((reason.to_string(), n)),
        }
    }
}

/// A claimed page.
struct Claimed {
    kind: Kind,
    container: ContainerName,
    page: ListBlobsPage,
    server_now: SystemTime,
}

/// Counters kept in the state.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TickEntry {
    /// The tick's random id.
    pub id: String,
    /// Its instance.
    pub instance: String,
    /// When it last wrote the state (server clock).
    pub since: String,
    /// Whether it may still be processing a page.
    pub active: bool,
    /// What it has added to the counters.
    pub credited: Counters,
}

// The state blob's JSON: camelCase keys, absent options and `off: false` left out; readers
// take missing counters as 0.

impl ToJson for Kind {
    fn to_json(&self) -> Value {
        json!(match self {
            Kind::Ttl => "ttl",
            Kind::Locks => "locks",
        })
    }
}

impl ToJson for Entry {
    fn to_json(&self) -> Value {
        let mut v = json!({
            "container": self.container,
            "prefix": self.prefix,
            "kind": self.kind,
            "status": self.status,
        });
        if let Some(m) = &self.marker {
            v.set("marker", json!(m));
        }
        if self.off {
            v.set("off", json!(true));
        }
        v
    }
}

impl Entry {
    fn from_json(value: &Value) -> Result<Entry, String> {
        let f = Fields::of(value)?;
        Ok(Entry {
            container: f.string("container")?,
            prefix: f.opt_string("prefix")?.unwrap_or_default(),
            kind: match f.string("kind")?.as_str() {
                "ttl" => Kind::Ttl,
                "locks" => Kind::Locks,
                _ => return Err("kind must be ttl or locks".into()),
            },
            status: f.string("status")?,
            marker: f.opt_string("marker")?,
            off: f.bool_or_false("off")?,
        })
    }
}

impl ToJson for State {
    fn to_json(&self) -> Value {
        let mut v = json!({ "containers": self.containers, "passes": self.passes });
        if let Some(t) = &self.last_pass_completed_at {
            v.set("lastPassCompletedAt", json!(t));
        }
        v.set("purged", json!(self.purged));
        v.set("moved", json!(self.moved));
        v.set("locksRemoved", json!(self.locks_removed));
        v.set("pages", json!(self.pages));
        v.set("ticks", json!(self.ticks));
        if !self.unusable.is_empty() {
            let list: Vec<Value> = self
                .unusable
                .iter()
                .map(|(c, n, p)| json!({"container": c, "name": n, "pass": p}))
                .collect();
            v.set("unusable", json!(list));
        }
        v
    }
}

impl State {
    fn from_json(value: &Value) -> Result<State, String> {
        let f = Fields::of(value)?;
        if !f.has("containers") {
            return Err("containers is missing".into());
        }
        Ok(State {
            containers: f.list("containers", Entry::from_json)?,
            passes: f.u64_or_zero("passes")?,
            last_pass_completed_at: f.opt_string("lastPassCompletedAt")?,
            purged: f.u64_or_zero("purged")?,
            moved: f.u64_or_zero("moved")?,
            locks_removed: f.u64_or_zero("locksRemoved")?,
            pages: f.u64_or_zero("pages")?,
            ticks: f.list("ticks", TickEntry::from_json)?,
            unusable: if f.has("unusable") {
                f.list("unusable", |u| {
                    let u = Fields::of(u)?;
                    Ok((
                        u.string("container")?,
                        u.string("name")?,
                        u.u64_or_zero("pass")?,
                    ))
                })?
            } else {
                Vec::new()
            },
        })
    }
}

impl ToJson for Report {
    fn to_json(&self) -> Value {
        let mut skipped = json!({});
        for (reason, n) in &self.skipped {
            skipped.set(reason, json!(n));
        }
        let mut v = json!({
            "pages": self.pages,
            "scanned": self.scanned,
            "unmarked": self.unmarked,
            "notExpired": self.not_expired,
            "deleted": self.deleted,
            "moved": self.moved,
            "locksRemoved": self.locks_removed,
            "skipped": skipped,
            "errors": self.errors,
            "passCompleted": self.pass_completed,
            "stopped": self.stopped,
        });
        if !self.containers_skipped.is_empty() {
            let list: Vec<Value> = self
                .containers_skipped
                .iter()
                .map(|c| {
                    json!({
                        "container": c.container,
                        "prefix": c.prefix,
                        "storageStatus": c.status,
                        "storageErrorCode": c.code,
                        "message": c.message,
                    })
                })
                .collect();
            v.set("containersSkipped", json!(list));
        }
        if !self.unusable_names.is_empty() {
            let list: Vec<Value> = self
                .unusable_names
                .iter()
                .map(|(c, n)| json!({"container": c, "name": n}))
                .collect();
            v.set("unusableNames", json!(list));
        }
        if self.unusable_not_remembered > 0 {
            v.set(
                "unusableNamesNotRemembered",
                json!(self.unusable_not_remembered),
            );
        }
        v
    }
}

impl ToJson for TickEntry {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "instance": self.instance,
            "since": self.since,
            "active": self.active,
            "purged": self.credited.purged,
            "moved": self.credited.moved,
            "locksRemoved": self.credited.locks_removed,
        })
    }
}

impl TickEntry {
    fn from_json(value: &Value) -> Result<TickEntry, String> {
        let f = Fields::of(value)?;
        Ok(TickEntry {
            id: f.string("id")?,
            instance: f.string("instance")?,
            since: f.string("since")?,
            active: match f.bool_or_false("active")? {
                _ if !f.has("active") => return Err("active is missing".into()),
                a => a,
            },
            credited: Counters {
                purged: f.u64_or_zero("purged")?,
                moved: f.u64_or_zero("moved")?,
                locks_removed: f.u64_or_zero("locksRemoved")?,
            },
        })
    }
}

/// One tick's bookkeeping.
struct Tick {
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
    unusable_names: Vec<(String, String)>,
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
    let mut tick = Tick {
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
    report.unusable_not_remembered = tick.unusable_overflow;
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
            let state = json::from_slice(&b.body).map_err(|e| e.to_string());
            let state = state.and_then(|v| State::from_json(&v)).map_err(|_| {
                leasegate::Error::CorruptLock(format!(
                    "the sweep state {STATE_BLOB} is not valid JSON (delete it to start over)"
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
    let body = json::to_pretty(&state.to_json()).into_bytes();
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
    tick: &mut Tick,
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
    tick: &mut Tick,
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
                    let (status, code) = match &e {
                        leasegate::Error::Storage(s) => (Some(s.status.as_u16()), s.code.clone()),
                        _ => (None, None),
                    };
                    skipped.push(SkippedContainer {
                        container: entry.container.clone(),
                        prefix: entry.prefix.clone(),
                        status,
                        code,
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
            state.unusable.retain(|u| u.2 == this_pass);
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
            s.status.is_client_error() && !matches!(s.status.as_u16(), 408 | 429)
        }
        leasegate::Error::InvalidName { .. } | leasegate::Error::InvalidArgument(_) => true,
        _ => false,
    }
}

/// Records the page's marked blobs whose names cannot be swept (a `.` or `..` segment, a
/// control character) in the state, and puts those it did not know into `new`: each is
/// reported once, not on every pass. Past [`MAX_UNUSABLE`] a name cannot be remembered, so it
/// is not named (it would be on every pass): the answer is how many such names the page had.
fn remember_unusable(state: &mut State, listed: &Claimed, new: &mut Vec<(String, String)>) -> u64 {
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
            .find(|u| u.0 == container && u.1 == item.name)
        {
            Some(known) => known.2 = pass,
            None => {
                if state.unusable.len() < MAX_UNUSABLE {
                    state
                        .unusable
                        .push((container.to_string(), item.name.clone(), pass));
                    new.push((container.to_string(), item.name.clone()));
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

/// The answer of a tick: its report, and the failure that ended it if one did.
fn describe(
    settings: &Settings,
    source: Source,
    report: &Report,
    failure: Option<&leasegate::Error>,
    round_trips: u32,
    started: Instant,
) -> (StatusCode, Value) {
    let mut v = json!(report);
    v.set("instance", json!(settings.instance_id));
    v.set("trigger", json!(source.as_str()));
    v.set("storageRoundTrips", json!(round_trips));
    v.set("durationMs", json!(elapsed_ms(started)));
    match failure {
        None => (StatusCode::OK, v),
        Some(e) => {
            v.set(
                "error",
                json!(if matches!(
                    e,
                    leasegate::Error::CorruptLock(_) | leasegate::Error::UnusableLock { .. }
                ) {
                    "state_unusable"
                } else {
                    web::storage_error_code(e)
                }),
            );
            v.set(
                "message",
                json!(web::storage_failed(e, "the sweep state could not be used")),
            );
            (web::storage_status(e), v)
        }
    }
}

fn log_tick(v: &Value) {
    let mut line = v.clone();
    line.set("fn", json!("ttl-sweeper"));
    log_line(line);
}

/// Handles `handle-cron-event`: one tick; `Err` when the sweep state could not be used.
pub async fn handle_cron<T: Transport>(
    ctx: &Context<'_, T>,
    _timestamp: u64,
) -> Result<(), String> {
    let started = Instant::now();
    let settings = Settings::load(ctx.variables).map_err(|e| {
        log_line(
            json!({"fn": "ttl-sweeper", "error": "not_configured", "message": format!("{e}")}),
        );
        e.to_string()
    })?;
    let (report, failure, trips) = sweep(ctx, &settings, started).await;
    let (status, v) = describe(
        &settings,
        Source::Cron,
        &report,
        failure.as_ref(),
        trips,
        started,
    );
    log_tick(&v);
    if status.is_success() {
        Ok(())
    } else {
        Err(v["message"]
            .as_str()
            .unwrap_or("the sweep failed")
            .to_string())
    }
}

/// The largest request body the routes read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Route prefix of the marking API.
pub const TTL_ROUTE: &str = "/api/ttl/";
/// Route of the sweeper's HTTP forms.
pub const SWEEPER_ROUTE: &str = "/api/sweeper";

/// Handles the component's HTTP requests: `PUT /api/ttl/{container}/{blob}` (marking: bearer
/// `admin_token` only), `POST /api/sweeper/tick` and `GET /api/sweeper` (the state: bearer
/// `timer_token` or `admin_token`); and
/// `POST /{FunctionName}` (any other path: an Azure Functions timer invocation).
pub async fn handle_http<T: Transport>(ctx: &Context<'_, T>, request: Request) -> Response {
    let started = Instant::now();
    let path = request.path();
    let api = path.starts_with(TTL_ROUTE)
        || path.trim_end_matches('/') == TTL_ROUTE.trim_end_matches('/')
        || path.trim_end_matches('/') == SWEEPER_ROUTE
        || path.starts_with(&format!("{SWEEPER_ROUTE}/"));
    if api {
        let power = match auth::authenticate_timer(ctx.variables, &request) {
            Ok(p) => p,
            Err(r) => return r,
        };
        if path.starts_with(TTL_ROUTE)
            || path.trim_end_matches('/') == TTL_ROUTE.trim_end_matches('/')
        {
            if let Err(r) = auth::require_admin(ctx.variables, power, "marking a blob") {
                return r;
            }
            return mark(ctx, &request).await;
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
                Ok((state, _, _)) => web::json(StatusCode::OK, &json!(state)),
                Err(e) => web::storage_unavailable(&e),
            };
        }
        let (report, failure, trips) = sweep(ctx, &settings, started).await;
        let (status, v) = describe(
            &settings,
            Source::Http,
            &report,
            failure.as_ref(),
            trips,
            started,
        );
        log_tick(&v);
        return web::json(status, &v);
    }
    if !timer::azure_channel(ctx.variables) {
        return timer::no_route();
    }
    if request.method() != leasegate::Method::POST {
        return web::method_not_allowed("POST");
    }
    let settings = match Settings::load(ctx.variables) {
        Ok(s) => s,
        Err(e) => {
            return timer::azure_answer(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "not_configured", "message": format!("{e}")}),
                vec![format!("ttl-sweeper: {e}")],
            )
        }
    };
    if let Err(m) = timer::parse_azure_timer(request.body(), ctx.now) {
        return timer::azure_answer(
            StatusCode::BAD_REQUEST,
            json!({"error": "invalid_invocation", "message": m}),
            vec![format!("ttl-sweeper: {m}")],
        );
    }
    let (report, failure, trips) = sweep(ctx, &settings, started).await;
    let (status, v) = describe(
        &settings,
        Source::Azure,
        &report,
        failure.as_ref(),
        trips,
        started,
    );
    log_tick(&v);
    let summary = format!(
        "ttl-sweeper on {}: {} pages, {} deleted, {} moved",
        settings.instance_id, v["pages"], v["deleted"], v["moved"]
    );
    timer::azure_answer(status, v, vec![summary])
}

/// The body of a marking request: `expiresAt` or `ttlSeconds`, and `deadBlobContainer`
/// (`Some(None)` for an explicit `null`, `None` when missing); no other field.
#[derive(Debug)]
struct Marking {
    expires_at: Option<String>,
    ttl_seconds: Option<u64>,
    dead_blob_container: Option<Option<String>>,
}

impl Marking {
    fn from_json(value: &Value) -> Result<Marking, String> {
        let f = Fields::of(value)?;
        f.only(&["expiresAt", "ttlSeconds", "deadBlobContainer"])?;
        let dead = "deadBlobContainer";
        Ok(Marking {
            expires_at: f.opt_string("expiresAt")?,
            ttl_seconds: f.opt_u64("ttlSeconds")?,
            dead_blob_container: if f.has(dead) {
                Some(f.opt_string(dead)?)
            } else {
                None
            },
        })
    }
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
    let marking = json::from_slice(request.body()).map_err(|e| e.to_string());
    let marking = match marking.and_then(|v| Marking::from_json(&v)) {
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
                let names: Vec<&str> = metadata.iter().map(|(k, _)| k.as_str()).collect();
                return web::error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "metadata_unwritable",
                    format!(
                        "storage refused the blob's metadata as it is (400 {}), nothing was changed; names: {}",
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
leasegate_spin::http_export!(handle_http, MAX_BODY_BYTES);
#[cfg(target_arch = "wasm32")]
leasegate_spin::cron_export!(crate::handle_cron);

#[cfg(test)]
mod tests {
    /// Past the names the state can remember, an unusable name is not reported by name (it
    /// would be reported again on every pass): only counted.
    #[test]
    fn unusable_names_past_the_cap_are_counted_not_reported_every_pass() {
        use super::*;
        let mut state = State::default();
        for k in 0..MAX_UNUSABLE {
            state.unusable.push(("c".into(), format!("old/{k}/.."), 0));
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
}
