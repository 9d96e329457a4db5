//! The HTTP functions' rows: device-alerts' readings and alerts, the gate's acquire, re-acquire and
//! release.

use super::*;

fn reading(device: &str, temperature: f64) -> serde_json::Value {
    json!({ "deviceId": device, "temperature": temperature })
}

fn decision(a: &Answer) -> &serde_json::Value {
    &a.json["decisions"][0]
}

/// Throttled reading, cache off: **1** (HEAD). Target 1.
#[test]
fn throttled_reading_cache_off() {
    let app = App::start(
        "rt-thr-off",
        &[("kv_cache", "off"), ("alert_window_seconds", "3600")],
    );
    let first = post_telemetry(&app, &reading("d", 40.0));
    assert_eq!(decision(&first)["decision"], "notified", "{}", first.text);
    let a = expect_requests(&app, "throttled, kv_cache=off", 1, || {
        post_telemetry(&app, &reading("d", 41.0))
    });
    assert_eq!(decision(&a)["decision"], "throttled", "{}", a.text);
    assert!(decision(&a)["cached"].is_null(), "{}", a.text);
}

/// Throttled reading, cache on: **0** (the key-value store tells). Target 0.
#[test]
fn throttled_reading_cache_on() {
    let app = App::start("rt-thr-on", &[("alert_window_seconds", "3600")]);
    let first = post_telemetry(&app, &reading("d", 40.0));
    assert_eq!(decision(&first)["decision"], "notified", "{}", first.text);
    let a = expect_requests(&app, "throttled, kv_cache=on", 0, || {
        post_telemetry(&app, &reading("d", 41.0))
    });
    assert_eq!(decision(&a)["decision"], "throttled", "{}", a.text);
    assert_eq!(decision(&a)["cached"], true, "{}", a.text);
}

/// An alert that wins on a lock blob that exists, its last window over (a native lease of
/// 15 s that ran out): **3** (HEAD, acquire, claim). Target 2, or the closing note says why 3.
#[test]
fn alert_that_wins() {
    let app = App::start(
        "rt-win",
        &[("kv_cache", "off"), ("alert_window_seconds", "15")],
    );
    let first = post_telemetry(&app, &reading("d", 40.0));
    assert_eq!(decision(&first)["decision"], "notified", "{}", first.text);
    // The window ends when storage says the lease is no longer held (inspected by the test,
    // not through the app).
    let locks = Locks::new(
        NativeTransport::default(),
        leasegate_tests::Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix("alerts/");
    let lock = LockName::try_new("d").unwrap();
    wait_for("the window to end", Duration::from_secs(30), || {
        let info = block_on(locks.inspect(&lock, SystemTime::now())).unwrap();
        matches!(info.status, LockStatus::Available).then_some(())
    });
    let a = expect_requests(&app, "alert that wins", 3, || {
        post_telemetry(&app, &reading("d", 42.0))
    });
    assert_eq!(decision(&a)["decision"], "notified", "{}", a.text);
    assert!(
        decision(&a)["fencingToken"].as_u64() > decision(&first)["fencingToken"].as_u64(),
        "{}",
        a.text
    );
}

/// The first alert of a new device (the container exists): **3** (HEAD 404, create the lock
/// blob with its first token and the claim of the call's generated id, acquire at the create's
/// ETag), was 4 (the claim written under the lease). Target 3. The lock blob is then held
/// with the token the alert carried.
#[test]
fn first_alert_of_a_new_device() {
    let app = App::start("rt-new", &[("kv_cache", "off")]);
    create_container(&app);
    let a = expect_requests_in_a_second(&app, "first alert of a new device", 3, || {
        post_telemetry(&app, &reading("new", 40.0))
    });
    assert_eq!(decision(&a)["decision"], "notified", "{}", a.text);
    let locks = Locks::new(
        NativeTransport::default(),
        leasegate_tests::Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix("alerts/");
    let info =
        block_on(locks.inspect(&LockName::try_new("new").unwrap(), SystemTime::now())).unwrap();
    // Held, by the claim the create wrote (not told as the holder: another caller could have
    // raced its creator to the lease), with the token the alert carried.
    assert!(
        matches!(info.status, LockStatus::Held { holder: None, .. }),
        "the new device's gate is held: {info:?}"
    );
    assert_eq!(
        Some(info.fencing_token),
        decision(&a)["fencingToken"].as_u64(),
        "{}",
        a.text
    );
}

/// The first alert with the container missing: **4** (HEAD 404 `ContainerNotFound`, create the
/// container, create the lock blob with the claim, acquire), was 6, then 5. Target 5.
#[test]
fn first_alert_container_missing() {
    let app = App::start("rt-nocontainer", &[("kv_cache", "off")]);
    let a = expect_requests_in_a_second(&app, "first alert, container missing", 4, || {
        post_telemetry(&app, &reading("new", 40.0))
    });
    assert_eq!(decision(&a)["decision"], "notified", "{}", a.text);
}

/// A gate taken, then re-acquired by its holder (its `Lease-Id`) in a later second.
fn reacquire(tag: &str, window: &str, expected: usize) {
    let app = App::start(tag, &[]);
    create_container(&app);
    let path = format!("/api/gate/k?window={window}&holder=node-a");
    let first = call("POST", &app.url(&path), &[GATE_AUTH], b"");
    assert_eq!(first.status, 200, "{}", first.text);
    let id = first.json["leaseId"].as_str().unwrap().to_string();
    // Within the server second of the claim's last write the claim already names the new
    // expiry and is not written again (one request fewer): counted in a later second.
    next_second();
    let label = format!("gate re-acquire by its holder, window {window}");
    let a = expect_requests(&app, &label, expected, || holder_post(&app, &path, &id));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["extended"], true, "{}", a.text);
    assert_eq!(a.json["fencingToken"], first.json["fencingToken"]);
}

/// Gate re-acquire by its holder, native lease (window 60): **2** (the renew and the claim's
/// new expiry, both from what the deployment kept of the holder's last call; 1 within the
/// server second of the last claim write), was 3 (a HEAD first). Target 1 while the claim's
/// recorded expiry covers the call, else 2.
#[test]
fn gate_reacquire_by_its_holder_native() {
    reacquire("rt-reacq-native", "60", 2);
}

/// Gate re-acquire by its holder, lease record (window 120): **1** (the compare-and-swap at the
/// ETag the deployment kept of the holder's last call, its expiry reckoned from the instance's
/// clock and checked against the write's `Date`), was 2 (a HEAD first). Target 1.
#[test]
fn gate_reacquire_by_its_holder_record() {
    reacquire("rt-reacq-record", "120", 1);
}

/// A deployment whose clock is 5 s behind storage's, and a record gate of `window` seconds
/// taken there: the deployment, the gate's path, the first answer and its lease id.
fn record_gate_behind(tag: &str, window: u64) -> (App, String, Answer, String) {
    let app = App::start_with(
        tag,
        &[],
        Setup {
            clock_offset_ms: -5_000,
            ..Setup::default()
        },
    );
    create_container(&app);
    let path = format!("/api/gate/k?window={window}&holder=node-a");
    let first = call("POST", &app.url(&path), &[GATE_AUTH], b"");
    assert_eq!(first.status, 200, "{}", first.text);
    let id = first.json["leaseId"].as_str().unwrap().to_string();
    (app, path, first, id)
}

/// A deployment whose clock is behind storage's (5 s): the record's expiry reckoned from it is
/// off what a read first would write, so the write's `Date` has it written again, at the ETag
/// the first write left: 2 requests, and the expiry a read first would give.
#[test]
fn a_record_extended_by_a_clock_behind_storage_is_written_as_a_read_would() {
    let (app, path, first, id) = record_gate_behind("rt-rec-behind", 120);
    let before = unix_now();
    wait_for("three seconds", Duration::from_secs(10), || {
        (unix_now() >= before + 3).then_some(())
    });
    let called = unix_now();
    let a = expect_requests(&app, "record from a clock behind", 2, || {
        holder_post(&app, &path, &id)
    });
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["extended"], true, "{}", a.text);
    assert_eq!(a.json["fencingToken"], first.json["fencingToken"]);
    let expires = humantime::parse_rfc3339(a.json["expiresAt"].as_str().unwrap()).unwrap();
    let expires = expires
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        (called + 119..=unix_now() + 120).contains(&expires),
        "{} (called at {called})",
        a.text
    );
}

/// A record that ran out at storage while the deployment's clock (5 s behind) says it has time
/// left: the write from what was kept lands after the old expiry, so a new tenure is due, and
/// the record is written again as one, with a higher token, as a read first would.
#[test]
fn a_record_that_ran_out_is_a_new_tenure_though_the_clock_says_otherwise() {
    let (app, path, first, id) = record_gate_behind("rt-rec-lapsed", 4);
    let expires = humantime::parse_rfc3339(first.json["expiresAt"].as_str().unwrap()).unwrap();
    wait_for("the record to run out", Duration::from_secs(10), || {
        (SystemTime::now() >= expires + Duration::from_millis(200)).then_some(())
    });
    let a = expect_requests(&app, "lapsed record from a kept state", 2, || {
        holder_post(&app, &path, &id)
    });
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["extended"], false, "{}", a.text);
    assert!(
        a.json["fencingToken"].as_u64() > first.json["fencingToken"].as_u64(),
        "{} after {}",
        a.text,
        first.text
    );
}

/// Gate release by its holder: **1** (the release, `If-Match` the ETag the deployment kept of
/// the holder's last call), was 2 (a HEAD first). Target 1.
#[test]
fn gate_release() {
    let app = App::start("rt-release", &[]);
    create_container(&app);
    let first = call("POST", &app.url("/api/gate/k?window=60"), &[GATE_AUTH], b"");
    assert_eq!(first.status, 200, "{}", first.text);
    let id = first.json["leaseId"].as_str().unwrap().to_string();
    let a = expect_requests(&app, "gate release", 1, || {
        call(
            "DELETE",
            &app.url("/api/gate/k"),
            &[GATE_AUTH, ("lease-id", &id)],
            b"",
        )
    });
    assert_eq!(a.status, 204, "{}", a.text);
    let state = call("GET", &app.url("/api/gate/k"), &[GATE_AUTH], b"");
    assert_eq!(state.json["state"], "available", "{}", state.text);
}

/// The gate path of the kept-state rows, its holder named.
const KEPT_GATE: &str = "/api/gate/k?window=60&holder=node-a";

/// Two deployments of the gate on one container, each with its own key-value store, and the
/// gate taken on the first: the deployments, the first answer and its lease id.
fn gate_on_two_deployments(tag: &str) -> (App, App, Answer, String) {
    let a = App::start(&format!("{tag}-a"), &[]);
    let b = App::start_with(
        &format!("{tag}-b"),
        &[],
        Setup {
            container: Some(a.container.clone()),
            ..Setup::default()
        },
    );
    create_container(&a);
    let first = call("POST", &a.url(KEPT_GATE), &[GATE_AUTH], b"");
    assert_eq!(first.status, 200, "{}", first.text);
    let id = first.json["leaseId"].as_str().unwrap().to_string();
    (a, b, first, id)
}

/// The holder's `POST` and `DELETE` with its lease id.
fn gate_call(app: &App, method: &str, id: &str) -> Answer {
    let path = if method == "POST" {
        KEPT_GATE
    } else {
        "/api/gate/k"
    };
    call(method, &app.url(path), &[GATE_AUTH, ("lease-id", id)], b"")
}

/// The holder's `POST` of `path` with its lease id.
fn holder_post(app: &App, path: &str, id: &str) -> Answer {
    call("POST", &app.url(path), &[GATE_AUTH, ("lease-id", id)], b"")
}

/// What one deployment keeps of a holder's gate goes stale when the holder calls the other. A
/// stale state costs the one refused request, then the call reads and answers as it would have
/// without it.
#[test]
fn a_gate_kept_by_another_deployment_is_read_again() {
    let (a, b, first, id) = gate_on_two_deployments("rt-kept");
    next_second();
    // B keeps nothing of it: a read first, 3.
    let on_b = expect_requests(&b, "re-acquire on the other deployment", 3, || {
        gate_call(&b, "POST", &id)
    });
    assert_eq!(on_b.json["extended"], true, "{}", on_b.text);
    next_second();
    // A's state names the ETag before B's claim: the renew is refused, then 3 as without it.
    let on_a = expect_requests(&a, "re-acquire from a stale state", 4, || {
        gate_call(&a, "POST", &id)
    });
    assert_eq!(on_a.json["extended"], true, "{}", on_a.text);
    assert_eq!(on_a.json["fencingToken"], first.json["fencingToken"]);
    // And B's release from its own stale state: refused, then the read and the release.
    let released = expect_requests(&b, "release from a stale state", 3, || {
        gate_call(&b, "DELETE", &id)
    });
    assert_eq!(released.status, 204, "{}", released.text);
    let state = call("GET", &a.url("/api/gate/k"), &[GATE_AUTH], b"");
    assert_eq!(state.json["state"], "available", "{}", state.text);
}

/// A gate released on another deployment leaves the lease's ETag where it was, so what the
/// first deployment kept still matches it: its holder's next call must not tell an extension
/// of the gate it gave back. The renew from the kept state is refused (storage renews no
/// released lease), and the acquire after a read tells a new tenure with a higher token.
#[test]
fn a_gate_released_elsewhere_is_not_extended_from_a_kept_state() {
    let (a, b, first, id) = gate_on_two_deployments("rt-kept-rel");
    let released = gate_call(&b, "DELETE", &id);
    assert_eq!(released.status, 204, "{}", released.text);
    let again = gate_call(&a, "POST", &id);
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["extended"], false, "{}", again.text);
    assert!(
        again.json["fencingToken"].as_u64() > first.json["fencingToken"].as_u64(),
        "{}",
        again.text
    );
}
