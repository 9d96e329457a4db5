//! The lease algorithms against a real Azurite: contention, extension, expiry, fencing tokens,
//! lease records judged by the server's clock, and round trips counted per decision.

use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime};

use leasegate::lease::{
    Acquire, Acquired, Acquiring, LockInfo, LockStatus, Locks, Release, Start, Term,
};
use leasegate::ops::{GetProperties, ListBlobs};
use leasegate::{ContainerName, Counting, HolderKey, LeaseId, LeaseState, LockName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::{unique_container, wait_for, Azurite};

mod acquire_release;
mod held;
mod requests_and_names;

fn locks(container: &ContainerName) -> Locks<NativeTransport> {
    Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        container.clone(),
    )
}

fn lock(name: &str) -> LockName {
    LockName::try_new(name).unwrap()
}

fn key() -> HolderKey {
    HolderKey::try_new(b"test holder key").unwrap()
}

fn random_id() -> LeaseId {
    LeaseId::from_random_bytes(*uuid::Uuid::new_v4().as_bytes())
}

fn native(secs: u64) -> Term {
    let term = Term::for_window(Duration::from_secs(secs)).unwrap();
    assert!(matches!(term, Term::Native(_)));
    term
}

fn record(secs: u64) -> Term {
    let term = Term::for_window(Duration::from_secs(secs)).unwrap();
    assert!(matches!(term, Term::Record(_)));
    term
}

fn acquire<T: leasegate::Transport>(
    l: &Locks<T>,
    name: &LockName,
    term: Term,
    id: LeaseId,
) -> Acquire {
    block_on(l.acquire(name, Acquiring::new(term, id), SystemTime::now())).unwrap()
}

fn held(outcome: Acquire) -> Acquired {
    match outcome {
        Acquire::Acquired(a) => a,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

type CountedLocks<'a> = Locks<&'a Counting<&'a NativeTransport>>;

/// Runs one decision through a counting transport: its outcome and the requests it sent.
fn counted<R>(base: &Locks<NativeTransport>, decide: impl FnOnce(&CountedLocks) -> R) -> (R, u32) {
    let transport = base.transport();
    let counting = Counting::new(transport);
    let l = Locks::new(&counting, base.account().clone(), base.container().clone());
    let outcome = decide(&l);
    (outcome, counting.sent())
}

fn is_acquired(outcome: &Acquire) -> bool {
    matches!(outcome, Acquire::Acquired(_))
}
