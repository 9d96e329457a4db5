//! The crate's one error type, and the classification of storage error responses.
//!
//! Storage answers are classified by their `x-ms-error-code`, never by status alone: a 409 can
//! mean "someone else holds the lease", "you lost the lease" or "the blob already exists", and
//! each asks for a different reaction. See the
//! [Blob service error codes](https://learn.microsoft.com/rest/api/storageservices/blob-service-error-codes)
//! and [Lease Blob](https://learn.microsoft.com/rest/api/storageservices/lease-blob#outcomes-of-lease-operations-on-blobs-by-lease-state).

use crate::message::StatusCode;

/// What a storage error response means to a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The lease is held by someone else (`LeaseAlreadyPresent`,
    /// `LeaseIsBreakingAndCannotBeAcquired`, or a write without lease id on a leased blob:
    /// `LeaseIdMissing`).
    HeldByOther,
    /// The lease we name is not ours (any more): `LeaseIdMismatchWith*`,
    /// `LeaseNotPresentWith*`, `LeaseIsBrokenAndCannotBeRenewed`, `LeaseAlreadyBroken`,
    /// `LeaseLost`.
    LeaseLost,
    /// `BlobNotFound`.
    BlobMissing,
    /// `ContainerNotFound`.
    ContainerMissing,
    /// `TableNotFound`, `TableBeingDeleted` (Table service).
    TableMissing,
    /// The Table service's `ResourceNotFound` for an entity: a point read, update, merge or
    /// delete of an entity that is not there (classified so by [`crate::table`] only).
    EntityMissing,
    /// `BlobAlreadyExists`, `ContainerAlreadyExists`; the Table service's
    /// `EntityAlreadyExists`, `TableAlreadyExists`.
    AlreadyExists,
    /// A conditional header (`If-Match`, `If-None-Match`, ...) did not hold: `ConditionNotMet`
    /// (the Table service: `UpdateConditionNotSatisfied`).
    PreconditionFailed,
    /// 403 (or 401): the signature, key, SAS or token was refused, or the identity lacks a role.
    Auth,
    /// 400 or another 4xx that says the request itself was wrong.
    BadRequest,
    /// 500, 503 (`ServerBusy`, `OperationTimedOut`, `InternalError`): the outcome is unknown.
    ServerBusy,
    /// A code this crate does not know; treat the outcome as unknown.
    Unknown,
}

impl ErrorClass {
    /// Classifies a storage error response by its error code, falling back to the status only
    /// for codes this crate does not know.
    pub fn classify(status: StatusCode, code: Option<&str>) -> ErrorClass {
        match code.unwrap_or("") {
            "LeaseAlreadyPresent" | "LeaseIsBreakingAndCannotBeAcquired" | "LeaseIdMissing" => {
                ErrorClass::HeldByOther
            }
            "LeaseIdMismatchWithLeaseOperation"
            | "LeaseNotPresentWithLeaseOperation"
            | "LeaseIsBrokenAndCannotBeRenewed"
            | "LeaseAlreadyBroken"
            | "LeaseLost"
            | "LeaseIdMismatchWithBlobOperation"
            | "LeaseNotPresentWithBlobOperation"
            | "LeaseIsBreakingAndCannotBeChanged"
            | "LeaseIdMismatchWithContainerOperation"
            | "LeaseNotPresentWithContainerOperation" => ErrorClass::LeaseLost,
            "BlobNotFound" => ErrorClass::BlobMissing,
            "ContainerNotFound" | "ContainerBeingDeleted" => ErrorClass::ContainerMissing,
            "TableNotFound" | "TableBeingDeleted" => ErrorClass::TableMissing,
            "BlobAlreadyExists"
            | "ContainerAlreadyExists"
            | "EntityAlreadyExists"
            | "TableAlreadyExists" => ErrorClass::AlreadyExists,
            "ConditionNotMet"
            | "TargetConditionNotMet"
            | "SourceConditionNotMet"
            | "UpdateConditionNotSatisfied" => ErrorClass::PreconditionFailed,
            "AuthenticationFailed"
            | "InvalidAuthenticationInfo"
            | "KeyBasedAuthenticationNotPermitted"
            | "AuthorizationFailure"
            | "AuthorizationPermissionMismatch"
            | "AuthorizationResourceTypeMismatch"
            | "AuthorizationProtocolMismatch"
            | "AuthorizationSourceIPMismatch"
            | "InsufficientAccountPermissions" => ErrorClass::Auth,
            "ServerBusy" | "OperationTimedOut" | "InternalError" => ErrorClass::ServerBusy,
            _ => match status.as_u16() {
                403 | 401 => ErrorClass::Auth,
                500..=599 => ErrorClass::ServerBusy,
                // An unknown 4xx code still says the request was refused: it did nothing.
                400..=499 => ErrorClass::BadRequest,
                _ => ErrorClass::Unknown,
            },
        }
    }

    /// True when the request may or may not have taken effect (5xx, unknown codes). Callers
    /// that must not act twice treat such an outcome as "not acquired" (fail closed).
    pub fn outcome_unknown(self) -> bool {
        matches!(self, ErrorClass::ServerBusy | ErrorClass::Unknown)
    }
}

/// A storage error response: the status, `x-ms-error-code` and `x-ms-request-id`, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The `x-ms-error-code` header (or the `<Code>` of the XML body).
    pub code: Option<String>,
    /// The `x-ms-request-id` header, for support requests.
    pub request_id: Option<String>,
    /// What the error means.
    pub class: ErrorClass,
    /// The `Retry-After` storage sent with it (whole seconds), if any.
    pub retry_after: Option<std::time::Duration>,
}

impl StorageError {
    /// True when storage refused the bearer token itself (expired, revoked, for another
    /// resource or tenant: 401, or 403 `InvalidAuthenticationInfo` / `AuthenticationFailed`),
    /// so that a new token may be accepted; not a missing role
    /// (`AuthorizationPermissionMismatch`), which a new token does not cure.
    pub fn token_refused(&self) -> bool {
        self.status.as_u16() == 401
            || (self.status.as_u16() == 403
                && matches!(
                    self.code.as_deref(),
                    Some("InvalidAuthenticationInfo" | "AuthenticationFailed")
                ))
    }
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "storage answered {}", status_name(self.status))?;
        if let Some(code) = &self.code {
            write!(f, ": {code}")?;
        }
        write!(f, " ({:?})", self.class)?;
        if let Some(id) = &self.request_id {
            write!(f, ", request id {id}")?;
        }
        Ok(())
    }
}

/// A status with its reason phrase where it has one (`403 Forbidden`, `499`).
pub(crate) fn status_name(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// ` at operation {index}`, for a batch's error message.
fn at_operation(index: Option<usize>) -> String {
    index.map_or(String::new(), |i| format!(" at operation {i}"))
}

/// What went wrong below the HTTP layer: the request may or may not have reached storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportErrorKind {
    /// The connection was refused or could not be made (nothing was sent).
    Connect,
    /// No answer in time (the request may have taken effect).
    Timeout,
    /// Anything else (the request may have taken effect).
    Other,
}

/// A failure to exchange a request and a response. Implementations of
/// [`Transport`](crate::Transport) build it with a message that must not contain a URL query,
/// a header value or any other secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("transport failed ({kind:?}): {message}")]
pub struct TransportError {
    /// What kind of failure.
    pub kind: TransportErrorKind,
    /// A description that holds no secret.
    pub message: String,
}

impl TransportError {
    /// A transport error of `kind`; `message` must hold no secret.
    pub fn new(kind: TransportErrorKind, message: impl Into<String>) -> Self {
        TransportError {
            kind,
            message: message.into(),
        }
    }
}

/// No access token could be had. The message names the endpoint and what it said, never a
/// secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenError {
    /// What happened.
    pub message: String,
    /// True when asking again later may work (the endpoint was unreachable, busy or failing);
    /// false when the endpoint refused (a wrong secret, no identity): a configuration fault.
    pub retryable: bool,
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A connection string could not be used; the message names the key, never a value.
    #[error("invalid connection string: {0}")]
    ConnectionString(String),
    /// An endpoint URL could not be used.
    #[error("invalid endpoint: {0}")]
    Endpoint(String),
    /// An account key that is not valid base64.
    #[error("invalid account key: not base64")]
    AccountKey,
    /// A lock name, device id, container or blob name that cannot be used.
    #[error("invalid {what}: {reason}")]
    InvalidName {
        /// What was being named ("lock name", "container name", ...).
        what: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// An argument out of range (a lease duration, a window, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Storage answered with an error.
    #[error("{0}")]
    Storage(StorageError),
    /// An entity group transaction (a table batch) failed as a whole with an error that is
    /// not a refused condition: `index` is the operation storage named (from 0), when it did.
    /// Nothing of the batch was written.
    #[error("table batch failed{}: {error}", at_operation(*.index))]
    Batch {
        /// The operation storage named.
        index: Option<usize>,
        /// Its error.
        error: StorageError,
    },
    /// A lock blob holds something this crate will not act on (a malformed or out-of-range
    /// claim in its metadata); the message names the field. An operator can break and release
    /// the lock, or delete the blob (tokens stay increasing: see the fencing rule).
    #[error("unusable lock blob: {0}")]
    CorruptLock(String),
    /// [`Error::CorruptLock`] of a named lock, as [`crate::lease::Locks`] returns it: `lock`
    /// is the lock's path in `container` as people (and the `leasegate` CLI) name it.
    #[error("unusable lock blob {lock}: {reason}")]
    UnusableLock {
        /// The lock's path in its container (`gates/tenant-a/lock`).
        lock: String,
        /// The container.
        container: String,
        /// What is wrong, naming the metadata field.
        reason: String,
    },
    /// Storage answered something this crate cannot read.
    #[error("unexpected response ({}): {detail}", status_name(*status))]
    UnexpectedResponse {
        /// The status of the response.
        status: StatusCode,
        /// What was wrong with it.
        detail: String,
    },
    /// The request could not be exchanged.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// No access token could be had for a bearer credential (the request was not sent).
    #[error("no access token: {0}")]
    Token(TokenError),
}

impl Error {
    /// The classification of a storage error, if this is one.
    pub fn class(&self) -> Option<ErrorClass> {
        match self {
            Error::Storage(e) | Error::Batch { error: e, .. } => Some(e.class),
            _ => None,
        }
    }

    /// True when storage may have acted on the request (5xx, transport failures after sending,
    /// unreadable answers): callers that must not act twice fail closed.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Error::Storage(e) | Error::Batch { error: e, .. } => e.class.outcome_unknown(),
            Error::Transport(_) | Error::UnexpectedResponse { .. } => true,
            _ => false,
        }
    }

    pub(crate) fn unexpected(status: StatusCode, detail: impl Into<String>) -> Self {
        Error::UnexpectedResponse {
            status,
            detail: detail.into(),
        }
    }
}
