//! leader, as the release `.wasm` served by the real `spin up`, against Azurite: one leader per
//! term among instances ticking concurrently, failover within one lease length when the leader
//! stops, step-down (a stepped-down leader stays a follower for a lease length), storage
//! faults, bad input, and the leader on the real cron plugin.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use leasegate_tests::app::{
    bad, call, expect_clear_errors, Answer, App, Manifest, Setup, ADMIN_AUTH, ADMIN_TOKEN,
    TIMER_AUTH, TIMER_TOKEN,
};
use leasegate_tests::proxy::Fault;
use leasegate_tests::wait_for;
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
/// takes over once the lease ran out (within a lease length, a second and a tick of the stop)
/// with a larger term, and the old leader, ticking again, reports follower.
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
            "no follower took over within a lease length, a second and a tick"
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
    let (status, status_trips) =
        b.storage_requests(|| call("GET", &b.url("/api/leader"), &[TIMER_AUTH], b""));
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
    assert_eq!(status_trips, 1, "GET /api/leader is one HEAD");
    assert_eq!(tick(&a).json["term"], term);
    // A step-down is the admin token's: the tick token is refused, and the leader stays.
    let refused = call(
        "DELETE",
        &a.url("/api/leader?instance=node-a"),
        &[TIMER_AUTH],
        b"",
    );
    assert_eq!(refused.status, 403, "{}", refused.text);
    assert_eq!(refused.json["error"], "forbidden", "{}", refused.text);
    assert_eq!(tick(&a).json["term"], term);
    // A step-down sent to another deployment.
    let wrong = call(
        "DELETE",
        &a.url("/api/leader?instance=node-b"),
        &[ADMIN_AUTH],
        b"",
    );
    assert_eq!(wrong.status, 409, "{}", wrong.text);
    let not_leader = call("DELETE", &b.url("/api/leader"), &[ADMIN_AUTH], b"");
    assert_eq!(not_leader.json["steppedDown"], false, "{}", not_leader.text);
    // The leader steps down: the next tick of b leads at once, with a larger term.
    let down = call(
        "DELETE",
        &a.url("/api/leader?instance=node-a"),
        &[ADMIN_AUTH],
        b"",
    );
    assert_eq!(down.status, 200, "{}", down.text);
    assert_eq!(down.json["steppedDown"], true);
    let next = tick(&b);
    assert_eq!(next.json["role"], "leader", "{}", next.text);
    assert!(next.json["term"].as_u64().unwrap() > term);
    assert_eq!(tick(&a).json["role"], "follower");
    // Requests per tick: leader 2 (the renew and the claim, from what b kept of its last
    // tick), follower 1. The claim is rewritten
    // only when it says more (a later expiry, in whole seconds): the counted tick comes in a
    // later second than the leader's last one.
    leasegate_tests::next_second();
    let (l, leader_trips) = b.storage_requests(|| tick(&b));
    let (f, follower_trips) = a.storage_requests(|| tick(&a));
    assert_eq!(l.json["role"], "leader", "{}", l.text);
    assert_eq!(f.json["role"], "follower", "{}", f.text);
    assert_eq!(leader_trips, 2, "{}", l.text);
    assert_eq!(follower_trips, 1, "{}", f.text);
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
        app.storage.set_fault(Some(fault.clone()));
        let a = tick(&app);
        assert_eq!(a.status, 503, "{fault:?}: {}", a.text);
        assert_eq!(a.json["role"], "unknown");
        assert_eq!(a.json["error"], "storage_unavailable");
    }
    app.storage.set_fault(None);
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
        bad("DELETE", "/api/leader", &[TIMER_AUTH], b"", 403),
        bad("DELETE", "/api/leader?who=me", &[ADMIN_AUTH], b"", 400),
        bad(
            "DELETE",
            "/api/leader?instance=a&instance=b",
            &[ADMIN_AUTH],
            b"",
            400,
        ),
        bad("GET", "/leader", &[], b"", 405),
        bad("POST", "/leader", &[json_ct], b"nope", 400),
    ];
    expect_clear_errors(
        &app,
        &cases,
        &[TIMER_TOKEN, ADMIN_TOKEN, leasegate::DEV_ACCOUNT_KEY],
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

/// The heartbeats `app`'s sink received.
fn beats_of(app: &App) -> Vec<Value> {
    heartbeats(std::slice::from_ref(app))
}

/// The leader ticks `app` logged that came from the cron trigger.
fn cron_ticks(app: &App) -> Vec<Value> {
    app.json_lines()
        .into_iter()
        .filter(|l| l["fn"] == "leader" && l["trigger"] == "cron")
        .collect()
}

/// The leader function under the real cron plugin: two cron-only deployments sharing one
/// container, each ticking every 2 s. Over at least 8 s of ticking, exactly one of them sends
/// heartbeats (at least 2, all with one term and its own name), while the other's ticks report
/// follower and name it.
#[test]
fn the_cron_plugin_elects_one_leader() {
    let start_cron = |instance: &str, container: Option<leasegate::ContainerName>| {
        App::start_with(
            "leadercron",
            &[("instance_id", instance), ("leader_lease_seconds", "15")],
            Setup {
                manifest: Manifest::Cron,
                cron: vec![("leader", "*/2 * * * * *")],
                container,
                ..Default::default()
            },
        )
    };
    let a = start_cron("cron-a", None);
    let b = start_cron("cron-b", Some(a.container.clone()));
    let apps = [a, b];
    let names = ["cron-a", "cron-b"];
    // Both deployments tick on the plugin's schedule.
    wait_for(
        "both deployments to log a cron tick",
        Duration::from_secs(60),
        || {
            apps.iter()
                .all(|app| !cron_ticks(app).is_empty())
                .then_some(())
        },
    );
    // Then at least 8 s of ticks, and enough of them to judge: two heartbeats in all, and two
    // ticks logged by each deployment.
    let watched = Instant::now();
    let counts = wait_for(
        "8 s of cron ticks with two heartbeats",
        Duration::from_secs(90),
        || {
            let counts: Vec<usize> = apps.iter().map(|a| beats_of(a).len()).collect();
            let ticked = apps.iter().all(|a| cron_ticks(a).len() >= 2);
            (watched.elapsed() >= Duration::from_secs(8)
                && ticked
                && counts.iter().sum::<usize>() >= 2)
                .then_some(counts)
        },
    );
    let senders: Vec<usize> = (0..2).filter(|&i| counts[i] > 0).collect();
    assert_eq!(
        senders.len(),
        1,
        "heartbeats per instance {counts:?}: exactly one instance leads"
    );
    let leader = senders[0];
    let follower = 1 - leader;
    assert!(counts[leader] >= 2, "{counts:?}");
    let beats = beats_of(&apps[leader]);
    let term = &beats[0]["term"];
    assert!(term.as_u64().is_some(), "{}", beats[0]);
    for b in &beats {
        assert_eq!(b["leader"], names[leader], "{b}");
        assert_eq!(
            &b["term"], term,
            "one term while the leader keeps ticking: {b}"
        );
    }
    // The leader's ticks all led; the follower's all followed, naming the leader.
    for t in cron_ticks(&apps[leader]) {
        assert_eq!(t["role"], "leader", "{t}");
        assert_eq!(t["heartbeat"], "delivered", "{t}");
    }
    assert!(
        beats_of(&apps[follower]).is_empty(),
        "the follower sent heartbeats: {:?}",
        beats_of(&apps[follower])
    );
    let follower_ticks = cron_ticks(&apps[follower]);
    for t in &follower_ticks {
        assert_eq!(t["role"], "follower", "{t}");
        assert_eq!(t["instance"], names[follower], "{t}");
    }
    assert!(
        follower_ticks.iter().any(|t| t["leader"] == names[leader]),
        "{follower_ticks:?}"
    );
    for app in &apps {
        app.assert_no_trap();
    }
}

/// 21.5: a stepped-down leader stays a follower for a lease length; another instance takes
/// over at its next tick.
#[test]
fn a_stepped_down_leader_stays_a_follower_for_a_lease() {
    let a = App::start(
        "stepdown",
        &[("instance_id", "node-a"), ("leader_lease_seconds", "15")],
    );
    let b = App::start_with(
        "stepdown",
        &[("instance_id", "node-b"), ("leader_lease_seconds", "15")],
        Setup {
            container: Some(a.container.clone()),
            ..Setup::default()
        },
    );
    let tick = |app: &App| call("POST", &app.url("/api/leader/tick"), &[TIMER_AUTH], b"");
    let first = tick(&a);
    assert_eq!(first.json["role"], "leader", "{}", first.text);
    // A step-down takes the admin token (the tick token only ticks and reads): three storage
    // requests (docs/timer-functions.md: the HEAD, the bar, the release at the bar's ETag).
    let refused = call("DELETE", &a.url("/api/leader"), &[TIMER_AUTH], b"");
    assert_eq!(refused.status, 403, "{}", refused.text);
    let (down, requests) =
        a.storage_requests(|| call("DELETE", &a.url("/api/leader"), &[ADMIN_AUTH], b""));
    assert_eq!(down.status, 200, "{}", down.text);
    assert_eq!(down.json["steppedDown"], true, "{}", down.text);
    assert_eq!(requests, 3, "a step-down costs three requests");
    let started = Instant::now();
    let again = tick(&a);
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["role"], "follower", "{}", again.text);
    assert!(again.json["steppedDownUntil"].is_string(), "{}", again.text);
    let other = tick(&b);
    assert_eq!(other.json["role"], "leader", "{}", other.text);
    assert!(other.json["term"].as_u64() > first.json["term"].as_u64());
    // node-b steps down too; node-a is still barred within its lease length, then may lead.
    let down_b = call("DELETE", &b.url("/api/leader"), &[ADMIN_AUTH], b"");
    assert_eq!(down_b.json["steppedDown"], true, "{}", down_b.text);
    if started.elapsed() < Duration::from_secs(12) {
        assert_eq!(tick(&a).json["role"], "follower");
    }
    let led = leasegate_tests::wait_for("node-a leads again", Duration::from_secs(30), || {
        let t = tick(&a);
        (t.json["role"] == "leader").then_some(t)
    });
    assert!(
        started.elapsed() >= Duration::from_secs(13),
        "node-a led again after {:?}: {}",
        started.elapsed(),
        led.text
    );
}
