//! [`once_ever`](super::once_ever): once, ever (an initialization).

use std::time::{Duration, Instant};

use leasegate::lease::{Acquire, Acquiring, IdOrigin, LockStatus, Locks, Release, Start, Term};
use leasegate::ops::Metadata;
use leasegate::{Error, LockName, Transport};

use crate::{log_verb, web, Context};

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
        .acquire(
            key,
            Acquiring::new(term, id)
                .origin(IdOrigin::Fresh)
                .label(holder)
                .start(Start::Seen(&info)),
            ctx.now,
        )
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
        locks
            .release(key, held.lease_id, Start::Acquired(&held), ctx.now)
            .await,
        Ok((Release::Released, _))
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
