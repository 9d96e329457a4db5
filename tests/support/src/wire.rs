//! Requests and answers as plain values the checker can keep in its states (hashable,
//! comparable), and back.

use leasegate::{Method, Request, Response, StatusCode};

/// A request as it went out.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WireRequest {
    /// `GET`, `PUT`, ...
    pub method: String,
    /// The whole URI.
    pub uri: String,
    /// Header names (lowercase) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl WireRequest {
    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Removes header `name` (lowercase).
    pub fn remove_header(&mut self, name: &str) {
        self.headers.retain(|(n, _)| n != name);
    }

    /// Sets header `name` (lowercase).
    pub fn set_header(&mut self, name: &str, value: String) {
        self.remove_header(name);
        self.headers.push((name.to_string(), value));
    }

    /// The host the request goes to.
    pub fn host(&self) -> &str {
        let rest = self.uri.split_once("://").map_or("", |(_, r)| r);
        rest.split(['/', '?']).next().unwrap_or("")
    }

    /// The path, without the query.
    pub fn path(&self) -> &str {
        let rest = self.uri.split_once("://").map_or("", |(_, r)| r);
        let path = rest.find('/').map_or("", |i| &rest[i..]);
        path.split('?').next().unwrap_or("")
    }

    /// The query parameter `name`, percent-decoded.
    pub fn query(&self, name: &str) -> Option<String> {
        let query = self.uri.split_once('?')?.1;
        query.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k == name).then(|| {
                percent_encoding::percent_decode_str(v)
                    .decode_utf8_lossy()
                    .into_owned()
            })
        })
    }
}

impl From<&Request> for WireRequest {
    fn from(request: &Request) -> Self {
        WireRequest {
            method: request.method().as_str().to_string(),
            uri: request.uri().to_string(),
            headers: request
                .headers()
                .iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v.to_string()))
                .collect(),
            body: request.body().to_vec(),
        }
    }
}

impl WireRequest {
    /// Back to a request (for a transport).
    pub fn to_request(&self) -> Request {
        let method = Method::from_bytes(self.method.as_bytes()).unwrap_or(Method::GET);
        let mut request = Request::new(method, self.uri.clone()).with_body(self.body.clone());
        for (n, v) in &self.headers {
            request.headers_mut().append(n, v.clone());
        }
        request
    }
}

/// An answer as it came back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WireResponse {
    /// The status code.
    pub status: u16,
    /// Header names (lowercase) and values.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl WireResponse {
    /// An answer with `status` and no headers.
    pub fn new(status: u16) -> Self {
        WireResponse {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// With header `name` set.
    pub fn with(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// As the core's response.
    pub fn to_response(&self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = Response::new(status).with_body(self.body.clone());
        for (n, v) in &self.headers {
            response.headers_mut().append(n, v.clone());
        }
        response
    }
}
