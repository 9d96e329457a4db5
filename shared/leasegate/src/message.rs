//! The HTTP messages the core builds and reads: plain values.
//!
//! A request is a method, a URL, a list of headers and a body; a response is a status, a list
//! of headers and a body. Header names are kept lowercased and looked up without regard to case.
//! These are deliberately smaller than the `http` crate's `Request`, `Response` and `HeaderMap`:
//! a storage request carries a dozen headers, so a list beats a hash map, and a Wasm component
//! does not carry the code that interns standard header names (about 35 KB of each component).
//! Methods and status codes are the `http` crate's.

pub use http::{Method, StatusCode};

/// Header fields in order, names lowercased; a name may repeat. `Debug` shows the values of
/// [`SECRET_HEADERS`] and of any header holding a SAS (`sig=`) as `<redacted>`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, String)>);

/// Headers whose values are secrets: a SharedKey signature or a bearer token, a copy source's
/// token, a managed identity's header.
pub const SECRET_HEADERS: [&str; 3] = [
    "authorization",
    "x-ms-copy-source-authorization",
    "x-identity-header",
];

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, value)| {
                let secret = SECRET_HEADERS.contains(&name.as_str()) || value.contains("sig=");
                (name, if secret { "<redacted>" } else { value.as_str() })
            }))
            .finish()
    }
}

/// `uri` with the value of a `sig=` query parameter (a SAS's signature) replaced.
fn redact_sig(uri: &str) -> String {
    match uri.find("sig=") {
        Some(at) => {
            let end = uri[at..].find('&').map_or(uri.len(), |i| at + i);
            format!("{}sig=<redacted>{}", &uri[..at], &uri[end..])
        }
        None => uri.to_string(),
    }
}

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Headers(Vec::new())
    }

    /// The first value of `name` (any case).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `name` (any case), in order.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// True if `name` (any case) is present.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Sets `name` to `value`, replacing any values it had.
    pub fn insert(&mut self, name: &str, value: impl Into<String>) {
        self.remove(name);
        self.append(name, value);
    }

    /// Adds a value for `name`, keeping those it had.
    pub fn append(&mut self, name: &str, value: impl Into<String>) {
        self.0.push((name.to_ascii_lowercase(), value.into()));
    }

    /// Removes every value of `name` (any case).
    pub fn remove(&mut self, name: &str) {
        self.0.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    }

    /// The fields in order, names lowercased.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The number of fields.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True if there are no fields.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// True if `value` may be sent as a header value: visible ASCII, spaces and tabs (what the
/// `http` crate and wasi:http accept, less the obsolete non-ASCII bytes).
pub fn valid_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
}

/// True if `name` is an HTTP token (RFC 9110 section 5.6.2), as a header name must be.
pub fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A request: method, URL (absolute for outbound requests; path and query for incoming ones),
/// headers, body. `Debug` shows no secret: a SAS signature and secret headers are redacted,
/// the body (a token request's form holds a client secret) by its length only.
#[derive(Clone, PartialEq, Eq)]
pub struct Request {
    method: Method,
    uri: String,
    headers: Headers,
    body: Vec<u8>,
}

impl Request {
    /// A request with no headers and an empty body.
    pub fn new(method: Method, uri: impl Into<String>) -> Self {
        Request {
            method,
            uri: uri.into(),
            headers: Headers::new(),
            body: Vec::new(),
        }
    }

    /// The request with `name: value` added.
    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.append(name, value);
        self
    }

    /// The request with this body.
    pub fn with_body(mut self, body: Vec<u8>) -> Self {
        self.body = body;
        self
    }

    /// The method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The URL as given.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Replaces the URL.
    pub fn set_uri(&mut self, uri: String) {
        self.uri = uri;
    }

    /// The scheme of an absolute URL (`http`, `https`).
    pub fn scheme(&self) -> Option<&str> {
        split_scheme(&self.uri).map(|(s, _)| s)
    }

    /// The authority of an absolute URL (`host[:port]`).
    pub fn authority(&self) -> Option<&str> {
        let (_, rest) = split_scheme(&self.uri)?;
        Some(&rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())])
    }

    /// The path: after the scheme and authority (if any), before the query; `/` if empty.
    pub fn path(&self) -> &str {
        let path = path_and_query(&self.uri);
        let path = path.split_once('?').map_or(path, |(p, _)| p);
        if path.is_empty() {
            "/"
        } else {
            path
        }
    }

    /// The query, without its `?`.
    pub fn query(&self) -> Option<&str> {
        path_and_query(&self.uri).split_once('?').map(|(_, q)| q)
    }

    /// The path and query, as a request line carries them (the path `/` if empty).
    pub fn path_and_query(&self) -> String {
        match path_and_query(&self.uri) {
            pq if pq.starts_with('/') => pq.to_string(),
            pq => format!("/{pq}"),
        }
    }

    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The headers, to change.
    pub fn headers_mut(&mut self) -> &mut Headers {
        &mut self.headers
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The body, taken.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

/// `uri` without `scheme://authority`, and without a fragment.
fn path_and_query(uri: &str) -> &str {
    let uri = uri.split_once('#').map_or(uri, |(u, _)| u);
    match split_scheme(uri) {
        Some((_, rest)) => rest.find(['/', '?']).map_or("", |i| &rest[i..]),
        None => uri,
    }
}

/// `scheme://rest` as `(scheme, rest)`. (The scheme ends at the first `:`; searching for a
/// `char` keeps the standard library's substring search out of the components.)
pub(crate) fn split_scheme(uri: &str) -> Option<(&str, &str)> {
    let colon = uri.find(':')?;
    let scheme = &uri[..colon];
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
    let rest = uri[colon..].strip_prefix("://").filter(|_| valid)?;
    Some((scheme, rest))
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("uri", &redact_sig(&self.uri))
            .field("headers", &self.headers)
            .field("body_bytes", &self.body.len())
            .finish()
    }
}

/// A response: status, headers, body. `Debug` shows the body by its length only (a token
/// endpoint's answer holds a token).
#[derive(Clone, PartialEq, Eq)]
pub struct Response {
    status: StatusCode,
    headers: Headers,
    body: Vec<u8>,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body_bytes", &self.body.len())
            .finish()
    }
}

impl Response {
    /// A response with no headers and an empty body.
    pub fn new(status: StatusCode) -> Self {
        Response {
            status,
            headers: Headers::new(),
            body: Vec::new(),
        }
    }

    /// The response with `name: value` added.
    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.append(name, value);
        self
    }

    /// The response with this body.
    pub fn with_body(mut self, body: Vec<u8>) -> Self {
        self.body = body;
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Replaces the status.
    pub fn set_status(&mut self, status: StatusCode) {
        self.status = status;
    }

    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The headers, to change.
    pub fn headers_mut(&mut self) -> &mut Headers {
        &mut self.headers
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The body, taken.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lowercased_and_found_in_any_case() {
        let mut h = Headers::new();
        h.append("X-MS-Meta-Foo", "a");
        h.append("x-ms-meta-foo", "b");
        assert_eq!(h.get("x-ms-META-foo"), Some("a"));
        assert_eq!(h.get_all("X-Ms-Meta-Foo").collect::<Vec<_>>(), ["a", "b"]);
        h.insert("x-ms-meta-FOO", "c");
        assert_eq!(h.iter().collect::<Vec<_>>(), [("x-ms-meta-foo", "c")]);
        h.remove("X-MS-META-FOO");
        assert!(h.is_empty());
    }

    #[test]
    fn path_and_query_of_absolute_and_relative_urls() {
        let r = Request::new(
            Method::GET,
            "http://127.0.0.1:10000/acct/c/b%20x?comp=lease&a=b",
        );
        assert_eq!(r.path(), "/acct/c/b%20x");
        assert_eq!(r.query(), Some("comp=lease&a=b"));
        assert_eq!(r.path_and_query(), "/acct/c/b%20x?comp=lease&a=b");
        assert_eq!(
            (r.scheme(), r.authority()),
            (Some("http"), Some("127.0.0.1:10000"))
        );
        let r = Request::new(
            Method::GET,
            "https://a.blob.core.windows.net?restype=service",
        );
        assert_eq!((r.path(), r.query()), ("/", Some("restype=service")));
        assert_eq!(r.path_and_query(), "/?restype=service");
        let r = Request::new(Method::GET, "https://a.blob.core.windows.net");
        assert_eq!(
            (r.path(), r.query(), r.path_and_query().as_str()),
            ("/", None, "/")
        );
        let r = Request::new(Method::POST, "/api/gate/k?holder=x://y#frag");
        assert_eq!((r.path(), r.query()), ("/api/gate/k", Some("holder=x://y")));
        assert_eq!((r.scheme(), r.authority()), (None, None));
    }

    #[test]
    fn header_values_and_names_are_checked() {
        assert!(valid_header_value("SharedKey a:b+/="));
        assert!(valid_header_value("a\tb c"));
        assert!(!valid_header_value("a\r\nx-evil: 1"));
        assert!(!valid_header_value("caf\u{e9}"));
        assert!(valid_header_name("x-ms-meta-foo_1"));
        assert!(!valid_header_name("a b"));
        assert!(!valid_header_name(""));
    }

    #[test]
    fn debug_output_holds_no_secret() {
        let request = Request::new(
            Method::PUT,
            "https://a.blob.core.windows.net/c/b?comp=lease&sig=s3cr3t%3D&sv=1",
        )
        .with_header("authorization", "Bearer eyJ.secret.token")
        .with_header("x-ms-copy-source-authorization", "Bearer eyJ.secret.token")
        .with_header("x-identity-header", "hdr-s3cr3t")
        .with_header(
            "x-ms-copy-source",
            "https://a.blob.core.windows.net/c/x?sv=1&sig=s3cr3t%3D",
        )
        .with_header("x-ms-version", "2021-12-02")
        .with_body(b"client_secret=s3cr3t".to_vec());
        let dbg = format!("{request:?}");
        assert!(!dbg.contains("s3cr3t") && !dbg.contains("eyJ"), "{dbg}");
        assert!(dbg.contains("comp=lease&sig=<redacted>&sv=1"), "{dbg}");
        assert!(dbg.contains("2021-12-02"), "{dbg}");
        let response = Response::new(StatusCode::OK)
            .with_body(br#"{"access_token":"eyJ.secret.token"}"#.to_vec());
        assert!(!format!("{response:?}").contains("eyJ"));
    }
}
