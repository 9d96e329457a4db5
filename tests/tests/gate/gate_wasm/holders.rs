//! Holders' lease ids: a lost answer leaves nothing taken, ids not computable from names nor
//! revealed by them, names kept out of keys.

use super::*;

/// A gate call without `holder` whose acquire reached storage but whose answer was lost (or
/// whose claim write failed) answers 503 and leaves nothing taken: the key is free at once,
/// not locked for the window under an id nobody knows.
#[test]
fn a_gate_whose_answer_was_lost_is_not_left_taken() {
    let app = App::start("lostanswer", &[("storage_timeout_ms", "2000")]);
    for (i, (part, fault)) in [
        ("comp=lease", Fault::LoseAnswer),
        ("comp=metadata", Fault::Status(503)),
        ("comp=metadata", Fault::LoseAnswer),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("lost-{i}");
        // The lock blob exists already: the fault hits the hot path.
        let warm = gate(&app, "POST", &format!("{key}?window=600"), &[AUTH]);
        let release = [AUTH, ("lease-id", warm.json["leaseId"].as_str().unwrap())];
        assert_eq!(gate(&app, "DELETE", &key, &release).status, 204);
        app.storage.fault_on(part, fault.clone());
        let a = gate(&app, "POST", &format!("{key}?window=30"), &[AUTH]);
        assert_eq!(a.status, 503, "{part} {fault:?}: {}", a.text);
        app.storage.set_fault(None);
        let next = gate(&app, "POST", &format!("{key}?window=30"), &[AUTH]);
        assert_eq!(
            next.status, 200,
            "{part} {fault:?}: left taken: {}",
            next.text
        );
    }
}

/// The gate derives no lease id from `holder` (the name is a label): knowing the holder's name
/// (and the gate token) is not enough to compute its lease id and release its gate, under any
/// `lease_id_secret`.
#[test]
fn holder_lease_ids_cannot_be_computed_from_the_name() {
    let app = App::start("keyed", &[]);
    let a = gate(&app, "POST", "leader?window=30&holder=node-a", &[AUTH]);
    assert_eq!(a.status, 200, "{}", a.text);
    let id = a.json["leaseId"].as_str().unwrap().to_string();
    // What an unkeyed, name-based id would be (a UUIDv5 of holder and key).
    let ns = uuid::Uuid::from_u128(0x6c1e_4a8d_92b3_5f0e_8a47_1d2c_3b4a_5e6f);
    let guess = uuid::Uuid::new_v5(&ns, b"node-a\0leader").to_string();
    assert_ne!(guess, id);
    let attempt = [AUTH, ("lease-id", guess.as_str())];
    assert_eq!(gate(&app, "DELETE", "leader", &attempt).status, 204);
    assert_eq!(gate(&app, "GET", "leader", &[AUTH]).json["state"], "held");
    // The same holder name from another deployment (another secret) gets a fresh id of its
    // own, and here it is refused: the name selects nothing.
    let other = App::start(
        "keyed2",
        &[
            ("lease_id_secret", "a different secret"),
            ("container", app.container.as_str()),
        ],
    );
    let b = gate(&other, "POST", "leader2?window=30&holder=node-a", &[AUTH]);
    let c = gate(&app, "POST", "leader2?window=30&holder=node-a", &[AUTH]);
    assert_eq!(b.status, 200, "{}", b.text);
    assert_eq!(c.status, 429, "{}", c.text);
    assert_eq!(c.json["holder"], "node-a");
    assert_ne!(b.json["leaseId"], a.json["leaseId"]);
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

/// 25.8: the `lock_unusable` answer names the lock as the CLI takes it, and a command that
/// works (`tests/tests/cli/locks.rs` runs it).
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
