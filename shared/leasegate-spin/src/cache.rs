//! The app's key-value store (Spin's store `default`): the store, the name of every entry the
//! toolkit keeps in it, and the gate cache's entries.
//!
//! # The entries
//!
//! | entry | key | written by |
//! |---|---|---|
//! | a device gate known held ([`Gates`]) | [`Scope::gate_key`] of the lock blob's path | device-alerts |
//! | how far a clock sharing the store is behind storage's ([`Gates`]) | [`Scope::clock_key`] | device-alerts |
//! | a lock as its holder's last call left it ([`crate::held`]) | [`Scope::holder_key`] of the lock blob's path | the gate, the leader |
//! | a job's last failed tick | [`Scope::failed_tick_key`] of the job's occurrences prefix | scheduled-job |
//! | until when a job of a `jobs` table needs no tick here | [`Scope::quiet_job_key`] of the instance, the job and its schedule | scheduled-job |
//! | an Entra ID token ([`crate::token`]) | [`token_key`] of its source | every function, with `storage_auth` an Entra ID sign-in |
//!
//! Every entry but the token is about one storage: its key is named by a [`Scope`], the blob
//! endpoint **in full** (origin and base path, so that two accounts behind one origin, as
//! Azurite and a proxy serve them, path style, never meet: a connection string with a SAS names
//! no account, its endpoint does) and the container, then the entry's own name. A token serves
//! every account its identity may reach, so its key is named by where it comes from. Keys are
//! digests: all of one short length, and naming no account, container or lock.
//!
//! Entries are a cache: a key of an older version (before keys named the endpoint in full) is
//! never read again, and nothing is migrated; the first call after an upgrade asks storage
//! where the old entry would have answered.
//!
//! # The gate cache
//!
//! A cache of "this device gate is held until T", so that a throttled decision needs no
//! storage request. **It only ever suppresses what storage would also suppress.** An entry
//! says: storage holds this gate until `until`, by **storage's clock** (the `Date` of the answer
//! that granted or showed the gate, and the expiry it gave), less [`MARGIN`], and nothing will
//! give it back before then. So an entry is written only for a gate that nobody will release
//! early:
//!
//! * a device gate this invocation took and keeps (its notification went out, or may have);
//! * a device gate storage reports held by another tenure that began long enough ago
//!   ([`settled_after`]) that its holder has finished notifying and, had it failed, giving
//!   the gate back: its gate is kept.
//!
//! A writer's clock plays no part in an entry. A reader judges entries by its best knowledge of
//! storage's time ([`Gates::open`]): its clock, moved ahead by the most that a clock sharing
//! the store was found behind storage's within the last [`CLOCK_MEMORY`] (every invocation
//! with the cache on that asks storage compares the answer's `Date` with its own clock:
//! [`Gates::check_clock`]).
//! A clock ahead of storage's only ends entries early (a storage request more). A clock
//! behind it by up to [`MARGIN`] less a second ends them no later than storage's gate; one
//! further behind is found at its first storage answer, and from then every reader of the
//! store reckons with it. Until then (its first use, or its first after an hour without a
//! storage request), an entry read before its own writing's `Date` by that clock is not
//! believed, which bounds what such a reader may over-throttle to under one window per entry.
//!
//! A miss, an expired entry, an unreadable store or an unreadable entry falls back to
//! storage, which stays the authority: an entry can only make a throttle cheaper, never let
//! an alert through. The gate API's gates are not cached here: their holders give them back at
//! will, and the store has no compare-and-swap to keep an entry from landing after a release.
//! (What the gate keeps for its holders, [`crate::held`], decides nothing on its own.)
//!
//! Entries are read once per invocation, before any device is gated, at the invocation's
//! time. A path that gives a gate back removes the entry first (best effort: this invocation
//! wrote none for that tenure, so a failing store cannot leave one of its own).

use std::time::{Duration, SystemTime};

use leasegate::lease::Locks;
use leasegate::token::TokenSource;
use leasegate::{BlobEndpoint, ContainerName, Transport};
use sha2::{Digest, Sha256};

use crate::config::{self, ConfigError, Variables};

/// A store operation that failed (the store is missing, denied or broken): the caller falls
/// back to storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

/// A key-value store. Failures are `Err(Unavailable)`: the caller falls back to storage.
pub trait Cache {
    /// The value under `key`.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Unavailable>;
    /// Sets `key`.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), Unavailable>;
    /// Removes `key` (a missing key is not an error).
    fn delete(&self, key: &str) -> Result<(), Unavailable>;
}

/// No cache (`kv_cache = off`, and unit tests).
pub struct NoCache;

impl Cache for NoCache {
    fn get(&self, _key: &str) -> Result<Option<Vec<u8>>, Unavailable> {
        Ok(None)
    }
    fn set(&self, _key: &str, _value: &[u8]) -> Result<(), Unavailable> {
        Ok(())
    }
    fn delete(&self, _key: &str) -> Result<(), Unavailable> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Keys

/// The storage a deployment's entries are about: the blob endpoint in full (origin and base
/// path) and the container. Every key but the token's is named by one ([`Scope::gate_key`],
/// [`Scope::holder_key`], [`Scope::failed_tick_key`], [`Scope::clock_key`]). It names no
/// secret: a connection string's key or SAS is not part of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    endpoint: String,
    container: String,
}

impl Scope {
    /// The scope of the container `container` at `endpoint`.
    pub fn new(endpoint: &BlobEndpoint, container: &ContainerName) -> Scope {
        Scope {
            endpoint: endpoint.base_url(),
            container: container.as_str().to_string(),
        }
    }

    /// The scope of `storage`'s container.
    pub fn of(storage: &config::Storage) -> Scope {
        Scope::new(storage.account.endpoint(), &storage.container)
    }

    /// The scope of `locks`' container.
    pub fn of_locks<T: Transport>(locks: &Locks<T>) -> Scope {
        Scope::new(locks.account().endpoint(), locks.container())
    }

    /// The scope [`config::storage`] would reach, read from the few variables that name it
    /// ([`config::endpoint`] and `container`) rather than from every storage setting, for a
    /// request that reads no other (each read is a call into Spin). A mistake in the variables
    /// is named as [`config::storage`] names it.
    pub fn load(vars: &dyn Variables) -> Result<Scope, ConfigError> {
        let endpoint = config::endpoint(vars)?;
        let container = config::var(vars, "container").unwrap_or_else(|| "leasegate".into());
        Ok(Scope {
            endpoint: endpoint.base_url(),
            container,
        })
    }

    /// The gate cache's entry of the lock blob at `path` ([`Gates`]).
    pub fn gate_key(&self, path: &str) -> String {
        self.key("held", path)
    }

    /// The entry of how far behind storage's the clocks sharing the store were found
    /// ([`Gates::check_clock`]).
    pub fn clock_key(&self) -> String {
        self.key("clock", "")
    }

    /// The entry of a lock as its holder's last call left it, for the lock blob at `path`
    /// ([`crate::held`]): one entry a lock, the latest holder's that acquired through the
    /// deployment.
    pub fn holder_key(&self, path: &str) -> String {
        self.key("holder", path)
    }

    /// The entry where a job whose occurrences are below `occurrences_prefix` notes its latest
    /// failed tick (scheduled-job).
    pub fn failed_tick_key(&self, occurrences_prefix: &str) -> String {
        self.key("failed-tick", occurrences_prefix)
    }

    /// The entry where an instance notes until when a job of scheduled-job's `jobs` table needs
    /// no tick; `name` holds the instance, the job and its schedule (scheduled-job).
    pub fn quiet_job_key(&self, name: &str) -> String {
        self.key("quiet-job", name)
    }

    /// `leasegate:{kind}:{digest}`, the digest of the endpoint, the container and `name`.
    fn key(&self, kind: &str, name: &str) -> String {
        let digest = Sha256::new()
            .chain_update(self.endpoint.as_bytes())
            .chain_update([0])
            .chain_update(self.container.as_bytes())
            .chain_update([0])
            .chain_update(name.as_bytes())
            .finalize();
        format!("leasegate:{kind}:{}", crate::web::hex(&digest[..16]))
    }
}

/// The entry of `source`'s tokens ([`crate::token`]): a digest of where they come from
/// (endpoint or authority, tenant, client id; no secret), so that apps sharing a store do not
/// meet. Not named by a storage: a token serves every account its identity may reach.
pub fn token_key(source: &TokenSource) -> String {
    let digest = Sha256::digest(source.identity().as_bytes());
    format!("leasegate:token:{}", crate::web::hex(&digest[..16]))
}

// ---------------------------------------------------------------------------------------------
// The gate cache

/// Taken off every entry's end, which is storage's: storage's `Date` is whole seconds (up to
/// 1 s of this), and a reader's clock may be behind storage's by the rest (2 s) before it is
/// found out ([`Gates::check_clock`]).
pub const MARGIN: Duration = Duration::from_secs(3);

/// A clock found behind storage's by more than this ([`Gates::check_clock`]) is noted in the
/// store: the `Date` it is compared with reads up to 1 s early, so a clock up to
/// [`MARGIN`] less this less that second behind is within the margin.
pub const CLOCK_SLACK: Duration = Duration::from_secs(1);

/// How long a clock found behind storage's is reckoned with after it was last found so.
pub const CLOCK_MEMORY: Duration = Duration::from_secs(3600);

/// The longest an entry may last: longer ones are not the cache's (it writes none) and are
/// ignored.
pub const LONGEST: Duration = Duration::from_secs(86_400);

/// The `kv_cache` variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No cache.
    Off,
    /// Device gates.
    On,
}

impl Mode {
    /// Reads `kv_cache` (`on` by default).
    pub fn load(vars: &dyn Variables) -> Result<Mode, ConfigError> {
        match config::var(vars, "kv_cache").as_deref() {
            None | Some("on") => Ok(Mode::On),
            Some("off") => Ok(Mode::Off),
            Some(other) => Err(ConfigError(format!(
                "variable kv_cache must be on or off, not '{other}'"
            ))),
        }
    }
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn at_millis(ms: u64) -> Option<SystemTime> {
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// A gate entry: held until `until`, written from the answer dated `date` (both Unix
/// milliseconds, storage's clock), stored as `{"until": T, "date": D}`. Unknown fields are
/// ignored (a newer writer's).
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    until: u64,
    date: u64,
}

/// The clock entry: a clock sharing the store was found `behindMs` behind storage's, and is
/// reckoned with until `until` (storage's clock, Unix milliseconds).
#[derive(serde::Serialize, serde::Deserialize)]
struct Clock {
    #[serde(rename = "behindMs")]
    behind_ms: u64,
    until: u64,
}

/// The gate cache as one invocation sees it: the store, the scope its keys are named by, and
/// the invocation's best knowledge of storage's time.
pub struct Gates<'a> {
    store: &'a dyn Cache,
    scope: Scope,
    /// Storage's time as this invocation reckons it: its clock at its start, moved ahead by the
    /// most that a clock sharing the store was last found behind storage's.
    server_now: SystemTime,
}

impl<'a> Gates<'a> {
    /// Reads `kv_cache` and, when it is on, the scope's variables ([`Scope::load`]) and the
    /// store's clock entry; `now` is the invocation's clock. `None`: the cache is off.
    pub fn open(
        store: &'a dyn Cache,
        vars: &dyn Variables,
        now: SystemTime,
    ) -> Result<Option<Gates<'a>>, ConfigError> {
        if Mode::load(vars)? == Mode::Off {
            return Ok(None);
        }
        Ok(Some(Gates::with_scope(store, Scope::load(vars)?, now)))
    }

    /// [`Gates::open`] with a scope known already.
    pub fn with_scope(store: &'a dyn Cache, scope: Scope, now: SystemTime) -> Gates<'a> {
        let behind = read_clock(store, &scope.clock_key())
            .and_then(|c| Some((Duration::from_millis(c.behind_ms), at_millis(c.until)?)))
            .filter(|(behind, until)| now + *behind < *until)
            .map(|(behind, _)| behind)
            .unwrap_or_default();
        Gates {
            store,
            scope,
            server_now: now + behind,
        }
    }

    /// Storage's time as this invocation reckons it (see [`Gates::open`]).
    pub fn server_now(&self) -> SystemTime {
        self.server_now
    }

    /// The time left on the live entry of the lock blob at `path`. `None` for a miss, an
    /// expired or unreadable entry, an entry this invocation's reckoning of storage's time is
    /// before the writing of (its clock is behind storage's), or a store that fails.
    pub fn held(&self, path: &str) -> Option<Duration> {
        let raw = self.store.get(&self.scope.gate_key(path)).ok()??;
        let Entry { until, date } = serde_json::from_slice(&raw).ok()?;
        let now = millis(self.server_now);
        if now.saturating_add(millis_of(MARGIN)) < date {
            return None;
        }
        let left = Duration::from_millis(until.checked_sub(now)?);
        (!left.is_zero() && left <= LONGEST).then_some(left)
    }

    /// Records that storage holds the gate of `path` until `ends`, as its answer dated `date`
    /// said (both storage's clock), less the margin; nothing when that leaves nothing. Best
    /// effort: a failed write only costs a request.
    pub fn remember(&self, path: &str, ends: SystemTime, date: SystemTime) {
        let Some(until) = ends.checked_sub(MARGIN).filter(|until| *until > date) else {
            return;
        };
        let until = until.min(date + LONGEST);
        let entry = Entry {
            until: millis(until),
            date: millis(date),
        };
        if let Ok(value) = serde_json::to_vec(&entry) {
            let _ = self.store.set(&self.scope.gate_key(path), &value);
        }
    }

    /// Removes the entry of `path`.
    pub fn forget(&self, path: &str) -> Result<(), Unavailable> {
        self.store.delete(&self.scope.gate_key(path))
    }

    /// Compares storage's `date` (an answer's `Date`) with this instance's clock when the
    /// answer came (`received`): a clock more than [`CLOCK_SLACK`] behind is noted in the
    /// store for [`CLOCK_MEMORY`], with the most any clock was found behind within that time,
    /// and logged (`clock_behind_storage`). Best effort.
    pub fn check_clock(&self, date: SystemTime, received: SystemTime) {
        let Some(measured) = date
            .duration_since(received)
            .ok()
            .filter(|d| *d > CLOCK_SLACK)
        else {
            return;
        };
        // The `Date` reads up to a second early: the clock may be that much further behind.
        let mut behind = millis_of(measured + Duration::from_secs(1));
        let key = self.scope.clock_key();
        if let Some(noted) = read_clock(self.store, &key).filter(|c| c.until > millis(date)) {
            behind = behind.max(noted.behind_ms);
        }
        let clock = Clock {
            behind_ms: behind,
            until: millis(date + CLOCK_MEMORY),
        };
        if let Ok(value) = serde_json::to_vec(&clock) {
            let _ = self.store.set(&key, &value);
        }
        crate::log_line(serde_json::json!({
            "event": "clock_behind_storage",
            "behindMs": millis_of(measured),
            "reckonedMs": behind,
        }));
    }
}

fn millis_of(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The clock entry under `key`, if there is a readable one.
fn read_clock(store: &dyn Cache, key: &str) -> Option<Clock> {
    let raw = store.get(key).ok()??;
    let clock: Clock = serde_json::from_slice(&raw).ok()?;
    (clock.behind_ms <= millis_of(LONGEST)).then_some(clock)
}

/// How old another holder's tenure must be before its gate counts as kept. Its age is
/// counted from its first read; after that come, each within `timeout`, at most: the
/// container's and the lock blob's creation, the acquire and the claim (4), the notification
/// (1), and a give-back (a read and a release, 2; the lease module's own give-back after a
/// failed claim is no longer), so 8 requests, plus two for slack and the margin.
pub fn settled_after(timeout: Duration) -> Duration {
    10 * timeout + MARGIN
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Memory(RefCell<HashMap<String, Vec<u8>>>, bool);

    impl Cache for Memory {
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Unavailable> {
            if self.1 {
                return Err(Unavailable);
            }
            Ok(self.0.borrow().get(key).cloned())
        }
        fn set(&self, key: &str, value: &[u8]) -> Result<(), Unavailable> {
            self.0.borrow_mut().insert(key.into(), value.into());
            Ok(())
        }
        fn delete(&self, key: &str) -> Result<(), Unavailable> {
            self.0.borrow_mut().remove(key);
            Ok(())
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The scope read from the variables, checked to be the one of the storage settings they
    /// make.
    fn scope(pairs: &[(&str, &str)]) -> Scope {
        let vars = vars(pairs);
        let scope = Scope::load(&vars).unwrap();
        assert_eq!(
            scope,
            Scope::of(&config::storage(&vars).unwrap()),
            "{pairs:?}"
        );
        scope
    }

    const SAS: &str = "sv=2021-12-02&sr=c&sp=racwdl&sig=c2lnbmF0dXJl";

    #[test]
    fn two_accounts_behind_one_origin_have_their_own_keys() {
        let sas_at = |account: &str| {
            format!("BlobEndpoint=http://127.0.0.1:10000/{account};SharedAccessSignature={SAS}")
        };
        let (one, two) = (sas_at("devstoreaccount1"), sas_at("second"));
        let origin = ("storage_origin", "http://127.0.0.1:10000");
        let a = scope(&[origin, ("storage_connection_string", &one)]);
        let b = scope(&[origin, ("storage_connection_string", &two)]);
        assert_ne!(a.gate_key("alerts/d"), b.gate_key("alerts/d"));
        assert_ne!(a.holder_key("gates/g"), b.holder_key("gates/g"));
        assert_ne!(a.failed_tick_key("jobs/j/"), b.failed_tick_key("jobs/j/"));
        assert_ne!(a.clock_key(), b.clock_key());
        assert_eq!(a.endpoint, "http://127.0.0.1:10000/devstoreaccount1");
        // Named accounts behind one origin too.
        let named = |account| {
            scope(&[
                origin,
                ("storage_account", account),
                ("storage_key", "a2V5"),
            ])
        };
        assert_ne!(named("first"), named("second"));
        // The same account, however it is reached (a key, a SAS, a connection string), is one
        // scope: its entries are shared.
        let key_cs = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;\
                      AccountKey=a2V5MQ==;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;";
        assert_eq!(scope(&[origin, ("storage_connection_string", key_cs)]), a);
        assert_eq!(named("devstoreaccount1"), a);
        assert_eq!(
            scope(&[
                origin,
                ("storage_account", "devstoreaccount1"),
                ("storage_sas", SAS),
                ("storage_timeout_ms", "900"),
            ]),
            a
        );
        // A connection string beside storage_account: the scope follows storage_auth, as the
        // settings do (unset: the connection string's; key: storage_account).
        let both = |auth: Option<&'static str>| {
            let mut pairs = vec![
                origin,
                ("storage_connection_string", two.as_str()),
                ("storage_account", "devstoreaccount1"),
                ("storage_key", "a2V5"),
            ];
            pairs.extend(auth.map(|a| ("storage_auth", a)));
            scope(&pairs)
        };
        assert_eq!(both(None), b);
        assert_eq!(both(Some("key")), a);
    }

    #[test]
    fn scopes_differ_by_origin_and_container_and_name_no_secret() {
        let base = [
            ("storage_origin", "https://acct.blob.core.windows.net/"),
            ("storage_account", "acct"),
            ("storage_sas", SAS),
        ];
        let s = scope(&base);
        assert_eq!(s.endpoint, "https://acct.blob.core.windows.net");
        assert_eq!(s.container, "leasegate");
        let mut other = base.to_vec();
        other.push(("container", "elsewhere"));
        assert_ne!(scope(&other).gate_key("alerts/d"), s.gate_key("alerts/d"));
        let other = [
            ("storage_origin", "https://other.blob.core.windows.net"),
            ("storage_account", "acct"),
            ("storage_sas", SAS),
        ];
        assert_ne!(scope(&other).gate_key("alerts/d"), s.gate_key("alerts/d"));
        assert!(!format!("{s:?}").contains("c2lnbmF0dXJl"));
        // Every kind of entry its own key, each short and naming nothing.
        let keys = [
            s.gate_key("alerts/d"),
            s.holder_key("alerts/d"),
            s.failed_tick_key("alerts/d"),
            s.clock_key(),
        ];
        for (i, k) in keys.iter().enumerate() {
            assert!(k.len() <= "leasegate:failed-tick:".len() + 32, "{k}");
            assert!(!k.contains("acct") && !k.contains("alerts"), "{k}");
            assert!(keys[i + 1..].iter().all(|o| o != k), "{k}");
        }
        assert_ne!(s.gate_key("alerts/d"), s.gate_key("alerts/e"));
        // A mistake is named as the storage settings name it.
        let e = Scope::load(&vars(&[("storage_account", "acct")])).unwrap_err();
        assert!(e.0.contains("storage_origin"), "{e}");
    }

    #[test]
    fn the_cache_is_off_or_on_by_kv_cache() {
        let store = Memory::default();
        let base = [
            ("storage_origin", "http://127.0.0.1:10000"),
            ("storage_account", "devstoreaccount1"),
        ];
        assert!(Gates::open(&store, &vars(&base), at(0)).unwrap().is_some());
        let mut off = base.to_vec();
        off.push(("kv_cache", "off"));
        assert!(Gates::open(&store, &vars(&off), at(0)).unwrap().is_none());
        let mut bad = base.to_vec();
        bad.push(("kv_cache", "maybe"));
        assert!(Gates::open(&store, &vars(&bad), at(0)).is_err());
    }

    fn test_scope() -> Scope {
        scope(&[
            ("storage_origin", "http://127.0.0.1:10000"),
            ("storage_account", "devstoreaccount1"),
            ("storage_key", "a2V5"),
        ])
    }

    #[test]
    fn entries_end_at_storages_end_less_the_margin_whatever_the_writers_clock() {
        let m = Memory::default();
        // The writer's clock is an hour off: it plays no part.
        let writer = Gates::with_scope(&m, test_scope(), at(100 + 3600));
        assert_eq!(writer.held("alerts/d"), None);
        writer.remember("alerts/d", at(160), at(100));
        let reader = |now| Gates::with_scope(&m, test_scope(), at(now));
        assert_eq!(reader(100).held("alerts/d"), Some(Duration::from_secs(57)));
        assert_eq!(reader(156).held("alerts/d"), Some(Duration::from_secs(1)));
        assert_eq!(reader(157).held("alerts/d"), None);
        // Nothing worth keeping under the margin.
        writer.remember("alerts/short", at(103), at(100));
        assert!(m
            .0
            .borrow()
            .get(&test_scope().gate_key("alerts/short"))
            .is_none());
        // Forgotten.
        reader(100).forget("alerts/d").unwrap();
        assert_eq!(reader(100).held("alerts/d"), None);
    }

    #[test]
    fn a_clock_found_behind_storages_is_reckoned_with_by_every_reader() {
        let m = Memory::default();
        let scope = test_scope();
        // Storage's time is 1000 s; the reader's clock is 10 s behind it.
        let writer = Gates::with_scope(&m, scope.clone(), at(1000));
        writer.remember("alerts/d", at(1060), at(1000));
        let behind = |real: u64| Gates::with_scope(&m, scope.clone(), at(real - 10));
        // Not yet found out: an entry read before its writing's Date by that clock (beyond the
        // margin) is not believed; one read after it is, 10 s too long.
        assert_eq!(behind(1005).held("alerts/d"), None);
        assert_eq!(behind(1061).held("alerts/d"), Some(Duration::from_secs(6)));
        // Its first storage answer: Date 1061, received at 1051 by its clock.
        behind(1061).check_clock(at(1061), at(1051));
        let noted: Clock = serde_json::from_slice(&m.0.borrow()[&scope.clock_key()]).unwrap();
        assert_eq!(noted.behind_ms, 11_000);
        assert_eq!(behind(1061).server_now(), at(1062));
        assert_eq!(behind(1061).held("alerts/d"), None);
        assert_eq!(behind(1040).held("alerts/d"), Some(Duration::from_secs(16)));
        // A reader whose clock is right ends entries early (costs requests, allows nothing).
        assert_eq!(
            Gates::with_scope(&m, scope.clone(), at(1040)).held("alerts/d"),
            Some(Duration::from_secs(6))
        );
        // A smaller lag found later does not shrink the note; a larger one grows it.
        behind(1070).check_clock(at(1070), at(1067));
        behind(1080).check_clock(at(1080), at(1060));
        let noted: Clock = serde_json::from_slice(&m.0.borrow()[&scope.clock_key()]).unwrap();
        assert_eq!(noted.behind_ms, 21_000);
        assert_eq!(noted.until, 1000 * (1080 + 3600));
        // An hour after it was last found, it is no longer reckoned with.
        let late = Gates::with_scope(&m, scope.clone(), at(1080 + 3600));
        assert_eq!(late.server_now(), at(1080 + 3600));
        // Within the slack, nothing is noted.
        let m2 = Memory::default();
        Gates::with_scope(&m2, scope.clone(), at(0)).check_clock(at(100), at(99));
        assert!(m2.0.borrow().is_empty());
    }

    #[test]
    fn failures_and_garbage_fall_back_to_storage() {
        let mut m = Memory::default();
        let scope = test_scope();
        let k = scope.gate_key("alerts/d");
        let gates = |m: &Memory| Gates::with_scope(m, scope.clone(), at(0)).held("alerts/d");
        m.0.borrow_mut().insert(k.clone(), b"not json".to_vec());
        assert_eq!(gates(&m), None);
        // An entry of an older version (its end in the writer's clock, no Date): not read.
        m.0.borrow_mut()
            .insert(k.clone(), br#"{"until":60000}"#.to_vec());
        assert_eq!(gates(&m), None);
        // An entry beyond what the cache ever writes is not believed.
        m.0.borrow_mut().insert(
            k.clone(),
            br#"{"until":18446744073709551615,"date":0}"#.to_vec(),
        );
        assert_eq!(gates(&m), None);
        Gates::with_scope(&m, scope.clone(), at(0)).remember("alerts/d", at(10 * 86_400), at(0));
        assert_eq!(gates(&m), Some(LONGEST));
        // A garbage clock entry counts as none.
        m.0.borrow_mut()
            .insert(scope.clock_key(), br#"{"behindMs":"x"}"#.to_vec());
        assert_eq!(
            Gates::with_scope(&m, scope.clone(), at(5)).server_now(),
            at(5)
        );
        m.1 = true;
        assert_eq!(gates(&m), None);
    }
}
