//! A native transport for [`leasegate`]: blocking HTTP/1.1 through `ureq`, for tests and tools.
//!
//! [`NativeTransport::send`] blocks the calling thread; drive the lease algorithms with
//! `pollster::block_on` (re-exported as [`block_on`]) and run concurrent callers on threads.
#![deny(missing_docs)]

use std::time::Duration;

use leasegate::{Request, Response, Transport, TransportError, TransportErrorKind};

pub use pollster::block_on;

/// Blocking HTTP transport. Statuses are answers, not errors; only a failure to exchange is an
/// error, and its message never holds the URL (which may carry a SAS).
#[derive(Debug, Clone)]
pub struct NativeTransport {
    agent: ureq::Agent,
}

impl NativeTransport {
    /// A transport with this timeout for each exchange.
    pub fn new(timeout: Duration) -> Self {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .max_redirects(0)
            .build();
        NativeTransport {
            agent: config.into(),
        }
    }

    /// Sends and waits: the blocking form of [`Transport::send`].
    pub fn send_blocking(&self, request: Request) -> Result<Response, TransportError> {
        let mut outgoing = http::Request::builder()
            .method(request.method().clone())
            .uri(request.uri());
        for (name, value) in request.headers().iter() {
            outgoing = outgoing.header(name, value);
        }
        let outgoing = outgoing.body(request.into_body()).map_err(|_| {
            TransportError::new(TransportErrorKind::Other, "the request is not valid HTTP")
        })?;
        let response = self.agent.run(outgoing).map_err(classify)?;
        let (parts, mut body) = response.into_parts();
        let mut answer = Response::new(parts.status);
        for (name, value) in &parts.headers {
            let value = String::from_utf8_lossy(value.as_bytes());
            answer.headers_mut().append(name.as_str(), value);
        }
        Ok(answer.with_body(body.read_to_vec().map_err(classify)?))
    }
}

impl Default for NativeTransport {
    fn default() -> Self {
        NativeTransport::new(Duration::from_secs(30))
    }
}

impl Transport for NativeTransport {
    async fn send(&self, request: Request) -> Result<Response, TransportError> {
        self.send_blocking(request)
    }

    /// The wall clock: every request is dated when it is sent.
    fn now(&self) -> Option<std::time::SystemTime> {
        Some(std::time::SystemTime::now())
    }
}

fn classify(e: ureq::Error) -> TransportError {
    use ureq::Error as E;
    match e {
        E::Timeout(_) => TransportError::new(TransportErrorKind::Timeout, "no answer in time"),
        E::ConnectionFailed | E::HostNotFound => {
            TransportError::new(TransportErrorKind::Connect, "could not connect to storage")
        }
        E::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            TransportError::new(TransportErrorKind::Connect, "connection refused by storage")
        }
        // The error's own text can quote the URL; keep only its kind.
        E::Io(io) => TransportError::new(
            TransportErrorKind::Other,
            format!("io error: {:?}", io.kind()),
        ),
        _ => TransportError::new(TransportErrorKind::Other, "http exchange failed"),
    }
}
