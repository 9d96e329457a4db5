//! The benchmark's reference for the floor (`scripts/dev.sh bench`, docs/benchmarks.md): the
//! hello world of spin-sdk 5.2, `#[http_component]` on a plain `Request -> Response` handler,
//! that reads and parses the body device-alerts gets for a reading below the threshold (one
//! `{"deviceId", "temperature"}` object, through serde) and answers a fixed JSON document. No
//! variables, no key-value store, no log line, no bearer check: what any component pays.
#![deny(missing_docs)]

/// The component (built for `wasm32` only).
#[cfg(target_arch = "wasm32")]
mod component {
    use serde::Deserialize;

    /// The reading, as device-alerts reads it.
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)] // parsed, not used: the parse is what is measured
    struct Reading {
        device_id: String,
        temperature: f64,
    }

    const ANSWER: &str = r#"{"decisions":[{"decision":"below_threshold"}]}"#;

    #[spin_sdk::http_component]
    fn handle(request: spin_sdk::http::Request) -> spin_sdk::http::Response {
        let status = match serde_json::from_slice::<Reading>(request.body()) {
            Ok(_) => 200,
            Err(_) => 400,
        };
        spin_sdk::http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(ANSWER)
            .build()
    }
}
