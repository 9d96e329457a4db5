//! A caller's run: its steps in order, each a call of the core's [`Locks`] (acquire, extend,
//! release) or a write or read of what a holder keeps, with what it saw noted for the checks.

use std::time::{Duration, SystemTime};

use leasegate::lease::{Acquire, Acquired, Acquiring, HeldState, IdOrigin, Locks, Release, Start};
use leasegate::ops::{GetBlob, PutBlob};
use leasegate::{Account, BlobName, ContainerName, LeaseId, LockName};

use super::{Caller, LeaseProtocol, Note, Step, CONTAINER, KEPT_BLOB, START};
use crate::world::{Io, CONNECTION_STRING};

fn at(secs: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64)
}

pub(super) fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What every step of caller `i` calls with: its own [`Locks`] over its network, the lock, its
/// clock's time, how many times it asks.
struct Calls<'a> {
    i: usize,
    caller: &'a Caller,
    io: &'a Io<Note>,
    locks: Locks<Io<Note>>,
    lock: LockName,
    now: SystemTime,
    tries: usize,
    label: &'static str,
}

pub(super) async fn run_caller(i: usize, caller: Caller, io: Io<Note>) {
    let account = Account::from_connection_string(CONNECTION_STRING).expect("a valid account");
    let locks = Locks::new(
        io.clone(),
        account,
        ContainerName::try_new(CONTAINER).expect("a valid name"),
    );
    let lock = LockName::try_new("l").expect("a valid name");
    let now = at(START as i64 + caller.skew);
    // The holder's last grant: its release goes at the ETag that grant left (`Start::Acquired`).
    let mut held: Option<Acquired> = None;
    let tries = if caller.prober { 4 } else { 1 };
    let label = if caller.labelled { caller.name } else { "" };
    let calls = Calls {
        i,
        caller: &caller,
        io: &io,
        locks,
        lock,
        now,
        tries,
        label,
    };
    for (k, step) in caller.steps.iter().enumerate() {
        match step {
            Step::Acquire | Step::Extend | Step::AcquireKept => {
                acquire(&calls, *step, k, &mut held).await;
            }
            Step::Wait => io.sleep(1).await,
            Step::Publish => {
                let Some(state) = held.as_ref().and_then(Acquired::held_state) else {
                    continue;
                };
                publish(&calls, &state).await;
            }
            Step::Release => {
                let Some(h) = held.take() else { continue };
                release(&calls, h).await;
            }
            Step::ReleasePublish => {
                let Some(h) = held.take() else { continue };
                release_publish(&calls, h).await;
            }
        }
    }
}

/// [`Step::Acquire`], [`Step::Extend`] or [`Step::AcquireKept`] (step `k`): asks up to
/// `tries` times, and keeps the grant in `held`.
async fn acquire(calls: &Calls<'_>, step: Step, k: usize, held: &mut Option<Acquired>) {
    let (caller, io) = (calls.caller, calls.io);
    for attempt in 0..calls.tries {
        let kept = match step {
            Step::Extend => held.as_ref().and_then(|h| Some((h, h.held_state()?))),
            _ => None,
        };
        // The state another holder published, and the read's `Date`.
        let published = match step {
            Step::AcquireKept => match read_kept(&calls.locks, calls.now).await {
                Ok(found) => found,
                Err(_) => {
                    io.note(Note::Busy);
                    continue;
                }
            },
            _ => None,
        };
        let id = match (caller.origin, &kept) {
            (_, Some((h, _))) => h.lease_id,
            (IdOrigin::Fresh, None) => LeaseProtocol::fresh_id(calls.i, k, attempt),
            (IdOrigin::Known, None) => held
                .as_ref()
                .map_or(LeaseProtocol::known_id(calls.i), |h| h.lease_id),
        };
        let faults = io.faults_seen();
        let kept_state = kept.as_ref().map(|(_, state)| state);
        match ask(calls, id, kept_state, &published).await {
            Ok(Acquire::Acquired(a)) => {
                io.note(Note::Granted {
                    id: a.lease_id.to_string(),
                    token: a.fencing_token.unwrap_or(0),
                    recorded: None,
                    from: unix(a.server_date),
                    until: a.expires_at.map(unix),
                    extended: a.extended,
                });
                *held = Some(a);
                break;
            }
            Ok(Acquire::Busy { retry_after, .. }) => {
                io.note(Note::Busy);
                if caller.prober && attempt + 1 < calls.tries {
                    let wait = retry_after.map_or(15, |d| d.as_secs()).clamp(1, 60);
                    io.sleep(wait).await;
                }
            }
            Err(_) => {
                io.note(Note::Failed {
                    id: id.to_string(),
                    fresh: caller.origin == IdOrigin::Fresh,
                    faults: io.faults_seen() - faults,
                    held: false,
                    in_flight: false,
                });
                if caller.prober && attempt + 1 < calls.tries {
                    io.sleep(1).await;
                }
            }
        }
    }
}

/// One acquire with `id`: from the state the caller kept of its last grant (`kept`), else from
/// the state another holder published (`published`, with the read's `Date`), else from a read.
async fn ask(
    calls: &Calls<'_>,
    id: LeaseId,
    kept: Option<&HeldState>,
    published: &Option<(HeldState, SystemTime)>,
) -> Result<Acquire, leasegate::Error> {
    let caller = calls.caller;
    let term = caller.window.term();
    match (kept, published) {
        (Some(state), _) => {
            let how = Acquiring::new(term, id)
                .label(calls.label)
                .start(Start::Held(state));
            calls.locks.acquire(&calls.lock, how, calls.now).await
        }
        // (Nothing published: from a read.)
        (None, published) => {
            let start = published
                .as_ref()
                .map_or(Start::Read, |(state, date)| Start::Kept(state, *date));
            let how = Acquiring::new(term, id)
                .origin(caller.origin)
                .label(calls.label)
                .start(start);
            calls.locks.acquire(&calls.lock, how, calls.now).await
        }
    }
}

/// Writes `state` to [`KEPT_BLOB`], for every caller to read ([`Step::Publish`], and
/// [`Step::ReleasePublish`]'s second half); its answer is not looked at.
async fn publish(calls: &Calls<'_>, state: &HeldState) {
    let put = PutBlob::block(
        calls.locks.container().clone(),
        BlobName::try_new(KEPT_BLOB).expect("a valid name"),
        state.to_json().into_bytes(),
    );
    let _ = calls.locks.client().execute(&put, calls.now).await;
}

/// [`Step::Release`]: gives up the grant `h`, at the ETag it left.
async fn release(calls: &Calls<'_>, h: Acquired) {
    let io = calls.io;
    io.note(Note::Releasing {
        id: h.lease_id.to_string(),
    });
    match calls
        .locks
        .release(&calls.lock, h.lease_id, Start::Acquired(&h), calls.now)
        .await
    {
        Ok((Release::Released, _)) => io.note(Note::Released),
        Ok((Release::NotHeld, _)) => io.note(Note::NotHeld),
        Err(_) => io.note(Note::ReleaseFailed),
    }
}

/// [`Step::ReleasePublish`]: gives up the grant `h` as [`Step::Release`] does, then publishes
/// the state its release left, if any.
async fn release_publish(calls: &Calls<'_>, h: Acquired) {
    let io = calls.io;
    io.note(Note::Releasing {
        id: h.lease_id.to_string(),
    });
    let from = Start::Acquired(&h);
    let left = match calls
        .locks
        .release(&calls.lock, h.lease_id, from, calls.now)
        .await
    {
        Ok((released, left)) => {
            io.note(if released == Release::Released {
                Note::Released
            } else {
                Note::NotHeld
            });
            left
        }
        Err(_) => {
            io.note(Note::ReleaseFailed);
            None
        }
    };
    if let Some(state) = left {
        publish(calls, &state).await;
    }
}

/// The state [`Step::Publish`] wrote, if any, and the read's `Date`.
async fn read_kept(
    locks: &Locks<Io<Note>>,
    now: SystemTime,
) -> Result<Option<(HeldState, SystemTime)>, leasegate::Error> {
    let get = GetBlob {
        container: locks.container().clone(),
        blob: BlobName::try_new(KEPT_BLOB).expect("a valid name"),
    };
    let (blob, date) = locks.client().execute(&get, now).await?;
    Ok(blob.and_then(|b| {
        let state = HeldState::from_json(std::str::from_utf8(&b.body).ok()?)?;
        Some((state, date?))
    }))
}
