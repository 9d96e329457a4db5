//! JSON answers and request checks shared by the HTTP functions.

use leasegate::{Request, Response, StatusCode};
use serde_json::json;

/// A JSON answer (written by [`to_json`]).
pub fn json(status: StatusCode, body: &impl serde::Serialize) -> Response {
    Response::new(status)
        .with_header("content-type", "application/json")
        .with_body(to_json(body))
}

/// `value` as compact JSON, with every control character and every format or separator
/// character (Unicode Cf, Zl, Zp: U+200B, U+2028, U+202E ...) escaped as `\uXXXX` (serde_json
/// escapes only those below U+0020): no answer or log line carries an invisible or reordering
/// character raw, whatever a caller or a stored name put in it. A value that cannot be
/// serialized (never one the handlers build: string keys, finite numbers) is `{}`.
pub fn to_json(value: &impl serde::Serialize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut writer = serde_json::Serializer::with_formatter(&mut out, Escaping);
    match value.serialize(&mut writer) {
        Ok(()) => out,
        Err(_) => b"{}".to_vec(),
    }
}

/// serde_json's compact formatter, escaping what [`to_json`] says.
struct Escaping;

impl serde_json::ser::Formatter for Escaping {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if c.is_control() || leasegate::is_format_or_separator(c) {
                writer.write_all(&fragment.as_bytes()[start..i])?;
                for unit in c.encode_utf16(&mut [0; 2]) {
                    write!(writer, "\\u{unit:04x}")?;
                }
                start = i + c.len_utf8();
            }
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

/// A JSON error: `{"error": code, "message": message}`. The message must hold no secret.
pub fn error(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Response {
    json(
        status,
        &ErrorBody {
            error: code,
            message: message.to_string(),
        },
    )
}

/// The body of [`error`].
#[derive(serde::Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    message: String,
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

pub use leasegate::time::rfc3339;

/// Lowercase hexadecimal of `bytes` (digests in keys and ids).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a finite number for a message the shortest way that reads back the same: JSON's
/// form (`31.5`, `1e+300`; not `f64`'s `Display`, which writes `1e300` as 301 digits),
/// a whole number without `.0` (`30`). Anything else as `NaN`.
pub fn number(x: f64) -> String {
    match serde_json::Number::from_f64(x) {
        Some(n) => {
            let s = n.to_string();
            match s.strip_suffix(".0") {
                Some(whole) => whole.to_owned(),
                None => s,
            }
        }
        None => "NaN".to_owned(),
    }
}

/// What an answer for a 403 from storage says when its error code tells nothing more: the
/// deployment must be fixed, retrying does not help.
pub const FORBIDDEN_FIX: &str = "storage refused this app's credential or the request's signature (403 Forbidden): check the storage key or SAS (its permissions, expiry, allowed IPs), or the identity's role on the account; retrying does not help";

/// What to fix for a 403 (or 401) from storage, by its error code.
pub fn forbidden_fix(e: &leasegate::Error) -> &'static str {
    let code = match e {
        leasegate::Error::Storage(s) => s.code.as_deref(),
        _ => None,
    };
    match code {
        Some("KeyBasedAuthenticationNotPermitted") => {
            "Shared Key access is turned off on this storage account (allowSharedKeyAccess: \
             false): storage refuses the account key and every SAS signed with it; sign in with \
             Microsoft Entra ID instead (storage_auth = managed_identity or client_secret, see \
             docs/entra-id.md); retrying does not help"
        }
        Some("AuthorizationPermissionMismatch") => {
            "the app's credential is not allowed this request: an identity needs the role \
             Storage Blob Data Contributor on the container (or the storage account; see \
             docs/entra-id.md; a new assignment takes a few minutes to apply), a SAS needs the \
             permissions read, add, create, write, delete and list; retrying does not help"
        }
        Some("InvalidAuthenticationInfo" | "AuthenticationFailed") => {
            "storage refused this app's credential: a storage key or SAS that is wrong or \
             expired, or an access token storage does not accept (expired, for another \
             resource or tenant; a new one was asked for and refused too); check the storage \
             settings, retrying does not help"
        }
        _ => FORBIDDEN_FIX,
    }
}

/// Whether storage refused the credential or the request's signature (a 403): a
/// configuration fault, answered 502 `storage_forbidden`, never 503.
pub fn is_forbidden(e: &leasegate::Error) -> bool {
    e.class() == Some(leasegate::ErrorClass::Auth)
}

/// Whether no access token could be had and asking again will not help (the token endpoint
/// refused: a wrong client secret, no identity): answered 502 `token_refused`.
fn token_refused(e: &leasegate::Error) -> bool {
    matches!(e, leasegate::Error::Token(t) if !t.retryable)
}

/// The status of an answer for a storage failure: 502 when storage refused the credential
/// or the signature, or the token endpoint refused (not retryable), else 503 (retryable).
pub fn storage_status(e: &leasegate::Error) -> StatusCode {
    if is_forbidden(e) || token_refused(e) {
        StatusCode::BAD_GATEWAY
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// The error code of an answer for a storage failure: `lock_unusable` when the lock blob's
/// claim cannot be used (an operator must act), `storage_forbidden` when storage refused the
/// credential or the signature (see [`forbidden_fix`]), `token_refused` / `token_unavailable`
/// when no access token could be had (the endpoint refused / could not answer), else
/// `storage_unavailable`.
pub fn storage_error_code(e: &leasegate::Error) -> &'static str {
    match e {
        leasegate::Error::CorruptLock(_) | leasegate::Error::UnusableLock { .. } => "lock_unusable",
        leasegate::Error::Token(t) if t.retryable => "token_unavailable",
        leasegate::Error::Token(_) => "token_refused",
        e if is_forbidden(e) => "storage_forbidden",
        _ => "storage_unavailable",
    }
}

/// The message for a storage failure and what it left undone (`consequence`): storage's own
/// words, for a 403 the fix ([`forbidden_fix`]), for a token that could not be had what the
/// endpoint said.
pub fn storage_failed(e: &leasegate::Error, consequence: &str) -> String {
    match e {
        leasegate::Error::Token(t) if t.retryable => format!(
            "no Microsoft Entra ID access token for storage, {consequence}: {t}; retry later"
        ),
        leasegate::Error::Token(t) => format!(
            "no Microsoft Entra ID access token for storage, {consequence}: {t}; check the \
             identity settings of storage_auth (docs/entra-id.md), retrying does not help"
        ),
        e if is_forbidden(e) => format!("{}; {consequence}: {e}", forbidden_fix(e)),
        _ => format!("lease storage failed, {consequence}: {e}"),
    }
}

/// The answer for a storage failure: what storage said (status and error code), never a
/// secret. A 503 with `Retry-After` (`storage_unavailable`, or `lock_unusable` naming the
/// field of a lock blob whose claim cannot be used), except for a 403: 502
/// `storage_forbidden`, not retryable, naming the fix.
pub fn storage_unavailable(e: &leasegate::Error) -> Response {
    let mut body = match e {
        leasegate::Error::UnusableLock {
            lock, container, ..
        } => json!({
            "error": "lock_unusable",
            "lock": lock,
            "message": format!(
                "nothing was done: {e}; an operator can remove the lock blob with the \
                 leasegate CLI: `leasegate delete {} --container {container}` (tokens stay \
                 increasing)",
                shell_word(lock)
            ),
        }),
        leasegate::Error::CorruptLock(_) => json!({
            "error": "lock_unusable",
            "message": format!("nothing was done: {e}; an operator can break the lock or delete its blob"),
        }),
        _ => json!({
            "error": storage_error_code(e),
            "message": storage_failed(e, "nothing was done"),
        }),
    };
    if let (leasegate::Error::Storage(s), Some(fields)) = (e, body.as_object_mut()) {
        fields.insert("storageStatus".into(), json!(s.status.as_u16()));
        fields.insert("storageErrorCode".into(), json!(s.code));
    }
    let status = storage_status(e);
    let mut r = json(status, &body);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert("retry-after", "1");
    }
    r
}

/// How long a client should wait before retrying after `failure` (`None`: the invocation ran
/// out of time), in seconds, jittered by `jitter` (any random number) so that clients refused
/// together do not come back together. Nothing is remembered between invocations, so the wait
/// grows with the kind of failure rather than with a count:
///
/// | failure | wait |
/// |---|---|
/// | storage sent `Retry-After: N` | N to N + N/4 (at least 1 more) |
/// | connection refused | 2 to 3 |
/// | storage busy or failing (5xx), other | 5 to 7 |
/// | no answer in time, the deadline | 10 to 14 |
pub fn retry_after(failure: Option<&leasegate::Error>, jitter: u32) -> u64 {
    use leasegate::TransportErrorKind as K;
    let base = match failure {
        Some(leasegate::Error::Token(_)) => 5,
        Some(leasegate::Error::Storage(s)) => match s.retry_after {
            Some(d) => d.as_secs().max(1),
            None => 5,
        },
        Some(leasegate::Error::Transport(t)) => match t.kind {
            K::Connect => 2,
            K::Timeout => 10,
            _ => 5,
        },
        Some(_) => 5,
        None => 10,
    };
    let spread = (base / 4).max(1);
    base + u64::from(jitter) % (spread + 1)
}

/// A jitter seed from a fresh (random) lease id.
pub fn jitter_seed(id: leasegate::LeaseId) -> u32 {
    let text = id.to_string();
    u32::from_str_radix(&text[..8], 16).unwrap_or(0)
}

/// `word` as one POSIX shell word: as it is when it holds only safe characters, else in single
/// quotes (a `'` inside written `'\''`).
pub fn shell_word(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-:@%+=,".contains(&b));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn answers_escape_control_format_and_separator_characters() {
        let value =
            json!({ "k\u{202e}": "a\u{2028}b\u{200b}c\u{7f}d\u{85}e\u{1}f\u{e0001}g \u{e9}" });
        let answer = super::json(leasegate::StatusCode::OK, &value);
        let text = String::from_utf8(answer.into_body()).unwrap();
        assert_eq!(
            text,
            r#"{"k\u202e":"a\u2028b\u200bc\u007fd\u0085e\u0001f\udb40\udc01g \u00e9"}"#
                .replace("\\u00e9", "\u{e9}")
        );
        // It reads back as the same value.
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
            value
        );
    }
    use super::number;
    use serde_json::json;

    #[test]
    fn retry_after_grows_with_the_failure() {
        use leasegate::{TransportError, TransportErrorKind as K};
        let t = |k| leasegate::Error::Transport(TransportError::new(k, "x"));
        for jitter in [0, 1, 2, 3, 7, 1000, u32::MAX] {
            let refused = super::retry_after(Some(&t(K::Connect)), jitter);
            let timeout = super::retry_after(Some(&t(K::Timeout)), jitter);
            assert!((2..=3).contains(&refused), "{refused}");
            assert!((10..=14).contains(&timeout), "{timeout}");
            assert!((10..=14).contains(&super::retry_after(None, jitter)));
        }
        let busy = leasegate::Error::Storage(leasegate::StorageError {
            status: leasegate::StatusCode::SERVICE_UNAVAILABLE,
            code: Some("ServerBusy".into()),
            request_id: None,
            class: leasegate::ErrorClass::classify(
                leasegate::StatusCode::SERVICE_UNAVAILABLE,
                None,
            ),
            retry_after: Some(std::time::Duration::from_secs(30)),
        });
        let waits: Vec<u64> = (0..20)
            .map(|j| super::retry_after(Some(&busy), j))
            .collect();
        assert!(waits.iter().all(|w| (30..=37).contains(w)), "{waits:?}");
        assert!(waits.iter().any(|&w| w != waits[0]), "jittered: {waits:?}");
    }

    #[test]
    fn shell_words() {
        assert_eq!(super::shell_word("gates/a-b_1.2"), "gates/a-b_1.2");
        assert_eq!(super::shell_word("gates/bad key"), "'gates/bad key'");
        assert_eq!(super::shell_word("it's"), "'it'\\''s'");
    }

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
        assert_eq!(number(f64::INFINITY), "NaN");
        // The exponent form (`1e300`, or `1e+300` by serde_json's version), not 301 digits.
        assert!(number(1e300).len() <= 6, "{}", number(1e300));
        assert!(number(-1e-300).len() <= 8, "{}", number(-1e-300));
        for x in [
            1e-7,
            123456.789,
            1e21,
            -273.15,
            1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
        ] {
            assert_eq!(number(x).parse::<f64>().unwrap(), x);
        }
    }
}
