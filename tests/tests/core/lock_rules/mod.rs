//! The lock rules, against a real Azurite: one holder per lock whatever window each caller asks
//! for (native leases and lease records mixed, first use included), fencing tokens that never
//! go back (across kinds, extensions, a deleted lock blob), nothing left taken when a step
//! after the acquisition fails, and clear errors for garbage in a lock blob.

use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime};

use leasegate::lease::{
    Acquire, Acquired, Acquiring, IdOrigin, LockStatus, Locks, Release, Start, Term,
};
use leasegate::ops::{Condition, DeleteBlob, DeleteOutcome, GetProperties, Metadata, SetMetadata};
use leasegate::{ContainerName, LeaseId, LockName, Transport, TransportError};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::{describe, unique_container, wait_for, Azurite, Faulty, Step};

mod failures;
mod holders;
mod windows_and_tokens;

fn locks(container: &ContainerName) -> Locks<NativeTransport> {
    Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        container.clone(),
    )
}

fn faulty(
    container: &ContainerName,
    rule: impl Fn(usize, &leasegate::Request) -> Step + Send + Sync + 'static,
) -> Locks<Faulty<NativeTransport>> {
    Locks::new(
        Faulty::new(NativeTransport::default(), rule),
        Azurite::shared().account(),
        container.clone(),
    )
}

fn lock(name: &str) -> LockName {
    LockName::try_new(name).unwrap()
}

fn random_id() -> LeaseId {
    LeaseId::from_random_bytes(*uuid::Uuid::new_v4().as_bytes())
}

fn term(secs: u64) -> Term {
    Term::for_window(Duration::from_secs(secs)).unwrap()
}

fn acquire<T: leasegate::Transport>(
    l: &Locks<T>,
    name: &LockName,
    secs: u64,
    id: LeaseId,
) -> Acquire {
    block_on(l.acquire(name, Acquiring::new(term(secs), id), SystemTime::now())).unwrap()
}

/// Faults the first request that `describe`s as `target` (and only that one).
fn first(target: &'static str, step: Step) -> impl Fn(usize, &leasegate::Request) -> Step {
    let hit = std::sync::atomic::AtomicBool::new(false);
    move |_, request| {
        if describe(request) == target && !hit.swap(true, std::sync::atomic::Ordering::SeqCst) {
            step.clone()
        } else {
            Step::Pass
        }
    }
}

fn release_of<T: leasegate::Transport>(l: &Locks<T>, name: &LockName, id: LeaseId) -> Release {
    block_on(l.release(name, id, Start::Read, SystemTime::now()))
        .unwrap()
        .0
}

fn held(outcome: Acquire) -> Acquired {
    match outcome {
        Acquire::Acquired(a) => a,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

fn token(a: &Acquired) -> u64 {
    a.fencing_token.expect("a fencing token")
}

fn release<T: leasegate::Transport>(l: &Locks<T>, name: &LockName, id: LeaseId) {
    block_on(l.release(name, id, Start::Read, SystemTime::now())).unwrap();
}
