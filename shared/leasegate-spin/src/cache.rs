//! A cache of "this gate is held until T", in Spin's key-value store, so that a throttled
//! decision needs no storage request.
//!
//! **It only ever suppresses what storage would also suppress.** An entry says: storage holds
//! this gate until `until` (the instance's wall clock, converted from the storage server's
//! clock when storage said so, less [`MARGIN`] for clocks that disagree), and nothing will give
//! it back before then. So an entry is written only for a gate that nobody will release early:
//!
//! * a device gate this invocation took and keeps (its notification went out, or may have);
//! * a device gate storage reports held by another tenure that began long enough ago
//!   ([`settled_after`]) that its holder has finished notifying and, had it failed, giving
//!   the gate back: its gate is kept.
//!
//! The gate API's gates are not cached here: their holders give them back at will, and the
//! store has no compare-and-swap to keep an entry from landing after a release. (What the gate
//! keeps for its holders, [`crate::held`], decides nothing on its own.)
//!
//! Entries are read once per invocation, before any device is gated, at the invocation's
//! time. A miss, an expired entry, an unreadable store or an unreadable entry falls back to
//! storage. A path that gives a gate back removes the entry first (best effort: this
//! invocation wrote none for that tenure, so a failing store cannot leave one of its own).

use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::config::{self, ConfigError, Variables};

/// Taken off every entry's end: storage's `Date` is whole seconds (up to 1 s of this), and
/// the clocks of the instances sharing a store may disagree by the rest (2 s).
pub const MARGIN: Duration = Duration::from_secs(3);

/// The longest an entry may last: longer ones are not the cache's (it writes none) and are
/// ignored.
pub const LONGEST: Duration = Duration::from_secs(86_400);

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

/// The entry's key: a digest of the blob service's origin, the account, the container and the
/// lock blob's path, so that apps sharing a store do not meet, and every key has the same short
/// length.
pub fn key(origin: &str, account: &str, container: &str, path: &str) -> String {
    let digest = Sha256::new()
        .chain_update(origin.as_bytes())
        .chain_update([0])
        .chain_update(account.as_bytes())
        .chain_update([0])
        .chain_update(container.as_bytes())
        .chain_update([0])
        .chain_update(path.as_bytes())
        .finalize();
    format!("leasegate:held:{}", crate::web::hex(&digest[..16]))
}

/// The storage a device-gate cache's entries describe, named by the variables that name it
/// rather than by the storage settings they make, so that a request the cache answers reads
/// a few variables, not every storage setting (each read is a call into Spin): the origin
/// (`storage_origin`), the account (`storage_auth`, `storage_connection_string`'s `AccountName`
/// and `storage_account`: together they say which account the settings use), the container
/// (`container`).
///
/// One scope, loaded once per request, gives every key of that request, the ones read and the
/// ones written: nothing derives a key another way. A scope names no secret (a connection
/// string's key is not part of it), and a mistake in the variables is reported where the
/// storage settings are read, at a request the cache does not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    origin: String,
    account: String,
    container: String,
}

impl Scope {
    /// Reads `kv_cache` and, when it is on, the variables the scope is made of. `None`: the
    /// cache is off.
    pub fn load(vars: &dyn Variables) -> Result<Option<Scope>, ConfigError> {
        if Mode::load(vars)? == Mode::Off {
            return Ok(None);
        }
        let origin = config::var(vars, "storage_origin").unwrap_or_default();
        let from_connection_string = config::var(vars, "storage_connection_string")
            .as_deref()
            .and_then(connection_string_account)
            .unwrap_or_default()
            .to_string();
        let named = config::var(vars, "storage_account").unwrap_or_default();
        let auth = config::var(vars, "storage_auth").unwrap_or_default();
        let container = config::var(vars, "container").unwrap_or_else(|| "leasegate".into());
        Ok(Some(Scope {
            origin: origin.trim_end_matches('/').to_string(),
            account: format!("{auth}/{from_connection_string}/{named}"),
            container,
        }))
    }

    /// [`key`] of the lock blob at `path`.
    pub fn key(&self, path: &str) -> String {
        key(&self.origin, &self.account, &self.container, path)
    }
}

/// A connection string's `AccountName` (its key is not read).
fn connection_string_account(cs: &str) -> Option<&str> {
    cs.split(';').find_map(|part| {
        let (name, value) = part.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("AccountName")
            .then(|| value.trim())
    })
}

/// [`key`] of the lock blob at `path` in `storage`'s container.
pub fn key_for(storage: &config::Storage, path: &str) -> String {
    key(
        &storage.account.endpoint().origin(),
        storage.account.name(),
        storage.container.as_str(),
        path,
    )
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// An entry: held until `until` (Unix milliseconds, the instance's clock, the margin taken off),
/// stored as `{"until": T}`. Unknown fields are ignored (a newer writer's).
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    until: u64,
}

/// The time left on a live entry under `key`. `None` for a miss, an expired or unreadable
/// entry, or a store that fails.
pub fn held(cache: &dyn Cache, key: &str, now: SystemTime) -> Option<Duration> {
    let raw = cache.get(key).ok()??;
    let Entry { until } = serde_json::from_slice(&raw).ok()?;
    let left = Duration::from_millis(until.checked_sub(millis(now))?);
    (!left.is_zero() && left <= LONGEST).then_some(left)
}

/// Records that storage holds the gate for `left` more (by its clock, as of `now`), less the
/// margin; nothing when that leaves nothing. Best effort: a failed write only costs a request.
pub fn remember(cache: &dyn Cache, key: &str, now: SystemTime, left: Duration) {
    let Some(left) = left.checked_sub(MARGIN).filter(|l| !l.is_zero()) else {
        return;
    };
    let left = left.min(LONGEST);
    let until = millis(now).saturating_add(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
    if let Ok(value) = serde_json::to_vec(&Entry { until }) {
        let _ = cache.set(key, &value);
    }
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

    fn scope(pairs: &[(&str, &str)]) -> Option<Scope> {
        let vars: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Scope::load(&vars).unwrap()
    }

    #[test]
    fn a_scope_is_named_by_origin_account_and_container() {
        let base = [
            ("storage_origin", "http://127.0.0.1:10000/"),
            ("storage_account", "devstoreaccount1"),
            ("storage_key", "c2VjcmV0"),
        ];
        let s = scope(&base).expect("on by default");
        assert_eq!(s.origin, "http://127.0.0.1:10000");
        assert_eq!(s.container, "leasegate");
        assert!(scope(&[("kv_cache", "off")]).is_none());
        let vars: HashMap<String, String> = [("kv_cache", "maybe")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert!(Scope::load(&vars).is_err());
        // Another key, SAS or timeout: the same scope. Another origin, account or container:
        // another.
        let mut same = base.to_vec();
        same[2] = ("storage_key", "b3RoZXI=");
        same.push(("storage_timeout_ms", "900"));
        assert_eq!(scope(&same), Some(s.clone()));
        for (name, value) in [
            ("storage_origin", "http://127.0.0.1:10001"),
            ("storage_account", "other"),
            ("container", "elsewhere"),
        ] {
            let mut other: Vec<(&str, &str)> =
                base.iter().copied().filter(|(k, _)| *k != name).collect();
            other.push((name, value));
            let o = scope(&other).unwrap();
            assert_ne!(o.key("alerts/d"), s.key("alerts/d"), "{name}");
        }
        // A connection string's account, not its key.
        let cs = |key: &str| {
            format!(
                "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={key};\
                 BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
            )
        };
        let (one, two) = (cs("a2V5MQ=="), cs("a2V5Mg=="));
        let a = scope(&[
            ("storage_origin", "http://127.0.0.1:10000"),
            ("storage_connection_string", &one),
        ])
        .unwrap();
        let b = scope(&[
            ("storage_origin", "http://127.0.0.1:10000"),
            ("storage_connection_string", &two),
        ])
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.account, "/devstoreaccount1/");
        // A connection string beside storage_account: which one the settings use follows
        // storage_auth (unset: the connection string's; key or sas: storage_account), and so
        // does the scope.
        let both = |auth: Option<&'static str>| {
            let mut pairs = vec![
                ("storage_origin", "http://127.0.0.1:10000"),
                ("storage_connection_string", one.as_str()),
                ("storage_account", "other"),
            ];
            pairs.extend(auth.map(|a| ("storage_auth", a)));
            scope(&pairs).unwrap().key("alerts/d")
        };
        assert_ne!(both(None), both(Some("key")));
        assert!(!format!("{a:?}").contains("a2V5MQ"));
        assert_ne!(a.key("alerts/d"), s.key("alerts/d"));
    }

    #[test]
    fn entries_last_until_their_end_less_the_margin() {
        let m = Memory::default();
        let k = key("http://o", "acct", "c", "alerts/d");
        assert_eq!(held(&m, &k, at(100)), None);
        remember(&m, &k, at(100), Duration::from_secs(60));
        assert_eq!(held(&m, &k, at(100)), Some(Duration::from_secs(57)));
        assert_eq!(held(&m, &k, at(156)), Some(Duration::from_secs(1)));
        assert_eq!(held(&m, &k, at(157)), None);
        // Nothing worth keeping under the margin.
        let short = key("http://o", "acct", "c", "alerts/short");
        remember(&m, &short, at(100), Duration::from_secs(3));
        assert_eq!(m.0.borrow().get(&short), None);
    }

    #[test]
    fn failures_and_garbage_fall_back_to_storage() {
        let mut m = Memory::default();
        let k = key("http://o", "acct", "c", "alerts/d");
        m.0.borrow_mut().insert(k.clone(), b"not json".to_vec());
        assert_eq!(held(&m, &k, at(0)), None);
        // An entry beyond what the cache ever writes is not believed.
        m.0.borrow_mut()
            .insert(k.clone(), br#"{"until":18446744073709551615}"#.to_vec());
        assert_eq!(held(&m, &k, at(0)), None);
        remember(&m, &k, at(0), Duration::from_secs(10 * 86_400));
        assert_eq!(held(&m, &k, at(0)), Some(LONGEST));
        m.1 = true;
        assert_eq!(held(&m, &k, at(0)), None);
    }

    #[test]
    fn keys_are_short_and_apart() {
        let a = key("http://o", "acct", "c", "alerts/d");
        assert_eq!(a.len(), "leasegate:held:".len() + 32);
        assert_ne!(a, key("http://o", "acct", "c2", "alerts/d"));
        assert_ne!(a, key("http://o", "acct2", "c", "alerts/d"));
        assert_ne!(key("o", "a", "bc", "d"), key("o", "ab", "c", "d"));
        assert_ne!(a, key("http://p", "acct", "c", "alerts/d"));
    }
}
