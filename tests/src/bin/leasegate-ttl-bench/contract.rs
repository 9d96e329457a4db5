//! `--contract`: issue 48's container, swept with the defaults. 2,101 blobs marked the way
//! applications mark them (Put Blob with metadata, Set Blob Metadata; no index tag, nothing
//! through the marking API), named as users name them (the live `reports/...` before the
//! expired `tmp/...`): 750 expired, 250 expired with a dead-blob container, 500 expiring
//! tomorrow, 500 unmarked, and 101 odd ones (25 with a `TimeToLive` that is not a time, 25
//! tagged by their application without `TimeToLive`, 25 expired with spaces and non-ASCII in
//! their names, 25 expired asking for a dead-blob container that is not allowed, 1 expired and
//! leased by its owner). The same container is made twice: one is swept by `--workers`
//! deployments with `ttl_find = tags` (the default before issue 48), the other with the
//! defaults (only `ttl_containers` and `ttl_dead_containers` set), a pass and then the next
//! one after the default rest (`ttl_pass_interval_seconds`, 60 s). Printed: blobs left (and
//! expired ones among them), moved, deleted, passes, storage requests, ticks and time.

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::Locks;
use leasegate::ops::{
    Condition, CreateContainer, Lease, LeaseAction, ListBlobs, Metadata, PutBlob, SetBlobTags,
    SetMetadata,
};
use leasegate::{BlobName, ContainerName, LeaseDuration, LeaseId};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{App, Setup};
use leasegate_tests::{unique_container, Azurite};

use crate::{pass, rfc3339, Options, Pass, TAG};

/// What the container holds, by kind, to count what is left.
const EXPIRED_PREFIXES: [&str; 4] = ["tmp/", "odd/names/", "odd/not-allowed/", "odd/leased"];

fn client(azurite: &Azurite) -> Locks<NativeTransport> {
    Locks::new(
        NativeTransport::new(Duration::from_secs(60)),
        azurite.account(),
        ContainerName::try_new("unused").expect("a name"),
    )
}

fn put(locks: &Locks<NativeTransport>, c: &ContainerName, name: &str, meta: &[(&str, &str)]) {
    let meta: Metadata = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let put = PutBlob::block(
        c.clone(),
        BlobName::try_new(name).expect("a name"),
        b"day,total\n".to_vec(),
    )
    .with_metadata(meta);
    block_on(locks.client().execute(&put, SystemTime::now())).expect("put a blob");
}

/// One blob of the container: its name, its metadata, and whether its application sets that
/// metadata with Set Blob Metadata after a plain Put Blob (rather than with the Put Blob).
type Shaped = (String, Vec<(&'static str, String)>, bool);

/// Makes issue 48's container in `c` (its dead-blob container is `dead`).
fn make(azurite: &Azurite, c: &ContainerName, dead: &ContainerName, threads: usize) {
    let locks = client(azurite);
    block_on(locks.client().execute(
        &CreateContainer {
            container: c.clone(),
        },
        SystemTime::now(),
    ))
    .expect("create the container");
    let past = rfc3339(SystemTime::now() - Duration::from_secs(3600));
    let tomorrow = rfc3339(SystemTime::now() + Duration::from_secs(86_400));
    let mut blobs: Vec<Shaped> = Vec::new();
    for i in 0..750 {
        let meta = vec![("TimeToLive", past.clone())];
        blobs.push((format!("tmp/exports/e{i:04}.csv"), meta, i % 2 == 1));
    }
    for i in 0..250 {
        let meta = vec![
            ("TimeToLive", past.clone()),
            ("DeadBlobContainer", dead.as_str().to_string()),
        ];
        blobs.push((format!("tmp/moved/m{i:04}.log"), meta, false));
    }
    for i in 0..500 {
        let meta = vec![("TimeToLive", tomorrow.clone())];
        blobs.push((format!("reports/2026/01/r{i:04}.csv"), meta, false));
    }
    for i in 0..500 {
        let meta = vec![("owner", "team-a".to_string())];
        blobs.push((format!("reports/2026/02/u{i:04}.csv"), meta, false));
    }
    for i in 0..25 {
        let bad = vec![("TimeToLive", "tomorrow".to_string())];
        blobs.push((format!("odd/bad-ttl/{i:02}.csv"), bad, false));
        blobs.push((format!("odd/tag-only/{i:02}.csv"), vec![], false));
        let meta = vec![("TimeToLive", past.clone())];
        blobs.push((format!("odd/names/{i:02} q3 é.csv"), meta, false));
        let not_allowed = vec![
            ("TimeToLive", past.clone()),
            ("DeadBlobContainer", "elsewhere".to_string()),
        ];
        blobs.push((format!("odd/not-allowed/{i:02}.csv"), not_allowed, false));
    }
    blobs.push((
        "odd/leased.csv".to_string(),
        vec![("TimeToLive", past.clone())],
        false,
    ));
    assert_eq!(blobs.len(), 2101);
    std::thread::scope(|s| {
        for t in 0..threads {
            let blobs = &blobs;
            let past = &past;
            s.spawn(move || {
                let locks = client(azurite);
                for (name, meta, later) in blobs.iter().skip(t).step_by(threads) {
                    let meta: Vec<(&str, &str)> =
                        meta.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    if *later {
                        put(&locks, c, name, &[]);
                        let metadata: Metadata = meta
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect();
                        let set = SetMetadata {
                            container: c.clone(),
                            blob: BlobName::try_new(name).expect("a name"),
                            metadata,
                            lease_id: None,
                            condition: Condition::None,
                        };
                        block_on(locks.client().execute(&set, SystemTime::now()))
                            .expect("set metadata");
                    } else {
                        put(&locks, c, name, &meta);
                    }
                    if name.starts_with("odd/tag-only/") {
                        let set = SetBlobTags {
                            container: c.clone(),
                            blob: BlobName::try_new(name).expect("a name"),
                            tags: [(TAG.to_string(), past.clone())].into(),
                            lease_id: None,
                        };
                        block_on(locks.client().execute(&set, SystemTime::now()))
                            .expect("set tags");
                    }
                }
            });
        }
    });
    let lease = Lease::new(
        c.clone(),
        BlobName::try_new("odd/leased.csv").expect("a name"),
        LeaseAction::Acquire {
            duration: LeaseDuration::Infinite,
            proposed: LeaseId::from_random_bytes([48; 16]),
        },
    );
    block_on(locks.client().execute(&lease, SystemTime::now())).expect("lease a blob");
}

/// The blobs of `c`: all of them, and those of them that were expired.
fn left(azurite: &Azurite, c: &ContainerName) -> (usize, usize) {
    let locks = client(azurite);
    let (mut all, mut expired) = (0, 0);
    let mut marker = None;
    loop {
        let list = ListBlobs {
            marker: marker.take(),
            ..ListBlobs::new(c.clone())
        };
        let (page, _) = block_on(locks.client().execute(&list, SystemTime::now())).expect("list");
        for b in &page.blobs {
            all += 1;
            if EXPIRED_PREFIXES.iter().any(|p| b.name.starts_with(p)) {
                expired += 1;
            }
        }
        match page.next_marker {
            Some(m) => marker = Some(m),
            None => return (all, expired),
        }
    }
}

fn deployments(
    label: &str,
    azurite: &'static Azurite,
    c: &ContainerName,
    dead: &ContainerName,
    find: Option<&str>,
    workers: usize,
) -> Vec<App> {
    let app_container = unique_container(&format!("bench{label}"));
    (0..workers)
        .map(|k| {
            let id = format!("{label}-{k}");
            let mut vars = vec![
                ("instance_id", id.as_str()),
                ("ttl_containers", c.as_str()),
                ("ttl_dead_containers", dead.as_str()),
            ];
            if let Some(find) = find {
                vars.push(("ttl_find", find));
            }
            App::start_with(
                &id,
                &vars,
                Setup {
                    azurite: Some(azurite),
                    container: Some(app_container.clone()),
                    // The manifest's defaults for everything but the above (the harness sets
                    // `list`, and a 3 s storage timeout, for its own tests).
                    unset: vec!["ttl_find", "storage_timeout_ms"],
                    ..Setup::default()
                },
            )
        })
        .collect()
}

/// Runs the `--contract` bench and prints its table.
pub(crate) fn run(o: &Options) {
    let azurite: &'static Azurite = Box::leak(Box::new(Azurite::start()));
    let mut rows: Vec<(String, Pass, (usize, usize))> = Vec::new();
    for (label, find) in [("tags", Some("tags")), ("defaults", None)] {
        let c = unique_container(&format!("issue48{label}"));
        let dead = unique_container(&format!("issue48dead{label}"));
        let started = Instant::now();
        make(azurite, &c, &dead, o.threads);
        eprintln!(
            "{label}: made 2,101 blobs in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let apps = deployments(label, azurite, &c, &dead, find, o.workers);
        let passes = if find.is_none() { 2 } else { 1 };
        for n in 1..=passes {
            if n > 1 {
                // The default rest between passes (ttl_pass_interval_seconds).
                std::thread::sleep(Duration::from_secs(61));
            }
            let p = pass(&apps);
            let remaining = left(azurite, &c);
            let name = match (find, n) {
                (Some(f), _) => format!("`ttl_find = {f}` (the old default), pass 1"),
                (None, 1) => "defaults (`both`), pass 1 (lists)".to_string(),
                (None, _) => format!("defaults (`both`), pass {n} (finds only)"),
            };
            eprintln!(
                "{name}: {} requests, {:.1} s, {} deleted, {} moved, {} tagged, left {remaining:?}, {:?}",
                p.requests,
                p.wall.as_secs_f64(),
                p.deleted,
                p.moved,
                p.tagged,
                p.left
            );
            rows.push((name, p, remaining));
        }
    }
    println!();
    println!(
        "Issue 48's container (2,101 blobs marked by metadata alone), {} workers, Azurite 3.35.0",
        o.workers
    );
    println!(
        "| sweep | blobs left | expired left | moved | deleted | tagged | storage requests | ticks | time |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, p, (all, expired)) in &rows {
        println!(
            "| {name} | {all} | {expired} | {} | {} | {} | {} | {} | {:.1} s |",
            p.moved,
            p.deleted,
            p.tagged,
            p.requests,
            p.ticks,
            p.wall.as_secs_f64()
        );
    }
}
