//! Storage faults, a device held elsewhere, log lines without secrets, a failure after the grant,
//! the deadline, back-off, unlisted devices.

use super::*;

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
        assert!(!line.contains(leasegate::DEV_ACCOUNT_KEY), "{line}");
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
    // in a later second than the HEAD; counted exactly in toolkit/requests_per_operation_wasm/), 1 blob, 1
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
