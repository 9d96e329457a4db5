//! The harness's shifted clocks: an Azurite under `faketime` dates its answers at the shifted
//! time, and an app under [`Setup::azurite_same_clock`] (Spin and its storage on one shifted
//! clock, two deployments sharing a container) writes its blobs to that Azurite, at that time:
//! what a test of a decision by the server's `Date` near a chosen instant (a DST change) needs.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasegate::lease::Locks;
use leasegate::ops::{CreateContainer, GetProperties};
use leasegate::{BlobClient, LockName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{build_components, call, App, Setup, GATE_TOKEN};
use leasegate_tests::{offset_to, unique_container, Azurite};

/// 10 s before the US Eastern switch to daylight time (2026-03-08 02:00 EST = 07:00Z).
const TARGET: &str = "2026-03-08T06:59:50Z";

fn target() -> SystemTime {
    humantime::parse_rfc3339(TARGET).unwrap()
}

fn target_unix() -> u64 {
    target().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// Seconds from `TARGET` to `t` (negative: before it).
fn after_target(t: SystemTime) -> f64 {
    match t.duration_since(target()) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// A `Date` (or Last-Modified) a few seconds after `TARGET`: the shifted clock has run on for as
/// long as it took to start what runs under it (`spare` seconds allowed), and is far from the
/// real clock.
fn assert_near_target(what: &str, t: SystemTime, spare: f64) {
    let after = after_target(t);
    assert!(
        (-2.0..=spare).contains(&after),
        "{what} is {after:.1} s after {TARGET}: {}",
        humantime::format_rfc3339_seconds(t)
    );
}

#[test]
fn offset_to_puts_a_clock_at_the_target() {
    let offset = offset_to(target_unix());
    let shifted = SystemTime::now()
        .checked_add(Duration::from_millis(offset.max(0) as u64))
        .and_then(|t| t.checked_sub(Duration::from_millis((-offset).max(0) as u64)))
        .unwrap();
    assert!(after_target(shifted).abs() < 1.0, "{offset} ms");
}

#[test]
fn an_azurite_at_an_offset_dates_its_answers_at_that_time() {
    let started = std::time::Instant::now();
    let azurite = Azurite::start_with_clock_offset(offset_to(target_unix()));
    // The shifted clock ran on while Azurite started (seconds on a loaded machine).
    let spare = 10.0 + started.elapsed().as_secs_f64();
    // The project's own client: it returns the server's `Date` with each answer.
    let container = unique_container("clock");
    let client = BlobClient::new(
        NativeTransport::default(),
        azurite.account(),
        container.clone(),
    );
    let (_, date) = block_on(client.execute(&CreateContainer { container }, SystemTime::now()))
        .expect("Azurite at the shifted clock answers a SharedKey request signed by real time");
    assert_near_target("Azurite's Date", date.expect("a Date header"), spare);
    // Dropped, it stops (Azurite is a child of the wrapper `run.js` we started).
    let addr = SocketAddr::from(([127, 0, 0, 1], azurite.port()));
    drop(azurite);
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err(),
        "Azurite still listens on {addr} after it was dropped"
    );
}

#[test]
fn an_app_and_its_storage_share_a_shifted_clock() {
    // Built first: the shifted clocks run on from the target from the moment it is computed.
    build_components();
    let offset = offset_to(target_unix());
    let container = unique_container("clockapp");
    let setup = Setup {
        clock_offset_ms: offset,
        azurite_same_clock: true,
        container: Some(container.clone()),
        ..Setup::default()
    };
    let first = App::start_with("clockapp", &[("instance_id", "node-a")], setup.clone());
    let second = App::start_with("clockapp", &[("instance_id", "node-b")], setup);
    // One Azurite for the offset, shared by both deployments; not the shared one.
    let azurite = Azurite::at_clock_offset(offset);
    assert!(std::ptr::eq(first.azurite(), azurite));
    assert!(std::ptr::eq(second.azurite(), azurite));
    assert!(!std::ptr::eq(azurite, Azurite::shared()));
    assert_eq!(azurite.clock_offset_ms(), offset);

    let auth = format!("Bearer {GATE_TOKEN}");
    let headers = [("authorization", auth.as_str())];
    let taken = call(
        "POST",
        &first.url("/api/gate/dst-edge?window=30"),
        &headers,
        b"",
    );
    assert_eq!(taken.status, 200, "{}", taken.text);
    let expires = humantime::parse_rfc3339(taken.json["expiresAt"].as_str().unwrap()).unwrap();
    assert_near_target("the gate's expiry", expires, 30.0 + 60.0);
    // The other deployment sees it held: the same storage.
    let busy = call(
        "POST",
        &second.url("/api/gate/dst-edge?window=30"),
        &headers,
        b"",
    );
    assert_eq!(busy.status, 429, "{}", busy.text);

    // The lock blob is in the shifted Azurite, written at the shifted time.
    let locks = Locks::new(
        NativeTransport::default(),
        first.inspect_account(),
        container.clone(),
    )
    .with_prefix("gates/");
    let blob = locks
        .blob_name(&LockName::try_new("dst-edge").unwrap())
        .unwrap();
    let get = GetProperties {
        container: container.clone(),
        blob,
    };
    let (props, date) = block_on(locks.client().execute(&get, SystemTime::now())).unwrap();
    let modified = props
        .expect("the lock blob is in the app's Azurite")
        .last_modified
        .unwrap();
    assert_near_target("the lock blob's Last-Modified", modified, 60.0);
    let date = date.expect("a Date header");
    assert!(
        date >= modified && date <= modified + Duration::from_secs(30),
        "Date {date:?}, Last-Modified {modified:?}"
    );
    // And not in the shared Azurite.
    let shared = BlobClient::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        container,
    );
    match block_on(shared.execute(&get, SystemTime::now())) {
        Ok((None, _)) => {}
        Err(e) if e.class() == Some(leasegate::ErrorClass::ContainerMissing) => {}
        other => panic!("the shared Azurite has the app's container: {other:?}"),
    }
    first.assert_no_trap();
    second.assert_no_trap();
}
