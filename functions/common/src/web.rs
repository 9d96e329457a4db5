//! JSON answers and request checks shared by the HTTP functions.

use http::{HeaderValue, Response, StatusCode};
use serde_json::json;

/// A JSON answer.
pub fn json(status: StatusCode, body: &serde_json::Value) -> Response<Vec<u8>> {
    let mut response = Response::new(body.to_string().into_bytes());
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A JSON error: `{"error": code, "message": message}`. The message must hold no secret.
pub fn error(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Response<Vec<u8>> {
    json(
        status,
        &json!({ "error": code, "message": message.to_string() }),
    )
}

/// 405 with the methods that are allowed.
pub fn method_not_allowed(allow: &str) -> Response<Vec<u8>> {
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("allowed methods: {allow}"),
    );
    if let Ok(v) = HeaderValue::from_str(allow) {
        r.headers_mut().insert(http::header::ALLOW, v);
    }
    r
}

/// 415 unless the request says its body is JSON (`application/json`, parameters allowed).
pub fn require_json<B>(request: &http::Request<B>) -> Result<(), Response<Vec<u8>>> {
    let content_type = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
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

/// 413 when the body is larger than `limit` bytes.
pub fn too_large(limit: usize) -> Response<Vec<u8>> {
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

/// The 503 for a storage failure: what storage said (status and error code), never a secret.
/// A lock blob whose claim cannot be used is `lock_unusable`, naming the field.
pub fn storage_unavailable(e: &leasegate::Error) -> Response<Vec<u8>> {
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
        body["storageStatus"] = json!(s.status.as_u16());
        body["storageErrorCode"] = json!(s.code);
    }
    let mut r = json(StatusCode::SERVICE_UNAVAILABLE, &body);
    r.headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}
