//! The core's CPU cost per lease decision: a whole `Locks::acquire` (validate the name, build
//! and sign each request, parse each answer, decide) against canned storage answers, so only
//! the core is measured. Prints microseconds and requests per decision; asserts nothing about
//! speed. Run with `cargo bench -p leasegate --bench decision`.
// A benchmark reads the clock to measure itself; the core never does.
#![allow(clippy::disallowed_methods)]

use std::cell::Cell;
use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{Acquire, Acquiring, Locks, Term};
use leasegate::{
    Account, ContainerName, LeaseId, LockName, Method, Request, Response, StatusCode, Transport,
    TransportError,
};

/// Storage answers by request kind: the lock blob as `lease_state` with `metadata`.
struct Canned {
    lease_state: &'static str,
    metadata: Vec<(&'static str, String)>,
    sent: Cell<u32>,
}

impl Transport for Canned {
    async fn send(&self, request: Request) -> Result<Response, TransportError> {
        self.sent.set(self.sent.get() + 1);
        let r = Response::new(StatusCode::OK)
            .with_header("date", "Sat, 21 Nov 2026 14:00:00 GMT")
            .with_header("etag", "\"0x8DB1A2B3C4D5E6F\"")
            .with_header("x-ms-request-id", "0f6d1b0e-501e-0035-5a1c-1c2b3a000000");
        Ok(if *request.method() == Method::HEAD {
            let mut r = r
                .with_header("x-ms-lease-state", self.lease_state)
                .with_header("x-ms-blob-type", "PageBlob");
            for (k, v) in &self.metadata {
                r = r.with_header(&format!("x-ms-meta-{k}"), v.as_str());
            }
            r
        } else if let Some(id) = request.headers().get("x-ms-proposed-lease-id") {
            let mut r = r.with_header("x-ms-lease-id", id);
            r.set_status(StatusCode::CREATED);
            r
        } else {
            r
        })
    }
}

fn measure(label: &str, iterations: u32, transport: &Canned, mut decide: impl FnMut() -> Acquire) {
    for _ in 0..iterations / 10 {
        decide(); // warm up
    }
    transport.sent.set(0);
    let start = Instant::now();
    for _ in 0..iterations {
        black_box(decide());
    }
    let per = start.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
    let requests = f64::from(transport.sent.get()) / f64::from(iterations);
    println!(
        "{label:<52} {per:>8.2} µs/decision  {requests:.0} request(s)  ({iterations} iterations)"
    );
}

fn main() {
    let account = Account::from_connection_string("UseDevelopmentStorage=true").unwrap();
    let container = ContainerName::try_new("leasegate").unwrap();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_096_800);
    let me = LeaseId::from_random_bytes([7; 16]);
    let other = LeaseId::from_random_bytes([8; 16]).to_string();
    let native = Term::for_window(Duration::from_secs(30)).unwrap();
    let record = Term::for_window(Duration::from_secs(90)).unwrap();
    // The canned answers' Date, in Unix seconds: the other holder has 20 s left.
    let date = httpdate::parse_http_date("Sat, 21 Nov 2026 14:00:00 GMT").unwrap();
    let secs = date
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let held_by_other = vec![
        ("leasegate_holder", other),
        ("leasegate_term", "30".to_string()),
        ("leasegate_since", (secs - 10).to_string()),
        ("leasegate_expires", (secs + 20).to_string()),
        ("leasegate_token", (secs << 16).to_string()),
    ];
    let n = 20_000;
    // (what is measured, the lock blob's lease state, its metadata, the caller's term)
    type Case = (
        &'static str,
        &'static str,
        Vec<(&'static str, String)>,
        Term,
    );
    let cases: [Case; 3] = [
        (
            "busy (throttled): HEAD",
            "leased",
            held_by_other.clone(),
            native,
        ),
        (
            "native, new holder: HEAD + acquire + claim",
            "available",
            held_by_other.clone(),
            native,
        ),
        (
            "record, new holder: HEAD + compare-and-swap",
            "available",
            held_by_other,
            record,
        ),
    ];
    for (label, lease_state, metadata, term) in cases {
        let transport = Canned {
            lease_state,
            metadata,
            sent: Cell::new(0),
        };
        let locks = Locks::new(&transport, account.clone(), container.clone());
        measure(label, n, &transport, || {
            let lock = LockName::try_new(black_box("devices/sensor-0042")).unwrap();
            pollster::block_on(locks.acquire(&lock, Acquiring::new(term, me), now)).unwrap()
        });
    }
}
