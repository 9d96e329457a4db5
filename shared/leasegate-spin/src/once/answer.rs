//! The one place an outcome ([`Once`](super::Once), [`Ever`](super::Ever)) becomes an HTTP answer.

use std::time::Duration;

use leasegate::{Error, Response, StatusCode};
use serde::Serialize;

use crate::web;

use super::{Ever, Once};

/// The JSON body of an answer of [`answer`].
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a, R> {
    key: &'a str,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    fencing_token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<R>,
}

/// The HTTP answer for an outcome of [`once_per_window`](super::once_per_window) on `key`; every verb's outcome is
/// answered here, so that every function answers alike:
///
/// | outcome | status | body |
/// |---|---|---|
/// | [`Once::Ran`] | 200 | `{"key","outcome":"ran","fencingToken","expiresAt","output"}` |
/// | [`Once::Throttled`], [`Once::Busy`] | 429, `Retry-After: N` | `{"key","outcome":"throttled"\|"busy","retryAfterSeconds":N}` |
/// | [`Once::Failed`] | 502 | `{"error":"work_failed","key","message","released"}` |
/// | a storage failure | 503 with `Retry-After` (502 for a refused credential) | see [`web::storage_unavailable`] |
/// | a window out of range | 500 | `{"error":"invalid_window","message"}` |
///
/// The work's error (`E`) is shown to the caller: it must hold no secret.
pub fn answer<R: Serialize, E: std::fmt::Display>(
    key: &str,
    outcome: Result<Once<R, E>, Error>,
) -> Response {
    let body = |outcome| Body {
        key,
        outcome,
        fencing_token: None,
        expires_at: None,
        retry_after_seconds: None,
        output: None::<R>,
    };
    match outcome {
        Ok(Once::Ran {
            fencing_token,
            expires_at,
            output,
        }) => web::json(
            StatusCode::OK,
            &Body {
                fencing_token: Some(fencing_token),
                expires_at: expires_at.map(web::rfc3339),
                output: Some(output),
                ..body("ran")
            },
        ),
        Ok(Once::Throttled { retry_after }) => too_many(body("throttled"), retry_after),
        Ok(Once::Busy { retry_after }) => too_many(body("busy"), retry_after),
        Ok(Once::Failed {
            error, released, ..
        }) => web::json(
            StatusCode::BAD_GATEWAY,
            &serde_json::json!({
                "error": "work_failed",
                "key": key,
                "message": error.to_string(),
                "released": released,
            }),
        ),
        Err(Error::InvalidArgument(message)) => {
            web::error(StatusCode::INTERNAL_SERVER_ERROR, "invalid_window", message)
        }
        Err(e) => web::storage_unavailable(&e),
    }
}

/// The HTTP answer for an outcome of [`once_ever`](super::once_ever) on `key`, alike [`answer`]'s:
///
/// | outcome | status | body |
/// |---|---|---|
/// | [`Ever::Ran`] | 200 | `{"key","outcome":"ran","fencingToken","output"}` |
/// | [`Ever::Done`] | 200 | `{"key","outcome":"done"}` |
/// | [`Ever::Busy`] | 429, `Retry-After: N` | `{"key","outcome":"busy","retryAfterSeconds":N}` |
/// | [`Ever::Failed`] | 502 | `{"error":"work_failed","key","message","released"}` |
/// | [`Ever::Unmarked`] | 502 | `{"error":"not_marked_done","key","message","fencingToken"}` |
/// | a storage failure, a lease out of range | as [`answer`] |
pub fn answer_ever<R: Serialize, E: std::fmt::Display>(
    key: &str,
    outcome: Result<Ever<R, E>, Error>,
) -> Response {
    let once = match outcome {
        Ok(Ever::Ran {
            fencing_token,
            output,
        }) => Once::Ran {
            fencing_token,
            expires_at: None,
            output,
        },
        Ok(Ever::Done) => {
            let body = Body::<R> {
                key,
                outcome: "done",
                fencing_token: None,
                expires_at: None,
                retry_after_seconds: None,
                output: None,
            };
            return web::json(StatusCode::OK, &body);
        }
        Ok(Ever::Busy { retry_after, .. }) => Once::Busy { retry_after },
        Ok(Ever::Failed {
            fencing_token,
            error,
            released,
        }) => Once::Failed {
            fencing_token,
            error,
            released,
        },
        Ok(Ever::Unmarked {
            fencing_token,
            reason,
            ..
        }) => {
            return web::json(
                StatusCode::BAD_GATEWAY,
                &serde_json::json!({
                    "error": "not_marked_done",
                    "key": key,
                    "message": format!("the work ran but {reason}; the next call runs it again"),
                    "fencingToken": fencing_token,
                }),
            )
        }
        Err(e) => return answer::<R, E>(key, Err(e)),
    };
    answer(key, Ok(once))
}

/// 429 with `Retry-After` in whole seconds (rounded up, at least 1).
fn too_many<R: Serialize>(mut body: Body<'_, R>, retry_after: Duration) -> Response {
    let secs = retry_after
        .as_secs()
        .saturating_add(u64::from(retry_after.subsec_nanos() > 0))
        .max(1);
    body.retry_after_seconds = Some(secs);
    let mut r = web::json(StatusCode::TOO_MANY_REQUESTS, &body);
    r.headers_mut().insert("retry-after", secs.to_string());
    r
}
