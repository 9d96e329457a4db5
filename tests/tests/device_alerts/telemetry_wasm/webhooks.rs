//! Concurrent requests for one device, webhooks that may have acted or cannot be reached,
//! idempotency keys, a storage failure of one device, requests in flight, a rolling window.

use super::*;

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
