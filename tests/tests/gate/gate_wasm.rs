//! The gate API and bad input to both functions, as `.wasm` served by the real `spin up`: the
//! gate key from the request's own path (never a client's `spin-path-info`), lease ids (never
//! revealed by a holder name, never computed from it, never shared with the leader's, derived
//! only with `lease_id_secret`), format characters kept out of keys and device ids, and a
//! `lock_unusable` answer naming a command that works.

use std::time::Duration;

use leasegate::lease::Locks;
use leasegate::ops::{GetProperties, Metadata, SetMetadata};
use leasegate::LockName;
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{
    call, post_telemetry, Answer, App, GATE_TOKEN, TELEMETRY_AUTH, TELEMETRY_TOKEN, TIMER_AUTH,
};
use leasegate_tests::proxy::{Fault, Proxy};
use leasegate_tests::Azurite;
use serde_json::{json, Value};

const AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

fn gate(app: &App, method: &str, path_and_query: &str, headers: &[(&str, &str)]) -> Answer {
    call(
        method,
        &app.url(&format!("/api/gate/{path_and_query}")),
        headers,
        b"",
    )
}

/// The metadata of the lock blob of `lock` under `prefix`, read straight from Azurite.
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

/// One bad-input request and the status it must get.
struct Case {
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, &'static str)>,
    body: Vec<u8>,
    status: u16,
}

fn case(
    method: &'static str,
    path: &str,
    headers: Vec<(&'static str, &'static str)>,
    body: Vec<u8>,
    status: u16,
) -> Case {
    Case {
        method,
        path: path.to_string(),
        headers,
        body,
        status,
    }
}

/// Bad input to both functions: each answers a clear 4xx JSON error, never a 5xx, and no
/// answer or log line holds a secret.
#[test]
fn bad_input_gets_clear_4xx_errors() {
    let app = App::start("badinput", &[]);
    let json_ct = ("content-type", "application/json");
    let tel = TELEMETRY_AUTH;
    let long_id = "d".repeat(300);
    let big = vec![b' '; (1 << 20) + 1];
    let many = json!(vec![json!({"deviceId": "d", "temperature": 1}); 1001]).to_string();
    let mut cases: Vec<Case> = vec![
        case("GET", "/api/telemetry", vec![tel], vec![], 405),
        case(
            "PUT",
            "/api/telemetry",
            vec![json_ct, tel],
            b"{}".to_vec(),
            405,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![tel],
            b"{\"deviceId\":\"d\",\"temperature\":40}".to_vec(),
            415,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![("content-type", "text/plain"), tel],
            b"hello".to_vec(),
            415,
        ),
        case("POST", "/api/telemetry", vec![json_ct], b"{}".to_vec(), 401),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            b"{not json".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            b"".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            b"42".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            b"[]".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            b"{}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            b"{\"deviceId\":7,\"temperature\":40}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            b"{\"deviceId\":\"d\",\"temperature\":\"hot\"}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            b"{\"deviceId\":\"d\"}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            b"{\"deviceId\":\"../../x\",\"temperature\":40}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            b"{\"deviceId\":\"a\\u0000b\",\"temperature\":40}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            format!("{{\"deviceId\":\"{long_id}\",\"temperature\":40}}").into_bytes(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            b"{\"deviceId\":\"d\",\"temperature\":40,\"timestamp\":\"noon\"}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct, tel],
            many.into_bytes(),
            413,
        ),
        case("POST", "/api/telemetry", vec![json_ct, tel], big, 413),
        case("PUT", "/api/gate/k", vec![AUTH], Vec::new(), 405),
        case("POST", "/api/gate/", vec![AUTH], Vec::new(), 400),
        case("POST", "/api/gate/%2E%2E", vec![AUTH], Vec::new(), 400),
        case("POST", "/api/gate/a%2F..%2Fb", vec![AUTH], Vec::new(), 400),
        case("POST", "/api/gate/%FF%FE", vec![AUTH], Vec::new(), 400),
        case("POST", "/api/gate/a%0Ab", vec![AUTH], Vec::new(), 400),
        case("POST", "/api/gate/k?window=0", vec![AUTH], Vec::new(), 400),
        case(
            "POST",
            "/api/gate/k?window=86401",
            vec![AUTH],
            Vec::new(),
            400,
        ),
        case(
            "POST",
            "/api/gate/k?window=soon",
            vec![AUTH],
            Vec::new(),
            400,
        ),
        case(
            "POST",
            "/api/gate/k?colour=red",
            vec![AUTH],
            Vec::new(),
            400,
        ),
        case("POST", "/api/gate/k?holder=", vec![AUTH], Vec::new(), 400),
        case(
            "POST",
            "/api/gate/k?holder=n%C5%93ud",
            vec![AUTH],
            Vec::new(),
            400,
        ),
        case("DELETE", "/api/gate/k", vec![AUTH], Vec::new(), 400),
        case(
            "DELETE",
            "/api/gate/k",
            vec![AUTH, ("lease-id", "not-a-guid")],
            Vec::new(),
            400,
        ),
    ];
    let long_key = format!("/api/gate/{}", "k".repeat(300));
    cases.push(case("POST", &long_key, vec![AUTH], Vec::new(), 400));
    assert!(cases.len() >= 30);
    for Case {
        method,
        path,
        headers,
        body,
        status: want,
    } in &cases
    {
        let a = call(method, &app.url(path), headers, body);
        assert_eq!(a.status, *want, "{method} {path}: {}", a.text);
        let error = a.json["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path}: no JSON error: {}", a.text));
        let message = a.json["message"].as_str().unwrap_or("");
        assert!(
            !error.is_empty() && !message.is_empty(),
            "{method} {path}: {}",
            a.text
        );
        assert!(
            !a.text.contains(GATE_TOKEN) && !a.text.contains(leasegate::account::DEV_ACCOUNT_KEY)
        );
    }
    // A batch keeps its valid readings: the invalid ones get decisions, nothing is lost.
    let mixed = post_telemetry(
        &app,
        &json!([{"deviceId": "ok-1", "temperature": 50}, {"deviceId": 5}, "x"]),
    );
    assert_eq!(mixed.status, 200, "{}", mixed.text);
    let d: &Vec<Value> = mixed.json["decisions"].as_array().unwrap();
    assert_eq!(d[0]["decision"], "notified");
    assert_eq!(d[1]["decision"], "invalid");
    assert_eq!(d[1]["reason"], "deviceId must be a string");
    assert_eq!(d[2]["reason"], "a reading must be a JSON object");
    // No answer was a 5xx and no log line holds a secret.
    app.assert_no_trap();
    for line in app.log_lines() {
        assert!(
            !line.contains(GATE_TOKEN) && !line.contains(leasegate::account::DEV_ACCOUNT_KEY),
            "{line}"
        );
    }
}

/// A connection string whose blob endpoint is not `storage_origin` (the only origin Spin lets
/// the component reach) is refused with a message that says what to set, before any request.
#[test]
fn a_connection_string_elsewhere_than_storage_origin_is_explained() {
    let azurite = leasegate_tests::Azurite::shared();
    let app = App::start(
        "denied",
        &[
            ("storage_connection_string", &azurite.connection_string()),
            ("storage_origin", "http://127.0.0.1:9"),
        ],
    );
    let (a, requests) = app.storage_requests(|| gate(&app, "POST", "k", &[AUTH]));
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "not_configured");
    let want = format!("storage_origin=http://127.0.0.1:{}", azurite.port());
    assert!(
        a.json["message"].as_str().unwrap().contains(&want),
        "{}",
        a.text
    );
    assert!(!a.text.contains(leasegate::account::DEV_ACCOUNT_KEY));
    assert_eq!(requests, 0);
}

/// The README's storage setups work as written: a SAS given as `storage_sas` (with
/// `storage_key` left at its default) is what signs the requests; a connection string with a
/// key, and one with a SAS, work.
#[test]
fn the_documented_storage_setups_work() {
    let azurite = leasegate_tests::Azurite::shared();
    // The app reaches Azurite through this proxy, which records how each request was signed.
    let proxy = Proxy::start(&format!("127.0.0.1:{}", azurite.port()));
    let origin = proxy.origin();
    // A SAS can reach blobs but not create containers: create it first.
    let container = leasegate_tests::unique_container("sas");
    let account = azurite.account();
    leasegate_cli::block_on(
        leasegate::lease::Locks::new(
            leasegate_cli::NativeTransport::default(),
            account.clone(),
            container.clone(),
        )
        .client()
        .execute(
            &leasegate::ops::CreateContainer {
                container: container.clone(),
            },
            std::time::SystemTime::now(),
        ),
    )
    .unwrap();
    let sas = leasegate_tests::container_sas(&container);
    let endpoint = format!("{origin}/devstoreaccount1");
    let connection_string = azurite
        .connection_string()
        .replace(&azurite.endpoint(), &endpoint);
    // (name, variables, how the requests must be signed)
    type Setup<'a> = (&'a str, Vec<(&'a str, String)>, &'a str);
    let setups: Vec<Setup> = vec![
        ("storage_sas", vec![("storage_sas", sas.clone())], "SAS"),
        (
            "connection string with a key",
            vec![("storage_connection_string", connection_string.clone())],
            "SharedKey",
        ),
        (
            "connection string with a SAS",
            vec![(
                "storage_connection_string",
                format!("BlobEndpoint={endpoint};SharedAccessSignature={sas}"),
            )],
            "SAS",
        ),
    ];
    for (name, vars, auth) in setups {
        let mut overrides: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        overrides.push(("container", container.as_str()));
        overrides.push(("storage_origin", origin.as_str()));
        let app = App::start("setup", &overrides);
        let key = format!("setup-{}", name.replace(' ', "-"));
        let (a, requests) =
            proxy.during(|| gate(&app, "POST", &format!("{key}?window=30"), &[AUTH]));
        assert_eq!(a.status, 200, "{name}: {}", a.text);
        let t = post_telemetry(&app, &json!({"deviceId": key, "temperature": 99}));
        assert_eq!(t.status, 200, "{name}: {}", t.text);
        assert_eq!(
            t.json["decisions"][0]["decision"], "notified",
            "{name}: {}",
            t.text
        );
        assert!(!requests.is_empty());
        assert!(
            requests.iter().all(|o| o.auth == auth),
            "{name}: {requests:?}"
        );
        assert!(!a.text.contains(&sas) && !t.text.contains(&sas));
    }
}

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
