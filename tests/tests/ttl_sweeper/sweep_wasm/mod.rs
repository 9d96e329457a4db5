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

/// 2,000 blobs over 2 containers, half expired, a quarter of those with a dead-blob container:
/// 4 workers sweep concurrently until the pass completes. Every expired blob is gone from its
/// source, every moved blob is in its dead-blob container with its content and metadata, no
/// unexpired blob is touched, and the counters add up.
#[test]
fn four_workers_sweep_two_thousand_blobs_once() {
    let (a, b) = (unique_container("ttla"), unique_container("ttlb"));
    let dead = unique_container("ttldead");
    for c in [&a, &b] {
        create_container(c);
    }
    let past = rfc3339(SystemTime::now() - Duration::from_secs(3600));
    let future = rfc3339(SystemTime::now() + Duration::from_secs(7 * 86_400));
    // blob i: expired when i is even; of those, every fourth (i % 8 == 0) moves.
    std::thread::scope(|s| {
        for t in 0..8 {
            let (a, b, dead, past, future) = (&a, &b, &dead, &past, &future);
            s.spawn(move || {
                for i in (t..2000).step_by(8) {
                    let c = if i < 1000 { a } else { b };
                    let mut meta = vec![("owner", format!("team-{}", i % 3))];
                    meta.push((
                        "TimeToLive",
                        if i % 2 == 0 {
                            past.clone()
                        } else {
                            future.clone()
                        },
                    ));
                    if i % 8 == 0 {
                        meta.push(("DeadBlobContainer", format!("{}/moved/", dead.as_str())));
                    }
                    put(
                        c,
                        &format!("data/blob-{i:04}"),
                        format!("content {i}").as_bytes(),
                        &meta,
                    );
                }
            });
        }
    });
    let before: BTreeMap<String, (String, Metadata)> =
        list(&a).into_iter().chain(list(&b)).collect();
    assert_eq!(before.len(), 2000);
    let containers = format!("{},{}", a.as_str(), b.as_str());
    let first = sweeper(
        "sweep-0",
        &containers,
        &[("ttl_time_budget_ms", "2000")],
        None,
    );
    let app_container = first.container.clone();
    let mut workers = vec![first];
    for w in 1..4 {
        workers.push(sweeper(
            &format!("sweep-{w}"),
            &containers,
            &[("ttl_time_budget_ms", "2000")],
            Some(app_container.clone()),
        ));
    }
    let (totals, took) = sweep_until_pass(&workers);
    println!("4 workers swept 2000 blobs (1000 expired) in {took:?}: {totals:?}");
    assert_eq!(totals["deleted"], 1000, "{totals:?}");
    assert_eq!(totals["moved"], 250, "{totals:?}");
    assert_eq!(
        totals["scanned"], 2000,
        "each page claimed once: {totals:?}"
    );
    assert_eq!(totals["notExpired"], 1000, "{totals:?}");
    assert_eq!(totals["errors"], 0, "{totals:?}");
    let after: BTreeMap<String, (String, Metadata)> =
        list(&a).into_iter().chain(list(&b)).collect();
    assert_eq!(after.len(), 1000);
    for (name, (etag, meta)) in &after {
        let i: usize = name[10..].parse().unwrap();
        assert_eq!(i % 2, 1, "{name} should be gone");
        assert_eq!(&before[name].0, etag, "{name} was touched");
        assert_eq!(
            meta.get("owner").unwrap().as_str(),
            format!("team-{}", i % 3)
        );
    }
    // The moved blobs, with their content and their source's metadata exactly (a copy sends
    // no metadata: storage keeps the source's; docs/ttl-sweeper.md).
    let moved = list(&dead);
    assert_eq!(moved.len(), 250);
    for (name, (_, meta)) in &moved {
        let original = name.strip_prefix("moved/").unwrap();
        let i: usize = original[10..].parse().unwrap();
        assert_eq!(i % 8, 0, "{name}");
        assert_eq!(
            meta.get("owner").unwrap().as_str(),
            format!("team-{}", i % 3)
        );
        assert!(meta.contains_key("timetolive"), "{meta:?}");
        assert!(meta.contains_key("deadblobcontainer"), "{meta:?}");
        assert!(!meta.contains_key("sourceuri"), "{meta:?}");
        let content = block_on(client().execute(
            &GetBlob {
                container: dead.clone(),
                blob: BlobName::try_new(name).unwrap(),
            },
            SystemTime::now(),
        ))
        .unwrap()
        .0
        .unwrap();
        assert_eq!(content.body, format!("content {i}").as_bytes());
    }
    // The state: a pass completed, counters add up.
    let st = state(&workers[0]);
    assert_eq!(st["passes"], 1, "{st}");
    assert_eq!(st["purged"], 1000, "{st}");
    assert_eq!(st["moved"], 250, "{st}");
    assert!(st["lastPassCompletedAt"].as_str().unwrap().ends_with('Z'));
}

/// A blob rewritten or re-marked after it was listed survives (the delete is conditional on the
/// listed ETag); a leased blob survives; bad metadata values are skipped and reported.
#[test]
fn changed_leased_and_badly_marked_blobs_are_left_alone() {
    let c = unique_container("ttledge");
    create_container(&c);
    let past = rfc3339(SystemTime::now() - Duration::from_secs(60));
    for name in ["rewritten", "remarked", "leased", "plain"] {
        put(&c, name, b"v1", &[("TimeToLive", past.clone())]);
    }
    put(&c, "garbage", b"x", &[("TimeToLive", "soon-ish".into())]);
    put(
        &c,
        "bad-dead",
        b"x",
        &[
            ("TimeToLive", past.clone()),
            ("DeadBlobContainer", "Not A Container!".into()),
        ],
    );
    let lease = Lease::new(
        c.clone(),
        BlobName::try_new("leased").unwrap(),
        LeaseAction::Acquire {
            duration: LeaseDuration::Infinite,
            proposed: LeaseId::from_random_bytes([4; 16]),
        },
    );
    block_on(client().execute(&lease, SystemTime::now())).unwrap();
    let app = sweeper("edge", c.as_str(), &[("storage_timeout_ms", "10000")], None);
    // The deletes of two blobs are held up 4 s: in that time, after the listing (the state
    // shows the page claimed), one is rewritten and the other re-marked.
    for name in ["rewritten", "remarked"] {
        app.storage.fault_on(
            &format!("DELETE /devstoreaccount1/{}/{name}", c.as_str()),
            Fault::Delay(Duration::from_secs(4)),
        );
    }
    let swept = std::thread::scope(|s| {
        let h = s.spawn(|| tick(&app));
        wait_for("the page to be claimed", Duration::from_secs(10), || {
            (state(&app)["pages"].as_u64().unwrap_or(0) >= 1).then_some(())
        });
        put(&c, "rewritten", b"v2", &[("TimeToLive", past.clone())]);
        put(
            &c,
            "remarked",
            b"v1",
            &[(
                "TimeToLive",
                rfc3339(SystemTime::now() + Duration::from_secs(3600)),
            )],
        );
        h.join().unwrap()
    });
    assert_eq!(swept.status, 200, "{}", swept.text);
    let r = &swept.json;
    assert_eq!(r["deleted"], 1, "{r}");
    assert_eq!(r["skipped"]["changed since listing"], 2, "{r}");
    assert_eq!(r["skipped"]["leased"], 1, "{r}");
    assert_eq!(r["skipped"]["TimeToLive is not a time"], 1, "{r}");
    assert_eq!(
        r["skipped"]["DeadBlobContainer is not container[/prefix/]"], 1,
        "{r}"
    );
    let left: BTreeSet<String> = list(&c).into_keys().collect();
    let want: BTreeSet<String> = ["rewritten", "remarked", "leased", "garbage", "bad-dead"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(left, want);
}

/// The marking API sets `TimeToLive` (and `DeadBlobContainer`) by compare-and-swap, keeping
/// the blob's other metadata; bad input gets clear 4xx errors.
#[test]
fn marking_api() {
    let c = unique_container("ttlmark");
    create_container(&c);
    put(&c, "doc", b"x", &[("owner", "team-a".into())]);
    let app = sweeper("mark", &format!("{}/", c.as_str()), &[], None);
    let path = format!("/api/ttl/{}/doc", c.as_str());
    let json_ct = ("content-type", "application/json");
    // Marking is the admin token's: the tick token is refused and marks nothing.
    let refused = call(
        "PUT",
        &app.url(&path),
        &[TIMER_AUTH, json_ct],
        json!({"ttlSeconds": 3600}).to_string().as_bytes(),
    );
    assert_eq!(refused.status, 403, "{}", refused.text);
    assert_eq!(refused.json["error"], "forbidden", "{}", refused.text);
    assert!(!list(&c)["doc"].1.contains_key("timetolive"));
    let marked = call(
        "PUT",
        &app.url(&path),
        &[ADMIN_AUTH, json_ct],
        json!({"ttlSeconds": 3600, "deadBlobContainer": "archive/doc/"})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(marked.status, 200, "{}", marked.text);
    let meta = list(&c)["doc"].1.clone();
    assert_eq!(meta.get("owner").unwrap().as_str(), "team-a");
    assert_eq!(
        meta.get("deadblobcontainer").unwrap().as_str(),
        "archive/doc/"
    );
    let ttl = humantime::parse_rfc3339(meta.get("timetolive").unwrap()).unwrap();
    let left = ttl.duration_since(SystemTime::now()).unwrap();
    assert!(
        left > Duration::from_secs(3590) && left <= Duration::from_secs(3605),
        "{left:?}"
    );
    let again = call(
        "PUT",
        &app.url(&path),
        &[ADMIN_AUTH, json_ct],
        json!({"expiresAt": "2030-01-01T00:00:00Z", "deadBlobContainer": null})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(again.status, 200, "{}", again.text);
    let meta = list(&c)["doc"].1.clone();
    assert_eq!(
        meta.get("timetolive").unwrap().as_str(),
        "2030-01-01T00:00:00Z"
    );
    assert!(!meta.contains_key("deadblobcontainer"));
    assert_eq!(meta.get("owner").unwrap().as_str(), "team-a");
    put(&c, "held", b"x", &[]);
    block_on(client().execute(
        &Lease::new(
            c.clone(),
            BlobName::try_new("held").unwrap(),
            LeaseAction::Acquire {
                duration: LeaseDuration::Infinite,
                proposed: LeaseId::from_random_bytes([5; 16]),
            },
        ),
        SystemTime::now(),
    ))
    .unwrap();
    let body = |v: Value| v.to_string().into_bytes();
    let ok = body(json!({"ttlSeconds": 60}));
    let cases = [
        bad("PUT", &path, &[json_ct], &ok, 401),
        bad("PUT", &path, &[TIMER_AUTH, json_ct], &ok, 403),
        bad("POST", &path, &[ADMIN_AUTH, json_ct], &ok, 405),
        bad("PUT", &path, &[ADMIN_AUTH], &ok, 415),
        bad("PUT", &path, &[ADMIN_AUTH, json_ct], b"{", 400),
        bad("PUT", &path, &[ADMIN_AUTH, json_ct], &body(json!({})), 400),
        bad(
            "PUT",
            &path,
            &[ADMIN_AUTH, json_ct],
            &body(json!({"ttlSeconds": 0})),
            400,
        ),
        bad(
            "PUT",
            &path,
            &[ADMIN_AUTH, json_ct],
            &body(json!({"ttlSeconds": 1e12})),
            400,
        ),
        bad(
            "PUT",
            &path,
            &[ADMIN_AUTH, json_ct],
            &body(json!({"ttlSeconds": -5})),
            400,
        ),
        bad(
            "PUT",
            &path,
            &[ADMIN_AUTH, json_ct],
            &body(json!({"ttlSeconds": 5, "expiresAt": "2030-01-01T00:00:00Z"})),
            400,
        ),
        bad(
            "PUT",
            &path,
            &[ADMIN_AUTH, json_ct],
            &body(json!({"expiresAt": "tomorrow"})),
            400,
        ),
        bad(
            "PUT",
            &path,
            &[ADMIN_AUTH, json_ct],
            &body(json!({"ttlSeconds": 5, "colour": 1})),
            400,
        ),
        bad(
            "PUT",
            &path,
            &[ADMIN_AUTH, json_ct],
            &body(json!({"ttlSeconds": 5, "deadBlobContainer": "Bad Name"})),
            400,
        ),
        bad("PUT", "/api/ttl/", &[ADMIN_AUTH, json_ct], &ok, 400),
        bad(
            "PUT",
            &format!("/api/ttl/{}", c.as_str()),
            &[ADMIN_AUTH, json_ct],
            &ok,
            400,
        ),
        bad(
            "PUT",
            "/api/ttl/UPPER/doc",
            &[ADMIN_AUTH, json_ct],
            &ok,
            400,
        ),
        bad(
            "PUT",
            &format!("/api/ttl/{}/a/../b", c.as_str()),
            &[ADMIN_AUTH, json_ct],
            &ok,
            400,
        ),
        bad(
            "PUT",
            "/api/ttl/other-container/doc",
            &[ADMIN_AUTH, json_ct],
            &ok,
            403,
        ),
        bad(
            "PUT",
            &format!("/api/ttl/{}/missing", c.as_str()),
            &[ADMIN_AUTH, json_ct],
            &ok,
            404,
        ),
        bad(
            "PUT",
            &format!("/api/ttl/{}/held", c.as_str()),
            &[ADMIN_AUTH, json_ct],
            &ok,
            409,
        ),
        bad("GET", "/api/sweeper/tick", &[TIMER_AUTH], b"", 405),
        bad("POST", "/api/sweeper/nope", &[TIMER_AUTH], b"", 404),
        bad("POST", "/api/sweeper/tick", &[TIMER_AUTH], b"{}", 400),
    ];
    expect_clear_errors(
        &app,
        &cases,
        &[
            TIMER_TOKEN,
            ADMIN_TOKEN,
            leasegate::account::DEV_ACCOUNT_KEY,
        ],
    );
}

/// The app's own lock blobs free for longer than the retention are removed (a lock with marks
/// or a held one is not), and the tokens of a removed lock stay increasing.
#[test]
fn free_lock_blobs_are_removed_after_the_retention() {
    let data = unique_container("ttllockdata");
    create_container(&data);
    let app = sweeper(
        "locks",
        data.as_str(),
        &[
            ("ttl_lock_retention_seconds", "2"),
            ("ttl_lock_prefixes", "gates/"),
        ],
        None,
    );
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix("gates/");
    let term = Term::for_window(Duration::from_secs(30)).unwrap();
    let mut tokens = BTreeMap::new();
    for name in ["free-1", "free-2", "held", "marked"] {
        let lock = LockName::try_new(name).unwrap();
        let id = LeaseId::from_random_bytes(*uuid::Uuid::new_v4().as_bytes());
        let got = match block_on(locks.acquire(&lock, Acquiring::new(term, id), SystemTime::now()))
            .unwrap()
        {
            leasegate::lease::Acquire::Acquired(a) => a,
            other => panic!("{other:?}"),
        };
        tokens.insert(name, got.fencing_token.unwrap());
        if name == "marked" {
            let m: Metadata = [("progress".to_string(), "done".to_string())].into();
            assert!(block_on(locks.set_marks(&lock, id, &m, SystemTime::now())).unwrap());
        }
        if name != "held" {
            block_on(locks.release(&lock, id, Start::Read, SystemTime::now())).unwrap();
        }
    }
    // Free for longer than the 2 s retention by the server's clock.
    wait_for("the retention to pass", Duration::from_secs(10), || {
        let head = block_on(
            locks.client().execute(
                &GetProperties {
                    container: app.container.clone(),
                    blob: locks
                        .blob_name(&LockName::try_new("free-1").unwrap())
                        .unwrap(),
                },
                SystemTime::now(),
            ),
        )
        .unwrap();
        let modified = head.0.unwrap().last_modified.unwrap();
        (head.1.unwrap() >= modified + Duration::from_secs(4)).then_some(())
    });
    let r = wait_for("a pass", Duration::from_secs(30), || {
        let a = tick(&app);
        assert_eq!(a.status, 200, "{}", a.text);
        (a.json["locksRemoved"].as_u64().unwrap_or(0) > 0).then_some(a)
    });
    assert_eq!(r.json["locksRemoved"], 2, "{}", r.text);
    let left: BTreeSet<String> = list(&app.container)
        .into_keys()
        .filter(|k| k.starts_with("gates/"))
        .collect();
    assert_eq!(
        left,
        ["gates/held", "gates/marked"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    // A removed lock, taken again, issues a larger token than before.
    let lock = LockName::try_new("free-1").unwrap();
    let again = match block_on(locks.acquire(
        &lock,
        Acquiring::new(term, LeaseId::from_random_bytes([6; 16])),
        SystemTime::now(),
    ))
    .unwrap()
    {
        leasegate::lease::Acquire::Acquired(a) => a,
        other => panic!("{other:?}"),
    };
    assert!(again.fencing_token.unwrap() > tokens["free-1"]);
}

/// Blobs swept per second with 1 and with 4 workers (printed; nothing asserted about speed).
#[test]
fn sweep_speed_with_one_and_four_workers() {
    for workers in [1usize, 4] {
        let c = unique_container(&format!("ttlspeed{workers}"));
        create_container(&c);
        let past = rfc3339(SystemTime::now() - Duration::from_secs(60));
        std::thread::scope(|s| {
            for t in 0..8 {
                let (c, past) = (&c, &past);
                s.spawn(move || {
                    for i in (t..600).step_by(8) {
                        put(
                            c,
                            &format!("b-{i:04}"),
                            b"x",
                            &[("TimeToLive", past.clone())],
                        );
                    }
                });
            }
        });
        let first = sweeper(
            &format!("speed-{workers}"),
            c.as_str(),
            &[("ttl_page_size", "50")],
            None,
        );
        let app_container = first.container.clone();
        let mut apps = vec![first];
        for w in 1..workers {
            apps.push(sweeper(
                &format!("speed-{workers}-{w}"),
                c.as_str(),
                &[("ttl_page_size", "50")],
                Some(app_container.clone()),
            ));
        }
        let (totals, took) = sweep_until_pass(&apps);
        assert_eq!(totals["deleted"], 600, "{totals:?}");
        // Every request each worker's proxy saw (each worker has its own).
        let storage_requests: usize = apps.iter().map(|a| a.storage.count()).sum();
        println!(
            "sweep, {workers} worker(s): 600 expired blobs in {took:?}: {:.0} blobs/s, {:.2} storage requests per blob",
            600.0 / took.as_secs_f64(),
            storage_requests as f64 / 600.0
        );
    }
}

/// Storage faults never lose a blob: a failed copy leaves the source; a delete that fails after
/// the copy (a crash between the two) leaves a duplicate in the dead-blob container and the
/// source; storage refusing the state fails the tick with a 503. Once storage recovers, the
/// next pass moves and deletes everything, once.
#[test]
fn storage_faults_leave_blobs_in_place_and_the_next_pass_finishes() {
    let c = unique_container("ttlfault");
    let dead = unique_container("ttlfaultdead");
    create_container(&c);
    let past = rfc3339(SystemTime::now() - Duration::from_secs(60));
    for i in 0..20 {
        let mut meta = vec![("TimeToLive", past.clone())];
        if i % 2 == 0 {
            meta.push(("DeadBlobContainer", dead.as_str().to_string()));
        }
        put(&c, &format!("f-{i:02}"), format!("v{i}").as_bytes(), &meta);
    }
    let app = sweeper(
        "fault",
        c.as_str(),
        &[("ttl_pass_interval_seconds", "0")],
        None,
    );
    let names = |c: &ContainerName| list(c).into_keys().collect::<BTreeSet<String>>();
    let movers: BTreeSet<String> = (0..20).step_by(2).map(|i| format!("f-{i:02}")).collect();

    // 1. Storage refuses: the tick fails with a clear 503 and nothing is touched.
    app.storage.set_fault(Some(Fault::Refuse));
    let a = tick(&app);
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "storage_unavailable", "{}", a.text);
    assert!(
        !a.text.contains(&leasegate::account::DEV_ACCOUNT_KEY[..20]),
        "{}",
        a.text
    );
    app.storage.set_fault(None);
    assert_eq!(names(&c).len(), 20);

    // 2. Every copy fails (503): the moving blobs stay, the others are deleted.
    app.storage.fault_on(
        &format!("PUT /devstoreaccount1/{}/", dead.as_str()),
        Fault::Status(503),
    );
    let a = tick(&app);
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["passCompleted"], true, "{}", a.text);
    assert_eq!(a.json["deleted"], 10, "{}", a.text);
    assert_eq!(a.json["errors"], 10, "{}", a.text);
    assert_eq!(names(&c), movers);
    assert!(names(&dead).is_empty());
    app.storage.set_fault(None);

    // 3. The copies succeed but every delete fails (a crash between copy and delete): each
    //    blob is now in both places, never in neither.
    app.storage.fault_on(
        &format!("DELETE /devstoreaccount1/{}/", c.as_str()),
        Fault::Refuse,
    );
    let a = tick(&app);
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["errors"], 10, "{}", a.text);
    assert_eq!(a.json["moved"], 0, "{}", a.text);
    assert_eq!(names(&c), movers);
    assert_eq!(names(&dead), movers);
    app.storage.set_fault(None);

    // 4. Storage is back: the next pass moves them (the duplicates are overwritten by the same
    //    content) and deletes the sources.
    let a = tick(&app);
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["moved"], 10, "{}", a.text);
    assert_eq!(a.json["errors"], 0, "{}", a.text);
    assert!(names(&c).is_empty());
    assert_eq!(names(&dead), movers);
    for name in &movers {
        let blob = block_on(client().execute(
            &GetBlob {
                container: dead.clone(),
                blob: BlobName::try_new(name).unwrap(),
            },
            SystemTime::now(),
        ))
        .unwrap()
        .0
        .unwrap();
        let i: usize = name[2..].parse().unwrap();
        assert_eq!(blob.body, format!("v{i}").as_bytes());
    }
    let st = state(&app);
    assert_eq!(st["purged"], 20, "{st}");
    assert_eq!(st["moved"], 10, "{st}");
    assert_eq!(st["passes"], 3, "{st}");
}

/// A tick stays within its bound: past its work deadline (twice the budget, at least the budget
/// and 5 s) it begins no more blobs of the page it holds; they are left to the next pass.
#[test]
fn a_slow_page_is_cut_at_the_work_deadline_and_the_next_pass_finishes_it() {
    let c = unique_container("ttlslow");
    create_container(&c);
    let past = rfc3339(SystemTime::now() - Duration::from_secs(60));
    for i in 0..4 {
        put(&c, &format!("s-{i}"), b"x", &[("TimeToLive", past.clone())]);
    }
    let app = sweeper(
        "slow",
        c.as_str(),
        &[
            ("ttl_time_budget_ms", "1000"),
            ("max_in_flight", "1"),
            ("ttl_pass_interval_seconds", "0"),
            ("storage_timeout_ms", "10000"),
        ],
        None,
    );
    // Each delete takes 3.5 s: two are begun before the work deadline (6 s), two are not.
    app.storage.fault_on(
        &format!("DELETE /devstoreaccount1/{}/", c.as_str()),
        Fault::Delay(Duration::from_millis(3500)),
    );
    let a = tick(&app);
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["deleted"], 2, "{}", a.text);
    assert_eq!(
        a.json["skipped"]["the tick's time ran out (the next pass takes it)"], 2,
        "{}",
        a.text
    );
    app.storage.set_fault(None);
    // The next ticks complete that pass and sweep the rest. (A tick on a loaded machine may
    // spend its budget before its first claim: ticks go on until the deadline.)
    let mut answers = Vec::new();
    let mut deleted = 0;
    wait_for(
        "the next passes to delete the two blobs left",
        Duration::from_secs(60),
        || {
            let b = tick(&app);
            assert_eq!(b.status, 200, "{}", b.text);
            deleted += b.json["deleted"].as_u64().unwrap();
            answers.push(b.text);
            (deleted >= 2).then_some(())
        },
    );
    assert_eq!(deleted, 2, "{answers:#?}");
    assert!(list(&c).is_empty());
}

/// 25.3: lock-blob clean-up is on by default: with nothing set but the defaults, the sweeper
/// sweeps the app's own lock blobs (retention one day).
#[test]
fn lock_blob_clean_up_is_on_by_default() {
    let app = App::start("lockclean", &[]);
    let a = call("POST", &app.url("/api/sweeper/tick"), &[TIMER_AUTH], b"");
    assert_eq!(a.status, 200, "{}", a.text);
    let s = call("GET", &app.url("/api/sweeper"), &[TIMER_AUTH], b"");
    let swept: Vec<&str> = s.json["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "locks")
        .map(|c| c["prefix"].as_str().unwrap())
        .collect();
    assert_eq!(swept, ["alerts/", "gates/"], "{}", s.text);
}
