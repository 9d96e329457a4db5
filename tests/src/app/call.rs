//! Requests to a running app: one call and its answer read whole, and the bad requests that
//! must get clear 4xx errors.

use std::collections::HashMap;
use std::time::Duration;

use super::{App, TELEMETRY_AUTH};

/// An HTTP answer, read whole.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status.
    pub status: u16,
    /// Headers (names lowercased).
    pub headers: HashMap<String, String>,
    /// The body parsed as JSON (`Null` if empty or not JSON).
    pub json: serde_json::Value,
    /// The raw body.
    pub text: String,
}

/// Sends one request to the app.
pub fn call(method: &str, url: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut request = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(body.to_vec()).expect("request");
    let response = agent.run(request).expect("the app answers");
    let status = response.status().as_u16();
    let headers: HashMap<String, String> = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let text = response.into_body().read_to_string().unwrap_or_default();
    Answer {
        status,
        json: serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        headers,
        text,
    }
}

/// `POST /api/telemetry` with a JSON body and the test token.
pub fn post_telemetry(app: &App, body: &serde_json::Value) -> Answer {
    call(
        "POST",
        &app.url("/api/telemetry"),
        &[("content-type", "application/json"), TELEMETRY_AUTH],
        body.to_string().as_bytes(),
    )
}

/// One bad request and the 4xx it must get.
#[derive(Debug, Clone)]
pub struct BadCase {
    /// Method.
    pub method: &'static str,
    /// Path and query.
    pub path: String,
    /// Headers.
    pub headers: Vec<(&'static str, &'static str)>,
    /// Body.
    pub body: Vec<u8>,
    /// The status it must get.
    pub status: u16,
}

/// `method path` with `headers` and `body` must be answered `status`.
pub fn bad(
    method: &'static str,
    path: &str,
    headers: &[(&'static str, &'static str)],
    body: &[u8],
    status: u16,
) -> BadCase {
    BadCase {
        method,
        path: path.to_string(),
        headers: headers.to_vec(),
        body: body.to_vec(),
        status,
    }
}

/// Sends every case: each gets its status and a JSON error (`error`, or an Azure answer's
/// `ReturnValue.error`) holding none of `secrets`; afterwards no component trapped and no log
/// line holds a secret.
pub fn expect_clear_errors(app: &App, cases: &[BadCase], secrets: &[&str]) {
    for c in cases {
        let a = call(c.method, &app.url(&c.path), &c.headers, &c.body);
        assert_eq!(a.status, c.status, "{} {}: {}", c.method, c.path, a.text);
        let error = a.json["error"]
            .as_str()
            .or_else(|| a.json["ReturnValue"]["error"].as_str())
            .unwrap_or_else(|| panic!("{} {}: no JSON error: {}", c.method, c.path, a.text));
        assert!(!error.is_empty());
        for s in secrets {
            assert!(!a.text.contains(s), "{} {}: {}", c.method, c.path, a.text);
        }
    }
    app.assert_no_trap();
    for line in app.log_lines() {
        for s in secrets {
            assert!(!line.contains(s), "a log line holds a secret: {line}");
        }
    }
}
