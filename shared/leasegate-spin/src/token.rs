//! Entra ID bearer tokens kept between invocations in the app's key-value store, so that a
//! hot decision costs its storage request and no token request.
//!
//! An entry holds a token **at rest in the app's own store** (`storage_token_cache = off` turns
//! that off: every invocation then asks for a token once). It is used until [`REFRESH_AHEAD`]
//! before it expires, then replaced by a fresh one. Two invocations refreshing at once each
//! fetch a token and write it: both are valid, the later write wins, nothing else happens. A
//! token storage refused is dropped before a new one is fetched (so a failing endpoint does not
//! leave it in place), and an entry that cannot be read counts as none. A kept token no longer
//! fresh still serves, while it may be sent ([`usable`]), when asking for a new one fails.

use std::time::{Duration, SystemTime};

use leasegate::token::{Token, TokenSource};
use leasegate::{AccessToken, Error};
use serde::{Deserialize, Serialize};

use crate::cache::{token_key, Cache};

/// A kept token is replaced this long before it expires (Entra ID's tokens live about an hour;
/// an invocation that takes a token just before this point still has minutes to use it).
pub const REFRESH_AHEAD: Duration = Duration::from_secs(300);

/// An entry of the store.
#[derive(Serialize, Deserialize)]
struct Entry {
    /// The token.
    token: String,
    /// When it expires, Unix seconds.
    #[serde(rename = "expiresOn")]
    expires_on: u64,
}

use leasegate::time::unix_secs;

/// Whether a token expiring at `expires_at` is still handed out at `now`.
pub fn fresh(expires_at: SystemTime, now: SystemTime) -> bool {
    now + REFRESH_AHEAD < expires_at
}

/// A token is sent only with at least this long to live: the longest a storage request may
/// take (`storage_timeout_ms` is at most a minute).
pub const USABLE_AHEAD: Duration = Duration::from_secs(60);

/// Whether a token expiring at `expires_at` may still be sent at `now` (one that is no longer
/// [`fresh`] only when no fresh one can be had: the invocation already asked for it).
pub fn usable(expires_at: SystemTime, now: SystemTime) -> bool {
    now + USABLE_AHEAD < expires_at
}

/// The token for `source` at `now`: the one kept in `cache` while [`fresh`], else one from
/// `fetch` (kept for the next invocations), else, when `fetch` fails, the kept one while
/// [`usable`]. `refresh`: storage refused the token handed out last; the kept one is dropped
/// and a new one fetched. A fixed token is handed out as it is.
pub async fn cached(
    cache: &dyn Cache,
    source: &TokenSource,
    now: SystemTime,
    refresh: bool,
    fetch: impl AsyncFnOnce() -> Result<Token, Error>,
) -> Result<Token, Error> {
    if matches!(source, TokenSource::Fixed(_)) {
        return fetch().await;
    }
    let key = token_key(source);
    let kept = if refresh {
        let _ = cache.delete(&key);
        None
    } else {
        read(cache, &key)
    };
    if let Some(token) = kept.as_ref().filter(|t| fresh(t.expires_at, now)) {
        return Ok(token.clone());
    }
    let token = match fetch().await {
        Ok(token) => token,
        // Refreshing early failed: the kept token serves while it may still be sent.
        Err(e) => match kept.filter(|t| usable(t.expires_at, now)) {
            Some(token) => return Ok(token),
            None => return Err(e),
        },
    };
    let entry = Entry {
        token: token.value.secret().to_string(),
        expires_on: unix_secs(token.expires_at),
    };
    if let Ok(bytes) = serde_json::to_vec(&entry) {
        // Best effort: without the store, the next invocation asks once more.
        let _ = cache.set(&key, &bytes);
    }
    Ok(token)
}

/// The entry under `key`, if there is a readable one.
fn read(cache: &dyn Cache, key: &str) -> Option<Token> {
    let bytes = cache.get(key).ok()??;
    let entry: Entry = serde_json::from_slice(&bytes).ok()?;
    Some(Token {
        value: AccessToken::try_new(&entry.token).ok()?,
        // An entry no clock can hold is unreadable, not a panic.
        expires_at: SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(entry.expires_on))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Unavailable;
    use leasegate::token::ClientSecret;
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    #[derive(Default)]
    struct Store {
        entries: RefCell<HashMap<String, Vec<u8>>>,
        broken: bool,
    }

    impl Cache for Store {
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Unavailable> {
            if self.broken {
                return Err(Unavailable);
            }
            Ok(self.entries.borrow().get(key).cloned())
        }
        fn set(&self, key: &str, value: &[u8]) -> Result<(), Unavailable> {
            if self.broken {
                return Err(Unavailable);
            }
            self.entries.borrow_mut().insert(key.into(), value.to_vec());
            Ok(())
        }
        fn delete(&self, key: &str) -> Result<(), Unavailable> {
            self.entries.borrow_mut().remove(key);
            Ok(())
        }
    }

    fn source() -> TokenSource {
        TokenSource::ClientSecret(
            ClientSecret::new("https://login.example", "t", "c", "the-client-secret").unwrap(),
        )
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// Fetches `tok{n}` expiring an hour after `now`, counting.
    fn get(store: &Store, now: u64, refresh: bool, fetched: &Cell<u32>) -> String {
        let token = pollster::block_on(cached(store, &source(), at(now), refresh, async || {
            fetched.set(fetched.get() + 1);
            Ok(Token {
                value: AccessToken::try_new(&format!("tok{}", fetched.get())).unwrap(),
                expires_at: at(now + 3600),
            })
        }))
        .unwrap();
        token.value.secret().to_string()
    }

    #[test]
    fn a_kept_token_serves_until_shortly_before_it_expires() {
        let store = Store::default();
        let fetched = Cell::new(0);
        assert_eq!(get(&store, 1000, false, &fetched), "tok1");
        assert_eq!(get(&store, 1001, false, &fetched), "tok1");
        assert_eq!(get(&store, 1000 + 3600 - 301, false, &fetched), "tok1");
        assert_eq!(fetched.get(), 1);
        // Within REFRESH_AHEAD of its expiry: a new one.
        assert_eq!(get(&store, 1000 + 3600 - 300, false, &fetched), "tok2");
        assert_eq!(fetched.get(), 2);
        let entry =
            String::from_utf8(store.entries.borrow().values().next().unwrap().clone()).unwrap();
        assert!(entry.contains("\"tok2\""), "{entry}");
        assert!(!entry.contains("the-client-secret"), "{entry}");
        assert!(!token_key(&source()).contains("the-client-secret"));
    }

    #[test]
    fn a_refused_token_is_dropped_then_replaced() {
        let store = Store::default();
        let fetched = Cell::new(0);
        assert_eq!(get(&store, 1000, false, &fetched), "tok1");
        assert_eq!(get(&store, 1000, true, &fetched), "tok2");
        assert_eq!(get(&store, 1001, false, &fetched), "tok2");

        // The endpoint fails on the refresh: the refused token is gone all the same.
        let failed = pollster::block_on(cached(&store, &source(), at(1002), true, async || {
            Err(Error::InvalidArgument("down".into()))
        }));
        assert!(failed.is_err());
        assert!(store.entries.borrow().is_empty());
    }

    #[test]
    fn a_kept_token_serves_while_its_early_refresh_fails_and_it_may_still_be_sent() {
        let store = Store::default();
        let fetched = Cell::new(0);
        assert_eq!(get(&store, 1000, false, &fetched), "tok1");
        let failing = |now: u64, refresh: bool| {
            pollster::block_on(cached(&store, &source(), at(now), refresh, async || {
                Err(Error::InvalidArgument("down".into()))
            }))
            .map(|t| t.value.secret().to_string())
        };
        // Two minutes left: no longer fresh, still usable.
        assert_eq!(failing(1000 + 3600 - 120, false).unwrap(), "tok1");
        // Half a minute left: not sent any more.
        assert!(failing(1000 + 3600 - 30, false).is_err());
        // Refused by storage: never handed out again.
        assert!(failing(1000 + 3600 - 120, true).is_err());
    }

    #[test]
    fn system_assigned_identities_of_two_apps_sharing_a_store_do_not_meet() {
        // Every App Service app has the same IDENTITY_ENDPOINT; its header tells it apart.
        let identity = |header: &str| {
            TokenSource::ManagedIdentity(
                leasegate::token::ManagedIdentity::new(
                    "http://localhost:8081/msi/token",
                    header,
                    None,
                )
                .unwrap(),
            )
        };
        let (a, b) = (identity("header-of-app-a"), identity("header-of-app-b"));
        assert_ne!(token_key(&a), token_key(&b));
        assert_eq!(token_key(&a), token_key(&identity("header-of-app-a")));
        assert!(!token_key(&a).contains("header-of-app-a"));
        assert!(!a.identity().contains("header-of-app-a"));
    }

    #[test]
    fn a_broken_store_or_entry_means_asking() {
        let store = Store {
            broken: true,
            ..Store::default()
        };
        let fetched = Cell::new(0);
        assert_eq!(get(&store, 1000, false, &fetched), "tok1");
        assert_eq!(get(&store, 1000, false, &fetched), "tok2");

        for unreadable in [
            &b"not json"[..],
            br#"{"token":"tok0","expiresOn":18446744073709551615}"#,
        ] {
            let store = Store::default();
            store
                .entries
                .borrow_mut()
                .insert(token_key(&source()), unreadable.to_vec());
            let fetched = Cell::new(0);
            assert_eq!(get(&store, 1000, false, &fetched), "tok1");
            assert_eq!(get(&store, 1001, false, &fetched), "tok1");
        }
    }
}
