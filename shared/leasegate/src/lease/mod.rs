//! Lease algorithms for stateless callers: acquire (which also extends), release, break,
//! inspect, with fencing tokens, over native blob leases or lease records.
//!
//! Every call takes `now`, used only to date the requests (`x-ms-date`); every expiry is judged
//! by the storage server's `Date` header.
//!
//! # One lock, two ways to hold it
//! A lock is one blob (an empty page blob, created with its container on first use). A caller
//! asks for a [`Term`]:
//! * [`Term::Native`]: a native blob lease of 15 to 60 seconds, or infinite ([`native`]);
//! * [`Term::Record`]: any other whole number of seconds, kept as a lease record in the
//!   blob's metadata, its expiry judged by the server's `Date` ([`record`]).
//!
//! **At no moment do two lease ids hold one lock, whatever term each caller asks for**, first
//! use included. Both protocols begin with one read (`HEAD`) of the lock blob: its lease
//! state, its [claim](claim) and its ETag. Then:
//! * a native taker acquires only when the blob is not leased and holds no live record, and
//!   it acquires with `If-Match` on the ETag it read, so a record written since makes storage
//!   refuse it (412) and it reads again;
//! * a record taker writes its record only when the blob is not leased and holds no live record
//!   of another, with `If-Match` on the ETag it read and without a lease id, so a lease taken
//!   since makes storage refuse it (412 `LeaseIdMissing`), as does another record written since.
//!
//! So a native lease and a live record never coexist, native leases exclude each other (storage
//! grants one lease at a time), and records exclude each other (compare-and-swap). A caller may
//! change its own term while it holds the lock (same lease id): it keeps its token.
//!
//! # Fencing tokens
//! A lost lease does not stop work already running: a paused holder can wake up after its
//! lease ran out. A fencing token is an integer that every new holder of a lock gets strictly
//! larger than every token before it, across both terms and across the lock blob being deleted
//! and created again; a holder that extends its own lock keeps its token ([`claim`] has the
//! rule). The holder passes the token with every write to the protected resource, and the
//! resource refuses a token lower than the highest it has seen (store the highest with the data
//! and compare-and-swap, or keep it in the same transaction). A stale holder then cannot
//! overwrite its successor's work.
//!
//! # Round trips
//! | decision | native lease | lease record |
//! |---|---|---|
//! | busy: someone else holds it (either term) | **1** (HEAD) | **1** (HEAD) |
//! | acquired by a new holder | 3: HEAD, acquire, claim (the token) | 2: HEAD, compare-and-swap |
//! | acquired, [unfenced](Locks::acquire_unfenced) | 2: HEAD, acquire | (always fenced) |
//! | extended by its holder (token kept) | 2: HEAD, acquire | 2: HEAD, compare-and-swap |
//! | first use of a lock | HEAD, create, acquire (+2 to create the container) | HEAD, create |
//! | release | 1 | 3 (the failed native release, HEAD, compare-and-swap) |
//!
//! What the extra requests buy: the HEAD is what lets the two terms share one lock and tells a
//! refused caller how long the holder has left; the claim write is the token.

mod claim;
pub mod native;
pub mod record;

use std::time::{Duration, SystemTime};

use crate::error::ErrorClass;
use crate::names::{BlobName, ContainerName, LockName};
use crate::ops::{
    build, server_date, BlobKind, BlobProperties, Condition, CreateContainer, GetProperties, Lease,
    LeaseAction, Metadata, Operation, PutBlob, WriteOutcome,
};
use crate::types::{unix_secs, ETag, LeaseDuration, LeaseId, LeaseState};
use crate::{Account, Error, Transport};

pub use claim::MAX_TOKEN;
use claim::{Claim, Kind};

/// How many times a step that lost a race (a concurrent create, a compare-and-swap, an ETag
/// that moved) is tried again before giving up.
const MAX_ATTEMPTS: usize = 6;

/// The longest window, in seconds (365 days).
pub const MAX_WINDOW_SECS: u64 = 365 * 24 * 3600;

/// How long a lock is taken for, and so how it is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    /// A native blob lease (15 to 60 s, or infinite).
    Native(LeaseDuration),
    /// A lease record of this many whole seconds (1 to [`MAX_WINDOW_SECS`]).
    Record(Duration),
}

impl Term {
    /// The cheapest term for a window: a native lease for whole seconds from 15 to 60, a record
    /// for any other whole number of seconds from 1 to [`MAX_WINDOW_SECS`].
    pub fn for_window(window: Duration) -> Result<Term, Error> {
        if window.subsec_nanos() != 0 || !(1..=MAX_WINDOW_SECS).contains(&window.as_secs()) {
            return Err(Error::InvalidArgument(format!(
                "a window is a whole number of seconds from 1 to {MAX_WINDOW_SECS} (got {window:?})"
            )));
        }
        Ok(match window.as_secs() {
            s @ 15..=60 => Term::Native(LeaseDuration::Seconds(s as u8)),
            s => Term::Record(Duration::from_secs(s)),
        })
    }
}

/// A held lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// The lease id, to release with (or to acquire again with, to extend).
    pub lease_id: LeaseId,
    /// The fencing token (`None` only for [unfenced](Locks::acquire_unfenced) native leases).
    pub fencing_token: Option<u64>,
    /// When it runs out by the server's clock (`None` for infinite leases).
    pub expires_at: Option<SystemTime>,
    /// The server's `Date` when it was taken.
    pub server_date: SystemTime,
    /// When this holder's tenure began (the server's clock): earlier than `server_date` when
    /// the holder extended its lock.
    pub since: SystemTime,
    /// True when the caller already held the lock and this extended it (same token).
    pub extended: bool,
}

/// The answer to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The caller holds the lock.
    Acquired(Acquired),
    /// The caller does not hold it: someone else does, or (a record shorter than storage's
    /// answer took) the grant would have run out before it arrived.
    Busy {
        /// How long the holder's lock has left by the server's clock, where storage can tell:
        /// exact for records and for native leases their holder has not extended, an upper
        /// bound for extended native leases, `None` for infinite leases or when unknown.
        retry_after: Option<Duration>,
    },
}

/// The answer to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The caller held it and gave it up.
    Released,
    /// The caller did not hold it (released already, expired, taken over, or never there): a
    /// retried release lands here.
    NotHeld,
}

/// What a lock looks like now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockStatus {
    /// Nobody holds it (or the lock blob does not exist yet).
    Available,
    /// Someone holds it.
    Held {
        /// When it runs out, where storage can tell (records, and native leases not extended
        /// since they were taken).
        expires_at: Option<SystemTime>,
        /// The holder, as its claim names it (a native lease taken without fencing writes no
        /// claim: then this is `None` or the previous native holder's).
        holder: Option<LeaseId>,
        /// When the holder's tenure began.
        since: Option<SystemTime>,
    },
}

/// A snapshot of a lock: its status by the server's clock, and its fencing counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// Held or not.
    pub status: LockStatus,
    /// The native lease state, if the blob exists.
    pub lease_state: Option<LeaseState>,
    /// The highest fencing token issued so far (0 for a lock never taken).
    pub fencing_token: u64,
    /// The server's `Date` of the read.
    pub server_date: Option<SystemTime>,
}

/// A lock blob as one HEAD saw it.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    etag: ETag,
    leased: bool,
    metadata: Metadata,
    claim: Claim,
    /// The highest token issued: the claim's, or the page blob sequence number that older
    /// leasegate versions used as the native lease's counter.
    highest_token: u64,
    server_date: SystemTime,
}

impl Snapshot {
    fn from_properties(props: BlobProperties, server_date: SystemTime) -> Result<Self, Error> {
        let etag = props
            .etag
            .ok_or_else(|| Error::unexpected(http::StatusCode::OK, "the lock blob has no ETag"))?;
        let claim = Claim::read(&props.metadata)?;
        let sequence = props.sequence_number.unwrap_or(0);
        if sequence > MAX_TOKEN {
            return Err(Error::CorruptLock(format!(
                "the page blob sequence number {sequence} is above {MAX_TOKEN}"
            )));
        }
        Ok(Snapshot {
            etag,
            leased: props.lease_state.is_some_and(LeaseState::is_held),
            metadata: props.metadata,
            claim,
            highest_token: claim.token.max(sequence),
            server_date,
        })
    }

    fn server_secs(&self) -> u64 {
        unix_secs(self.server_date)
    }

    /// The live record, if the lock is held as one now.
    fn live_record(&self) -> Option<&Claim> {
        let c = &self.claim;
        (!self.leased
            && c.kind == Kind::Record
            && c.holder.is_some()
            && c.expires > self.server_secs())
        .then_some(c)
    }

    /// The claim of the native lease that holds the lock now, if its holder wrote one.
    fn native_claim(&self) -> Option<&Claim> {
        let c = &self.claim;
        (self.leased && matches!(c.kind, Kind::Native(_)) && c.holder.is_some()).then_some(c)
    }

    /// Who holds the lock, if anyone does and it is not `id`: the refusal to give `id`.
    fn busy_for(&self, id: LeaseId) -> Option<Acquire> {
        if self.leased {
            let ours = self.native_claim().is_some_and(|c| c.holder == Some(id));
            return (!ours).then(|| self.busy());
        }
        match self.live_record() {
            Some(r) if r.holder != Some(id) => Some(self.busy()),
            _ => None,
        }
    }

    /// "Busy", with the time the holder has left where the snapshot tells it.
    fn busy(&self) -> Acquire {
        let now = self.server_secs();
        let retry_after = if let Some(r) = self.live_record() {
            Some(r.expires - now)
        } else if let Some(c) = self.native_claim() {
            match c.kind {
                Kind::Native(LeaseDuration::Seconds(s)) if c.expires > now => {
                    Some((c.expires - now).min(u64::from(s)))
                }
                // The holder extended its lease since it wrote its claim: at most one term.
                Kind::Native(LeaseDuration::Seconds(s)) => Some(u64::from(s)),
                _ => None,
            }
        } else {
            None
        };
        Acquire::Busy {
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    /// `id`'s tenure if it takes the lock now: its own (it holds the lock already, in either
    /// term), or a new one with a token by [the fencing rule](claim::next_token).
    fn tenure_for(&self, id: LeaseId) -> Result<Tenure, Error> {
        let own = self
            .native_claim()
            .or_else(|| self.live_record())
            .filter(|c| c.holder == Some(id));
        Ok(match own {
            Some(c) => Tenure {
                token: c.token,
                since: c.since,
                extended: true,
            },
            None => Tenure {
                token: claim::next_token(self.highest_token, self.server_date)?,
                since: self.server_secs(),
                extended: false,
            },
        })
    }

    /// The metadata with `claim` written into it (other entries kept).
    fn with_claim(&self, claim: &Claim) -> Metadata {
        let mut m = self.metadata.clone();
        claim.write(&mut m);
        m
    }
}

/// A holder's tenure: its token, when it began (server seconds), and whether the holder held
/// the lock already (an extension keeps token and start).
#[derive(Debug, Clone, Copy)]
struct Tenure {
    token: u64,
    since: u64,
    extended: bool,
}

/// What one read of a lock blob found.
enum Read {
    /// No blob (or no container) yet, at this server time.
    Missing(SystemTime),
    /// The blob.
    Found(Snapshot),
}

/// Locks in one container, under one name prefix, reached through a [`Transport`].
#[derive(Debug, Clone)]
pub struct Locks<T> {
    transport: T,
    account: Account,
    container: ContainerName,
    prefix: String,
}

impl<T: Transport> Locks<T> {
    /// Locks kept in `container` below the prefix `locks/`.
    pub fn new(transport: T, account: Account, container: ContainerName) -> Self {
        Locks {
            transport,
            account,
            container,
            prefix: "locks/".into(),
        }
    }

    /// Uses another blob name prefix (for example `gates/`).
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_string();
        self
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The account.
    pub fn account(&self) -> &Account {
        &self.account
    }

    /// The container.
    pub fn container(&self) -> &ContainerName {
        &self.container
    }

    /// The blob that holds `lock`.
    pub fn blob_name(&self, lock: &LockName) -> Result<BlobName, Error> {
        lock.blob_name(&self.prefix)
    }

    /// One round trip: builds, sends and parses `op`; also returns the server's `Date`.
    pub async fn execute<O: Operation>(
        &self,
        op: &O,
        now: SystemTime,
    ) -> Result<(O::Output, Option<SystemTime>), Error> {
        let request = build(op, &self.account, now)?;
        let response = self.transport.send(request).await?;
        let date = server_date(&response);
        Ok((op.parse(&response)?, date))
    }

    /// Takes `lock` for `term` with `lease_id`, or extends it if `lease_id` already holds it
    /// (keeping its token), and returns the fencing token. See the [module](self) for the rules
    /// and the round trips.
    ///
    /// If a request fails after storage may have granted the lock (its answer was lost, it
    /// answered 5xx, or a later step failed), the lock is given back (best effort, with
    /// `lease_id`) before the error is returned.
    pub async fn acquire(
        &self,
        lock: &LockName,
        term: Term,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        let blob = self.blob_name(lock)?;
        match term {
            Term::Native(duration) => {
                native::acquire(self, &blob, duration, lease_id, true, now).await
            }
            Term::Record(length) => record::acquire(self, &blob, length, lease_id, now).await,
        }
    }

    /// Like [`Locks::acquire`], without a fencing token for native leases: one request fewer
    /// when a new holder takes the lock (records always carry their token). No claim is
    /// written, so such a lease cannot be extended (acquiring again with its id is refused
    /// while it holds): use it with a fresh lease id per event, as a throttle does.
    pub async fn acquire_unfenced(
        &self,
        lock: &LockName,
        term: Term,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        let blob = self.blob_name(lock)?;
        match term {
            Term::Native(duration) => {
                native::acquire(self, &blob, duration, lease_id, false, now).await
            }
            Term::Record(length) => record::acquire(self, &blob, length, lease_id, now).await,
        }
    }

    /// Gives `lock` up if `lease_id` holds it, whichever term it was taken for. Safe to retry:
    /// a lock not held (any more) by `lease_id` answers [`Release::NotHeld`].
    ///
    /// Round trips: one for a native lease; a record takes the failed native release, a HEAD
    /// and the compare-and-swap.
    pub async fn release(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> Result<Release, Error> {
        let blob = self.blob_name(lock)?;
        if native::release(self, &blob, lease_id, now).await? == Release::Released {
            return Ok(Release::Released);
        }
        record::clear(self, &blob, Some(lease_id), now).await
    }

    /// Ends whoever holds `lock`: breaks a native lease after `period` (0 to 60 s) and clears a
    /// live record at once. For operators and tests; holders should release.
    pub async fn break_lock(
        &self,
        lock: &LockName,
        period: u8,
        now: SystemTime,
    ) -> Result<(), Error> {
        let blob = self.blob_name(lock)?;
        let op = Lease::new(
            self.container.clone(),
            blob.clone(),
            LeaseAction::Break {
                period: Some(period),
            },
        );
        match self.execute(&op, now).await {
            Ok(_) => {}
            Err(e) if is_missing(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
        record::clear(self, &blob, None, now).await?;
        Ok(())
    }

    /// Reads `lock`'s state with one HEAD, judged by the server's clock.
    pub async fn inspect(&self, lock: &LockName, now: SystemTime) -> Result<LockInfo, Error> {
        let blob = self.blob_name(lock)?;
        let (props, date) = self
            .execute(
                &GetProperties {
                    container: self.container.clone(),
                    blob,
                },
                now,
            )
            .await?;
        let Some(props) = props else {
            return Ok(LockInfo {
                status: LockStatus::Available,
                lease_state: None,
                fencing_token: 0,
                server_date: date,
            });
        };
        let lease_state = props.lease_state;
        let snap = Snapshot::from_properties(props, date.ok_or_else(no_date)?)?;
        let now_secs = snap.server_secs();
        let status = if snap.leased {
            match snap.native_claim() {
                Some(c) => LockStatus::Held {
                    expires_at: c.expires_at().filter(|_| c.expires > now_secs),
                    holder: c.holder,
                    since: c.since_at(),
                },
                None => LockStatus::Held {
                    expires_at: None,
                    holder: None,
                    since: None,
                },
            }
        } else if let Some(r) = snap.live_record() {
            LockStatus::Held {
                expires_at: r.expires_at(),
                holder: r.holder,
                since: r.since_at(),
            }
        } else {
            LockStatus::Available
        };
        Ok(LockInfo {
            status,
            lease_state,
            fencing_token: snap.highest_token,
            server_date: date,
        })
    }

    /// One HEAD of the lock blob.
    async fn read(&self, blob: &BlobName, now: SystemTime) -> Result<Read, Error> {
        let (props, date) = self
            .execute(
                &GetProperties {
                    container: self.container.clone(),
                    blob: blob.clone(),
                },
                now,
            )
            .await?;
        let date = date.ok_or_else(no_date)?;
        match props {
            None => Ok(Read::Missing(date)),
            Some(props) => Snapshot::from_properties(props, date).map(Read::Found),
        }
    }

    /// Creates the lock blob (an empty page blob with `claim` in its metadata), and its
    /// container if that is missing. Returns the new blob as a snapshot, or `None` when a
    /// concurrent caller created it first (not an error: read it).
    async fn create(
        &self,
        blob: &BlobName,
        claim: Claim,
        now: SystemTime,
    ) -> Result<Option<Snapshot>, Error> {
        let mut metadata = Metadata::new();
        claim.write(&mut metadata);
        let op = PutBlob {
            kind: BlobKind::Page(0),
            condition: Condition::IfNotExists,
            metadata: metadata.clone(),
            ..PutBlob::block(self.container.clone(), blob.clone(), Vec::new())
        };
        for _ in 0..MAX_ATTEMPTS {
            match self.execute(&op, now).await {
                Ok((WriteOutcome::Written(w), date)) => {
                    let etag = w.etag.ok_or_else(|| {
                        Error::unexpected(http::StatusCode::CREATED, "the new blob has no ETag")
                    })?;
                    return Ok(Some(Snapshot {
                        etag,
                        leased: false,
                        metadata,
                        claim,
                        highest_token: claim.token,
                        server_date: w.server_date.or(date).ok_or_else(no_date)?,
                    }));
                }
                Ok((WriteOutcome::Refused(_), _)) => return Ok(None),
                Err(e) if e.class() == Some(ErrorClass::ContainerMissing) => {
                    self.execute(
                        &CreateContainer {
                            container: self.container.clone(),
                        },
                        now,
                    )
                    .await?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(gave_up("create the lock blob"))
    }

    /// A lease operation on `blob`.
    fn lease_op(&self, blob: &BlobName, action: LeaseAction) -> Lease {
        Lease::new(self.container.clone(), blob.clone(), action)
    }
}

/// Whether an acquire's answer means storage may have granted the lock (5xx, a lost answer):
/// then the caller gives it back before reporting the error. A refused connection sent nothing.
fn may_have_granted(e: &Error) -> bool {
    match e {
        Error::Transport(t) => t.kind != crate::TransportErrorKind::Connect,
        other => other.outcome_unknown(),
    }
}

fn is_missing(e: &Error) -> bool {
    matches!(
        e.class(),
        Some(ErrorClass::BlobMissing | ErrorClass::ContainerMissing)
    )
}

fn no_date() -> Error {
    Error::unexpected(
        http::StatusCode::OK,
        "storage sent no Date header; lease expiry is judged by the server's clock",
    )
}

fn gave_up(what: &str) -> Error {
    Error::unexpected(
        http::StatusCode::CONFLICT,
        format!("could not {what}: the lock blob kept changing under us"),
    )
}

/// `secs` as a time.
fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}
