//! `leasegate-ttl-bench` (`scripts/dev.sh ttl-bench`): what a TTL sweep pass costs with
//! `ttl_find = list` and with `ttl_find = tags`, under the real `spin up`, against its own
//! Azurite.
//!
//! One container of `--blobs` blobs (100,000), every one marked (`TimeToLive` metadata and the
//! expiry tag `leasegate_expires_at`, as marking writes them), `--expired-percent` (1) of them
//! already due, the rest due in a week. `--workers` (4) deployments of `spin.toml` share the
//! app's container and are ticked at once (`POST /api/sweeper/tick`) until one completes a
//! pass. Four passes, each printed with its storage requests (counted at the deployments'
//! storage proxies), its wall time and what it deleted:
//!
//! 1. `list`, 1 % due; 2. `tags`, 1 % due (the due blobs put back first);
//! 3. `list`, nothing due; 4. `tags`, nothing due.
//!
//! Blobs are created by `--threads` (32) concurrent writers within `--create-minutes` (10);
//! if that runs out the bench goes on with what was created and says so. Figures are printed,
//! never asserted (one run on a shared machine; Azurite, one Node process, is the server).
//!
//! `--contract` runs instead issue 48's container of 2,101 blobs marked by metadata alone,
//! swept with the defaults (`contract.rs`).

mod contract;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::Locks;
use leasegate::ops::{CreateContainer, Metadata, Operation, PutBlob, WriteOutcome};
use leasegate::{Account, ContainerName, Error, Request, Response};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{call, App, Setup, TIMER_AUTH};
use leasegate_tests::{unique_container, Azurite};

const USAGE: &str = "usage: leasegate-ttl-bench [--blobs 100000] [--expired-percent 1] \
                     [--workers 4] [--page-size 100] [--threads 32] [--create-minutes 10] \
                     [--contract]";

/// The expiry tag (`ttl_sweeper::EXPIRES_TAG`).
const TAG: &str = "leasegate_expires_at";

struct Options {
    blobs: usize,
    expired_percent: f64,
    workers: usize,
    page_size: u32,
    threads: usize,
    create_minutes: u64,
    /// Issue 48's container with the defaults instead (`contract.rs`).
    contract: bool,
}

fn options() -> Options {
    let mut o = Options {
        blobs: 100_000,
        expired_percent: 1.0,
        workers: 4,
        page_size: 100,
        threads: 32,
        create_minutes: 10,
        contract: false,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--contract" {
            o.contract = true;
            i += 1;
            continue;
        }
        let value = args.get(i + 1).unwrap_or_else(|| {
            eprintln!("{USAGE}");
            std::process::exit(2)
        });
        let bad = || -> ! {
            eprintln!("{}: not a number\n{USAGE}", args[i]);
            std::process::exit(2)
        };
        match args[i].as_str() {
            "--blobs" => o.blobs = value.parse().unwrap_or_else(|_| bad()),
            "--expired-percent" => o.expired_percent = value.parse().unwrap_or_else(|_| bad()),
            "--workers" => o.workers = value.parse().unwrap_or_else(|_| bad()),
            "--page-size" => o.page_size = value.parse().unwrap_or_else(|_| bad()),
            "--threads" => o.threads = value.parse().unwrap_or_else(|_| bad()),
            "--create-minutes" => o.create_minutes = value.parse().unwrap_or_else(|_| bad()),
            _ => {
                eprintln!("{USAGE}");
                std::process::exit(2)
            }
        }
        i += 2;
    }
    o
}

/// Put Blob with `x-ms-tags` (the tags set at write time, as an application marking its own
/// blobs would).
struct PutTagged(PutBlob, String);

impl Operation for PutTagged {
    type Output = WriteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let mut r = self.0.request(account)?;
        r.headers_mut().append("x-ms-tags", self.1.as_str());
        Ok(r)
    }
    fn parse(&self, response: &Response) -> Result<WriteOutcome, Error> {
        self.0.parse(response)
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Blob `i`'s name: the due ones sort first (`a-due/`), the others after (`data/`).
/// Azurite 3.35's Find Blobs by Tags searches only the first `maxresults` names after the
/// marker and ends there (docs/ttl-sweeper.md, "Azurite and Azure"); Azure's index returns the
/// matches wherever they sort. The list pass reads every blob either way.
fn name(i: usize, due: bool) -> String {
    if due {
        format!("a-due/{i:07}")
    } else {
        format!("data/{i:07}")
    }
}

fn put(
    locks: &Locks<NativeTransport>,
    c: &ContainerName,
    i: usize,
    due: bool,
    expires: &str,
) -> bool {
    let meta: Metadata = [("TimeToLive".to_string(), expires.to_string())].into();
    let put = PutBlob::block(
        c.clone(),
        leasegate::BlobName::try_new(&name(i, due)).expect("a name"),
        b"x".to_vec(),
    )
    .with_metadata(meta);
    // The tag value in the form x-ms-tags takes: a query string (`:` encoded).
    let tags = format!("{TAG}={}", expires.replace(':', "%3A"));
    block_on(
        locks
            .client()
            .execute(&PutTagged(put, tags), SystemTime::now()),
    )
    .is_ok()
}

struct Pass {
    requests: usize,
    wall: Duration,
    deleted: u64,
    /// Of those, moved to their dead-blob container.
    moved: u64,
    /// Blobs given their expiry tag.
    tagged: u64,
    /// Blobs left, by reason (`skipped`), and failed requests (`errors`), summed over ticks.
    left: std::collections::BTreeMap<String, u64>,
    ticks: usize,
}

/// Ticks every worker at once until one reports the pass complete.
fn pass(workers: &[App]) -> Pass {
    let started = Instant::now();
    let before: usize = workers.iter().map(|w| w.storage.count()).sum();
    let (mut deleted, mut moved, mut tagged, mut ticks) = (0, 0, 0, 0);
    let mut left = std::collections::BTreeMap::new();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "no pass in an hour"
        );
        let answers: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = workers
                .iter()
                .map(|w| {
                    s.spawn(move || call("POST", &w.url("/api/sweeper/tick"), &[TIMER_AUTH], b""))
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("a tick")).collect()
        });
        let mut done = false;
        for a in &answers {
            ticks += 1;
            if a.status != 200 {
                eprintln!("a tick answered {}: {}", a.status, a.text);
                continue;
            }
            deleted += a.json["deleted"].as_u64().unwrap_or(0);
            moved += a.json["moved"].as_u64().unwrap_or(0);
            tagged += a.json["tagged"].as_u64().unwrap_or(0);
            if let Some(skipped) = a.json["skipped"].as_object() {
                for (k, v) in skipped {
                    *left.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
                }
            }
            let errors = a.json["errors"].as_u64().unwrap_or(0);
            if errors > 0 {
                *left.entry("errors".into()).or_default() += errors;
            }
            done |= a.json["passCompleted"] == true;
        }
        if done {
            let after: usize = workers.iter().map(|w| w.storage.count()).sum();
            return Pass {
                requests: after - before,
                wall: started.elapsed(),
                deleted,
                moved,
                tagged,
                left,
                ticks,
            };
        }
    }
}

fn workers(mode: &str, azurite: &'static Azurite, data: &ContainerName, o: &Options) -> Vec<App> {
    let app_container = unique_container(&format!("bench{mode}"));
    let page = o.page_size.to_string();
    (0..o.workers)
        .map(|k| {
            let id = format!("{mode}-{k}");
            App::start_with(
                &id,
                &[
                    ("instance_id", id.as_str()),
                    ("ttl_containers", data.as_str()),
                    ("ttl_find", mode),
                    ("ttl_page_size", page.as_str()),
                    ("ttl_pass_interval_seconds", "0"),
                    ("ttl_lock_retention_seconds", "off"),
                    ("storage_timeout_ms", "30000"),
                ],
                Setup {
                    azurite: Some(azurite),
                    container: Some(app_container.clone()),
                    ..Setup::default()
                },
            )
        })
        .collect()
}

fn main() {
    let o = options();
    leasegate_tests::app::build_components();
    if o.contract {
        contract::run(&o);
        return;
    }
    let azurite: &'static Azurite = Box::leak(Box::new(Azurite::start()));
    let locks = Locks::new(
        NativeTransport::new(Duration::from_secs(60)),
        azurite.account(),
        ContainerName::try_new("unused").expect("a name"),
    );
    let data = unique_container("ttlbench");
    block_on(locks.client().execute(
        &CreateContainer {
            container: data.clone(),
        },
        SystemTime::now(),
    ))
    .expect("create the container");
    let past = rfc3339(SystemTime::now() - Duration::from_secs(3600));
    let future = rfc3339(SystemTime::now() + Duration::from_secs(7 * 86_400));
    let step = ((100.0 / o.expired_percent).round() as usize).max(1);
    let due = |i: usize| i.is_multiple_of(step);

    eprintln!(
        "creating {} blobs ({} % due) with {} writers, at most {} minutes",
        o.blobs, o.expired_percent, o.threads, o.create_minutes
    );
    let started = Instant::now();
    let deadline = Duration::from_secs(o.create_minutes * 60);
    let next = AtomicUsize::new(0);
    let created = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..o.threads {
            s.spawn(|| {
                let locks = Locks::new(
                    NativeTransport::new(Duration::from_secs(60)),
                    azurite.account(),
                    ContainerName::try_new("unused").expect("a name"),
                );
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= o.blobs || started.elapsed() > deadline {
                        return;
                    }
                    let expires = if due(i) { &past } else { &future };
                    if put(&locks, &data, i, due(i), expires) {
                        let n = created.fetch_add(1, Ordering::Relaxed) + 1;
                        if n.is_multiple_of(10_000) {
                            eprintln!("  {n} blobs, {:.0} s", started.elapsed().as_secs_f64());
                        }
                    }
                }
            });
        }
    });
    let created = created.load(Ordering::Relaxed);
    let highest = next.load(Ordering::Relaxed).min(o.blobs);
    let due_count = (0..highest).filter(|i| due(*i)).count();
    let create_s = started.elapsed().as_secs_f64();
    eprintln!(
        "created {created} blobs in {create_s:.0} s ({:.0}/s){}",
        created as f64 / create_s,
        if created < o.blobs {
            " (time box reached: the bench goes on with these)"
        } else {
            ""
        }
    );

    let mut rows = Vec::new();
    let mut run = |mode: &str, label: &str| {
        let apps = workers(mode, azurite, &data, &o);
        let p = pass(&apps);
        eprintln!(
            "{label}: {} requests, {:.1} s, {} deleted, left for the next pass: {:?}",
            p.requests,
            p.wall.as_secs_f64(),
            p.deleted,
            p.left
        );
        rows.push((label.to_string(), p));
    };
    run("list", "list, 1 % due");
    // Put the due blobs back.
    std::thread::scope(|s| {
        for t in 0..o.threads {
            let (locks, data, past) = (&locks, &data, &past);
            s.spawn(move || {
                for i in (0..highest).filter(|i| due(*i)).skip(t).step_by(o.threads) {
                    put(locks, data, i, true, past);
                }
            });
        }
    });
    // Blobs written in the second of a find are left for the next pass: start after it.
    std::thread::sleep(Duration::from_millis(1100));
    run("tags", "tags, 1 % due");
    run("list", "list, nothing due");
    run("tags", "tags, nothing due");

    println!();
    println!(
        "TTL sweep pass: {created} blobs, {due_count} due, {} workers, pages of {}, Azurite 3.35.0",
        o.workers, o.page_size
    );
    println!("| pass | storage requests | per due blob | wall time | deleted | ticks |");
    println!("|---|---|---|---|---|---|");
    for (label, p) in &rows {
        let per = if p.deleted > 0 {
            format!("{:.2}", p.requests as f64 / p.deleted as f64)
        } else {
            "-".into()
        };
        println!(
            "| {label} | {} | {per} | {:.1} s | {} | {} |",
            p.requests,
            p.wall.as_secs_f64(),
            p.deleted,
            p.ticks
        );
    }
}
