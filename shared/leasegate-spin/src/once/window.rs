//! [`once_per_window`](super::once_per_window): at most once per key per window.

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{Acquire, Acquiring, Holder, IdOrigin, Locks, Release, Start, Term};
use leasegate::ops::Metadata;
use leasegate::{Error, LockName, Transport};

use crate::{log_verb, web, Context};

/// How long after another holder took the lock its work may still be running (and may still
/// fail and give the lock back): a call refused within this time is [`Once::Busy`], later
/// [`Once::Throttled`]. Keep the work (with `storage_timeout_ms`) well under it: a work that
/// fails later than this gives the lock back after callers were told to wait out the window.
pub const RUNNING_FOR: Duration = Duration::from_secs(60);

/// The lock blob's mark of a window whose work is done: the fencing token of the holder
/// whose work returned `Ok` (a mark outlives its tenure; the token ties it to one).
pub const RAN_TOKEN: &str = "ran_token";

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
/// token. See the [module](super) for the rules; `window` is whole seconds from 1 to a year.
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
        .acquire(
            key,
            Acquiring::new(term, id).origin(IdOrigin::Fresh),
            ctx.now,
        )
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
                        let from = Start::Acquired(&held);
                        match locks.release(key, held.lease_id, from, ctx.now).await {
                            Ok((r, _)) => {
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
