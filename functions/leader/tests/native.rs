//! The leader's tick run natively, as each deployment's cron trigger runs it, against the
//! in-memory storage (`leasegate-test-support`): one leader per term, its renewals, a takeover
//! once the term ran out, a step-down. What each case checks is what storage holds (the lease
//! on `leader/{group}` and whose it is), what the tick answers and the heartbeats the receiver
//! at `leader_url` got.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use leader::{Leader, Settings};
use leasegate::{HolderKey, LeaseId, LockName, Method, Request};
use leasegate_spin::auth::Power;
use leasegate_spin::timer::{Source, Tick, TimerFunction};
use leasegate_test_support::instance::Instance;
use leasegate_test_support::memory::{together, Memory};
use leasegate_test_support::wire::WireResponse;
use serde_json::Value;

/// 2026-11-19T14:00:00Z.
const START: u64 = 1_795_096_800;
const SECRET: &str = "native-test-lease-id-secret";
const LEASE_SECS: u64 = 15;

/// A deployment of the leader in group `reports`, its heartbeats to `hooks.test`.
fn deployment(memory: &Memory, instance: &str) -> Instance {
    Instance::new(
        memory,
        instance,
        &[
            ("leader_group", "reports"),
            ("leader_lease_seconds", "15"),
            ("leader_url", "http://hooks.test/heartbeat"),
            ("lease_id_secret", SECRET),
        ],
    )
}

/// The heartbeats the receiver at `leader_url` got, in order (it answers 200).
fn receiver(memory: &Memory) -> Rc<RefCell<Vec<Value>>> {
    let got = Rc::new(RefCell::new(Vec::new()));
    let seen = got.clone();
    memory.route("hooks.test", move |r| {
        seen.borrow_mut()
            .push(serde_json::from_slice(&r.body).unwrap_or_default());
        WireResponse::new(200)
    });
    got
}

/// One cron tick of `instance` now: its status and answer.
async fn tick(instance: &Instance) -> (u16, Value) {
    let ctx = instance.context();
    let settings = Settings::load(instance.variables()).expect("the settings load");
    let t = Tick {
        at: ctx.now,
        source: Source::Cron,
        past_due: false,
    };
    let (status, answer) = Leader::tick(&ctx, &settings, &t, Instant::now()).await;
    (status.as_u16(), answer)
}

fn tick_now(instance: &Instance) -> (u16, Value) {
    pollster::block_on(tick(instance))
}

/// The lease id `instance` holds the group's lease with (derived from its name).
fn lease_id(instance: &str) -> String {
    let key = HolderKey::try_new(SECRET.as_bytes()).unwrap();
    let lock = LockName::try_new("reports").unwrap();
    LeaseId::for_holder(&key, "leader", instance, &lock).to_string()
}

/// Whose lease holds the group's lock blob at storage's clock now.
fn holder(memory: &Memory) -> Option<String> {
    let storage = memory.storage();
    let blob = storage.blob("leasegate", "leader/reports")?;
    blob.leased_by(storage.clock).map(str::to_string)
}

#[test]
fn two_instances_ticking_at_once_elect_one_leader() {
    let memory = Memory::new(START);
    let heartbeats = receiver(&memory);
    let (a, b) = (deployment(&memory, "node-a"), deployment(&memory, "node-b"));
    memory.take_turns(true);
    let ((sa, va), (sb, vb)) = together(tick(&a), tick(&b));
    assert_eq!((sa, sb), (200, 200), "{va} {vb}");
    let (leader, follower) = match (va["role"].as_str(), vb["role"].as_str()) {
        (Some("leader"), Some("follower")) => (&va, &vb),
        (Some("follower"), Some("leader")) => (&vb, &va),
        roles => panic!("one leader and one follower, not {roles:?}: {va} {vb}"),
    };
    assert_eq!(follower["leader"], leader["instance"], "{follower}");
    assert_eq!(follower["term"], leader["term"], "{follower}");
    assert_eq!(leader["tookOver"], true);
    let name = leader["instance"].as_str().unwrap();
    assert_eq!(holder(&memory), Some(lease_id(name)));
    let heartbeats = heartbeats.borrow();
    assert_eq!(heartbeats.len(), 1, "{heartbeats:?}");
    assert_eq!(heartbeats[0]["leader"], name);
    assert_eq!(heartbeats[0]["term"], leader["term"]);
}

#[test]
fn the_leader_renews_its_lease_and_keeps_its_term() {
    let memory = Memory::new(START);
    let heartbeats = receiver(&memory);
    let (a, b) = (deployment(&memory, "node-a"), deployment(&memory, "node-b"));
    let (_, first) = tick_now(&a);
    assert_eq!(first["role"], "leader", "{first}");
    // Each tick 10 s after the last, past the first lease's 15 s: renewed each time.
    for _ in 0..3 {
        memory.advance(Duration::from_secs(10));
        let (status, again) = tick_now(&a);
        assert_eq!(status, 200, "{again}");
        assert_eq!(
            (&again["role"], &again["term"], &again["tookOver"]),
            (&first["role"], &first["term"], &Value::Bool(false)),
            "{again}"
        );
        let (_, other) = tick_now(&b);
        assert_eq!(
            (&other["role"], &other["leader"]),
            (&"follower".into(), &"node-a".into())
        );
    }
    assert_eq!(memory.clock(), START + 30);
    assert_eq!(holder(&memory), Some(lease_id("node-a")));
    let terms: Vec<Value> = heartbeats
        .borrow()
        .iter()
        .map(|h| h["term"].clone())
        .collect();
    assert_eq!(
        terms,
        vec![first["term"].clone(); 4],
        "one heartbeat per tick of the leader"
    );
}

#[test]
fn another_instance_takes_over_once_the_term_ran_out() {
    let memory = Memory::new(START);
    let heartbeats = receiver(&memory);
    let (a, b) = (deployment(&memory, "node-a"), deployment(&memory, "node-b"));
    let (_, first) = tick_now(&a);
    assert_eq!(first["role"], "leader", "{first}");
    // Before the lease ran out, node-b follows.
    memory.advance(Duration::from_secs(LEASE_SECS - 1));
    assert_eq!(tick_now(&b).1["role"], "follower");
    // node-a stopped ticking: its lease runs out, node-b's next tick takes over.
    memory.advance(Duration::from_secs(2));
    let (status, second) = tick_now(&b);
    assert_eq!(
        (status, &second["role"]),
        (200, &"leader".into()),
        "{second}"
    );
    assert_eq!(second["tookOver"], true);
    let (t1, t2) = (first["term"].as_u64(), second["term"].as_u64());
    assert!(
        t2 > t1,
        "the new term is above the last: {t1:?} then {t2:?}"
    );
    assert_eq!(holder(&memory), Some(lease_id("node-b")));
    // node-a comes back: a follower of node-b's term.
    let (_, back) = tick_now(&a);
    assert_eq!(
        (&back["role"], &back["leader"], &back["term"]),
        (&"follower".into(), &"node-b".into(), &second["term"])
    );
    let heartbeats = heartbeats.borrow();
    let sent: Vec<(&Value, &Value)> = heartbeats
        .iter()
        .map(|h| (&h["leader"], &h["term"]))
        .collect();
    assert_eq!(
        sent,
        [
            (&"node-a".into(), &first["term"]),
            (&"node-b".into(), &second["term"])
        ]
    );
}

#[test]
fn a_leader_that_steps_down_hands_over_at_the_next_tick() {
    let memory = Memory::new(START);
    receiver(&memory);
    let (a, b) = (deployment(&memory, "node-a"), deployment(&memory, "node-b"));
    assert_eq!(tick_now(&a).1["role"], "leader");
    let delete = Request::new(Method::DELETE, "http://app.test/api/leader");
    let answer = pollster::block_on(Leader::api(
        &a.context(),
        &delete,
        Power::Admin,
        Instant::now(),
    ));
    let body: Value = serde_json::from_slice(answer.body()).unwrap();
    assert_eq!(
        (answer.status().as_u16(), &body["steppedDown"]),
        (200, &Value::Bool(true))
    );
    assert_eq!(holder(&memory), None, "the lease is released");
    // Barred for one lease length, node-a does not take the free lease back; node-b's next
    // tick takes it at once, without waiting for the term's end.
    memory.advance(Duration::from_secs(1));
    let (_, barred) = tick_now(&a);
    assert_eq!(barred["role"], "follower", "{barred}");
    assert!(barred["steppedDownUntil"].is_string(), "{barred}");
    assert_eq!(holder(&memory), None);
    let (_, b_tick) = tick_now(&b);
    assert_eq!(
        (&b_tick["role"], &b_tick["tookOver"]),
        (&"leader".into(), &Value::Bool(true)),
        "{b_tick}"
    );
    let (_, a_tick) = tick_now(&a);
    assert_eq!(
        (&a_tick["role"], &a_tick["leader"]),
        (&"follower".into(), &"node-b".into()),
        "{a_tick}"
    );
    assert_eq!(holder(&memory), Some(lease_id("node-b")));
}
