//! Each hot device's gate and its notification: the lease on `alerts/{deviceId}`, the webhook POST.

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{Acquire, Acquired, Acquiring, IdOrigin, Release, Start};
use leasegate::{Counting, LeaseId, Transport, TransportErrorKind};
use leasegate::{Response, StatusCode};
use serde_json::json;
use sha2::{Digest, Sha256};

use futures::StreamExt;
use leasegate_spin::config::ConfigError;
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{cache, Context};

use crate::readings::{HotDevice, Parsed, Reading};
use crate::settings::Settings;
use crate::GATE_PREFIX;

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
    let batch = Batch {
        ctx,
        transport: &transport,
        parsed,
        settings,
        gates: gates.as_ref(),
        started,
    };
    let batch = &batch;
    Ok(futures::stream::iter(cached)
        .map(|(device, cached)| gate_one(batch, device, cached))
        .buffered(settings.storage.max_in_flight)
        .collect()
        .await)
}

/// What every device of one batch is gated with: the invocation, its storage connection and
/// settings, the gate cache (when on) and when the batch started.
struct Batch<'b, 'c, 'g, T: Transport> {
    ctx: &'b Context<'c, T>,
    transport: &'b T,
    parsed: &'b Parsed,
    settings: &'b Settings,
    gates: Option<&'b cache::Gates<'g>>,
    started: Instant,
}

/// The device's lock blob path, as the gate cache names its entry.
fn gate_path(device: HotDevice<'_>) -> String {
    format!("{GATE_PREFIX}{}", device.reading.device.as_str())
}

/// One device: take its gate, notify if taken, give the gate back only if the notification
/// certainly did not arrive. A gate the cache said is held (`cached`, its time left) is
/// throttled without storage. The gate cache (`gates`, when on) learns what storage said: the
/// gate's end by storage's clock, and how this instance's clock compares with storage's.
async fn gate_one<'r, T: Transport>(
    batch: &Batch<'_, '_, '_, T>,
    device: HotDevice<'r>,
    cached: Option<Duration>,
) -> Gated<'r> {
    let Batch {
        ctx,
        transport,
        parsed,
        settings,
        gates,
        started,
    } = *batch;
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
        .acquire(
            lock,
            Acquiring::new(parsed.term, id).origin(IdOrigin::Fresh),
            ctx.now,
        )
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
                        locks
                            .release(lock, held.lease_id, Start::Acquired(&held), ctx.now)
                            .await,
                        Ok((Release::Released, _))
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
pub(crate) fn alert_message(reading: &Reading, threshold: f64) -> String {
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
