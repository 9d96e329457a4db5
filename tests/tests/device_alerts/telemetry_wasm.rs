//! device-alerts, as the release `.wasm` served by the real `spin up` from `spin.toml`, against
//! a real Azurite behind a counting, fault-injecting proxy, with notifications counted at a
//! webhook sink (behind a proxy of its own). Also an invocation deadline after which no device
//! is started, `Retry-After` growing with the kind of failure, and devices not on `device_ids`
//! costing nothing.

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{Acquiring, Locks, Term};
use leasegate::{LeaseId, LockName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{call, post_telemetry, App, TELEMETRY_AUTH};
use leasegate_tests::proxy::Fault;
use leasegate_tests::sink::Behaviour;
use leasegate_tests::{wait_for, Azurite};
use serde_json::{json, Value};

use crate::door::Door;

fn reading(device: &str, temperature: f64) -> Value {
    json!({ "deviceId": device, "temperature": temperature })
}

fn decision(answer: &leasegate_tests::app::Answer, i: usize) -> &Value {
    &answer.json["decisions"][i]
}

/// Runs `f` (one decision at a time on `app`) and returns what it gave and how many requests
/// reached storage and the webhook meanwhile.
fn costs<T>(app: &App, f: impl FnOnce() -> T) -> (T, usize, usize) {
    let ((out, storage), webhook) = app.webhook.during(|| app.counted(f));
    (out, storage.len(), webhook.len())
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
                    &[("content-type", "application/json"), TELEMETRY_AUTH],
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
    // Every answer is in, so every notification was sent (or not) before it.
    assert_eq!(app.sink.for_device("herd-1").len(), 1);
    assert_eq!(app.sink.received().len(), 1);
}

/// A webhook that may have acted (it answered 5xx, answered after the timeout, or its answer
/// was lost) keeps the gate: the next reading of the window sends nothing.
///
/// The lost answer is the webhook proxy's `LoseAnswer` (the sink got the notification and
/// answered; the connection to the app was reset), not the sink's `Behaviour::Reset`: when the
/// sink closes a connection without answering, the proxy sends the request again on a new
/// one, and the sink would count two.
#[test]
fn a_webhook_that_may_have_acted_keeps_the_gate() {
    let app = App::start(
        "notifyunknown",
        &[
            ("alert_window_seconds", "60"),
            ("storage_timeout_ms", "1000"),
        ],
    );
    let cases = [
        (
            "dev-500",
            Behaviour::Answer(500),
            None,
            "webhook answered 500",
        ),
        (
            "dev-late",
            Behaviour::Late(Duration::from_millis(2500), 204),
            None,
            "webhook did not confirm",
        ),
        (
            "dev-lost",
            Behaviour::Answer(204),
            Some(Fault::LoseAnswer),
            "webhook did not confirm",
        ),
    ];
    for (device, behaviour, fault, reason) in cases {
        app.sink.behave(behaviour);
        app.webhook.set_fault(fault);
        let failed = post_telemetry(&app, &reading(device, 44.0));
        app.webhook.set_fault(None);
        assert_eq!(failed.status, 200, "{device}: {}", failed.text);
        let d = decision(&failed, 0);
        assert_eq!(d["decision"], "notify_failed", "{device}: {d}");
        assert_eq!(d["delivery"], "unknown", "{device}: {d}");
        assert_eq!(d["gateReleased"], false, "{device}: {d}");
        assert!(
            d["reason"].as_str().unwrap().contains(reason),
            "{device}: {d}"
        );
        // The webhook did get it...
        let got = app
            .sink
            .received()
            .into_iter()
            .filter(|r| r.body["deviceId"] == device)
            .count();
        assert_eq!(got, 1, "{device}");
        // ...and the next reading in the window is throttled, so it is not sent twice.
        app.sink.answer(204);
        let next = post_telemetry(&app, &reading(device, 45.0));
        assert_eq!(
            decision(&next, 0)["decision"],
            "throttled",
            "{device}: {}",
            next.text
        );
        let got = app
            .sink
            .received()
            .into_iter()
            .filter(|r| r.body["deviceId"] == device)
            .count();
        assert_eq!(got, 1, "{device}: sent twice");
    }
}

/// A webhook that cannot be reached got nothing: the gate is given back and the next reading
/// alerts. (Unreachable: its port refuses connections; the proxy's `Fault::Refuse` reads the
/// request first, so to the app that webhook may have acted.)
#[test]
fn an_unreachable_webhook_gives_the_gate_back() {
    let door = Door::closed();
    let app = App::start(
        "notifyrefused",
        &[
            ("alert_window_seconds", "60"),
            ("notify_origin", &door.origin()),
        ],
    );
    let refused = post_telemetry(&app, &reading("dev-g", 44.0));
    assert_eq!(refused.status, 200, "{}", refused.text);
    let d = decision(&refused, 0);
    assert_eq!(d["decision"], "notify_failed", "{d}");
    assert_eq!(d["delivery"], "not_delivered", "{d}");
    assert_eq!(d["gateReleased"], true);
    assert_eq!(d["reason"], "webhook unreachable: ConnectionRefused");
    assert_eq!(app.webhook.count(), 0);
    door.open(&app.webhook.authority());
    let back = post_telemetry(&app, &reading("dev-g", 45.0));
    assert_eq!(decision(&back, 0)["decision"], "notified", "{}", back.text);
    assert_eq!(app.sink.for_device("dev-g").len(), 1);
}

/// Every notification carries an idempotency key, in a header and in the body: the same for
/// the whole window, another for the next window.
#[test]
fn notifications_carry_an_idempotency_key_per_window() {
    let app = App::start("idem", &[("alert_window_seconds", "2")]);
    let first = post_telemetry(&app, &reading("dev-i", 41.0));
    assert_eq!(
        decision(&first, 0)["decision"],
        "notified",
        "{}",
        first.text
    );
    wait_for("the 2 s window to pass", Duration::from_secs(15), || {
        let a = post_telemetry(&app, &reading("dev-i", 42.0));
        (decision(&a, 0)["decision"] == "notified").then_some(())
    });
    let sent = app.sink.for_device("dev-i");
    assert_eq!(sent.len(), 2);
    for n in &sent {
        let key = n
            .idempotency_key
            .clone()
            .expect("an Idempotency-Key header");
        assert_eq!(n.body["idempotencyKey"], key.as_str());
        assert_eq!(key.len(), 32);
        assert!(key.chars().all(|c| c.is_ascii_hexdigit()), "{key}");
    }
    assert_ne!(sent[0].idempotency_key, sent[1].idempotency_key);
}

/// One device's storage failing does not hold back the others of the batch; the answer is a
/// 503 that says so, and the client's retry of the whole batch repeats no alert.
#[test]
fn one_devices_storage_failure_does_not_hold_back_the_others() {
    let app = App::start("partial", &[("alert_window_seconds", "60")]);
    app.storage.fault_on("/alerts/sick", Fault::Status(503));
    let batch = json!([
        reading("healthy", 50.0),
        reading("sick", 51.0),
        reading("cool", 1.0)
    ]);
    let a = post_telemetry(&app, &batch);
    assert_eq!(a.status, 503, "{}", a.text);
    // Storage answered 5xx (without a Retry-After of its own): 5 to 7 s, jittered.
    let wait: u64 = a.headers["retry-after"].parse().unwrap();
    assert!((5..=7).contains(&wait), "{wait}");
    assert_eq!(a.json["error"], "storage_unavailable");
    assert!(a.json["message"]
        .as_str()
        .unwrap()
        .contains("1 of 2 devices"));
    assert_eq!(decision(&a, 0)["decision"], "notified", "{}", a.text);
    assert_eq!(
        decision(&a, 1)["decision"],
        "storage_unavailable",
        "{}",
        a.text
    );
    assert_eq!(decision(&a, 2)["decision"], "below_threshold");
    assert_eq!(app.sink.for_device("healthy").len(), 1);
    assert_eq!(app.sink.for_device("sick").len(), 0);
    // The client retries the batch as told: nothing is sent twice; the sick device, once
    // storage answers for it again, alerts.
    let retry = post_telemetry(&app, &batch);
    assert_eq!(
        decision(&retry, 0)["decision"],
        "throttled",
        "{}",
        retry.text
    );
    assert_eq!(decision(&retry, 1)["decision"], "storage_unavailable");
    app.storage.set_fault(None);
    let healed = post_telemetry(&app, &batch);
    assert_eq!(healed.status, 200, "{}", healed.text);
    assert_eq!(decision(&healed, 0)["decision"], "throttled");
    assert_eq!(decision(&healed, 1)["decision"], "notified");
    assert_eq!(app.sink.for_device("healthy").len(), 1);
    assert_eq!(app.sink.for_device("sick").len(), 1);
}

/// A batch of 40 devices keeps at most `max_in_flight` storage requests in flight.
#[test]
fn a_batch_keeps_a_bounded_number_of_requests_in_flight() {
    let app = App::start(
        "bounded",
        &[("alert_window_seconds", "60"), ("max_in_flight", "8")],
    );
    app.storage
        .set_fault(Some(Fault::Delay(Duration::from_millis(50))));
    let devices: Vec<Value> = (0..40).map(|i| reading(&format!("b-{i}"), 40.0)).collect();
    app.storage.reset_peak();
    let a = post_telemetry(&app, &json!(devices));
    assert_eq!(a.status, 200, "{}", a.text);
    assert!(a.json["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["decision"] == "notified"));
    // Counted at the storage proxy (the only caller of this app).
    let peak = app.storage.peak_in_flight();
    assert!((2..=8).contains(&peak), "{peak}");
}

/// A rolling change of `alert_window_seconds` (60 to 90): old and new deployments gate the
/// same devices at once, with a native lease and a lease record. Still one alert per device.
#[test]
fn a_rolling_window_change_still_sends_one_alert() {
    let old = App::start("rollold", &[("alert_window_seconds", "60")]);
    let container = old.container.as_str().to_string();
    let new = App::start(
        "rollnew",
        &[("alert_window_seconds", "90"), ("container", &container)],
    );
    for round in 0..3 {
        let device = format!("roll-{round}");
        let body = reading(&device, 55.0).to_string();
        let start = std::sync::Arc::new(std::sync::Barrier::new(32));
        let urls = [old.url("/api/telemetry"), new.url("/api/telemetry")];
        let answers: Vec<_> = (0..32)
            .map(|i| {
                let (url, body, start) = (urls[i % 2].clone(), body.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    call(
                        "POST",
                        &url,
                        &[("content-type", "application/json"), TELEMETRY_AUTH],
                        body.as_bytes(),
                    )
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let notified = answers
            .iter()
            .filter(|a| decision(a, 0)["decision"] == "notified")
            .count();
        assert_eq!(notified, 1, "round {round}");
        // Every answer is in, so every notification was sent (or not) before it.
        assert_eq!(
            old.sink.for_device(&device).len() + new.sink.for_device(&device).len(),
            1,
            "round {round}"
        );
    }
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
    // Each failure kind with the Retry-After it asks for (jittered): `Fault::Refuse` reads the
    // request and then resets the connection (a broken connection, "anything else": 5 to 7 s;
    // a connection refused outright is `retry_after_backs_off_with_the_failure` below);
    // a 403 is no outage: 502 `storage_forbidden`, not retryable.
    let faults = [
        ("refused", Fault::Refuse, Some(5..=7)),
        ("busy", Fault::Status(503), Some(5..=7)),
        ("slow", Fault::Delay(Duration::from_secs(4)), Some(10..=14)),
        ("forbidden", Fault::Status(403), None),
    ];
    for (name, fault, wait) in faults {
        app.storage.set_fault(Some(fault));
        let started = Instant::now();
        let (a, webhook) = app.webhook.during(|| {
            post_telemetry(
                &app,
                &json!([
                    reading(&format!("f-{name}"), 60.0),
                    reading("f-other", 61.0)
                ]),
            )
        });
        let (status, error) = if wait.is_some() {
            (503, "storage_unavailable")
        } else {
            (502, "storage_forbidden")
        };
        assert_eq!(a.status, status, "{name}: {}", a.text);
        assert_eq!(a.json["error"], error, "{name}: {}", a.text);
        assert!(a.json["message"]
            .as_str()
            .unwrap()
            .contains("nothing was sent"));
        assert!(a.json["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["decision"] == "storage_unavailable"));
        match wait {
            Some(range) => {
                let secs: u64 = a.headers["retry-after"].parse().unwrap();
                assert!(range.contains(&secs), "{name}: {secs} not in {range:?}");
            }
            None => assert!(
                !a.headers.contains_key("retry-after"),
                "{name}: {:?}",
                a.headers
            ),
        }
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{name}: {:?}",
            started.elapsed()
        );
        assert_eq!(webhook.len(), 0, "{name}");
    }
    assert_eq!(app.sink.received().len(), 0);
    // Recovery: the next request works, and the devices alert (no gate was left taken).
    app.storage.set_fault(None);
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
    let holder = LeaseId::from_random_bytes(*b"other deployment");
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix("alerts/");
    block_on(locks.break_lock(&lock, 0, SystemTime::now())).unwrap();
    let held = block_on(locks.acquire(
        &lock,
        Acquiring::new(Term::for_window(Duration::from_secs(60)).unwrap(), holder),
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
    let (a, storage) = app.storage_requests(|| {
        post_telemetry(
            &app,
            &json!([
                reading("log-1", 40.0),
                reading("log-2", 10.0),
                json!({"deviceId": 3})
            ]),
        )
    });
    assert_eq!(a.status, 200);
    // The component's own output files (Spin's `--log-dir`): every line is JSON.
    let output = wait_for(
        "the component's three log lines",
        Duration::from_secs(10),
        || {
            let lines = component_output(&app, "device-alerts");
            (lines.len() >= 3).then_some(lines)
        },
    );
    let lines: Vec<Value> = output
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON log line"))
        .collect();
    assert_eq!(lines.len(), 3, "{output:?}");
    let hot = lines.iter().find(|l| l["deviceId"] == "log-1").unwrap();
    assert_eq!(hot["decision"], "notified");
    assert_eq!(hot["storageRoundTrips"], storage);
    assert!(hot["durationMs"].is_u64());
    assert!(lines.iter().any(|l| l["decision"] == "below_threshold"));
    assert!(lines.iter().any(|l| l["decision"] == "invalid"));
    for line in app.log_lines() {
        assert!(
            !line.contains(leasegate::account::DEV_ACCOUNT_KEY),
            "{line}"
        );
        assert!(!line.contains("SharedKey"), "{line}");
    }
    app.assert_no_trap();
}

/// The lines `component` wrote to stdout and stderr (the files Spin keeps for it in its
/// `--log-dir`), without Spin's own output.
fn component_output(app: &App, component: &str) -> Vec<String> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(app.spin.dir().join("logs"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(component))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A device whose gate was granted but whose next step failed (the claim with its fencing
/// token answered 503, or the acquire's answer was lost) is answered 503, and the client's
/// retry alerts: the gate was given back, not left throttling the device for its window.
#[test]
fn a_failure_after_the_gate_was_granted_does_not_throttle_the_retry() {
    // The gates are broken by hand below, which the gate cache cannot see: it is off.
    let app = App::start(
        "grantedfail",
        &[("alert_window_seconds", "60"), ("kv_cache", "off")],
    );
    for (i, (part, fault)) in [
        ("comp=metadata", Fault::Status(503)),
        ("comp=lease", Fault::LoseAnswer),
    ]
    .into_iter()
    .enumerate()
    {
        let device = format!("granted-{i}");
        // Create the device's lock blob first (an alert, then an operator's break), so the
        // fault hits the hot path.
        let warm = post_telemetry(&app, &reading(&device, 40.0));
        assert_eq!(decision(&warm, 0)["decision"], "notified");
        let lock = LockName::try_new(&device).unwrap();
        block_on(
            Locks::new(
                NativeTransport::default(),
                Azurite::shared().account(),
                app.container.clone(),
            )
            .with_prefix("alerts/")
            .break_lock(&lock, 0, SystemTime::now()),
        )
        .unwrap();
        app.storage.fault_on(part, fault.clone());
        let failed = post_telemetry(&app, &reading(&device, 40.0));
        app.storage.set_fault(None);
        assert_eq!(failed.status, 503, "{part} {fault:?}: {}", failed.text);
        assert_eq!(
            app.sink.for_device(&device).len(),
            1,
            "only the warm-up alert"
        );
        let retry = post_telemetry(&app, &reading(&device, 40.0));
        assert_eq!(
            decision(&retry, 0)["decision"],
            "notified",
            "{part} {fault:?}: {}",
            retry.text
        );
        assert_eq!(app.sink.for_device(&device).len(), 2);
    }
}

/// 25.3: an invocation deadline: devices not started by then are not gated (503, nothing
/// done for them), and the answer comes soon after the deadline however big the batch.
#[test]
fn device_alerts_stop_starting_devices_at_the_deadline() {
    let app = App::start(
        "deadline",
        &[("alert_deadline_ms", "1500"), ("max_in_flight", "1")],
    );
    app.storage
        .set_fault(Some(Fault::Delay(Duration::from_millis(400))));
    let batch: Vec<_> = (0..8)
        .map(|i| json!({"deviceId": format!("d{i}"), "temperature": 99}))
        .collect();
    let started = Instant::now();
    let a = post_telemetry(&app, &json!(batch));
    let took = started.elapsed();
    app.storage.set_fault(None);
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "deadline_exceeded", "{}", a.text);
    let decisions = a.json["decisions"].as_array().unwrap();
    let skipped = decisions
        .iter()
        .filter(|d| d["decision"] == "deadline_exceeded")
        .count();
    assert!(skipped >= 4, "{}", a.text);
    assert!(a.headers.contains_key("retry-after"));
    assert!(took < Duration::from_secs(8), "{took:?}");
    // A retry gates the rest.
    let again = post_telemetry(&app, &json!(batch));
    assert_eq!(again.status, 200, "{}", again.text);
}

/// 25.3: `Retry-After` grows with the kind of failure, each jittered within its band
/// (docs/functions.md): a refused connection 2 to 3 s, a connection broken after the request
/// went out (the proxy's `Fault::Refuse` reads the request, then resets: "anything else") 5 to
/// 7 s, no answer in time 10 to 14 s.
#[test]
fn retry_after_backs_off_with_the_failure() {
    let app = App::start("retryafter", &[("storage_timeout_ms", "500")]);
    let reading = json!({"deviceId": "s1", "temperature": 99});
    let mut reset = Vec::new();
    let mut timed_out = Vec::new();
    for _ in 0..3 {
        app.storage.set_fault(Some(Fault::Refuse));
        let a = post_telemetry(&app, &reading);
        assert_eq!(a.status, 503, "{}", a.text);
        reset.push(a.headers["retry-after"].parse::<u64>().unwrap());
        app.storage
            .set_fault(Some(Fault::Delay(Duration::from_millis(1500))));
        let a = post_telemetry(&app, &reading);
        assert_eq!(a.status, 503, "{}", a.text);
        timed_out.push(a.headers["retry-after"].parse::<u64>().unwrap());
    }
    app.storage.set_fault(None);
    // Storage on a port that refuses connections: nothing was sent.
    let door = Door::closed();
    let closed = App::start(
        "retryrefused",
        &[
            ("storage_origin", &door.origin()),
            ("storage_timeout_ms", "500"),
        ],
    );
    let mut refused = Vec::new();
    for _ in 0..3 {
        let a = post_telemetry(&closed, &reading);
        assert_eq!(a.status, 503, "{}", a.text);
        refused.push(a.headers["retry-after"].parse::<u64>().unwrap());
    }
    assert!(refused.iter().all(|s| (2..=3).contains(s)), "{refused:?}");
    assert!(reset.iter().all(|s| (5..=7).contains(s)), "{reset:?}");
    assert!(
        timed_out.iter().all(|s| (10..=14).contains(s)),
        "{timed_out:?}"
    );
}

/// 25.3: with `device_ids` set, a device not on the list costs no storage request and no
/// webhook call.
#[test]
fn unlisted_devices_cost_nothing() {
    let app = App::start("allowlist", &[("device_ids", "sensor-*, pump-7")]);
    let batch = json!([
        {"deviceId": "sensor-1", "temperature": 99},
        {"deviceId": "pump-7", "temperature": 99},
        {"deviceId": "pump-8", "temperature": 99},
        {"deviceId": "invented-1", "temperature": 99},
    ]);
    let (a, seen) = app.counted(|| post_telemetry(&app, &batch));
    assert_eq!(a.status, 200, "{}", a.text);
    let d = a.json["decisions"].as_array().unwrap();
    assert_eq!(d[0]["decision"], "notified");
    assert_eq!(d[1]["decision"], "notified");
    for i in [2, 3] {
        assert_eq!(d[i]["decision"], "invalid", "{}", a.text);
        assert!(d[i]["reason"].as_str().unwrap().contains("device_ids"));
    }
    assert!(seen
        .iter()
        .all(|s| !s.path().contains("pump-8") && !s.path().contains("invented")));
    assert_eq!(app.sink.received().len(), 2);
    // What a new device costs (docs/functions.md): 3 storage requests (4 when the grant lands
    // in a later second than the HEAD; counted exactly in toolkit/requests_per_operation_wasm.rs), 1 blob, 1
    // webhook call.
    let (a, requests) = app.storage_requests(|| {
        post_telemetry(&app, &json!({"deviceId": "sensor-new", "temperature": 99}))
    });
    assert_eq!(a.json["decisions"][0]["decision"], "notified", "{}", a.text);
    assert!((3..=4).contains(&requests), "{requests}");
    assert_eq!(app.sink.received().len(), 3);
    // A bad pattern is not_configured.
    let bad = App::start("allowlistbad", &[("device_ids", "a*b")]);
    let a = post_telemetry(&bad, &json!({"deviceId": "ab", "temperature": 99}));
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "not_configured");
    assert!(a.text.contains("device_ids"), "{}", a.text);
}
