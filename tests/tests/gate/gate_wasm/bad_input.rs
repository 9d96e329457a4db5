//! Bad input gets a clear 4xx; the documented storage setups work, a misplaced connection string is
//! explained.

use super::*;

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
        assert!(!a.text.contains(GATE_TOKEN) && !a.text.contains(leasegate::DEV_ACCOUNT_KEY));
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
            !line.contains(GATE_TOKEN) && !line.contains(leasegate::DEV_ACCOUNT_KEY),
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
    assert!(!a.text.contains(leasegate::DEV_ACCOUNT_KEY));
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
