//! ttl-sweeper, as the release `.wasm` served by the real `spin up`, against Azurite: 2,000 blobs
//! over 2 containers swept by 4 workers at once, each expired blob deleted or moved exactly once;
//! blobs changed after listing, leased blobs and bad metadata left alone; the marking API; the
//! app's own lock blobs (swept by default); blobs swept per second with 1 and 4 workers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{Acquiring, Locks, Start, Term};
use leasegate::ops::{GetBlob, GetProperties, Lease, LeaseAction, ListBlobs, Metadata};
use leasegate::{BlobName, ContainerName, LeaseDuration, LeaseId, LockName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{
    bad, call, expect_clear_errors, Answer, App, ADMIN_AUTH, ADMIN_TOKEN, TIMER_AUTH, TIMER_TOKEN,
};
use leasegate_tests::blobs::{client, create_container, put, rfc3339};
use leasegate_tests::proxy::Fault;
use leasegate_tests::{unique_container, wait_for, Azurite};
use serde_json::{json, Value};

mod clean_up_and_faults;
mod passes;

/// Every blob of a container: name -> (etag, metadata).
fn list(c: &ContainerName) -> BTreeMap<String, (String, Metadata)> {
    let mut out = BTreeMap::new();
    let mut marker = None;
    loop {
        let op = ListBlobs {
            marker: marker.clone(),
            include_metadata: true,
            ..ListBlobs::new(c.clone())
        };
        let (page, _) = match block_on(client().execute(&op, SystemTime::now())) {
            Ok(p) => p,
            Err(e) if e.class() == Some(leasegate::ErrorClass::ContainerMissing) => return out,
            Err(e) => panic!("{e}"),
        };
        for b in page.blobs {
            let etag = b
                .properties
                .etag
                .map(|e| e.as_str().to_string())
                .unwrap_or_default();
            out.insert(b.name, (etag, b.properties.metadata));
        }
        match page.next_marker {
            Some(m) => marker = Some(m),
            None => return out,
        }
    }
}

fn sweeper(
    tag: &str,
    containers: &str,
    extra: &[(&str, &str)],
    app_container: Option<ContainerName>,
) -> App {
    // Moves into any dead-blob container but the app's own and the swept ones (the
    // allow-list itself is tested in ttl_sweeper/storage_wasm.rs); `extra` may narrow it.
    let mut vars = vec![
        ("instance_id", tag),
        ("ttl_containers", containers),
        ("ttl_dead_containers", "*"),
    ];
    vars.extend_from_slice(extra);
    leasegate_tests::app::App::start_with(
        tag,
        &vars,
        leasegate_tests::app::Setup {
            container: app_container,
            ..Default::default()
        },
    )
}

fn tick(app: &App) -> Answer {
    call("POST", &app.url("/api/sweeper/tick"), &[TIMER_AUTH], b"")
}

fn state(app: &App) -> Value {
    call("GET", &app.url("/api/sweeper"), &[TIMER_AUTH], b"").json
}

/// Ticks every worker at once, over and over, until one reports the pass complete. Returns the
/// sum of every tick's report, and the wall time.
fn sweep_until_pass(workers: &[App]) -> (BTreeMap<String, u64>, Duration) {
    let started = Instant::now();
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the pass did not complete"
        );
        let answers: Vec<Answer> = std::thread::scope(|s| {
            let hs: Vec<_> = workers.iter().map(|w| s.spawn(move || tick(w))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut done = false;
        for a in &answers {
            assert_eq!(a.status, 200, "{}", a.text);
            for k in [
                "pages",
                "scanned",
                "deleted",
                "moved",
                "notExpired",
                "unmarked",
                "errors",
                "locksRemoved",
            ] {
                *totals.entry(k.into()).or_default() += a.json[k].as_u64().unwrap_or(0);
            }
            if let Some(skipped) = a.json["skipped"].as_object() {
                for (k, v) in skipped {
                    *totals.entry(format!("skipped:{k}")).or_default() += v.as_u64().unwrap();
                }
            }
            done |= a.json["passCompleted"] == true;
        }
        if done {
            return (totals, started.elapsed());
        }
    }
}
