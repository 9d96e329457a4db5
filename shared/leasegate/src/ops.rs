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

// ---------------------------------------------------------------------------------------------
// Blobs.

/// The type of blob [`PutBlob`] creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobKind {
    /// A block blob holding the body.
    Block,
    /// An empty page blob of this size (a multiple of 512; 0 is fine). leasegate's lock blobs
    /// are empty page blobs: their sequence number is the fencing counter.
    Page(u64),
}

/// [Put Blob](https://learn.microsoft.com/rest/api/storageservices/put-blob): create or
/// overwrite, optionally only if absent (`If-None-Match: *`) or at a version (`If-Match`).
#[derive(Debug, Clone)]
pub struct PutBlob {
    /// The container.
    pub container: ContainerName,
    /// The blob.
    pub blob: BlobName,
    /// Block or page blob.
    pub kind: BlobKind,
    /// The content (block blobs only).
    pub body: Vec<u8>,
    /// `Content-Type` of the blob.
    pub content_type: Option<String>,
    /// Metadata to set.
    pub metadata: Metadata,
    /// Write condition.
    pub condition: Condition,
    /// The lease to write under, when the blob is leased.
    pub lease_id: Option<LeaseId>,
}

impl PutBlob {
    /// A block blob put with no condition, no metadata.
    pub fn block(container: ContainerName, blob: BlobName, body: Vec<u8>) -> Self {
        PutBlob {
            container,
            blob,
            kind: BlobKind::Block,
            body,
            content_type: None,
            metadata: Metadata::new(),
            condition: Condition::None,
            lease_id: None,
        }
    }

    /// Sets the content type.
    pub fn with_content_type(mut self, content_type: &str) -> Self {
        self.content_type = Some(content_type.to_string());
        self
    }

    /// Sets the write condition.
    pub fn with_condition(mut self, condition: Condition) -> Self {
        self.condition = condition;
        self
    }

    /// Sets the metadata.
    pub fn with_metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = metadata;
        self
    }

    /// Writes under a lease.
    pub fn with_lease(mut self, lease_id: LeaseId) -> Self {
        self.lease_id = Some(lease_id);
        self
    }
}

impl Operation for PutBlob {
    type Output = WriteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let body = match self.kind {
            BlobKind::Block => self.body.clone(),
            BlobKind::Page(_) => Vec::new(),
        };
        let mut r = request(
            Method::PUT,
            blob_url(account, &self.container, &self.blob, ""),
            body,
        )?;
        r = match self.kind {
            BlobKind::Block => r.header("x-ms-blob-type", "BlockBlob")?,
            BlobKind::Page(size) => {
                if size % 512 != 0 {
                    return Err(Error::InvalidArgument(
                        "a page blob's size is a multiple of 512".into(),
                    ));
                }
                r.header("x-ms-blob-type", "PageBlob")?
                    .header("x-ms-blob-content-length", size.to_string())?
            }
        };
        r.opt_header("content-type", self.content_type.as_ref())?
            .opt_header("x-ms-lease-id", lease_header(self.lease_id.as_ref()))?
            .condition(&self.condition)?
            .metadata(&self.metadata)?
            .finish()
    }
    fn parse(&self, response: &Response) -> Result<WriteOutcome, Error> {
        write_outcome(response, &[201], &self.condition)
    }
}

/// Properties of a blob, from a HEAD, a GET or a listing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlobProperties {
    /// ETag.
    pub etag: Option<ETag>,
    /// `Last-Modified`.
    pub last_modified: Option<SystemTime>,
    /// Content length in bytes.
    pub content_length: Option<u64>,
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// `Content-MD5` (base64), when storage keeps one (it computes it for a Put Blob; a copy
    /// keeps its source's): the content's identity.
    pub content_md5: Option<String>,
    /// `x-ms-lease-state`.
    pub lease_state: Option<LeaseState>,
    /// `x-ms-blob-type` (`BlockBlob`, `PageBlob`, `AppendBlob`).
    pub blob_type: Option<String>,
    /// `x-ms-blob-sequence-number` (page blobs).
    pub sequence_number: Option<u64>,
    /// `x-ms-copy-status` of the last copy into this blob (`success`, `pending`, `aborted`,
    /// `failed`).
    pub copy_status: Option<String>,
    /// `x-ms-copy-id` of the last copy into this blob.
    pub copy_id: Option<String>,
    /// `x-ms-copy-source` of the last copy into this blob (the source URL it was copied from).
    pub copy_source: Option<String>,
    /// Metadata (names lowercased).
    pub metadata: Metadata,
    /// The storage server's `Date` when this was read (not set for listings).
    pub server_date: Option<SystemTime>,
    /// `x-ms-tag-count` (a HEAD) or `TagCount` (a listing): how many index tags the blob has;
    /// `None` when it has none.
    pub tag_count: Option<u32>,
    /// The blob's index tags, from a listing with [`ListBlobs::include_tags`] (`None`
    /// otherwise; a blob without tags lists none).
    pub tags: Option<Tags>,
}

impl BlobProperties {
    fn from_headers(response: &Response) -> Self {
        let mut metadata = Metadata::new();
        for (name, value) in response.headers().iter() {
            if let Some(key) = name.strip_prefix("x-ms-meta-") {
                metadata.insert(key.to_string(), value.to_string());
            }
        }
        BlobProperties {
            etag: etag(response),
            last_modified: header_str(response, "last-modified")
                .and_then(|d| httpdate::parse_http_date(d).ok()),
            content_length: header_str(response, "content-length").and_then(|s| s.parse().ok()),
            content_type: header_str(response, "content-type").map(str::to_string),
            content_md5: header_str(response, "content-md5")
                .filter(|m| !m.is_empty())
                .map(str::to_string),
            lease_state: header_str(response, "x-ms-lease-state").and_then(LeaseState::parse),
            blob_type: header_str(response, "x-ms-blob-type").map(str::to_string),
            sequence_number: header_str(response, "x-ms-blob-sequence-number")
                .and_then(|s| s.parse().ok()),
            copy_status: header_str(response, "x-ms-copy-status").map(str::to_string),
            copy_id: header_str(response, "x-ms-copy-id").map(str::to_string),
            copy_source: header_str(response, "x-ms-copy-source").map(str::to_string),
            metadata,
            server_date: server_date(response),
            tag_count: header_str(response, "x-ms-tag-count").and_then(|s| s.parse().ok()),
            tags: None,
        }
    }
}

/// [Get Blob Properties](https://learn.microsoft.com/rest/api/storageservices/get-blob-properties):
/// `HEAD`. A missing blob or container is `None`.
#[derive(Debug, Clone)]
pub struct GetProperties {
    /// The container.
    pub container: ContainerName,
    /// The blob.
    pub blob: BlobName,
}

/// Turns a 404 into `None` for reads.
fn found<T>(result: Result<T, Error>) -> Result<Option<T>, Error> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e)
            if matches!(
                e.class(),
                Some(ErrorClass::BlobMissing | ErrorClass::ContainerMissing)
            ) =>
        {
            Ok(None)
        }
        // A HEAD error has no body and, on some peers, no error code: 404 alone means missing.
        Err(Error::Storage(e)) if e.status == StatusCode::NOT_FOUND && e.code.is_none() => Ok(None),
        Err(e) => Err(e),
    }
}

impl Operation for GetProperties {
    type Output = Option<BlobProperties>;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        request(
            Method::HEAD,
            blob_url(account, &self.container, &self.blob, ""),
            Vec::new(),
        )?
        .finish()
    }
    fn parse(&self, response: &Response) -> Result<Option<BlobProperties>, Error> {
        found(expect(response, &[200]).map(|()| BlobProperties::from_headers(response)))
    }
}

/// [Get Blob](https://learn.microsoft.com/rest/api/storageservices/get-blob): content and
/// properties. A missing blob or container is `None`.
#[derive(Debug, Clone)]
pub struct GetBlob {
    /// The container.
    pub container: ContainerName,
    /// The blob.
    pub blob: BlobName,
}

/// A blob's content and properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobContent {
    /// The content.
    pub body: Vec<u8>,
    /// The properties.
    pub properties: BlobProperties,
}

impl Operation for GetBlob {
    type Output = Option<BlobContent>;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        request(
            Method::GET,
            blob_url(account, &self.container, &self.blob, ""),
            Vec::new(),
        )?
        .finish()
    }
    fn parse(&self, response: &Response) -> Result<Option<BlobContent>, Error> {
        found(expect(response, &[200]).map(|()| BlobContent {
            body: response.body().to_vec(),
            properties: BlobProperties::from_headers(response),
        }))
    }
}

/// [Set Blob Metadata](https://learn.microsoft.com/rest/api/storageservices/set-blob-metadata):
/// replaces all metadata; needs the lease id while the blob is leased.
#[derive(Debug, Clone)]
pub struct SetMetadata {
    /// The container.
    pub container: ContainerName,
    /// The blob.
    pub blob: BlobName,
    /// The complete new metadata.
    pub metadata: Metadata,
    /// The lease to write under.
    pub lease_id: Option<LeaseId>,
    /// Write condition (`If-Match` for compare-and-swap).
    pub condition: Condition,
}

impl Operation for SetMetadata {
    type Output = WriteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        request(
            Method::PUT,
            blob_url(account, &self.container, &self.blob, "?comp=metadata"),
            Vec::new(),
        )?
        .opt_header("x-ms-lease-id", lease_header(self.lease_id.as_ref()))?
        .condition(&self.condition)?
        .metadata(&self.metadata)?
        .finish()
    }
    fn parse(&self, response: &Response) -> Result<WriteOutcome, Error> {
        write_outcome(response, &[200], &self.condition)
    }
}

/// [Set Blob Properties](https://learn.microsoft.com/rest/api/storageservices/set-blob-properties)
/// with `x-ms-sequence-number-action: increment`: atomically adds one to a page blob's sequence
/// number and returns the new value. Under a lease, only the holder can do it: this is
/// leasegate's fencing counter.
#[derive(Debug, Clone)]
pub struct IncrementSequenceNumber {
    /// The container.
    pub container: ContainerName,
    /// The page blob.
    pub blob: BlobName,
    /// The lease to write under.
    pub lease_id: Option<LeaseId>,
}

impl Operation for IncrementSequenceNumber {
    type Output = WriteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        request(
            Method::PUT,
            blob_url(account, &self.container, &self.blob, "?comp=properties"),
            Vec::new(),
        )?
        .header("x-ms-sequence-number-action", "increment")?
        .opt_header("x-ms-lease-id", lease_header(self.lease_id.as_ref()))?
        .finish()
    }
    fn parse(&self, response: &Response) -> Result<WriteOutcome, Error> {
        let outcome = write_outcome(response, &[200], &Condition::None)?;
        if let WriteOutcome::Written(w) = &outcome {
            if w.sequence_number.is_none() {
                return Err(Error::unexpected(
                    response.status(),
                    "no x-ms-blob-sequence-number in the answer",
                ));
            }
        }
        Ok(outcome)
    }
}

/// [Delete Blob](https://learn.microsoft.com/rest/api/storageservices/delete-blob), with the
/// lease id and/or `If-Match` so only the version you listed is deleted.
#[derive(Debug, Clone)]
pub struct DeleteBlob {
    /// The container.
    pub container: ContainerName,
    /// The blob.
    pub blob: BlobName,
    /// The lease to delete under.
    pub lease_id: Option<LeaseId>,
    /// Delete condition.
    pub condition: Condition,
}

/// The answer to a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// 202: deleted.
    Deleted,
    /// 404: nothing to delete (already gone, or never there).
    NotFound,
    /// Refused, nothing deleted.
    Refused(Refusal),
}

impl Operation for DeleteBlob {
    type Output = DeleteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        request(
            Method::DELETE,
            blob_url(account, &self.container, &self.blob, ""),
            Vec::new(),
        )?
        .opt_header("x-ms-lease-id", lease_header(self.lease_id.as_ref()))?
        .condition(&self.condition)?
        .finish()
    }
    fn parse(&self, response: &Response) -> Result<DeleteOutcome, Error> {
        match found(expect(response, &[202])) {
            Ok(Some(())) => Ok(DeleteOutcome::Deleted),
            Ok(None) => Ok(DeleteOutcome::NotFound),
            Err(Error::Storage(e)) => match refusal(&e, &self.condition) {
                Some(r) => Ok(DeleteOutcome::Refused(r)),
                None => Err(Error::Storage(e)),
            },
            Err(e) => Err(e),
        }
    }
}

/// [Delete Blob](https://learn.microsoft.com/rest/api/storageservices/delete-blob) with
/// `x-ms-delete-snapshots: include`: the blob and its snapshots (a blob with snapshots refuses a
/// plain delete with 409 `SnapshotsPresent`). The condition and lease apply to the base blob.
#[derive(Debug, Clone)]
pub struct DeleteBlobAndSnapshots(pub DeleteBlob);

impl Operation for DeleteBlobAndSnapshots {
    type Output = DeleteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let mut request = self.0.request(account)?;
        request
            .headers_mut()
            .append("x-ms-delete-snapshots", "include");
        Ok(request)
    }
    fn parse(&self, response: &Response) -> Result<DeleteOutcome, Error> {
        self.0.parse(response)
    }
}

/// [Copy Blob](https://learn.microsoft.com/rest/api/storageservices/copy-blob) within the
/// account: `x-ms-copy-source` is the source blob's URL (with the SAS when the account uses
/// one). Poll [`GetProperties`] while the status is pending.
#[derive(Debug, Clone)]
pub struct CopyBlob {
    /// Source container.
    pub source_container: ContainerName,
    /// Source blob.
    pub source_blob: BlobName,
    /// Destination container.
    pub container: ContainerName,
    /// Destination blob.
    pub blob: BlobName,
    /// Destination condition.
    pub condition: Condition,
    /// Copy only if the source is still at this version (`x-ms-source-if-match`): a source
    /// changed since it was listed refuses the copy (412).
    pub source_etag: Option<ETag>,
    /// The destination's metadata; `None` copies the source's.
    pub metadata: Option<Metadata>,
}

impl CopyBlob {
    /// Copies `source_container/source_blob` to `container/blob`, unconditionally, with the
    /// source's metadata.
    pub fn new(
        source_container: ContainerName,
        source_blob: BlobName,
        container: ContainerName,
        blob: BlobName,
    ) -> Self {
        CopyBlob {
            source_container,
            source_blob,
            container,
            blob,
            condition: Condition::None,
            source_etag: None,
            metadata: None,
        }
    }
}

/// The URL of a blob, without any credential (for people and for metadata such as a moved
/// blob's `SourceUri`).
pub fn public_blob_url(account: &Account, container: &ContainerName, blob: &BlobName) -> String {
    blob_url(account, container, blob, "")
}

/// `x-ms-copy-status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyStatus {
    /// Done.
    Success,
    /// Still copying; poll the destination's properties.
    Pending,
}

/// The answer to a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyOutcome {
    /// 202: the copy started (and, within an account, usually finished).
    Started {
        /// `x-ms-copy-id`.
        copy_id: Option<String>,
        /// `x-ms-copy-status`.
        status: CopyStatus,
        /// The destination's ETag.
        etag: Option<ETag>,
    },
    /// The destination condition or lease refused the copy.
    Refused(Refusal),
}

impl Operation for CopyBlob {
    type Output = CopyOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let mut source = blob_url(account, &self.source_container, &self.source_blob, "");
        if let Credential::Sas(token) = account.credential() {
            source = format!("{source}?{}", token.query());
        }
        let mut r = request(
            Method::PUT,
            blob_url(account, &self.container, &self.blob, ""),
            Vec::new(),
        )?
        .header("x-ms-copy-source", source)?
        .opt_header(
            "x-ms-source-if-match",
            self.source_etag.as_ref().map(ETag::quoted),
        )?
        .condition(&self.condition)?;
        if let Some(m) = &self.metadata {
            r = r.metadata(m)?;
        }
        r.finish()
    }
    fn parse(&self, response: &Response) -> Result<CopyOutcome, Error> {
        match write_outcome(response, &[202, 201], &self.condition)? {
            WriteOutcome::Refused(r) => Ok(CopyOutcome::Refused(r)),
            WriteOutcome::Written(w) => {
                // Storage always says; an answer without it (a proxy that dropped it) is not
                // taken for success: the caller polls the destination, which tells.
                let status = match header_str(response, "x-ms-copy-status") {
                    Some("success") => CopyStatus::Success,
                    Some("pending") | None => CopyStatus::Pending,
                    Some(_) => {
                        return Err(Error::unexpected(
                            response.status(),
                            "copy status is neither success nor pending",
                        ))
                    }
                };
                Ok(CopyOutcome::Started {
                    copy_id: header_str(response, "x-ms-copy-id").map(str::to_string),
                    status,
                    etag: w.etag,
                })
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------
// Listing.

/// [List Blobs](https://learn.microsoft.com/rest/api/storageservices/list-blobs): one page.
/// Loop while [`ListBlobsPage::next_marker`] is `Some`.
#[derive(Debug, Clone, Default)]
pub struct ListBlobs {
    /// The container.
    pub container: Option<ContainerName>,
    /// Only names starting with this.
    pub prefix: Option<String>,
    /// Continue where the previous page ended.
    pub marker: Option<String>,
    /// Page size (1 to 5000; storage's default is 5000).
    pub max_results: Option<u32>,
    /// Include each blob's metadata.
    pub include_metadata: bool,
    /// Include each blob's index tags (`include=tags`: needs the tags read permission, see
    /// [`SetBlobTags`]).
    pub include_tags: bool,
}

impl ListBlobs {
    /// Lists `container`.
    pub fn new(container: ContainerName) -> Self {
        ListBlobs {
            container: Some(container),
            ..Default::default()
        }
    }
}

/// One blob of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobItem {
    /// The blob's name.
    pub name: String,
    /// Its properties and (if asked for) metadata.
    pub properties: BlobProperties,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListBlobsPage {
    /// The blobs of this page.
    pub blobs: Vec<BlobItem>,
    /// Where the next page starts; `None` on the last page.
    pub next_marker: Option<String>,
}

/// Query values are encoded strictly: everything but unreserved characters.
fn query_value(s: &str) -> String {
    encode_path(s).replace('/', "%2F")
}

impl Operation for ListBlobs {
    type Output = ListBlobsPage;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let container = self
            .container
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("list blobs needs a container".into()))?;
        let mut query = String::from("?restype=container&comp=list");
        if let Some(p) = &self.prefix {
            query.push_str(&format!("&prefix={}", query_value(p)));
        }
        if let Some(m) = &self.marker {
            query.push_str(&format!("&marker={}", query_value(m)));
        }
        if let Some(n) = self.max_results {
            if !(1..=5000).contains(&n) {
                return Err(Error::InvalidArgument("maxresults is 1 to 5000".into()));
            }
            query.push_str(&format!("&maxresults={n}"));
        }
        match (self.include_metadata, self.include_tags) {
            (true, true) => query.push_str("&include=metadata%2Ctags"),
            (true, false) => query.push_str("&include=metadata"),
            (false, true) => query.push_str("&include=tags"),
            (false, false) => {}
        }
        request(
            Method::GET,
            container_url(account, container, &query),
            Vec::new(),
        )?
        .finish()
    }

    fn parse(&self, response: &Response) -> Result<ListBlobsPage, Error> {
        expect(response, &[200])?;
        parse_list_blobs(response.body())
            .map_err(|detail| Error::unexpected(response.status(), detail))
    }
}

/// The `EnumerationResults` document of a listing (List Blobs, Find Blobs by Tags): UTF-8 XML,
/// a byte-order mark allowed. Errors name `what` was read.
fn enumeration_results<'a>(body: &'a [u8], what: &str) -> Result<roxmltree::Document<'a>, String> {
    let text = std::str::from_utf8(body).map_err(|_| format!("{what} is not UTF-8"))?;
    let doc = roxmltree::Document::parse(text.trim_start_matches('\u{feff}'))
        .map_err(|e| format!("{what} is not XML: {e}"))?;
    if !doc.root_element().has_tag_name("EnumerationResults") {
        return Err(format!("{what} has no EnumerationResults"));
    }
    Ok(doc)
}

/// Parses an `EnumerationResults` document ([List Blobs' response
/// body](https://learn.microsoft.com/rest/api/storageservices/list-blobs#response-body)).
pub fn parse_list_blobs(body: &[u8]) -> Result<ListBlobsPage, String> {
    let doc = enumeration_results(body, "listing")?;
    let root = doc.root_element();
    let mut page = ListBlobsPage {
        next_marker: xml_child_text(root, "NextMarker").filter(|m| !m.is_empty()),
        ..Default::default()
    };
    let Some(blobs) = xml_child(root, "Blobs") else {
        return Ok(page);
    };
    for blob in blobs.children().filter(|n| n.has_tag_name("Blob")) {
        let name = xml_child(blob, "Name").ok_or("a listed blob has no Name")?;
        let name = listed_name(name)?;
        let mut properties = BlobProperties::default();
        if let Some(props) = xml_child(blob, "Properties") {
            let text = |name: &str| xml_child_text(props, name);
            // Note the listing's spelling: `Etag`, not `ETag`.
            properties.etag = text("Etag").map(|e| ETag::new(&e));
            properties.last_modified =
                text("Last-Modified").and_then(|d| httpdate::parse_http_date(&d).ok());
            properties.content_length = text("Content-Length").and_then(|s| s.parse().ok());
            properties.content_type = text("Content-Type");
            properties.content_md5 = text("Content-MD5").filter(|m| !m.is_empty());
            properties.lease_state = text("LeaseState").and_then(|s| LeaseState::parse(&s));
            properties.blob_type = text("BlobType");
            properties.sequence_number =
                text("x-ms-blob-sequence-number").and_then(|s| s.parse().ok());
            properties.tag_count = text("TagCount").and_then(|s| s.parse().ok());
        }
        if let Some(tags) = xml_child(blob, "Tags") {
            properties.tags = Some(parse_tag_set(tags)?);
        }
        if let Some(meta) = xml_child(blob, "Metadata") {
            for entry in meta.children().filter(roxmltree::Node::is_element) {
                properties.metadata.insert(
                    entry.tag_name().name().to_ascii_lowercase(),
                    xml_text(entry).unwrap_or_default(),
                );
            }
        }
        page.blobs.push(BlobItem { name, properties });
    }
    Ok(page)
}

/// A listed blob's `<Name>`. A name holding characters XML cannot carry comes percent-encoded
/// (UTF-8) and marked `Encoded="true"`: it is decoded.
fn listed_name(name: roxmltree::Node<'_, '_>) -> Result<String, String> {
    let text = xml_text(name).ok_or("a listed blob has no Name")?;
    if name.attribute("Encoded") != Some("true") {
        return Ok(text);
    }
    percent_encoding::percent_decode_str(&text)
        .decode_utf8()
        .map(String::from)
        .map_err(|_| "a listed blob's encoded Name is not UTF-8".to_string())
}

// ---------------------------------------------------------------------------------------------
// Blob index tags.

/// A blob's index tags: keys to values, sorted by key. Keys are 1 to 128 characters, values 0
/// to 256, both of letters, digits, space and `+ - . / : = _`
/// ([the rules](https://learn.microsoft.com/azure/storage/blobs/storage-manage-find-blobs#setting-blob-index-tags)).
/// Values compare as strings in queries.
pub type Tags = std::collections::BTreeMap<String, String>;

/// The most index tags a blob can carry.
pub const MAX_TAGS: usize = 10;

fn tag_text_ok(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b" +-./:=_".contains(&b))
}

/// Checks a tag key and value against storage's rules.
pub fn check_tag(key: &str, value: &str) -> Result<(), Error> {
    if key.is_empty() || key.len() > 128 || !tag_text_ok(key) {
        return Err(Error::InvalidArgument(format!(
            "tag key '{key}' must be 1 to 128 letters, digits, spaces or + - . / : = _"
        )));
    }
    if value.len() > 256 || !tag_text_ok(value) {
        return Err(Error::InvalidArgument(format!(
            "the value of tag '{key}' must be up to 256 letters, digits, spaces or + - . / : = _"
        )));
    }
    Ok(())
}

/// A tag condition `"key" = 'value'` (for [`IfTags`]; the key and value are checked first, so
/// no quote can end them early).
pub fn tag_equals(key: &str, value: &str) -> Result<String, Error> {
    check_tag(key, value)?;
    Ok(format!("\"{key}\" = '{value}'"))
}

/// A tag query `"key" <= 'value'` (for [`FindBlobsByTags`]).
pub fn tag_at_most(key: &str, value: &str) -> Result<String, Error> {
    check_tag(key, value)?;
    Ok(format!("\"{key}\" <= '{value}'"))
}

/// Reads a `<TagSet>` (or a `<Tags>` holding one): its `<Tag><Key/><Value/></Tag>` entries.
fn parse_tag_set(node: roxmltree::Node<'_, '_>) -> Result<Tags, String> {
    let set = if node.has_tag_name("TagSet") {
        node
    } else {
        match xml_child(node, "TagSet") {
            Some(set) => set,
            None => return Ok(Tags::new()),
        }
    };
    let mut tags = Tags::new();
    for tag in set.children().filter(|n| n.has_tag_name("Tag")) {
        let key = xml_child_text(tag, "Key").ok_or("a tag has no Key")?;
        tags.insert(key, xml_child_text(tag, "Value").unwrap_or_default());
    }
    Ok(tags)
}

/// [Set Blob Tags](https://learn.microsoft.com/rest/api/storageservices/set-blob-tags):
/// `PUT ?comp=tags` with an XML body; **replaces all the blob's tags** (read them first to
/// keep others: [`GetBlobTags`]). Changes neither the ETag nor `Last-Modified` (so `If-Match`
/// on a later request does not see it: use [`IfTags`]). Needs the RBAC data action
/// `.../blobs/tags/write` (Storage Blob Data Owner has it, Contributor does not) or the SAS
/// permission `t`.
#[derive(Debug, Clone)]
pub struct SetBlobTags {
    /// The container.
    pub container: ContainerName,
    /// The blob.
    pub blob: BlobName,
    /// The complete new tags (at most [`MAX_TAGS`]).
    pub tags: Tags,
    /// The lease, while the blob is leased.
    pub lease_id: Option<LeaseId>,
}

impl Operation for SetBlobTags {
    type Output = WriteOutcome;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        if self.tags.len() > MAX_TAGS {
            return Err(Error::InvalidArgument(format!(
                "a blob has at most {MAX_TAGS} index tags"
            )));
        }
        let mut body = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?><Tags><TagSet>");
        for (key, value) in &self.tags {
            // Checked: no character of a key or value needs escaping in XML.
            check_tag(key, value)?;
            body.push_str(&format!(
                "<Tag><Key>{key}</Key><Value>{value}</Value></Tag>"
            ));
        }
        body.push_str("</TagSet></Tags>");
        request(
            Method::PUT,
            blob_url(account, &self.container, &self.blob, "?comp=tags"),
            body.into_bytes(),
        )?
        .header("content-type", "application/xml; charset=utf-8")?
        .opt_header("x-ms-lease-id", lease_header(self.lease_id.as_ref()))?
        .finish()
    }
    fn parse(&self, response: &Response) -> Result<WriteOutcome, Error> {
        write_outcome(response, &[204, 200], &Condition::None)
    }
}

/// [Get Blob Tags](https://learn.microsoft.com/rest/api/storageservices/get-blob-tags):
/// `GET ?comp=tags`. A missing blob is `None`. Needs `.../blobs/tags/read` or the SAS
/// permission `t`.
#[derive(Debug, Clone)]
pub struct GetBlobTags {
    /// The container.
    pub container: ContainerName,
    /// The blob.
    pub blob: BlobName,
}

impl Operation for GetBlobTags {
    type Output = Option<Tags>;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        request(
            Method::GET,
            blob_url(account, &self.container, &self.blob, "?comp=tags"),
            Vec::new(),
        )?
        .finish()
    }
    fn parse(&self, response: &Response) -> Result<Option<Tags>, Error> {
        let Some(()) = found(expect(response, &[200]))? else {
            return Ok(None);
        };
        let text = std::str::from_utf8(response.body())
            .map_err(|_| Error::unexpected(response.status(), "tags are not UTF-8"))?;
        let doc = roxmltree::Document::parse(text.trim_start_matches('\u{feff}'))
            .map_err(|e| Error::unexpected(response.status(), format!("tags are not XML: {e}")))?;
        parse_tag_set(doc.root_element())
            .map(Some)
            .map_err(|e| Error::unexpected(response.status(), e))
    }
}

/// `x-ms-if-tags: {condition}` on another operation: storage does it only if the blob's tags
/// meet the condition (else 412 `ConditionNotMet`, a [`Refusal::ConditionFailed`]). Combined
/// with the operation's own conditions (`If-Match`): all must hold.
#[derive(Debug, Clone)]
pub struct IfTags<O> {
    /// The operation.
    pub op: O,
    /// The condition, e.g. from [`tag_equals`].
    pub condition: String,
}

impl<O: Operation> Operation for IfTags<O> {
    type Output = O::Output;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        if !valid_header_value(&self.condition) {
            return Err(Error::InvalidArgument(
                "invalid value for header x-ms-if-tags".into(),
            ));
        }
        let mut request = self.op.request(account)?;
        request
            .headers_mut()
            .append("x-ms-if-tags", self.condition.as_str());
        Ok(request)
    }
    fn parse(&self, response: &Response) -> Result<O::Output, Error> {
        self.op.parse(response)
    }
}

/// [Find Blobs by Tags](https://learn.microsoft.com/rest/api/storageservices/find-blobs-by-tags)
/// in one container (`GET /{container}?restype=container&comp=blobs&where=...`, version
/// 2021-04-10 and later): one page. Loop while [`FoundBlobs::next_marker`] is `Some`. The
/// answer names the blobs and the tags the query matched, no ETag or other property. Needs
/// `.../blobs/filter/action` or the SAS permission `f`. On Azure the index follows writes
/// asynchronously (seconds, minutes under load).
#[derive(Debug, Clone)]
pub struct FindBlobsByTags {
    /// The container.
    pub container: ContainerName,
    /// The query, e.g. from [`tag_at_most`].
    pub expression: String,
    /// Continue where the previous page ended.
    pub marker: Option<String>,
    /// Page size (1 to 5000).
    pub max_results: Option<u32>,
}

/// One blob found by tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundBlob {
    /// Its name.
    pub name: String,
    /// The tags the query matched, with their values.
    pub tags: Tags,
}

/// One page of [`FindBlobsByTags`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FoundBlobs {
    /// The blobs of this page.
    pub blobs: Vec<FoundBlob>,
    /// Where the next page starts; `None` on the last page.
    pub next_marker: Option<String>,
}

impl Operation for FindBlobsByTags {
    type Output = FoundBlobs;
    fn request(&self, account: &Account) -> Result<Request, Error> {
        let mut query = format!(
            "?restype=container&comp=blobs&where={}",
            query_value(&self.expression)
        );
        if let Some(m) = &self.marker {
            query.push_str(&format!("&marker={}", query_value(m)));
        }
        if let Some(n) = self.max_results {
            if !(1..=5000).contains(&n) {
                return Err(Error::InvalidArgument("maxresults is 1 to 5000".into()));
            }
            query.push_str(&format!("&maxresults={n}"));
        }
        request(
            Method::GET,
            container_url(account, &self.container, &query),
            Vec::new(),
        )?
        .finish()
    }
    fn parse(&self, response: &Response) -> Result<FoundBlobs, Error> {
        expect(response, &[200])?;
        parse_found_blobs(response.body())
            .map_err(|detail| Error::unexpected(response.status(), detail))
    }
}

/// Parses Find Blobs by Tags' `EnumerationResults`
/// ([response body](https://learn.microsoft.com/rest/api/storageservices/find-blobs-by-tags#response-body)).
pub fn parse_found_blobs(body: &[u8]) -> Result<FoundBlobs, String> {
    let doc = enumeration_results(body, "the answer")?;
    let root = doc.root_element();
    let mut page = FoundBlobs {
        next_marker: xml_child_text(root, "NextMarker").filter(|m| !m.is_empty()),
        ..Default::default()
    };
    let Some(blobs) = xml_child(root, "Blobs") else {
        return Ok(page);
    };
    for blob in blobs.children().filter(|n| n.has_tag_name("Blob")) {
        let name = xml_child(blob, "Name").ok_or("a found blob has no Name")?;
        let name = listed_name(name)?;
        let tags = match xml_child(blob, "Tags") {
            Some(t) => parse_tag_set(t)?,
            None => Tags::new(),
        };
        page.blobs.push(FoundBlob { name, tags });
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_a_map_sorted_by_name() {
        let mut m: Metadata = [("b".to_string(), "2".to_string())].into();
        assert_eq!(m.insert("c".into(), "3".into()), None);
        assert_eq!(m.insert("a".into(), "1".into()), None);
        assert_eq!(m.insert("b".into(), "two".into()), Some("2".into()));
        assert_eq!(
            m.keys().map(String::as_str).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
    }

    #[test]
    fn list_xml_is_parsed() {
        let xml = "\u{feff}<?xml version=\"1.0\" encoding=\"utf-8\"?>\
<EnumerationResults ServiceEndpoint=\"http://127.0.0.1:10000/devstoreaccount1\" ContainerName=\"c\">\
<Prefix>ttl/</Prefix><MaxResults>2</MaxResults><Blobs>\
<Blob><Name>ttl/a</Name><Properties><Last-Modified>Sat, 21 Nov 2026 14:00:00 GMT</Last-Modified>\
<Etag>0x8DB1</Etag><Content-Length>3</Content-Length><BlobType>BlockBlob</BlobType>\
<LeaseStatus>locked</LeaseStatus><LeaseState>leased</LeaseState></Properties>\
<Metadata><TimeToLive>2026-11-21T14:00:00Z</TimeToLive><DeadBlobContainer>dead</DeadBlobContainer></Metadata></Blob>\
<Blob><Name>ttl/b &amp; c</Name><Properties><Etag>\"0x8DB2\"</Etag></Properties></Blob>\
</Blobs><NextMarker>2!8!dHRsL2M-</NextMarker></EnumerationResults>";
        let page = parse_list_blobs(xml.as_bytes()).unwrap();
        assert_eq!(page.next_marker.as_deref(), Some("2!8!dHRsL2M-"));
        assert_eq!(page.blobs.len(), 2);
        let a = &page.blobs[0];
        assert_eq!(a.name, "ttl/a");
        assert_eq!(a.properties.etag, Some(ETag::new("0x8DB1")));
        assert_eq!(a.properties.lease_state, Some(LeaseState::Leased));
        assert_eq!(a.properties.content_length, Some(3));
        assert_eq!(
            a.properties.metadata.get("timetolive").unwrap().as_str(),
            "2026-11-21T14:00:00Z"
        );
        assert_eq!(
            a.properties
                .metadata
                .get("deadblobcontainer")
                .unwrap()
                .as_str(),
            "dead"
        );
        assert_eq!(page.blobs[1].name, "ttl/b & c");
        assert_eq!(page.blobs[1].properties.etag, Some(ETag::new("0x8DB2")));
    }

    #[test]
    fn last_page_has_no_marker_and_junk_is_refused() {
        let page =
            parse_list_blobs(b"<EnumerationResults><Blobs/><NextMarker/></EnumerationResults>")
                .unwrap();
        assert_eq!(page, ListBlobsPage::default());
        assert!(parse_list_blobs(b"<html>").is_err());
        assert!(parse_list_blobs(b"<Other/>").is_err());
    }

    #[test]
    fn encoded_names_are_decoded() {
        // Azure percent-encodes (UTF-8) a name holding characters XML cannot carry (here U+FFFF
        // and a control character) and marks it `Encoded="true"`; other names come as they are.
        let xml = "<EnumerationResults><Blobs>\
<Blob><Name Encoded=\"true\">ttl%2Fa%EF%BF%BFb%01%25</Name><Properties/></Blob>\
<Blob><Name Encoded=\"false\">ttl/100%25</Name></Blob>\
<Blob><Name>ttl/%41</Name></Blob>\
</Blobs></EnumerationResults>";
        let page = parse_list_blobs(xml.as_bytes()).unwrap();
        let names: Vec<&str> = page.blobs.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["ttl/a\u{ffff}b\u{1}%", "ttl/100%25", "ttl/%41"]);
        let bad = b"<EnumerationResults><Blobs><Blob><Name Encoded=\"true\">a%FF</Name></Blob>\
</Blobs></EnumerationResults>";
        let err = parse_list_blobs(bad).unwrap_err();
        assert!(err.contains("encoded Name is not UTF-8"), "{err}");
    }

    #[test]
    fn malformed_listings_are_clear_errors() {
        for bad in [
            &b""[..],
            b"<EnumerationResults><Blobs>",
            b"<EnumerationResults></Blobs></EnumerationResults>",
            b"<EnumerationResults><Blobs><Blob><Name>a &nope; b</Name></Blob></Blobs></EnumerationResults>",
            b"<!DOCTYPE x [<!ENTITY a \"aaaa\">]><EnumerationResults/>",
            b"<EnumerationResults/><EnumerationResults/>",
            b"\xff\xfe<EnumerationResults/>",
        ] {
            let err = parse_list_blobs(bad).unwrap_err();
            assert!(
                err.starts_with("listing is not XML: ") || err == "listing is not UTF-8",
                "{err}"
            );
        }
        let nameless =
            b"<EnumerationResults><Blobs><Blob><Name/></Blob></Blobs></EnumerationResults>";
        assert_eq!(
            parse_list_blobs(nameless).unwrap_err(),
            "a listed blob has no Name"
        );
        // An error body that is not XML has no code, and no panic.
        for body in [&b"<Error><Code>"[..], b"\xff", b"Code", b""] {
            assert_eq!(xml_error_code(body), None);
        }
        assert_eq!(
            xml_error_code(b"<Error><Code> LeaseIdMissing </Code><Message>x</Message></Error>")
                .as_deref(),
            Some("LeaseIdMissing")
        );
    }

    #[test]
    fn found_blobs_and_tags_are_parsed() {
        let xml = "\u{feff}<?xml version=\"1.0\" encoding=\"UTF-8\"?><EnumerationResults \
ServiceEndpoint=\"http://127.0.0.1:10000/devstoreaccount1\"><Where>\"k\" &lt;= '2'</Where><Blobs>\
<Blob><Name>a/b</Name><ContainerName>c</ContainerName><Tags><TagSet><Tag><Key>k</Key>\
<Value>2026-01-01T00:00:00Z</Value></Tag></TagSet></Tags></Blob>\
<Blob><Name Encoded=\"true\">x%01</Name><ContainerName>c</ContainerName></Blob>\
</Blobs><NextMarker>m-1</NextMarker></EnumerationResults>";
        let page = parse_found_blobs(xml.as_bytes()).unwrap();
        assert_eq!(page.next_marker.as_deref(), Some("m-1"));
        assert_eq!(page.blobs[0].name, "a/b");
        assert_eq!(page.blobs[0].tags["k"], "2026-01-01T00:00:00Z");
        assert_eq!(page.blobs[1].name, "x\u{1}");
        assert!(page.blobs[1].tags.is_empty());
        let last =
            parse_found_blobs(b"<EnumerationResults><Blobs/><NextMarker/></EnumerationResults>")
                .unwrap();
        assert_eq!(last, FoundBlobs::default());
        assert!(parse_found_blobs(b"<Other/>").is_err());
        assert!(parse_found_blobs(
            b"<EnumerationResults><Blobs><Blob/></Blobs></EnumerationResults>"
        )
        .is_err());
    }

    #[test]
    fn tag_expressions_refuse_what_could_end_a_quote() {
        assert_eq!(
            tag_equals("leasegate_expires_at", "2026-01-01T00:00:00Z").unwrap(),
            "\"leasegate_expires_at\" = '2026-01-01T00:00:00Z'"
        );
        assert_eq!(tag_at_most("k", "v 1").unwrap(), "\"k\" <= 'v 1'");
        for (k, v) in [
            ("k", "a'b"),
            ("k\"", "v"),
            ("", "v"),
            ("k", "<x>"),
            ("k", "é"),
        ] {
            assert!(tag_equals(k, v).is_err(), "{k} {v}");
        }
        assert!(check_tag(&"k".repeat(129), "").is_err());
        assert!(check_tag("k", &"v".repeat(257)).is_err());
    }

    /// Find Blobs by Tags signs its `where` decoded (the canonicalized resource takes query
    /// values URL-decoded), and Set Blob Tags signs its XML body's length and type.
    #[test]
    fn tag_requests_sign_what_storage_checks() {
        let account = Account::development("http://127.0.0.1:10000/devstoreaccount1").unwrap();
        let c = ContainerName::try_new("logs").unwrap();
        let find = FindBlobsByTags {
            container: c.clone(),
            expression: tag_at_most("leasegate_expires_at", "2026-11-27T10:00:00Z").unwrap(),
            marker: Some("m/1".into()),
            max_results: Some(100),
        };
        let r = find.request(&account).unwrap();
        assert_eq!(
            r.query(),
            Some("restype=container&comp=blobs&where=%22leasegate_expires_at%22%20%3C%3D%20%272026-11-27T10%3A00%3A00Z%27&marker=m%2F1&maxresults=100")
        );
        assert_eq!(
            crate::signing::canonicalized_resource(&r, "devstoreaccount1"),
            "/devstoreaccount1/devstoreaccount1/logs\ncomp:blobs\nmarker:m/1\nmaxresults:100\nrestype:container\nwhere:\"leasegate_expires_at\" <= '2026-11-27T10:00:00Z'"
        );
        let set = SetBlobTags {
            container: c.clone(),
            blob: BlobName::try_new("a").unwrap(),
            tags: [("k".to_string(), "v".to_string())].into(),
            lease_id: None,
        };
        let r = set.request(&account).unwrap();
        let body = "<?xml version=\"1.0\" encoding=\"utf-8\"?><Tags><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tags>";
        assert_eq!(r.body(), body.as_bytes());
        let sts = crate::signing::string_to_sign(&r, "devstoreaccount1");
        assert!(
            sts.starts_with(&format!(
                "PUT\n\n\n{}\n\napplication/xml; charset=utf-8\n",
                body.len()
            )),
            "{sts}"
        );
        let too_many: Tags = (0..11).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(SetBlobTags {
            tags: too_many,
            ..set.clone()
        }
        .request(&account)
        .is_err());
        let cond = IfTags {
            op: GetProperties {
                container: c,
                blob: BlobName::try_new("a").unwrap(),
            },
            condition: tag_equals("leasegate_expires_at", "2026-11-27T10:00:00Z").unwrap(),
        };
        let r = cond.request(&account).unwrap();
        assert_eq!(
            r.headers().get("x-ms-if-tags"),
            Some("\"leasegate_expires_at\" = '2026-11-27T10:00:00Z'")
        );
    }
}
