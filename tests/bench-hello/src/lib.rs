//! The benchmark's references (`scripts/dev.sh bench`, docs/benchmarks.md), built and served
//! the way the app is:
//!
//! * `POST /api/telemetry`, the floor's: the hello world of spin-sdk 5.2, `#[http_component]`
//!   on a plain `Request -> Response` handler, that reads and parses the body device-alerts
//!   gets for a reading below the threshold (one `{"deviceId", "temperature"}` object, through
//!   serde) and answers a fixed JSON document. No variables, no key-value store, no log line,
//!   no bearer check: what any component pays.
//! * `POST /api/head/sdk` and `POST /api/head/wasi`, the throttle's: the same, plus one storage
//!   request sent as it is given (the variables `head_origin`, `head_path` and `head_headers`:
//!   a HEAD the bench signed), its answer's head read, through `spin_sdk::http::send` or
//!   straight through the `wasi:http` outgoing handler that it wraps. The least any spin-sdk
//!   component can do for a decision that asks storage once.
#![deny(missing_docs)]

/// The component (built for `wasm32` only).
#[cfg(target_arch = "wasm32")]
mod component {
    use serde::Deserialize;
    use spin_sdk::http::{Request, Response};

    /// The reading, as device-alerts reads it.
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)] // parsed, not used: the parse is what is measured
    struct Reading {
        device_id: String,
        temperature: f64,
    }

    const ANSWER: &str = r#"{"decisions":[{"decision":"below_threshold"}]}"#;
    const NOT_A_READING: &str = r#"{"error":"invalid_reading","message":"the body is not a {\"deviceId\", \"temperature\"} reading"}"#;
    const NO_SUCH_ROUTE: &str = r#"{"error":"not_found","message":"the routes are /api/telemetry, /api/head/sdk and /api/head/wasi"}"#;

    #[spin_sdk::http_component]
    async fn handle(request: Request) -> Response {
        let parsed = serde_json::from_slice::<Reading>(request.body()).is_ok();
        let (status, body) = match (parsed, request.path()) {
            (false, _) => (400, NOT_A_READING.to_string()),
            (true, "/api/head/sdk") => head_answer(head_through_spin_sdk().await),
            (true, "/api/head/wasi") => head_answer(head_through_wasi()),
            (true, "/api/telemetry") => (200, ANSWER.to_string()),
            (true, _) => (404, NO_SUCH_ROUTE.to_string()),
        };
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(body)
            .build()
    }

    /// The answer to a HEAD route: the storage answer's status and how many headers it had.
    fn head_answer(answer: Option<(u16, usize)>) -> (u16, String) {
        match answer {
            Some((status, headers)) => (
                200,
                format!(r#"{{"storageStatus":{status},"storageHeaders":{headers}}}"#),
            ),
            None => (502, r#"{"error":"the storage request failed"}"#.to_string()),
        }
    }

    /// The HEAD the bench gave.
    struct Head {
        https: bool,
        authority: String,
        path: String,
        fields: Vec<(String, Vec<u8>)>,
    }

    fn head() -> Option<Head> {
        let origin = spin_sdk::variables::get("head_origin").ok()?;
        let path = spin_sdk::variables::get("head_path").ok()?;
        let lines = spin_sdk::variables::get("head_headers").ok()?;
        let (https, authority) = match origin.split_once("://")? {
            ("https", a) => (true, a.to_string()),
            (_, a) => (false, a.to_string()),
        };
        let fields = lines
            .lines()
            .filter_map(|l| l.split_once(": "))
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        Some(Head {
            https,
            authority,
            path,
            fields,
        })
    }

    /// The HEAD through spin-sdk's `send`. It and [`head_through_wasi`] build the same request
    /// alike on purpose, each with its own crate's types: the two paths are what is compared.
    async fn head_through_spin_sdk() -> Option<(u16, usize)> {
        use spin_sdk::http::{Fields, IncomingResponse, Method, OutgoingRequest, Scheme};
        let Head {
            https,
            authority,
            path,
            fields,
        } = head()?;
        let request = OutgoingRequest::new(Fields::from_list(&fields).ok()?);
        request.set_method(&Method::Head).ok()?;
        let scheme = if https { Scheme::Https } else { Scheme::Http };
        request.set_scheme(Some(&scheme)).ok()?;
        request.set_authority(Some(&authority)).ok()?;
        request.set_path_with_query(Some(&path)).ok()?;
        let response: IncomingResponse = spin_sdk::http::send(request).await.ok()?;
        Some((response.status(), response.headers().entries().len()))
    }

    /// The HEAD straight through the `wasi` crate's outgoing handler, waiting on its pollable.
    fn head_through_wasi() -> Option<(u16, usize)> {
        use wasi::http::outgoing_handler;
        use wasi::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
        let Head {
            https,
            authority,
            path,
            fields,
        } = head()?;
        let request = OutgoingRequest::new(Fields::from_list(&fields).ok()?);
        request.set_method(&Method::Head).ok()?;
        let scheme = if https { Scheme::Https } else { Scheme::Http };
        request.set_scheme(Some(&scheme)).ok()?;
        request.set_authority(Some(&authority)).ok()?;
        request.set_path_with_query(Some(&path)).ok()?;
        let body = request.body().ok()?;
        OutgoingBody::finish(body, None).ok()?;
        let pending = outgoing_handler::handle(request, None).ok()?;
        pending.subscribe().block();
        let response = pending.get()?.ok()?.ok()?;
        Some((response.status(), response.headers().entries().len()))
    }
}
