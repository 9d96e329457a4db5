//! Passes of four workers over 2,000 blobs, blobs changed, leased or badly marked, the marking API.

use super::*;

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
        &[TIMER_TOKEN, ADMIN_TOKEN, leasegate::DEV_ACCOUNT_KEY],
    );
}
