//! One decision per reading, the answer's status and body, and the decision's log line.

use std::collections::HashMap;
use std::time::Instant;

use leasegate::{Response, StatusCode};
use serde_json::{json, Value};

use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{elapsed_ms, log_line};

use crate::gate::{Gated, Outcome};
use crate::readings::Parsed;

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
