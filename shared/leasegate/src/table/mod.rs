//! Azure Table storage over signed REST, sans-IO like the Blob side: tables, entity writes,
//! point reads, queries and entity group transactions (batches).
//!
//! As for blobs, an operation ([`TableOperation`]) builds an unsigned [`Request`] for an
//! [`Account`]; [`build`] stamps and authorizes it with the account's credential (SharedKey by
//! the [Table service's own rules](signing), a SAS, or an Entra ID bearer token); the caller
//! sends it; the operation's `parse` turns the [`Response`] into a typed outcome. The account
//! needs a table endpoint ([`Account::table_endpoint`]): a connection string gives one
//! (`TableEndpoint`, or derived: `UseDevelopmentStorage=true` is Azurite's
//! `http://127.0.0.1:10002/devstoreaccount1`), or [`Account::with_table_endpoint`] does.
//! [`TableClient`] does the round trip through a [`Transport`].
//!
//! Outcomes of a condition are values: an insert of an entity that exists, an `If-Match` that
//! no longer holds and an update or delete of an entity that is not there are
//! [`TableRefusal`]s, for a [`Batch`] with the index of the operation that was refused
//! ([`BatchOutcome::Refused`]), nothing of the batch having been written. Anything else (a
//! 403, a 5xx, a malformed answer) is an [`Error`] with the status and the error code.
//!
//! Entities are JSON with OData annotations; **an Int64 (a fencing token) is sent as a
//! decimal string annotated `Edm.Int64`** (see [`entity`]), and read back as an
//! [`EdmValue::Int64`].
//!
//! # Example: a fenced batch, by hand
//! ```
//! use std::time::{Duration, SystemTime};
//! use leasegate::table::{self, Batch, BatchOperation, BatchOutcome, Entity, EntityTag};
//! use leasegate::table::{IfMatch, TableName, TableOperation, TableRefusal};
//! use leasegate::Account;
//!
//! let account = Account::from_connection_string("UseDevelopmentStorage=true")?;
//! let fence_etag = EntityTag::new("W/\"datetime'2026-11-21T14%3A00%3A00.1234567Z'\"");
//! let batch = Batch::new(TableName::try_new("ledger")?, "book-1")?
//!     // The fence entity, updated only if no newer holder has written it since it was read.
//!     .with(BatchOperation::Update(
//!         Entity::new("book-1", "fence").with("fencingToken", 7_i64),
//!         IfMatch::ETag(fence_etag),
//!     ))?
//!     .with(BatchOperation::Insert(
//!         Entity::new("book-1", "entry-0001").with("fencingToken", 7_i64).with("amount", 42),
//!     ))?;
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_096_800);
//! let request = table::build(&batch, &account, now)?;
//! assert!(request.uri().ends_with("/devstoreaccount1/$batch"));
//!
//! // ... the caller sends `request` and gets this back: a newer holder moved the fence on.
//! let answer = "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n\
//!     --changesetresponse_1\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n\
//!     HTTP/1.1 412 Precondition Failed\r\nContent-ID: 1\r\nContent-Type: application/json\r\n\r\n\
//!     {\"odata.error\":{\"code\":\"UpdateConditionNotSatisfied\",\"message\":{\"value\":\"0:The update condition was not satisfied.\"}}}\r\n\
//!     --changesetresponse_1--\r\n--batchresponse_1--\r\n";
//! let response = leasegate::Response::new(leasegate::StatusCode::ACCEPTED)
//!     .with_header("content-type", "multipart/mixed; boundary=batchresponse_1")
//!     .with_body(answer.as_bytes().to_vec());
//! assert_eq!(
//!     batch.parse(&response)?,
//!     BatchOutcome::Refused { index: Some(0), refusal: TableRefusal::ConditionNotMet },
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::future::Future;
use std::pin::Pin;
use std::time::SystemTime;

use crate::blob::send_authorized;
use crate::message::{Request, Response};
use crate::ops::server_date;
use crate::{Account, Error, Transport};

pub mod batch;
pub mod entity;
pub mod ops;
pub mod query;
pub mod signing;

pub use batch::{Batch, BatchItem, BatchOperation, BatchOutcome, MAX_BATCH_OPERATIONS};
pub use entity::{EdmValue, Entity, EntityTag, StoredEntity, TableName};
pub use ops::{
    CreateTable, DeleteEntity, EntityDeleteOutcome, EntityWriteOutcome, EntityWritten, IfMatch,
    InsertEntity, MergeEntity, TableCreated, TableOperation, TableRefusal, UpdateEntity,
    UpsertEntity, UpsertMode,
};
pub use query::{int64_literal, string_literal, Continuation, GetEntity, QueryEntities, QueryPage};

/// Builds the authorized request of `op` at time `now` (a parameter; use the caller's clock,
/// which must be within 15 minutes of the server's).
pub fn build<O: TableOperation + ?Sized>(
    op: &O,
    account: &Account,
    now: SystemTime,
) -> Result<Request, Error> {
    let mut request = op.request(account)?;
    signing::authorize(&mut request, account, now)?;
    Ok(request)
}

/// The tables of an account, reached through a [`Transport`] with the account's credential:
/// it signs each request (Table SharedKey, a SAS or a bearer token, asked of the transport
/// right before sending), dates it, sends it and parses the answer of a [`TableOperation`].
/// Like the rest of the crate it does no IO of its own.
#[derive(Debug, Clone)]
pub struct TableClient<T> {
    transport: T,
    account: Account,
}

impl<T: Transport> TableClient<T> {
    /// The tables of `account`, reached through `transport`; refused if the account has no
    /// table endpoint.
    pub fn try_new(transport: T, account: Account) -> Result<Self, Error> {
        ops::endpoint(&account)?;
        Ok(TableClient { transport, account })
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The account.
    pub fn account(&self) -> &Account {
        &self.account
    }

    /// One round trip: builds, sends and parses `op`; also returns the server's `Date`.
    pub async fn execute<O: TableOperation>(
        &self,
        op: &O,
        now: SystemTime,
    ) -> Result<(O::Output, Option<SystemTime>), Error> {
        let response = self.round_trip(op.request(&self.account), now).await?;
        Ok((op.parse(&response)?, server_date(&response)))
    }

    /// Signs and sends, whatever the operation (kept apart and behind a pointer, as
    /// [`crate::BlobClient`]'s, so the sending state machine exists once in a component).
    fn round_trip(
        &self,
        request: Result<Request, Error>,
        now: SystemTime,
    ) -> Pin<Box<dyn Future<Output = Result<Response, Error>> + '_>> {
        Box::pin(send_authorized(
            &self.transport,
            &self.account,
            request,
            now,
            signing::authorize_with,
        ))
    }
}
