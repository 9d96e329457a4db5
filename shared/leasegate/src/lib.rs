//! Azure Blob Storage leases over signed REST, for stateless (WebAssembly) functions.
//!
//! **This crate does no IO and reads no clock.** It builds signed [`Request`]s and reads
//! [`Response`]s (plain values); whoever calls it sends the requests (through a
//! [`Transport`]) and passes the time in. Expiry is always judged by the storage server's
//! `Date` header, never by the caller's clock.
//!
//! The crate's root holds the plumbing every caller uses (the [`Account`] and its
//! [`Credential`], names, [`Request`] and [`Response`], errors, the [`Transport`], the
//! [`BlobClient`]); its modules are namespaces by concern. Layers, bottom up:
//! * [`Account`]: connection strings, blob and table endpoints (host style and Azurite's path style),
//!   credentials (SharedKey, SAS, Entra ID bearer tokens); secrets never print.
//! * [`token`]: Entra ID token sources (managed identity, client secret): the token request
//!   and its answer.
//! * [`signing`]: SharedKey string-to-sign and signature, service SAS generation.
//! * [`ops`]: one request builder and one response parser per Blob operation, with outcomes
//!   classified by `x-ms-error-code` ([`ErrorClass`]).
//! * [`table`]: Azure Table storage the same way: the Table service's SharedKey, entity
//!   writes, point reads, queries and entity group transactions (`$batch`) answered per
//!   operation.
//! * [`lease`]: the algorithms a stateless caller needs: acquire (re-acquire extends), release
//!   (safe to retry), break, inspect, fencing tokens that never go back, and windows of any
//!   length through a lease record; one holder per lock whatever window each caller asks for.
//!
//! # Example: one operation, by hand
//! ```
//! use std::time::{Duration, SystemTime};
//! use leasegate::ops::{build, Lease, LeaseAction, LeaseOutcome, Operation};
//! use leasegate::{Account, BlobName, ContainerName, LeaseDuration, LeaseId};
//!
//! let account = Account::from_connection_string("UseDevelopmentStorage=true")?;
//! let op = Lease::new(
//!     ContainerName::try_new("leasegate")?,
//!     BlobName::try_new("locks/nightly-job")?,
//!     LeaseAction::Acquire {
//!         duration: LeaseDuration::try_from_secs(15)?,
//!         proposed: LeaseId::try_new("2f2c4b1e-8d2a-4c55-9a10-6f3e1d0c9b7a")?,
//!     },
//! );
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_096_800);
//! let request = build(&op, &account, now)?;
//! assert!(request.headers().get("authorization").unwrap().starts_with("SharedKey devstoreaccount1:"));
//!
//! // ... the caller sends `request` and gets this back:
//! let response = leasegate::Response::new(leasegate::StatusCode::CONFLICT)
//!     .with_header("x-ms-error-code", "LeaseAlreadyPresent");
//! assert_eq!(op.parse(&response)?, LeaseOutcome::HeldByOther);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Example: the algorithm, with a transport
//! ```no_run
//! # async fn demo(transport: impl leasegate::Transport, now: std::time::SystemTime) -> Result<(), leasegate::Error> {
//! use std::time::Duration;
//! use leasegate::lease::{Acquire, Locks, Term, Acquiring};
//! use leasegate::{Account, ContainerName, HolderKey, LeaseId, LockName};
//!
//! let account = Account::from_connection_string("UseDevelopmentStorage=true")?;
//! let key = HolderKey::try_new(b"a secret every instance of the app shares")?;
//! let locks = Locks::new(transport, account, ContainerName::try_new("leasegate")?);
//! let lock = LockName::try_new("jobs/nightly")?;
//! let me = LeaseId::for_holder(&key, "jobs", "node-a", &lock); // the same id every invocation
//! let term = Term::for_window(Duration::from_secs(30))?; // a native lease
//! match locks.acquire(&lock, Acquiring::new(term, me), now).await? {
//!     Acquire::Acquired(held) => println!("run the job with token {:?}", held.fencing_token),
//!     Acquire::Busy { .. } => println!("another node runs it"),
//! }
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::panic))]

// The README's examples are compiled and run as doctests too.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The plumbing every caller uses, private behind the names below.
mod account;
mod blob;
mod error;
mod message;
mod names;
mod transport;
mod types;

// The namespaces a caller reaches into: the lease rules, one type per operation, the Table
// service, fenced writes, the signing stages, times, Entra ID token sources.
pub mod fence;
pub mod lease;
pub mod ops;
pub mod signing;
pub mod table;
pub mod time;
pub mod token;

pub use account::{
    Account, AccountKey, BlobEndpoint, Credential, SasToken, TableEndpoint, DEV_ACCOUNT_KEY,
    DEV_ACCOUNT_NAME,
};
pub use blob::BlobClient;
pub use error::{Error, ErrorClass, StorageError, TokenError, TransportError, TransportErrorKind};
pub use message::{
    valid_header_name, valid_header_value, Headers, Method, Request, Response, StatusCode,
    SECRET_HEADERS,
};
pub use names::{is_format_or_separator, BlobName, ContainerName, LockName, MAX_LOCK_NAME_BYTES};
pub use token::{AccessToken, TokenSource};
pub use transport::{Counting, Transport};
pub use types::{ETag, HolderKey, LeaseDuration, LeaseId, LeaseState};
