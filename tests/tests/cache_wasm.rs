//! The gate cache in Spin's key-value store (`kv_cache`), as the release `.wasm` in the wasmtime
//! host (whose `default` store behaves as Spin's), against Azurite: throttles with no storage
//! request, never a suppression storage would not make, entries cleared before a gate goes
//! back, a failing store falling back to storage (and costing no alert), another deployment's gate
//! cached only once its holder is done, and the gate API never cached.

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
    // container, create the lock blob, acquire its lease (and write the claim again when the
    // create landed in a later second than the HEAD).
    let first_requests = storage_requests(&app, &first);
    assert!((5..=6).contains(&first_requests), "{first_requests}");
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
/// a failed notification still gives its gate back (the store costs requests, never alerts).
#[test]
fn a_failing_store_falls_back_to_storage_and_costs_no_alert() {
    let app = App::start("kvfail", &[("alert_window_seconds", "60")]);
    let first = post_telemetry(&app, &reading("kv-f", 40.0));
    assert_eq!(decision(&first)["decision"], "notified");
    app.host.kv().set_failing(true);
    let again = post_telemetry(&app, &reading("kv-f", 40.0));
    assert_eq!(decision(&again)["decision"], "throttled", "{}", again.text);
    assert!(decision(&again)["cached"].is_null());
    assert_eq!(storage_requests(&app, &again), 1);
    // The webhook is unreachable and the store cannot be cleared: the gate goes back anyway
    // (this invocation wrote no entry for it), and the next reading alerts.
    app.host
        .set_fault(&app.sink.authority(), Some(Fault::Refuse));
    let refused = post_telemetry(&app, &reading("kv-g", 44.0));
    let d = decision(&refused);
    assert_eq!(d["decision"], "notify_failed", "{d}");
    assert_eq!(d["gateReleased"], true, "{d}");
    assert!(
        d["reason"].as_str().unwrap().contains("key-value store"),
        "{d}"
    );
    assert_eq!(held_until(&app, "alerts/", "kv-g"), None);
    app.host.set_fault(&app.sink.authority(), None);
    let later = post_telemetry(&app, &reading("kv-g", 44.0));
    assert_eq!(decision(&later)["decision"], "notified", "{}", later.text);
    app.host.kv().set_failing(false);
    let after = post_telemetry(&app, &reading("kv-f", 40.0));
    assert_eq!(decision(&after)["decision"], "throttled", "{}", after.text);
    // An unreadable entry is not believed either.
    let key = app.host.kv().snapshot().into_keys().next().unwrap();
    assert!(key.starts_with("leasegate:held:"), "{key}");
}

/// Another deployment's gate is cached only once its tenure is old enough that its holder is
/// done notifying and any give-back (ten storage timeouts and the margin: 8 s here); until then
/// every throttle asks storage.
#[test]
fn another_deployments_gate_is_cached_once_settled() {
    let vars = [
        ("alert_window_seconds", "60"),
        ("storage_timeout_ms", "500"),
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
    if won_at.elapsed() < Duration::from_secs(7) {
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
    // (Storage dates the tenure to the whole second: up to 1 s earlier than `won_at`.)
    assert!(cached_at.duration_since(won_at) >= Duration::from_secs(7));
    assert_eq!(a.sink.delivered().len() + b.sink.delivered().len(), 1);
}

/// The gate API never caches (its holders give gates back at will, and the store has no
/// compare-and-swap): a busy gate is one storage request, the store is untouched, and a holder
/// that shortens its gate to 1 s frees it for others as soon as storage does.
#[test]
fn the_gate_api_always_asks_storage() {
    let gate = |app: &App, method: &str, path: &str| {
        call(
            method,
            &app.url(&format!("/api/gate/{path}")),
            &[GATE_AUTH],
            b"",
        )
    };
    let app = App::start("kvgate", &[]);
    let a = gate(&app, "POST", "g1?window=3600&holder=alpha");
    assert_eq!(a.status, 200, "{}", a.text);
    let b = gate(&app, "POST", "g1?window=30&holder=beta");
    assert_eq!(b.status, 429, "{}", b.text);
    assert!(b.json["cached"].is_null(), "{}", b.text);
    assert_eq!(storage_requests(&app, &b), 1);
    assert!(app.record_of(&b).key_value.is_empty());
    // alpha shortens its gate to 1 s: beta gets it once storage lets it go.
    let short = gate(&app, "POST", "g1?window=1&holder=alpha");
    assert_eq!(short.status, 200, "{}", short.text);
    assert_eq!(short.json["extended"], true);
    wait_for("beta to take the gate", Duration::from_secs(15), || {
        (gate(&app, "POST", "g1?window=30&holder=beta").status == 200).then_some(())
    });
    assert!(app.host.kv().snapshot().is_empty());
}
