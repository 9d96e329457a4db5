//! Lease algorithms for stateless callers: acquire (which also extends), release, break,
//! inspect, with fencing tokens, over native blob leases or lease records.
//!
//! Every call takes `now`, used only to date the requests (`x-ms-date`) when the transport has
//! no clock of its own: a transport that has one ([`Transport::now`]) dates each request when it
//! is sent, so a long call never sends a stale date. Every expiry is judged by the storage
//! server's `Date` header.
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
//! state, its claim (the holder, written into the blob's metadata) and its ETag. Then:
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
//! and created again; a holder that extends its own lock keeps its token (the claim has the
//! rule). The holder passes the token with every write to the protected resource, and the
//! resource refuses a token lower than the highest it has seen (store the highest with the data
//! and compare-and-swap, or keep it in the same transaction). A stale holder then cannot
//! overwrite its successor's work.
//!
//! # Round trips
//! | decision | native lease | lease record |
//! |---|---|---|
//! | busy: someone else holds it (either term) | **1** (HEAD) | **1** (HEAD) |
//! | acquired by a new holder | 3: HEAD, acquire, claim | 2: HEAD, compare-and-swap |
//! | extended by its holder (token kept) | 3: HEAD, acquire, claim (its new expiry); 2 when the claim names that expiry already | 2: HEAD, compare-and-swap; 1 when the record names that expiry already |
//! | first use of a lock | HEAD, create, acquire, claim (+2 to create the container) | HEAD, create, compare-and-swap (+2 to create the container) |
//! | release | 2: HEAD, release | 2: HEAD, compare-and-swap |
//!
//! What the requests buy: the HEAD lets the two terms share one lock and tells a refused
//! caller how long the holder has left; the claim is the token, and keeps what a refused
//! caller or an inspection is told exact (an extension moves its expiry).
//!
//! # Failures
//! A request that fails after storage may have granted the lock to a **new** holder (an answer
//! lost, a 5xx, a claim that could not be written) is followed by giving the lock back before
//! the error is returned, **only when this call generated the lease id itself**
//! ([`IdOrigin::Fresh`]: a random id no other call knows). An id the caller chose or derived
//! ([`IdOrigin::Known`]: a client's lease id, an instance's id) may be held right now by
//! another call with that id (a client's retry, a second tick of one instance) that read the
//! lock after this call's grant and was told it holds it: giving back then would free the lock
//! under it. So such a lock is left as it is, and acquiring again with the same id settles the
//! state (or it runs out). A holder that was **extending** (or switching the term of) a lock
//! it already held keeps it too: the error takes away nothing it was granted before. Nor is a
//! blob found leased without a live claim given back: that lease may be the caller's own (a
//! call that stopped between its grant and its claim); it runs out on its own.
//!
//! A lock blob's first create names no holder (native and record alike): it only carries the
//! first token. The lock is then taken as on any existing blob, so a create whose answer was
//! lost grants nothing, however late it lands.

mod claim;
pub mod native;
pub mod record;
mod snapshot;

use std::time::{Duration, SystemTime};

use crate::error::ErrorClass;
use crate::message::StatusCode;
use crate::names::{BlobName, ContainerName, LockName};
use crate::ops::{
    BlobKind, Condition, CreateContainer, GetProperties, Lease, LeaseAction, Metadata, PutBlob,
    SetMetadata, WriteOutcome,
};
use crate::types::{unix_secs, LeaseDuration, LeaseId, LeaseState};
use crate::{Account, Error, Transport};

use crate::blob::BlobClient;
use claim::{Claim, Kind};
pub use claim::{MAX_LABEL_BYTES, MAX_TOKEN};
use snapshot::{checked_date, Read, Snapshot, Tenure};

/// How many times a step that lost a race (a concurrent create, a compare-and-swap, an ETag
/// that moved) is tried again before giving up.
const MAX_ATTEMPTS: usize = 6;

/// The most step-down bars one lock blob keeps (see [`Locks::step_down`]).
pub const MAX_STEPPED_DOWN: usize = 8;

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

/// Where an acquire's lease id comes from, which decides what a failure that may have granted
/// the lock leaves behind (see the [module](self)'s failures).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdOrigin {
    /// Generated by this call (random, known to no other call): a failure after storage may
    /// have granted the lock gives it back before the error is returned.
    Fresh,
    /// Chosen by the caller or derived (a client's lease id, an instance's id): another call
    /// with the same id may hold the lock right now, so a failure leaves the lock as it is.
    /// Acquiring again with the id settles it (or it runs out).
    Known,
}

/// A held lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// The lease id, to release with (or to acquire again with, to extend).
    pub lease_id: LeaseId,
    /// The fencing token (always set by [`Locks::acquire`]).
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
    /// The lock blob's own marks (its metadata other than the claim) as they were when the lock
    /// was granted: nobody changed them since (see [`Locks::set_marks`]).
    pub marks: Metadata,
}

/// Who holds a lock, as its claim says (never the holder's lease id: that would let its
/// reader release or extend the lock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's label (an instance id), empty if it gave none.
    pub label: String,
    /// When its tenure began.
    pub since: Option<SystemTime>,
    /// When its lock runs out (`None`: infinite lease).
    pub expires_at: Option<SystemTime>,
    /// Its fencing token.
    pub token: u64,
    /// How long it has held the lock (its tenure so far) by the server's clock at the read:
    /// what tells a holder at work from one long done.
    pub held_for: Option<Duration>,
}

/// The answer to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The caller holds the lock.
    Acquired(Acquired),
    /// The caller does not hold it: someone else does, or (a record shorter than storage's
    /// answer took) the grant would have run out before it arrived.
    Busy {
        /// How long the holder's lock has left by the server's clock, as its claim records
        /// it (every holder moves its claim's expiry when it extends); `None` for infinite
        /// leases, or when the holder took the lock a moment ago and its claim is not there
        /// yet.
        retry_after: Option<Duration>,
        /// Who holds it, where its claim says.
        holder: Option<Holder>,
        /// The caller's own id stepped down ([`Locks::step_down`]) and may not take the lock
        /// before this time (the server's clock), even though nobody holds it.
        stepped_down_until: Option<SystemTime>,
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
        /// The holder, as its claim names it (`None` for a moment after a native grant, before
        /// the claim is written).
        holder: Option<LeaseId>,
        /// When the holder's tenure began.
        since: Option<SystemTime>,
        /// The holder's label (an instance id), empty if it gave none.
        label: String,
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
    /// The lock blob's own marks (metadata other than the claim).
    pub marks: Metadata,
}

/// Locks in one container, under one name prefix, reached through a [`Transport`].
#[derive(Debug, Clone)]
pub struct Locks<T> {
    client: BlobClient<T>,
    prefix: String,
}

impl<T: Transport> Locks<T> {
    /// Locks kept in `container` below the prefix `locks/`.
    pub fn new(transport: T, account: Account, container: ContainerName) -> Self {
        Locks::from_client(BlobClient::new(transport, account, container))
    }

    /// Locks kept in the client's container below the prefix `locks/`.
    pub fn from_client(client: BlobClient<T>) -> Self {
        Locks {
            client,
            prefix: "locks/".into(),
        }
    }

    /// Uses another blob name prefix (for example `gates/`).
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_string();
        self
    }

    /// The blob client the locks are kept through (for plain blob work beside them).
    pub fn client(&self) -> &BlobClient<T> {
        &self.client
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        self.client.transport()
    }

    /// The account.
    pub fn account(&self) -> &Account {
        self.client.account()
    }

    /// The container.
    pub fn container(&self) -> &ContainerName {
        self.client.container()
    }

    /// The blob that holds `lock`.
    pub fn blob_name(&self, lock: &LockName) -> Result<BlobName, Error> {
        lock.blob_name(&self.prefix)
    }

    /// Takes `lock` for `term` with `lease_id`, or extends it if `lease_id` already holds it
    /// (keeping its token), and returns the fencing token. See the [module](self) for the rules
    /// and the round trips.
    ///
    /// `lease_id` is taken as [`IdOrigin::Known`]: if a request fails after storage may have
    /// granted the lock, the lock is left as it is (another call with this id may hold it by
    /// now), and acquiring again with the same id settles it. A caller that generated the id
    /// for this call uses [`Locks::acquire_with`] and [`IdOrigin::Fresh`], and then gets the
    /// lock given back (best effort) before the error is returned.
    pub async fn acquire(
        &self,
        lock: &LockName,
        term: Term,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        self.acquire_with(lock, term, lease_id, IdOrigin::Known, "", now)
            .await
    }

    /// [`Locks::acquire`], with a label in the claim that says who holds the lock to people and
    /// to refused callers ([`Holder::label`]): an instance id, 1 to
    /// [`MAX_LABEL_BYTES`] printable ASCII characters.
    pub async fn acquire_as(
        &self,
        lock: &LockName,
        term: Term,
        lease_id: LeaseId,
        label: &str,
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        self.acquire_with(lock, term, lease_id, IdOrigin::Known, label, now)
            .await
    }

    /// [`Locks::acquire_as`], saying where `lease_id` comes from: [`IdOrigin::Fresh`] when this
    /// call generated it (then a failure that may have granted the lock gives it back),
    /// [`IdOrigin::Known`] otherwise (then the lock is left as it is).
    pub async fn acquire_with(
        &self,
        lock: &LockName,
        term: Term,
        lease_id: LeaseId,
        origin: IdOrigin,
        label: &str,
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        if label.len() > MAX_LABEL_BYTES || !label.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(Error::InvalidArgument(format!(
                "a holder label is at most {} printable ASCII characters",
                claim::MAX_LABEL_BYTES
            )));
        }
        let blob = self.blob_name(lock)?;
        let outcome = match term {
            Term::Native(duration) => {
                native::acquire(self, &blob, duration, lease_id, origin, label, now).await
            }
            Term::Record(length) => {
                record::acquire(self, &blob, length, lease_id, origin, label, now).await
            }
        };
        outcome.map_err(|e| self.name_lock(lock, e))
    }

    /// The lock's path in its container as people name it (and the `leasegate` CLI takes it):
    /// the prefix and the lock name as given, e.g. `gates/tenant-a/lock`.
    pub fn lock_path(&self, lock: &LockName) -> String {
        format!("{}{}", self.prefix, lock.as_str())
    }

    /// A [`Error::CorruptLock`] about `lock` becomes an [`Error::UnusableLock`] naming it.
    fn name_lock(&self, lock: &LockName, e: Error) -> Error {
        match e {
            Error::CorruptLock(reason) => Error::UnusableLock {
                lock: self.lock_path(lock),
                container: self.client.container().as_str().to_string(),
                reason,
            },
            e => e,
        }
    }

    /// Sets marks on `lock` (metadata entries beside the claim, such as `progress=done`) if
    /// `lease_id` holds it: only its holder can, and only while it does. Other marks and the
    /// claim are kept; an empty value removes a mark. Returns whether they were written (`false`:
    /// not held, or held no more). Two requests: a HEAD and the write.
    pub async fn set_marks(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        marks: &Metadata,
        now: SystemTime,
    ) -> Result<bool, Error> {
        self.set_marks_of(lock, lease_id, marks, now)
            .await
            .map_err(|e| self.name_lock(lock, e))
    }

    async fn set_marks_of(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        marks: &Metadata,
        now: SystemTime,
    ) -> Result<bool, Error> {
        if let Some(name) = marks.keys().find(|k| claim::is_claim_field(k)) {
            return Err(Error::InvalidArgument(format!(
                "mark {name} uses the claim's prefix leasegate_"
            )));
        }
        let blob = self.blob_name(lock)?;
        let snap = match self.read(&blob, now).await? {
            Read::Found(snap) => snap,
            Read::Missing(_) => return Ok(false),
        };
        if !snap.held_by(lease_id) {
            return Ok(false);
        }
        let mut metadata = snap.metadata.clone();
        for (name, value) in marks {
            if value.is_empty() {
                metadata.remove(&name.to_ascii_lowercase());
            } else {
                metadata.insert(name.to_ascii_lowercase(), value.clone());
            }
        }
        let write = SetMetadata {
            container: self.client.container().clone(),
            blob,
            metadata,
            lease_id: snap.leased.then_some(lease_id),
            condition: Condition::IfMatch(snap.etag.clone()),
        };
        match self.client.execute(&write, now).await? {
            (WriteOutcome::Written(_), _) => Ok(true),
            (WriteOutcome::Refused(_), _) => Ok(false),
        }
    }

    /// Gives `lock` up like [`Locks::release`], and bars `lease_id` from taking it again for
    /// `bar` (by the server's clock): its acquires answer [`Acquire::Busy`] with
    /// `stepped_down_until` meanwhile, so another holder can take over. The bar is kept in the
    /// lock blob's metadata (`leasegate_stepped_down`, written under the lease before it is
    /// let go), so a holder with no memory between invocations keeps it too. Other ids'
    /// unexpired bars are kept (at most [`MAX_STEPPED_DOWN`], the latest).
    ///
    /// Round trips: four (a HEAD and the metadata write, then the release's two).
    pub async fn step_down(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        bar: Duration,
        now: SystemTime,
    ) -> Result<Release, Error> {
        self.step_down_of(lock, lease_id, bar, now)
            .await
            .map_err(|e| self.name_lock(lock, e))
    }

    async fn step_down_of(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        bar: Duration,
        now: SystemTime,
    ) -> Result<Release, Error> {
        let blob = self.blob_name(lock)?;
        for _ in 0..MAX_ATTEMPTS {
            let snap = match self.read(&blob, now).await? {
                Read::Found(snap) => snap,
                Read::Missing(_) => return Ok(Release::NotHeld),
            };
            if !snap.held_by(lease_id) {
                return Ok(Release::NotHeld);
            }
            let server_now = snap.server_secs();
            let mut bars: Vec<(LeaseId, u64)> = snap
                .stepped_down
                .iter()
                .copied()
                .filter(|(who, until)| *who != lease_id && *until > server_now)
                .collect();
            bars.push((lease_id, server_now.saturating_add(bar.as_secs().max(1))));
            let skip = bars.len().saturating_sub(MAX_STEPPED_DOWN);
            let mut metadata = snap.metadata.clone();
            claim::write_stepped_down(&bars[skip..], &mut metadata);
            let write = SetMetadata {
                container: self.client.container().clone(),
                blob: blob.clone(),
                metadata,
                lease_id: snap.leased.then_some(lease_id),
                condition: Condition::IfMatch(snap.etag.clone()),
            };
            match self.client.execute(&write, now).await? {
                (WriteOutcome::Written(_), _) => return self.release_of(lock, lease_id, now).await,
                (WriteOutcome::Refused(_), _) => continue,
            }
        }
        Err(gave_up("step down"))
    }

    /// Gives `lock` up if `lease_id` holds it, whichever term it was taken for (a native lease,
    /// a record, or both after a term switch whose lease could not be let go). Safe to retry: a
    /// lock not held (any more) by `lease_id` answers [`Release::NotHeld`].
    ///
    /// Round trips: two, a HEAD and the release of the lease or the compare-and-swap of the
    /// record.
    pub async fn release(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> Result<Release, Error> {
        self.release_of(lock, lease_id, now)
            .await
            .map_err(|e| self.name_lock(lock, e))
    }

    async fn release_of(
        &self,
        lock: &LockName,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> Result<Release, Error> {
        let blob = self.blob_name(lock)?;
        let snap = match self.read(&blob, now).await? {
            Read::Found(snap) => snap,
            Read::Missing(_) => return Ok(Release::NotHeld),
        };
        let mut released = false;
        if snap.leased {
            // Only the id that holds the lease can release it, whatever the claim says.
            released = native::release(self, &blob, lease_id, now).await? == Release::Released;
        }
        if snap.record_of(lease_id).is_some() && (released || !snap.leased) {
            released |= record::clear_at(self, &blob, &snap, now).await?;
        }
        Ok(if released {
            Release::Released
        } else {
            Release::NotHeld
        })
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
            self.client.container().clone(),
            blob.clone(),
            LeaseAction::Break {
                period: Some(period),
            },
        );
        match self.client.execute(&op, now).await {
            Ok(_) => {}
            Err(e) if is_missing(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
        record::clear_any(self, &blob, now).await
    }

    /// Reads `lock`'s state with one HEAD, judged by the server's clock.
    pub async fn inspect(&self, lock: &LockName, now: SystemTime) -> Result<LockInfo, Error> {
        self.inspect_of(lock, now)
            .await
            .map_err(|e| self.name_lock(lock, e))
    }

    async fn inspect_of(&self, lock: &LockName, now: SystemTime) -> Result<LockInfo, Error> {
        let blob = self.blob_name(lock)?;
        let (props, date) = self
            .client
            .execute(
                &GetProperties {
                    container: self.client.container().clone(),
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
                marks: Metadata::new(),
            });
        };
        let lease_state = props.lease_state;
        let snap = Snapshot::from_properties(props, date.ok_or_else(no_date)?)?;
        let status = match snap.holder_claim() {
            Some(c) => LockStatus::Held {
                expires_at: c.expires_at(),
                holder: c.holder,
                since: c.since_at(),
                label: c.label.clone(),
            },
            // Leased by a holder that wrote no claim (yet).
            None if snap.leased => LockStatus::Held {
                expires_at: None,
                holder: None,
                since: None,
                label: String::new(),
            },
            None => LockStatus::Available,
        };
        Ok(LockInfo {
            status,
            lease_state,
            fencing_token: snap.highest_token,
            server_date: date,
            marks: snap.marks(),
        })
    }

    /// One HEAD of the lock blob.
    async fn read(&self, blob: &BlobName, now: SystemTime) -> Result<Read, Error> {
        let (props, date) = self
            .client
            .execute(
                &GetProperties {
                    container: self.client.container().clone(),
                    blob: blob.clone(),
                },
                now,
            )
            .await?;
        let date = checked_date(date.ok_or_else(no_date)?)?;
        match props {
            None => Ok(Read::Missing(date)),
            Some(props) => Snapshot::from_properties(props, date).map(Read::Found),
        }
    }

    /// First use of a lock: creates its blob with the first token in it but no holder (so that
    /// tokens never go back, whoever takes it, and a create whose answer is lost grants
    /// nothing however late it lands). Returns the new blob and the tenure its first holder
    /// starts from, or `None` when a concurrent caller created it first (read it again).
    async fn create_first(
        &self,
        blob: &BlobName,
        kind: Kind,
        date: SystemTime,
        now: SystemTime,
    ) -> Result<Option<(Snapshot, Tenure)>, Error> {
        let pending = Claim {
            holder: None,
            kind,
            since: unix_secs(date),
            expires: 0,
            token: claim::first_token(date)?,
            label: String::new(),
        };
        let Some(created) = self.create(blob, pending.clone(), now).await? else {
            return Ok(None);
        };
        // The token is the create's when it landed in a later second than the read (a slow
        // create).
        let tenure = Tenure {
            token: claim::first_token(created.server_date)?.max(pending.token),
            since: pending.since,
            extended: false,
        };
        Ok(Some((created, tenure)))
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
            ..PutBlob::block(self.client.container().clone(), blob.clone(), Vec::new())
        };
        for _ in 0..MAX_ATTEMPTS {
            match self.client.execute(&op, now).await {
                Ok((WriteOutcome::Written(w), date)) => {
                    let etag = w.etag.ok_or_else(|| {
                        Error::unexpected(StatusCode::CREATED, "the new blob has no ETag")
                    })?;
                    return Ok(Some(Snapshot {
                        etag,
                        leased: false,
                        breaking: false,
                        metadata,
                        highest_token: claim.token,
                        claim,
                        server_date: checked_date(w.server_date.or(date).ok_or_else(no_date)?)?,
                        stepped_down: Vec::new(),
                    }));
                }
                Ok((WriteOutcome::Refused(_), _)) => return Ok(None),
                Err(e) if e.class() == Some(ErrorClass::ContainerMissing) => {
                    self.client
                        .execute(
                            &CreateContainer {
                                container: self.client.container().clone(),
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
        Lease::new(self.client.container().clone(), blob.clone(), action)
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
        StatusCode::OK,
        "storage sent no Date header; lease expiry is judged by the server's clock",
    )
}

fn gave_up(what: &str) -> Error {
    Error::unexpected(
        StatusCode::CONFLICT,
        format!("could not {what}: the lock blob kept changing under us"),
    )
}
