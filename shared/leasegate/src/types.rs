//! Small value types shared by the operations: lease ids, ETags, lease states, durations.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

use crate::names::LockName;
use crate::Error;

/// A lease id: a GUID.
///
/// Two kinds are useful: a **stable** id for a holder that should extend what it holds when it
/// acquires again (a leader, a job runner), derived with [`LeaseId::for_holder`] so a stateless
/// instance needs to store nothing; and a **fresh** id per event for a throttle
/// ([`LeaseId::from_random_bytes`]), so that two events never both win.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(Uuid);

impl LeaseId {
    /// Parses a GUID (`8-4-4-4-12` hex, any case).
    pub fn try_new(s: &str) -> Result<Self, Error> {
        Uuid::try_parse(s.trim())
            .map(LeaseId)
            .map_err(|_| Error::InvalidArgument("lease id must be a GUID (8-4-4-4-12 hex)".into()))
    }

    /// The stable id of `holder` for `lock` under `key`, for one `purpose` (`"leader"`, ...):
    /// the same on every invocation and every instance that shares the key, and impossible to
    /// compute without the key (a lease id lets whoever knows it extend or release the lock).
    /// Ids of different purposes never coincide, whatever the holder and lock names (each part
    /// is length-prefixed). An HMAC-SHA256 as a version 8 (custom) UUID.
    pub fn for_holder(key: &HolderKey, purpose: &str, holder: &str, lock: &LockName) -> Self {
        let mut mac = key.mac();
        mac.update(b"leasegate lease id v2\0");
        for part in [purpose, holder, lock.as_str()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        let digest = mac.finalize().into_bytes();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        LeaseId(uuid::Builder::from_custom_bytes(bytes).into_uuid())
    }

    /// A fresh (version 4) id from 16 random bytes the caller provides (the core has no
    /// randomness source of its own).
    pub fn from_random_bytes(bytes: [u8; 16]) -> Self {
        LeaseId(uuid::Builder::from_random_bytes(bytes).into_uuid())
    }
}

/// The secret that holder-derived lease ids are keyed with ([`LeaseId::for_holder`]): a
/// configured secret of its own (never derived from a storage credential, which may change or,
/// with Entra ID, not exist). Every instance of one application must use the same key. `Debug`
/// never shows it.
#[derive(Clone)]
pub struct HolderKey(Vec<u8>);

impl HolderKey {
    /// A key from secret bytes (a configured secret; at least 16 bytes are advised).
    pub fn try_new(secret: &[u8]) -> Result<Self, Error> {
        if secret.is_empty() {
            return Err(Error::InvalidArgument(
                "the holder key must not be empty".into(),
            ));
        }
        Ok(HolderKey(secret.to_vec()))
    }

    fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC-SHA256 takes keys of any length")
    }
}

impl std::fmt::Debug for HolderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HolderKey(<redacted>)")
    }
}

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}

/// An entity tag, kept without its quotes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ETag(String);

impl ETag {
    /// Takes an ETag as a header or a listing shows it, with or without quotes.
    pub fn new(raw: &str) -> Self {
        let raw = raw.trim();
        let raw = raw.strip_prefix("W/").unwrap_or(raw);
        ETag(raw.trim_matches('"').to_string())
    }

    /// The quoted form for `If-Match`.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// The tag without quotes.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `x-ms-lease-state` / `<LeaseState>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// No lease.
    Available,
    /// Held.
    Leased,
    /// Held once, now run out.
    Expired,
    /// Being broken; still held until the break period ends.
    Breaking,
    /// Broken; free to acquire.
    Broken,
}

impl LeaseState {
    /// Parses the lowercase wire form.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "available" => LeaseState::Available,
            "leased" => LeaseState::Leased,
            "expired" => LeaseState::Expired,
            "breaking" => LeaseState::Breaking,
            "broken" => LeaseState::Broken,
            _ => return None,
        })
    }

    /// True while someone holds the lease (leased or breaking).
    pub fn is_held(self) -> bool {
        matches!(self, LeaseState::Leased | LeaseState::Breaking)
    }
}

/// The duration of a native blob lease: 15 to 60 seconds, or infinite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseDuration {
    /// 15..=60 seconds.
    Seconds(u8),
    /// Until released or broken.
    Infinite,
}

impl LeaseDuration {
    /// Validates a duration in seconds (15 to 60; -1 for infinite).
    pub fn try_from_secs(secs: i64) -> Result<Self, Error> {
        match secs {
            -1 => Ok(LeaseDuration::Infinite),
            15..=60 => Ok(LeaseDuration::Seconds(secs as u8)),
            _ => Err(Error::InvalidArgument(format!(
                "a blob lease lasts 15 to 60 seconds or -1 (infinite), got {secs}"
            ))),
        }
    }

    /// The `x-ms-lease-duration` value.
    pub fn header_value(self) -> String {
        match self {
            LeaseDuration::Seconds(s) => s.to_string(),
            LeaseDuration::Infinite => "-1".into(),
        }
    }

    /// The length, `None` for infinite.
    pub fn as_duration(self) -> Option<Duration> {
        match self {
            LeaseDuration::Seconds(s) => Some(Duration::from_secs(u64::from(s))),
            LeaseDuration::Infinite => None,
        }
    }
}

pub(crate) use crate::time::unix_secs;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_ids_are_stable_distinct_and_keyed() {
        let key = HolderKey::try_new(b"a server-side secret").unwrap();
        let lock = LockName::try_new("jobs/nightly").unwrap();
        let a1 = LeaseId::for_holder(&key, "leader", "node-a", &lock);
        let a2 = LeaseId::for_holder(&key, "leader", "node-a", &lock);
        let b = LeaseId::for_holder(&key, "leader", "node-b", &lock);
        let other = LeaseId::for_holder(
            &key,
            "leader",
            "node-a",
            &LockName::try_new("jobs/hourly").unwrap(),
        );
        assert_eq!(a1, a2);
        assert_ne!(a1, b);
        assert_ne!(a1, other);
        assert_eq!(LeaseId::try_new(&a1.to_string()).unwrap(), a1);
        // Without the key nobody can compute it.
        let guess = HolderKey::try_new(b"another secret").unwrap();
        assert_ne!(LeaseId::for_holder(&guess, "leader", "node-a", &lock), a1);
        assert_eq!(&a1.to_string()[14..15], "8", "a version 8 UUID: {a1}");
        assert!(!format!("{key:?}").contains("secret"));
    }

    #[test]
    fn purposes_never_share_an_id() {
        let key = HolderKey::try_new(b"k").unwrap();
        let group = LockName::try_new("group").unwrap();
        assert_ne!(
            LeaseId::for_holder(&key, "gate", "x", &group),
            LeaseId::for_holder(&key, "leader", "x", &group)
        );
        // Parts cannot slide into each other.
        assert_ne!(
            LeaseId::for_holder(&key, "ab", "c", &group),
            LeaseId::for_holder(&key, "a", "bc", &group)
        );
    }

    #[test]
    fn random_ids_are_v4() {
        let id = LeaseId::from_random_bytes([7; 16]).to_string();
        assert_eq!(&id[14..15], "4", "{id}");
    }

    #[test]
    fn etags_lose_their_quotes() {
        assert_eq!(ETag::new("\"0x8D1\"").as_str(), "0x8D1");
        assert_eq!(ETag::new("0x8D1").quoted(), "\"0x8D1\"");
        assert_eq!(ETag::new("W/\"x\"").as_str(), "x");
    }

    #[test]
    fn lease_durations() {
        assert!(LeaseDuration::try_from_secs(14).is_err());
        assert!(LeaseDuration::try_from_secs(61).is_err());
        assert_eq!(
            LeaseDuration::try_from_secs(-1).unwrap().header_value(),
            "-1"
        );
        assert_eq!(
            LeaseDuration::try_from_secs(15).unwrap().header_value(),
            "15"
        );
    }
}
