//! The gate API and bad input to both functions, as `.wasm` served by the wasmtime host.

use std::time::Duration;

use leasegate_host::Fault;
use leasegate_tests::app::{call, post_telemetry, Answer, App, GATE_TOKEN};
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
    // Held: 429 with Retry-After.
    let busy = gate(&app, "POST", "jobs%2Fnightly?window=30", &[AUTH]);
    assert_eq!(busy.status, 429, "{}", busy.text);
    assert_eq!(
        busy.json,
        json!({"acquired": false, "key": "jobs/nightly", "retryAfterSeconds": 30})
    );
    assert_eq!(busy.headers["retry-after"], "30");
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
        let a2 = gate(
            &app,
            "POST",
            &format!("{key}?window={window}&holder=node-a"),
            &[AUTH],
        );
        assert_eq!(a2.status, 200, "holder re-acquire extends: {}", a2.text);
        assert_eq!(a1.json["leaseId"], a2.json["leaseId"]);
        let b = gate(
            &app,
            "POST",
            &format!("{key}?window={window}&holder=node-b"),
            &[AUTH],
        );
        assert_eq!(b.status, 429, "{}", b.text);
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
    ] {
        let a = gate(&app, "POST", "k", &headers);
        assert_eq!(a.status, 401, "{headers:?}: {}", a.text);
        assert_eq!(a.json["error"], "unauthorized");
        assert_eq!(a.headers["www-authenticate"], "Bearer");
        assert!(!a.text.contains(GATE_TOKEN));
    }
    // Nothing was taken by the refused calls.
    assert_eq!(gate(&app, "POST", "k", &[AUTH]).status, 200);
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
        app.host.set_fault(&app.storage, Some(fault.clone()));
        for method in ["POST", "GET"] {
            let a = gate(&app, method, "faulty", &[AUTH]);
            assert_eq!(a.status, 503, "{fault:?} {method}: {}", a.text);
            assert_eq!(a.json["error"], "storage_unavailable");
        }
    }
    app.host.set_fault(&app.storage, None);
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
    let long_id = "d".repeat(300);
    let big = vec![b' '; (1 << 20) + 1];
    let many = json!(vec![json!({"deviceId": "d", "temperature": 1}); 1001]).to_string();
    let mut cases: Vec<Case> = vec![
        case("GET", "/api/telemetry", vec![], vec![], 405),
        case("PUT", "/api/telemetry", vec![json_ct], b"{}".to_vec(), 405),
        case(
            "POST",
            "/api/telemetry",
            vec![],
            b"{\"deviceId\":\"d\",\"temperature\":40}".to_vec(),
            415,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![("content-type", "text/plain")],
            b"hello".to_vec(),
            415,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct],
            b"{not json".to_vec(),
            400,
        ),
        case("POST", "/api/telemetry", vec![json_ct], b"".to_vec(), 400),
        case("POST", "/api/telemetry", vec![json_ct], b"42".to_vec(), 400),
        case("POST", "/api/telemetry", vec![json_ct], b"[]".to_vec(), 400),
        case("POST", "/api/telemetry", vec![json_ct], b"{}".to_vec(), 400),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct],
            b"{\"deviceId\":7,\"temperature\":40}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct],
            b"{\"deviceId\":\"d\",\"temperature\":\"hot\"}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct],
            b"{\"deviceId\":\"d\"}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct],
            b"{\"deviceId\":\"../../x\",\"temperature\":40}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct],
            b"{\"deviceId\":\"a\\u0000b\",\"temperature\":40}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct],
            format!("{{\"deviceId\":\"{long_id}\",\"temperature\":40}}").into_bytes(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct],
            b"{\"deviceId\":\"d\",\"temperature\":40,\"timestamp\":\"noon\"}".to_vec(),
            400,
        ),
        case(
            "POST",
            "/api/telemetry",
            vec![json_ct],
            many.into_bytes(),
            413,
        ),
        case("POST", "/api/telemetry", vec![json_ct], big, 413),
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
    assert!(app.host.wait_idle(Duration::from_secs(30)));
    for r in app.host.records() {
        assert!(r.status < 500, "{} {} -> {}", r.method, r.path, r.status);
        for line in &r.output {
            assert!(
                !line.contains(GATE_TOKEN) && !line.contains(leasegate::account::DEV_ACCOUNT_KEY),
                "{line}"
            );
        }
    }
}

#[test]
fn outbound_hosts_outside_the_manifest_are_denied() {
    // The connection string points at Azurite, but allowed_outbound_hosts (from storage_origin)
    // names another origin: the host refuses the request, as Spin would, and the gate says so.
    let azurite = leasegate_tests::Azurite::shared();
    let app = App::start(
        "denied",
        &[
            ("storage_connection_string", &azurite.connection_string()),
            ("storage_origin", "http://127.0.0.1:9"),
        ],
    );
    let a = gate(&app, "POST", "k", &[AUTH]);
    assert_eq!(a.status, 503, "{}", a.text);
    assert!(
        a.json["message"]
            .as_str()
            .unwrap()
            .contains("allowed_outbound_hosts"),
        "{}",
        a.text
    );
    assert!(!a.text.contains(leasegate::account::DEV_ACCOUNT_KEY));
    assert_eq!(app.record_of(&a).outbound.len(), 0);
}
