//! ttl-sweeper with `ttl_find = tags` (opt-in; the default, `both`, finds the same way between
//! its listings: `ttl_sweeper/defaults_wasm.rs`), as the release `.wasm` under the real `spin up`, against Azurite through the fault proxy: marking writes the expiry tag beside
//! `TimeToLive`; a tick finds due blobs with Find Blobs by Tags and deletes only what it found
//! (a rewrite and a re-mark racing the sweep, each held at the proxy, are left alone); blobs
//! marked the old way are found only after `POST /api/sweeper/migrate`, which is resumable and
//! says how far it is; a 403 on the tag requests answers 502 `storage_forbidden` naming the fix.

use std::time::{Duration, Instant, SystemTime};

use leasegate::ops::{GetBlobTags, GetProperties, SetBlobTags, Tags};
use leasegate::{BlobName, ContainerName};
use leasegate_cli::block_on;
use leasegate_tests::app::{call, Answer, App, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::blobs::{account_sas, client, create_container, put, rfc3339};
use leasegate_tests::proxy::Fault;
use leasegate_tests::{unique_container, wait_for};
use serde_json::{json, Value};

/// The expiry tag (`ttl_sweeper::EXPIRES_TAG`).
const TAG: &str = "leasegate_expires_at";

fn name(n: &str) -> BlobName {
    BlobName::try_new(n).unwrap()
}

fn set_tags(c: &ContainerName, n: &str, tags: &[(&str, String)]) {
    let tags: Tags = tags
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    block_on(client().execute(
        &SetBlobTags {
            container: c.clone(),
            blob: name(n),
            tags,
            lease_id: None,
        },
        SystemTime::now(),
    ))
    .unwrap();
}

fn tags(c: &ContainerName, n: &str) -> Option<Tags> {
    block_on(client().execute(
        &GetBlobTags {
            container: c.clone(),
            blob: name(n),
        },
        SystemTime::now(),
    ))
    .unwrap()
    .0
}

fn exists(c: &ContainerName, n: &str) -> bool {
    block_on(client().execute(
        &GetProperties {
            container: c.clone(),
            blob: name(n),
        },
        SystemTime::now(),
    ))
    .unwrap()
    .0
    .is_some()
}

fn sweeper(tag: &str, containers: &str, extra: &[(&str, &str)]) -> App {
    let mut vars = vec![
        ("instance_id", tag),
        ("ttl_containers", containers),
        ("ttl_find", "tags"),
        ("ttl_pass_interval_seconds", "0"),
        ("ttl_lock_retention_seconds", "off"),
    ];
    vars.extend_from_slice(extra);
    App::start(tag, &vars)
}

fn tick(app: &App) -> Answer {
    call("POST", &app.url("/api/sweeper/tick"), &[TIMER_AUTH], b"")
}

fn mark(app: &App, c: &ContainerName, n: &str, body: Value) -> Answer {
    call(
        "PUT",
        &app.url(&format!("/api/ttl/{c}/{n}")),
        &[ADMIN_AUTH, ("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
}

fn migrate(app: &App) -> Answer {
    call("POST", &app.url("/api/sweeper/migrate"), &[ADMIN_AUTH], b"")
}

/// Ticks until a tick completes a pass; the sum of `deleted`.
fn pass(app: &App) -> u64 {
    let started = Instant::now();
    let mut deleted = 0;
    loop {
        assert!(started.elapsed() < Duration::from_secs(120), "no pass");
        let a = tick(app);
        assert_eq!(a.status, 200, "{}", a.text);
        deleted += a.json["deleted"].as_u64().unwrap();
        if a.json["passCompleted"] == json!(true) {
            return deleted;
        }
    }
}

/// Marking writes the tag beside `TimeToLive`; a pass finds and deletes only the due tagged
/// blobs, at a cost of one find (up to 5000 found, claimed in pages of `ttl_page_size`) and a
/// lease, a HEAD and a delete per due blob (the listing's
/// blobs are not read); blobs marked the old way stay until the migration tags them, which
/// goes page by page over several calls, saying how far it is.
#[test]
fn tags_find_due_blobs_and_the_migration_tags_old_marks() {
    let c = unique_container("tagsweep");
    create_container(&c);
    let app = sweeper(
        "tags-main",
        c.as_str(),
        &[("ttl_page_size", "4"), ("ttl_time_budget_ms", "100")],
    );
    let past = rfc3339(SystemTime::now() - Duration::from_secs(3600));
    let future = rfc3339(SystemTime::now() + Duration::from_secs(3600));
    for i in 0..10 {
        put(&c, &format!("due/{i}"), b"x", &[]);
        let a = mark(&app, &c, &format!("due/{i}"), json!({"expiresAt": past}));
        assert_eq!(a.status, 200, "{}", a.text);
        assert_eq!(a.json["tagged"], json!(true));
    }
    // Other index tags are kept beside the expiry tag.
    set_tags(&c, "due/0", &[("owner", "team-a".into())]);
    let a = mark(&app, &c, "due/0", json!({"expiresAt": past}));
    assert_eq!(a.status, 200, "{}", a.text);
    let t = tags(&c, "due/0").unwrap();
    assert_eq!(t.get("owner").map(String::as_str), Some("team-a"));
    assert_eq!(t.get(TAG), Some(&past));
    for i in 0..3 {
        put(&c, &format!("a-later/{i}"), b"x", &[]);
        assert_eq!(
            mark(
                &app,
                &c,
                &format!("a-later/{i}"),
                json!({"expiresAt": future})
            )
            .status,
            200
        );
    }
    // The live blobs sort before the due ones (Azurite 3.35's Find Blobs by Tags searches only
    // the first `maxresults` names after the marker: the sweeper asks for 5000).
    for i in 0..5 {
        put(
            &c,
            &format!("e-old/{i}"),
            b"x",
            &[("TimeToLive", past.clone())],
        );
    }
    for i in 0..6 {
        put(&c, &format!("b-plain/{i}"), b"x", &[]);
    }
    // Found blobs written in the second of the find are left for the next pass: wait it out.
    std::thread::sleep(Duration::from_millis(1100));
    let (deleted, seen) = app.counted(|| pass(&app));
    assert_eq!(deleted, 10);
    let on = |method: &str, part: &str| {
        seen.iter()
            .filter(|s| s.method == method && s.target.contains(part))
            .count()
    };
    assert_eq!(
        on("GET", "comp=blobs"),
        1,
        "one find of up to 5000, its 10 due blobs claimed in pages of 4"
    );
    assert_eq!(on("GET", "comp=list"), 0, "tags mode lists nothing");
    // Per due blob: a lease on the tag found, a HEAD under it, the delete under it.
    assert_eq!(on("PUT", &format!("/{c}/due/")), 10);
    assert_eq!(on("HEAD", &format!("/{c}/due/")), 10);
    assert_eq!(on("DELETE", &format!("/{c}/due/")), 10);
    for s in seen
        .iter()
        .filter(|s| s.target.contains(&format!("/{c}/due/")))
    {
        match s.method.as_str() {
            "PUT" => {
                assert_eq!(s.header("x-ms-lease-action"), Some("acquire"));
                assert_eq!(
                    s.header("x-ms-if-tags"),
                    Some(format!("\"{TAG}\" = '{past}'").as_str()),
                    "the lease is taken only on the tag found"
                );
            }
            "DELETE" => {
                assert!(s.header("x-ms-lease-id").is_some(), "under the lease");
                assert!(s.header("if-match").is_some(), "on the ETag read");
            }
            _ => {}
        }
    }
    for i in 0..10 {
        assert!(!exists(&c, &format!("due/{i}")));
    }
    for n in [
        "a-later/0",
        "a-later/2",
        "e-old/0",
        "e-old/4",
        "b-plain/0",
        "b-plain/5",
    ] {
        assert!(exists(&c, n), "{n}");
    }

    // The migration: admin token only; several calls (budget 100 ms, pages of 4 over 14
    // blobs, each listing held 150 ms at the proxy: a page per call), each answering its
    // progress; the last says done.
    app.storage
        .fault_on("comp=list", Fault::Delay(Duration::from_millis(150)));
    let refused = call("POST", &app.url("/api/sweeper/migrate"), &[TIMER_AUTH], b"");
    assert!(
        refused.status == 401 || refused.status == 403,
        "{}",
        refused.text
    );
    let mut calls = 0;
    let last = loop {
        calls += 1;
        assert!(calls < 50, "the migration does not end");
        let a = migrate(&app);
        assert_eq!(a.status, 200, "{}", a.text);
        assert!(a.json["scanned"].as_u64().is_some(), "{}", a.text);
        if a.json["done"] == json!(true) {
            break a.json;
        }
        assert!(a.json["containers"][0]["marker"].is_string(), "{}", a.text);
    };
    assert!(calls > 1, "resumed over several calls: {last}");
    assert_eq!(last["tagged"], 5, "{last}");
    assert_eq!(last["alreadyTagged"], 3, "{last}");
    assert_eq!(last["unmarked"], 6, "{last}");
    assert_eq!(last["scanned"], 14, "{last}");
    assert_eq!(tags(&c, "e-old/3").unwrap().get(TAG), Some(&past));
    app.storage.set_fault(None);
    // Now the old marks are found.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(pass(&app), 5);
    assert!(!exists(&c, "e-old/3") && exists(&c, "a-later/1") && exists(&c, "b-plain/1"));
    // Done, a call starts a new pass (nothing left to tag).
    let again = migrate(&app);
    assert_eq!(again.status, 200, "{}", again.text);
    assert!(again.json["tagged"] == 0 || again.json["done"] == json!(false));
}

/// Ticks while the sweeper's storage request whose `METHOD /account/container/blob?query`
/// contains `part` is held at the proxy (1.5 s), runs `race` while it is held, and returns the
/// tick's answer.
fn race_tick(app: &App, part: &str, race: impl FnOnce()) -> Answer {
    // Held less than the app's storage timeout (3 s in the tests).
    app.storage
        .fault_on(part, Fault::Delay(Duration::from_millis(1500)));
    let before = app.storage.seen().len();
    std::thread::scope(|s| {
        let ticking = s.spawn(|| tick(app));
        wait_for("the held request", Duration::from_secs(30), || {
            app.storage.seen()[before..]
                .iter()
                .any(|r| format!("{} {}", r.method, r.target).contains(part))
                .then_some(())
        });
        // Later requests go through at once; the held one is forwarded after its delay.
        app.storage.set_fault(None);
        race();
        ticking.join().unwrap()
    })
}

/// A rewrite and a re-mark racing the sweep are never deleted. The sweeper's lease on the
/// found blob (taken only while its tag is the one found) is held at the proxy while the test
/// (1) rewrites the blob with the same due tag: read under the lease, it is newer than the find
/// (left for the next pass); (2) re-marks its tag alone (Set Blob Tags: no new ETag): the lease
/// is refused; (3) re-marks it through the API (metadata and tag): the lease is refused. And
/// (4) while the delete is held, a re-mark through the API is refused (409 `leased`: the
/// sweeper holds the blob) and the delete goes through: the re-mark never happened. Each
/// blob left is swept once due again.
#[test]
fn a_rewrite_and_a_re_mark_racing_the_sweep_are_not_deleted() {
    let c = unique_container("tagrace");
    create_container(&c);
    let app = sweeper("tags-race", c.as_str(), &[]);
    let past = rfc3339(SystemTime::now() - Duration::from_secs(3600));
    let future = rfc3339(SystemTime::now() + Duration::from_secs(3600));
    let due = |n: &str| {
        put(&c, n, b"old", &[]);
        assert_eq!(mark(&app, &c, n, json!({"expiresAt": past})).status, 200);
    };
    let lease = |n: &str| format!("PUT /devstoreaccount1/{c}/{n}?comp=lease");

    // 1. Rewritten while the lease request is held, with the same metadata and due tag.
    due("rewrite");
    std::thread::sleep(Duration::from_millis(1100));
    let a = race_tick(&app, &lease("rewrite"), || {
        put(&c, "rewrite", b"new", &[("timetolive", past.clone())]);
        set_tags(&c, "rewrite", &[(TAG, past.clone())]);
    });
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["deleted"], 0, "{}", a.text);
    assert_eq!(a.json["skipped"]["changed since found"], 1, "{}", a.text);
    assert!(exists(&c, "rewrite"));

    // 2. The tag alone re-marked while the lease request is held: the ETag is the same, the tag
    // not. (The rewritten blob of case 1 is found again in this tick and deleted: it is due.)
    due("retag");
    std::thread::sleep(Duration::from_millis(1100));
    let a = race_tick(&app, &lease("retag"), || {
        set_tags(&c, "retag", &[(TAG, future.clone())]);
    });
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["skipped"]["re-marked since found"], 1, "{}", a.text);
    assert!(exists(&c, "retag"), "{}", a.text);
    assert_eq!(tags(&c, "retag").unwrap().get(TAG), Some(&future));
    assert!(!exists(&c, "rewrite"), "due, unchanged since: deleted");

    // 3. Re-marked through the API (metadata and tag) while the lease request is held.
    due("remark");
    std::thread::sleep(Duration::from_millis(1100));
    let a = race_tick(&app, &lease("remark"), || {
        let m = mark(&app, &c, "remark", json!({"expiresAt": future}));
        assert_eq!(m.status, 200, "{}", m.text);
    });
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["deleted"], 0, "{}", a.text);
    assert!(exists(&c, "remark"));
    assert_eq!(tags(&c, "remark").unwrap().get(TAG), Some(&future));
    assert!(!a.text.contains("errors\":1"), "{}", a.text);

    // 4. A re-mark while the delete is held is refused: the sweeper holds the blob.
    due("late");
    std::thread::sleep(Duration::from_millis(1100));
    let a = race_tick(&app, &format!("DELETE /devstoreaccount1/{c}/late"), || {
        let m = mark(&app, &c, "late", json!({"expiresAt": future}));
        assert_eq!(m.status, 409, "{}", m.text);
        assert_eq!(m.json["error"], "leased", "{}", m.text);
    });
    assert_eq!(a.status, 200, "{}", a.text);
    assert!(!exists(&c, "late"), "{}", a.text);

    // Due again: swept.
    for n in ["retag", "remark"] {
        assert_eq!(mark(&app, &c, n, json!({"expiresAt": past})).status, 200);
    }
    std::thread::sleep(Duration::from_millis(1100));
    let a = tick(&app);
    assert_eq!(a.status, 200, "{}", a.text);
    assert!(!exists(&c, "retag") && !exists(&c, "remark"), "{}", a.text);
}

/// Without the tag permissions (storage answers 403 `AuthorizationPermissionMismatch`, as Azure
/// does for an identity without the data actions; Azurite has no RBAC, so the proxy answers),
/// a tick, a marking and the migration answer 502 `storage_forbidden` naming the fix, never a
/// secret; `ttl_find = list` does without them (marking answers `tagged: false`).
#[test]
fn missing_tag_permissions_answer_storage_forbidden_naming_the_fix() {
    let c = unique_container("tagdeny");
    create_container(&c);
    put(&c, "a", b"x", &[]);
    let app = sweeper("tags-deny", c.as_str(), &[]);
    let deny = Fault::Error(403, "AuthorizationPermissionMismatch");
    app.storage.fault_on("comp=blobs", deny.clone());
    let t = tick(&app);
    assert_eq!(t.status, 502, "{}", t.text);
    assert_eq!(t.json["error"], "storage_forbidden", "{}", t.text);
    let m = t.json["message"].as_str().unwrap();
    for fix in [
        "Storage Blob Data Owner",
        "filter/action",
        "tags/write",
        "ttl_find = list",
    ] {
        assert!(m.contains(fix), "{fix}: {m}");
    }
    app.storage.set_fault(None);
    app.storage.fault_on("comp=tags", deny.clone());
    let a = mark(&app, &c, "a", json!({"ttlSeconds": 60}));
    assert_eq!(a.status, 502, "{}", a.text);
    assert_eq!(a.json["error"], "storage_forbidden");
    assert_eq!(
        a.json["storageErrorCode"],
        "AuthorizationPermissionMismatch"
    );
    assert!(a.json["message"]
        .as_str()
        .unwrap()
        .contains("permissions t (tags) and f"));
    let g = migrate(&app);
    // (Listing with include=tags is a tag read too.)
    app.storage.fault_on("include=metadata", deny.clone());
    let g2 = migrate(&app);
    for g in [&g, &g2] {
        assert_eq!(g.status, 502, "{}", g.text);
        assert_eq!(g.json["error"], "storage_forbidden");
    }
    app.assert_no_secret(&[&t, &a, &g, &g2]);
    drop(app);

    // `list` marks without the tag.
    let listing = sweeper("tags-deny-list", c.as_str(), &[("ttl_find", "list")]);
    listing.storage.fault_on("comp=tags", deny);
    let a = mark(&listing, &c, "a", json!({"ttlSeconds": 60}));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["tagged"], json!(false));
}

/// With a real SAS: Azurite enforces the tag permissions of a SAS (`t` for Set and Get Blob
/// Tags, `f` for Find Blobs by Tags), so a `storage_sas` without them makes a tick and a
/// marking answer 502 `storage_forbidden` naming the fix, never the SAS; with `t` and `f` the
/// same deployment marks and sweeps.
#[test]
fn a_sas_without_the_tag_permissions_answers_storage_forbidden() {
    let c = unique_container("tagsas");
    create_container(&c);
    put(&c, "a", b"x", &[]);
    let narrow = account_sas("rwdlac");
    let app = sweeper("tags-sas", c.as_str(), &[("storage_sas", narrow.as_str())]);
    let t = tick(&app);
    assert_eq!(t.status, 502, "{}", t.text);
    assert_eq!(t.json["error"], "storage_forbidden", "{}", t.text);
    assert!(t.json["message"]
        .as_str()
        .unwrap()
        .contains("t (tags) and f"));
    let a = mark(&app, &c, "a", json!({"ttlSeconds": 1}));
    assert_eq!(a.status, 502, "{}", a.text);
    assert_eq!(a.json["error"], "storage_forbidden", "{}", a.text);
    let sig = narrow.split("sig=").nth(1).unwrap();
    for answer in [&t, &a] {
        assert!(!answer.text.contains(sig), "the SAS is never shown");
    }
    drop(app);
    let wide = account_sas("rwdlactf");
    let app = sweeper("tags-sas-ok", c.as_str(), &[("storage_sas", wide.as_str())]);
    let a = mark(
        &app,
        &c,
        "a",
        json!({"expiresAt": rfc3339(SystemTime::now() - Duration::from_secs(60))}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(pass(&app), 1);
    assert!(!exists(&c, "a"));
}

/// A found blob asking to be moved is copied to its dead-blob container under the sweeper's
/// lease (a leased source can be read) and deleted with the lease id: the copy holds its
/// content and metadata; Copy Blob does not copy index tags, so the dead copy is never found.
#[test]
fn a_found_blob_is_moved_under_the_lease() {
    let c = unique_container("tagmove");
    let dead = unique_container("tagdead");
    create_container(&c);
    let app = sweeper(
        "tags-move",
        c.as_str(),
        &[("ttl_dead_containers", dead.as_str())],
    );
    put(&c, "m", b"content m", &[("owner", "team-a".into())]);
    let past = rfc3339(SystemTime::now() - Duration::from_secs(60));
    let a = mark(
        &app,
        &c,
        "m",
        json!({"expiresAt": past, "deadBlobContainer": format!("{dead}/moved/")}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(pass(&app), 1);
    assert!(!exists(&c, "m"));
    let (copy, _) = block_on(client().execute(
        &leasegate::ops::GetBlob {
            container: dead.clone(),
            blob: name("moved/m"),
        },
        SystemTime::now(),
    ))
    .unwrap();
    let copy = copy.expect("the dead copy");
    assert_eq!(copy.body, b"content m");
    assert_eq!(
        copy.properties.metadata.get("owner").map(String::as_str),
        Some("team-a")
    );
    assert_eq!(tags(&dead, "moved/m"), Some(Tags::new()));
}
