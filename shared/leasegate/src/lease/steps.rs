//! The steps every entry point of [`Locks`] shares: the lock blob read (one HEAD), its first
//! create, the lease request, and how a failure is classified.

use std::time::SystemTime;

use crate::error::ErrorClass;
use crate::message::StatusCode;
use crate::names::{BlobName, LockName};
use crate::ops::{
    BlobKind, BlobProperties, Condition, CreateContainer, GetProperties, Lease, LeaseAction,
    Metadata, Operation, PutBlob, WriteOutcome,
};
use crate::types::{unix_secs, LeaseId};
use crate::{Account, Error, Request, Response, Transport};

use super::claim::{self, Claim, Kind};
use super::snapshot::{checked_date, Read, Snapshot, Tenure};

use super::*;

impl<T: Transport> Locks<T> {
    pub(super) async fn inspect_of(
        &self,
        lock: &LockName,
        now: SystemTime,
    ) -> Result<LockInfo, Error> {
        let blob = self.blob_name(lock)?;
        let (head, date) = self
            .client
            .execute(
                &HeadLock(GetProperties {
                    container: self.client.container().clone(),
                    blob,
                }),
                now,
            )
            .await?;
        let Some(props) = head.props else {
            return Ok(LockInfo {
                status: LockStatus::Available,
                lease_state: None,
                fencing_token: 0,
                server_date: date,
                marks: Metadata::new(),
                seen: date
                    .and_then(|d| checked_date(d).ok())
                    .map(|date| Read::Missing {
                        date,
                        container_missing: head.container_missing,
                    }),
            });
        };
        LockInfo::from_properties(props, date.ok_or_else(no_date)?)
    }

    /// One HEAD of the lock blob.
    pub(super) async fn read(&self, blob: &BlobName, now: SystemTime) -> Result<Read, Error> {
        let (head, date) = self
            .client
            .execute(
                &HeadLock(GetProperties {
                    container: self.client.container().clone(),
                    blob: blob.clone(),
                }),
                now,
            )
            .await?;
        let date = checked_date(date.ok_or_else(no_date)?)?;
        match head.props {
            Some(props) => Snapshot::from_properties(props, date).map(Read::Found),
            None => Ok(Read::Missing {
                date,
                container_missing: head.container_missing,
            }),
        }
    }

    /// First use of a lock: creates its blob with the first token in it (so that tokens never
    /// go back, whoever takes it) and, by default, no holder. Returns the new blob and the
    /// tenure its first holder starts from, or `None` when a concurrent caller created it first
    /// (read it again). `container_missing`: the read said the container is missing too.
    ///
    /// `creator`: a native lease's claim as its creator will write it once granted (an id it
    /// generated, no label, the expiry and token from the read's `Date`), written by the
    /// create instead, so that a grant in the same second needs no claim write of its own
    /// (see [`native::acquire`]). A native claim counts only while the blob is leased, so the
    /// create still grants nothing, whatever becomes of its answer.
    pub(super) async fn create_first(
        &self,
        blob: &BlobName,
        kind: Kind,
        (date, container_missing): (SystemTime, bool),
        creator: Option<(LeaseId, u64)>,
        now: SystemTime,
    ) -> Result<Option<(Snapshot, Tenure)>, Error> {
        let pending = Claim {
            holder: creator.map(|(id, _)| id),
            kind,
            since: unix_secs(date),
            expires: creator.map_or(0, |(_, expires)| expires),
            token: claim::first_token(date)?,
            label: String::new(),
        };
        let Some(created) = self
            .create(
                blob,
                pending.clone(),
                creator.is_some(),
                container_missing,
                now,
            )
            .await?
        else {
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
    /// container if that is missing: first when the caller's read already said so
    /// (`container_missing`), else when the create is refused `ContainerNotFound`. Returns the
    /// new blob as a snapshot, or `None` when a concurrent caller created it first (not an
    /// error: read it).
    pub(super) async fn create(
        &self,
        blob: &BlobName,
        claim: Claim,
        unconfirmed: bool,
        mut container_missing: bool,
        now: SystemTime,
    ) -> Result<Option<Snapshot>, Error> {
        let mut metadata = Metadata::new();
        claim.write(&mut metadata);
        if unconfirmed {
            claim::mark_unconfirmed(&mut metadata);
        }
        let op = PutBlob {
            kind: BlobKind::Page(0),
            condition: Condition::IfNotExists,
            metadata: metadata.clone(),
            ..PutBlob::block(self.client.container().clone(), blob.clone(), Vec::new())
        };
        for _ in 0..MAX_ATTEMPTS {
            if container_missing {
                self.client
                    .execute(
                        &CreateContainer {
                            container: self.client.container().clone(),
                        },
                        now,
                    )
                    .await?;
            }
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
                        unconfirmed,
                    }));
                }
                Ok((WriteOutcome::Refused(_), _)) => return Ok(None),
                // Deleted meanwhile, or the read could not tell: create it, then try again.
                Err(e) if e.class() == Some(ErrorClass::ContainerMissing) => {
                    container_missing = true;
                }
                Err(e) => return Err(e),
            }
        }
        Err(gave_up("create the lock blob"))
    }

    /// A lease operation on `blob`.
    pub(super) fn lease_op(&self, blob: &BlobName, action: LeaseAction) -> Lease {
        Lease::new(self.client.container().clone(), blob.clone(), action)
    }
}

/// Refuses marks that would write over the claim (names with its prefix `leasegate_`).
pub(super) fn own_marks(marks: &Metadata) -> Result<(), Error> {
    match marks.keys().find(|k| claim::is_claim_field(k)) {
        Some(name) => Err(Error::InvalidArgument(format!(
            "mark {name} uses the claim's prefix leasegate_"
        ))),
        None => Ok(()),
    }
}

/// `metadata` with `marks` set (names lowercased; an empty value removes the mark).
pub(super) fn with_marks(metadata: &Metadata, marks: &Metadata) -> Metadata {
    let mut metadata = metadata.clone();
    for (name, value) in marks {
        if value.is_empty() {
            metadata.remove(&name.to_ascii_lowercase());
        } else {
            metadata.insert(name.to_ascii_lowercase(), value.clone());
        }
    }
    metadata
}

/// A HEAD of a lock blob ([`GetProperties`]) that also tells a missing container from a
/// missing blob, by its 404's `x-ms-error-code` (a peer that sends none: the blob).
struct HeadLock(GetProperties);

/// What a [`HeadLock`] found: the blob's properties, or `None` and whether the container is
/// missing too.
struct Head {
    props: Option<BlobProperties>,
    container_missing: bool,
}

impl Operation for HeadLock {
    type Output = Head;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        self.0.request(account)
    }
    fn parse(&self, response: &Response) -> Result<Head, Error> {
        let props = self.0.parse(response)?;
        Ok(Head {
            container_missing: props.is_none()
                && response.headers().get("x-ms-error-code") == Some("ContainerNotFound"),
            props,
        })
    }
}

/// Whether an acquire's answer means storage may have granted the lock (5xx, a lost answer):
/// then the caller gives it back before reporting the error. A refused connection sent nothing.
pub(super) fn may_have_granted(e: &Error) -> bool {
    match e {
        Error::Transport(t) => t.kind != crate::TransportErrorKind::Connect,
        other => other.outcome_unknown(),
    }
}

/// A held fast path's request that storage refused (the blob moved or went, the lease is not
/// ours): nothing landed, read first.
pub(super) fn refused(e: &Error) -> bool {
    is_missing(e)
        || matches!(
            e.class(),
            Some(ErrorClass::PreconditionFailed | ErrorClass::HeldByOther | ErrorClass::LeaseLost)
        )
}

pub(super) fn is_missing(e: &Error) -> bool {
    matches!(
        e.class(),
        Some(ErrorClass::BlobMissing | ErrorClass::ContainerMissing)
    )
}

pub(super) fn no_date() -> Error {
    Error::unexpected(
        StatusCode::OK,
        "storage sent no Date header; lease expiry is judged by the server's clock",
    )
}

pub(super) fn gave_up(what: &str) -> Error {
    Error::unexpected(
        StatusCode::CONFLICT,
        format!("could not {what}: the lock blob kept changing under us"),
    )
}
