//! `POST /api/telemetry`: at most one alert per device per window.
//!
//! The handler is four steps, one function each:
//! 1. [`parse`]: authenticate (`Authorization: Bearer <telemetry_token>`, before any other
//!    setting is read), check the request, read the settings and the readings.
//! 2. [`gate`](fn@gate): each device of the batch once, with its hottest reading at or above the
//!    threshold, takes its gate: a lease on `alerts/{deviceId}` for `alert_window_seconds`,
//!    with a fresh lease id per event (so two readings never both win).
//! 3. `notify` (in `gate.rs`): a device that won its gate posts the notification, with an idempotency key.
//! 4. [`answer`](fn@answer): one decision per reading.
//!
//! Steps 2 and 3 run per device as one pipeline, devices concurrently, at most `max_in_flight`
//! at once. Each device ends in an [`Outcome`](gate::Outcome), and every outcome that took a gate says what
//! became of it: kept on purpose (the alert went out, or may have) or given back.
//!
//! Failures stay per device: a device whose storage failed is answered `storage_unavailable`
//! (nothing sent for it) while the others of the batch are handled; the whole answer is then a
//! 503 so that clients retry, and a retry never repeats an alert: a device already notified is
//! throttled by its gate for the rest of its window.
#![deny(missing_docs)]
// Helpers return `Err(Response)`: the finished 4xx answer, once per request.
#![allow(clippy::result_large_err)]

use std::time::Instant;

use leasegate::{Request, Response, Transport};

use leasegate_spin::{web, Context};

/// The largest body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// The most readings in one batch.
pub const MAX_READINGS: usize = 1000;
/// Blob name prefix of the device gates.
pub const GATE_PREFIX: &str = "alerts/";

// The four steps' modules: the settings, the readings (step 1), the gate and the notification
// (steps 2 and 3), the answer (step 4).
mod answer;
mod gate;
mod readings;
mod settings;

use answer::answer;
use gate::gate;
use readings::{hot_devices, parse};

/// Handles `POST /api/telemetry`: the four steps.
pub async fn handle<T: Transport>(ctx: &Context<'_, T>, request: Request) -> Response {
    let started = Instant::now();
    let parsed = match parse(ctx.variables, &request) {
        Ok(p) => p,
        Err(response) => return response,
    };
    let hot = hot_devices(&parsed.readings, parsed.threshold);
    // No reading at or above the threshold: nothing to gate, no other setting read.
    let gated = if hot.is_empty() {
        Vec::new()
    } else {
        match gate(ctx, &parsed, &hot, started).await {
            Ok(gated) => gated,
            Err(response) => return response,
        }
    };
    // The jitter of a 503's Retry-After, drawn (two calls into Spin) only for such an answer.
    answer(&parsed, &gated, started, || {
        web::jitter_seed((ctx.new_lease_id)())
    })
}

// The Spin entry points.
#[cfg(target_arch = "wasm32")]
#[spin_sdk::http_component]
async fn handle_request(
    request: spin_sdk::http::IncomingRequest,
    out: spin_sdk::http::ResponseOutparam,
) {
    leasegate_spin::spin::serve(request, out, MAX_BODY_BYTES, handle).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::{alert_message, idempotency_key};
    use crate::readings::{parse_body, parse_reading};
    use leasegate::{LeaseId, StatusCode};
    use serde_json::{json, Value};
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::time::Duration;
    use std::time::SystemTime;

    /// Scripted storage and webhook: requests on `alerts/bad` fail with 500; the blob
    /// `alerts/good` exists, unleased; everything else succeeds. Records what was sent.
    struct Scripted {
        sent: RefCell<Vec<(String, String, Option<String>)>>,
    }

    impl Transport for Scripted {
        async fn send(&self, request: Request) -> Result<Response, leasegate::TransportError> {
            let action = request
                .headers()
                .get("x-ms-lease-action")
                .map(str::to_string);
            let path = request.path().to_string();
            self.sent.borrow_mut().push((
                request.method().to_string(),
                path.clone(),
                action.clone(),
            ));
            let r = |status: StatusCode| {
                Response::new(status).with_header("date", "Sat, 21 Nov 2026 14:00:00 GMT")
            };
            Ok(if path.ends_with("/alerts/bad") {
                r(StatusCode::INTERNAL_SERVER_ERROR).with_header("x-ms-error-code", "InternalError")
            } else if *request.method() == leasegate::Method::HEAD {
                r(StatusCode::OK)
                    .with_header("etag", "\"0x1\"")
                    .with_header("x-ms-lease-state", "available")
            } else if action.as_deref() == Some("acquire") {
                let id = request.headers().get("x-ms-proposed-lease-id").unwrap();
                r(StatusCode::CREATED).with_header("x-ms-lease-id", id)
            } else if action.is_some() || request.query() == Some("comp=metadata") {
                r(StatusCode::OK)
            } else {
                r(StatusCode::NO_CONTENT)
            })
        }
    }

    #[test]
    fn one_failing_device_does_not_hold_back_the_others() {
        let transport = Scripted {
            sent: RefCell::new(Vec::new()),
        };
        let vars: HashMap<String, String> = [
            ("storage_account", "devstoreaccount1"),
            ("storage_key", leasegate::DEV_ACCOUNT_KEY),
            ("storage_origin", "http://127.0.0.1:10000"),
            ("notify_url", "http://127.0.0.1:3001/notify"),
            ("telemetry_token", "t0ken"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let ctx = Context {
            connect: &|_| &transport,
            variables: &vars,
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_096_800),
            new_lease_id: &|| LeaseId::from_random_bytes([9; 16]),
            sleep: &|_| Box::pin(async {}),
            cache: &leasegate_spin::cache::NoCache,
            log_decisions: false,
        };
        let body = json!([
            {"deviceId": "good", "temperature": 40},
            {"deviceId": "bad", "temperature": 40}
        ]);
        let request = Request::new(leasegate::Method::POST, "/api/telemetry")
            .with_header("content-type", "application/json")
            .with_header("authorization", "Bearer t0ken")
            .with_body(body.to_string().into_bytes());
        let response = pollster::block_on(handle(&ctx, request));
        assert_eq!(response.status(), 503);
        let answer: Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(answer["error"], "storage_unavailable");
        assert_eq!(answer["storageErrorCode"], "InternalError");
        assert_eq!(answer["decisions"][0]["decision"], "notified", "{answer}");
        assert_eq!(answer["decisions"][1]["decision"], "storage_unavailable");
        let sent = transport.sent.borrow();
        // The good device's alert went out, and its gate was kept (no release).
        assert_eq!(
            sent.iter().filter(|(_, path, _)| path == "/notify").count(),
            1,
            "{sent:?}"
        );
        assert!(
            !sent
                .iter()
                .any(|(_, _, action)| action.as_deref() == Some("release")),
            "{sent:?}"
        );
    }

    /// Storage that notes each request in a log the cache below writes to as well.
    struct Noted<'a> {
        inner: Scripted,
        log: &'a RefCell<Vec<&'static str>>,
    }

    impl Transport for Noted<'_> {
        async fn send(&self, request: Request) -> Result<Response, leasegate::TransportError> {
            self.log.borrow_mut().push("send");
            self.inner.send(request).await
        }
    }

    /// A cache that misses, noting each read of a gate entry ("get") or of the clock entry
    /// ("clock").
    struct NotedCache<'a>(&'a RefCell<Vec<&'static str>>);

    impl leasegate_spin::cache::Cache for NotedCache<'_> {
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, leasegate_spin::cache::Unavailable> {
            let kind = if key.starts_with("leasegate:clock:") {
                "clock"
            } else {
                "get"
            };
            self.0.borrow_mut().push(kind);
            Ok(None)
        }
        fn set(&self, _key: &str, _value: &[u8]) -> Result<(), leasegate_spin::cache::Unavailable> {
            Ok(())
        }
        fn delete(&self, _key: &str) -> Result<(), leasegate_spin::cache::Unavailable> {
            Ok(())
        }
    }

    /// Every device's entry is read before any device is gated (after the store's clock entry),
    /// so that the invocation's time (`ctx.now`) is the time it is judged by, however long the
    /// batch takes.
    #[test]
    fn the_cache_is_read_for_every_device_before_storage_is_asked() {
        let log = RefCell::new(Vec::new());
        let transport = Noted {
            inner: Scripted {
                sent: RefCell::new(Vec::new()),
            },
            log: &log,
        };
        let cache = NotedCache(&log);
        let vars: HashMap<String, String> = [
            ("storage_account", "devstoreaccount1"),
            ("storage_key", leasegate::DEV_ACCOUNT_KEY),
            ("storage_origin", "http://127.0.0.1:10000"),
            ("notify_url", "http://127.0.0.1:3001/notify"),
            ("telemetry_token", "t0ken"),
            ("max_in_flight", "1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let ctx = Context {
            connect: &|_| &transport,
            variables: &vars,
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_096_800),
            new_lease_id: &|| LeaseId::from_random_bytes([9; 16]),
            sleep: &|_| Box::pin(async {}),
            cache: &cache,
            log_decisions: false,
        };
        let body = json!([
            {"deviceId": "a", "temperature": 40},
            {"deviceId": "b", "temperature": 40},
            {"deviceId": "c", "temperature": 40}
        ]);
        let request = Request::new(leasegate::Method::POST, "/api/telemetry")
            .with_header("content-type", "application/json")
            .with_header("authorization", "Bearer t0ken")
            .with_body(body.to_string().into_bytes());
        pollster::block_on(handle(&ctx, request));
        let log = log.borrow();
        let first_send = log.iter().position(|e| *e == "send").unwrap();
        assert_eq!(
            &log[..first_send],
            ["clock", "get", "get", "get"],
            "{log:?}"
        );
        assert!(!log[first_send..].contains(&"get"), "{log:?}");
    }

    #[test]
    fn idempotency_keys_are_per_device_and_tenure() {
        let a = LeaseId::from_random_bytes([1; 16]);
        let b = LeaseId::from_random_bytes([2; 16]);
        assert_eq!(idempotency_key("d", a), idempotency_key("d", a));
        assert_ne!(idempotency_key("d", a), idempotency_key("d", b));
        assert_ne!(idempotency_key("d", a), idempotency_key("e", a));
        assert_eq!(idempotency_key("d", a).len(), 32);
        assert!(!idempotency_key("d", a).contains(&a.to_string()));
    }

    #[test]
    fn readings_are_checked_field_by_field() {
        let cases = [
            (json!(5), "a reading must be a JSON object"),
            (json!({}), "deviceId is missing"),
            (
                json!({"deviceId": 7, "temperature": 1}),
                "deviceId must be a string",
            ),
            (
                json!({"deviceId": "", "temperature": 1}),
                "deviceId must not be empty",
            ),
            (
                json!({"deviceId": "../x", "temperature": 1}),
                "deviceId empty, '.' and '..' segments",
            ),
            (
                json!({"deviceId": "a\u{1}", "temperature": 1}),
                "deviceId control characters",
            ),
            (json!({"deviceId": "d"}), "temperature is missing"),
            (
                json!({"deviceId": "d", "temperature": "31"}),
                "temperature must be a number",
            ),
            (
                json!({"deviceId": "d", "temperature": 31, "timestamp": 5}),
                "timestamp must be a string",
            ),
            (
                json!({"deviceId": "d", "temperature": 31, "timestamp": "yesterday"}),
                "RFC 3339",
            ),
            (json!(["d", 31]), "a reading must be a JSON object"),
            (
                json!({"deviceId": null, "temperature": 31}),
                "deviceId is missing",
            ),
            (
                json!({"deviceId": "d", "temperature": null}),
                "temperature is missing",
            ),
        ];
        for (value, want) in cases {
            let err = parse_reading(&value).unwrap_err();
            assert!(err.contains(want), "{value}: {err}");
        }
        let ok = parse_reading(
            &json!({"deviceId": "d/1", "temperature": 31.5, "timestamp": "2026-11-21T14:00:00Z"}),
        )
        .unwrap();
        assert_eq!(ok.temperature, 31.5);
        assert_eq!(ok.timestamp.as_deref(), Some("2026-11-21T14:00:00Z"));
    }

    /// A device may send more than the function reads: the other fields are ignored.
    #[test]
    fn other_fields_of_a_reading_are_ignored() {
        let r = parse_reading(
            &json!({"humidity": 40, "deviceId": "d", "temperature": 31, "timestamp": null}),
        )
        .unwrap();
        assert_eq!((r.device_id.as_str(), r.temperature), ("d", 31.0));
        assert_eq!(r.timestamp, None);
    }

    #[test]
    fn each_hot_device_is_gated_once_with_its_hottest_reading() {
        let body = json!([
            {"deviceId": "b", "temperature": 31},
            {"deviceId": "a", "temperature": 29},
            {"deviceId": "b", "temperature": 35},
            {"deviceId": "c", "temperature": 12},
            {"deviceId": "a", "temperature": 30},
            {"deviceId": "b", "temperature": 35},
        ]);
        let readings = parse_body(body.to_string().as_bytes()).unwrap();
        let hot: Vec<(&str, usize)> = hot_devices(&readings, 30.0)
            .iter()
            .map(|d| (d.reading.device_id.as_str(), d.index))
            .collect();
        // In the order the devices first appear; the first of equal readings; at the
        // threshold is hot.
        assert_eq!(hot, [("b", 2), ("a", 4)]);
    }

    /// Numbers in the message are written the short way (`1e300`, not 301 digits), and a
    /// whole number without a fraction (`30`, as the docs show).
    #[test]
    fn alert_messages_write_numbers_short() {
        let readings = parse_body(br#"[{"deviceId": "d", "temperature": 1e300}]"#).unwrap();
        let reading = readings[0].as_ref().unwrap();
        let m = alert_message(reading, 30.0);
        // JSON's exponent form (`1e300` or `1e+300`, by serde_json's version).
        let shown = m
            .strip_prefix("device d reported ")
            .and_then(|m| m.strip_suffix(" °C, at or above the threshold of 30 °C"))
            .unwrap_or_else(|| panic!("{m}"));
        assert!(shown.len() <= 6, "{shown}");
        assert_eq!(shown.parse::<f64>().unwrap(), 1e300);
        let readings = parse_body(br#"[{"deviceId": "s", "temperature": 31.5}]"#).unwrap();
        let m = alert_message(readings[0].as_ref().unwrap(), 30.25);
        assert_eq!(
            m,
            "device s reported 31.5 °C, at or above the threshold of 30.25 °C"
        );
    }

    #[test]
    fn bodies_are_checked_as_a_whole() {
        let status = |body: &str| parse_body(body.as_bytes()).unwrap_err().status().as_u16();
        assert_eq!(status("{"), 400);
        assert_eq!(status("\"text\""), 400);
        assert_eq!(status("[]"), 400);
        assert_eq!(status("{\"deviceId\": 1}"), 400);
        let many = format!(
            "[{}]",
            vec!["{\"deviceId\":\"d\",\"temperature\":1}"; 1001].join(",")
        );
        assert_eq!(status(&many), 413);
        let mixed = parse_body(b"[{\"deviceId\":\"d\",\"temperature\":1}, 3]").unwrap();
        assert!(mixed[0].is_ok() && mixed[1].is_err());
    }
}
