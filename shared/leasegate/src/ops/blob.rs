//! Blob operations: put, properties, get, metadata, sequence numbers, delete, copy.

use super::*;
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
    /// Index tags to set with the write (`x-ms-tags`; empty: none, and a put **removes** the
    /// tags an overwritten blob had).
    pub tags: Tags,
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
            tags: Tags::new(),
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

    /// Sets the index tags the write gives the blob.
    pub fn with_tags(mut self, tags: Tags) -> Self {
        self.tags = tags;
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
            .opt_header("x-ms-tags", tags_header(&self.tags)?)?
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
pub(super) fn found<T>(result: Result<T, Error>) -> Result<Option<T>, Error> {
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
