//! Fixes from the correctness and security reviews, as `.wasm` served by the real `spin up`:
//! the gate key comes from the request's own path (never a client's `spin-path-info`), lease
//! ids are never revealed by a holder name nor shared between purposes, a stepped-down leader
//! stays a follower for a lease length, settings that cannot work are refused, device-alerts
//! bounds an invocation's work, and format characters stay out of ids and keys.

use std::time::{Duration, Instant};

use leasegate::lease::Locks;
use leasegate::ops::{GetProperties, Metadata, SetMetadata};
use leasegate::LockName;
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{call, post_telemetry, Answer, App, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::proxy::Fault;
use leasegate_tests::Azurite;
use serde_json::json;

// Only a closed door (storage that refuses connections) is used here.
#[allow(dead_code)]
#[path = "support/door.rs"]
mod door;
use door::Door;

const AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

fn gate(app: &App, method: &str, path_and_query: &str, headers: &[(&str, &str)]) -> Answer {
    call(
        method,
        &app.url(&format!("/api/gate/{path_and_query}")),
        headers,
        b"",
    )
}

fn metadata(app: &App, prefix: &str, lock: &str) -> Metadata {
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix(prefix);
    let blob = locks.blob_name(&LockName::try_new(lock).unwrap()).unwrap();
    let (props, _) = block_on(locks.client().execute(
        &GetProperties {
            container: app.container.clone(),
            blob,
        },
        std::time::SystemTime::now(),
    ))
    .unwrap();
    props.expect("the lock blob exists").metadata
}

/// 25.1: Spin passes the client's own `spin-path-info` before the one it adds; the key is the
/// request's own path.
#[test]
fn a_client_header_does_not_pick_the_gate_key() {
    let app = App::start("forged", &[]);
    let forged = ("spin-path-info", "/tenant-b/lock");
    let a = gate(&app, "POST", "tenant-a/lock?window=30", &[AUTH, forged]);
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["key"], "tenant-a/lock", "{}", a.text);
    // tenant-b's gate was not taken.
    let b = gate(&app, "GET", "tenant-b/lock", &[AUTH]);
    assert_eq!(b.json["state"], "available", "{}", b.text);
    let held = gate(&app, "GET", "tenant-a/lock", &[AUTH, forged]);
    assert_eq!(held.json["key"], "tenant-a/lock", "{}", held.text);
    assert_eq!(held.json["state"], "held", "{}", held.text);
    // No key in the path: still a 400, whatever the header says.
    let none = gate(&app, "POST", "?window=30", &[AUTH, forged]);
    assert_eq!(none.status, 400, "{}", none.text);
    assert_eq!(none.json["error"], "invalid_key");
    // The logs name the real key only: tenant-b/lock was only ever inspected.
    assert!(app
        .json_lines()
        .iter()
        .all(|l| l["key"] != "tenant-b/lock" || l["decision"] == "inspected"));
}

/// 21.7: a holder name never reveals a lease id: not the victim's while it holds, and the
/// id a stranger got for a free gate is not the one the victim then uses.
#[test]
fn a_holder_name_never_reveals_a_lease_id() {
    let app = App::start("holderid", &[]);
    let victim = gate(&app, "POST", "k1?window=30&holder=victim", &[AUTH]);
    assert_eq!(victim.status, 200, "{}", victim.text);
    let id = victim.json["leaseId"].as_str().unwrap().to_string();
    let stranger = gate(&app, "POST", "k1?window=30&holder=victim", &[AUTH]);
    assert!(!stranger.text.contains(&id), "{}", stranger.text);
    assert_eq!(stranger.status, 429, "{}", stranger.text);
    // The holder's name is what GET and a refusal show of the holder.
    assert_eq!(stranger.json["holder"], "victim", "{}", stranger.text);
    assert_eq!(
        gate(&app, "GET", "k1", &[AUTH]).json["holder"],
        "victim",
        "GET shows the holder's name"
    );
    // The holder extends with its lease id (sent as Lease-Id): same token, same id.
    let own = [AUTH, ("lease-id", id.as_str())];
    let again = gate(&app, "POST", "k1?window=30&holder=victim", &own);
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["extended"], true);
    assert_eq!(again.json["leaseId"], id.as_str());
    assert_eq!(again.json["fencingToken"], victim.json["fencingToken"]);
    // A stranger takes a free gate naming the victim: what it gets is not what the victim
    // would hold, so it cannot release the victim's gate.
    let early = gate(&app, "POST", "k2?window=30&holder=victim", &[AUTH]);
    assert_eq!(early.status, 200, "{}", early.text);
    let release = [AUTH, ("lease-id", early.json["leaseId"].as_str().unwrap())];
    assert_eq!(gate(&app, "DELETE", "k2", &release).status, 204);
    let later = gate(&app, "POST", "k2?window=30&holder=victim", &[AUTH]);
    assert_eq!(later.status, 200, "{}", later.text);
    assert_ne!(later.json["leaseId"], early.json["leaseId"]);
    assert_eq!(later.json["extended"], false);
    // A client may choose its own id up front: a retry after a lost answer extends.
    let chosen = "6f9619ff-8b86-4011-b42d-00c04fc964ff";
    let mine = [AUTH, ("lease-id", chosen)];
    let first = gate(&app, "POST", "k3?window=20", &mine);
    let retry = gate(&app, "POST", "k3?window=20", &mine);
    assert_eq!((first.status, retry.status), (200, 200), "{}", retry.text);
    assert_eq!(retry.json["leaseId"], chosen);
    assert_eq!(retry.json["extended"], true);
    // Bad holders and ids are clear 400s.
    for (q, h) in [
        ("k4?holder=%E2%80%AEevil", None),
        ("k4?holder=a%C3%A9", None),
        ("k4", Some("not-a-guid")),
    ] {
        let mut headers = vec![AUTH];
        if let Some(h) = h {
            headers.push(("lease-id", h));
        }
        let a = gate(&app, "POST", q, &headers);
        assert_eq!(a.status, 400, "{q}: {}", a.text);
        assert!(a.json["error"].is_string(), "{q}: {}", a.text);
    }
}

/// 21.7: lease ids of different purposes never coincide: a gate holder named like the leader
/// instance, on a key named like its group, does not get the leader's lease id.
#[test]
fn lease_ids_of_different_purposes_differ() {
    let app = App::start("purpose", &[("leader_lease_seconds", "15")]);
    let t = call("POST", &app.url("/api/leader/tick"), &[TIMER_AUTH], b"");
    assert_eq!(t.json["role"], "leader", "{}", t.text);
    let leader_id = metadata(&app, "leader/", "example-group")
        .get("leasegate_holder")
        .cloned()
        .unwrap_or_default();
    assert!(!leader_id.is_empty());
    let g = gate(
        &app,
        "POST",
        "example-group?window=30&holder=test-instance",
        &[AUTH],
    );
    assert_eq!(g.status, 200, "{}", g.text);
    assert_ne!(g.json["leaseId"], leader_id.as_str());
}

/// 21.7: the leader derives its lease id from `instance_id`: without `lease_id_secret` it
/// refuses (never a key derived from the storage credential).
#[test]
fn deriving_lease_ids_needs_lease_id_secret() {
    let app = App::start("nosecret", &[("lease_id_secret", "")]);
    let t = call("POST", &app.url("/api/leader/tick"), &[TIMER_AUTH], b"");
    assert_eq!(t.status, 503, "{}", t.text);
    assert_eq!(t.json["error"], "not_configured", "{}", t.text);
    assert!(t.text.contains("lease_id_secret"), "{}", t.text);
    // The gate derives nothing: it serves.
    assert_eq!(gate(&app, "POST", "k?holder=a", &[AUTH]).status, 200);
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
    // A step-down takes the admin token (the tick token only ticks and reads): four storage
    // requests (docs/functions.md).
    let refused = call("DELETE", &a.url("/api/leader"), &[TIMER_AUTH], b"");
    assert_eq!(refused.status, 403, "{}", refused.text);
    let (down, requests) =
        a.storage_requests(|| call("DELETE", &a.url("/api/leader"), &[ADMIN_AUTH], b""));
    assert_eq!(down.status, 200, "{}", down.text);
    assert_eq!(down.json["steppedDown"], true, "{}", down.text);
    assert_eq!(requests, 4, "a step-down costs four requests");
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

/// 21.11: an initialization allowed to take longer than its lock lasts is refused.
#[test]
fn an_init_timeout_above_its_lease_is_not_configured() {
    let app = App::start(
        "inittimeout",
        &[
            ("init_lease_seconds", "60"),
            ("init_timeout_seconds", "120"),
        ],
    );
    let a = call("POST", &app.url("/api/init/seed"), &[TIMER_AUTH], b"");
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "not_configured", "{}", a.text);
    let m = a.json["message"].as_str().unwrap();
    assert!(
        m.contains("init_timeout_seconds") && m.contains("init_lease_seconds"),
        "{m}"
    );
    assert!(app.sink.received().is_empty());
}

/// 25.9: format and separator characters (Cf, Zl, Zp) are refused in gate keys and device
/// ids with a clear 400, and never reach a log line or a webhook.
#[test]
fn format_characters_stay_out_of_keys_and_ids() {
    let app = App::start("formatchars", &[]);
    for key in [
        "a%E2%80%AEb",
        "a%E2%80%A8b",
        "a%E2%80%A9b",
        "%EF%BB%BFk",
        "a%C2%ADb",
    ] {
        let a = gate(&app, "POST", key, &[AUTH]);
        assert_eq!(a.status, 400, "{key}: {}", a.text);
        assert_eq!(a.json["error"], "invalid_key", "{key}: {}", a.text);
        assert!(a.text.contains("format"), "{key}: {}", a.text);
    }
    for id in ["sensor\u{202e}1", "sensor\u{2028}1", "sensor\u{200b}1"] {
        let a = post_telemetry(&app, &json!({"deviceId": id, "temperature": 99}));
        assert_eq!(a.status, 400, "{id:?}: {}", a.text);
        assert_eq!(a.json["error"], "invalid_reading", "{}", a.text);
    }
    // Other scripts are fine.
    let a = post_telemetry(
        &app,
        &json!({"deviceId": "capteur-é-東京", "temperature": 99}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    for line in app.log_lines() {
        assert!(
            !line.contains('\u{202e}') && !line.contains('\u{2028}'),
            "{line:?}"
        );
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
    // What a new device costs (docs/functions.md): 4 storage requests, 1 blob, 1 webhook call.
    let (a, requests) = app.storage_requests(|| {
        post_telemetry(&app, &json!({"deviceId": "sensor-new", "temperature": 99}))
    });
    assert_eq!(a.json["decisions"][0]["decision"], "notified", "{}", a.text);
    assert_eq!(requests, 4);
    assert_eq!(app.sink.received().len(), 3);
    // A bad pattern is not_configured.
    let bad = App::start("allowlistbad", &[("device_ids", "a*b")]);
    let a = post_telemetry(&bad, &json!({"deviceId": "ab", "temperature": 99}));
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "not_configured");
    assert!(a.text.contains("device_ids"), "{}", a.text);
}

/// 25.3: lock-blob clean-up is on by default: with nothing set but the defaults, the sweeper
/// sweeps the app's own lock blobs (retention one day).
#[test]
fn lock_blob_clean_up_is_on_by_default() {
    let app = App::start("lockclean", &[]);
    let a = call("POST", &app.url("/api/sweeper/tick"), &[TIMER_AUTH], b"");
    assert_eq!(a.status, 200, "{}", a.text);
    let s = call("GET", &app.url("/api/sweeper"), &[TIMER_AUTH], b"");
    let swept: Vec<&str> = s.json["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "locks")
        .map(|c| c["prefix"].as_str().unwrap())
        .collect();
    assert_eq!(swept, ["alerts/", "gates/"], "{}", s.text);
}

/// 25.8: the `lock_unusable` answer names the lock as the CLI takes it, and a command that
/// works (`tests/tests/cli_locks.rs` runs it).
#[test]
fn lock_unusable_names_a_working_command() {
    let app = App::start("unusable", &[]);
    let a = gate(&app, "POST", "bad%20key?window=30", &[AUTH]);
    assert_eq!(a.status, 200, "{}", a.text);
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix("gates/");
    let lock = LockName::try_new("bad key").unwrap();
    block_on(locks.break_lock(&lock, 0, std::time::SystemTime::now())).unwrap();
    let mut m = Metadata::new();
    m.insert("leasegate_token".into(), "x".into());
    block_on(locks.client().execute(
        &SetMetadata {
            container: app.container.clone(),
            blob: locks.blob_name(&lock).unwrap(),
            metadata: m,
            lease_id: None,
            condition: leasegate::ops::Condition::None,
        },
        std::time::SystemTime::now(),
    ))
    .unwrap();
    let a = gate(&app, "POST", "bad%20key?window=30", &[AUTH]);
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "lock_unusable");
    assert_eq!(a.json["lock"], "gates/bad key", "{}", a.text);
    let want = format!(
        "leasegate delete 'gates/bad key' --container {}",
        app.container.as_str()
    );
    assert!(
        a.json["message"].as_str().unwrap().contains(&want),
        "{}",
        a.text
    );
}
