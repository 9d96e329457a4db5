//! `POST /api/telemetry`: at most one alert per device per window.
//!
//! The handler is four steps, one function each:
//! 1. [`parse`]: authenticate (`Authorization: Bearer <telemetry_token>`, before any other
//!    setting is read), check the request, read the settings and the readings.
//! 2. [`gate`]: each device of the batch once, with its hottest reading at or above the
//!    threshold, takes its gate: a lease on `alerts/{deviceId}` for `alert_window_seconds`,
//!    with a fresh lease id per event (so two readings never both win).
//! 3. [`notify`]: a device that won its gate posts the notification, with an idempotency key.
//! 4. [`answer`]: one decision per reading.
//!
//! Steps 2 and 3 run per device as one pipeline, devices concurrently, at most `max_in_flight`
//! at once. Each device ends in an [`Outcome`], and every outcome that took a gate says what
//! became of it: kept on purpose (the alert went out, or may have) or given back.
//!
//! Failures stay per device: a device whose storage failed is answered `storage_unavailable`
//! (nothing sent for it) while the others of the batch are handled; the whole answer is then a
//! 503 so that clients retry, and a retry never repeats an alert: a device already notified is
//! throttled by its gate for the rest of its window.
#![deny(missing_docs)]
// Helpers return `Err(Response)`: the finished 4xx answer, once per request.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use leasegate::lease::{Acquire, Acquired, IdOrigin, Release, Term};
use leasegate::{Counting, LeaseId, LockName, Transport, TransportErrorKind};
use leasegate::{Request, Response, StatusCode};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use leasegate_spin::config::{self, ConfigError, Storage, Variables};
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{auth, cache, elapsed_ms, log_line, Context};

/// The largest body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// The most readings in one batch.
pub const MAX_READINGS: usize = 1000;
/// Blob name prefix of the device gates.
pub const GATE_PREFIX: &str = "alerts/";

/// The device-alerts settings that gating a device needs (the others are [`Basics`]).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Storage.
    pub storage: Storage,
    /// Readings at or above this alert.
    pub threshold: f64,
    /// Whether notifications carry the gate's fencing token (`alert_fencing`).
    pub fencing: bool,
    /// Where notifications are posted.
    pub notify_url: String,
    /// How long one invocation may go on starting devices (`alert_deadline_ms`): a device not
    /// started by then is answered `deadline_exceeded`, nothing done for it.
    pub deadline: Duration,
}

/// One entry of `device_ids`: an exact id, or a prefix (written with a trailing `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DevicePattern {
    /// This id only.
    Exact(String),
    /// Every id that starts with this.
    Prefix(String),
}

impl DevicePattern {
    /// Reads `device_ids`: entries separated by `,`, each an id or a prefix followed by one
    /// `*` (`sensor-*`); `*` alone allows any id.
    pub fn parse_list(value: &str) -> Result<Vec<DevicePattern>, ConfigError> {
        let mut list = Vec::new();
        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (stem, prefix) = match entry.strip_suffix('*') {
                Some(stem) => (stem, true),
                None => (entry, false),
            };
            if stem.contains('*') {
                return Err(ConfigError(format!(
                    "variable device_ids: '{}' may hold '*' only at its end (a prefix)",
                    entry.chars().take(64).collect::<String>()
                )));
            }
            list.push(if prefix {
                DevicePattern::Prefix(stem.to_string())
            } else {
                DevicePattern::Exact(stem.to_string())
            });
        }
        Ok(list)
    }

    fn matches(&self, id: &str) -> bool {
        match self {
            DevicePattern::Exact(e) => e == id,
            DevicePattern::Prefix(p) => id.starts_with(p.as_str()),
        }
    }
}

/// Whether `list` (empty: any) serves the device `id`.
pub(crate) fn device_allowed(list: &[DevicePattern], id: &str) -> bool {
    list.is_empty() || list.iter().any(|p| p.matches(id))
}

/// What every request is answered with: the threshold, the window and the devices served. A
/// request with no reading at or above the threshold reads only these (and the bearer token):
/// the rest of [`Settings`] is what gating a device needs.
#[derive(Debug, Clone)]
pub(crate) struct Basics {
    /// Readings at or above this alert.
    pub threshold: f64,
    /// At most one alert per device per this long.
    pub window: Duration,
    /// The device ids served (`device_ids`); empty: any.
    pub device_ids: Vec<DevicePattern>,
}

impl Basics {
    /// Reads `temperature_threshold`, `alert_window_seconds` and `device_ids`.
    pub fn load(vars: &dyn Variables) -> Result<Basics, ConfigError> {
        let threshold = config::number(
            vars,
            "temperature_threshold",
            30.0,
            -1_000_000_000..=1_000_000_000,
        )?;
        let window = config::number(vars, "alert_window_seconds", 60.0, 1..=86_400)?;
        if window.fract() != 0.0 {
            return Err(ConfigError(
                "variable alert_window_seconds must be whole seconds".into(),
            ));
        }
        let device_ids =
            DevicePattern::parse_list(&config::var(vars, "device_ids").unwrap_or_default())?;
        Ok(Basics {
            threshold,
            window: Duration::from_secs(window as u64),
            device_ids,
        })
    }
}

impl Settings {
    /// Reads the settings gating needs from variables (`threshold`: the basics').
    pub fn load_with(vars: &dyn Variables, threshold: f64) -> Result<Settings, ConfigError> {
        let fencing = match config::var(vars, "alert_fencing").as_deref() {
            None | Some("on") | Some("true") => true,
            Some("off") | Some("false") => false,
            Some(_) => {
                return Err(ConfigError(
                    "variable alert_fencing must be on or off".into(),
                ))
            }
        };
        let notify_url = config::url(vars, "notify_url")?;
        let deadline = config::number(vars, "alert_deadline_ms", 20_000.0, 100..=600_000)?;
        Ok(Settings {
            storage: config::storage(vars)?,
            threshold,
            fencing,
            notify_url,
            deadline: Duration::from_millis(deadline as u64),
        })
    }
}

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
/// needs are read only for a request with a reading at or above the threshold ([`gate`]): one
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

/// What became of one hot device. Every outcome that took a gate says what became of it.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The gate was taken and the webhook confirmed the notification (2xx). The gate is kept:
    /// the window's one alert went out.
    Notified(Acquired),
    /// The device's gate is held elsewhere (an earlier reading, another instance): nothing sent.
    Throttled {
        /// Time left on the holder's gate, where storage can tell.
        retry_after: Option<Duration>,
        /// Told by the gate cache, without asking storage.
        cached: bool,
    },
    /// Storage failed: nothing was sent for this device. A gate the lease module may have
    /// taken was given back by it (best effort), so a retry can alert.
    StorageFailed(leasegate::Error),
    /// The notification certainly did not arrive (the webhook could not be reached, nothing
    /// was sent): the gate was given back (`released`) so a later reading can alert.
    NotDelivered {
        /// Why.
        reason: String,
        /// Whether the gate was given back.
        released: bool,
    },
    /// The invocation's deadline (`alert_deadline_ms`) had passed when this device's turn
    /// came: nothing was done for it.
    NotStarted,
    /// The webhook may have received the notification (it answered late, broke off, or
    /// answered an error): the gate is kept on purpose, so this window sends nothing more.
    Unconfirmed {
        /// What went wrong (the gate stays held).
        reason: String,
    },
}

/// A device's outcome and the storage requests it took.
#[derive(Debug)]
pub(crate) struct Gated<'r> {
    /// The device.
    pub device: HotDevice<'r>,
    /// What became of it.
    pub outcome: Outcome,
    /// Storage requests sent for this device (gate and, if any, its release).
    pub round_trips: u32,
}

/// Steps 2 and 3 for every hot device: the gate cache first, then the devices it does not
/// answer concurrently, at most `max_in_flight` at once (each device has at most one request
/// in flight at a time), in the order given. The settings gating needs (storage, the webhook,
/// ...) are read only when some device is not answered by the cache, which reads `kv_cache` and
/// the few variables that name the storage ([`cache::Scope::load`]). `Err`: 503 `not_configured`.
pub(crate) async fn gate<'r, T: Transport>(
    ctx: &Context<'_, T>,
    parsed: &Parsed,
    hot: &[HotDevice<'r>],
    started: Instant,
) -> Result<Vec<Gated<'r>>, Response> {
    let not_configured =
        |e: ConfigError| web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e);
    let gates = cache::Gates::open(ctx.cache, ctx.variables, ctx.now).map_err(not_configured)?;
    // The cache is read for every device first, at the invocation's time (`ctx.now`): a device
    // gated late in a long batch is not judged by an entry read against a stale clock.
    let cached: Vec<(HotDevice<'r>, Option<Duration>)> = hot
        .iter()
        .map(|&device| {
            let left = gates.as_ref().and_then(|g| g.held(&gate_path(device)));
            (device, left)
        })
        .collect();
    if cached.iter().all(|(_, left)| left.is_some()) {
        return Ok(cached
            .into_iter()
            .map(|(device, left)| Gated {
                device,
                outcome: Outcome::Throttled {
                    retry_after: left,
                    cached: true,
                },
                round_trips: 0,
            })
            .collect());
    }
    let settings = Settings::load_with(ctx.variables, parsed.threshold).map_err(not_configured)?;
    let transport = (ctx.connect)(settings.storage.timeout);
    let settings = &settings;
    let (transport, gates) = (&transport, gates.as_ref());
    Ok(futures::stream::iter(cached)
        .map(|(device, cached)| {
            gate_one(
                ctx, transport, parsed, settings, gates, device, cached, started,
            )
        })
        .buffered(settings.storage.max_in_flight)
        .collect()
        .await)
}

/// The device's lock blob path, as the gate cache names its entry.
fn gate_path(device: HotDevice<'_>) -> String {
    format!("{GATE_PREFIX}{}", device.reading.device.as_str())
}

/// One device: take its gate, notify if taken, give the gate back only if the notification
/// certainly did not arrive. A gate the cache said is held (`cached`, its time left) is
/// throttled without storage. The gate cache (`gates`, when on) learns what storage said: the
/// gate's end by storage's clock, and how this instance's clock compares with storage's.
#[allow(clippy::too_many_arguments)]
async fn gate_one<'r, T: Transport>(
    ctx: &Context<'_, T>,
    transport: &T,
    parsed: &Parsed,
    settings: &Settings,
    gates: Option<&cache::Gates<'_>>,
    device: HotDevice<'r>,
    cached: Option<Duration>,
    started: Instant,
) -> Gated<'r> {
    // A device starts only before the deadline (one already started finishes: each of its
    // requests is bounded by storage_timeout_ms).
    if Instant::now() >= started + settings.deadline {
        return Gated {
            device,
            outcome: Outcome::NotStarted,
            round_trips: 0,
        };
    }
    let lock = &device.reading.device;
    if let Some(left) = cached {
        return Gated {
            device,
            outcome: Outcome::Throttled {
                retry_after: Some(left),
                cached: true,
            },
            round_trips: 0,
        };
    }
    let path = gate_path(device);
    // Storage said the gate is kept until `ends` in its answer dated `date`.
    let remember = |ends: Option<SystemTime>, date: SystemTime| {
        if let (Some(gates), Some(ends)) = (gates, ends) {
            gates.remember(&path, ends, date);
        }
    };
    let counting = Counting::new(transport);
    let locks = settings.storage.locks(&counting, GATE_PREFIX);
    let id = (ctx.new_lease_id)();
    let taken = locks
        .acquire_with(lock, parsed.term, id, IdOrigin::Fresh, "", ctx.now)
        .await;
    // This instance's clock as the answer came, against the answer's `Date`.
    if let (Some(gates), Some(date)) = (gates, taken.as_ref().ok().and_then(answer_date)) {
        gates.check_clock(date, ctx.now + started.elapsed());
    }
    let outcome = match taken {
        Ok(Acquire::Busy {
            retry_after,
            holder,
            ..
        }) => {
            // Another tenure, old enough that its holder is done notifying: it keeps its gate.
            if let Some(h) = holder.as_ref() {
                let settled = h
                    .held_for
                    .is_some_and(|age| age >= cache::settled_after(settings.storage.timeout));
                if let (true, Some(date)) = (settled, read_date(h)) {
                    remember(h.expires_at, date);
                }
            }
            Outcome::Throttled {
                retry_after,
                cached: false,
            }
        }
        Err(e) => Outcome::StorageFailed(e),
        Ok(Acquire::Acquired(mut held)) => {
            if !settings.fencing {
                held.fencing_token = None;
            }
            let date = held.server_date;
            match notify(transport, settings, device.reading, &held).await {
                Ok(()) => {
                    remember(held.expires_at, date);
                    Outcome::Notified(held)
                }
                Err(Undelivered::NotSent(reason)) => {
                    // The entry goes first. Best effort: this invocation wrote none for this
                    // tenure, and others write one only once it is settled, after any
                    // give-back; keeping the gate would cost the alert the release is for.
                    let reason = if gates.is_some_and(|g| g.forget(&path).is_err()) {
                        format!("{reason}; the key-value store could not be cleared")
                    } else {
                        reason
                    };
                    let released = matches!(
                        locks.release_held(lock, &held, ctx.now).await,
                        Ok(Release::Released)
                    );
                    Outcome::NotDelivered { reason, released }
                }
                Err(Undelivered::Unknown(reason)) => {
                    remember(held.expires_at, date);
                    Outcome::Unconfirmed { reason }
                }
            }
        }
    };
    Gated {
        device,
        outcome,
        round_trips: counting.sent(),
    }
}

/// The `Date` of the read that showed another holder: its tenure's start and age.
fn read_date(holder: &leasegate::lease::Holder) -> Option<SystemTime> {
    holder
        .since
        .zip(holder.held_for)
        .map(|(since, age)| since + age)
}

/// The `Date` of storage's answer to an acquire, where the outcome tells it.
fn answer_date(outcome: &Acquire) -> Option<SystemTime> {
    match outcome {
        Acquire::Acquired(held) => Some(held.server_date),
        Acquire::Busy { holder, .. } => holder.as_ref().and_then(read_date),
    }
}

/// Why a notification was not confirmed.
enum Undelivered {
    /// Nothing reached the webhook (the connection could not be made, or the host refused to
    /// send): safe to alert again.
    NotSent(String),
    /// The webhook may have received it.
    Unknown(String),
}

/// The idempotency key of a device's alert: unique per device and gate tenure (a window), the
/// same for any resend of that window's alert. A hex SHA-256 of the device id and the gate's
/// lease id; it reveals neither.
pub(crate) fn idempotency_key(device_id: &str, lease_id: LeaseId) -> String {
    let digest = Sha256::new()
        .chain_update(b"leasegate alert v1\0")
        .chain_update(device_id.as_bytes())
        .chain_update(b"\0")
        .chain_update(lease_id.to_string().as_bytes())
        .finalize();
    leasegate_spin::web::hex(&digest[..16])
}

/// The notification's `message`: the device, its reading and the threshold.
fn alert_message(reading: &Reading, threshold: f64) -> String {
    format!(
        "device {} reported {} °C, at or above the threshold of {} °C",
        reading.device_id,
        web::number(reading.temperature),
        web::number(threshold)
    )
}

/// Step 3: posts the notification (with `Idempotency-Key`); `Err` says why it is not
/// confirmed (no secret, no URL).
async fn notify<T: Transport>(
    transport: &T,
    settings: &Settings,
    reading: &Reading,
    held: &Acquired,
) -> Result<(), Undelivered> {
    let key = idempotency_key(&reading.device_id, held.lease_id);
    let body = json!({
        "deviceId": reading.device_id,
        "temperature": reading.temperature,
        "timestamp": reading.timestamp,
        "message": alert_message(reading, settings.threshold),
        "fencingToken": held.fencing_token,
        "windowEndsAt": held.expires_at.map(rfc3339),
        "idempotencyKey": key,
    })
    .to_string()
    .into_bytes();
    let request = web::json_post(&settings.notify_url, &key, body).ok_or_else(|| {
        Undelivered::NotSent("the notification request could not be built".into())
    })?;
    match transport.send_for_status(request).await {
        Ok(response) if response.status().is_success() => Ok(()),
        Ok(response) => Err(Undelivered::Unknown(format!(
            "webhook answered {}",
            response.status().as_u16()
        ))),
        Err(e) if e.kind == TransportErrorKind::Connect => Err(Undelivered::NotSent(format!(
            "webhook unreachable: {}",
            e.message
        ))),
        Err(e) => Err(Undelivered::Unknown(format!(
            "webhook did not confirm: {}",
            e.message
        ))),
    }
}

/// Step 4: one decision per reading, in order; the other readings of a gated device share its
/// outcome (`coveredBy`). 503 when any device's storage failed, else 200.
pub(crate) fn answer(
    parsed: &Parsed,
    gated: &[Gated],
    started: Instant,
    jitter: impl Fn() -> u32,
) -> Response {
    let window_secs = parsed.window.as_secs();
    // Each device is gated once (see `hot_devices`).
    let by_device: HashMap<&str, &Gated> = gated
        .iter()
        .map(|g| (g.device.reading.device_id.as_str(), g))
        .collect();
    let decisions: Vec<Value> = parsed
        .readings
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let (device_id, mut d, trips) = match r {
                Err(reason) => ("", json!({ "decision": "invalid", "reason": reason }), 0),
                Ok(r) if r.temperature < parsed.threshold => (
                    r.device_id.as_str(),
                    json!({ "decision": "below_threshold" }),
                    0,
                ),
                Ok(r) => match by_device.get(r.device_id.as_str()) {
                    None => (
                        r.device_id.as_str(),
                        json!({ "decision": "below_threshold" }),
                        0,
                    ),
                    Some(g) if g.device.index == i => (
                        r.device_id.as_str(),
                        decision(&g.outcome, window_secs),
                        g.round_trips,
                    ),
                    Some(g) => {
                        let mut d = match &g.outcome {
                            // Not acted on: the same as the reading that stood for them.
                            Outcome::StorageFailed(_)
                            | Outcome::NotDelivered { .. }
                            | Outcome::NotStarted => decision(&g.outcome, window_secs),
                            _ => {
                                json!({ "decision": "throttled", "retryAfterSeconds": window_secs })
                            }
                        };
                        d["coveredBy"] = json!(g.device.index);
                        (r.device_id.as_str(), d, 0)
                    }
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
    let mut body = json!({
        "decisions": decisions,
        "threshold": parsed.threshold,
        "windowSeconds": window_secs,
    });
    let failed: Vec<&leasegate::Error> = gated
        .iter()
        .filter_map(|g| match &g.outcome {
            Outcome::StorageFailed(e) => Some(e),
            _ => None,
        })
        .collect();
    let not_started = gated
        .iter()
        .filter(|g| matches!(g.outcome, Outcome::NotStarted))
        .count();
    let Some(first) = failed.first() else {
        if not_started == 0 {
            return web::json(StatusCode::OK, &body);
        }
        body["error"] = json!("deadline_exceeded");
        body["message"] = json!(format!(
            "the invocation reached its deadline (alert_deadline_ms) before {not_started} of \
                 {} devices were started; nothing was done for them. Retrying the whole batch \
                 is safe: devices already notified are throttled for the rest of their window",
            gated.len()
        ));
        let mut r = web::json(StatusCode::SERVICE_UNAVAILABLE, &body);
        r.headers_mut()
            .insert("retry-after", web::retry_after(None, jitter()).to_string());
        return r;
    };
    // A 403 for any device: the deployment must be fixed (502, not retryable).
    let first = failed
        .iter()
        .find(|e| web::is_forbidden(e))
        .unwrap_or(first);
    body["error"] = json!(web::storage_error_code(first));
    let message = if web::is_forbidden(first) {
        format!(
            "{}; nothing was sent for {} of {} devices ({first})",
            web::forbidden_fix(first),
            failed.len(),
            gated.len()
        )
    } else {
        format!(
            "lease storage failed for {} of {} devices ({first}); nothing was sent for them. \
         Retrying the whole batch is safe: devices already notified are throttled for the \
         rest of their window",
            failed.len(),
            gated.len()
        )
    };
    body["message"] = json!(message);
    if let leasegate::Error::Storage(s) = first {
        body["storageStatus"] = json!(s.status.as_u16());
        body["storageErrorCode"] = json!(s.code);
    }
    let status = web::storage_status(first);
    let mut r = web::json(status, &body);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        let jitter = jitter();
        // The longest wait any failure asks for (a timeout longer than a refusal; storage's
        // own Retry-After when it sent one), jittered so that clients do not retry in step.
        let wait = failed
            .iter()
            .map(|e| web::retry_after(Some(e), jitter))
            .max()
            .unwrap_or(1);
        r.headers_mut().insert("retry-after", wait.to_string());
    }
    r
}

/// The decision for a device's own (hottest) reading.
fn decision(outcome: &Outcome, window_secs: u64) -> Value {
    match outcome {
        Outcome::Notified(held) => json!({
            "decision": "notified",
            "fencingToken": held.fencing_token,
            "windowEndsAt": held.expires_at.map(rfc3339),
        }),
        Outcome::Throttled {
            retry_after,
            cached,
        } => {
            let mut d = json!({
                "decision": "throttled",
                // What storage says of the holder's gate; the window when it cannot tell.
                "retryAfterSeconds": retry_after.map_or(window_secs, |d| d.as_secs().max(1)),
            });
            if *cached {
                d["cached"] = json!(true);
            }
            d
        }
        Outcome::StorageFailed(e) => json!({
            "decision": "storage_unavailable",
            "reason": e.to_string(),
        }),
        Outcome::NotDelivered { reason, released } => json!({
            "decision": "notify_failed",
            "reason": reason,
            "delivery": "not_delivered",
            "gateReleased": released,
        }),
        Outcome::NotStarted => json!({
            "decision": "deadline_exceeded",
            "reason": "the invocation's deadline (alert_deadline_ms) passed before this device's turn: nothing was done for it",
        }),
        Outcome::Unconfirmed { reason, .. } => json!({
            "decision": "notify_failed",
            "reason": reason,
            "delivery": "unknown",
            "gateReleased": false,
        }),
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
    use std::cell::RefCell;
    use std::collections::HashMap;
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
            ("storage_key", leasegate::account::DEV_ACCOUNT_KEY),
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
            ("storage_key", leasegate::account::DEV_ACCOUNT_KEY),
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
