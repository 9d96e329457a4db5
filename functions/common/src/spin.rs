//! The Spin side: outbound HTTP through spin-sdk, Spin variables, and the incoming request
//! read with a size cap. Only this module touches spin-sdk.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, SystemTime};

use futures::future::{select, Either};
use futures::StreamExt;
use http::{Request, Response, StatusCode};
use leasegate::{LeaseId, Transport, TransportError, TransportErrorKind};
use spin_sdk::http::{IncomingRequest, SendError};

use crate::config::Variables;
use crate::web;
use crate::Context;

/// Outbound HTTP through spin-sdk (`wasi:http/outgoing-handler`), each request bounded by a
/// timeout. Spin checks every request against the component's `allowed_outbound_hosts`.
#[derive(Debug, Clone, Copy)]
pub struct SpinTransport {
    /// How long one exchange may take.
    pub timeout: Duration,
}

impl Transport for SpinTransport {
    async fn send(&self, request: Request<Vec<u8>>) -> Result<Response<Vec<u8>>, TransportError> {
        let exchange = spin_sdk::http::send::<_, Response<Vec<u8>>>(request);
        match select(Box::pin(exchange), Sleep::new(self.timeout)).await {
            Either::Left((Ok(response), _)) => Ok(response),
            Either::Left((Err(e), _)) => Err(classify(&e)),
            Either::Right(_) => Err(TransportError::new(
                TransportErrorKind::Timeout,
                format!("no answer within {} ms", self.timeout.as_millis()),
            )),
        }
    }
}

/// Maps spin-sdk's send errors; the text names the error kind, never the URL.
fn classify(e: &SendError) -> TransportError {
    use spin_sdk::http::ErrorCode;
    match e {
        SendError::Http(code) => {
            let kind = match code {
                ErrorCode::ConnectionRefused
                | ErrorCode::DestinationNotFound
                | ErrorCode::DestinationUnavailable
                | ErrorCode::DnsError(_) => TransportErrorKind::Connect,
                ErrorCode::ConnectionTimeout | ErrorCode::ConnectionReadTimeout => {
                    TransportErrorKind::Timeout
                }
                _ => TransportErrorKind::Other,
            };
            let what = match code {
                ErrorCode::HttpRequestDenied => {
                    "request denied by the host (is the origin in allowed_outbound_hosts?)"
                        .to_string()
                }
                // The variant's name only: payloads (an internal error's text) could carry
                // details of the request.
                other => format!("{other:?}")
                    .trim_start_matches("ErrorCode::")
                    .split(['(', ' ', '{'])
                    .next()
                    .unwrap_or("error")
                    .to_string(),
            };
            TransportError::new(kind, what)
        }
        SendError::RequestConversion(_) => {
            TransportError::new(TransportErrorKind::Other, "the request could not be sent")
        }
        SendError::ResponseConversion(_) | SendError::Io(_) => {
            TransportError::new(TransportErrorKind::Other, "the response could not be read")
        }
    }
}

/// A future that is ready once a monotonic-clock deadline has passed. Each time it is polled
/// too early it hands Spin's executor a fresh WASI pollable for the deadline, so the executor
/// waits on it beside the outbound requests; dropping it cancels the wait.
struct Sleep {
    deadline: u64,
    _waiting: Option<spin_executor::CancelOnDropToken>,
}

impl Sleep {
    fn new(after: Duration) -> Self {
        let nanos = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
        Sleep {
            deadline: wasi::clocks::monotonic_clock::now().saturating_add(nanos),
            _waiting: None,
        }
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        if wasi::clocks::monotonic_clock::now() >= self.deadline {
            return Poll::Ready(());
        }
        let pollable = wasi::clocks::monotonic_clock::subscribe_instant(self.deadline);
        let token = spin_executor::push_waker_and_get_token(pollable, cx.waker().clone());
        self._waiting = Some(token.into());
        Poll::Pending
    }
}

/// Component variables, read through spin-sdk.
pub struct SpinVariables;

impl Variables for SpinVariables {
    fn get(&self, name: &str) -> Option<String> {
        spin_sdk::variables::get(name).ok()
    }
}

/// A fresh random lease id from WASI's random source.
pub fn random_lease_id() -> LeaseId {
    let a = wasi::random::random::get_random_u64().to_le_bytes();
    let b = wasi::random::random::get_random_u64().to_le_bytes();
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a);
    bytes[8..].copy_from_slice(&b);
    LeaseId::from_random_bytes(bytes)
}

/// Bodies up to this size are read to their end (and discarded) before a 413 is sent, so the
/// client, still writing, gets the answer rather than a reset connection. Larger ones are cut.
const DRAIN_LIMIT: u64 = 8 << 20;

/// Reads the incoming request into an `http::Request`, refusing bodies over `limit` bytes
/// (413) without keeping them.
pub async fn read_request(
    request: IncomingRequest,
    limit: usize,
) -> Result<Request<Vec<u8>>, Response<Vec<u8>>> {
    let bad = |m: &str| web::error(StatusCode::BAD_REQUEST, "bad_request", m);
    let mut builder = Request::builder()
        .method(request.method().to_string().as_str())
        .uri(request.path_with_query().unwrap_or_else(|| "/".into()));
    for (name, value) in request.headers().entries() {
        builder = builder.header(name, value);
    }
    let declared = request
        .headers()
        .get("content-length")
        .first()
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAIN_LIMIT) {
        return Err(web::too_large(limit));
    }
    let mut body = Vec::new();
    let mut seen: u64 = 0;
    let mut stream = request.into_body_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| bad("the request body could not be read"))?;
        seen += chunk.len() as u64;
        if seen > DRAIN_LIMIT {
            break;
        }
        if seen <= limit as u64 {
            body.extend_from_slice(&chunk);
        }
    }
    if seen > limit as u64 {
        return Err(web::too_large(limit));
    }
    builder
        .body(body)
        .map_err(|_| bad("the request line or headers are not valid"))
}

/// What a component's handler runs with in Spin: the Spin transport and variables.
pub struct SpinEnv {
    transport: SpinTransport,
    variables: SpinVariables,
}

impl SpinEnv {
    /// Reads `storage_timeout_ms` (default 5000) for the transport.
    pub fn new() -> Self {
        let variables = SpinVariables;
        let timeout =
            crate::config::number(&variables, "storage_timeout_ms", 5000.0, 100.0..=60_000.0)
                .unwrap_or(5000.0);
        SpinEnv {
            transport: SpinTransport {
                timeout: Duration::from_millis(timeout as u64),
            },
            variables,
        }
    }

    /// The handler context, dated now.
    pub fn context(&self) -> Context<'_, SpinTransport> {
        Context {
            transport: &self.transport,
            variables: &self.variables,
            now: SystemTime::now(),
            new_lease_id: &random_lease_id,
        }
    }
}

impl Default for SpinEnv {
    fn default() -> Self {
        Self::new()
    }
}
