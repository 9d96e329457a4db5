//! The restartable Azurite the soak restarts (`Azurite::start_restartable`): stopped, it
//! refuses connections; started again on its port with its data folder, it still has every
//! blob with its ETag, `Last-Modified` and metadata, so lease records and fencing tokens go on
//! as before. Its native blob leases do not survive (an emulator difference, below): the soak
//! keeps every window a lease record.

use std::net::TcpStream;
use std::time::{Duration, SystemTime};

use leasegate::lease::{Acquire, Acquiring, Locks, Term};
use leasegate::ops::{build, BlobProperties, GetProperties, Operation};
use leasegate::{Account, BlobName, ContainerName, LeaseId, LockName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::{unique_container, Azurite};

fn random_id() -> LeaseId {
    LeaseId::from_random_bytes(*uuid::Uuid::new_v4().as_bytes())
}

fn acquire(locks: &Locks<NativeTransport>, name: &LockName, secs: u64, id: LeaseId) -> Acquire {
    let term = Term::for_window(Duration::from_secs(secs)).unwrap();
    block_on(locks.acquire(name, Acquiring::new(term, id), SystemTime::now())).unwrap()
}

fn token(outcome: &Acquire) -> u64 {
    match outcome {
        Acquire::Acquired(a) => a.fencing_token.unwrap(),
        other => panic!("expected to acquire, got {other:?}"),
    }
}

/// The lock blob's properties (the lock `name` is the blob `locks/{name}`).
fn lock_blob(account: &Account, container: &ContainerName, name: &str) -> BlobProperties {
    let op = GetProperties {
        container: container.clone(),
        blob: BlobName::try_new(&format!("locks/{name}")).unwrap(),
    };
    let request = build(&op, account, SystemTime::now()).unwrap();
    let response = NativeTransport::default().send_blocking(request).unwrap();
    op.parse(&response).unwrap().expect("the lock blob exists")
}

fn restart(azurite: &Azurite) {
    azurite.stop();
    assert!(
        TcpStream::connect(azurite.authority()).is_err(),
        "a stopped Azurite refuses connections"
    );
    let took = azurite.start_again();
    println!("started again in {took:?}");
}

#[test]
fn a_restarted_azurite_keeps_blobs_lease_records_and_tokens() {
    let azurite = Azurite::start_restartable();
    let container = unique_container("restart");
    let locks = Locks::new(
        NativeTransport::default(),
        azurite.account(),
        container.clone(),
    );
    let (native, record) = (
        LockName::try_new("restart/native").unwrap(),
        LockName::try_new("restart/record").unwrap(),
    );
    let first = token(&acquire(&locks, &native, 60, random_id()));
    token(&acquire(&locks, &record, 120, random_id()));
    let before = lock_blob(&azurite.account(), &container, "restart/record");

    restart(&azurite);

    let after = lock_blob(&azurite.account(), &container, "restart/record");
    assert_eq!(
        (after.etag, after.last_modified, after.metadata),
        (before.etag, before.last_modified, before.metadata)
    );
    // The record still holds its lock: another id is refused.
    let other = acquire(&locks, &record, 120, random_id());
    assert!(matches!(other, Acquire::Busy { .. }), "{other:?}");
    // The next holder of the native lock gets a larger token.
    let next = token(&acquire(&locks, &native, 60, random_id()));
    assert!(next > first, "{next} after {first}");
}

/// Azurite 3.35 saves a lease's expiry as a date and reads it back as a string; `startTime <
/// leaseExpireTime` (`lease/LeaseFactory.js`) is then false, so after a restart every native
/// lease counts as expired and another id acquires it. Azure keeps a lease across any failover
/// of its own. If this starts failing, Azurite keeps leases now: the soak may use native
/// windows (15-60 s) again.
#[test]
fn a_restarted_azurite_forgets_its_native_leases() {
    let azurite = Azurite::start_restartable();
    let locks = Locks::new(
        NativeTransport::default(),
        azurite.account(),
        unique_container("restartnative"),
    );
    let native = LockName::try_new("restart/native").unwrap();
    token(&acquire(&locks, &native, 60, random_id()));
    let before = acquire(&locks, &native, 60, random_id());
    assert!(matches!(before, Acquire::Busy { .. }), "{before:?}");

    restart(&azurite);

    let after = acquire(&locks, &native, 60, random_id());
    assert!(
        matches!(after, Acquire::Acquired(_)),
        "Azurite kept its lease across a restart: {after:?}"
    );
}
