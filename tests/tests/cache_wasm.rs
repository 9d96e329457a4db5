//! The gate cache in Spin's key-value store (`kv_cache`), as the release `.wasm` in the wasmtime
//! host (whose `default` store behaves as Spin's), against Azurite: throttles with no storage
//! request, never a suppression storage would not make, entries cleared before a gate goes
//! back (or the gate kept), a failing store falling back to storage, another deployment's gate
//! cached only once its holder is done, and the gate API's gates cached only in a shared store.

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{LockStatus, Locks};
use leasegate::LockName;
use leasegate_host::Fault;
use leasegate_native::{block_on, NativeTransport};
use leasegate_tests::app::{call, post_telemetry, Answer, App, Setup};
use leasegate_tests::{wait_for, Azurite};
use serde_json::{json, Value};

const GATE_AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

fn reading(device: &str, temperature: f64) -> Value {
    json!({ "deviceId": device, "temperature": temperature })
}

fn decision(answer: &Answer) -> &Value {
    &answer.json["decisions"][0]
}

/// Storage's view of a lock: its expiry if held.
fn held_until(app: &App, prefix: &str, name: &str) -> Option<SystemTime> {
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix(prefix);
    let info =
        block_on(locks.inspect(&LockName::try_new(name).unwrap(), SystemTime::now())).unwrap();
    match info.status {
        LockStatus::Held { expires_at, .. } => Some(expires_at.unwrap_or(SystemTime::UNIX_EPOCH)),
        LockStatus::Available => None,
    }
}

fn storage_requests(app: &App, answer: &Answer) -> usize {
    app.record_of(answer).outbound_to(&app.storage)
}

/// A device that alerted is throttled from the cache: no storage request, and storage agrees
/// (its gate is held at least as long as the answer says). A batch of throttled devices is
/// no storage request either.
#[test]
fn a_throttle_known_from_the_cache_needs_no_storage_request() {
    let app = App::start("kvon", &[("alert_window_seconds", "60")]);
    let first = post_telemetry(&app, &reading("kv-1", 40.0));
    assert_eq!(decision(&first)["decision"], "notified", "{}", first.text);
    // First use of the app's container: HEAD 404, create refused (no container), create the
    // container, create the lock blob taking its lease, write the claim.
    assert_eq!(storage_requests(&app, &first), 5);
    let mut took = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let again = post_telemetry(&app, &reading("kv-1", 41.0));
        took.push(started.elapsed());
        let d = decision(&again);
        assert_eq!(d["decision"], "throttled", "{}", again.text);
        assert_eq!(d["cached"], true, "{}", again.text);
        assert_eq!(storage_requests(&app, &again), 0);
        assert_eq!(app.record_of(&again).key_value, ["open", "get"]);
        // Storage would throttle it as long.
        let until = held_until(&app, "alerts/", "kv-1").expect("storage holds the gate");
        let said = Duration::from_secs(d["retryAfterSeconds"].as_u64().unwrap());
        assert!(SystemTime::now() + said <= until + Duration::from_secs(1));
    }
    took.sort();
    println!(
        "cached throttle: median {:?} per request, 0 storage requests",
        took[took.len() / 2]
    );
    // A batch: 30 devices alert, then all 30 are throttled from the cache.
    let batch: Vec<Value> = (0..30)
        .map(|i| reading(&format!("kvb-{i}"), 35.0))
        .collect();
    let cold = post_telemetry(&app, &json!(batch));
    // 3 per new device (HEAD 404, create with the claim, acquire), 4 when the create lands in
    // a later second than the HEAD (the claim's token is made again from the create's Date).
    let cold_requests = storage_requests(&app, &cold);
    assert!(
        (90..=120).contains(&cold_requests),
        "{cold_requests}: {}",
        cold.text
    );
    let warm = post_telemetry(&app, &json!(batch));
    assert!(warm.json["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["decision"] == "throttled" && d["cached"] == true));
    assert_eq!(storage_requests(&app, &warm), 0);
    assert_eq!(app.sink.delivered().len(), 31);
}

/// `kv_cache = off`: every throttle asks storage, and the store is not touched.
#[test]
fn with_the_cache_off_every_throttle_asks_storage() {
    let app = App::start(
        "kvoff",
        &[("alert_window_seconds", "60"), ("kv_cache", "off")],
    );
    post_telemetry(&app, &reading("kv-off", 40.0));
    let again = post_telemetry(&app, &reading("kv-off", 40.0));
    assert_eq!(decision(&again)["decision"], "throttled");
    assert!(decision(&again)["cached"].is_null());
    assert_eq!(storage_requests(&app, &again), 1);
    assert!(app.record_of(&again).key_value.is_empty());
    assert!(app.host.kv().snapshot().is_empty());
    let bad = App::start("kvbad", &[("kv_cache", "sometimes")]);
    let a = post_telemetry(&bad, &reading("x", 40.0));
    assert_eq!(a.status, 503, "{}", a.text);
    assert!(a.text.contains("kv_cache"), "{}", a.text);
}

/// A notification that certainly did not arrive gives the gate back, and leaves no entry: the
/// next reading alerts.
#[test]
fn a_failed_notification_leaves_no_entry_behind() {
    let app = App::start("kvnotify", &[("alert_window_seconds", "60")]);
    app.host
        .set_fault(&app.sink.authority(), Some(Fault::Refuse));
    let refused = post_telemetry(&app, &reading("kv-n", 44.0));
    let d = decision(&refused);
    assert_eq!(d["decision"], "notify_failed", "{d}");
    assert_eq!(d["gateReleased"], true, "{d}");
    assert!(app.host.kv().snapshot().is_empty());
    assert_eq!(held_until(&app, "alerts/", "kv-n"), None);
    app.host.set_fault(&app.sink.authority(), None);
    let back = post_telemetry(&app, &reading("kv-n", 45.0));
    assert_eq!(decision(&back)["decision"], "notified", "{}", back.text);
    assert_eq!(app.host.kv().snapshot().len(), 1);
}

/// A store that fails: decisions fall back to storage (nothing suppressed from the cache), and
/// a gate whose entry might not be cleared is kept rather than given back.
#[test]
fn a_failing_store_falls_back_to_storage_and_keeps_gates_it_cannot_clear() {
    let app = App::start("kvfail", &[("alert_window_seconds", "60")]);
    let first = post_telemetry(&app, &reading("kv-f", 40.0));
    assert_eq!(decision(&first)["decision"], "notified");
    app.host.kv().set_failing(true);
    let again = post_telemetry(&app, &reading("kv-f", 40.0));
    assert_eq!(decision(&again)["decision"], "throttled", "{}", again.text);
    assert!(decision(&again)["cached"].is_null());
    assert_eq!(storage_requests(&app, &again), 1);
    // The webhook is unreachable and the entry cannot be cleared: the gate stays.
    app.host
        .set_fault(&app.sink.authority(), Some(Fault::Refuse));
    let refused = post_telemetry(&app, &reading("kv-g", 44.0));
    let d = decision(&refused);
    assert_eq!(d["decision"], "notify_failed", "{d}");
    assert_eq!(d["gateReleased"], false, "{d}");
    assert!(
        d["reason"].as_str().unwrap().contains("key-value store"),
        "{d}"
    );
    assert!(held_until(&app, "alerts/", "kv-g").is_some());
    app.host.set_fault(&app.sink.authority(), None);
    app.host.kv().set_failing(false);
    let later = post_telemetry(&app, &reading("kv-g", 44.0));
    assert_eq!(decision(&later)["decision"], "throttled", "{}", later.text);
    // An unreadable entry is not believed either.
    let key = app.host.kv().snapshot().into_keys().next().unwrap();
    assert!(key.starts_with("leasegate:held:"), "{key}");
}

/// Another deployment's gate is cached only once its tenure is old enough that its holder is
/// done notifying (three storage timeouts and the margin: 5 s here); until then every throttle
/// asks storage.
#[test]
fn another_deployments_gate_is_cached_once_settled() {
    let vars = [
        ("alert_window_seconds", "60"),
        ("storage_timeout_ms", "1000"),
    ];
    let a = App::start("kvsettle-a", &vars);
    let b = App::start_with(
        "kvsettle-b",
        &vars,
        Setup {
            container: Some(a.container.clone()),
            ..Setup::default()
        },
    );
    let won = post_telemetry(&a, &reading("kv-s", 40.0));
    assert_eq!(decision(&won)["decision"], "notified");
    let won_at = Instant::now();
    let seen = post_telemetry(&b, &reading("kv-s", 40.0));
    assert_eq!(decision(&seen)["decision"], "throttled");
    assert_eq!(storage_requests(&b, &seen), 1);
    if won_at.elapsed() < Duration::from_secs(4) {
        assert!(
            b.host.kv().snapshot().is_empty(),
            "cached a tenure younger than the settle time"
        );
    }
    let cached_at = wait_for(
        "B to cache A's settled gate",
        Duration::from_secs(30),
        || {
            let t = post_telemetry(&b, &reading("kv-s", 40.0));
            assert_eq!(decision(&t)["decision"], "throttled");
            (decision(&t)["cached"] == true).then(Instant::now)
        },
    );
    assert!(cached_at.duration_since(won_at) >= Duration::from_secs(4));
    assert_eq!(a.sink.delivered().len() + b.sink.delivered().len(), 1);
}

/// The gate API's gates: cached only with `kv_cache = shared`. Another holder is refused from
/// the cache; the holder itself still reaches storage (it extends); `DELETE` clears the entry
/// before it gives the gate back, and keeps the gate (503) if it cannot.
#[test]
fn gates_are_cached_only_in_a_shared_store() {
    let gate = |app: &App, method: &str, path: &str, extra: &[(&str, &str)]| {
        let mut headers = vec![GATE_AUTH];
        headers.extend_from_slice(extra);
        call(
            method,
            &app.url(&format!("/api/gate/{path}")),
            &headers,
            b"",
        )
    };
    let shared = App::start("kvgate", &[("kv_cache", "shared")]);
    let a = gate(&shared, "POST", "g1?window=30&holder=alpha", &[]);
    assert_eq!(a.status, 200, "{}", a.text);
    let lease_id = a.json["leaseId"].as_str().unwrap().to_string();
    let b = gate(&shared, "POST", "g1?window=30&holder=beta", &[]);
    assert_eq!(b.status, 429, "{}", b.text);
    assert_eq!(b.json["cached"], true);
    assert_eq!(storage_requests(&shared, &b), 0);
    let again = gate(&shared, "POST", "g1?window=30&holder=alpha", &[]);
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["extended"], true);
    // A store that cannot be cleared: the gate is not given back.
    shared.host.kv().set_failing(true);
    let stuck = gate(&shared, "DELETE", "g1", &[("lease-id", &lease_id)]);
    assert_eq!(stuck.status, 503, "{}", stuck.text);
    assert_eq!(stuck.json["error"], "cache_unavailable");
    assert!(held_until(&shared, "gates/", "g1").is_some());
    shared.host.kv().set_failing(false);
    let gone = gate(&shared, "DELETE", "g1", &[("lease-id", &lease_id)]);
    assert_eq!(gone.status, 204, "{}", gone.text);
    assert!(shared.host.kv().snapshot().is_empty());
    let b = gate(&shared, "POST", "g1?window=30&holder=beta", &[]);
    assert_eq!(b.status, 200, "{}", b.text);

    // A store of one's own (the default): gates are not cached.
    let own = App::start("kvgateown", &[]);
    assert_eq!(
        gate(&own, "POST", "g2?window=30&holder=alpha", &[]).status,
        200
    );
    let b = gate(&own, "POST", "g2?window=30&holder=beta", &[]);
    assert_eq!(b.status, 429);
    assert!(b.json["cached"].is_null());
    assert_eq!(storage_requests(&own, &b), 1);
    assert!(own.host.kv().snapshot().is_empty());
}
