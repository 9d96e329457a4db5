//! Table service operations, each a request builder paired with a response parser, as the
//! Blob side's [`crate::ops`]: tables and entity writes (insert, upsert, update, merge,
//! delete); the reads are in [`super::query`], the batch in [`super::batch`].
//!
//! Expected outcomes of a condition (the entity exists, its ETag moved on, it is not there)
//! are values ([`TableRefusal`]); everything else is an [`Error`] with the status and the
//! error code (`x-ms-error-code`, or the JSON `odata.error` code) classified
//! ([`ErrorClass`]).

use std::time::SystemTime;

use percent_encoding::utf8_percent_encode;
use serde_json::Value;

use super::entity::{check_key, Entity, EntityTag, TableName};
use crate::account::{Account, TableEndpoint};
use crate::error::{ErrorClass, StorageError};
use crate::message::{valid_header_value, Headers, Method, Request, Response, StatusCode};
use crate::names::UNRESERVED;
use crate::ops::server_date;
use crate::Error;

/// A Table service operation: how to ask, and how to read the answer.
pub trait TableOperation {
    /// What a successful exchange yields.
    type Output;
    /// The request, not yet stamped or authorized (see [`super::build`]).
    fn request(&self, account: &Account) -> Result<Request, Error>;
    /// Reads the response.
    fn parse(&self, response: &Response) -> Result<Self::Output, Error>;
}

/// What JSON answers are asked in: OData minimal metadata, under which the service annotates
/// the values JSON cannot type (Int64, DateTime, Guid, Binary) and gives each entity's ETag.
pub const ACCEPT: &str = "application/json;odata=minimalmetadata";

/// `If-Match` of an update, merge or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// `If-Match: *`: whatever its version, as long as the entity exists.
    Any,
    /// Only if the entity is still at this version (412 otherwise).
    ETag(EntityTag),
}

impl IfMatch {
    fn header(&self) -> &str {
        match self {
            IfMatch::Any => "*",
            IfMatch::ETag(tag) => tag.as_str(),
        }
    }
}

/// How an upsert treats an entity that exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpsertMode {
    /// [Insert Or Replace Entity](https://learn.microsoft.com/rest/api/storageservices/insert-or-replace-entity):
    /// the properties sent replace all the entity had.
    Replace,
    /// [Insert Or Merge Entity](https://learn.microsoft.com/rest/api/storageservices/insert-or-merge-entity):
    /// the properties sent are set, the others kept.
    Merge,
}

/// Why a conditional table write did not happen (it did nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableRefusal {
    /// An insert of an entity that exists (409 `EntityAlreadyExists`).
    AlreadyExists,
    /// `If-Match` named a version the entity is no longer at (412
    /// `UpdateConditionNotSatisfied`).
    ConditionNotMet,
    /// An update, merge or delete of an entity that is not there (404 `ResourceNotFound`).
    NotFound,
}

/// What a successful entity write reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityWritten {
    /// The entity's new ETag.
    pub etag: Option<EntityTag>,
    /// The storage server's `Date`.
    pub server_date: Option<SystemTime>,
}

/// The answer to an insert, upsert, update or merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntityWriteOutcome {
    /// The write happened.
    Written(EntityWritten),
    /// The write was refused, and did nothing.
    Refused(TableRefusal),
}

/// The answer to a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntityDeleteOutcome {
    /// Deleted.
    Deleted,
    /// Refused ([`TableRefusal::NotFound`]: nothing to delete), nothing deleted.
    Refused(TableRefusal),
}

// ---------------------------------------------------------------------------------------------
// Shared request and response helpers.

/// What an entity write does on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    /// `POST /{table}`.
    Insert,
    /// `PUT /{table}(keys)`: replace (an upsert without `If-Match`).
    Replace,
    /// `PATCH /{table}(keys)`: merge (an upsert without `If-Match`). The spec names the verb
    /// `MERGE`; the service and Azurite take `PATCH` alike (OData 3), which every HTTP stack
    /// and wasi:http carry.
    Merge,
    /// `DELETE /{table}(keys)`.
    Delete,
}

/// One entity write as a request line, headers and body: sent alone, or embedded in a batch.
#[derive(Debug, Clone)]
pub(crate) struct EntityRequest {
    pub(crate) method: Method,
    pub(crate) url: String,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: Vec<u8>,
}

/// The endpoint of the account's Table service, or an error saying how to give one.
pub(crate) fn endpoint(account: &Account) -> Result<&TableEndpoint, Error> {
    account.table_endpoint().ok_or_else(|| {
        Error::InvalidArgument(
            "the account has no table endpoint (give TableEndpoint in the connection string, \
             or Account::with_table_endpoint)"
                .into(),
        )
    })
}

/// A key as it is written in an entity's address: single quotes doubled (an OData string
/// literal), then percent-encoded (all but unreserved bytes), as the Azure SDKs send it.
fn key_literal(key: &str) -> String {
    utf8_percent_encode(&key.replace('\'', "''"), UNRESERVED).to_string()
}

/// `/{table}(PartitionKey='{pk}',RowKey='{rk}')`, encoded
/// ([addressing an entity](https://learn.microsoft.com/rest/api/storageservices/addressing-table-service-resources)).
pub(crate) fn entity_path(
    table: &TableName,
    partition_key: &str,
    row_key: &str,
) -> Result<String, Error> {
    check_key("PartitionKey", partition_key)?;
    check_key("RowKey", row_key)?;
    Ok(format!(
        "/{table}(PartitionKey='{}',RowKey='{}')",
        key_literal(partition_key),
        key_literal(row_key)
    ))
}

/// The request of one entity write. `entity` is the body (none for a delete); `keys` address
/// the entity (none for an insert, which is addressed by its body).
pub(crate) fn entity_request(
    endpoint: &TableEndpoint,
    table: &TableName,
    verb: Verb,
    keys: (&str, &str),
    entity: Option<&Entity>,
    if_match: Option<&IfMatch>,
) -> Result<EntityRequest, Error> {
    let (method, path) = match verb {
        Verb::Insert => (Method::POST, format!("/{table}")),
        Verb::Replace => (Method::PUT, entity_path(table, keys.0, keys.1)?),
        Verb::Merge => (Method::PATCH, entity_path(table, keys.0, keys.1)?),
        Verb::Delete => (Method::DELETE, entity_path(table, keys.0, keys.1)?),
    };
    // Names as the spec writes them: an embedded request of a batch carries them so.
    let mut headers = vec![("Accept", ACCEPT.to_string())];
    let body = match entity {
        Some(entity) => {
            headers.push(("Content-Type", "application/json".to_string()));
            entity.to_json()?
        }
        None => Vec::new(),
    };
    if verb == Verb::Insert {
        // 204 with the ETag, rather than 201 with the entity echoed back.
        headers.push(("Prefer", "return-no-content".to_string()));
    }
    if let Some(if_match) = if_match {
        let value = if_match.header();
        if !valid_header_value(value) {
            return Err(Error::InvalidArgument("invalid ETag for If-Match".into()));
        }
        headers.push(("If-Match", value.to_string()));
    }
    headers.push(("DataServiceVersion", "3.0".to_string()));
    Ok(EntityRequest {
        method,
        url: endpoint.url(&path),
        headers,
        body,
    })
}

impl EntityRequest {
    /// As a request of its own.
    fn into_request(self) -> Request {
        request(self.method, self.url, self.headers, self.body)
    }
}

/// A request with these headers and body; `Content-Length` is set (wasi:http wants it, and
/// storage wants it on every write, zero included).
pub(crate) fn request(
    method: Method,
    url: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
) -> Request {
    let mut request = Request::new(method.clone(), url);
    for (name, value) in headers {
        request.headers_mut().append(name, value);
    }
    request
        .headers_mut()
        .append("maxdataserviceversion", "3.0;NetFx");
    if method != Method::GET || !body.is_empty() {
        request
            .headers_mut()
            .insert("content-length", body.len().to_string());
    }
    request.with_body(body)
}

/// Reads a Table service error: the code from `x-ms-error-code`, else the JSON body's
/// `odata.error.code` (else an XML body's `code`), and `x-ms-request-id`, classified. The
/// message is never kept: it can echo request details.
pub fn table_error(response: &Response) -> StorageError {
    error_of(response.status(), response.headers(), response.body())
}

pub(crate) fn error_of(status: StatusCode, headers: &Headers, body: &[u8]) -> StorageError {
    let code = headers
        .get("x-ms-error-code")
        .map(str::to_string)
        .or_else(|| odata_error(body).map(|(code, _)| code))
        .or_else(|| xml_error_code(body))
        .filter(|code| !code.is_empty());
    StorageError {
        status,
        class: classify(status, code.as_deref()),
        code,
        request_id: headers.get("x-ms-request-id").map(str::to_string),
        retry_after: headers
            .get("retry-after")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| std::time::Duration::from_secs(s.min(3600))),
    }
}

/// The Table service's codes first (`ResourceNotFound` here means the entity is not there),
/// then the crate's classification.
fn classify(status: StatusCode, code: Option<&str>) -> ErrorClass {
    match code {
        Some("ResourceNotFound") => ErrorClass::EntityMissing,
        code => ErrorClass::classify(status, code),
    }
}

/// The code and message of a JSON error body: `{"odata.error": {"code": ..., "message":
/// {"value": ...}}}`.
pub(crate) fn odata_error(body: &[u8]) -> Option<(String, String)> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let error = value.get("odata.error")?;
    let code = error.get("code")?.as_str()?.to_string();
    let message = error
        .get("message")
        .and_then(|m| m.get("value").or(Some(m)))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    Some((code, message))
}

/// The `<code>` (any namespace) or `<Code>` of an XML error body (Atom answers).
fn xml_error_code(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let doc = roxmltree::Document::parse(text.trim_start_matches('\u{feff}')).ok()?;
    let code = doc
        .descendants()
        .find(|n| n.tag_name().name().eq_ignore_ascii_case("code"))?;
    Some(code.text()?.trim().to_string())
}

/// A refusal of a condition, or `None` for an error.
pub(crate) fn refusal(error: &StorageError) -> Option<TableRefusal> {
    match error.class {
        ErrorClass::AlreadyExists => Some(TableRefusal::AlreadyExists),
        ErrorClass::PreconditionFailed => Some(TableRefusal::ConditionNotMet),
        ErrorClass::EntityMissing => Some(TableRefusal::NotFound),
        _ => None,
    }
}

/// Success statuses expected by each operation; anything else is an error.
pub(crate) fn expect(response: &Response, ok: &[u16]) -> Result<(), Error> {
    if ok.contains(&response.status().as_u16()) {
        Ok(())
    } else if response.status().is_success() {
        Err(Error::unexpected(
            response.status(),
            format!("expected status {ok:?}"),
        ))
    } else {
        Err(Error::Storage(table_error(response)))
    }
}

pub(crate) fn etag_header(response: &Response) -> Option<EntityTag> {
    response.headers().get("etag").map(EntityTag::new)
}

fn write_outcome(response: &Response) -> Result<EntityWriteOutcome, Error> {
    match expect(response, &[201, 204]) {
        Ok(()) => Ok(EntityWriteOutcome::Written(EntityWritten {
            etag: etag_header(response),
            server_date: server_date(response),
        })),
        Err(Error::Storage(e)) => match refusal(&e) {
            Some(r) => Ok(EntityWriteOutcome::Refused(r)),
            None => Err(Error::Storage(e)),
        },
        Err(e) => Err(e),
    }
}

pub(crate) fn json_body(response: &Response) -> Result<serde_json::Map<String, Value>, Error> {
    match serde_json::from_slice(response.body()) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(Error::unexpected(
            response.status(),
            "the body is not a JSON object",
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Tables.

/// [Create Table](https://learn.microsoft.com/rest/api/storageservices/create-table):
/// `POST /Tables` with `{"TableName": ...}`.
#[derive(Debug, Clone)]
pub struct CreateTable {
    /// The table.
    pub table: TableName,
}

/// Whether the table was made by this call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableCreated {
    /// 201 or 204.
    Created,
    /// 409 `TableAlreadyExists`: someone made it first; not an error.
    AlreadyExists,
}

impl TableOperation for CreateTable {
    type Output = TableCreated;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let body = serde_json::json!({ "TableName": self.table.as_str() }).to_string();
        Ok(request(
            Method::POST,
            endpoint(account)?.url("/Tables"),
            vec![
                ("accept", ACCEPT.to_string()),
                ("content-type", "application/json".to_string()),
                ("prefer", "return-no-content".to_string()),
                ("dataserviceversion", "3.0".to_string()),
            ],
            body.into_bytes(),
        ))
    }
    fn parse(&self, response: &Response) -> Result<TableCreated, Error> {
        match expect(response, &[201, 204]) {
            Ok(()) => Ok(TableCreated::Created),
            Err(Error::Storage(e)) if e.class == ErrorClass::AlreadyExists => {
                Ok(TableCreated::AlreadyExists)
            }
            Err(e) => Err(e),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Entity writes.

/// [Insert Entity](https://learn.microsoft.com/rest/api/storageservices/insert-entity):
/// only if no entity has its keys ([`TableRefusal::AlreadyExists`] otherwise).
#[derive(Debug, Clone)]
pub struct InsertEntity {
    /// The table.
    pub table: TableName,
    /// The entity.
    pub entity: Entity,
}

impl TableOperation for InsertEntity {
    type Output = EntityWriteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let e = &self.entity;
        let keys = (e.partition_key.as_str(), e.row_key.as_str());
        entity_request(
            endpoint(account)?,
            &self.table,
            Verb::Insert,
            keys,
            Some(e),
            None,
        )
        .map(EntityRequest::into_request)
    }
    fn parse(&self, response: &Response) -> Result<EntityWriteOutcome, Error> {
        write_outcome(response)
    }
}

/// Insert or replace, insert or merge: written whether the entity exists or not.
#[derive(Debug, Clone)]
pub struct UpsertEntity {
    /// The table.
    pub table: TableName,
    /// The entity.
    pub entity: Entity,
    /// Replace or merge an entity that exists.
    pub mode: UpsertMode,
}

impl TableOperation for UpsertEntity {
    type Output = EntityWriteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let verb = match self.mode {
            UpsertMode::Replace => Verb::Replace,
            UpsertMode::Merge => Verb::Merge,
        };
        let e = &self.entity;
        let keys = (e.partition_key.as_str(), e.row_key.as_str());
        entity_request(endpoint(account)?, &self.table, verb, keys, Some(e), None)
            .map(EntityRequest::into_request)
    }
    fn parse(&self, response: &Response) -> Result<EntityWriteOutcome, Error> {
        write_outcome(response)
    }
}

/// [Update Entity](https://learn.microsoft.com/rest/api/storageservices/update-entity2):
/// replace an entity that exists, `If-Match` its ETag or `*`.
#[derive(Debug, Clone)]
pub struct UpdateEntity {
    /// The table.
    pub table: TableName,
    /// The entity: its properties replace all the stored one had.
    pub entity: Entity,
    /// The condition.
    pub if_match: IfMatch,
}

impl TableOperation for UpdateEntity {
    type Output = EntityWriteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let e = &self.entity;
        let keys = (e.partition_key.as_str(), e.row_key.as_str());
        entity_request(
            endpoint(account)?,
            &self.table,
            Verb::Replace,
            keys,
            Some(e),
            Some(&self.if_match),
        )
        .map(EntityRequest::into_request)
    }
    fn parse(&self, response: &Response) -> Result<EntityWriteOutcome, Error> {
        write_outcome(response)
    }
}

/// [Merge Entity](https://learn.microsoft.com/rest/api/storageservices/merge-entity): set the
/// properties sent on an entity that exists, keep its others; `If-Match` its ETag or `*`.
#[derive(Debug, Clone)]
pub struct MergeEntity {
    /// The table.
    pub table: TableName,
    /// The keys and the properties to set.
    pub entity: Entity,
    /// The condition.
    pub if_match: IfMatch,
}

impl TableOperation for MergeEntity {
    type Output = EntityWriteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let e = &self.entity;
        let keys = (e.partition_key.as_str(), e.row_key.as_str());
        entity_request(
            endpoint(account)?,
            &self.table,
            Verb::Merge,
            keys,
            Some(e),
            Some(&self.if_match),
        )
        .map(EntityRequest::into_request)
    }
    fn parse(&self, response: &Response) -> Result<EntityWriteOutcome, Error> {
        write_outcome(response)
    }
}

/// [Delete Entity](https://learn.microsoft.com/rest/api/storageservices/delete-entity1),
/// `If-Match` its ETag or `*` (storage requires one).
#[derive(Debug, Clone)]
pub struct DeleteEntity {
    /// The table.
    pub table: TableName,
    /// The entity's PartitionKey.
    pub partition_key: String,
    /// The entity's RowKey.
    pub row_key: String,
    /// The condition.
    pub if_match: IfMatch,
}

impl TableOperation for DeleteEntity {
    type Output = EntityDeleteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        entity_request(
            endpoint(account)?,
            &self.table,
            Verb::Delete,
            (&self.partition_key, &self.row_key),
            None,
            Some(&self.if_match),
        )
        .map(EntityRequest::into_request)
    }
    fn parse(&self, response: &Response) -> Result<EntityDeleteOutcome, Error> {
        match write_outcome(response)? {
            EntityWriteOutcome::Written(_) => Ok(EntityDeleteOutcome::Deleted),
            EntityWriteOutcome::Refused(r) => Ok(EntityDeleteOutcome::Refused(r)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::GetEntity;

    fn table() -> TableName {
        TableName::try_new("ledger").unwrap()
    }

    #[test]
    fn errors_are_read_from_the_header_or_the_json_body() {
        let body = br#"{"odata.error":{"code":"UpdateConditionNotSatisfied","message":{"lang":"en-US","value":"secret detail"}}}"#;
        let r = Response::new(StatusCode::PRECONDITION_FAILED).with_body(body.to_vec());
        let e = table_error(&r);
        assert_eq!(e.code.as_deref(), Some("UpdateConditionNotSatisfied"));
        assert_eq!(e.class, ErrorClass::PreconditionFailed);
        assert!(!e.to_string().contains("secret"));
        let r =
            Response::new(StatusCode::NOT_FOUND).with_header("x-ms-error-code", "TableNotFound");
        assert_eq!(table_error(&r).class, ErrorClass::TableMissing);
        let r =
            Response::new(StatusCode::NOT_FOUND).with_header("x-ms-error-code", "ResourceNotFound");
        assert_eq!(refusal(&table_error(&r)), Some(TableRefusal::NotFound));
        let get = GetEntity {
            table: table(),
            partition_key: "p".into(),
            row_key: "r".into(),
            select: vec![],
        };
        assert_eq!(get.parse(&r).unwrap(), None);
        let missing_table =
            Response::new(StatusCode::NOT_FOUND).with_header("x-ms-error-code", "TableNotFound");
        assert!(get.parse(&missing_table).is_err());
    }

    #[test]
    fn no_table_endpoint_is_a_clear_error() {
        let a = Account::development("http://127.0.0.1:10000/devstoreaccount1").unwrap();
        let err = CreateTable { table: table() }.request(&a).unwrap_err();
        assert!(err.to_string().contains("TableEndpoint"), "{err}");
    }
}
