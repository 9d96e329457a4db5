//! The gate's contract: one holder per window, holders extending their own gate with rising tokens,
//! its tokens, mixed windows, a corrupt blob, storage faults.

use super::*;

#[test]
fn gate_contract() {
    let app = App::start("gate", &[]);
    // Acquire with a 30 s window (a native lease).
    let a = gate(&app, "POST", "jobs%2Fnightly?window=30", &[AUTH]);
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["acquired"], true);
    assert_eq!(a.json["key"], "jobs/nightly");
    let lease_id = a.json["leaseId"].as_str().unwrap().to_string();
    let token1 = a.json["fencingToken"].as_u64().unwrap();
    assert!(a.json["expiresAt"].as_str().unwrap().ends_with('Z'));
    // Held: 429 with Retry-After, the holder's time left by the server's clock.
    let busy = gate(&app, "POST", "jobs%2Fnightly?window=45", &[AUTH]);
    assert_eq!(busy.status, 429, "{}", busy.text);
    assert_eq!(busy.json["acquired"], false);
    assert_eq!(busy.json["key"], "jobs/nightly");
    let left = busy.json["retryAfterSeconds"].as_u64().unwrap();
    assert!(
        (28..=30).contains(&left),
        "{left}: the holder's 30 s, not the caller's 45 s"
    );
    assert_eq!(busy.headers["retry-after"], left.to_string());
    let state = gate(&app, "GET", "jobs%2Fnightly", &[AUTH]);
    assert_eq!(state.status, 200);
    assert_eq!(state.json["state"], "held");
    assert_eq!(state.json["fencingToken"], token1);
    // Release: 204, and 204 again on retry; then it is available and can be taken again.
    let lease_header = [AUTH, ("lease-id", lease_id.as_str())];
    assert_eq!(
        gate(&app, "DELETE", "jobs%2Fnightly", &lease_header).status,
        204
    );
    assert_eq!(
        gate(&app, "DELETE", "jobs%2Fnightly", &lease_header).status,
        204
    );
    assert_eq!(
        gate(&app, "GET", "jobs%2Fnightly", &[AUTH]).json["state"],
        "available"
    );
    let again = gate(&app, "POST", "jobs%2Fnightly?window=30", &[AUTH]);
    assert_eq!(again.status, 200);
    assert!(again.json["fencingToken"].as_u64().unwrap() > token1);
}

#[test]
fn holders_extend_their_own_gate_and_tokens_increase() {
    let app = App::start("holder", &[]);
    for window in ["20", "120"] {
        let key = format!("leader-{window}");
        let a1 = gate(
            &app,
            "POST",
            &format!("{key}?window={window}&holder=node-a"),
            &[AUTH],
        );
        assert_eq!(a1.status, 200, "{}", a1.text);
        assert_eq!(a1.json["extended"], false);
        let id = a1.json["leaseId"].as_str().unwrap().to_string();
        // The holder's name selects no id: the same name without the lease id is refused,
        // shown the holder it names.
        let same_name = gate(
            &app,
            "POST",
            &format!("{key}?window={window}&holder=node-a"),
            &[AUTH],
        );
        assert_eq!(same_name.status, 429, "{}", same_name.text);
        assert_eq!(same_name.json["holder"], "node-a");
        assert!(
            same_name.json.get("leaseId").is_none(),
            "{}",
            same_name.text
        );
        // The holder extends with the id its first POST returned.
        let a2 = gate(
            &app,
            "POST",
            &format!("{key}?window={window}&holder=node-a"),
            &[AUTH, ("lease-id", id.as_str())],
        );
        assert_eq!(a2.status, 200, "holder re-acquire extends: {}", a2.text);
        assert_eq!(a1.json["leaseId"], a2.json["leaseId"]);
        assert_eq!(a2.json["extended"], true);
        assert_eq!(
            a1.json["fencingToken"], a2.json["fencingToken"],
            "a term stays"
        );
        assert_eq!(a1.json["since"], a2.json["since"]);
        let b = gate(
            &app,
            "POST",
            &format!("{key}?window={window}&holder=node-b"),
            &[AUTH],
        );
        assert_eq!(b.status, 429, "{}", b.text);
        assert_eq!(b.json["holder"], "node-a");
        assert_eq!(gate(&app, "GET", &key, &[AUTH]).json["holder"], "node-a");
        if window == "120" {
            // Records know how long is left.
            let left = b.json["retryAfterSeconds"].as_u64().unwrap();
            assert!((110..=120).contains(&left), "{left}");
            assert_eq!(
                gate(&app, "GET", &key, &[AUTH]).json["expiresAt"],
                a2.json["expiresAt"]
            );
        }
        // node-a hands over; node-b gets a larger token.
        let release = [AUTH, ("lease-id", a2.json["leaseId"].as_str().unwrap())];
        assert_eq!(gate(&app, "DELETE", &key, &release).status, 204);
        let b2 = gate(
            &app,
            "POST",
            &format!("{key}?window={window}&holder=node-b"),
            &[AUTH],
        );
        assert_eq!(b2.status, 200, "{}", b2.text);
        assert!(b2.json["fencingToken"].as_u64() > a2.json["fencingToken"].as_u64());
    }
}

#[test]
fn gate_needs_its_token() {
    let app = App::start("auth", &[]);
    for headers in [
        vec![],
        vec![("authorization", "Bearer wrong")],
        vec![("authorization", "Basic dGVzdA==")],
        vec![("authorization", "Bearer ")],
        vec![("authorization", "test-gate-token-7f3a")],
    ] {
        let a = gate(&app, "POST", "k", &headers);
        assert_eq!(a.status, 401, "{headers:?}: {}", a.text);
        assert_eq!(a.json["error"], "unauthorized");
        assert_eq!(a.headers["www-authenticate"], "Bearer");
        assert!(!a.text.contains(GATE_TOKEN));
    }
    // Nothing was taken by the refused calls. The scheme is case-insensitive.
    assert_eq!(gate(&app, "POST", "k", &[AUTH]).status, 200);
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        let header = format!("{scheme} {GATE_TOKEN}");
        let a = gate(&app, "GET", "k", &[("authorization", header.as_str())]);
        assert_eq!(a.status, 200, "{scheme}: {}", a.text);
    }
}

/// Authentication comes before any other setting is read: an unauthenticated caller of a
/// misconfigured app learns nothing of the setup.
#[test]
fn authentication_comes_before_configuration() {
    let app = App::start(
        "authfirst",
        &[
            ("storage_key", "not base64!"),
            ("container", "Not_A_Container"),
        ],
    );
    let a = gate(&app, "POST", "k", &[]);
    assert_eq!(a.status, 401, "{}", a.text);
    let t = call(
        "POST",
        &app.url("/api/telemetry"),
        &[("content-type", "application/json")],
        b"{}",
    );
    assert_eq!(t.status, 401, "{}", t.text);
    for text in [&a.text, &t.text] {
        assert!(
            !text.contains("storage_key") && !text.contains("container"),
            "{text}"
        );
    }
    // Authenticated, they learn what is wrong.
    let a = gate(&app, "POST", "k", &[AUTH]);
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "not_configured");
}

#[test]
fn telemetry_needs_its_token() {
    let app = App::start("telauth", &[]);
    let body = json!({"deviceId": "t-1", "temperature": 10}).to_string();
    let post = |headers: &[(&str, &str)]| {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        call("POST", &app.url("/api/telemetry"), &all, body.as_bytes())
    };
    for headers in [
        vec![],
        vec![("authorization", "Bearer wrong")],
        vec![("authorization", GATE_TOKEN)],
        vec![("authorization", "Basic dGVzdA==")],
        vec![("authorization", "Bearer test-gate-token-7f3a")],
    ] {
        let a = post(&headers);
        assert_eq!(a.status, 401, "{headers:?}: {}", a.text);
        assert_eq!(a.json["error"], "unauthorized");
        assert_eq!(a.headers["www-authenticate"], "Bearer");
        assert!(!a.text.contains(TELEMETRY_TOKEN));
    }
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let header = format!("{scheme} {TELEMETRY_TOKEN}");
        let a = post(&[("authorization", header.as_str())]);
        assert_eq!(a.status, 200, "{scheme}: {}", a.text);
    }
    // No token configured: refuses to serve, unless switched off on purpose.
    let closed = App::start("telnotoken", &[("telemetry_token", "")]);
    let a = call(
        "POST",
        &closed.url("/api/telemetry"),
        &[("content-type", "application/json")],
        body.as_bytes(),
    );
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "not_configured");
    assert!(a.json["message"]
        .as_str()
        .unwrap()
        .contains("telemetry_token is empty"));
    let open = App::start(
        "teloff",
        &[("telemetry_token", ""), ("telemetry_auth", "none")],
    );
    let a = call(
        "POST",
        &open.url("/api/telemetry"),
        &[("content-type", "application/json")],
        body.as_bytes(),
    );
    assert_eq!(a.status, 200, "{}", a.text);
}

/// A gate taken with one window holds against callers with any other window: native leases
/// and lease records share the key. Sequential, then 64 callers racing on a fresh key.
#[test]
fn mixed_windows_share_one_gate() {
    let app = App::start("mixedgate", &[]);
    for (first, second) in [(600, 30), (30, 600), (5, 45)] {
        let key = format!("job-{first}-{second}");
        let a = gate(&app, "POST", &format!("{key}?window={first}"), &[AUTH]);
        assert_eq!(a.status, 200, "{}", a.text);
        let b = gate(&app, "POST", &format!("{key}?window={second}"), &[AUTH]);
        assert_eq!(b.status, 429, "{first} then {second}: {}", b.text);
        // A release frees it whichever way it is held.
        let release = [AUTH, ("lease-id", a.json["leaseId"].as_str().unwrap())];
        assert_eq!(gate(&app, "DELETE", &key, &release).status, 204);
        let c = gate(&app, "POST", &format!("{key}?window={second}"), &[AUTH]);
        assert_eq!(c.status, 200, "{}", c.text);
        assert!(c.json["fencingToken"].as_u64() > a.json["fencingToken"].as_u64());
    }
    let url = app.url("/api/gate/first-use");
    let start = std::sync::Arc::new(std::sync::Barrier::new(64));
    let answers: Vec<Answer> = (0..64)
        .map(|i| {
            let (url, start) = (url.clone(), start.clone());
            std::thread::spawn(move || {
                let window = [30, 600, 2, 60][i % 4];
                start.wait();
                call("POST", &format!("{url}?window={window}"), &[AUTH], b"")
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        63,
        "{statuses:?}"
    );
}

/// A gate whose lock blob holds garbage answers a clear 503 naming the field, never a 500.
#[test]
fn a_corrupt_gate_blob_is_a_clear_error() {
    let app = App::start("corrupt", &[]);
    let a = gate(&app, "POST", "bad?window=30", &[AUTH]);
    assert_eq!(a.status, 200, "{}", a.text);
    let release = [AUTH, ("lease-id", a.json["leaseId"].as_str().unwrap())];
    assert_eq!(gate(&app, "DELETE", "bad", &release).status, 204);
    let locks = leasegate::lease::Locks::new(
        leasegate_cli::NativeTransport::default(),
        leasegate_tests::Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix("gates/");
    let blob = locks
        .blob_name(&leasegate::LockName::try_new("bad").unwrap())
        .unwrap();
    let mut metadata = leasegate::ops::Metadata::new();
    metadata.insert("leasegate_token".into(), "18446744073709551615".into());
    leasegate_cli::block_on(locks.client().execute(
        &leasegate::ops::SetMetadata {
            container: app.container.clone(),
            blob,
            metadata,
            lease_id: None,
            condition: leasegate::ops::Condition::None,
        },
        std::time::SystemTime::now(),
    ))
    .unwrap();
    for method in ["POST", "GET"] {
        let a = gate(&app, method, "bad", &[AUTH]);
        assert_eq!(a.status, 503, "{method}: {}", a.text);
        assert_eq!(a.json["error"], "lock_unusable", "{method}: {}", a.text);
        assert!(a.json["message"]
            .as_str()
            .unwrap()
            .contains("leasegate_token"));
    }
}

#[test]
fn an_empty_token_refuses_to_serve_unless_auth_is_off() {
    let app = App::start("notoken", &[("gate_token", "")]);
    let a = gate(&app, "POST", "k", &[]);
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "not_configured");
    assert!(a.json["message"]
        .as_str()
        .unwrap()
        .contains("gate_token is empty"));
    let open = App::start("authoff", &[("gate_token", ""), ("gate_auth", "none")]);
    assert_eq!(gate(&open, "POST", "k", &[]).status, 200);
}

#[test]
fn gate_storage_faults_are_503() {
    let app = App::start("gatefault", &[("storage_timeout_ms", "1000")]);
    for fault in [
        Fault::Refuse,
        Fault::Status(503),
        Fault::Delay(Duration::from_secs(3)),
    ] {
        app.storage.set_fault(Some(fault.clone()));
        for method in ["POST", "GET"] {
            let a = gate(&app, method, "faulty", &[AUTH]);
            assert_eq!(a.status, 503, "{fault:?} {method}: {}", a.text);
            assert_eq!(a.json["error"], "storage_unavailable");
        }
    }
    app.storage.set_fault(None);
    assert_eq!(gate(&app, "POST", "faulty", &[AUTH]).status, 200);
}
