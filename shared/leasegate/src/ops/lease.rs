//! [Lease Blob](https://learn.microsoft.com/rest/api/storageservices/lease-blob).

use super::*;

// Leases.

/// [Lease Blob](https://learn.microsoft.com/rest/api/storageservices/lease-blob) actions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseAction {
    /// Acquire with this id for this long. Acquiring again with the id you hold extends it.
    Acquire {
        /// `x-ms-lease-duration`.
        duration: LeaseDuration,
        /// `x-ms-proposed-lease-id`.
        proposed: LeaseId,
    },
    /// Reset the timer of a lease you hold.
    Renew(LeaseId),
    /// Change the id of a lease you hold.
    Change {
        /// The id you hold.
        current: LeaseId,
        /// The id it becomes.
        proposed: LeaseId,
    },
    /// Give the lease up.
    Release(LeaseId),
    /// End whoever's lease after `period` seconds (0 to 60).
    Break {
        /// `x-ms-lease-break-period`; `None` lets the lease run out first.
        period: Option<u8>,
    },
}

/// A lease operation on a blob.
#[derive(Debug, Clone)]
pub struct Lease {
    /// The container.
    pub container: ContainerName,
    /// The blob.
    pub blob: BlobName,
    /// What to do.
    pub action: LeaseAction,
    /// Only if the blob is at this version (`If-Match`): lease operations accept the
    /// conditional headers, and leasegate acquires only at the ETag it has just read.
    pub condition: Condition,
}

impl Lease {
    /// `action` on `blob`, unconditionally.
    pub fn new(container: ContainerName, blob: BlobName, action: LeaseAction) -> Self {
        Lease {
            container,
            blob,
            action,
            condition: Condition::None,
        }
    }

    /// Makes the operation conditional.
    pub fn with_condition(mut self, condition: Condition) -> Self {
        self.condition = condition;
        self
    }
}

/// The answer to a lease operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// Acquire, renew or change succeeded: the lease is held with this id.
    Held {
        /// `x-ms-lease-id`.
        lease_id: LeaseId,
        /// The storage server's `Date`.
        server_date: Option<SystemTime>,
        /// The blob's ETag (leases do not change it).
        etag: Option<ETag>,
    },
    /// Released (200).
    Released,
    /// Broken or breaking: it ends after this long (`x-ms-lease-time`).
    Broken {
        /// Time left until the lease is free.
        remaining: Duration,
    },
    /// Someone else holds the lease (acquire or change refused).
    HeldByOther,
    /// The lease named is not the blob's (renew, change or release of a lost lease; break of a
    /// blob with no lease).
    NotHeld,
}

impl Operation for Lease {
    type Output = LeaseOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let r = request(
            Method::PUT,
            blob_url(account, &self.container, &self.blob, "?comp=lease"),
            Vec::new(),
        )?;
        match &self.action {
            LeaseAction::Acquire { duration, proposed } => r
                .header("x-ms-lease-action", "acquire")?
                .header("x-ms-lease-duration", duration.header_value())?
                .header("x-ms-proposed-lease-id", proposed.to_string())?,
            LeaseAction::Renew(id) => r
                .header("x-ms-lease-action", "renew")?
                .header("x-ms-lease-id", id.to_string())?,
            LeaseAction::Change { current, proposed } => r
                .header("x-ms-lease-action", "change")?
                .header("x-ms-lease-id", current.to_string())?
                .header("x-ms-proposed-lease-id", proposed.to_string())?,
            LeaseAction::Release(id) => r
                .header("x-ms-lease-action", "release")?
                .header("x-ms-lease-id", id.to_string())?,
            LeaseAction::Break { period } => {
                if period.is_some_and(|p| p > 60) {
                    return Err(Error::InvalidArgument(
                        "a break period is 0 to 60 seconds".into(),
                    ));
                }
                r.header("x-ms-lease-action", "break")?
                    .opt_header("x-ms-lease-break-period", period.map(|p| p.to_string()))?
            }
        }
        .condition(&self.condition)?
        .finish()
    }

    fn parse(&self, response: &Response) -> Result<LeaseOutcome, Error> {
        let ok: &[u16] = match self.action {
            LeaseAction::Acquire { .. } => &[201],
            LeaseAction::Break { .. } => &[202],
            _ => &[200],
        };
        match expect(response, ok) {
            Ok(()) => {}
            Err(Error::Storage(e)) => {
                return match (e.class, &self.action) {
                    (ErrorClass::HeldByOther, _) => Ok(LeaseOutcome::HeldByOther),
                    (ErrorClass::LeaseLost, _) => Ok(LeaseOutcome::NotHeld),
                    _ => Err(Error::Storage(e)),
                }
            }
            Err(e) => return Err(e),
        }
        match &self.action {
            LeaseAction::Release(_) => Ok(LeaseOutcome::Released),
            LeaseAction::Break { .. } => {
                let secs = header_str(response, "x-ms-lease-time")
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                Ok(LeaseOutcome::Broken {
                    remaining: Duration::from_secs(secs),
                })
            }
            _ => {
                let lease_id = header_str(response, "x-ms-lease-id")
                    .and_then(|s| LeaseId::try_new(s).ok())
                    .ok_or_else(|| {
                        Error::unexpected(response.status(), "no valid x-ms-lease-id in the answer")
                    })?;
                Ok(LeaseOutcome::Held {
                    lease_id,
                    server_date: server_date(response),
                    etag: etag(response),
                })
            }
        }
    }
}
