//! init-once, as the release `.wasm` in the wasmtime host, against Azurite: 16 concurrent
//! callers run the initialization once; a dead initializer is replaced with a larger token and
//! the work is marked done once; failures are never marked done; reset; timers; bad input.

use std::time::Duration;

use leasegate_host::Fault;
use leasegate_tests::app::{
    bad, call, expect_clear_errors, Answer, App, Manifest, Setup, TIMER_AUTH, TIMER_TOKEN,
};
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

/// 16 concurrent callers on 4 deployments: the initialization runs exactly once; the others
/// answer 202 `running` with Retry-After while it runs, and every caller then sees `done`.
#[test]
fn sixteen_concurrent_callers_run_it_once() {
    let first = start("init16", "node-0", &[], azure());
    let container = first.container.clone();
    let mut apps = vec![first];
    for i in 1..4 {
        apps.push(start(
            "init16",
            &format!("node-{i}"),
            &[],
            Setup {
                container: Some(container.clone()),
                ..azure()
            },
        ));
    }
    for a in &apps {
        a.sink
            .behave(Behaviour::Late(Duration::from_millis(1500), 204));
    }
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let app = &apps[i % 4];
                s.spawn(move || post(app, "seed"))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ran: Vec<&Answer> = answers.iter().filter(|a| a.json["ran"] == true).collect();
    assert_eq!(ran.len(), 1, "{answers:?}");
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
        assert_eq!(s.json["doneToken"], ran[0].json["fencingToken"]);
        let again = post(a, "seed");
        assert_eq!(again.status, 200);
        assert_eq!(again.json["ran"], false);
        assert_eq!(a.record_of(&again).outbound_to(&a.storage), 1);
    }
    assert_eq!(runs(&all).len(), 1);
    // The winner's storage requests: the read, the acquire's three, the mark's two, the
    // release's two.
    let winner: usize = ran[0].json["instance"].as_str().unwrap()[5..]
        .parse()
        .unwrap();
    // (Two more when the winner was also the first to use the container: its create of the
    // lock blob was refused, then it created the container; one more when it created the lock
    // blob: a new blob holds no claim, the winner writes its claim under the lease.)
    let record = apps[winner].record_of(ran[0]);
    let made_container = record
        .outbound
        .iter()
        .any(|o| o.authority == apps[winner].storage && !o.path.contains("/init/"));
    let base = if made_container { 10 } else { 8 };
    let trips = record.outbound_to(&apps[winner].storage);
    assert!(
        trips == base || trips == base + 1,
        "{trips}: {:?}",
        record.outbound
    );
}

/// The initializer dies (its webhook hangs past the 15 s lease): the next caller runs it again
/// with a larger token, and it is marked done once, by that caller.
#[test]
fn a_dead_initializer_is_replaced_and_done_is_marked_once() {
    let a = start(
        "initdead",
        "node-a",
        &[("init_lease_seconds", "15"), ("init_timeout_seconds", "40")],
        azure(),
    );
    let b = start(
        "initdead",
        "node-b",
        &[("init_lease_seconds", "15"), ("init_timeout_seconds", "40")],
        Setup {
            container: Some(a.container.clone()),
            ..azure()
        },
    );
    a.sink.behave(Behaviour::Late(Duration::from_secs(22), 204));
    std::thread::scope(|s| {
        let slow = s.spawn(|| post(&a, "migrate"));
        wait_for(
            "A to call the initialization",
            Duration::from_secs(10),
            || (!a.sink.received().is_empty()).then_some(()),
        );
        // While A holds the lock, B is told it runs.
        let running = post(&b, "migrate");
        assert_eq!(running.status, 202, "{}", running.text);
        assert_eq!(running.json["runningOn"], "node-a");
        // A's lease runs out: B runs it again, with a larger token, and marks it done.
        let replaced = wait_for("B to run it again", Duration::from_secs(25), || {
            let r = post(&b, "migrate");
            (r.status == 200).then_some(r)
        });
        assert_eq!(replaced.json["ran"], true, "{}", replaced.text);
        let a_run = slow.join().unwrap();
        // A's answer comes back after B's run: it lost its lease and does not mark it done.
        assert_eq!(a_run.status, 409, "{}", a_run.text);
        assert_eq!(a_run.json["error"], "lease_lost");
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
    app.sink.answer(204);
    // The run succeeds but its mark cannot be written (storage answers 503): not done.
    app.host
        .set_request_fault(&app.storage, "comp=metadata", Fault::Status(503));
    let unmarked = post(&app, "seed");
    app.host.set_fault(&app.storage, None);
    assert_eq!(unmarked.status, 503, "{}", unmarked.text);
    assert_ne!(state(&app, "seed").json["state"], "done");
    // Storage refused: nothing runs.
    let before = runs(&[&app]).len();
    app.host.set_fault(&app.storage, Some(Fault::Refuse));
    let refused = post(&app, "other");
    app.host.set_fault(&app.storage, None);
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
    let reset = call("DELETE", &app.url("/api/init/boot"), &[TIMER_AUTH], b"");
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
    // Cron: done already, runs nothing.
    let cron = start(
        "initcron",
        "node-c",
        &[("init_name", "boot"), ("container", app.container.as_str())],
        Setup {
            manifest: Manifest::Cron,
            ..Setup::default()
        },
    );
    let fired = cron.host.fire_cron("init-once", 1_800_000_030).unwrap();
    assert!(fired.result.is_ok(), "{:?}", fired.result);
    assert_eq!(runs(&[&app, &cron]).len(), 2);
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
        &[TIMER_TOKEN, leasegate::account::DEV_ACCOUNT_KEY],
    );
    assert!(runs(&[&app]).is_empty());
}
