//! "Run this at most once per key per window" ([`once_per_window`]) and "run this once, ever"
//! ([`once_ever`], an initialization), across every deployment of an app, each handing the
//! work a fencing token and returning an outcome value ([`Once`], [`Ever`]) that [`answer`] /
//! [`answer_ever`] turn into HTTP answers in one place.
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
//! that lost, whichever way the race fell: `busy` while the work may still be running
//! elsewhere (come back when it has settled: it may fail and give the lock back), `throttled`
//! once it is done (the holder marks the lock when its work returns `Ok`: come back when the
//! window ends).
//!
//! Every call writes one JSON log line (see [`crate::Decision`]): the key, the decision, the
//! fencing token, the storage requests and the time taken.
//!
//! Round trips: a refused call 1 (a HEAD); the call that runs 2 for a record (HEAD and
//! compare-and-swap) or 3 for a native lease, plus its work, plus 1 for the done mark (or 1
//! when failed work gives the lock back: each a request at the ETag the call's own last write
//! left, no HEAD first).
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

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{Acquire, Holder, IdOrigin, LockStatus, Locks, Release, Term};
use leasegate::ops::Metadata;
use leasegate::{Error, LockName, Request, Response, StatusCode, Transport};
use percent_encoding::percent_decode_str;
use serde::Serialize;

use crate::{log_verb, web, Context};

/// How long after another holder took the lock its work may still be running (and may still
/// fail and give the lock back): a call refused within this time is [`Once::Busy`], later
/// [`Once::Throttled`]. Keep the work (with `storage_timeout_ms`) well under it: a work that
/// fails later than this gives the lock back after callers were told to wait out the window.
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
    /// The work ran this window: another call's work is done (it marked the lock), or that
    /// call took the lock more than [`RUNNING_FOR`] ago.
    Throttled {
        /// When the window ends (whole seconds, at least 1).
        retry_after: Duration,
    },
    /// Another call took the lock less than [`RUNNING_FOR`] ago and has not marked its work
    /// done: its work may still be running (and give the lock back if it fails).
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
    let started = Instant::now();
    let counted = locks.counting();
    let outcome = run_once_per_window(ctx, &counted, key, window, work).await;
    let (decision, fencing_token) = match &outcome {
        Ok(Once::Ran { fencing_token, .. }) => ("ran", Some(*fencing_token)),
        Ok(Once::Failed { fencing_token, .. }) => ("failed", Some(*fencing_token)),
        Ok(Once::Throttled { .. }) => ("throttled", None),
        Ok(Once::Busy { .. }) => ("busy", None),
        Err(Error::InvalidArgument(_)) => ("invalid_window", None),
        Err(e) => (web::storage_error_code(e), None),
    };
    log_verb(
        ctx.log_decisions,
        "once_per_window",
        key.as_str(),
        None,
        (decision, fencing_token),
        counted.transport().sent(),
        started,
    );
    outcome
}

async fn run_once_per_window<C, L, R, E>(
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
        Acquire::Acquired(mut held) => {
            let fencing_token = held.fencing_token.unwrap_or(0);
            match work(fencing_token).await {
                Ok(output) => {
                    // Tells later callers the work is done, so that they are told to come back
                    // when the window ends rather than when the work may have settled. Best
                    // effort: without it they are told [`Once::Busy`] for up to RUNNING_FOR.
                    let mut done = Metadata::new();
                    done.insert(RAN_TOKEN.into(), fencing_token.to_string());
                    let _ = locks.set_marks_held(key, &mut held, &done, ctx.now).await;
                    Ok(Once::Ran {
                        fencing_token,
                        expires_at: held.expires_at,
                        output,
                    })
                }
                Err(error) => {
                    // Given back so that a retry runs the work; a give-back storage refused is
                    // asked once more (releasing our own id twice is harmless), since a lock
                    // left taken blocks the key for the rest of the window.
                    let mut released = false;
                    for _ in 0..2 {
                        match locks.release_held(key, &held, ctx.now).await {
                            Ok(r) => {
                                released = r == Release::Released;
                                break;
                            }
                            Err(_) => continue,
                        }
                    }
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

/// The lock blob's mark of a window whose work is done: the fencing token of the holder
/// whose work returned `Ok` (a mark outlives its tenure; the token ties it to one).
pub const RAN_TOKEN: &str = "ran_token";

/// What became of one call of [`once_ever`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ever<R, E> {
    /// This call ran the work (it returned `Ok(output)`) and marked the key done: no call runs
    /// it again.
    Ran {
        /// The fencing token the work was handed.
        fencing_token: u64,
        /// What the work returned.
        output: R,
    },
    /// The work was done before (by this deployment or another): nothing ran.
    Done,
    /// Another call is running the work now.
    Busy {
        /// When that call's lock runs out (whole seconds, at least 1); 1 when its claim does not
        /// say (an infinite lease, or a moment after its grant, before its claim is written):
        /// asking again then learns it.
        retry_after: Duration,
        /// Who runs it, as its claim says (the label it took the lock with, empty when it gave
        /// none); `None` when storage refused the lock before its claim could be read.
        holder: Option<String>,
    },
    /// The work returned `Err(error)` (it did not happen): the lock was let go (`released`),
    /// and the next call runs it.
    Failed {
        /// The fencing token the work was handed.
        fencing_token: u64,
        /// What the work returned.
        error: E,
        /// Whether the lock was let go (`false`: the next call runs it once the lease runs out).
        released: bool,
    },
    /// The work ran (it returned `Ok(output)`) but the done mark could not be written (the
    /// lock ran out under it, or storage failed): the next call runs it again, with a larger
    /// fencing token.
    Unmarked {
        /// The fencing token the work was handed.
        fencing_token: u64,
        /// What the work returned.
        output: R,
        /// Why the mark is missing.
        reason: String,
        /// What storage answered when the mark failed (`None`: the lock ran out under the
        /// work, and the mark was refused).
        storage_error: Option<String>,
    },
}

/// How soon to ask again about a key whose holder's expiry is not known.
const ASK_AGAIN: Duration = Duration::from_secs(1);

/// The mark of a key whose work is done (`progress=done`, as the init-once function writes it).
const DONE: (&str, &str) = ("progress", "done");

/// Runs `work` once for `key`, ever, among every caller of `locks` ("run this initialization
/// once"), handing it the lock's fencing token. One call at a time runs it, holding the key's
/// lock for `lease` (whole seconds, up to a year: the longest the work may take), and marks the
/// key done on the lock blob when the work returns `Ok`; whatever came of it, the lock is let
/// go, so a failed run is run again by the next call rather than held up until the lease runs
/// out.
///
/// Round trips: 1 when done or running (a HEAD); 4 or 5 when this call runs it (the HEAD; the
/// acquire from that read, 1 for a record or 2 for a native lease; the mark; the release), one
/// more for a key never used (its lock blob is created). `Err` is a storage failure before the work
/// ran, or a `lease` out of range.
pub async fn once_ever<C, L, R, E>(
    ctx: &Context<'_, C>,
    locks: &Locks<L>,
    key: &LockName,
    lease: Duration,
    work: impl AsyncFnOnce(u64) -> Result<R, E>,
) -> Result<Ever<R, E>, Error>
where
    L: Transport,
{
    once_ever_as(ctx, locks, key, lease, "", &Metadata::new(), work).await
}

/// [`once_ever`], with a label in the lock's claim that says who runs the work to other callers
/// ([`Ever::Busy`]'s `holder`: an instance id, at most [`leasegate::lease::MAX_LABEL_BYTES`]
/// printable ASCII characters), and `marks` written on the lock blob with the done mark (who
/// did it, a version: names of lowercase letters, digits and `_`).
pub async fn once_ever_as<C, L, R, E>(
    ctx: &Context<'_, C>,
    locks: &Locks<L>,
    key: &LockName,
    lease: Duration,
    holder: &str,
    marks: &Metadata,
    work: impl AsyncFnOnce(u64) -> Result<R, E>,
) -> Result<Ever<R, E>, Error>
where
    L: Transport,
{
    let started = Instant::now();
    let counted = locks.counting();
    let outcome = run_once_ever(ctx, &counted, key, lease, holder, marks, work).await;
    let (decision, fencing_token) = match &outcome {
        Ok(Ever::Ran { fencing_token, .. }) => ("ran", Some(*fencing_token)),
        Ok(Ever::Done) => ("done", None),
        Ok(Ever::Busy { .. }) => ("busy", None),
        Ok(Ever::Failed { fencing_token, .. }) => ("failed", Some(*fencing_token)),
        Ok(Ever::Unmarked { fencing_token, .. }) => ("not_marked_done", Some(*fencing_token)),
        Err(Error::InvalidArgument(_)) => ("invalid_window", None),
        Err(e) => (web::storage_error_code(e), None),
    };
    log_verb(
        ctx.log_decisions,
        "once_ever",
        key.as_str(),
        (!holder.is_empty()).then_some(holder),
        (decision, fencing_token),
        counted.transport().sent(),
        started,
    );
    outcome
}

async fn run_once_ever<C, L, R, E>(
    ctx: &Context<'_, C>,
    locks: &Locks<L>,
    key: &LockName,
    lease: Duration,
    holder: &str,
    marks: &Metadata,
    work: impl AsyncFnOnce(u64) -> Result<R, E>,
) -> Result<Ever<R, E>, Error>
where
    L: Transport,
{
    let term = Term::for_window(lease)?;
    let is_done = |marks: &Metadata| marks.get(DONE.0).map(String::as_str) == Some(DONE.1);
    let info = locks.inspect(key, ctx.now).await?;
    if is_done(&info.marks) {
        return Ok(Ever::Done);
    }
    if let LockStatus::Held {
        expires_at, label, ..
    } = info.status
    {
        let left = expires_at
            .zip(info.server_date)
            .and_then(|(end, now)| end.duration_since(now).ok());
        return Ok(Ever::Busy {
            retry_after: left.unwrap_or(ASK_AGAIN).max(ASK_AGAIN),
            holder: Some(label),
        });
    }
    let id = (ctx.new_lease_id)();
    // From the read just made: no HEAD of its own.
    let mut held = match locks
        .acquire_after(&info, key, term, id, IdOrigin::Fresh, holder, ctx.now)
        .await?
    {
        Acquire::Acquired(held) => held,
        Acquire::Busy {
            retry_after,
            holder,
            ..
        } => {
            return Ok(Ever::Busy {
                retry_after: retry_after.unwrap_or(ASK_AGAIN).max(ASK_AGAIN),
                holder: holder.map(|h| h.label),
            })
        }
    };
    let fencing_token = held.fencing_token.unwrap_or(0);
    let outcome = if is_done(&held.marks) {
        // Done between the read and the grant.
        Ever::Done
    } else {
        match work(fencing_token).await {
            Err(error) => Ever::Failed {
                fencing_token,
                error,
                released: false,
            },
            Ok(output) => {
                let mut marks = marks.clone();
                marks.insert(DONE.0.into(), DONE.1.into());
                marks.insert("done_token".into(), fencing_token.to_string());
                match locks.set_marks_held(key, &mut held, &marks, ctx.now).await {
                    Ok(true) => Ever::Ran {
                        fencing_token,
                        output,
                    },
                    Ok(false) => Ever::Unmarked {
                        fencing_token,
                        output,
                        reason: "the lock ran out before the work was marked done".into(),
                        storage_error: None,
                    },
                    Err(e) => Ever::Unmarked {
                        fencing_token,
                        output,
                        reason: web::storage_failed(&e, "the work was not marked done"),
                        storage_error: Some(e.to_string()),
                    },
                }
            }
        }
    };
    // Best effort: a lock not let go runs out at the end of its lease.
    let let_go = matches!(
        locks.release_held(key, &held, ctx.now).await,
        Ok(Release::Released)
    );
    Ok(match outcome {
        Ever::Failed {
            fencing_token,
            error,
            ..
        } => Ever::Failed {
            fencing_token,
            error,
            released: let_go,
        },
        other => other,
    })
}

/// A refusal: throttled once the holder marked its work done; otherwise busy while the
/// holder's tenure is younger than [`RUNNING_FOR`], throttled after.
fn refused<R, E>(
    window: Duration,
    retry_after: Option<Duration>,
    holder: Option<&Holder>,
) -> Once<R, E> {
    let second = Duration::from_secs(1);
    let left = retry_after.unwrap_or(window).max(second);
    // The holder's work is done (it marked the lock with its own token): the rest of the
    // window.
    let token = |h: &Holder| h.token.to_string();
    if holder.is_some_and(|h| h.marks.get(RAN_TOKEN) == Some(&token(h))) {
        return Once::Throttled { retry_after: left };
    }
    // A holder with no expiry (an infinite lease) may be at work however long it has held the
    // key: its age tells nothing, so it is busy.
    let age = holder
        .filter(|h| h.expires_at.is_some())
        .and_then(|h| h.held_for);
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

/// A side effect for [`once_per_window`]'s work: POSTs `body` as JSON to `url` with an
/// `Idempotency-Key`, through `transport` (its timeout applies). `Ok` is the receiver's 2xx
/// status; `Err` says why not (an unusable URL, another status, no answer), naming no secret.
///
/// `Err` makes [`once_per_window`] give its lock back, so a retry calls again: a receiver
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

/// The HTTP answer for an outcome of [`once_ever`] on `key`, alike [`answer`]'s:
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::{HashMap, VecDeque};

    use leasegate::{Account, ContainerName, LeaseId, Method, TransportError};

    /// The storage server's clock in every scripted answer.
    pub(crate) const SERVER_SECS: u64 = 1_795_096_800;
    /// `SERVER_SECS` as an HTTP date.
    pub(crate) const SERVER_DATE: &str = "Thu, 19 Nov 2026 14:00:00 GMT";
    const HOUR: Duration = Duration::from_secs(3600);

    /// Answers each request with the next scripted response and records what it was sent.
    #[derive(Default)]
    pub(crate) struct Scripted {
        answers: RefCell<VecDeque<Response>>,
        pub(crate) sent: RefCell<Vec<(Method, String)>>,
        /// The metadata headers of each request sent (`x-ms-meta-*`).
        pub(crate) metadata: RefCell<Vec<Vec<(String, String)>>>,
        /// The `If-Match` of each request sent.
        pub(crate) if_match: RefCell<Vec<Option<String>>>,
    }

    impl Scripted {
        pub(crate) fn new(answers: Vec<Response>) -> Self {
            Scripted {
                answers: RefCell::new(answers.into()),
                sent: RefCell::default(),
                metadata: RefCell::default(),
                if_match: RefCell::default(),
            }
        }
    }

    impl Transport for Scripted {
        async fn send(&self, request: Request) -> Result<Response, TransportError> {
            self.sent
                .borrow_mut()
                .push((request.method().clone(), request.uri().to_string()));
            self.if_match
                .borrow_mut()
                .push(request.headers().get("if-match").map(str::to_string));
            self.metadata.borrow_mut().push(
                request
                    .headers()
                    .iter()
                    .filter(|(n, _)| n.starts_with("x-ms-meta-"))
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
            );
            Ok(self
                .answers
                .borrow_mut()
                .pop_front()
                .unwrap_or_else(|| panic!("no scripted answer left for {request:?}")))
        }
    }

    pub(crate) fn reply(status: u16) -> Response {
        Response::new(StatusCode::from_u16(status).unwrap()).with_header("date", SERVER_DATE)
    }

    /// A HEAD of an existing, unleased lock blob with this record (if any).
    pub(crate) fn head(record: Option<(LeaseId, u64)>) -> Response {
        head_marked(record, false)
    }

    /// [`head`], with the done mark when `done`.
    fn head_marked(record: Option<(LeaseId, u64)>, done: bool) -> Response {
        let mut r = reply(200)
            .with_header("etag", "\"e1\"")
            .with_header("x-ms-lease-state", "available")
            .with_header("x-ms-blob-type", "PageBlob")
            .with_header("content-length", "0");
        if let Some((holder, since)) = record {
            for (k, v) in [
                ("holder", holder.to_string()),
                ("term", "record".into()),
                ("since", since.to_string()),
                ("expires", (since + 3600).to_string()),
                ("token", (7u64 << 16).to_string()),
                ("label", String::new()),
            ] {
                r = r.with_header(&format!("x-ms-meta-leasegate_{k}"), v);
            }
        }
        if done {
            r = r.with_header("x-ms-meta-progress", "done");
        }
        r
    }

    pub(crate) fn written() -> Response {
        reply(200).with_header("etag", "\"e2\"")
    }

    pub(crate) fn me() -> LeaseId {
        LeaseId::from_random_bytes([1; 16])
    }

    pub(crate) fn other() -> LeaseId {
        LeaseId::from_random_bytes([2; 16])
    }

    /// Runs `once_per_window` on "order-1" for an hour against `script`, with work that
    /// returns `result` and records the token it was handed.
    fn run(
        script: Vec<Response>,
        result: Result<&'static str, &'static str>,
    ) -> (
        Result<Once<&'static str, &'static str>, Error>,
        Option<u64>,
        Scripted,
    ) {
        let transport = Scripted::new(script);
        let locks = Locks::new(
            &transport,
            Account::from_connection_string("UseDevelopmentStorage=true").unwrap(),
            ContainerName::try_new("leasegate").unwrap(),
        )
        .with_prefix("orders/");
        let variables = HashMap::new();
        let ctx = Context {
            connect: &|_| (),
            variables: &variables,
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(SERVER_SECS),
            new_lease_id: &me,
            sleep: &|_| Box::pin(async {}),
            cache: &crate::cache::NoCache,
            log_decisions: false,
        };
        let handed = RefCell::new(None);
        let outcome = pollster::block_on(once_per_window(
            &ctx,
            &locks,
            &LockName::try_new("order-1").unwrap(),
            HOUR,
            async |token| {
                *handed.borrow_mut() = Some(token);
                result
            },
        ));
        (outcome, handed.into_inner(), transport)
    }

    /// Runs `once_ever` on "init" with an hour's lease against `script`, with work that
    /// returns `result` and records the token it was handed.
    fn run_ever(
        script: Vec<Response>,
        result: Result<&'static str, &'static str>,
    ) -> (
        Result<Ever<&'static str, &'static str>, Error>,
        Option<u64>,
        Scripted,
    ) {
        run_ever_as(script, result, "", &Metadata::new())
    }

    fn run_ever_as(
        script: Vec<Response>,
        result: Result<&'static str, &'static str>,
        holder: &str,
        marks: &Metadata,
    ) -> (
        Result<Ever<&'static str, &'static str>, Error>,
        Option<u64>,
        Scripted,
    ) {
        let transport = Scripted::new(script);
        let locks = Locks::new(
            &transport,
            Account::from_connection_string("UseDevelopmentStorage=true").unwrap(),
            ContainerName::try_new("leasegate").unwrap(),
        );
        let variables = HashMap::new();
        let ctx = Context {
            connect: &|_| (),
            variables: &variables,
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(SERVER_SECS),
            new_lease_id: &me,
            sleep: &|_| Box::pin(async {}),
            cache: &crate::cache::NoCache,
            log_decisions: false,
        };
        let handed = RefCell::new(None);
        let outcome = pollster::block_on(once_ever_as(
            &ctx,
            &locks,
            &LockName::try_new("init").unwrap(),
            HOUR,
            holder,
            marks,
            async |token| {
                *handed.borrow_mut() = Some(token);
                result
            },
        ));
        (outcome, handed.into_inner(), transport)
    }

    #[test]
    fn once_ever_runs_marks_and_lets_go() {
        // The read, the record's compare-and-swap (from that read: no HEAD of its own), the
        // done mark and the release (each at the ETag the last write left: no HEAD).
        let script = vec![head(None), written(), written(), written()];
        let (outcome, handed, t) = run_ever(script, Ok("initialized"));
        let Ok(Ever::Ran {
            fencing_token,
            output,
        }) = outcome
        else {
            panic!("{outcome:?}")
        };
        assert_eq!((handed, output), (Some(fencing_token), "initialized"));
        let sent = t.sent.borrow();
        assert_eq!(sent.len(), 4, "{sent:?}");
        assert_eq!(sent[0].0, Method::HEAD);
        let if_match = t.if_match.borrow();
        assert_eq!(if_match[1].as_deref(), Some("\"e1\""), "{if_match:?}");
        assert_eq!(if_match[2].as_deref(), Some("\"e2\""), "{if_match:?}");
        assert_eq!(if_match[3].as_deref(), Some("\"e2\""), "{if_match:?}");
    }

    /// What init-once needs of the verb: its instance as the holder's label (told to other
    /// callers), its own marks beside the done mark, and why a mark failed.
    #[test]
    fn once_ever_as_labels_the_holder_and_writes_the_marks() {
        let script = vec![head(None), written(), written(), written()];
        let mut marks = Metadata::new();
        marks.insert("done_by".into(), "node-a".into());
        let (outcome, _, t) = run_ever_as(script, Ok("x"), "node-a", &marks);
        assert!(matches!(outcome, Ok(Ever::Ran { .. })), "{outcome:?}");
        let sent = t.metadata.borrow();
        let has = |i: usize, k: &str, v: &str| sent[i].iter().any(|(n, x)| n == k && x == v);
        assert!(
            has(1, "x-ms-meta-leasegate_label", "node-a"),
            "{:?}",
            sent[1]
        );
        assert!(has(2, "x-ms-meta-done_by", "node-a"), "{:?}", sent[2]);
        assert!(has(2, "x-ms-meta-progress", "done"), "{:?}", sent[2]);
        // Another holder's label is told to a caller that finds it running.
        let mut running = head(Some((other(), SERVER_SECS - 100)));
        running
            .headers_mut()
            .insert("x-ms-meta-leasegate_label", "node-b");
        let (outcome, _, _) = run_ever_as(vec![running], Ok("x"), "node-a", &marks);
        let Ok(Ever::Busy { holder, .. }) = outcome else {
            panic!("{outcome:?}")
        };
        assert_eq!(holder.as_deref(), Some("node-b"));
    }

    #[test]
    fn once_ever_does_nothing_once_done_or_while_running() {
        let (outcome, handed, t) = run_ever(vec![head_marked(None, true)], Ok("x"));
        assert_eq!(outcome.unwrap(), Ever::Done);
        assert_eq!((handed, t.sent.borrow().len()), (None, 1));
        let running = head(Some((other(), SERVER_SECS - 100)));
        let (outcome, handed, _) = run_ever(vec![running], Ok("x"));
        assert_eq!(
            outcome.unwrap(),
            Ever::Busy {
                retry_after: Duration::from_secs(3500),
                holder: Some(String::new()),
            }
        );
        assert_eq!(handed, None);
        // Marked done between the read and the grant: the compare-and-swap at the read's ETag
        // is refused, the acquire reads again and takes the lock, and the work is not run.
        let script = vec![
            head(None),
            reply(412).with_header("x-ms-error-code", "ConditionNotMet"),
            head_marked(None, true),
            written(),
            written(),
        ];
        let (outcome, handed, t) = run_ever(script, Ok("x"));
        assert_eq!((outcome.unwrap(), handed), (Ever::Done, None));
        assert_eq!(t.sent.borrow().len(), 5);
    }

    #[test]
    fn once_ever_lets_failed_work_run_again() {
        let script = vec![head(None), written(), written()];
        let (outcome, _, _) = run_ever(script, Err("no"));
        let Ok(Ever::Failed {
            error, released, ..
        }) = outcome
        else {
            panic!("{outcome:?}")
        };
        assert_eq!((error, released), ("no", true));
        let r = answer_ever::<u16, &str>(
            "init",
            Ok(Ever::Failed {
                fencing_token: 1,
                error: "no",
                released: true,
            }),
        );
        assert_eq!(r.status(), 502);
        assert_eq!(
            answer_ever::<u16, &str>("init", Ok(Ever::Done)).status(),
            200
        );
        let busy = answer_ever::<u16, &str>(
            "init",
            Ok(Ever::Busy {
                retry_after: Duration::from_secs(5),
                holder: None,
            }),
        );
        assert_eq!(busy.status(), 429);
        assert_eq!(busy.headers().get("retry-after"), Some("5"));
    }

    #[test]
    fn a_free_key_runs_the_work_with_its_token_and_keeps_the_lock() {
        // The take (HEAD, write), then the done mark (a write at the ETag the take left).
        let script = vec![head(None), written(), written()];
        let (outcome, handed, t) = run(script, Ok("shipped"));
        let Ok(Once::Ran {
            fencing_token,
            expires_at,
            output,
        }) = outcome
        else {
            panic!("{outcome:?}")
        };
        assert_eq!(output, "shipped");
        assert_eq!(handed, Some(fencing_token));
        assert!(fencing_token > 7 << 16, "{fencing_token}");
        assert_eq!(
            expires_at,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(SERVER_SECS + 3600))
        );
        // A HEAD and the record's compare-and-swap, the mark's write; no release.
        let sent = t.sent.borrow();
        assert_eq!(sent.len(), 3, "{sent:?}");
        assert_eq!(sent[0].0, Method::HEAD);
        assert!(sent[0].1.contains("/leasegate/orders/order-1"), "{sent:?}");
        assert_eq!(sent[1].0, Method::PUT);
        assert_eq!(sent[2].0, Method::PUT);
        assert_eq!(t.if_match.borrow()[2].as_deref(), Some("\"e2\""));
        // The mark names the holder's token, beside the claim it keeps.
        let written = &t.metadata.borrow()[2];
        let mark = ("x-ms-meta-ran_token".to_string(), fencing_token.to_string());
        assert!(written.contains(&mark), "{written:?}");
        assert!(
            written
                .iter()
                .any(|(k, _)| k == "x-ms-meta-leasegate_holder"),
            "{written:?}"
        );
    }

    /// Once the holder's work is done, a caller is told the window's real time left, not to
    /// come back when the work may have settled; a mark left by an earlier holder (another
    /// token) says nothing of this one.
    #[test]
    fn a_key_whose_work_is_done_is_throttled_for_the_rest_of_its_window() {
        let done = |token: u64| {
            head(Some((other(), SERVER_SECS - 10)))
                .with_header("x-ms-meta-ran_token", token.to_string())
        };
        let (outcome, handed, t) = run(vec![done(7 << 16)], Ok("x"));
        assert_eq!(
            outcome.unwrap(),
            Once::Throttled {
                retry_after: Duration::from_secs(3590)
            }
        );
        assert_eq!(handed, None);
        assert_eq!(t.sent.borrow().len(), 1);
        let (outcome, _, _) = run(vec![done(6 << 16)], Ok("x"));
        assert_eq!(
            outcome.unwrap(),
            Once::Busy {
                retry_after: Duration::from_secs(50)
            }
        );
    }

    #[test]
    fn a_key_taken_a_moment_ago_is_busy_and_the_work_does_not_run() {
        let (outcome, handed, t) = run(vec![head(Some((other(), SERVER_SECS - 10)))], Ok("x"));
        assert_eq!(
            outcome.unwrap(),
            Once::Busy {
                retry_after: Duration::from_secs(50)
            }
        );
        assert_eq!(handed, None);
        assert_eq!(t.sent.borrow().len(), 1);
    }

    #[test]
    fn a_key_taken_long_ago_is_throttled_for_the_rest_of_its_window() {
        let (outcome, handed, _) = run(vec![head(Some((other(), SERVER_SECS - 600)))], Ok("x"));
        assert_eq!(
            outcome.unwrap(),
            Once::Throttled {
                retry_after: Duration::from_secs(3000)
            }
        );
        assert_eq!(handed, None);
    }

    /// A holder with no expiry (an infinite lease taken by an operator): how long it has held
    /// the key says nothing of whether it is at work, so the answer stays `busy`, as before
    /// the holder's age came from the core.
    #[test]
    fn an_infinite_holder_keeps_a_key_busy() {
        let infinite = reply(200)
            .with_header("etag", "\"e1\"")
            .with_header("x-ms-lease-state", "leased")
            .with_header("x-ms-blob-type", "PageBlob")
            .with_header("content-length", "0")
            .with_header("x-ms-meta-leasegate_holder", other().to_string())
            .with_header("x-ms-meta-leasegate_term", "-1")
            .with_header("x-ms-meta-leasegate_since", (SERVER_SECS - 100).to_string())
            .with_header("x-ms-meta-leasegate_expires", "0")
            .with_header("x-ms-meta-leasegate_token", (7u64 << 16).to_string())
            .with_header("x-ms-meta-leasegate_label", "cli");
        let (outcome, handed, _) = run(vec![infinite.clone()], Ok("x"));
        assert_eq!(
            outcome.unwrap(),
            Once::Busy {
                retry_after: RUNNING_FOR
            }
        );
        assert_eq!(handed, None);
        // once_ever: the holder's expiry unknown, so ask again in a second (init-once's answer).
        let (outcome, _, _) = run_ever(vec![infinite], Ok("x"));
        assert_eq!(
            outcome.unwrap(),
            Ever::Busy {
                retry_after: Duration::from_secs(1),
                holder: Some("cli".into()),
            }
        );
    }

    #[test]
    fn failed_work_gives_the_lock_back() {
        // Take (HEAD, write), the work fails, release (clear the record at the ETag the take
        // left).
        let script = vec![head(None), written(), written()];
        let (outcome, handed, t) = run(script, Err("the webhook answered 503"));
        let Ok(Once::Failed {
            fencing_token,
            error,
            released,
        }) = outcome
        else {
            panic!("{outcome:?}")
        };
        assert_eq!(handed, Some(fencing_token));
        assert_eq!(error, "the webhook answered 503");
        assert!(released);
        assert_eq!(t.sent.borrow().len(), 3);
    }

    #[test]
    fn a_storage_failure_is_an_error_and_runs_nothing() {
        let failing = reply(503).with_header("x-ms-error-code", "ServerBusy");
        let (outcome, handed, _) = run(vec![failing], Ok("x"));
        assert!(outcome.is_err(), "{outcome:?}");
        assert_eq!(handed, None);
    }

    fn body(r: &Response) -> serde_json::Value {
        serde_json::from_slice(r.body()).unwrap()
    }

    #[test]
    fn outcomes_are_answered_in_one_place() {
        let ran: Result<Once<u16, String>, Error> = Ok(Once::Ran {
            fencing_token: 42,
            expires_at: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(SERVER_SECS)),
            output: 204,
        });
        let r = answer_of("order-1", ran);
        assert_eq!(r.status(), 200);
        assert_eq!(
            body(&r),
            serde_json::json!({
                "key": "order-1", "outcome": "ran", "fencingToken": 42,
                "expiresAt": "2026-11-19T14:00:00Z", "output": 204,
            })
        );
        // Whichever way the race fell, the loser gets 429 with Retry-After.
        for (once, name, secs) in [
            (
                Once::Busy {
                    retry_after: Duration::from_millis(1500),
                },
                "busy",
                2,
            ),
            (
                Once::Throttled {
                    retry_after: Duration::from_secs(3000),
                },
                "throttled",
                3000,
            ),
        ] {
            let r = answer_of::<u16, String>("order-1", Ok(once));
            assert_eq!(r.status(), 429);
            assert_eq!(
                r.headers().get("retry-after"),
                Some(secs.to_string().as_str())
            );
            assert_eq!(
                body(&r),
                serde_json::json!({"key": "order-1", "outcome": name, "retryAfterSeconds": secs})
            );
        }
        let failed: Result<Once<u16, String>, Error> = Ok(Once::Failed {
            fencing_token: 42,
            error: "the webhook answered 503".into(),
            released: true,
        });
        let r = answer_of("order-1", failed);
        assert_eq!(r.status(), 502);
        assert_eq!(body(&r)["error"], "work_failed");
        assert_eq!(body(&r)["released"], true);
        let r = answer_of::<u16, String>(
            "order-1",
            Err(Term::for_window(Duration::ZERO).unwrap_err()),
        );
        assert_eq!(r.status(), 500);
        assert_eq!(body(&r)["error"], "invalid_window");
    }

    fn answer_of<R: Serialize, E: std::fmt::Display>(
        key: &str,
        outcome: Result<Once<R, E>, Error>,
    ) -> Response {
        answer(key, outcome)
    }

    #[test]
    fn keys_are_checked() {
        assert_eq!(key("order%2D1").unwrap().as_str(), "order-1");
        for bad in ["", "..", "%ff", "a%00b", &"k".repeat(300)] {
            let r = key(bad).unwrap_err();
            assert_eq!(r.status(), 400, "{bad}");
            assert_eq!(body(&r)["error"], "invalid_key");
        }
        let path = |p: &str| Request::new(Method::POST, format!("http://h{p}"));
        let k = key_in_path(&path("/api/orders/a%2Fb/ship"), "/api/orders/", "/ship");
        assert_eq!(k.unwrap().as_str(), "a/b");
        for (p, status) in [
            ("/api/orders//ship", 400),
            ("/api/orders/../ship", 400),
            ("/api/orders/x", 404),
            ("/api/other/x/ship", 404),
        ] {
            let r = key_in_path(&path(p), "/api/orders/", "/ship").unwrap_err();
            assert_eq!(r.status(), status, "{p}");
        }
    }

    #[test]
    fn post_json_is_ok_only_for_a_2xx() {
        let t = Scripted::new(vec![reply(204), reply(503)]);
        let body = serde_json::json!({ "order": "order-1", "fencingToken": 9 });
        let url = "http://127.0.0.1:3001/ship";
        assert_eq!(
            pollster::block_on(post_json(&t, url, "order-1/9", &body)),
            Ok(204)
        );
        let refused = pollster::block_on(post_json(&t, url, "order-1/9", &body));
        assert_eq!(refused, Err("the webhook answered 503".into()));
        let unusable = pollster::block_on(post_json(&t, "ftp://x", "k", &body));
        assert!(unusable.unwrap_err().contains("not an absolute"));
        assert_eq!(t.sent.borrow().len(), 2);
    }
}
