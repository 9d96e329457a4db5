//! ttl-sweeper edge cases, as the release `.wasm` served by the real `spin up`, against Azurite:
//! moves that would overwrite another blob in the dead-blob container, a dead-blob container that
//! is the app's own container, marking input that storage cannot take, a new pass that starts while
//! a worker still moves the previous pass's blobs, counters after a lost answer, and the prefixes
//! that must never be swept.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use leasegate::ops::{GetBlob, ListBlobs};
use leasegate::{BlobName, ContainerName};
use leasegate_cli::block_on;
use leasegate_tests::app::{call, Answer, App, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::blobs::{client, create_container, put, rfc3339};
use leasegate_tests::proxy::Fault;
use leasegate_tests::{unique_container, wait_for};
use serde_json::{json, Value};

fn past() -> String {
    rfc3339(SystemTime::now() - Duration::from_secs(3600))
}

/// The names of a container's blobs.
fn names(c: &ContainerName) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut marker = None;
    loop {
        let op = ListBlobs {
            marker: marker.clone(),
            ..ListBlobs::new(c.clone())
        };
        let (page, _) = match block_on(client().execute(&op, SystemTime::now())) {
            Ok(p) => p,
            Err(e) if e.class() == Some(leasegate::ErrorClass::ContainerMissing) => return out,
            Err(e) => panic!("{e}"),
        };
        out.extend(page.blobs.into_iter().map(|b| b.name));
        match page.next_marker {
            Some(m) => marker = Some(m),
            None => return out,
        }
    }
}

/// The content of every blob of a container.
fn contents(c: &ContainerName) -> BTreeSet<String> {
    names(c)
        .into_iter()
        .map(|name| {
            let blob = block_on(client().execute(
                &GetBlob {
                    container: c.clone(),
                    blob: BlobName::try_new(&name).unwrap(),
                },
                SystemTime::now(),
            ))
            .unwrap()
            .0
            .unwrap();
            String::from_utf8(blob.body).unwrap()
        })
        .collect()
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
    App::start_with(
        tag,
        &vars,
        Setup {
            container: app_container,
            ..Default::default()
        },
    )
}

fn tick(app: &App) -> Answer {
    call("POST", &app.url("/api/sweeper/tick"), &[TIMER_AUTH], b"")
}

fn state(app: &App) -> Answer {
    call("GET", &app.url("/api/sweeper"), &[TIMER_AUTH], b"")
}

/// Marks a blob: `PUT /api/ttl/...`, an operator's route (the admin token).
fn mark(app: &App, container: &ContainerName, blob: &str, body: Value) -> Answer {
    call(
        "PUT",
        &app.url(&format!("/api/ttl/{}/{blob}", container.as_str())),
        &[ADMIN_AUTH, ("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// Ticks until a tick reports the pass complete; every tick must answer 200.
fn sweep_one_pass(app: &App) {
    wait_for("a pass", Duration::from_secs(60), || {
        let a = tick(app);
        assert_eq!(a.status, 200, "{}", a.text);
        (a.json["passCompleted"] == true).then_some(())
    });
}

/// Two expired blobs of the same name in two swept containers, moving to one dead-blob
/// container: both are deleted from their sources, so both must be found in the dead-blob
/// container. (The copy overwrites its destination unconditionally: the second move destroys
/// the first one's copy, and that blob is lost.)
#[test]
fn two_blobs_moved_to_one_dead_name_are_both_kept() {
    let (a, b) = (unique_container("ttlcola"), unique_container("ttlcolb"));
    let dead = unique_container("ttlcoldead");
    for c in [&a, &b, &dead] {
        create_container(c);
    }
    for (c, body) in [(&a, "report from a"), (&b, "report from b")] {
        put(
            c,
            "report.csv",
            body.as_bytes(),
            &[
                ("TimeToLive", past()),
                ("DeadBlobContainer", dead.as_str().to_string()),
            ],
        );
    }
    let app = sweeper(
        "ttlcollide",
        &format!("{},{}", a.as_str(), b.as_str()),
        &[],
        None,
    );
    sweep_one_pass(&app);
    assert!(
        names(&a).is_empty() && names(&b).is_empty(),
        "both sources deleted"
    );
    let kept = contents(&dead);
    assert!(
        kept.contains("report from a") && kept.contains("report from b"),
        "a deleted blob has no copy left in the dead-blob container: {kept:?}"
    );
}

/// A blob that already sits at the dead-blob destination, never marked to expire, is not
/// destroyed by a move onto its name.
#[test]
fn a_move_never_overwrites_a_blob_at_its_destination() {
    let src = unique_container("ttlowsrc");
    let archive = unique_container("ttlowarch");
    for c in [&src, &archive] {
        create_container(c);
    }
    put(&archive, "invoice-17.pdf", b"the signed original", &[]);
    put(
        &src,
        "invoice-17.pdf",
        b"a scratch copy",
        &[
            ("TimeToLive", past()),
            ("DeadBlobContainer", archive.as_str().to_string()),
        ],
    );
    let app = sweeper("ttloverwrite", src.as_str(), &[], None);
    sweep_one_pass(&app);
    let kept = contents(&archive);
    assert!(
        kept.contains("the signed original"),
        "an unexpired blob in the dead-blob container was overwritten: {kept:?}"
    );
    assert!(
        !names(&src).is_empty() || kept.contains("a scratch copy"),
        "the expired blob was deleted without a copy: {kept:?}"
    );
}

/// A marked blob whose dead-blob container is the app's own container (through the marking
/// API) must not be copied over the app's blobs: here it would overwrite the sweep state
/// itself, and every later tick fails (503 `state_unusable`).
#[test]
fn a_dead_blob_container_cannot_be_the_apps_own_container() {
    let data = unique_container("ttlowndata");
    create_container(&data);
    put(
        &data,
        "sweeper/state.json",
        b"this is not the sweep state",
        &[],
    );
    let app = sweeper(
        "ttlown",
        data.as_str(),
        &[("ttl_pass_interval_seconds", "0")],
        None,
    );
    // A first tick writes the real state.
    assert_eq!(tick(&app).status, 200);
    let marked = mark(
        &app,
        &data,
        "sweeper/state.json",
        json!({"expiresAt": "2020-01-01T00:00:00Z", "deadBlobContainer": app.container.as_str()}),
    );
    if marked.status == 200 {
        for _ in 0..3 {
            let a = tick(&app);
            assert_eq!(a.status, 200, "a tick after the move: {}", a.text);
        }
        let st = state(&app);
        assert_eq!(st.status, 200, "the sweep state: {}", st.text);
    } else {
        assert!(
            (400..500).contains(&marked.status),
            "{}: {}",
            marked.status,
            marked.text
        );
    }
}

/// A dead-blob prefix that is a valid blob name but not ASCII cannot be written as metadata:
/// the marking API must refuse it as bad input (4xx), not answer 503 `storage_unavailable`.
#[test]
fn a_non_ascii_dead_blob_prefix_is_bad_input() {
    let c = unique_container("ttlascii");
    create_container(&c);
    put(&c, "doc", b"x", &[]);
    let app = sweeper("ttlascii", c.as_str(), &[], None);
    for dead in ["archive/été/", "archive/\u{2603}/"] {
        let a = mark(
            &app,
            &c,
            "doc",
            json!({"ttlSeconds": 60, "deadBlobContainer": dead}),
        );
        assert!(
            (400..500).contains(&a.status),
            "{dead}: {} {}",
            a.status,
            a.text
        );
    }
    // A blob name that is not ASCII is fine where it belongs: in the path.
    put(&c, "café", b"x", &[]);
    let a = mark(&app, &c, "caf%C3%A9", json!({"ttlSeconds": 60}));
    assert_eq!(a.status, 200, "{}", a.text);
}

/// Worker A claims the page holding an expired blob and copies it to its dead-blob container;
/// its delete is slow. Meanwhile worker B completes the pass and (the pass interval being 0)
/// starts the next one, which lists the same blob again: it must not be moved a second time
/// (one copy in all, and no resurrected dead blob after a consumer took it).
#[test]
fn a_new_pass_does_not_move_a_blob_a_worker_is_still_moving() {
    let c = unique_container("ttlpass");
    let dead = unique_container("ttlpassdead");
    for x in [&c, &dead] {
        create_container(x);
    }
    put(
        &c,
        "x",
        b"payload",
        &[
            ("TimeToLive", past()),
            ("DeadBlobContainer", dead.as_str().to_string()),
        ],
    );
    let extra = [
        ("ttl_pass_interval_seconds", "0"),
        ("storage_timeout_ms", "10000"),
    ];
    let a = sweeper("ttlpassa", c.as_str(), &extra, None);
    let b = sweeper("ttlpassb", c.as_str(), &extra, Some(a.container.clone()));
    a.storage.fault_on(
        &format!("DELETE /devstoreaccount1/{}/x", c.as_str()),
        Fault::Delay(Duration::from_secs(5)),
    );
    let (a_answer, b_answers) = std::thread::scope(|s| {
        let h = s.spawn(|| tick(&a));
        wait_for("A to copy the blob", Duration::from_secs(10), || {
            names(&dead).contains("x").then_some(())
        });
        // A consumer of the dead-blob container takes the moved blob.
        block_on(client().execute(
            &leasegate::ops::DeleteBlob {
                container: dead.clone(),
                blob: BlobName::try_new("x").unwrap(),
                lease_id: None,
                condition: leasegate::ops::Condition::None,
            },
            SystemTime::now(),
        ))
        .unwrap();
        // B: the first tick completes the pass, the next starts a new one.
        let b_answers: Vec<Answer> = (0..3).map(|_| tick(&b)).collect();
        (h.join().unwrap(), b_answers)
    });
    assert_eq!(a_answer.status, 200, "{}", a_answer.text);
    for (i, x) in b_answers.iter().enumerate() {
        assert_eq!(x.status, 200, "B's tick {i}: {}", x.text);
    }
    // Every request both workers' proxies saw (every tick has answered: none is under way).
    let copy_path = format!("/devstoreaccount1/{}/x", dead.as_str());
    let copies: usize = [&a, &b]
        .iter()
        .flat_map(|app| app.storage.seen())
        .filter(|o| o.method == "PUT" && o.path() == copy_path)
        .count();
    let b_moved: u64 = b_answers
        .iter()
        .map(|x| x.json["moved"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        copies, 1,
        "the blob was copied {copies} times (B moved {b_moved}); A: {}",
        a_answer.text
    );
    assert!(
        !names(&dead).contains("x"),
        "the dead blob, taken by its consumer, came back"
    );
}

/// A state write whose answer is lost (storage wrote it) must not make the tick add the same
/// counters to the state again: `purged` stays equal to the blobs actually deleted.
#[test]
fn counters_are_recorded_once_when_a_state_answer_is_lost() {
    let c = unique_container("ttlcount");
    create_container(&c);
    for name in ["b-0", "b-1"] {
        put(&c, name, b"x", &[("TimeToLive", past())]);
    }
    let app = sweeper(
        "ttlcount",
        c.as_str(),
        &[("ttl_page_size", "1"), ("storage_timeout_ms", "10000")],
        None,
    );
    app.storage.fault_on(
        &format!("DELETE /devstoreaccount1/{}/b-0", c.as_str()),
        Fault::Delay(Duration::from_secs(3)),
    );
    let answer = std::thread::scope(|s| {
        let h = s.spawn(|| tick(&app));
        wait_for(
            "the first page to be claimed",
            Duration::from_secs(10),
            || (state(&app).json["pages"].as_u64().unwrap_or(0) >= 1).then_some(()),
        );
        // From now on, the state's writes land but their answers are lost.
        app.storage.fault_on(
            &format!(
                "PUT /devstoreaccount1/{}/sweeper/state.json",
                app.container.as_str()
            ),
            Fault::LoseAnswer,
        );
        h.join().unwrap()
    });
    app.storage.set_fault(None);
    let deleted = 2 - names(&c).len() as u64;
    assert_eq!(deleted, 1, "{}", answer.text);
    let st = state(&app).json;
    assert_eq!(
        st["purged"].as_u64().unwrap(),
        deleted,
        "the state counts {} deleted blobs, storage lost {deleted}: {st}; the tick answered {} {}",
        st["purged"],
        answer.status,
        answer.text
    );
}

/// The README: `init/`, `leader/`, `jobs/` and `sweeper/` are never swept. A lock prefix
/// naming the leader's locks is refused like the others.
#[test]
fn leader_locks_are_never_swept() {
    let data = unique_container("ttlleaderdata");
    create_container(&data);
    for prefix in ["init/", "jobs/", "sweeper/", "leader/"] {
        let app = sweeper(
            "ttlnosweep",
            data.as_str(),
            &[
                ("ttl_lock_retention_seconds", "2"),
                ("ttl_lock_prefixes", prefix),
            ],
            None,
        );
        let a = tick(&app);
        assert_eq!(a.status, 503, "{prefix}: {}", a.text);
        assert_eq!(a.json["error"], "not_configured", "{prefix}: {}", a.text);
    }
}
