//! The readings of a batch: the body parsed, each reading checked, the hottest reading per device.

use std::collections::HashMap;
use std::time::Duration;

use leasegate::lease::Term;
use leasegate::LockName;
use leasegate::{Request, Response, StatusCode};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use leasegate_spin::auth;
use leasegate_spin::config::Variables;
use leasegate_spin::web::{self};

use crate::settings::{device_allowed, Basics};
use crate::{MAX_BODY_BYTES, MAX_READINGS};

/// One valid reading.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reading {
    /// The device id as sent.
    pub device_id: String,
    /// The device's lock name.
    pub device: LockName,
    /// The temperature.
    pub temperature: f64,
    /// The reading's own timestamp, if it had one.
    pub timestamp: Option<String>,
}

/// A reading as sent. Other fields are ignored: a device may send more than this function
/// reads. A field sent as `null` counts as missing. A field of the wrong type is named.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SentReading {
    #[serde(default, deserialize_with = "device_id")]
    device_id: Option<String>,
    #[serde(default, deserialize_with = "temperature")]
    temperature: Option<f64>,
    #[serde(default, deserialize_with = "timestamp")]
    timestamp: Option<String>,
}

/// An optional field, or `message` when it has the wrong type.
fn field<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    message: &str,
) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d).map_err(|_| D::Error::custom(message))
}

fn device_id<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    field(d, "deviceId must be a string")
}

fn temperature<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    field(d, "temperature must be a number")
}

fn timestamp<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    field(d, "timestamp must be a string")
}

/// Reads one reading, or says what is wrong with it.
pub(crate) fn parse_reading(value: &Value) -> Result<Reading, String> {
    // Checked first: serde would also read an array as the fields in order.
    if !value.is_object() {
        return Err("a reading must be a JSON object".into());
    }
    let sent = SentReading::deserialize(value).map_err(|e| e.to_string())?;
    let device_id = sent.device_id.ok_or("deviceId is missing")?;
    let device = LockName::try_new(&device_id).map_err(|e| match e {
        leasegate::Error::InvalidName { reason, .. } => format!("deviceId {reason}"),
        other => format!("deviceId: {other}"),
    })?;
    // Finite: the JSON reader refuses a number out of the range of `f64`.
    let temperature = sent.temperature.ok_or("temperature is missing")?;
    if let Some(t) = &sent.timestamp {
        humantime::parse_rfc3339_weak(t)
            .map_err(|_| "timestamp must be an RFC 3339 time (2026-11-21T14:00:00Z)")?;
    }
    Ok(Reading {
        device_id,
        device,
        temperature,
        timestamp: sent.timestamp,
    })
}

/// The readings of a body: one object or an array of them. `Err` is the 4xx answer.
pub(crate) fn parse_body(body: &[u8]) -> Result<Vec<Result<Reading, String>>, Response> {
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

/// A checked request: its settings, its readings and the gate term.
pub(crate) struct Parsed {
    /// Readings at or above this alert.
    pub threshold: f64,
    /// At most one alert per device per this long.
    pub window: Duration,
    /// Each reading, or why it is unusable.
    pub readings: Vec<Result<Reading, String>>,
    /// The term of the device gates.
    pub term: Term,
}

/// Step 1: authenticates, checks the request, reads the basic settings and the readings. `Err`
/// is the answer (401, 405, 415, 413, 400, or 503 `not_configured`). The settings gating
/// needs are read only for a request with a reading at or above the threshold ([`gate`](fn@crate::gate::gate)): one
/// whose readings are all below it is answered from the threshold, the window and
/// `device_ids` alone (a variable read is a call into Spin, a few µs each).
pub(crate) fn parse(vars: &dyn Variables, request: &Request) -> Result<Parsed, Response> {
    auth::authenticate(vars, "telemetry_token", "telemetry_auth", request)?;
    if request.method() != leasegate::Method::POST {
        return Err(web::method_not_allowed("POST"));
    }
    web::require_json(request)?;
    if request.body().len() > MAX_BODY_BYTES {
        return Err(web::too_large(MAX_BODY_BYTES));
    }
    let not_configured = |e: &dyn std::fmt::Display| {
        web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e)
    };
    let basics = Basics::load(vars).map_err(|e| not_configured(&e))?;
    let term = Term::for_window(basics.window).map_err(|e| not_configured(&e))?;
    let mut readings = parse_body(request.body())?;
    // Devices not served cost nothing: no storage request, no notification.
    let refused = |r: &Reading| !device_allowed(&basics.device_ids, &r.device_id);
    if readings.len() == 1 && readings[0].as_ref().is_ok_and(refused) && body_is_object(request) {
        return Err(web::error(
            StatusCode::BAD_REQUEST,
            "invalid_reading",
            "deviceId is not one of the devices served (device_ids)",
        ));
    }
    for r in &mut readings {
        if r.as_ref().is_ok_and(refused) {
            *r = Err("deviceId is not one of the devices served (device_ids)".into());
        }
    }
    let (threshold, window) = (basics.threshold, basics.window);
    Ok(Parsed {
        threshold,
        window,
        readings,
        term,
    })
}

fn body_is_object(request: &Request) -> bool {
    request
        .body()
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'{')
}

/// One device of the batch that is at or above the threshold, with its hottest reading.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HotDevice<'r> {
    /// Index of the hottest reading (the first of equals).
    pub index: usize,
    /// The reading.
    pub reading: &'r Reading,
}

/// The hot devices of a batch, each once (in the order they first appear), with its hottest
/// reading.
pub(crate) fn hot_devices(
    readings: &[Result<Reading, String>],
    threshold: f64,
) -> Vec<HotDevice<'_>> {
    let mut hottest: Vec<HotDevice> = Vec::new();
    // Each device's place in `hottest`.
    let mut place: HashMap<&str, usize> = HashMap::new();
    for (index, reading) in readings.iter().enumerate() {
        let Ok(reading) = reading else { continue };
        let device = HotDevice { index, reading };
        match place.get(reading.device_id.as_str()) {
            Some(&i) if reading.temperature > hottest[i].reading.temperature => hottest[i] = device,
            Some(_) => {}
            None => {
                place.insert(&reading.device_id, hottest.len());
                hottest.push(device);
            }
        }
    }
    hottest.retain(|d| d.reading.temperature >= threshold);
    hottest
}
