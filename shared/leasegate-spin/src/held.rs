//! What a holder keeps of its lock between calls, in Spin's key-value store: the lock blob as
//! its own last write left it ([`leasegate::lease::HeldState`]). The gate's holders and the
//! leader extend and release from it without reading the lock first
//! ([`leasegate::lease::Start::Held`]).
//!
//! **It never decides anything on its own.** Every request made from a kept state is
//! conditional on its ETag, so a state that is stale (another deployment with its own store
//! wrote the lock since, an entry left behind by a race, a store that lost a write) costs one
//! refused request; the call then reads the lock and decides as it would have without it. The
//! store has no compare-and-swap, and needs none: an entry is a hint.
//!
//! The entry's key is the lock blob's [`Scope::holder_key`] (the blob endpoint in full, the
//! container and the lock blob's path): one entry a lock, the latest holder's that acquired
//! through the deployment. Its value names that holder's lease id (as the lock blob's own
//! metadata does): the store is the deployment's own; nothing in it reaches an answer or a log.

use std::time::SystemTime;

use leasegate::lease::{Acquire, Acquired, Acquiring, HeldState, IdOrigin, Locks, Release, Start};
use leasegate::{Error, LeaseId, LockName, Transport};

use crate::cache::{Cache, Scope};

/// [`Locks::acquire`] through `cache`: a holder's own id ([`IdOrigin::Known`]) extends from
/// the state kept of its last call, if there is one ([`Start::Held`], in place of `how`'s
/// start); the grant is kept for the next call, and a kept state that proved of no more use
/// (another holder's lock now, a failure) is forgotten.
pub async fn acquire<T: Transport>(
    cache: &dyn Cache,
    locks: &Locks<T>,
    lock: &LockName,
    how: Acquiring<'_>,
    now: SystemTime,
) -> Result<Acquire, Error> {
    let key = key(locks, lock);
    let kept = match how.origin {
        IdOrigin::Known => recall(cache, &key, how.lease_id),
        IdOrigin::Fresh => None,
    };
    let how = match &kept {
        Some(kept) => how.start(Start::Held(kept)),
        None => how,
    };
    let acquired = locks.acquire(lock, how, now).await;
    match &acquired {
        Ok(Acquire::Acquired(a)) => keep(cache, &key, a, kept.as_ref()),
        _ if kept.is_some() => forget(cache, &key),
        _ => {}
    }
    acquired
}

/// [`Locks::release`] through `cache`: from the state kept of the holder's last call, if there
/// is one ([`Start::Held`]), which is then forgotten.
pub async fn release<T: Transport>(
    cache: &dyn Cache,
    locks: &Locks<T>,
    lock: &LockName,
    lease_id: LeaseId,
    now: SystemTime,
) -> Result<Release, Error> {
    let key = key(locks, lock);
    let Some(kept) = recall(cache, &key, lease_id) else {
        return Ok(locks.release(lock, lease_id, Start::Read, now).await?.0);
    };
    let released = locks.release(lock, lease_id, Start::Held(&kept), now).await;
    forget(cache, &key);
    Ok(released?.0)
}

/// Forgets `lease_id`'s kept state of `lock` (another holder's is left alone): the holder wrote
/// the lock some other way (a step-down's bar), so what was kept is stale.
pub fn forget_own<T: Transport>(
    cache: &dyn Cache,
    locks: &Locks<T>,
    lock: &LockName,
    lease_id: LeaseId,
) {
    let key = key(locks, lock);
    if recall(cache, &key, lease_id).is_some() {
        forget(cache, &key);
    }
}

/// The entry's key for a hold on `lock` ([`Scope::holder_key`]): one entry a lock (the latest
/// holder that acquired through this deployment), so that the entries are as many as the locks
/// the deployment served, however many holders came and went.
pub fn key<T: Transport>(locks: &Locks<T>, lock: &LockName) -> String {
    Scope::of_locks(locks).holder_key(&locks.lock_path(lock))
}

/// `lease_id`'s state kept under `key`, if there is one that can be used (a store that fails,
/// an entry that cannot be read, another holder's entry: no state, a read more).
pub fn recall(cache: &dyn Cache, key: &str, lease_id: LeaseId) -> Option<HeldState> {
    let raw = cache.get(key).ok()??;
    HeldState::from_json(std::str::from_utf8(&raw).ok()?).filter(|s| s.is_held_by(lease_id))
}

/// Keeps what `acquired` left for the holder's next call, unless that is what was `kept`
/// already (an extension that wrote nothing: no write to the store). Best effort: a store that
/// fails costs that call a read.
pub fn keep(cache: &dyn Cache, key: &str, acquired: &Acquired, kept: Option<&HeldState>) {
    match acquired.held_state() {
        Some(state) if kept == Some(&state) => {}
        Some(state) => {
            let _ = cache.set(key, state.to_json().as_bytes());
        }
        None => forget(cache, key),
    }
}

/// Drops the state under `key`: the lock was released, or another holds it.
pub fn forget(cache: &dyn Cache, key: &str) {
    let _ = cache.delete(key);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Unused;

    impl Transport for Unused {
        async fn send(
            &self,
            _request: leasegate::Request,
        ) -> Result<leasegate::Response, leasegate::TransportError> {
            unreachable!("keys send nothing")
        }
    }

    fn storage(container: &str) -> crate::config::Storage {
        let vars: HashMap<String, String> = [
            ("storage_account", "devstoreaccount1"),
            ("storage_origin", "http://127.0.0.1:10000"),
            ("storage_key", "a2V5"),
            ("container", container),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        crate::config::storage(&vars).unwrap()
    }

    #[test]
    fn keys_differ_by_lock_and_container_and_show_neither() {
        let (one, two) = (storage("leases"), storage("other"));
        let (locks, other) = (one.locks(&Unused, "gates/"), two.locks(&Unused, "gates/"));
        let x = LockName::try_new("x").unwrap();
        let y = LockName::try_new("y").unwrap();
        let k = key(&locks, &x);
        assert_eq!(k, key(&locks, &x));
        assert_ne!(k, key(&locks, &y));
        assert_ne!(k, key(&other, &x));
        assert!(!k.contains("gates") && !k.contains("leases"), "{k}");
    }
}
