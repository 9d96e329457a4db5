//! Blob index tags: set, get, conditions on them, Find Blobs by Tags.

use super::*;

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

/// The `x-ms-tags` header of a write that sets `tags` (`key=value&...`, each part
/// percent-encoded), or `None` for no tags; every tag is checked against storage's rules.
pub(super) fn tags_header(tags: &Tags) -> Result<Option<String>, Error> {
    if tags.len() > MAX_TAGS {
        return Err(Error::InvalidArgument(format!(
            "a blob carries at most {MAX_TAGS} tags, not {}",
            tags.len()
        )));
    }
    let encode = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let mut parts = Vec::new();
    for (key, value) in tags {
        check_tag(key, value)?;
        parts.push(format!("{}={}", encode(key), encode(value)));
    }
    Ok((!parts.is_empty()).then(|| parts.join("&")))
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
pub(super) fn parse_tag_set(node: roxmltree::Node<'_, '_>) -> Result<Tags, String> {
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
