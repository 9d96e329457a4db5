//! init-once, as the release `.wasm` served by the real `spin up`, against Azurite: 16
//! concurrent callers run the initialization once; a dead initializer is replaced with a larger
//! token and the work is marked done once; failures are never marked done; reset; timers (Azure
//! and the real cron plugin); bad input, and a timeout longer than the lease refused.

use std::time::Duration;

use leasegate_tests::app::{
    bad, call, expect_clear_errors, Answer, App, Manifest, Setup, ADMIN_AUTH, ADMIN_TOKEN,
    TIMER_AUTH, TIMER_TOKEN,
};
use leasegate_tests::proxy::{Fault, Seen};
use leasegate_tests::sink::Behaviour;
use leasegate_tests::wait_for;
use serde_json::{json, Value};

fn start(tag: &str, instance: &str, extra: &[(&str, &str)], setup: Setup) -> App {
    let mut vars = vec![("instance_id", instance)];
    vars.extend_from_slice(extra);
    App::start_with(tag, &vars, setup)
}

fn azure() -> Setup {
    Setup {
        manifest: Manifest::Azure,
        ..Setup::default()
    }
}

fn post(app: &App, name: &str) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/init/{name}")),
        &[TIMER_AUTH],
        b"",
    )
}

fn state(app: &App, name: &str) -> Answer {
    call(
        "GET",
        &app.url(&format!("/api/init/{name}")),
        &[TIMER_AUTH],
        b"",
    )
}

fn runs(apps: &[&App]) -> Vec<Value> {
    apps.iter()
        .flat_map(|a| a.sink.received())
        .filter(|r| r.path == "/init")
        .map(|r| r.body)
        .collect()
}

/// 16 concurrent callers, each on its own deployment (one `spin up` each, one container): the
/// initialization runs exactly once; the others answer 202 `running` with Retry-After while it
/// runs, and every caller then sees `done`. Each deployment has its own storage proxy, so the
/// winner's proxy counts exactly the storage requests of the winning call.
#[test]
fn sixteen_concurrent_callers_run_it_once() {
    const CALLERS: usize = 16;
    let container = leasegate_tests::unique_container("init16");
    let apps: Vec<App> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CALLERS)
            .map(|i| {
                let container = container.clone();
                s.spawn(move || {
                    start(
                        "init16",
                        &format!("node-{i}"),
                        &[],
                        Setup {
                            container: Some(container),
                            ..azure()
                        },
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for a in &apps {
        a.sink
            .behave(Behaviour::Late(Duration::from_millis(1500), 204));
    }
    let before: Vec<usize> = apps.iter().map(|a| a.storage.count()).collect();
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = apps
            .iter()
            .map(|app| s.spawn(move || post(app, "seed")))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // What reached each deployment's proxy during the calls: its one caller's requests.
    let during: Vec<Vec<Seen>> = apps
        .iter()
        .zip(&before)
        .map(|(a, &n)| a.storage.seen()[n..].to_vec())
        .collect();
    let ran: Vec<usize> = (0..CALLERS)
        .filter(|&i| answers[i].json["ran"] == true)
        .collect();
    assert_eq!(ran.len(), 1, "{answers:?}");
    let winner = ran[0];
    assert_eq!(
        answers[winner].json["instance"],
        format!("node-{winner}"),
        "{}",
        answers[winner].text
    );
    for a in &answers {
        match a.status {
            200 => assert_eq!(a.json["state"], "done", "{}", a.text),
            202 => {
                assert_eq!(a.json["state"], "running", "{}", a.text);
                assert!(a.headers["retry-after"].parse::<u64>().unwrap() >= 1);
            }
            other => panic!("{other}: {}", a.text),
        }
    }
    let all: Vec<&App> = apps.iter().collect();
    assert_eq!(runs(&all).len(), 1);
    // Everyone eventually sees done, and a later call runs nothing.
    for a in &apps {
        let s = wait_for("done", Duration::from_secs(10), || {
            let s = state(a, "seed");
            (s.json["state"] == "done").then_some(s)
        });
        assert_eq!(s.json["doneToken"], answers[winner].json["fencingToken"]);
        let (again, trips) = a.storage_requests(|| post(a, "seed"));
        assert_eq!(again.status, 200);
        assert_eq!(again.json["ran"], false);
        assert_eq!(trips, 1, "{}", again.text);
    }
    assert_eq!(runs(&all).len(), 1);
    // The winner's storage requests: the read; from it the acquire and the claim; the mark;
    // the release (5). One more when the winner created the lock blob (its read found none),
    // two when another caller created it first (the winner's create refused, then a HEAD).
    // With the container missing (the winner's read said so): the container's create and the
    // lock blob's, 7, or 8 when another's lock blob came first.
    let record = &during[winner];
    let made_container = record.iter().any(|o| !o.path().contains("/init/"));
    let base = if made_container { 7 } else { 5 };
    let trips = record.len();
    let described: Vec<String> = record
        .iter()
        .map(|o| format!("{} {}", o.describe(), o.path()))
        .collect();
    assert!(
        (base..=base + 2).contains(&trips),
        "{trips}: {described:#?}"
    );
}

/// The initializer stalls (its whole deployment is frozen, as a paused VM or container would
/// be, while it calls the initialization) past its 15 s lease: the next caller runs it again
/// with a larger token and marks it done, once; the stalled one, when it wakes, marks nothing.
/// (A call cannot outlive its lease by configuration: `init_timeout_seconds` and the two
/// storage requests of the mark must fit in `init_lease_seconds`.)
#[test]
fn a_dead_initializer_is_replaced_and_done_is_marked_once() {
    // The call (10 s) and the three storage requests after the grant (claim, two marks) fit
    // in the 15 s native lease.
    let vars = [
        ("init_lease_seconds", "15"),
        ("init_timeout_seconds", "10"),
        ("storage_timeout_ms", "1600"),
    ];
    let a = start("initdead", "node-a", &vars, azure());
    let b = start(
        "initdead",
        "node-b",
        &vars,
        Setup {
            container: Some(a.container.clone()),
            ..azure()
        },
    );
    a.sink.behave(Behaviour::Late(Duration::from_secs(2), 204));
    std::thread::scope(|s| {
        let slow = s.spawn(|| post(&a, "migrate"));
        wait_for(
            "A to call the initialization",
            Duration::from_secs(10),
            || (!a.sink.received().is_empty()).then_some(()),
        );
        a.spin.pause();
        // While A holds the lock, B is told it runs.
        let running = post(&b, "migrate");
        assert_eq!(running.status, 202, "{}", running.text);
        assert_eq!(running.json["runningOn"], "node-a");
        // A's lease runs out: B runs it again, with a larger token, and marks it done.
        let replaced = wait_for("B to run it again", Duration::from_secs(30), || {
            let r = post(&b, "migrate");
            (r.status == 200).then_some(r)
        });
        assert_eq!(replaced.json["ran"], true, "{}", replaced.text);
        a.spin.resume();
        let a_run = slow.join().unwrap();
        // A wakes after B's run: whether its call's answer or its timeout comes first, it no
        // longer holds the lease and marks nothing done.
        assert!(
            (a_run.status, a_run.json["error"].as_str()) == (409, Some("lease_lost"))
                || (a_run.status, a_run.json["error"].as_str()) == (502, Some("init_failed")),
            "{}",
            a_run.text
        );
        let runs = runs(&[&a, &b]);
        assert_eq!(runs.len(), 2);
        let (ta, tb) = (
            runs[0]["fencingToken"].as_u64().unwrap(),
            runs[1]["fencingToken"].as_u64().unwrap(),
        );
        assert!(tb > ta, "{ta} then {tb}");
        assert_ne!(runs[0]["idempotencyKey"], runs[1]["idempotencyKey"]);
        let s = state(&a, "migrate");
        assert_eq!(s.json["state"], "done");
        assert_eq!(s.json["doneBy"], "node-b");
        assert_eq!(s.json["doneToken"], tb);
    });
}

/// A failed initialization is not marked done, nor is one whose mark could not be written;
/// the next call runs it again. Storage failing before: nothing runs.
#[test]
fn never_done_without_a_successful_run() {
    let app = start(
        "initfail",
        "node-f",
        &[("storage_timeout_ms", "1000")],
        azure(),
    );
    app.sink.answer(500);
    let failed = post(&app, "seed");
    assert_eq!(failed.status, 502, "{}", failed.text);
    assert_eq!(failed.json["error"], "init_failed");
    assert_eq!(state(&app, "seed").json["state"], "pending");
    // The run succeeds but its mark cannot be written (storage answers 503): not done. The
    // fault is set once the initialization has been called: the acquire's claim is a Set
    // Metadata too, and must land for the run to start.
    app.sink
        .behave(Behaviour::Late(Duration::from_millis(1500), 204));
    let before = runs(&[&app]).len();
    let unmarked = std::thread::scope(|s| {
        let h = s.spawn(|| post(&app, "seed"));
        wait_for(
            "the initialization to be called",
            Duration::from_secs(10),
            || (runs(&[&app]).len() > before).then_some(()),
        );
        app.storage.fault_on("comp=metadata", Fault::Status(503));
        h.join().unwrap()
    });
    app.storage.set_fault(None);
    app.sink.answer(204);
    assert_eq!(unmarked.status, 503, "{}", unmarked.text);
    assert_eq!(unmarked.json["error"], "mark_failed", "{}", unmarked.text);
    assert_eq!(unmarked.json["ran"], true, "{}", unmarked.text);
    assert_ne!(state(&app, "seed").json["state"], "done");
    // Storage refused: nothing runs.
    let before = runs(&[&app]).len();
    app.storage.set_fault(Some(Fault::Refuse));
    let refused = post(&app, "other");
    app.storage.set_fault(None);
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert_eq!(runs(&[&app]).len(), before);
    // Once storage answers, the next call runs it and marks it done.
    let done = wait_for("the next call to run it", Duration::from_secs(10), || {
        let r = post(&app, "seed");
        (r.status == 200).then_some(r)
    });
    assert_eq!(done.json["ran"], true, "{}", done.text);
    assert_eq!(state(&app, "seed").json["state"], "done");
}

/// An operator resets a done initialization: the next call runs it again. The timer forms
/// (cron and Azure) run `init_name`.
#[test]
fn reset_and_timers() {
    let app = start("initreset", "node-r", &[("init_name", "boot")], azure());
    assert_eq!(post(&app, "boot").json["ran"], true);
    // The reset is the admin token's: the tick token is refused and resets nothing.
    let refused = call("DELETE", &app.url("/api/init/boot"), &[TIMER_AUTH], b"");
    assert_eq!(refused.status, 403, "{}", refused.text);
    assert_eq!(refused.json["error"], "forbidden", "{}", refused.text);
    assert_eq!(state(&app, "boot").json["state"], "done");
    let reset = call("DELETE", &app.url("/api/init/boot"), &[ADMIN_AUTH], b"");
    assert_eq!(reset.status, 200, "{}", reset.text);
    assert_eq!(state(&app, "boot").json["state"], "pending");
    // Azure timer: runs it again.
    let az = call(
        "POST",
        &app.url("/init-once"),
        &[("content-type", "application/json")],
        json!({"Data": {"timer": {"ScheduleStatus": null}}, "Metadata": {"sys": {"UtcNow": "2026-11-22T06:00:30Z"}}})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(az.status, 200, "{}", az.text);
    assert_eq!(az.json["ReturnValue"]["ran"], true);
    assert_eq!(runs(&[&app]).len(), 2);
    // Cron (the real plugin, every 2 s, on another deployment): done already, runs nothing.
    let cron = start(
        "initcron",
        "node-c",
        &[("init_name", "boot")],
        Setup {
            manifest: Manifest::Cron,
            cron: vec![("init-once", "*/2 * * * * *")],
            container: Some(app.container.clone()),
            ..Setup::default()
        },
    );
    let ticks = wait_for("two cron calls", Duration::from_secs(60), || {
        let t = cron_calls(&cron);
        (t.len() >= 2).then_some(t)
    });
    for t in &ticks {
        assert_eq!(t["name"], "boot", "{t}");
        assert_eq!(t["state"], "done", "{t}");
        assert_eq!(t["ran"], false, "{t}");
    }
    assert_eq!(runs(&[&app, &cron]).len(), 2);
    // Reset again: the next cron call runs it, once.
    let reset = wait_for("the reset", Duration::from_secs(20), || {
        let r = call("DELETE", &app.url("/api/init/boot"), &[ADMIN_AUTH], b"");
        (r.status != 409).then_some(r)
    });
    assert_eq!(reset.status, 200, "{}", reset.text);
    let run = wait_for(
        "the cron trigger to run it after the reset",
        Duration::from_secs(60),
        || runs(&[&cron]).first().cloned(),
    );
    assert_eq!(run["name"], "boot", "{run}");
    assert_eq!(run["instance"], "node-c", "{run}");
    let done = wait_for("done by the cron call", Duration::from_secs(20), || {
        let s = state(&app, "boot");
        (s.json["state"] == "done").then_some(s)
    });
    assert_eq!(done.json["doneBy"], "node-c", "{}", done.text);
    assert_eq!(done.json["doneToken"], run["fencingToken"], "{}", done.text);
    // The cron call that ran it logged so; later cron calls find it done.
    let seen = wait_for("the cron call's log line", Duration::from_secs(20), || {
        cron_calls(&cron)
            .iter()
            .position(|t| t["ran"] == true)
            .map(|i| i + 1)
    });
    assert_eq!(
        cron_calls(&cron)[seen - 1]["fencingToken"],
        run["fencingToken"]
    );
    let later = wait_for("two more cron calls", Duration::from_secs(60), || {
        let t = cron_calls(&cron);
        (t.len() >= seen + 2).then_some(t)
    });
    assert!(
        later[seen..]
            .iter()
            .all(|t| t["state"] == "done" && t["ran"] == false),
        "{:?}",
        &later[seen..]
    );
    assert_eq!(runs(&[&app, &cron]).len(), 3);
    cron.assert_no_trap();
}

/// The init-once calls `app` logged that came from the cron trigger.
fn cron_calls(app: &App) -> Vec<Value> {
    app.json_lines()
        .into_iter()
        .filter(|l| l["fn"] == "init-once" && l["trigger"] == "cron")
        .collect()
}

/// Bad input to every route: clear 4xx, no secret in answers or logs.
#[test]
fn bad_input_to_the_init_routes() {
    let app = start("initbad", "node-b", &[], azure());
    let json_ct = ("content-type", "application/json");
    let cases = [
        bad("POST", "/api/init/seed", &[], b"", 401),
        bad(
            "GET",
            "/api/init/seed",
            &[("authorization", "Bearer nope")],
            b"",
            401,
        ),
        bad("POST", "/api/init/", &[TIMER_AUTH], b"", 400),
        bad("POST", "/api/init/Bad_Name", &[TIMER_AUTH], b"", 400),
        bad("POST", "/api/init/a/b", &[TIMER_AUTH], b"", 400),
        bad("PUT", "/api/init/seed", &[TIMER_AUTH], b"", 405),
        bad("DELETE", "/api/init/seed", &[TIMER_AUTH], b"", 403),
        bad(
            "POST",
            "/api/init/seed",
            &[TIMER_AUTH],
            b"{\"force\":true}",
            400,
        ),
        bad("GET", "/init-once", &[], b"", 405),
        bad("POST", "/init-once", &[json_ct], b"[", 400),
    ];
    expect_clear_errors(
        &app,
        &cases,
        &[TIMER_TOKEN, ADMIN_TOKEN, leasegate::DEV_ACCOUNT_KEY],
    );
    assert!(runs(&[&app]).is_empty());
}

/// 21.11: an initialization allowed to take longer than its lock lasts is refused.
#[test]
fn an_init_timeout_above_its_lease_is_not_configured() {
    let app = App::start(
        "inittimeout",
        &[
            ("init_lease_seconds", "60"),
            ("init_timeout_seconds", "120"),
        ],
    );
    let a = call("POST", &app.url("/api/init/seed"), &[TIMER_AUTH], b"");
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "not_configured", "{}", a.text);
    let m = a.json["message"].as_str().unwrap();
    assert!(
        m.contains("init_timeout_seconds") && m.contains("init_lease_seconds"),
        "{m}"
    );
    assert!(app.sink.received().is_empty());
}
