//! `POST /api/telemetry`: at most one alert per device per window.
//!
//! Each device of a batch is gated once, with its hottest reading, and different devices are
//! gated concurrently. A gate is a lease on `alerts/devices/{deviceId}` taken with a fresh id per
//! event (so two events never both win) for `alert_window_seconds`: a native blob lease for
//! 15–60 s, an ETag lease record otherwise. The winner posts the notification; if that fails,
//! it releases the gate so that a later reading can alert. Any storage failure answers 503 and
//! sends nothing (fail closed).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use http::{Request, Response, StatusCode};
use leasegate::lease::{Acquire, Acquired, Term};
use leasegate::{Counting, LeaseId, LockName, Transport};
use serde_json::{json, Value};

use crate::config::{self, ConfigError, Storage, Variables};
use crate::web::{self, rfc3339};
use crate::{elapsed_ms, log_line, Context};

/// The largest body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// The most readings in one batch.
pub const MAX_READINGS: usize = 1000;
/// Blob name prefix of the device gates.
pub const GATE_PREFIX: &str = "alerts/";

/// The device-alerts settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Storage.
    pub storage: Storage,
    /// Readings at or above this alert.
    pub threshold: f64,
    /// At most one alert per device per this long.
    pub window: Duration,
    /// Whether winners also take a fencing token (one more storage request).
    pub fencing: bool,
    /// Where notifications are posted.
    pub notify_url: String,
}

impl Settings {
    /// Reads the settings from variables.
    pub fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        let threshold = config::number(vars, "temperature_threshold", 30.0, -1e9..=1e9)?;
        let window = config::number(vars, "alert_window_seconds", 60.0, 1.0..=86_400.0)?;
        if window.fract() != 0.0 {
            return Err(ConfigError(
                "variable alert_window_seconds must be whole seconds".into(),
            ));
        }
        let fencing = match config::var(vars, "alert_fencing").as_deref() {
            None | Some("on") | Some("true") => true,
            Some("off") | Some("false") => false,
            Some(_) => {
                return Err(ConfigError(
                    "variable alert_fencing must be on or off".into(),
                ))
            }
        };
        let notify_url = config::var(vars, "notify_url")
            .ok_or_else(|| ConfigError("variable notify_url is not set".into()))?;
        if notify_url
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.host().map(|_| ()))
            .is_none()
        {
            return Err(ConfigError(
                "variable notify_url is not an absolute URL".into(),
            ));
        }
        Ok(Settings {
            storage: config::storage(vars)?,
            threshold,
            window: Duration::from_secs(window as u64),
            fencing,
            notify_url,
        })
    }
}

/// One valid reading.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The device id as sent.
    pub device_id: String,
    /// The device's lock name.
    pub device: LockName,
    /// The temperature.
    pub temperature: f64,
    /// The reading's own timestamp, if it had one.
    pub timestamp: Option<String>,
}

/// Reads one reading, or says what is wrong with it.
pub fn parse_reading(value: &Value) -> Result<Reading, String> {
    let obj = value.as_object().ok_or("a reading must be a JSON object")?;
    let device_id = match obj.get("deviceId") {
        None | Some(Value::Null) => return Err("deviceId is missing".into()),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("deviceId must be a string".into()),
    };
    let device = LockName::try_new(&device_id).map_err(|e| match e {
        leasegate::Error::InvalidName { reason, .. } => format!("deviceId {reason}"),
        other => format!("deviceId: {other}"),
    })?;
    let temperature = match obj.get("temperature") {
        None | Some(Value::Null) => return Err("temperature is missing".into()),
        Some(Value::Number(n)) => n.as_f64().ok_or("temperature must be a finite number")?,
        Some(_) => return Err("temperature must be a number".into()),
    };
    if !temperature.is_finite() {
        return Err("temperature must be a finite number".into());
    }
    let timestamp = match obj.get("timestamp") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            humantime::parse_rfc3339_weak(s)
                .map_err(|_| "timestamp must be an RFC 3339 time (2026-11-21T14:00:00Z)")?;
            Some(s.clone())
        }
        Some(_) => return Err("timestamp must be a string".into()),
    };
    Ok(Reading {
        device_id,
        device,
        temperature,
        timestamp,
    })
}

/// The readings of a body: one object or an array of them. `Err` is the 4xx answer.
pub fn parse_body(body: &[u8]) -> Result<Vec<Result<Reading, String>>, Response<Vec<u8>>> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        web::error(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not valid JSON: {e}"),
        )
    })?;
    match value {
        Value::Object(_) => match parse_reading(&value) {
            Ok(r) => Ok(vec![Ok(r)]),
            Err(reason) => Err(web::error(
                StatusCode::BAD_REQUEST,
                "invalid_reading",
                reason,
            )),
        },
        Value::Array(items) if items.is_empty() => Err(web::error(
            StatusCode::BAD_REQUEST,
            "no_readings",
            "the array holds no readings",
        )),
        Value::Array(items) if items.len() > MAX_READINGS => Err(web::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_readings",
            format!(
                "at most {MAX_READINGS} readings per request, got {}",
                items.len()
            ),
        )),
        Value::Array(items) => Ok(items.iter().map(parse_reading).collect()),
        _ => Err(web::error(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "the body must be a reading object or an array of readings",
        )),
    }
}

/// What happened to one device's gate.
enum GateResult {
    Won(Acquired),
    Throttled(Option<Duration>),
    Failed(leasegate::Error),
}

/// One hot device of the batch, gated with its hottest reading.
struct DeviceGate<'r> {
    /// Index of the hottest reading.
    index: usize,
    reading: &'r Reading,
    result: GateResult,
    /// Storage requests sent for this device.
    round_trips: u32,
    /// The notification's fate, for winners.
    notified: Option<Result<(), String>>,
    /// Whether the gate was given back after a failed notification.
    released: bool,
}

/// Handles `POST /api/telemetry`.
pub async fn handle<T: Transport>(
    ctx: &Context<'_, T>,
    request: Request<Vec<u8>>,
) -> Response<Vec<u8>> {
    let started = Instant::now();
    if request.method() != http::Method::POST {
        return web::method_not_allowed("POST");
    }
    if let Err(r) = web::require_json(&request) {
        return r;
    }
    if request.body().len() > MAX_BODY_BYTES {
        return web::too_large(MAX_BODY_BYTES);
    }
    let settings = match Settings::load(ctx.variables) {
        Ok(s) => s,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    let readings = match parse_body(request.body()) {
        Ok(r) => r,
        Err(response) => return response,
    };
    let term = match Term::for_window(settings.window) {
        Ok(t) => t,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };

    // Each device once, with its hottest reading (the first of equals).
    let mut hottest: BTreeMap<&str, (usize, &Reading)> = BTreeMap::new();
    for (i, r) in readings.iter().enumerate() {
        if let Ok(r) = r {
            let best = hottest.entry(&r.device_id).or_insert((i, r));
            if r.temperature > best.1.temperature {
                *best = (i, r);
            }
        }
    }
    let hot: Vec<(usize, &Reading)> = hottest
        .into_values()
        .filter(|(_, r)| r.temperature >= settings.threshold)
        .collect();

    // Gate every hot device concurrently: their storage requests are in flight together.
    let mut gates: Vec<DeviceGate> = join_all(hot.iter().map(|&(index, reading)| {
        let settings = &settings;
        async move {
            let counting = Counting::new(ctx.transport);
            let locks = settings.storage.locks(&counting, GATE_PREFIX);
            let id = (ctx.new_lease_id)();
            let outcome = if settings.fencing {
                locks
                    .acquire_fenced(&reading.device, term, id, ctx.now)
                    .await
            } else {
                locks.acquire(&reading.device, term, id, ctx.now).await
            };
            DeviceGate {
                index,
                reading,
                result: match outcome {
                    Ok(Acquire::Acquired(a)) => GateResult::Won(a),
                    Ok(Acquire::Busy { retry_after }) => GateResult::Throttled(retry_after),
                    Err(e) => GateResult::Failed(e),
                },
                round_trips: counting.sent(),
                notified: None,
                released: false,
            }
        }
    }))
    .await;

    // Fail closed: any storage failure means no notification at all, and the gates this
    // request took are given back so that the client's retry can alert.
    if gates
        .iter()
        .any(|g| matches!(g.result, GateResult::Failed(_)))
    {
        join_all(gates.iter_mut().map(|g| async {
            if let GateResult::Won(a) = &g.result {
                let (_, trips) = release(ctx, &settings, &g.reading.device, a.lease_id).await;
                g.round_trips += trips;
            }
        }))
        .await;
        for g in &gates {
            log_decision(
                &g.reading.device_id,
                "storage_unavailable",
                g.round_trips,
                started,
            );
        }
        let error = gates.iter().find_map(|g| match &g.result {
            GateResult::Failed(e) => Some(e),
            _ => None,
        });
        return match error {
            Some(e) => web::storage_unavailable(e),
            None => web::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
                "lease storage failed",
            ),
        };
    }

    // Notify the winners concurrently; a failed notification gives its gate back.
    join_all(gates.iter_mut().map(|g| async {
        if let GateResult::Won(a) = &g.result {
            let outcome = notify(ctx, &settings, g.reading, a).await;
            if outcome.is_err() {
                let (released, trips) =
                    release(ctx, &settings, &g.reading.device, a.lease_id).await;
                g.released = released;
                g.round_trips += trips;
            }
            g.notified = Some(outcome);
        }
    }))
    .await;

    // One decision per reading; the other readings of a gated device share its decision.
    let window_secs = settings.window.as_secs();
    let by_device: BTreeMap<&str, &DeviceGate> = gates
        .iter()
        .map(|g| (g.reading.device_id.as_str(), g))
        .collect();
    let decisions: Vec<Value> = readings
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let (device_id, mut d, trips) = match r {
                Err(reason) => ("", json!({ "decision": "invalid", "reason": reason }), 0),
                Ok(r) if r.temperature < settings.threshold => (
                    r.device_id.as_str(),
                    json!({ "decision": "below_threshold" }),
                    0,
                ),
                Ok(r) => match by_device.get(r.device_id.as_str()) {
                    Some(g) if g.index == i => (
                        r.device_id.as_str(),
                        gate_decision(g, window_secs),
                        g.round_trips,
                    ),
                    Some(g) => {
                        let mut d = match &g.notified {
                            Some(Err(_)) => gate_decision(g, window_secs),
                            _ => {
                                json!({ "decision": "throttled", "retryAfterSeconds": window_secs })
                            }
                        };
                        d["coveredBy"] = json!(g.index);
                        (r.device_id.as_str(), d, 0)
                    }
                    None => (
                        r.device_id.as_str(),
                        json!({ "decision": "throttled", "retryAfterSeconds": window_secs }),
                        0,
                    ),
                },
            };
            log_decision(
                device_id,
                d["decision"].as_str().unwrap_or(""),
                trips,
                started,
            );
            d["index"] = json!(i);
            if let Ok(r) = r {
                d["deviceId"] = json!(r.device_id);
                d["temperature"] = json!(r.temperature);
            }
            d
        })
        .collect();
    web::json(
        StatusCode::OK,
        &json!({
            "decisions": decisions,
            "threshold": settings.threshold,
            "windowSeconds": window_secs,
        }),
    )
}

/// The decision of a gated device's hottest reading.
fn gate_decision(g: &DeviceGate, window_secs: u64) -> Value {
    match (&g.result, &g.notified) {
        (GateResult::Won(a), Some(Ok(()))) => json!({
            "decision": "notified",
            "fencingToken": a.fencing_token,
            "windowEndsAt": a.expires_at.map(rfc3339),
        }),
        (GateResult::Won(_), Some(Err(reason))) => {
            json!({ "decision": "notify_failed", "reason": reason, "gateReleased": g.released })
        }
        (GateResult::Throttled(after), _) => json!({
            "decision": "throttled",
            "retryAfterSeconds": after.map_or(window_secs, |d| d.as_secs().max(1)),
        }),
        _ => json!({ "decision": "throttled", "retryAfterSeconds": window_secs }),
    }
}

fn log_decision(device_id: &str, decision: &str, storage_round_trips: u32, started: Instant) {
    log_line(json!({
        "fn": "device-alerts",
        "deviceId": device_id,
        "decision": decision,
        "storageRoundTrips": storage_round_trips,
        "durationMs": elapsed_ms(started),
    }));
}

/// Posts the notification; `Err` says why it did not arrive (no secret, no URL).
async fn notify<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    reading: &Reading,
    held: &Acquired,
) -> Result<(), String> {
    let body = json!({
        "deviceId": reading.device_id,
        "temperature": reading.temperature,
        "timestamp": reading.timestamp,
        "message": format!(
            "device {} reported {} °C, at or above the threshold of {} °C",
            reading.device_id, reading.temperature, settings.threshold
        ),
        "fencingToken": held.fencing_token,
        "windowEndsAt": held.expires_at.map(rfc3339),
    })
    .to_string()
    .into_bytes();
    let request = Request::builder()
        .method(http::Method::POST)
        .uri(&settings.notify_url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(body)
        .map_err(|_| "the notification request could not be built".to_string())?;
    match ctx.transport.send(request).await {
        Ok(response) if response.status().is_success() => Ok(()),
        Ok(response) => Err(format!("webhook answered {}", response.status().as_u16())),
        Err(e) => Err(format!("webhook unreachable: {}", e.message)),
    }
}

/// Gives a device's gate back (best effort): whether it was released, and the requests sent.
async fn release<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    device: &LockName,
    id: LeaseId,
) -> (bool, u32) {
    let counting = Counting::new(ctx.transport);
    let locks = settings.storage.locks(&counting, GATE_PREFIX);
    let released = matches!(
        locks.release(device, id, ctx.now).await,
        Ok(leasegate::lease::Release::Released)
    );
    (released, counting.sent())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::time::SystemTime;

    /// Scripted storage and webhook: leases on `alerts/bad` fail with 500, everything else
    /// succeeds. Records what was sent.
    struct Scripted {
        sent: RefCell<Vec<(String, String, Option<String>)>>,
    }

    impl Transport for Scripted {
        async fn send(
            &self,
            request: Request<Vec<u8>>,
        ) -> Result<Response<Vec<u8>>, leasegate::TransportError> {
            let action = request
                .headers()
                .get("x-ms-lease-action")
                .map(|v| v.to_str().unwrap().to_string());
            let path = request.uri().path().to_string();
            self.sent.borrow_mut().push((
                request.method().to_string(),
                path.clone(),
                action.clone(),
            ));
            let mut r = Response::builder().header("date", "Sat, 21 Nov 2026 14:00:00 GMT");
            if path.ends_with("/alerts/bad") {
                r = r.status(500).header("x-ms-error-code", "InternalError");
            } else if action.as_deref() == Some("acquire") {
                let id = request.headers()["x-ms-proposed-lease-id"].clone();
                r = r.status(201).header("x-ms-lease-id", id);
            } else if action.is_some() {
                r = r.status(200);
            } else if request.uri().query() == Some("comp=properties") {
                r = r.status(200).header("x-ms-blob-sequence-number", "7");
            } else {
                r = r.status(204);
            }
            Ok(r.body(Vec::new()).unwrap())
        }
    }

    #[test]
    fn one_failing_gate_fails_the_batch_closed_and_gives_back_the_others() {
        let transport = Scripted {
            sent: RefCell::new(Vec::new()),
        };
        let vars: HashMap<String, String> = [
            ("storage_account", "devstoreaccount1"),
            ("storage_key", leasegate::account::DEV_ACCOUNT_KEY),
            ("storage_origin", "http://127.0.0.1:10000"),
            ("notify_url", "http://127.0.0.1:3001/notify"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let ctx = Context {
            transport: &transport,
            variables: &vars,
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_096_800),
            new_lease_id: &|| LeaseId::from_random_bytes([9; 16]),
        };
        let body = json!([
            {"deviceId": "good", "temperature": 40},
            {"deviceId": "bad", "temperature": 40}
        ]);
        let request = Request::builder()
            .method("POST")
            .uri("/api/telemetry")
            .header("content-type", "application/json")
            .body(body.to_string().into_bytes())
            .unwrap();
        let response = pollster::block_on(handle(&ctx, request));
        assert_eq!(response.status(), 503);
        let answer: Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(answer["error"], "storage_unavailable");
        assert_eq!(answer["storageErrorCode"], "InternalError");
        let sent = transport.sent.borrow();
        // No notification went out, and the gate that was won was released.
        assert!(
            sent.iter().all(|(_, path, _)| path != "/notify"),
            "{sent:?}"
        );
        assert!(
            sent.iter()
                .any(|(_, path, action)| path.ends_with("/alerts/good")
                    && action.as_deref() == Some("release")),
            "{sent:?}"
        );
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
