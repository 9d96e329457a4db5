//! A lock blob as one read (`HEAD`) saw it, and what follows from it by the server's clock:
//! who holds the lock, whether a caller may take it, the tenure and token a new holder gets.
//! [`native`](super::native) and [`record`](super::record) decide on it.

use std::time::{Duration, SystemTime};

use super::claim::{self, Claim, Kind, MAX_TOKEN};
use super::{Acquire, Holder, MAX_WINDOW_SECS};
use crate::message::StatusCode;
use crate::ops::{BlobProperties, Metadata};
use crate::types::{unix_secs, ETag, LeaseDuration, LeaseId, LeaseState};
use crate::Error;

/// A lock blob as one HEAD saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Snapshot {
    pub(super) etag: ETag,
    pub(super) leased: bool,
    /// The lease is being broken (an operator's break period): nobody may extend or switch.
    pub(super) breaking: bool,
    pub(super) metadata: Metadata,
    pub(super) claim: Claim,
    /// The highest token issued: the claim's, or the page blob sequence number that older
    /// leasegate versions used as the native lease's counter.
    pub(super) highest_token: u64,
    pub(super) server_date: SystemTime,
    /// Ids that stepped down, each barred until a time (Unix seconds, the server's clock).
    pub(super) stepped_down: Vec<(LeaseId, u64)>,
    /// The claim is the one the blob's create wrote, before its holder's grant
    /// ([`claim::META_UNCONFIRMED`]).
    pub(super) unconfirmed: bool,
}

impl Snapshot {
    pub(super) fn from_properties(
        props: BlobProperties,
        server_date: SystemTime,
    ) -> Result<Self, Error> {
        let etag = props
            .etag
            .ok_or_else(|| Error::unexpected(StatusCode::OK, "the lock blob has no ETag"))?;
        let claim = Claim::read(&props.metadata)?;
        let highest_token = claim.token.max(props.sequence_number.unwrap_or(0));
        let sequence = props.sequence_number.unwrap_or(0);
        if sequence > MAX_TOKEN {
            return Err(Error::CorruptLock(format!(
                "the page blob sequence number {sequence} is above {MAX_TOKEN}"
            )));
        }
        let stepped_down = claim::read_stepped_down(&props.metadata)?;
        let unconfirmed = claim::is_unconfirmed(&props.metadata);
        Ok(Snapshot {
            etag,
            leased: props.lease_state.is_some_and(LeaseState::is_held),
            breaking: props.lease_state == Some(LeaseState::Breaking),
            metadata: props.metadata,
            claim,
            highest_token,
            server_date: checked_date(server_date)?,
            stepped_down,
            unconfirmed,
        })
    }

    /// This blob, leased, as storage said at `date` (a lease refused at its ETag).
    pub(super) fn leased_at(&self, date: SystemTime) -> Option<Snapshot> {
        Some(Snapshot {
            leased: true,
            server_date: checked_date(date).ok()?,
            ..self.clone()
        })
    }

    pub(super) fn server_secs(&self) -> u64 {
        unix_secs(self.server_date)
    }

    /// The claim of whoever holds the lock now, if it says so:
    /// * a live record (with the blob also leased by the same holder after a term switch whose
    ///   lease could not be let go);
    /// * a leased blob's native claim that has not run out (an infinite one never does). Every
    ///   native holder writes its claim when granted and moves its expiry when it extends, so a
    ///   leased blob without one is held by a holder that stopped between its grant and its
    ///   claim: only the acquire itself can tell whose it is.
    ///
    /// A native claim's expiry is the grant's `Date` (whole seconds, rounded down) plus the
    /// duration, so storage's lease can outlive it by up to a second: while storage says the
    /// blob is leased, the claim still counts in the second it names. (Storage's lease state
    /// decides; the claim only says whose the lease is and its token.)
    pub(super) fn holder_claim(&self) -> Option<&Claim> {
        let c = &self.claim;
        c.holder?;
        match c.kind {
            Kind::Record => (c.expires > self.server_secs()).then_some(c),
            Kind::Native(LeaseDuration::Infinite) => self.leased.then_some(c),
            Kind::Native(_) => (self.leased && c.expires >= self.server_secs()).then_some(c),
        }
    }

    /// The live record of the lock (for a break, and for inspection).
    pub(super) fn live_record(&self) -> Option<&Claim> {
        self.holder_claim().filter(|c| c.kind == Kind::Record)
    }

    /// Whether `id` holds the lock as its claim says.
    pub(super) fn held_by(&self, id: LeaseId) -> bool {
        self.holder_claim().is_some_and(|c| c.holder == Some(id))
    }

    /// Who holds the lock, if anyone does and it is not `id`: the refusal to give `id`. `None`
    /// also for a leased blob whose holder wrote no claim: the acquire itself tells (storage
    /// grants that lease to its own id only, and refuses a record over it). During a break
    /// period nobody extends or switches.
    pub(super) fn busy_for(&self, id: LeaseId) -> Option<Acquire> {
        match self.holder_claim() {
            Some(c) if c.holder == Some(id) && !self.breaking => None,
            Some(_) => Some(self.busy()),
            None if self.breaking => Some(self.busy()),
            None => {
                // A free lock that `id` stepped down from: not before its bar ends.
                let now = self.server_secs();
                let until = self
                    .stepped_down
                    .iter()
                    .find(|(who, until)| *who == id && *until > now)?
                    .1;
                Some(Acquire::Busy {
                    retry_after: Some(Duration::from_secs(until - now)),
                    holder: None,
                    stepped_down_until: Some(at(until)),
                })
            }
        }
    }

    /// Whether the lease may be `id`'s own though the claim names another, until storage says:
    /// a caller took the lease and lost its claim's write, and the claim in place counts for
    /// as long as a lease holds without telling whose it is:
    /// * the claim the blob's create wrote for its creator (another caller may have taken the
    ///   lease at the new blob first);
    /// * an infinite lease's claim, which its holder's release leaves in place and which never
    ///   runs out (a 15 to 60 s claim runs out within its lease's term).
    ///
    /// Only an id a caller chose can be that caller (a generated one is new to storage); its
    /// acquire asks storage, which grants that lease to its own id only.
    pub(super) fn may_be_held_by(&self, id: LeaseId) -> bool {
        self.leased
            && !self.breaking
            && self.holder_claim().is_some_and(|c| {
                c.holder != Some(id)
                    && (self.unconfirmed || c.kind == Kind::Native(LeaseDuration::Infinite))
            })
    }

    /// "Busy", with the time the holder has left where its claim tells it (every holder moves
    /// its claim's expiry when it extends).
    pub(super) fn busy(&self) -> Acquire {
        let now = self.server_secs();
        let claim = self.holder_claim();
        // At least a second: a native claim counts in the second it names (see `holder_claim`).
        let retry_after = claim
            .filter(|c| c.expires > 0)
            .map(|c| Duration::from_secs(c.expires.saturating_sub(now).max(1)));
        Acquire::Busy {
            retry_after,
            holder: claim.map(|c| Holder {
                label: c.label.clone(),
                since: c.since_at(),
                expires_at: c.expires_at(),
                token: c.token,
                held_for: c
                    .since_at()
                    .and_then(|since| self.server_date.duration_since(since).ok()),
                marks: self.marks(),
            }),
            stepped_down_until: None,
        }
    }

    /// The blob's own marks: its metadata other than the claim.
    pub(super) fn marks(&self) -> Metadata {
        claim::marks_of(&self.metadata)
    }

    /// The live record of `id`, whether or not the blob is leased too (a holder that switched
    /// from a native lease to a record and could not let the lease go).
    pub(super) fn record_of(&self, id: LeaseId) -> Option<&Claim> {
        self.live_record().filter(|c| c.holder == Some(id))
    }

    /// `id`'s tenure if it takes the lock now: its own (it holds the lock already, in either
    /// term), or a new one with a token by [the fencing rule](claim::next_token).
    pub(super) fn tenure_for(&self, id: LeaseId) -> Result<Tenure, Error> {
        let own = self.holder_claim().filter(|c| c.holder == Some(id));
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
    pub(super) fn with_claim(&self, claim: &Claim) -> Metadata {
        let mut m = self.metadata.clone();
        claim.write(&mut m);
        m
    }
}

/// A holder's tenure: its token, when it began (server seconds), and whether the holder held
/// the lock already (an extension keeps token and start).
#[derive(Debug, Clone, Copy)]
pub(super) struct Tenure {
    pub(super) token: u64,
    pub(super) since: u64,
    pub(super) extended: bool,
}

/// What one read of a lock blob found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Read {
    /// No blob yet, at this server time `date`; `container_missing` when storage said the
    /// container is missing too (`ContainerNotFound`), so the blob's create starts by creating
    /// it instead of learning it from a refused create.
    Missing {
        date: SystemTime,
        container_missing: bool,
    },
    /// The blob.
    Found(Snapshot),
}

/// The latest server `Date` this crate acts on: one window before the latest time a claim may
/// name, so that no expiry it computes is out of range (a storage clock past the year 9000 is
/// broken, or hostile).
pub(super) fn checked_date(date: SystemTime) -> Result<SystemTime, Error> {
    if unix_secs(date) > claim::MAX_SECS - MAX_WINDOW_SECS - 1 {
        return Err(Error::unexpected(
            StatusCode::OK,
            "storage's Date header is out of range (after the year 9000)",
        ));
    }
    Ok(date)
}

/// `secs` as a time.
pub(super) fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}
