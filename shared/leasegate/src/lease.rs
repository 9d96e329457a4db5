//! Lease algorithms for stateless callers: acquire (which also extends), release, break,
//! inspect, with fencing tokens, over native blob leases or an ETag lease record.
//!
//! Every call takes `now`, used only to date the requests (`x-ms-date`); every expiry is judged
//! by the storage server's `Date` header.
//!
//! # Terms
//! * [`Term::Native`]: a blob lease of 15 to 60 seconds (or infinite). Acquire is **one**
//!   request on an existing lock blob, whether it takes a free lease or extends the caller's
//!   own (acquiring again with the same id). The lock blob is an empty page blob, created on
//!   first use (with its container).
//! * [`Term::Record`]: any whole number of seconds from 1 up. The lock blob's metadata holds a
//!   record (holder, expiry in server seconds, token), read with one HEAD and replaced with a
//!   compare-and-swap (`If-Match`). A busy answer costs one request, an acquisition two.
//!
//! # Fencing tokens
//! A lost lease does not stop work already running (REFERENCE §7.4). A fencing token is an
//! integer that every new acquisition makes strictly larger than all earlier ones for that
//! lock; the holder passes it with every write to the protected resource, and the resource
//! refuses a token lower than the highest it has seen (store the highest with the data and
//! compare-and-swap, or keep it in the same transaction). A stale holder, whose lease expired
//! while it was paused, then cannot overwrite the work of its successor.
//!
//! For native leases the token is the lock blob's page-blob sequence number, incremented
//! atomically by storage under the lease ([`Locks::acquire_fenced`], one extra request): only
//! the holder can increment it, so no two acquisitions share a value. For records the token is
//! part of the record and is raised by the same compare-and-swap that takes the lock (no extra
//! request); extending your own record keeps its token.

use std::time::{Duration, SystemTime};

use crate::error::ErrorClass;
use crate::names::{BlobName, ContainerName, LockName};
use crate::ops::{
    build, server_date, BlobKind, BlobProperties, Condition, CreateContainer, GetProperties,
    IncrementSequenceNumber, Lease, LeaseAction, LeaseOutcome, Metadata, Operation, PutBlob,
    Refusal, SetMetadata, WriteOutcome,
};
use crate::types::{unix_secs, LeaseDuration, LeaseId, LeaseState};
use crate::{Account, Error, Transport};

/// Metadata names of the ETag lease record.
const META_HOLDER: &str = "leasegate_holder";
const META_EXPIRES: &str = "leasegate_expires";
const META_TOKEN: &str = "leasegate_token";

/// How many times a step that lost a race (a concurrent create, a compare-and-swap) is retried.
const MAX_ATTEMPTS: usize = 4;

/// How long a lock is taken for, and so how it is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    /// A native blob lease (15 to 60 s, or infinite).
    Native(LeaseDuration),
    /// An ETag lease record of this many seconds (1 or more).
    Record(Duration),
}

impl Term {
    /// The cheapest term for a window: a native lease for whole seconds from 15 to 60, a record
    /// for any other whole number of seconds from 1 up.
    pub fn for_window(window: Duration) -> Result<Term, Error> {
        if window.subsec_nanos() != 0 || window.as_secs() == 0 {
            return Err(Error::InvalidArgument(format!(
                "a window is a whole number of seconds, 1 or more (got {window:?})"
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
    /// The fencing token, where one was asked for (always for records).
    pub fencing_token: Option<u64>,
    /// When it runs out by the server's clock (`None` for infinite leases).
    pub expires_at: Option<SystemTime>,
    /// The server's `Date` when it was taken.
    pub server_date: SystemTime,
}

/// The answer to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The caller holds the lock.
    Acquired(Acquired),
    /// Someone else does; try again after `retry_after` where it is known (records know it;
    /// native leases cannot tell how long they have left).
    Busy {
        /// Time left on the other holder's lock, by the server's clock.
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
        /// When it runs out, where storage can tell (records; not native leases).
        expires_at: Option<SystemTime>,
        /// The record's holder (records only).
        holder: Option<LeaseId>,
    },
}

/// A snapshot of a lock: its status by the server's clock, and its fencing counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// Held or not.
    pub status: LockStatus,
    /// The native lease state, if the blob exists.
    pub lease_state: Option<LeaseState>,
    /// The highest fencing token issued so far (sequence number or record token).
    pub fencing_token: u64,
    /// The server's `Date` of the read.
    pub server_date: Option<SystemTime>,
}

/// The ETag lease record kept in a lock blob's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Record {
    holder: Option<LeaseId>,
    expires: u64,
    token: u64,
}

impl Record {
    fn read(metadata: &Metadata) -> Record {
        Record {
            holder: metadata
                .get(META_HOLDER)
                .and_then(|h| LeaseId::try_new(h).ok()),
            expires: metadata
                .get(META_EXPIRES)
                .and_then(|e| e.parse().ok())
                .unwrap_or(0),
            token: metadata
                .get(META_TOKEN)
                .and_then(|t| t.parse().ok())
                .unwrap_or(0),
        }
    }

    fn metadata(&self) -> Metadata {
        let mut m = Metadata::new();
        m.insert(
            META_HOLDER.into(),
            self.holder.map(|h| h.to_string()).unwrap_or_default(),
        );
        m.insert(META_EXPIRES.into(), self.expires.to_string());
        m.insert(META_TOKEN.into(), self.token.to_string());
        m
    }

    fn live_holder(&self, now_secs: u64) -> Option<LeaseId> {
        self.holder.filter(|_| self.expires > now_secs)
    }
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

    /// Takes `lock` for `term` with `lease_id`, or extends it if `lease_id` already holds it.
    /// Records always carry a fencing token; native leases do not (see
    /// [`Locks::acquire_fenced`]).
    ///
    /// Round trips: one for a native lease on an existing lock blob (acquired, extended or
    /// busy); one for a busy record, two for an acquired one. The first use of a lock also
    /// creates the blob (and, if need be, the container); racing creators are not errors.
    pub async fn acquire(
        &self,
        lock: &LockName,
        term: Term,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        match term {
            Term::Native(duration) => self.acquire_native(lock, duration, lease_id, now).await,
            Term::Record(length) => self.acquire_record(lock, length, lease_id, now).await,
        }
    }

    /// Like [`Locks::acquire`], and also returns a fencing token. A native lease that was
    /// acquired costs one more request: the atomic increment of the lock blob's sequence number
    /// under the lease. A busy answer stays one request.
    pub async fn acquire_fenced(
        &self,
        lock: &LockName,
        term: Term,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        let acquired = match self.acquire(lock, term, lease_id, now).await? {
            Acquire::Acquired(a) if a.fencing_token.is_none() => a,
            other => return Ok(other),
        };
        let increment = IncrementSequenceNumber {
            container: self.container.clone(),
            blob: self.blob_name(lock)?,
            lease_id: Some(lease_id),
        };
        match self.execute(&increment, now).await?.0 {
            WriteOutcome::Written(w) => Ok(Acquire::Acquired(Acquired {
                fencing_token: w.sequence_number,
                ..acquired
            })),
            // Broken or taken between the two requests: not ours after all.
            WriteOutcome::Refused(_) => Ok(Acquire::Busy { retry_after: None }),
        }
    }

    async fn acquire_native(
        &self,
        lock: &LockName,
        duration: LeaseDuration,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        let op = Lease {
            container: self.container.clone(),
            blob: self.blob_name(lock)?,
            action: LeaseAction::Acquire {
                duration,
                proposed: lease_id,
            },
        };
        for _ in 0..MAX_ATTEMPTS {
            match self.execute(&op, now).await {
                Ok((LeaseOutcome::Held { server_date, .. }, date)) => {
                    let server_date = server_date.or(date).ok_or_else(no_date)?;
                    return Ok(Acquire::Acquired(Acquired {
                        lease_id,
                        fencing_token: None,
                        expires_at: duration.as_duration().map(|d| server_date + d),
                        server_date,
                    }));
                }
                Ok((_, _)) => return Ok(Acquire::Busy { retry_after: None }),
                Err(e) if is_missing(&e) => {
                    self.create_lock_blob(&op.blob, None, now).await?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(gave_up("acquire"))
    }

    async fn acquire_record(
        &self,
        lock: &LockName,
        length: Duration,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> Result<Acquire, Error> {
        if length.as_secs() == 0 {
            return Err(Error::InvalidArgument(
                "a record lasts 1 second or more".into(),
            ));
        }
        let blob = self.blob_name(lock)?;
        for _ in 0..MAX_ATTEMPTS {
            let (props, date) = self
                .execute(
                    &GetProperties {
                        container: self.container.clone(),
                        blob: blob.clone(),
                    },
                    now,
                )
                .await?;
            let server_date = date.ok_or_else(no_date)?;
            let server_secs = unix_secs(server_date);
            let expires = server_secs + length.as_secs();
            let taken = |token| {
                Acquire::Acquired(Acquired {
                    lease_id,
                    fencing_token: Some(token),
                    expires_at: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(expires)),
                    server_date,
                })
            };
            let Some(props) = props else {
                // First use: create the blob with our record in it.
                let record = Record {
                    holder: Some(lease_id),
                    expires,
                    token: 1,
                };
                if self.create_lock_blob(&blob, Some(record), now).await? {
                    return Ok(taken(1));
                }
                continue;
            };
            if props.lease_state.is_some_and(LeaseState::is_held) {
                // Someone keeps this lock with a native lease.
                return Ok(Acquire::Busy { retry_after: None });
            }
            let record = Record::read(&props.metadata);
            let token = match record.live_holder(server_secs) {
                Some(holder) if holder == lease_id => record.token.max(1),
                Some(_) => {
                    return Ok(Acquire::Busy {
                        retry_after: Some(Duration::from_secs(record.expires - server_secs)),
                    })
                }
                None => record.token.max(props.sequence_number.unwrap_or(0)) + 1,
            };
            let new = Record {
                holder: Some(lease_id),
                expires,
                token,
            };
            match self.swap_record(&blob, &props, new, now).await? {
                Some(true) => return Ok(taken(token)),
                Some(false) => return Ok(Acquire::Busy { retry_after: None }),
                None => continue,
            }
        }
        Err(gave_up("acquire"))
    }

    /// Compare-and-swap of the record: `Some(true)` written, `Some(false)` refused by a lease,
    /// `None` lost a race (ETag changed, or the blob vanished): read again.
    async fn swap_record(
        &self,
        blob: &BlobName,
        props: &BlobProperties,
        record: Record,
        now: SystemTime,
    ) -> Result<Option<bool>, Error> {
        let etag = props
            .etag
            .clone()
            .ok_or_else(|| Error::unexpected(http::StatusCode::OK, "the lock blob has no ETag"))?;
        let op = SetMetadata {
            container: self.container.clone(),
            blob: blob.clone(),
            metadata: record.metadata(),
            lease_id: None,
            condition: Condition::IfMatch(etag),
        };
        match self.execute(&op, now).await {
            Ok((WriteOutcome::Written(_), _)) => Ok(Some(true)),
            Ok((WriteOutcome::Refused(Refusal::ConditionFailed), _)) => Ok(None),
            Ok((WriteOutcome::Refused(_), _)) => Ok(Some(false)),
            Err(e) if is_missing(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates the lock blob (an empty page blob, with `record` in its metadata if given), and
    /// its container if that is missing. Returns whether this call created it; a concurrent
    /// creator's blob counts as created by someone else, not as an error.
    async fn create_lock_blob(
        &self,
        blob: &BlobName,
        record: Option<Record>,
        now: SystemTime,
    ) -> Result<bool, Error> {
        let op = PutBlob {
            kind: BlobKind::Page(0),
            condition: Condition::IfNotExists,
            metadata: record.map(|r| r.metadata()).unwrap_or_default(),
            ..PutBlob::block(self.container.clone(), blob.clone(), Vec::new())
        };
        for _ in 0..MAX_ATTEMPTS {
            match self.execute(&op, now).await {
                Ok((WriteOutcome::Written(_), _)) => return Ok(true),
                Ok((WriteOutcome::Refused(_), _)) => return Ok(false),
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
        let op = Lease {
            container: self.container.clone(),
            blob: blob.clone(),
            action: LeaseAction::Release(lease_id),
        };
        match self.execute(&op, now).await {
            Ok((LeaseOutcome::Released, _)) => return Ok(Release::Released),
            Ok(_) => {}
            Err(e) if is_missing(&e) => return Ok(Release::NotHeld),
            Err(e) => return Err(e),
        }
        // Not a native lease of ours: maybe a record.
        Ok(if self.clear_record(&blob, Some(lease_id), now).await? {
            Release::Released
        } else {
            Release::NotHeld
        })
    }

    /// Clears the live record of `blob` (keeping its token) if `holder` holds it, or whoever
    /// does when `holder` is `None`. Returns whether a record was cleared.
    async fn clear_record(
        &self,
        blob: &BlobName,
        holder: Option<LeaseId>,
        now: SystemTime,
    ) -> Result<bool, Error> {
        for _ in 0..MAX_ATTEMPTS {
            let (props, date) = self
                .execute(
                    &GetProperties {
                        container: self.container.clone(),
                        blob: blob.clone(),
                    },
                    now,
                )
                .await?;
            let Some(props) = props else {
                return Ok(false);
            };
            let record = Record::read(&props.metadata);
            let live = record.live_holder(unix_secs(date.ok_or_else(no_date)?));
            let ours = match holder {
                Some(id) => live == Some(id),
                None => live.is_some(),
            };
            if !ours {
                return Ok(false);
            }
            let freed = Record {
                holder: None,
                expires: 0,
                token: record.token,
            };
            match self.swap_record(blob, &props, freed, now).await? {
                Some(cleared) => return Ok(cleared),
                None => continue,
            }
        }
        Err(gave_up("clear the lease record"))
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
        let op = Lease {
            container: self.container.clone(),
            blob: blob.clone(),
            action: LeaseAction::Break {
                period: Some(period),
            },
        };
        match self.execute(&op, now).await {
            Ok(_) => {}
            Err(e) if is_missing(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
        self.clear_record(&blob, None, now).await?;
        Ok(())
    }

    /// Reads `lock`'s state with one HEAD, judged by the server's clock.
    pub async fn inspect(&self, lock: &LockName, now: SystemTime) -> Result<LockInfo, Error> {
        let (props, date) = self
            .execute(
                &GetProperties {
                    container: self.container.clone(),
                    blob: self.blob_name(lock)?,
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
        let record = Record::read(&props.metadata);
        let server_secs = date.map(unix_secs).unwrap_or(0);
        let status = if props.lease_state.is_some_and(LeaseState::is_held) {
            LockStatus::Held {
                expires_at: None,
                holder: None,
            }
        } else if let Some(holder) = record.live_holder(server_secs) {
            LockStatus::Held {
                expires_at: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(record.expires)),
                holder: Some(holder),
            }
        } else {
            LockStatus::Available
        };
        Ok(LockInfo {
            status,
            lease_state: props.lease_state,
            fencing_token: record.token.max(props.sequence_number.unwrap_or(0)),
            server_date: date,
        })
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
