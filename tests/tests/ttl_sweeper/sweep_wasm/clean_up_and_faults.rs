//! Lock blobs' clean-up, the sweep's speed, storage faults, a slow page cut at the work deadline.

use super::*;

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
        !a.text.contains(&leasegate::DEV_ACCOUNT_KEY[..20]),
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
