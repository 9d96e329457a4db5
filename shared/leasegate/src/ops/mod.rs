//! Blob service operations, each a request builder paired with a response parser.
//!
//! An [`Operation`] builds an unsigned [`Request`] for an [`Account`]; [`build`] stamps and
//! authorizes it; the caller sends it however it likes; [`Operation::parse`] turns the
//! [`Response`] into a typed outcome. Expected outcomes (already exists, condition
//! failed, lease held) are values; everything else is an [`Error`] classified by
//! `x-ms-error-code` ([`ErrorClass`]).

use std::time::{Duration, SystemTime};

use crate::account::{Account, Credential};
use crate::error::{ErrorClass, StorageError};
use crate::message::{valid_header_value, Method, Request, Response, StatusCode};
use crate::names::{encode_path, BlobName, ContainerName};
use crate::signing::authorize;
use crate::types::{ETag, LeaseDuration, LeaseId, LeaseState};
use crate::Error;

/// A Blob service operation: how to ask, and how to read the answer.
pub trait Operation {
    /// What a successful exchange yields.
    type Output;
    /// The request, not yet stamped or authorized (see [`build`]).
    fn request(&self, account: &Account) -> Result<Request, Error>;
    /// Reads the response.
    fn parse(&self, response: &Response) -> Result<Self::Output, Error>;
}

/// Builds the authorized request of `op` at time `now` (a parameter; use the caller's clock,
/// which must be within 15 minutes of the server's).
pub fn build<O: Operation + ?Sized>(
    op: &O,
    account: &Account,
    now: SystemTime,
) -> Result<Request, Error> {
    let mut request = op.request(account)?;
    authorize(&mut request, account, now)?;
    Ok(request)
}

/// Why a conditional write did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `If-None-Match: *` on an existing blob (409 `BlobAlreadyExists`, or 412 on some peers).
    AlreadyExists,
    /// `If-Match` did not match (412 `ConditionNotMet`).
    ConditionFailed,
    /// The blob is leased and the request named no lease, or another one.
    LeaseHeld,
    /// The lease the request named is not (or no longer) the blob's.
    LeaseLost,
}

/// The answer to a write (put, set metadata, set properties).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The write happened.
    Written(Written),
    /// The write was refused, and did nothing.
    Refused(Refusal),
}

/// What a successful write reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The blob's new ETag.
    pub etag: Option<ETag>,
    /// The storage server's `Date`.
    pub server_date: Option<SystemTime>,
    /// The page blob sequence number, where the answer carries one.
    pub sequence_number: Option<u64>,
}

/// A write condition.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Condition {
    /// No condition.
    #[default]
    None,
    /// `If-None-Match: *`: only if the blob does not exist.
    IfNotExists,
    /// `If-Match: "<etag>"`: only if the blob is still at this version.
    IfMatch(ETag),
}

/// Metadata: names (C# identifiers, compared case-insensitively by storage) to ASCII values,
/// sorted by name (the order SharedKey canonicalizes `x-ms-meta-*` headers in, once
/// lowercased).
pub type Metadata = std::collections::BTreeMap<String, String>;

// ---------------------------------------------------------------------------------------------
// Shared request and response helpers.

/// Whether storage can be sent `metadata`: names are C# identifiers, values printable ASCII
/// (tabs allowed), each sent as it is (a run of spaces inside included).
pub(crate) fn check_metadata(metadata: &Metadata) -> Result<(), Error> {
    for (name, value) in metadata {
        if name.is_empty()
            || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            || name.as_bytes()[0].is_ascii_digit()
        {
            return Err(Error::InvalidArgument(format!(
                "metadata name '{name}' must be a C# identifier"
            )));
        }
        if !value
            .bytes()
            .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
        {
            return Err(Error::InvalidArgument(format!(
                "metadata value of '{name}' must be printable ASCII (tabs allowed)"
            )));
        }
    }
    Ok(())
}

fn container_url(account: &Account, container: &ContainerName, query: &str) -> String {
    account
        .endpoint()
        .url(&format!("/{}{}", container.as_str(), query))
}

fn blob_url(account: &Account, container: &ContainerName, blob: &BlobName, query: &str) -> String {
    account.endpoint().url(&format!(
        "/{}/{}{}",
        container.as_str(),
        blob.url_path(),
        query
    ))
}

fn request(method: Method, url: String, body: Vec<u8>) -> Result<RequestParts, Error> {
    // Names are validated and percent-encoded, so this only refuses a broken endpoint.
    if !url.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::InvalidArgument(
            "the request URL is not valid".into(),
        ));
    }
    Ok(RequestParts {
        request: Request::new(method, url),
        body,
    })
}

struct RequestParts {
    request: Request,
    body: Vec<u8>,
}

impl RequestParts {
    fn header(mut self, name: &str, value: impl AsRef<str>) -> Result<Self, Error> {
        let value = value.as_ref();
        if !valid_header_value(value) {
            return Err(Error::InvalidArgument(format!(
                "invalid value for header {name}"
            )));
        }
        self.request.headers_mut().append(name, value);
        Ok(self)
    }

    fn opt_header(self, name: &str, value: Option<impl AsRef<str>>) -> Result<Self, Error> {
        match value {
            Some(v) => self.header(name, v),
            None => Ok(self),
        }
    }

    fn condition(self, condition: &Condition) -> Result<Self, Error> {
        match condition {
            Condition::None => Ok(self),
            Condition::IfNotExists => self.header("if-none-match", "*"),
            Condition::IfMatch(etag) => self.header("if-match", etag.quoted()),
        }
    }

    fn metadata(mut self, metadata: &Metadata) -> Result<Self, Error> {
        check_metadata(metadata)?;
        for (name, value) in metadata {
            self = self.header(&format!("x-ms-meta-{name}"), value)?;
        }
        Ok(self)
    }

    fn finish(self) -> Result<Request, Error> {
        let mut request = self.request;
        // Storage wants Content-Length on every PUT, zero included; wasi:http wants it set by
        // the caller (transfer-encoding is forbidden), and it is part of the signature.
        if *request.method() == Method::PUT || !self.body.is_empty() {
            request
                .headers_mut()
                .insert("content-length", self.body.len().to_string());
        }
        Ok(request.with_body(self.body))
    }
}

fn header_str<'a>(response: &'a Response, name: &str) -> Option<&'a str> {
    response.headers().get(name)
}

/// The storage server's `Date` header: the clock that lease expiry is judged by.
pub fn server_date(response: &Response) -> Option<SystemTime> {
    header_str(response, "date").and_then(|d| httpdate::parse_http_date(d).ok())
}

fn etag(response: &Response) -> Option<ETag> {
    header_str(response, "etag").map(ETag::new)
}

/// True when storage refused a request's bearer token itself (see
/// [`StorageError::token_refused`]): the request did nothing, and a new token may be accepted.
pub fn token_refused(response: &Response) -> bool {
    matches!(response.status().as_u16(), 401 | 403) && storage_error(response).token_refused()
}

/// Reads a storage error response: `x-ms-error-code` (or the XML body's `<Code>` when the header
/// is missing), `x-ms-request-id`, classified. The body's `<Message>` is never kept: it can
/// echo request details.
pub fn storage_error(response: &Response) -> StorageError {
    let code = header_str(response, "x-ms-error-code")
        .map(str::to_string)
        .or_else(|| xml_error_code(response.body()));
    StorageError {
        status: response.status(),
        class: ErrorClass::classify(response.status(), code.as_deref()),
        code,
        request_id: header_str(response, "x-ms-request-id").map(str::to_string),
        // Seconds only (the HTTP-date form is not used by storage); at most an hour.
        retry_after: header_str(response, "retry-after")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| std::time::Duration::from_secs(s.min(3600))),
    }
}

/// The `<Code>` of an [error body](https://learn.microsoft.com/rest/api/storageservices/status-and-error-codes2)
/// (`<Error><Code>...</Code><Message>...</Message></Error>`); `None` for a body that is not
/// such a document.
fn xml_error_code(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let doc = roxmltree::Document::parse(text.trim_start_matches('\u{feff}')).ok()?;
    let code = doc.descendants().find(|n| n.has_tag_name("Code"))?;
    Some(xml_text(code)?.trim().to_string())
}

/// An element's character data, its pieces (text and CDATA, around comments) joined; `None`
/// when it has none.
fn xml_text(node: roxmltree::Node<'_, '_>) -> Option<String> {
    let mut pieces = node
        .children()
        .filter(|c| c.is_text())
        .filter_map(|c| c.text());
    let first = pieces.next()?;
    Some(pieces.fold(first.to_string(), |text, piece| text + piece))
}

/// The first child element of `node` named `name`.
fn xml_child<'a, 'input>(
    node: roxmltree::Node<'a, 'input>,
    name: &str,
) -> Option<roxmltree::Node<'a, 'input>> {
    node.children().find(|c| c.has_tag_name(name))
}

/// The text of the first child element of `node` named `name`.
fn xml_child_text(node: roxmltree::Node<'_, '_>, name: &str) -> Option<String> {
    xml_child(node, name).and_then(xml_text)
}

/// Success statuses expected by each operation; anything else is an error.
fn expect(response: &Response, ok: &[u16]) -> Result<(), Error> {
    if ok.contains(&response.status().as_u16()) {
        Ok(())
    } else if response.status().is_success() {
        let mut expected = String::from("expected status");
        for (i, code) in ok.iter().enumerate() {
            expected.push_str(if i == 0 { " " } else { " or " });
            expected.push_str(&code.to_string());
        }
        Err(Error::unexpected(response.status(), expected))
    } else {
        Err(Error::Storage(storage_error(response)))
    }
}

fn refusal(error: &StorageError, condition: &Condition) -> Option<Refusal> {
    match error.class {
        ErrorClass::AlreadyExists => Some(Refusal::AlreadyExists),
        // A copy's `x-ms-source-if-match` that failed, whatever the destination's condition.
        ErrorClass::PreconditionFailed
            if error.code.as_deref() == Some("SourceConditionNotMet") =>
        {
            Some(Refusal::ConditionFailed)
        }
        // Some peers answer a failed If-None-Match: * with 412 ConditionNotMet.
        ErrorClass::PreconditionFailed if *condition == Condition::IfNotExists => {
            Some(Refusal::AlreadyExists)
        }
        ErrorClass::PreconditionFailed => Some(Refusal::ConditionFailed),
        ErrorClass::HeldByOther => Some(Refusal::LeaseHeld),
        ErrorClass::LeaseLost => Some(Refusal::LeaseLost),
        _ => None,
    }
}

fn write_outcome(
    response: &Response,
    ok: &[u16],
    condition: &Condition,
) -> Result<WriteOutcome, Error> {
    match expect(response, ok) {
        Ok(()) => Ok(WriteOutcome::Written(Written {
            etag: etag(response),
            server_date: server_date(response),
            sequence_number: header_str(response, "x-ms-blob-sequence-number")
                .and_then(|s| s.parse().ok()),
        })),
        Err(Error::Storage(e)) => match refusal(&e, condition) {
            Some(r) => Ok(WriteOutcome::Refused(r)),
            None => Err(Error::Storage(e)),
        },
        Err(e) => Err(e),
    }
}

fn lease_header(lease_id: Option<&LeaseId>) -> Option<String> {
    lease_id.map(LeaseId::to_string)
}

// ---------------------------------------------------------------------------------------------
// Containers.

/// [Create Container](https://learn.microsoft.com/rest/api/storageservices/create-container):
/// `PUT /{container}?restype=container`.
#[derive(Debug, Clone)]
pub struct CreateContainer {
    /// The container.
    pub container: ContainerName,
}

/// Whether the container was made by this call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerCreated {
    /// 201.
    Created,
    /// 409 `ContainerAlreadyExists`: someone made it first; not an error.
    AlreadyExists,
}

impl Operation for CreateContainer {
    type Output = ContainerCreated;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        request(
            Method::PUT,
            container_url(account, &self.container, "?restype=container"),
            Vec::new(),
        )?
        .finish()
    }
    fn parse(&self, response: &Response) -> Result<ContainerCreated, Error> {
        match expect(response, &[201]) {
            Ok(()) => Ok(ContainerCreated::Created),
            Err(Error::Storage(e)) if e.class == ErrorClass::AlreadyExists => {
                Ok(ContainerCreated::AlreadyExists)
            }
            Err(e) => Err(e),
        }
    }
}

mod blob;
mod lease;
mod list;
mod tags;

pub use blob::*;
pub use lease::*;
pub use list::*;
pub use tags::*;

#[cfg(test)]
mod tests;
