//! [List Blobs](https://learn.microsoft.com/rest/api/storageservices/list-blobs), one page at a time.

use super::*;

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
pub(super) fn query_value(s: &str) -> String {
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
pub(super) fn enumeration_results<'a>(
    body: &'a [u8],
    what: &str,
) -> Result<roxmltree::Document<'a>, String> {
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
pub(super) fn listed_name(name: roxmltree::Node<'_, '_>) -> Result<String, String> {
    let text = xml_text(name).ok_or("a listed blob has no Name")?;
    if name.attribute("Encoded") != Some("true") {
        return Ok(text);
    }
    percent_encoding::percent_decode_str(&text)
        .decode_utf8()
        .map(String::from)
        .map_err(|_| "a listed blob's encoded Name is not UTF-8".to_string())
}
