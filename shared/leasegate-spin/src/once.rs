//! "Run this at most once per key per window", across every deployment of an app.
//!
//! [`once_per_window`] takes the key's lock for the window (a native lease for 15 to 60 s, a
//! lease record for any other length up to a year: [`Term::for_window`]) with a fresh lease
//! id, runs the work with the lock's fencing token, and keeps the lock for the rest of the
//! window: every other call for the key in that window, in this deployment or another, is
//! refused without running anything. Work that fails (returns `Err`) gives the lock back, so
//! a retry can run it; return `Err` only when the work certainly did not happen.
//!
//! The outcome says what happened ([`Once`]), and [`answer`] is the one place that turns it
//! into an HTTP answer: 200 for the call that ran, **429 with `Retry-After`** for every call
//! that lost, whichever way the race fell (the work still running elsewhere, or done already).
//!
//! Round trips: a refused call 1 (a HEAD); the call that runs 2 for a record (HEAD and
//! compare-and-swap) or 3 for a native lease, plus its work, plus 2 more when failed work
//! gives the lock back.
//!
//! # Example
//! ```
//! use std::time::Duration;
//! use leasegate::lease::Locks;
//! use leasegate::{LockName, Response, Transport};
//! use leasegate_spin::once::{self, once_per_window};
//! use leasegate_spin::Context;
//!
//! /// Sends the invoice of `order` at most once an hour, whatever calls us and however often.
//! async fn invoice<T, S: Transport>(ctx: &Context<'_, T>, locks: &Locks<S>, order: &str) -> Response {
//!     let key = match once::key(order) {
//!         Ok(key) => key,
//!         Err(bad_request) => return bad_request,
//!     };
//!     let outcome = once_per_window(ctx, locks, &key, Duration::from_secs(3600), async |fencing_token| {
//!         // The side effect, handed the token: the receiver refuses a token lower than the
//!         // highest it has seen, so a stale holder cannot act after its successor.
//!         Ok::<_, String>(fencing_token)
//!     })
//!     .await;
//!     // 200 {"key","outcome":"ran","fencingToken","output"}, or 429 with Retry-After.
//!     once::answer(key.as_str(), outcome)
//! }
//! ```

use std::time::{Duration, SystemTime};

use leasegate::lease::{Acquire, Holder, IdOrigin, Locks, Release, Term};
use leasegate::{Error, LockName, Response, StatusCode, Transport};
use percent_encoding::percent_decode_str;
use serde::Serialize;

use crate::{web, Context};

/// How long after another holder took the lock its work may still be running (and may still
/// fail and give the lock back): a call refused within this time is [`Once::Busy`], later
/// [`Once::Throttled`].
pub const RUNNING_FOR: Duration = Duration::from_secs(60);

/// What became of one call of [`once_per_window`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Once<R, E> {
    /// This call took the lock and the work ran (and returned `Ok(output)`). The lock is kept
    /// for the rest of the window.
    Ran {
        /// The fencing token the work was handed: larger than every token of the key before.
        fencing_token: u64,
        /// When the window ends, by the storage server's clock.
        expires_at: Option<SystemTime>,
        /// What the work returned.
        output: R,
    },
    /// This call took the lock, the work returned `Err(error)` (it did not happen), and the
    /// lock was given back (`released`, best effort) so that a retry can run it.
    Failed {
        /// The fencing token the work was handed.
        fencing_token: u64,
        /// What the work returned.
        error: E,
        /// Whether the lock was given back (`false`: it runs out at the window's end).
        released: bool,
    },
    /// Another call took the lock more than [`RUNNING_FOR`] ago: the work ran this window.
    Throttled {
        /// When the window ends (whole seconds, at least 1).
        retry_after: Duration,
    },
    /// Another call took the lock a moment ago: its work may still be running (and give the
    /// lock back if it fails).
    Busy {
        /// When to ask again: when the other call's work has settled (whole seconds, at least
        /// 1, at most the window's rest).
        retry_after: Duration,
    },
}

/// Runs `work` at most once per `key` per `window` among every caller of `locks` (every
/// deployment that shares the storage container and prefix), handing it the lock's fencing
/// token. See the [module](self) for the rules; `window` is whole seconds from 1 to a year.
///
/// `Err` is a storage failure (nothing ran; a lock this call may have been granted was given
/// back) or a window out of range.
pub async fn once_per_window<C, L, R, E>(
    ctx: &Context<'_, C>,
    locks: &Locks<L>,
    key: &LockName,
    window: Duration,
    work: impl AsyncFnOnce(u64) -> Result<R, E>,
) -> Result<Once<R, E>, Error>
where
    L: Transport,
{
    let term = Term::for_window(window)?;
    // A fresh id per call: every call is a new event, and a failure that may have granted the
    // lock gives it back.
    let id = (ctx.new_lease_id)();
    match locks
        .acquire_with(key, term, id, IdOrigin::Fresh, "", ctx.now)
        .await?
    {
        Acquire::Busy {
            retry_after,
            holder,
            ..
        } => Ok(refused(window, retry_after, holder.as_ref())),
        Acquire::Acquired(held) => {
            let fencing_token = held.fencing_token.unwrap_or(0);
            match work(fencing_token).await {
                Ok(output) => Ok(Once::Ran {
                    fencing_token,
                    expires_at: held.expires_at,
                    output,
                }),
                Err(error) => {
                    let released = matches!(
                        locks.release(key, held.lease_id, ctx.now).await,
                        Ok(Release::Released)
                    );
                    Ok(Once::Failed {
                        fencing_token,
                        error,
                        released,
                    })
                }
            }
        }
    }
}

/// A refusal: busy while the holder's tenure is younger than [`RUNNING_FOR`], throttled after.
fn refused<R, E>(
    window: Duration,
    retry_after: Option<Duration>,
    holder: Option<&Holder>,
) -> Once<R, E> {
    let second = Duration::from_secs(1);
    let left = retry_after.unwrap_or(window).max(second);
    // The server's clock at the read: the holder's expiry less the time it has left.
    let age = holder.and_then(|h| {
        let server_now = h.expires_at?.checked_sub(retry_after?)?;
        server_now.duration_since(h.since?).ok()
    });
    match age {
        Some(age) if age >= RUNNING_FOR => Once::Throttled { retry_after: left },
        Some(age) => Once::Busy {
            retry_after: (RUNNING_FOR - age).min(left).max(second),
        },
        // A holder that took the lock a moment ago (its claim not written yet).
        None => Once::Busy {
            retry_after: RUNNING_FOR.min(left),
        },
    }
}

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

/// The HTTP answer for an outcome of [`once_per_window`] on `key`; every verb's outcome is
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
