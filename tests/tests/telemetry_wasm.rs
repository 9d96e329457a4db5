//! device-alerts, as the release `.wasm` served by the wasmtime host from `spin.toml`, against
//! a real Azurite, with notifications counted at a webhook sink.

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{Locks, Term};
use leasegate::{LeaseId, LockName};
use leasegate_host::Fault;
use leasegate_native::{block_on, NativeTransport};
use leasegate_tests::app::{call, post_telemetry, App};
use leasegate_tests::{wait_for, Azurite};
use serde_json::{json, Value};

fn reading(device: &str, temperature: f64) -> Value {
    json!({ "deviceId": device, "temperature": temperature })
}

fn decision(answer: &leasegate_tests::app::Answer, i: usize) -> &Value {
    &answer.json["decisions"][i]
}

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
    let cool = post_telemetry(&app, &reading("dev-1", 12.0));
    assert_eq!(decision(&cool, 0)["decision"], "below_threshold");
    assert_eq!(app.record_of(&cool).outbound.len(), 0);
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
    let app = App::start("batch", &[("alert_window_seconds", "60")]);
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
    let busy = post_telemetry(&app, &json!(batch));
    let busy_time = started.elapsed();
    assert!(busy.json["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["decision"] == "throttled"));
    let record = app.record_of(&busy);
    assert_eq!(
        record.outbound_to(&app.storage),
        50,
        "{:?}",
        record.outbound
    );
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
    let win = post_telemetry(&app, &json!(batch));
    let win_time = started.elapsed();
    let notified = win.json["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["decision"] == "notified")
        .count();
    assert_eq!(notified, 50, "{}", win.text);
    let record = app.record_of(&win);
    // Acquire + the fencing token's increment: two storage requests per winning gate.
    assert_eq!(
        record.outbound_to(&app.storage),
        100,
        "{:?}",
        record.outbound
    );
    assert_eq!(record.outbound_to(&app.sink.authority()), 50);

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
fn without_fencing_a_winning_gate_is_one_request() {
    let app = App::start(
        "nofence",
        &[("alert_window_seconds", "60"), ("alert_fencing", "off")],
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
    let warm = post_telemetry(&app, &json!(devices));
    let decisions = warm.json["decisions"].as_array().unwrap();
    assert!(
        decisions
            .iter()
            .all(|d| d["decision"] == "notified" && d["fencingToken"].is_null()),
        "{}",
        warm.text
    );
    assert_eq!(app.record_of(&warm).outbound_to(&app.storage), 10);
}

#[test]
fn devices_of_a_batch_are_gated_concurrently() {
    // Storage answers after 300 ms: gated one after another, ten devices would never have more
    // than one request in flight.
    let app = App::start("inflight", &[("alert_window_seconds", "60")]);
    app.host
        .set_fault(&app.storage, Some(Fault::Delay(Duration::from_millis(300))));
    let devices: Vec<Value> = (0..10).map(|i| reading(&format!("c-{i}"), 40.0)).collect();
    let a = post_telemetry(&app, &json!(devices));
    assert_eq!(a.status, 200, "{}", a.text);
    let record = app.record_of(&a);
    assert_eq!(record.max_in_flight, 10, "{record:?}");
    assert!(a.json["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["decision"] == "notified"));
}

#[test]
fn sixty_four_concurrent_requests_for_one_device() {
    let app = App::start("herd", &[("alert_window_seconds", "60")]);
    let url = app.url("/api/telemetry");
    let body = reading("herd-1", 55.0).to_string();
    let start = std::sync::Arc::new(std::sync::Barrier::new(64));
    let answers: Vec<_> = (0..64)
        .map(|_| {
            let (url, body, start) = (url.clone(), body.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                call(
                    "POST",
                    &url,
                    &[("content-type", "application/json")],
                    body.as_bytes(),
                )
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert!(
        answers.iter().all(|a| a.status == 200),
        "{:?}",
        answers.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    let notified = answers
        .iter()
        .filter(|a| decision(a, 0)["decision"] == "notified")
        .count();
    let throttled = answers
        .iter()
        .filter(|a| decision(a, 0)["decision"] == "throttled")
        .count();
    assert_eq!((notified, throttled), (1, 63));
    assert!(app.host.wait_idle(Duration::from_secs(30)));
    assert_eq!(app.sink.for_device("herd-1").len(), 1);
}

#[test]
fn failed_notification_releases_the_gate() {
    let app = App::start("notifyfail", &[("alert_window_seconds", "60")]);
    app.sink.answer(500);
    let failed = post_telemetry(&app, &reading("dev-f", 44.0));
    assert_eq!(failed.status, 200, "{}", failed.text);
    let d = decision(&failed, 0);
    assert_eq!(d["decision"], "notify_failed", "{d}");
    assert_eq!(d["gateReleased"], true);
    assert!(d["reason"].as_str().unwrap().contains("500"));
    assert_eq!(app.sink.delivered().len(), 0);
    // The gate was given back: the next reading alerts.
    app.sink.answer(204);
    let next = post_telemetry(&app, &reading("dev-f", 45.0));
    assert_eq!(decision(&next, 0)["decision"], "notified", "{}", next.text);
    assert_eq!(app.sink.for_device("dev-f").len(), 1);

    // An unreachable webhook is the same: notify_failed, gate released, then recovery.
    app.host
        .set_fault(&app.sink.authority(), Some(Fault::Refuse));
    let refused = post_telemetry(&app, &reading("dev-g", 44.0));
    let d = decision(&refused, 0);
    assert_eq!(d["decision"], "notify_failed", "{d}");
    assert_eq!(d["gateReleased"], true);
    assert_eq!(d["reason"], "webhook unreachable: ConnectionRefused");
    app.host.set_fault(&app.sink.authority(), None);
    let back = post_telemetry(&app, &reading("dev-g", 45.0));
    assert_eq!(decision(&back, 0)["decision"], "notified", "{}", back.text);
    assert_eq!(app.sink.for_device("dev-g").len(), 1);
}

#[test]
fn storage_faults_answer_503_and_notify_nobody() {
    let app = App::start(
        "faults",
        &[
            ("alert_window_seconds", "60"),
            ("storage_timeout_ms", "1000"),
        ],
    );
    let faults = [
        ("refused", Fault::Refuse),
        ("busy", Fault::Status(503)),
        ("slow", Fault::Delay(Duration::from_secs(4))),
        ("forbidden", Fault::Status(403)),
    ];
    for (name, fault) in faults {
        app.host.set_fault(&app.storage, Some(fault));
        let started = Instant::now();
        let a = post_telemetry(
            &app,
            &json!([
                reading(&format!("f-{name}"), 60.0),
                reading("f-other", 61.0)
            ]),
        );
        assert_eq!(a.status, 503, "{name}: {}", a.text);
        assert_eq!(a.json["error"], "storage_unavailable", "{name}: {}", a.text);
        assert!(a.json["message"]
            .as_str()
            .unwrap()
            .contains("nothing was done"));
        assert_eq!(a.headers.get("retry-after").map(String::as_str), Some("1"));
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{name}: {:?}",
            started.elapsed()
        );
        assert_eq!(
            app.record_of(&a).outbound_to(&app.sink.authority()),
            0,
            "{name}"
        );
    }
    assert_eq!(app.sink.received().len(), 0);
    // Recovery: the next request works, and the devices alert (no gate was left taken).
    app.host.set_fault(&app.storage, None);
    let ok = post_telemetry(
        &app,
        &json!([reading("f-refused", 60.0), reading("f-other", 61.0)]),
    );
    assert_eq!(ok.status, 200, "{}", ok.text);
    assert_eq!(decision(&ok, 0)["decision"], "notified");
    assert_eq!(decision(&ok, 1)["decision"], "notified");
}

#[test]
fn a_device_held_elsewhere_is_throttled_while_others_alert() {
    // Another deployment holds m-1's gate (a native lease taken outside this app).
    let app = App::start("elsewhere", &[("alert_window_seconds", "60")]);
    let warm = post_telemetry(&app, &json!([reading("m-1", 40.0)]));
    assert_eq!(decision(&warm, 0)["decision"], "notified");
    let lock = LockName::try_new("m-1").unwrap();
    let holder = LeaseId::for_holder("test", &lock);
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix("alerts/");
    block_on(locks.break_lock(&lock, 0, SystemTime::now())).unwrap();
    let held = block_on(locks.acquire(
        &lock,
        Term::for_window(Duration::from_secs(60)).unwrap(),
        holder,
        SystemTime::now(),
    ));
    assert!(held.is_ok());
    let a = post_telemetry(&app, &json!([reading("m-1", 41.0), reading("m-2", 42.0)]));
    assert_eq!(decision(&a, 0)["decision"], "throttled", "{}", a.text);
    assert_eq!(decision(&a, 1)["decision"], "notified");
}

#[test]
fn log_lines_are_json_and_hold_no_secret() {
    let app = App::start("logs", &[("alert_window_seconds", "60")]);
    let a = post_telemetry(
        &app,
        &json!([
            reading("log-1", 40.0),
            reading("log-2", 10.0),
            json!({"deviceId": 3})
        ]),
    );
    assert_eq!(a.status, 200);
    let record = app.record_of(&a);
    let lines: Vec<Value> = record
        .output
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON log line"))
        .collect();
    assert_eq!(lines.len(), 3, "{:?}", record.output);
    let hot = lines.iter().find(|l| l["deviceId"] == "log-1").unwrap();
    assert_eq!(hot["decision"], "notified");
    assert_eq!(hot["storageRoundTrips"], record.outbound_to(&app.storage));
    assert!(hot["durationMs"].is_u64());
    assert!(lines.iter().any(|l| l["decision"] == "below_threshold"));
    assert!(lines.iter().any(|l| l["decision"] == "invalid"));
    for line in &record.output {
        assert!(!line.contains(leasegate::account::DEV_ACCOUNT_KEY));
        assert!(!line.contains("SharedKey"));
    }
}
