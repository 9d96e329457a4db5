//! The storage ceiling: requests signed here with the `leasegate` crate, straight to Azurite
//! (the blobs leased for it, the two acquire rows), and the setup requests the bench sends.

use std::net::SocketAddr;
use std::time::SystemTime;

use leasegate::ops::{
    build, CreateContainer, Lease, LeaseAction, LeaseOutcome, Operation, PutBlob, WriteOutcome,
};
use leasegate::{Account, BlobName, ContainerName, LeaseDuration, LeaseId};
use leasegate_cli::NativeTransport;
use leasegate_tests::load::Expect;
use leasegate_tests::Azurite;

use crate::rows::{Bench, Row, Storage};

/// A signed storage request, as it goes on the wire.
pub(crate) fn wire(request: &leasegate::Request) -> Vec<u8> {
    let mut out = format!(
        "{} {} HTTP/1.1\r\nhost: {}\r\n",
        request.method(),
        request.path_and_query(),
        request.authority().unwrap_or("")
    )
    .into_bytes();
    for (name, value) in request.headers().iter() {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(request.body());
    out
}

/// Sends one setup operation with the native transport.
pub(crate) fn setup_op<O: Operation>(op: &O, account: &Account) -> Result<O::Output, String> {
    let request = build(op, account, SystemTime::now()).map_err(|e| e.to_string())?;
    let response = NativeTransport::default()
        .send_blocking(request)
        .map_err(|e| e.to_string())?;
    op.parse(&response).map_err(|e| e.to_string())
}

/// The storage ceiling's blobs: one per connection, each leased (infinitely) by `holder`.
pub(crate) fn lease_blobs(
    account: &Account,
    container: &ContainerName,
    n: usize,
    holder: &LeaseId,
) -> Result<Vec<BlobName>, String> {
    // Created, or already there: either will do.
    setup_op(
        &CreateContainer {
            container: container.clone(),
        },
        account,
    )?;
    let mut blobs = Vec::new();
    for i in 0..n {
        let blob = BlobName::try_new(&format!("bench/lease-{i}")).map_err(|e| e.to_string())?;
        let put = PutBlob::block(container.clone(), blob.clone(), Vec::new());
        match setup_op(&put, account)? {
            WriteOutcome::Written(_) => {}
            other => return Err(format!("creating {}: {other:?}", blob.as_str())),
        }
        let acquire = Lease::new(container.clone(), blob.clone(), acquire(holder));
        match setup_op(&acquire, account)? {
            LeaseOutcome::Held { .. } => {}
            other => return Err(format!("leasing {}: {other:?}", blob.as_str())),
        }
        blobs.push(blob);
    }
    Ok(blobs)
}

pub(crate) fn acquire(id: &LeaseId) -> LeaseAction {
    LeaseAction::Acquire {
        duration: LeaseDuration::Infinite,
        proposed: *id,
    }
}

pub(crate) fn new_lease_id() -> LeaseId {
    LeaseId::from_random_bytes(*uuid::Uuid::new_v4().as_bytes())
}

/// The storage ceiling rows: the signed acquire straight to Azurite, granted and refused.
pub(crate) fn ceiling(
    bench: &mut Bench,
    azurite: &Azurite,
    blobs: &[BlobName],
    container: &ContainerName,
    holder: &LeaseId,
) -> Vec<Row> {
    let account = azurite.account();
    let addr = SocketAddr::from(([127, 0, 0, 1], azurite.port()));
    let other = new_lease_id();
    let levels = bench.options.concurrency.len();
    let mut rows = Vec::new();
    for (name, id, expect) in [
        (
            "storage ceiling: Lease acquire 201 (holder again)",
            holder,
            Expect {
                status: 201,
                body_contains: None,
            },
        ),
        (
            "storage ceiling: Lease acquire 409 (other id)",
            &other,
            Expect {
                status: 409,
                body_contains: Some("LeaseAlreadyPresent"),
            },
        ),
    ] {
        let ops: Vec<Lease> = blobs
            .iter()
            .map(|b| Lease::new(container.clone(), b.clone(), acquire(id)))
            .collect();
        let request = |i: usize| {
            wire(&build(&ops[i], &account, SystemTime::now()).expect("a lease request builds"))
        };
        let mut row = Row::new(name, Storage::One, levels);
        bench.run_row(&mut row, addr, &request, &expect);
        rows.push(row);
    }
    rows
}
