//! The sweeper's settings, read from the `ttl_*` variables (`docs/configuration.md`): what to
//! sweep, how long a tick may take, where expired blobs may be moved.

use std::time::Duration;

use leasegate::{BlobName, ContainerName};
use serde::{Deserialize, Serialize};

use leasegate_spin::config::{self, ConfigError, Storage, Variables};
use leasegate_spin::timer;

use crate::{DEFAULT_LOCK_RETENTION_SECS, STATE_BLOB};

/// How often a pending copy is polled.
pub(crate) const COPY_POLL: Duration = Duration::from_millis(250);
/// How long a pending copy is waited for before the source is left alone.
pub(crate) const COPY_WAIT: Duration = Duration::from_secs(5);
/// The storage requests one expired blob can make at most, each bounded by the storage
/// timeout: copy, create the dead-blob container, copy again (3); HEAD of a taken name (1);
/// the same for the second name (3); the last poll of a pending copy or the HEAD of a taken
/// name (1); the delete (1). A pending copy adds [`COPY_WAIT`] and one [`COPY_POLL`].
const BLOB_REQUESTS: u32 = 9;
/// `ttl_list_interval_seconds` when it is not set: an hour.
pub(crate) const DEFAULT_LIST_INTERVAL_SECS: u64 = 3600;
/// The variable that allows dead-blob containers.
pub(crate) const DEAD_CONTAINERS_VAR: &str = "ttl_dead_containers";

/// What a sweep entry sweeps (`"ttl"` or `"locks"` in the state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    /// Blobs marked with a time-to-live.
    Ttl,
    /// The app's own lock blobs, free for longer than the retention.
    Locks,
}

/// How the sweeper finds the expired blobs of `ttl_containers` (`ttl_find`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Find {
    /// The default: Find Blobs by Tags on every pass, and a listing of every blob with its
    /// metadata once per `ttl_list_interval_seconds`, which sweeps what is due and gives the
    /// marked blobs it keeps their expiry tag. A blob marked by its metadata alone is swept
    /// within the interval; a pass between listings costs what expired.
    Both,
    /// Find Blobs by Tags on the index tag [`EXPIRES_TAG`](crate::EXPIRES_TAG): a pass costs
    /// what expired, not what is stored. Finds only tagged blobs (opt-in).
    Tags,
    /// List Blobs with metadata: every blob on every pass (no tag permissions needed).
    List,
}

impl Find {
    /// Whether this way finds blobs by their expiry tag (and so needs the tag permissions).
    pub(crate) fn uses_tags(self) -> bool {
        self != Find::List
    }
}

/// The sweeper's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Storage (its container holds the state and the app's lock blobs).
    pub(crate) storage: Storage,
    /// This deployment's identity.
    pub(crate) instance_id: String,
    /// What to sweep: (kind, container, prefix).
    pub(crate) targets: Vec<(Kind, ContainerName, String)>,
    /// Blobs per page.
    pub(crate) page_size: u32,
    /// How long one tick may sweep.
    pub(crate) budget: Duration,
    /// Lock blobs free for longer than this are removed (`None`: never).
    pub(crate) lock_retention: Option<Duration>,
    /// A new pass starts no sooner than this after the last one ended.
    pub(crate) pass_interval: Duration,
    /// The containers blobs may be moved to (`ttl_dead_containers`).
    pub(crate) dead_containers: DeadContainers,
    /// How expired blobs are found (`ttl_find`).
    pub(crate) find: Find,
    /// Under `ttl_find = both`: a container is listed again no sooner than this after its last
    /// listing completed (`ttl_list_interval_seconds`).
    pub(crate) list_interval: Duration,
}

/// Where `DeadBlobContainer` may send a blob (`ttl_dead_containers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeadContainers {
    /// These containers only (none: blobs asking to be moved are left alone).
    Only(Vec<ContainerName>),
    /// `*`: any container but the app's own and the swept ones.
    Any,
}

/// Parses `container`, `container/` or `container/prefix/` (a dead-blob container, a swept
/// container): the container and the prefix (empty, or ending in `/`).
pub(crate) fn parse_location(s: &str) -> Result<(ContainerName, String), String> {
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
    pub(crate) fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
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
        let find = match config::var(vars, "ttl_find")
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
        {
            None | Some("both") => Find::Both,
            Some("tags") => Find::Tags,
            Some("list") => Find::List,
            Some(other) => {
                return Err(ConfigError(format!(
                    "variable ttl_find: '{other}' is not both, tags or list"
                )))
            }
        };
        let list_interval = config::number(
            vars,
            "ttl_list_interval_seconds",
            DEFAULT_LIST_INTERVAL_SECS as f64,
            0..=31_536_000,
        )?;
        Ok(Settings {
            find,
            list_interval: Duration::from_secs(list_interval as u64),
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
    pub(crate) fn dead_refusal(
        &self,
        container: &ContainerName,
        prefix: &str,
    ) -> Option<&'static str> {
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
    pub(crate) fn blob_worst_case(&self) -> Duration {
        BLOB_REQUESTS * self.storage.timeout + COPY_WAIT + COPY_POLL
    }

    /// The longest a tick can take: blobs are begun until [`Settings::work_deadline`], and one
    /// begun then ends within [`Settings::blob_worst_case`] (10 s more for clocks and the last
    /// write). A tick's entry older than this is no longer active.
    pub(crate) fn tick_bound(&self) -> Duration {
        self.work_deadline() + self.blob_worst_case() + Duration::from_secs(10)
    }

    /// Pages are claimed until the budget is spent; the blobs of the last page are begun until
    /// this long after the tick started (the budget again, at least 5 s more).
    pub(crate) fn work_deadline(&self) -> Duration {
        self.budget + self.budget.max(Duration::from_secs(5))
    }

    pub(crate) fn state_blob(&self) -> Result<BlobName, leasegate::Error> {
        BlobName::try_new(STATE_BLOB)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The settings of a test deployment (the development account, lock blobs kept unless
    /// `vars` name `ttl_lock_retention_seconds`) with `vars`; the other modules' tests use it
    /// too.
    pub(crate) fn settings(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let mut v: HashMap<String, String> = HashMap::from([
            ("instance_id".to_string(), "node-a".to_string()),
            ("container".to_string(), "leasegate".to_string()),
            (
                "storage_account".to_string(),
                "devstoreaccount1".to_string(),
            ),
            (
                "storage_key".to_string(),
                leasegate::DEV_ACCOUNT_KEY.to_string(),
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
            ("storage_key", leasegate::DEV_ACCOUNT_KEY),
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
        // ttl_find: both (tags, and a listing every hour) unless set to tags or list.
        assert_eq!(s.find, Find::Both);
        assert_eq!(s.list_interval, Duration::from_secs(3600));
        for (value, find) in [
            ("tags", Find::Tags),
            ("list", Find::List),
            ("both", Find::Both),
        ] {
            let s = settings(&[("ttl_containers", "xxx"), ("ttl_find", value)]).unwrap();
            assert_eq!(s.find, find);
        }
        let e = settings(&[("ttl_containers", "xxx"), ("ttl_find", "index")]).unwrap_err();
        assert!(e.to_string().contains("ttl_find"), "{e}");
        let s = settings(&[
            ("ttl_containers", "xxx"),
            ("ttl_list_interval_seconds", "0"),
        ])
        .unwrap();
        assert_eq!(s.list_interval, Duration::ZERO);
        let e = settings(&[
            ("ttl_containers", "xxx"),
            ("ttl_list_interval_seconds", "-1"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("ttl_list_interval_seconds"), "{e}");
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
    fn locations() {
        assert_eq!(parse_location("dead").unwrap().1, "");
        assert_eq!(parse_location(" dead/ ").unwrap().1, "");
        assert_eq!(parse_location("dead/a/b/").unwrap().1, "a/b/");
        for bad in ["", "Dead", "dead/a", "d", "dead//"] {
            assert!(parse_location(bad).is_err(), "{bad}");
        }
    }
}
