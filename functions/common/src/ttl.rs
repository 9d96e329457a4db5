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
//! `ttl_lock_prefixes`) are swept too when `ttl_lock_retention_seconds` is set: a lock blob
//! free for longer than that (not leased, no live claim, no marks, not written since) is
//! deleted with `If-Match`; tokens stay increasing (a re-created lock blob starts above).

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use http::{Request, Response, StatusCode};
use leasegate::lease::{Acquire, Locks, Term};
use leasegate::ops::{
    public_blob_url, BlobItem, Condition, CopyBlob, CopyOutcome, CopyStatus, CreateContainer,
    DeleteBlob, DeleteOutcome, GetBlob, GetProperties, ListBlobs, ListBlobsPage, Metadata, PutBlob,
    Refusal, SetMetadata, WriteOutcome,
};
use leasegate::{BlobName, ContainerName, Counting, LeaseState, LockName, Transport};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::{self, ConfigError, Storage, Variables};
use crate::jobs::execute_creating_container;
use crate::timer::{self, Source};
use crate::web::{self, rfc3339};
use crate::{auth, elapsed_ms, log_line, Context};

/// Metadata name of the time-to-live (as storage keeps it: lowercase).
pub const TIME_TO_LIVE: &str = "timetolive";
/// Metadata name of the dead-blob container.
pub const DEAD_BLOB_CONTAINER: &str = "deadblobcontainer";
/// Metadata name a moved blob gets: where it came from.
pub const SOURCE_URI: &str = "sourceuri";
/// The sweep state blob.
pub const STATE_BLOB: &str = "sweeper/state.json";
/// The longest time-to-live the marking API accepts (10 years).
pub const MAX_TTL_SECS: u64 = 10 * 365 * 24 * 3600;
/// How long a worker waits for a busy state lease before ending its tick.
const CLAIM_PATIENCE: Duration = Duration::from_secs(5);
/// The pause between two tries of a busy state lease.
const CLAIM_PAUSE: Duration = Duration::from_millis(40);
/// How many times a pending copy is polled before the source is left alone.
const COPY_POLLS: usize = 20;

/// What a sweep entry sweeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Blobs marked with a time-to-live.
    Ttl,
    /// The app's own lock blobs, free for longer than the retention.
    Locks,
}

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
    /// `init` (the pass has not reached it), `current` (pages left), `last` (its last page was
    /// claimed this pass) or `off` (no longer configured).
    pub status: String,
    /// Where the next page starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marker: Option<String>,
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
        let page_size = config::number(vars, "ttl_page_size", 100.0, 1.0..=5000.0)? as u32;
        let budget_ms = config::number(vars, "ttl_time_budget_ms", 10_000.0, 100.0..=600_000.0)?;
        let lock_retention = match config::var(vars, "ttl_lock_retention_seconds") {
            None => None,
            Some(_) => {
                // At least 2 s: a lock blob removed then is re-created in a later second than its
                // last token, so its tokens go on increasing.
                let secs =
                    config::number(vars, "ttl_lock_retention_seconds", 0.0, 2.0..=31_536_000.0)?;
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
                if ["init/", "sweeper/", "jobs/"]
                    .iter()
                    .any(|k| p.starts_with(k))
                {
                    return Err(ConfigError(format!(
                        "variable ttl_lock_prefixes: '{p}' holds state that is not a lock (init marks, the sweep state, job logs)"
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
            config::number(vars, "ttl_pass_interval_seconds", 60.0, 0.0..=31_536_000.0)?;
        Ok(Settings {
            storage,
            instance_id,
            targets,
            page_size,
            budget: Duration::from_millis(budget_ms as u64),
            lock_retention,
            pass_interval: Duration::from_secs(pass_interval as u64),
        })
    }

    fn state_blob(&self) -> BlobName {
        BlobName::try_new(STATE_BLOB).expect("a valid blob name")
    }
}

/// What one tick did.
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
}

impl Report {
    fn has_counters(&self) -> bool {
        self.deleted + self.moved + self.locks_removed > 0
    }

    fn skip(&mut self, reason: &str) {
        *self.skipped.entry(reason.to_string()).or_default() += 1;
    }
}

/// A claimed page.
struct Claimed {
    kind: Kind,
    container: ContainerName,
    page: ListBlobsPage,
    server_now: SystemTime,
}

/// One tick: claim and process pages until the budget is spent or the pass completes.
pub async fn sweep<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    started: Instant,
) -> (Result<Report, leasegate::Error>, u32) {
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let locks = settings.storage.locks(&counting, "sweeper/");
    let result = async {
        let mut report = Report::default();
        // Counters of processed pages not yet in the state: they go in with the next claim,
        // and whatever is left at the end with a last write under the same lock.
        let mut carried = Report::default();
        let mut failure = None;
        loop {
            if started.elapsed() >= settings.budget {
                report.stopped = "budget".into();
                break;
            }
            let claimed = match claim(ctx, &locks, settings, &carried, Some(started)).await {
                Ok(Claim::Page(p)) => {
                    carried = Report::default();
                    p
                }
                Ok(Claim::PassComplete) => {
                    carried = Report::default();
                    report.pass_completed = true;
                    report.stopped = "pass complete".into();
                    break;
                }
                // (`Counted` answers only a counters-only claim.)
                Ok(Claim::Busy | Claim::Counted) => {
                    report.stopped = "state busy".into();
                    break;
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let page_report = process(ctx, &locks, settings, &claimed).await;
            carried = merge(carried, &page_report);
            report = merge(report, &page_report);
            report.pages += 1;
        }
        if carried.has_counters() {
            match claim(ctx, &locks, settings, &carried, None).await {
                Ok(Claim::Counted) => {}
                Ok(_) => report
                    .stopped
                    .push_str("; counters not recorded (state busy)"),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok::<_, leasegate::Error>(report),
        }
    }
    .await;
    (result, counting.sent())
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
        *into.skipped.entry(k.clone()).or_default() += v;
    }
    into
}

enum Claim {
    Page(Claimed),
    PassComplete,
    Busy,
    /// A counters-only claim wrote its counters.
    Counted,
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
                blob: settings.state_blob(),
            },
            now,
        )
        .await?;
    let date = date.unwrap_or(now);
    match blob {
        None => Ok((State::default(), None, date)),
        Some(b) => {
            let state: State = serde_json::from_slice(&b.body).map_err(|_| {
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
    let body = serde_json::to_vec_pretty(state).unwrap_or_default();
    let put = PutBlob::block(
        settings.storage.container.clone(),
        settings.state_blob(),
        body,
    )
    .with_content_type("application/json")
    .with_condition(etag.map_or(Condition::IfNotExists, Condition::IfMatch));
    Ok(matches!(
        execute_creating_container(locks, &put, now).await?.0,
        WriteOutcome::Written(_)
    ))
}

/// The configured targets, with the state's progress where it has some: new ones are added
/// (`init`), ones no longer configured are `off`.
fn reconcile(state: &mut State, settings: &Settings) {
    let mut next = Vec::new();
    for (kind, container, prefix) in &settings.targets {
        let found = state
            .containers
            .iter()
            .find(|e| e.kind == *kind && e.container == container.as_str() && e.prefix == *prefix);
        next.push(match found {
            Some(e) if e.status != "off" => e.clone(),
            _ => Entry {
                container: container.to_string(),
                prefix: prefix.clone(),
                kind: *kind,
                status: "init".into(),
                marker: None,
            },
        });
    }
    state.containers = next;
}

/// Takes the state lease, adds the carried counters, claims the next page (unless `started`
/// is `None`: then it only records the counters), writes the new state, releases the lease.
async fn claim<T, S: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<S>,
    settings: &Settings,
    carried: &Report,
    started: Option<Instant>,
) -> Result<Claim, leasegate::Error> {
    let lock = LockName::try_new("lock")?;
    let id = (ctx.new_lease_id)();
    let term = Term::for_window(Duration::from_secs(30))?;
    let waited = Instant::now();
    loop {
        match locks
            .acquire_as(&lock, term, id, &settings.instance_id, ctx.now)
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
    let claimed = claim_held(locks, settings, carried, started.is_some(), ctx.now).await;
    let _ = locks.release(&lock, id, ctx.now).await;
    claimed
}

async fn claim_held<S: Transport>(
    locks: &Locks<S>,
    settings: &Settings,
    carried: &Report,
    page_wanted: bool,
    now: SystemTime,
) -> Result<Claim, leasegate::Error> {
    let (mut state, etag, server_now) = read_state(locks, settings, now).await?;
    reconcile(&mut state, settings);
    state.purged += carried.deleted;
    state.moved += carried.moved;
    state.locks_removed += carried.locks_removed;
    // Nothing is claimed unless the state (with the counters) is written.
    let written = |ok: bool, claim: Claim| if ok { claim } else { Claim::Busy };
    if !page_wanted {
        let ok = write_state(locks, settings, &state, etag, now).await?;
        return Ok(written(ok, Claim::Counted));
    }
    // A new pass starts no sooner than `ttl_pass_interval_seconds` after the last one ended.
    let fresh = state
        .containers
        .iter()
        .all(|e| e.status == "init" || e.status == "off");
    let resting = state
        .last_pass_completed_at
        .as_deref()
        .and_then(timer::parse_time)
        .is_some_and(|t| t + settings.pass_interval > server_now);
    if fresh && resting {
        if !carried.has_counters() {
            return Ok(Claim::PassComplete);
        }
        let ok = write_state(locks, settings, &state, etag, now).await?;
        return Ok(written(ok, Claim::PassComplete));
    }
    let Some(index) = state
        .containers
        .iter()
        .position(|e| e.status == "init" || e.status == "current")
    else {
        // Every container gave its last page: the pass is complete.
        for e in &mut state.containers {
            e.status = "init".into();
            e.marker = None;
        }
        state.passes += 1;
        state.last_pass_completed_at = Some(rfc3339(server_now));
        let ok = write_state(locks, settings, &state, etag, now).await?;
        return Ok(written(ok, Claim::PassComplete));
    };
    let entry = state.containers[index].clone();
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
    let e = &mut state.containers[index];
    e.marker = page.next_marker.clone();
    e.status = if page.next_marker.is_some() {
        "current"
    } else {
        "last"
    }
    .into();
    state.pages += 1;
    if !write_state(locks, settings, &state, etag, now).await? {
        // The state moved although we hold its lease (someone wrote it without): claim nothing.
        return Ok(Claim::Busy);
    }
    Ok(Claim::Page(Claimed {
        kind: entry.kind,
        container,
        page,
        server_now: date.unwrap_or(now),
    }))
}

/// Processes a claimed page concurrently (at most `max_in_flight` blobs at a time).
async fn process<T, S: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<S>,
    settings: &Settings,
    claimed: &Claimed,
) -> Report {
    let outcomes: Vec<Outcome> = futures::stream::iter(claimed.page.blobs.iter())
        .map(|item| async move {
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
        return Outcome::Skipped("the name is not usable");
    };
    let Some(etag) = props.etag.clone() else {
        return Outcome::Skipped("listed without an ETag");
    };
    let container = &claimed.container;
    if let Some((dead_container, prefix)) = &dead {
        let Ok(target) = BlobName::try_new(&format!("{prefix}{}", item.name)) else {
            return Outcome::Skipped("the dead blob's name is too long");
        };
        let mut metadata: Metadata = props
            .metadata
            .iter()
            .filter(|(k, _)| k.as_str() != TIME_TO_LIVE)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        metadata.insert(
            SOURCE_URI.into(),
            public_blob_url(&settings.storage.account, container, &source),
        );
        let copy = CopyBlob {
            source_etag: Some(etag.clone()),
            metadata: Some(metadata),
            ..CopyBlob::new(
                container.clone(),
                source.clone(),
                dead_container.clone(),
                target.clone(),
            )
        };
        let copied = match copy_creating(locks, &copy, dead_container, ctx.now).await {
            Ok(CopyOutcome::Started { status, .. }) => match status {
                CopyStatus::Success => true,
                CopyStatus::Pending => wait_for_copy(ctx, locks, dead_container, &target).await,
            },
            Ok(CopyOutcome::Refused(Refusal::ConditionFailed)) => {
                return Outcome::Skipped("changed since listing")
            }
            Ok(CopyOutcome::Refused(_)) => return Outcome::Skipped("the dead blob is leased"),
            Err(_) => return Outcome::Error,
        };
        if !copied {
            return Outcome::Skipped("the copy did not finish");
        }
    }
    let delete = DeleteBlob {
        container: container.clone(),
        blob: source,
        lease_id: None,
        condition: Condition::IfMatch(etag),
    };
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

/// Polls a pending copy's destination until it succeeds (`true`) or fails or takes too long.
async fn wait_for_copy<T, S: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<S>,
    container: &ContainerName,
    blob: &BlobName,
) -> bool {
    for _ in 0..COPY_POLLS {
        (ctx.sleep)(Duration::from_millis(250)).await;
        let head = GetProperties {
            container: container.clone(),
            blob: blob.clone(),
        };
        match locks.execute(&head, ctx.now).await {
            Ok((Some(p), _)) => match p.copy_status.as_deref() {
                Some("success") | None => return true,
                Some("pending") => continue,
                Some(_) => return false,
            },
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

/// The answer of a tick.
fn describe(
    settings: &Settings,
    source: Source,
    result: &Result<Report, leasegate::Error>,
    round_trips: u32,
    started: Instant,
) -> (StatusCode, Value) {
    let mut v = match result {
        Ok(r) => json!(r),
        Err(_) => json!({}),
    };
    v["instance"] = json!(settings.instance_id);
    v["trigger"] = json!(source.as_str());
    v["storageRoundTrips"] = json!(round_trips);
    v["durationMs"] = json!(elapsed_ms(started));
    match result {
        Ok(_) => (StatusCode::OK, v),
        Err(e) => {
            v["error"] = json!(if matches!(e, leasegate::Error::CorruptLock(_)) {
                "state_unusable"
            } else {
                "storage_unavailable"
            });
            v["message"] = json!(format!("the sweep state could not be used: {e}"));
            (StatusCode::SERVICE_UNAVAILABLE, v)
        }
    }
}

fn log_tick(v: &Value) {
    let mut line = v.clone();
    line["fn"] = json!("ttl-sweeper");
    log_line(line);
}

/// Handles `handle-cron-event`: one tick; `Err` when the sweep state could not be used.
pub async fn handle_cron<T: Transport>(
    ctx: &Context<'_, T>,
    _timestamp: u64,
) -> Result<(), String> {
    let started = Instant::now();
    let settings = Settings::load(ctx.variables).map_err(|e| {
        log_line(json!({"fn": "ttl-sweeper", "error": "not_configured", "message": e.to_string()}));
        e.to_string()
    })?;
    let (result, trips) = sweep(ctx, &settings, started).await;
    let (status, v) = describe(&settings, Source::Cron, &result, trips, started);
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

/// Handles the component's HTTP requests: `PUT /api/ttl/{container}/{blob}` (marking),
/// `POST /api/sweeper/tick` and `GET /api/sweeper` (the state), all bearer `timer_token`; and
/// `POST /{FunctionName}` (any other path: an Azure Functions timer invocation).
pub async fn handle_http<T: Transport>(
    ctx: &Context<'_, T>,
    request: Request<Vec<u8>>,
) -> Response<Vec<u8>> {
    let started = Instant::now();
    let path = request.uri().path().to_string();
    let api = path.starts_with(TTL_ROUTE)
        || path.trim_end_matches('/') == TTL_ROUTE.trim_end_matches('/')
        || path.trim_end_matches('/') == SWEEPER_ROUTE
        || path.starts_with(&format!("{SWEEPER_ROUTE}/"));
    if api {
        if let Err(r) = auth::authenticate(ctx.variables, "timer_token", "timer_auth", &request) {
            return r;
        }
        if path.starts_with(TTL_ROUTE)
            || path.trim_end_matches('/') == TTL_ROUTE.trim_end_matches('/')
        {
            return mark(ctx, &request).await;
        }
        let action = path[SWEEPER_ROUTE.len()..].trim_matches('/');
        let method = request.method().clone();
        match (action, &method) {
            ("", &http::Method::GET) | ("tick", &http::Method::POST) => {}
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
        if method == http::Method::GET {
            let transport = (ctx.connect)(settings.storage.timeout);
            let locks = settings.storage.locks(&transport, "sweeper/");
            return match read_state(&locks, &settings, ctx.now).await {
                Ok((state, _, _)) => web::json(StatusCode::OK, &json!(state)),
                Err(e) => web::storage_unavailable(&e),
            };
        }
        let (result, trips) = sweep(ctx, &settings, started).await;
        let (status, v) = describe(&settings, Source::Http, &result, trips, started);
        log_tick(&v);
        return web::json(status, &v);
    }
    if !timer::azure_channel(ctx.variables) {
        return timer::no_route();
    }
    if request.method() != http::Method::POST {
        return web::method_not_allowed("POST");
    }
    let settings = match Settings::load(ctx.variables) {
        Ok(s) => s,
        Err(e) => {
            return timer::azure_answer(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "not_configured", "message": e.to_string()}),
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
    let (result, trips) = sweep(ctx, &settings, started).await;
    let (status, v) = describe(&settings, Source::Azure, &result, trips, started);
    log_tick(&v);
    let summary = format!(
        "ttl-sweeper on {}: {} pages, {} deleted, {} moved",
        settings.instance_id, v["pages"], v["deleted"], v["moved"]
    );
    timer::azure_answer(status, v, vec![summary])
}

/// The body of a marking request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Marking {
    #[serde(default)]
    expires_at: Option<String>,
    #[serde(default)]
    ttl_seconds: Option<u64>,
    #[serde(default, with = "double_option")]
    dead_blob_container: Option<Option<String>>,
}

/// `Some(None)` for an explicit `null`, `None` for a missing field.
mod double_option {
    use serde::{Deserialize, Deserializer};
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<String>>, D::Error> {
        Ok(Some(Option::deserialize(d)?))
    }
}

/// `PUT /api/ttl/{container}/{blob}`: sets `TimeToLive` (and `DeadBlobContainer`) on an
/// existing blob of a swept container, keeping its other metadata (compare-and-swap).
async fn mark<T: Transport>(ctx: &Context<'_, T>, request: &Request<Vec<u8>>) -> Response<Vec<u8>> {
    if request.method() != http::Method::PUT {
        return web::method_not_allowed("PUT");
    }
    let bad = |code: &str, m: String| web::error(StatusCode::BAD_REQUEST, code, m);
    let raw = request.uri().path()[TTL_ROUTE.len().min(request.uri().path().len())..].to_string();
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
    let marking: Marking = match serde_json::from_slice(request.body()) {
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
    if let Some(Some(d)) = &marking.dead_blob_container {
        if let Err(e) = parse_location(d) {
            return bad(
                "invalid_body",
                format!(
                    "deadBlobContainer must be container, container/ or container/prefix/: {e}"
                ),
            );
        }
    }
    let settings = match Settings::load(ctx.variables) {
        Ok(s) => s,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
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
            Err(e) => return web::storage_unavailable(&e),
        }
    }
    web::error(
        StatusCode::CONFLICT,
        "changed",
        "the blob kept changing while it was marked; try again",
    )
}
