//! leader, as the release `.wasm` in the wasmtime host, against Azurite: one leader per term
//! among instances ticking concurrently, failover within one lease length when the leader
//! stops, step-down, storage faults, bad input.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use leasegate_host::Fault;
use leasegate_tests::app::{
    bad, call, expect_clear_errors, Answer, App, Manifest, Setup, TIMER_AUTH, TIMER_TOKEN,
};
use serde_json::{json, Value};

const LEASE: u64 = 15;

fn start(tag: &str, instance: &str, container: Option<leasegate::ContainerName>) -> App {
    App::start_with(
        tag,
        &[("instance_id", instance), ("leader_lease_seconds", "15")],
        Setup {
            manifest: Manifest::Azure,
            container,
            ..Setup::default()
        },
    )
}

fn tick(app: &App) -> Answer {
    call("POST", &app.url("/api/leader/tick"), &[TIMER_AUTH], b"")
}

fn heartbeats(apps: &[App]) -> Vec<Value> {
    apps.iter()
        .flat_map(|a| a.sink.received())
        .filter(|r| r.path == "/heartbeat")
        .map(|r| r.body)
        .collect()
}

/// Every instance ticks at once, `rounds` times, `every` apart: the answers of each round.
fn tick_all(apps: &[App], alive: &[bool]) -> Vec<Option<Answer>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = apps
            .iter()
            .zip(alive)
            .map(|(app, alive)| s.spawn(move || alive.then(|| tick(app))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// 5 instances tick concurrently for a few lease lengths: exactly one leader per term, terms
/// strictly increase, heartbeats carry only the current term. Then the leader stops: a follower
/// takes over within one lease length with a larger term, and the old leader, ticking again,
/// reports follower.
#[test]
fn one_leader_per_term_and_failover_within_one_lease() {
    let first = start("elect", "node-0", None);
    let container = first.container.clone();
    let mut apps = vec![first];
    for i in 1..5 {
        apps.push(start(
            "elect",
            &format!("node-{i}"),
            Some(container.clone()),
        ));
    }
    let mut alive = vec![true; 5];
    let mut leaders_by_term: BTreeMap<u64, String> = BTreeMap::new();
    let mut last_term = 0;
    let mut leader = String::new();
    let started = Instant::now();
    // Two lease lengths of ticks, every 3 s.
    while started.elapsed() < Duration::from_secs(2 * LEASE) {
        let answers = tick_all(&apps, &alive);
        let leaders: Vec<&Value> = answers
            .iter()
            .flatten()
            .map(|a| &a.json)
            .filter(|v| v["role"] == "leader")
            .collect();
        assert_eq!(leaders.len(), 1, "one leader per round: {answers:?}");
        let term = leaders[0]["term"].as_u64().unwrap();
        let who = leaders[0]["instance"].as_str().unwrap().to_string();
        assert!(
            term >= last_term,
            "terms never go back: {term} after {last_term}"
        );
        if let Some(previous) = leaders_by_term.insert(term, who.clone()) {
            assert_eq!(previous, who, "term {term} had two leaders");
        }
        for a in answers.iter().flatten() {
            assert_eq!(a.status, 200, "{}", a.text);
            // A follower names the leader (unless it lost the race at the very moment the
            // leader took the lock, before its claim was there).
            if a.json["role"] == "follower" && !a.json["leader"].is_null() {
                assert_eq!(a.json["leader"], who.as_str(), "{}", a.text);
                assert_eq!(a.json["term"], term);
            }
        }
        last_term = term;
        leader = who;
        std::thread::sleep(Duration::from_secs(3));
    }
    assert_eq!(
        leaders_by_term.len(),
        1,
        "a leader that keeps ticking keeps its term"
    );
    // Heartbeats: one per leader tick, all with the current term.
    let beats = heartbeats(&apps);
    assert!(!beats.is_empty());
    assert!(beats
        .iter()
        .all(|b| b["term"] == last_term && b["leader"] == leader.as_str()));
    assert!(beats
        .iter()
        .all(|b| b["idempotencyKey"].as_str().unwrap().len() == 32));

    // The leader stops ticking.
    let old = leader.trim_start_matches("node-").parse::<usize>().unwrap();
    alive[old] = false;
    let stopped = Instant::now();
    let new_leader = loop {
        assert!(
            stopped.elapsed() < Duration::from_secs(LEASE + 10),
            "no follower took over within one lease length"
        );
        let answers = tick_all(&apps, &alive);
        let leaders: Vec<&Value> = answers
            .iter()
            .flatten()
            .map(|a| &a.json)
            .filter(|v| v["role"] == "leader")
            .collect();
        assert!(leaders.len() <= 1, "{answers:?}");
        if let Some(l) = leaders.first() {
            break (*l).clone();
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    let failover = stopped.elapsed();
    println!(
        "failover: a follower led {failover:?} after the leader's last tick (lease {LEASE} s)"
    );
    assert!(failover <= Duration::from_secs(LEASE + 2), "{failover:?}");
    assert!(new_leader["term"].as_u64().unwrap() > last_term);
    assert_eq!(new_leader["tookOver"], true);
    // The old leader comes back: it learns it lost.
    let back = tick(&apps[old]);
    assert_eq!(back.status, 200, "{}", back.text);
    assert_eq!(back.json["role"], "follower", "{}", back.text);
    assert_eq!(back.json["leader"], new_leader["instance"]);
    // The old leader's heartbeats all carry the old term; the new one's the new term.
    let beats = heartbeats(&apps);
    let new_term = new_leader["term"].as_u64().unwrap();
    for b in &beats {
        let t = b["term"].as_u64().unwrap();
        assert!(t == last_term || t == new_term, "{b}");
        if t == new_term {
            assert_eq!(b["leader"], new_leader["instance"]);
        }
    }
}

/// GET reports who leads without taking the lease; DELETE on the leader's deployment hands
/// over at once; DELETE elsewhere says so.
#[test]
fn status_and_step_down() {
    let a = start("stepdown", "node-a", None);
    let b = start("stepdown", "node-b", Some(a.container.clone()));
    let vacant = call("GET", &a.url("/api/leader"), &[TIMER_AUTH], b"");
    assert_eq!(vacant.status, 200, "{}", vacant.text);
    assert_eq!(vacant.json["state"], "vacant");
    let led = tick(&a);
    assert_eq!(led.json["role"], "leader", "{}", led.text);
    let term = led.json["term"].as_u64().unwrap();
    let status = call("GET", &b.url("/api/leader"), &[TIMER_AUTH], b"");
    assert_eq!(status.json["state"], "led", "{}", status.text);
    assert_eq!(status.json["leader"], "node-a");
    assert_eq!(status.json["term"], term);
    assert_eq!(status.json["since"], led.json["since"]);
    let expires = humantime::parse_rfc3339(status.json["expiresAt"].as_str().unwrap()).unwrap();
    let server = humantime::parse_rfc3339(status.json["serverTime"].as_str().unwrap()).unwrap();
    let left = expires.duration_since(server).unwrap();
    assert!(
        left <= Duration::from_secs(LEASE) && left >= Duration::from_secs(LEASE - 3),
        "{left:?}"
    );
    // GET took nothing: the leader still extends with the same term.
    assert_eq!(b.record_of(&status).outbound_to(&b.storage), 1);
    assert_eq!(tick(&a).json["term"], term);
    // A step-down sent to another deployment.
    let wrong = call(
        "DELETE",
        &a.url("/api/leader?instance=node-b"),
        &[TIMER_AUTH],
        b"",
    );
    assert_eq!(wrong.status, 409, "{}", wrong.text);
    let not_leader = call("DELETE", &b.url("/api/leader"), &[TIMER_AUTH], b"");
    assert_eq!(not_leader.json["steppedDown"], false, "{}", not_leader.text);
    // The leader steps down: the next tick of b leads at once, with a larger term.
    let down = call(
        "DELETE",
        &a.url("/api/leader?instance=node-a"),
        &[TIMER_AUTH],
        b"",
    );
    assert_eq!(down.status, 200, "{}", down.text);
    assert_eq!(down.json["steppedDown"], true);
    let next = tick(&b);
    assert_eq!(next.json["role"], "leader", "{}", next.text);
    assert!(next.json["term"].as_u64().unwrap() > term);
    assert_eq!(tick(&a).json["role"], "follower");
    // Requests per tick: leader 3 (HEAD, acquire, claim), follower 1.
    let l = tick(&b);
    let f = tick(&a);
    assert_eq!(b.record_of(&l).outbound_to(&b.storage), 3);
    assert_eq!(a.record_of(&f).outbound_to(&a.storage), 1);
}

/// While storage fails, nobody claims leadership and no heartbeat goes out; a failing
/// heartbeat receiver is reported, and the leader stays leader.
#[test]
fn no_leader_while_storage_fails() {
    let app = start("leaderfault", "node-f", None);
    for fault in [
        Fault::Refuse,
        Fault::Status(503),
        Fault::Delay(Duration::from_secs(4)),
    ] {
        app.host.set_fault(&app.storage, Some(fault.clone()));
        let a = tick(&app);
        assert_eq!(a.status, 503, "{fault:?}: {}", a.text);
        assert_eq!(a.json["role"], "unknown");
        assert_eq!(a.json["error"], "storage_unavailable");
    }
    app.host.set_fault(&app.storage, None);
    assert!(heartbeats(std::slice::from_ref(&app)).is_empty());
    app.sink.answer(500);
    let a = tick(&app);
    assert_eq!(a.status, 502, "{}", a.text);
    assert_eq!(a.json["role"], "leader");
    assert_eq!(a.json["heartbeat"], "failed");
}

/// Bad input to every route: clear 4xx, no secret in answers or logs.
#[test]
fn bad_input_to_the_leader_routes() {
    let app = start("leaderbad", "node-b", None);
    let json_ct = ("content-type", "application/json");
    let cases = [
        bad("POST", "/api/leader/tick", &[], b"", 401),
        bad(
            "GET",
            "/api/leader",
            &[("authorization", "Bearer nope")],
            b"",
            401,
        ),
        bad("PUT", "/api/leader", &[TIMER_AUTH], b"", 405),
        bad("GET", "/api/leader/tick", &[TIMER_AUTH], b"", 405),
        bad("POST", "/api/leader/nope", &[TIMER_AUTH], b"", 404),
        bad("POST", "/api/leader/tick", &[TIMER_AUTH], b"{\"x\":1}", 400),
        bad("DELETE", "/api/leader?who=me", &[TIMER_AUTH], b"", 400),
        bad(
            "DELETE",
            "/api/leader?instance=a&instance=b",
            &[TIMER_AUTH],
            b"",
            400,
        ),
        bad("GET", "/leader", &[], b"", 405),
        bad("POST", "/leader", &[json_ct], b"nope", 400),
    ];
    expect_clear_errors(
        &app,
        &cases,
        &[TIMER_TOKEN, leasegate::account::DEV_ACCOUNT_KEY],
    );
    // Azure timer invocations work on this deployment.
    let az = call(
        "POST",
        &app.url("/leader"),
        &[("content-type", "application/json")],
        json!({"Data": {"timer": {"IsPastDue": false}}, "Metadata": {"sys": {"UtcNow": "2026-11-22T06:00:00Z"}}})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(az.status, 200, "{}", az.text);
    assert_eq!(az.json["ReturnValue"]["role"], "leader");
}
