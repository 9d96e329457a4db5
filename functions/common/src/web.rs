//! JSON answers and request checks shared by the HTTP functions.

use crate::json;
use leasegate::{Request, Response, StatusCode};

/// A JSON answer.
pub fn json(status: StatusCode, body: &crate::json::Value) -> Response {
    Response::new(status)
        .with_header("content-type", "application/json")
        .with_body(body.to_string().into_bytes())
}

/// A JSON error: `{"error": code, "message": message}`. The message must hold no secret.
pub fn error(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Response {
    error_text(status, code, message.to_string())
}

/// [`error`] once its message is text (the part not repeated per message type).
fn error_text(status: StatusCode, code: &str, message: String) -> Response {
    json(status, &json!({ "error": code, "message": message }))
}

/// 405 with the methods that are allowed.
pub fn method_not_allowed(allow: &str) -> Response {
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("allowed methods: {allow}"),
    );
    r.headers_mut().insert("allow", allow);
    r
}

/// 415 unless the request says its body is JSON (`application/json`, parameters allowed).
pub fn require_json(request: &Request) -> Result<(), Response> {
    let content_type = request.headers().get("content-type").unwrap_or("");
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if media == "application/json" {
        Ok(())
    } else {
        Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as Content-Type: application/json",
        ))
    }
}

/// A JSON `POST` of `body` to `url` with an `Idempotency-Key` (a webhook, a job, a heartbeat),
/// or `None` if `url` cannot be sent (not an absolute `http(s)` URL of visible ASCII).
pub fn json_post(url: &str, idempotency_key: &str, body: Vec<u8>) -> Option<Request> {
    let absolute = url.starts_with("http://") || url.starts_with("https://");
    if !absolute || !url.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    Some(
        Request::new(leasegate::Method::POST, url)
            .with_header("content-type", "application/json")
            .with_header("content-length", body.len().to_string())
            .with_header("idempotency-key", idempotency_key)
            .with_body(body),
    )
}

/// 413 when the body is larger than `limit` bytes.
pub fn too_large(limit: usize) -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("the body may be at most {limit} bytes"),
    )
}

/// Formats a time as RFC 3339 (`2026-11-21T14:00:00Z`). Times after the year 9999 (which RFC
/// 3339 cannot write) are written as its last second rather than failing.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let last = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(253_402_300_799);
    humantime::format_rfc3339_seconds(t.min(last)).to_string()
}

/// Lowercase hexadecimal of `bytes` (digests in keys and ids), without the formatting
/// machinery's padding per byte.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

/// Writes a finite number the shortest way that reads back the same (`31.5`, `30`), with the
/// JSON writer's formatter (zmij) rather than the standard library's float formatting, which would
/// add ~14 KB to a component for one log message.
pub fn number(x: f64) -> String {
    if !x.is_finite() {
        return "NaN".to_owned();
    }
    let s = zmij::Buffer::new().format_finite(x).to_owned();
    match s.strip_suffix(".0") {
        Some(whole) => whole.to_owned(),
        None => s,
    }
}

/// The error code of an answer for a storage failure: `lock_unusable` when the lock blob's
/// claim cannot be used (an operator must act), else `storage_unavailable`.
pub fn storage_error_code(e: &leasegate::Error) -> &'static str {
    match e {
        leasegate::Error::CorruptLock(_) => "lock_unusable",
        _ => "storage_unavailable",
    }
}

/// The 503 for a storage failure: what storage said (status and error code), never a secret.
/// A lock blob whose claim cannot be used is `lock_unusable`, naming the field.
pub fn storage_unavailable(e: &leasegate::Error) -> Response {
    let mut body = match e {
        leasegate::Error::CorruptLock(_) => json!({
            "error": "lock_unusable",
            "message": format!("nothing was done: {e}; an operator can break the lock or delete its blob"),
        }),
        _ => json!({
            "error": "storage_unavailable",
            "message": format!("lease storage failed, nothing was done: {e}"),
        }),
    };
    if let leasegate::Error::Storage(s) = e {
        body.set("storageStatus", json!(s.status.as_u16()));
        body.set("storageErrorCode", json!(s.code));
    }
    let mut r = json(StatusCode::SERVICE_UNAVAILABLE, &body);
    r.headers_mut().insert("retry-after", "1");
    r
}

#[cfg(test)]
mod tests {
    use super::number;

    #[test]
    fn hex_is_lowercase_two_digits_a_byte() {
        assert_eq!(super::hex(&[0, 9, 10, 255, 0x5a]), "00090aff5a");
        assert_eq!(super::hex(&[]), "");
    }

    #[test]
    fn numbers_read_back_the_same() {
        assert_eq!(number(30.0), "30");
        assert_eq!(number(31.5), "31.5");
        assert_eq!(number(-0.1), "-0.1");
        assert_eq!(number(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(number(f64::NAN), "NaN");
        for x in [1e-7, 123456.789, 1e21, -273.15] {
            assert_eq!(number(x).parse::<f64>().unwrap(), x);
        }
    }
}
