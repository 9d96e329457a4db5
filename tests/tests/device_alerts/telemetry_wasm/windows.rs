//! One notification per device per window: short and long windows, a batch of 100 readings, fencing
//! tokens, devices gated concurrently.

use super::*;

#[test]
fn one_notification_per_device_per_short_window() {
    let app = App::start("short", &[("alert_window_seconds", "2")]);
    let first = post_telemetry(&app, &reading("dev-1", 35.0));
    assert_eq!(first.status, 200, "{}", first.text);
    let d = decision(&first, 0);
    assert_eq!(d["decision"], "notified", "{d}");
    assert!(d["fencingToken"].as_u64().unwrap() >= 1);
    assert!(d["windowEndsAt"].as_str().unwrap().ends_with('Z'));

    let second = post_telemetry(&app, &reading("dev-1", 36.0));
    assert_eq!(
        decision(&second, 0)["decision"],
        "throttled",
        "{}",
        second.text
    );
    assert!(decision(&second, 0)["retryAfterSeconds"].as_u64().unwrap() <= 2);
    assert_eq!(app.sink.for_device("dev-1").len(), 1);

    // After the window another notification goes out, with a larger fencing token.
    let third = wait_for("the 2 s window to pass", Duration::from_secs(15), || {
        let a = post_telemetry(&app, &reading("dev-1", 37.0));
        (decision(&a, 0)["decision"] == "notified").then_some(a)
    });
    let sent = app.sink.for_device("dev-1");
    assert_eq!(sent.len(), 2);
    assert!(decision(&third, 0)["fencingToken"].as_u64() > d["fencingToken"].as_u64());
    let n = &sent[1].body;
    assert_eq!(n["deviceId"], "dev-1");
    assert_eq!(n["temperature"], 37.0);
    assert!(n["message"].as_str().unwrap().contains("threshold"));
    assert_eq!(n["fencingToken"], decision(&third, 0)["fencingToken"]);
    assert_eq!(n["windowEndsAt"], decision(&third, 0)["windowEndsAt"]);
    // Below the threshold: no gate, no storage request.
    let (cool, storage, webhook) = costs(&app, || post_telemetry(&app, &reading("dev-1", 12.0)));
    assert_eq!(decision(&cool, 0)["decision"], "below_threshold");
    assert_eq!((storage, webhook), (0, 0));
}

#[test]
fn native_fifteen_second_lease_window() {
    let app = App::start("native", &[("alert_window_seconds", "15")]);
    let first = post_telemetry(&app, &reading("dev-n", 40.0));
    assert_eq!(
        decision(&first, 0)["decision"],
        "notified",
        "{}",
        first.text
    );
    let started = Instant::now();
    let second = post_telemetry(&app, &reading("dev-n", 41.0));
    assert_eq!(decision(&second, 0)["decision"], "throttled");
    let again = wait_for("the 15 s lease to run out", Duration::from_secs(30), || {
        let a = post_telemetry(&app, &reading("dev-n", 42.0));
        (decision(&a, 0)["decision"] == "notified").then_some(a)
    });
    assert!(
        started.elapsed() >= Duration::from_secs(12),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(app.sink.for_device("dev-n").len(), 2);
    assert!(
        decision(&again, 0)["fencingToken"].as_u64() > decision(&first, 0)["fencingToken"].as_u64()
    );
}

#[test]
fn window_longer_than_sixty_seconds_uses_the_etag_lease() {
    let app = App::start("long", &[("alert_window_seconds", "90")]);
    let first = post_telemetry(&app, &reading("dev-l", 50.0));
    assert_eq!(
        decision(&first, 0)["decision"],
        "notified",
        "{}",
        first.text
    );
    let ends =
        humantime::parse_rfc3339(decision(&first, 0)["windowEndsAt"].as_str().unwrap()).unwrap();
    let left = ends.duration_since(SystemTime::now()).unwrap_or_default();
    assert!(
        left > Duration::from_secs(80) && left <= Duration::from_secs(92),
        "{left:?}"
    );
    let second = post_telemetry(&app, &reading("dev-l", 51.0));
    let d = decision(&second, 0);
    assert_eq!(d["decision"], "throttled");
    let retry = d["retryAfterSeconds"].as_u64().unwrap();
    assert!((80..=90).contains(&retry), "{retry}");
    assert_eq!(app.sink.for_device("dev-l").len(), 1);
}

#[test]
fn batch_of_100_readings_over_50_devices() {
    // Storage's costs, without the gate cache (tests/tests/device_alerts/cache_wasm.rs has the cached ones).
    let app = App::start(
        "batch",
        &[("alert_window_seconds", "60"), ("kv_cache", "off")],
    );
    let batch: Vec<Value> = (0..100)
        .map(|i| reading(&format!("sensor-{:02}", i % 50), 30.0 + (i / 50) as f64))
        .collect();
    let started = Instant::now();
    let cold = post_telemetry(&app, &json!(batch));
    let cold_time = started.elapsed();
    assert_eq!(cold.status, 200, "{}", cold.text);
    let decisions = cold.json["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 100);
    // Each device is gated once, with its hottest reading (the second of each pair).
    for (i, d) in decisions.iter().enumerate() {
        assert_eq!(d["index"], i);
        if i < 50 {
            assert_eq!(d["decision"], "throttled", "{d}");
            assert_eq!(d["coveredBy"], i + 50);
        } else {
            assert_eq!(d["decision"], "notified", "{d}");
        }
    }
    let delivered = app.sink.wait_for(50, Duration::from_secs(10));
    assert_eq!(app.sink.delivered().len(), 50, "{delivered:?}");
    for i in 0..50 {
        assert_eq!(app.sink.for_device(&format!("sensor-{i:02}")).len(), 1);
    }

    // Hot path, busy: the same batch again is one storage request per hot device gate.
    let started = Instant::now();
    let (busy, seen) = app.counted(|| post_telemetry(&app, &json!(batch)));
    let busy_time = started.elapsed();
    assert!(busy.json["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["decision"] == "throttled"));
    assert_eq!(seen.len(), 50, "{seen:?}");
    assert_eq!(app.sink.delivered().len(), 50);

    // Hot path, winning: free the 50 gates (the lock blobs stay), then gate again.
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix("alerts/");
    for i in 0..50 {
        let lock = LockName::try_new(&format!("sensor-{i:02}")).unwrap();
        block_on(locks.break_lock(&lock, 0, SystemTime::now())).unwrap();
    }
    let started = Instant::now();
    let (win, storage, webhook) = costs(&app, || post_telemetry(&app, &json!(batch)));
    let win_time = started.elapsed();
    let notified = win.json["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["decision"] == "notified")
        .count();
    assert_eq!(notified, 50, "{}", win.text);
    // HEAD + acquire + the claim with the fencing token: three storage requests per winning
    // gate (the HEAD is what lets gates of different windows share a device's lock).
    assert_eq!(storage, 150);
    assert_eq!(webhook, 50);

    // One reading on the hot path, for comparison.
    let single_start = Instant::now();
    let single = post_telemetry(&app, &reading("sensor-00", 45.0));
    let single_time = single_start.elapsed();
    assert_eq!(decision(&single, 0)["decision"], "throttled");
    println!(
        "batch of 100 readings / 50 devices: cold {cold_time:?}, all throttled {busy_time:?}, \
         all notified {win_time:?}; single reading (throttled) {single_time:?}"
    );
}

#[test]
fn without_fencing_notifications_carry_no_token() {
    // The gates are broken by hand below, which the gate cache cannot see: it is off.
    let app = App::start(
        "nofence",
        &[
            ("alert_window_seconds", "60"),
            ("alert_fencing", "off"),
            ("kv_cache", "off"),
        ],
    );
    let devices: Vec<Value> = (0..10)
        .map(|i| reading(&format!("plain-{i}"), 40.0))
        .collect();
    let cold = post_telemetry(&app, &json!(devices));
    assert_eq!(cold.status, 200, "{}", cold.text);
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix("alerts/");
    for i in 0..10 {
        let lock = LockName::try_new(&format!("plain-{i}")).unwrap();
        block_on(locks.break_lock(&lock, 0, SystemTime::now())).unwrap();
    }
    let (warm, storage) = app.storage_requests(|| post_telemetry(&app, &json!(devices)));
    let decisions = warm.json["decisions"].as_array().unwrap();
    assert!(
        decisions
            .iter()
            .all(|d| d["decision"] == "notified" && d["fencingToken"].is_null()),
        "{}",
        warm.text
    );
    // The gate still takes its claim (HEAD + acquire + claim): only the token is left out.
    assert_eq!(storage, 30);
    assert!(app
        .sink
        .delivered()
        .iter()
        .all(|n| n.body["fencingToken"].is_null()));
}

#[test]
fn devices_of_a_batch_are_gated_concurrently() {
    // Storage answers after 300 ms: gated one after another, ten devices would never have more
    // than one request in flight. Counted at the storage proxy (the only caller of this app).
    let app = App::start("inflight", &[("alert_window_seconds", "60")]);
    app.storage
        .set_fault(Some(Fault::Delay(Duration::from_millis(300))));
    let devices: Vec<Value> = (0..10).map(|i| reading(&format!("c-{i}"), 40.0)).collect();
    app.storage.reset_peak();
    let a = post_telemetry(&app, &json!(devices));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(app.storage.peak_in_flight(), 10);
    assert!(a.json["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["decision"] == "notified"));
}
