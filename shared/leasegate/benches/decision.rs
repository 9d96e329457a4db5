//! The core's CPU cost per lease decision: build + sign the acquire request, parse the answer.
//! Prints microseconds per decision; asserts nothing about speed. Run with
//! `cargo bench -p leasegate --bench decision`.
// A benchmark reads the clock to measure itself; the core never does.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime};

use leasegate::ops::{build, Condition, GetProperties, Lease, LeaseAction, Operation};
use leasegate::{Account, BlobName, ContainerName, HolderKey, LeaseDuration, LeaseId, LockName};

fn measure(label: &str, iterations: u32, mut decide: impl FnMut()) {
    for _ in 0..iterations / 10 {
        decide(); // warm up
    }
    let start = Instant::now();
    for _ in 0..iterations {
        decide();
    }
    let per = start.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
    println!("{label:<58} {per:>8.2} µs/decision  ({iterations} iterations)");
}

fn main() {
    let account = Account::from_connection_string("UseDevelopmentStorage=true").unwrap();
    let container = ContainerName::try_new("leasegate").unwrap();
    let lock = LockName::try_new("devices/sensor-0042").unwrap();
    let key = HolderKey::try_new(b"bench secret").unwrap();
    let holder = LeaseId::for_holder(&key, "node-a", &lock);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_096_800);
    let op = Lease {
        container: container.clone(),
        blob: lock.blob_name("locks/").unwrap(),
        action: LeaseAction::Acquire {
            duration: LeaseDuration::Seconds(15),
            proposed: holder,
        },
        condition: Condition::None,
    };
    let acquired = http::Response::builder()
        .status(201)
        .header("x-ms-lease-id", holder.to_string())
        .header("etag", "\"0x8DB1A2B3C4D5E6F\"")
        .header("date", "Sat, 21 Nov 2026 14:00:00 GMT")
        .header("x-ms-request-id", "0f6d1b0e-501e-0035-5a1c-1c2b3a000000")
        .body(Vec::new())
        .unwrap();
    let busy = http::Response::builder()
        .status(409)
        .header("x-ms-error-code", "LeaseAlreadyPresent")
        .header("date", "Sat, 21 Nov 2026 14:00:00 GMT")
        .body(b"<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>LeaseAlreadyPresent</Code><Message>There is already a lease present.</Message></Error>".to_vec())
        .unwrap();
    let n = 20_000;
    measure(
        "native acquire: validate name + build + sign + parse 201",
        n,
        || {
            let name = LockName::try_new(black_box("devices/sensor-0042")).unwrap();
            let op = Lease {
                blob: name.blob_name("locks/").unwrap(),
                ..op.clone()
            };
            let request = build(&op, &account, now).unwrap();
            black_box(&request);
            black_box(op.parse(&acquired).unwrap());
        },
    );
    measure("native acquire, busy: build + sign + parse 409", n, || {
        let request = build(&op, &account, now).unwrap();
        black_box(&request);
        black_box(op.parse(&busy).unwrap());
    });
    let head = GetProperties {
        container,
        blob: BlobName::try_new("locks/x").unwrap(),
    };
    let props = http::Response::builder()
        .status(200)
        .header("etag", "\"0x8DB1A2B3C4D5E6F\"")
        .header("date", "Sat, 21 Nov 2026 14:00:00 GMT")
        .header("x-ms-lease-state", "available")
        .header("x-ms-blob-sequence-number", "41")
        .header("x-ms-meta-leasegate_holder", holder.to_string())
        .header("x-ms-meta-leasegate_expires", "1795096860")
        .header("x-ms-meta-leasegate_token", "42")
        .body(Vec::new())
        .unwrap();
    measure(
        "record read: build + sign HEAD + parse properties",
        n,
        || {
            let request = build(&head, &account, now).unwrap();
            black_box(&request);
            black_box(head.parse(&props).unwrap());
        },
    );
}
