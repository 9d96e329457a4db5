//! What the verbs' callers read from a request (the key) and the webhook POST they send.

use leasegate::{Error, LockName, Request, Response, StatusCode, Transport};
use percent_encoding::percent_decode_str;
use serde::Serialize;

use crate::web;

/// A key from a request's path segment: percent-decoded, 1 to 256 bytes of UTF-8, no `.` or
/// `..` segment, no control character. `Err` is the 400 answer (`invalid_key`).
pub fn key(raw: &str) -> Result<LockName, Response> {
    let bad = |message: String| web::error(StatusCode::BAD_REQUEST, "invalid_key", message);
    let decoded = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| bad("the key is not UTF-8 once percent-decoded".into()))?;
    LockName::try_new(&decoded).map_err(|e| match e {
        Error::InvalidName { reason, .. } => bad(format!("the key {reason}")),
        other => bad(other.to_string()),
    })
}

/// The key in `request`'s path between `prefix` and `suffix` (`/api/orders/` and `/ship` in
/// `/api/orders/{id}/ship`), checked as [`key`] checks it. `Err` is the answer: 404
/// (`not_found`) for a path of another shape, 400 (`invalid_key`) for a bad key.
///
/// The request's own path, never Spin's `spin-path-info` header (a client can send its own).
pub fn key_in_path(request: &Request, prefix: &str, suffix: &str) -> Result<LockName, Response> {
    let raw = request.path().strip_prefix(prefix);
    match raw.and_then(|rest| rest.strip_suffix(suffix)) {
        Some(raw) => key(raw),
        None => Err(web::error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("the route is {prefix}{{key}}{suffix}"),
        )),
    }
}

/// A side effect for [`once_per_window`](super::once_per_window)'s work: POSTs `body` as JSON to `url` with an
/// `Idempotency-Key`, through `transport` (its timeout applies). `Ok` is the receiver's 2xx
/// status; `Err` says why not (an unusable URL, another status, no answer), naming no secret.
///
/// `Err` makes [`once_per_window`](super::once_per_window) give its lock back, so a retry calls again: a receiver
/// that may have acted before failing (a 5xx after the work, an answer lost) then sees the
/// call again, with a larger fencing token and the same body; make it idempotent on the body's
/// identity (the order id, say), and pass an `idempotency_key` that stays the same across
/// such retries (the event's identity, never the fencing token, which a retry changes). A 2xx
/// whose body breaks off is an `Err` too (the transport cannot tell it from a broken answer):
/// the same idempotency key makes its retry harmless.
pub async fn post_json<T: Transport>(
    transport: &T,
    url: &str,
    idempotency_key: &str,
    body: &impl Serialize,
) -> Result<u16, String> {
    let body = serde_json::to_vec(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let request = web::json_post(url, idempotency_key, body)
        .ok_or("the webhook URL is not an absolute http(s) URL")?;
    match transport.send_for_status(request).await {
        Ok(answer) if answer.status().is_success() => Ok(answer.status().as_u16()),
        Ok(answer) => Err(format!("the webhook answered {}", answer.status().as_u16())),
        Err(e) => Err(format!("the webhook could not be reached: {e}")),
    }
}
