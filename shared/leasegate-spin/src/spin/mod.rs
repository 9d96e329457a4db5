//! The Spin side, on spin-sdk 5.2 (WASI 0.2): outbound HTTP through `spin_sdk::http::send`
//! (bounded by a timeout, the response body read as a stream with a cap), Spin variables and
//! the key-value store, the incoming request read with a size cap, the answer sent in one
//! write, and the entry points ([`serve`], [`cron_export!`](crate::cron_export)). Only this module touches
//! spin-sdk: moving to another spin-sdk is a change to this crate alone.
//!
//! Besides spin-sdk, two crates spin-sdk itself is built on, at the versions it uses: Spin's
//! executor (a timeout must hand the executor a clock pollable to wait on, which spin-sdk does
//! not expose) and the `wasi` crate (the monotonic clock and the random source; its
//! `wasi:io@0.2.0` types are the ones spin-sdk's HTTP types use).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, SystemTime};

use futures::future::{select, Either};
use futures::StreamExt;
use leasegate::token::TokenSource;
use leasegate::{
    AccessToken, LeaseId, Request, Response, StatusCode, Transport, TransportError,
    TransportErrorKind,
};
use spin_sdk::http::conversions::TryIntoOutgoingRequest;
use spin_sdk::http::{
    ErrorCode, Fields, IncomingRequest, IncomingResponse, Method, OutgoingBody, OutgoingRequest,
    OutgoingResponse, ResponseOutparam, Scheme, SendError,
};
use spin_sdk::{key_value, variables};

use crate::config::Variables;
use crate::web;
use crate::Context;

mod tokens;

/// The largest response body [`SpinTransport`] reads by default: 16 MiB. Storage answers of
/// the lease module are a few KiB at most (a lease record's metadata, an error document, a
/// listing page), webhook answers are ignored; the cap only keeps a misbehaving server from
/// filling the component's memory.
pub const MAX_RESPONSE_BODY: usize = 16 << 20;

/// How much of an answer whose body is not used ([`Transport::send_for_status`]: a webhook's,
/// a job's, a heartbeat receiver's) is read before the rest is dropped: 4 KiB. A receiver that
/// answers a huge body then costs the component no memory (with `max_in_flight` up to 256
/// answers at once, 16 MiB each would exhaust it).
pub const UNUSED_BODY_READ: usize = 4 << 10;

/// Outbound HTTP through `spin_sdk::http::send`, each exchange bounded by a timeout and each
/// response body by a size cap. Spin checks every request against the component's
/// `allowed_outbound_hosts`.
///
/// The response is read as a stream: a body that breaks off, or that is larger than
/// `max_body`, is a [`TransportError`] of kind `Other`.
#[derive(Debug, Clone, Copy)]
pub struct SpinTransport {
    /// How long one exchange may take: sending the request, the response head and reading
    /// the whole body.
    pub timeout: Duration,
    /// The largest response body read, in bytes ([`MAX_RESPONSE_BODY`] by default). Reading
    /// stops at the cap; nothing beyond it is buffered.
    pub max_body: usize,
}

impl Transport for SpinTransport {
    /// The wall clock, read as each storage request is signed: a long invocation (an
    /// initialization, a job, a sweep) never sends a date older than the request.
    fn now(&self) -> Option<SystemTime> {
        Some(SystemTime::now())
    }

    async fn send(&self, request: Request) -> Result<Response, TransportError> {
        self.bounded(exchange(request, Some(self.max_body))).await
    }

    /// Reads at most [`UNUSED_BODY_READ`] bytes of the answer's body and drops the rest (the
    /// host then cancels the exchange and closes its connection); the answer's body is empty.
    async fn send_for_status(&self, request: Request) -> Result<Response, TransportError> {
        self.bounded(exchange(request, None)).await
    }

    /// The bearer token of `source`: the one this invocation already holds while it is
    /// [usable](crate::token::usable) (it was the freshest to be had), else the one kept in
    /// the key-value store `default` ([`crate::token`]; not with `storage_token_cache = off`),
    /// else a new one from the source, fetched through this transport.
    async fn access_token(
        &self,
        source: &TokenSource,
        refresh: bool,
    ) -> Result<AccessToken, leasegate::Error> {
        tokens::access_token(self, source, refresh).await
    }
}

impl SpinTransport {
    /// `exchange` bounded by the timeout.
    async fn bounded(
        &self,
        exchange: impl Future<Output = Result<Response, TransportError>>,
    ) -> Result<Response, TransportError> {
        match select(Box::pin(exchange), Sleep::new(self.timeout)).await {
            Either::Left((result, _)) => result,
            Either::Right(_) => Err(TransportError::new(
                TransportErrorKind::Timeout,
                // In u64 (whole years of milliseconds): printing a u128 is more code.
                format!(
                    "no complete answer within {} ms",
                    u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX)
                ),
            )),
        }
    }
}

/// `headers` as a `wasi:http` field list, without `skip` (one copy of this loop for requests
/// and responses).
fn field_list(headers: &leasegate::Headers, skip: &str) -> Vec<(String, Vec<u8>)> {
    let mut entries = Vec::with_capacity(headers.len());
    for (name, value) in headers.iter() {
        if name != skip {
            entries.push((name.to_owned(), value.as_bytes().to_vec()));
        }
    }
    entries
}

/// A [`Request`] on its way to `spin_sdk::http::send`: the head becomes a `wasi:http` outgoing
/// request, the body the buffer spin-sdk writes (and finishes) before it waits for the answer.
struct Outbound(Request);

/// A request head `wasi:http` refuses (a header or method it forbids).
#[derive(Debug)]
struct NotSendable;

impl std::fmt::Display for NotSendable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request could not be sent")
    }
}

impl std::error::Error for NotSendable {}

impl TryIntoOutgoingRequest for Outbound {
    type Error = NotSendable;

    fn try_into_outgoing_request(self) -> Result<(OutgoingRequest, Option<Vec<u8>>), NotSendable> {
        let request = self.0;
        let entries = field_list(request.headers(), "");
        let outgoing = OutgoingRequest::new(Fields::from_list(&entries).map_err(|_| NotSendable)?);
        let method = match request.method().as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "CONNECT" => Method::Connect,
            "OPTIONS" => Method::Options,
            "TRACE" => Method::Trace,
            "PATCH" => Method::Patch,
            other => Method::Other(other.to_owned()),
        };
        outgoing.set_method(&method).map_err(|()| NotSendable)?;
        outgoing
            .set_path_with_query(Some(&request.path_and_query()))
            .map_err(|()| NotSendable)?;
        let scheme = request.scheme().map(|s| match s {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            s => Scheme::Other(s.to_owned()),
        });
        outgoing
            .set_scheme(scheme.as_ref())
            .map_err(|()| NotSendable)?;
        outgoing
            .set_authority(request.authority())
            .map_err(|()| NotSendable)?;
        Ok((outgoing, Some(request.into_body())))
    }
}

/// Sends `request` with `spin_sdk::http::send` (which writes the body, then waits for the
/// response head); the response comes back unread, its body a stream.
async fn send(request: Request) -> Result<IncomingResponse, TransportError> {
    match spin_sdk::http::send::<_, IncomingResponse>(Outbound(request)).await {
        Ok(response) => Ok(response),
        Err(SendError::Http(code)) => Err(classify(&code)),
        Err(SendError::RequestConversion(_)) => Err(TransportError::new(
            TransportErrorKind::Other,
            "the request could not be sent",
        )),
        Err(_) => Err(TransportError::new(
            TransportErrorKind::Other,
            "the request body could not be written",
        )),
    }
}

/// Sends `request` and reads its response, the body up to `max_body` bytes (more is an
/// error); `None`: the body is not used, [`UNUSED_BODY_READ`] bytes of it at most are read and
/// the answer has none. Dropping this future (at the timeout) drops the body stream, then the
/// response: the host cancels the rest of the exchange.
async fn exchange(request: Request, max_body: Option<usize>) -> Result<Response, TransportError> {
    // A HEAD answer has no body, whatever its Content-Length says (for a blob, its size).
    let head = *request.method() == leasegate::Method::HEAD;
    let response = send(request).await?;
    let status = response.status();
    let mut answer = Response::new(StatusCode::from_u16(status).map_err(|_| {
        TransportError::new(
            TransportErrorKind::Other,
            "the response head is not valid HTTP",
        )
    })?);
    let mut declared = None;
    // A value that is not UTF-8 is left out: the parsers read none such (the `http` crate's
    // `to_str` refused them too).
    for (name, value) in response.headers().entries() {
        let Ok(value) = String::from_utf8(value) else {
            continue;
        };
        if name.eq_ignore_ascii_case("content-length") {
            declared = value.trim().parse::<u64>().ok();
        }
        answer.headers_mut().append(&name, value);
    }
    let body = if head || status == 204 || status == 304 {
        Vec::new()
    } else if let Some(max_body) = max_body {
        if declared.is_some_and(|n| n > max_body as u64) {
            return Err(over(max_body));
        }
        read_body(&response, max_body, false).await?
    } else {
        // Read a little (a body that breaks off early still says the answer broke), then
        // drop the rest with the response.
        read_body(&response, UNUSED_BODY_READ, true).await?;
        Vec::new()
    };
    Ok(answer.with_body(body))
}

/// Reads a response body chunk by chunk through spin-sdk's body stream, up to `max` bytes:
/// more is an error, or (`cut`) the end of the reading, the rest left unread. A body that
/// breaks off is an error, never a trap. (The response stays alive while its body is read:
/// dropping it would cancel the exchange.)
async fn read_body(
    response: &IncomingResponse,
    max: usize,
    cut: bool,
) -> Result<Vec<u8>, TransportError> {
    let broke_off = |n: usize| {
        TransportError::new(
            TransportErrorKind::Other,
            format!("the response body broke off after {n} bytes"),
        )
    };
    let mut stream = std::pin::pin!(response.take_body_stream());
    let mut body = Vec::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return Err(broke_off(body.len()));
        };
        if chunk.len() > max - body.len() {
            if cut {
                // The stream (and its body) is dropped before the response it belongs to.
                return Ok(body);
            }
            return Err(over(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn over(max: usize) -> TransportError {
    TransportError::new(
        TransportErrorKind::Other,
        format!("response body over {max} bytes"),
    )
}

/// Maps the host's HTTP error codes; the text names the error kind, never the URL.
fn classify(code: &ErrorCode) -> TransportError {
    let kind = match code {
        ErrorCode::ConnectionRefused
        | ErrorCode::DestinationNotFound
        | ErrorCode::DestinationUnavailable
        | ErrorCode::DnsError(_)
        // The host refused to send it (not an allowed outbound host): nothing left.
        | ErrorCode::HttpRequestDenied => TransportErrorKind::Connect,
        ErrorCode::ConnectionTimeout | ErrorCode::ConnectionReadTimeout => {
            TransportErrorKind::Timeout
        }
        _ => TransportErrorKind::Other,
    };
    let what = match code {
        ErrorCode::HttpRequestDenied => {
            "request denied by the host (is the origin in allowed_outbound_hosts?)"
        }
        // The variant's name only: payloads (an internal error's text) could carry details of
        // the request.
        other => error_code_name(other),
    };
    TransportError::new(kind, what)
}

/// The name of an error code's variant (as its `Debug` would start), without its payload.
fn error_code_name(code: &ErrorCode) -> &'static str {
    match code {
        ErrorCode::DnsTimeout => "DnsTimeout",
        ErrorCode::DnsError(_) => "DnsError",
        ErrorCode::DestinationNotFound => "DestinationNotFound",
        ErrorCode::DestinationUnavailable => "DestinationUnavailable",
        ErrorCode::DestinationIpProhibited => "DestinationIpProhibited",
        ErrorCode::DestinationIpUnroutable => "DestinationIpUnroutable",
        ErrorCode::ConnectionRefused => "ConnectionRefused",
        ErrorCode::ConnectionTerminated => "ConnectionTerminated",
        ErrorCode::ConnectionTimeout => "ConnectionTimeout",
        ErrorCode::ConnectionReadTimeout => "ConnectionReadTimeout",
        ErrorCode::ConnectionWriteTimeout => "ConnectionWriteTimeout",
        ErrorCode::ConnectionLimitReached => "ConnectionLimitReached",
        ErrorCode::TlsProtocolError => "TlsProtocolError",
        ErrorCode::TlsCertificateError => "TlsCertificateError",
        ErrorCode::TlsAlertReceived(_) => "TlsAlertReceived",
        ErrorCode::HttpRequestDenied => "HttpRequestDenied",
        ErrorCode::HttpRequestLengthRequired => "HttpRequestLengthRequired",
        ErrorCode::HttpRequestBodySize(_) => "HttpRequestBodySize",
        ErrorCode::HttpRequestMethodInvalid => "HttpRequestMethodInvalid",
        ErrorCode::HttpRequestUriInvalid => "HttpRequestUriInvalid",
        ErrorCode::HttpRequestUriTooLong => "HttpRequestUriTooLong",
        ErrorCode::HttpRequestHeaderSectionSize(_) => "HttpRequestHeaderSectionSize",
        ErrorCode::HttpRequestHeaderSize(_) => "HttpRequestHeaderSize",
        ErrorCode::HttpRequestTrailerSectionSize(_) => "HttpRequestTrailerSectionSize",
        ErrorCode::HttpRequestTrailerSize(_) => "HttpRequestTrailerSize",
        ErrorCode::HttpResponseIncomplete => "HttpResponseIncomplete",
        ErrorCode::HttpResponseHeaderSectionSize(_) => "HttpResponseHeaderSectionSize",
        ErrorCode::HttpResponseHeaderSize(_) => "HttpResponseHeaderSize",
        ErrorCode::HttpResponseBodySize(_) => "HttpResponseBodySize",
        ErrorCode::HttpResponseTrailerSectionSize(_) => "HttpResponseTrailerSectionSize",
        ErrorCode::HttpResponseTrailerSize(_) => "HttpResponseTrailerSize",
        ErrorCode::HttpResponseTransferCoding(_) => "HttpResponseTransferCoding",
        ErrorCode::HttpResponseContentCoding(_) => "HttpResponseContentCoding",
        ErrorCode::HttpResponseTimeout => "HttpResponseTimeout",
        ErrorCode::HttpUpgradeFailed => "HttpUpgradeFailed",
        ErrorCode::HttpProtocolError => "HttpProtocolError",
        ErrorCode::LoopDetected => "LoopDetected",
        ErrorCode::ConfigurationError => "ConfigurationError",
        ErrorCode::InternalError(_) => "InternalError",
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

/// Component variables, read through `fermyon:spin/variables`.
pub struct SpinVariables;

impl Variables for SpinVariables {
    fn get(&self, name: &str) -> Option<String> {
        variables::get(name).ok()
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

/// Reads the incoming request, refusing bodies over `limit` bytes (413) without keeping them.
pub async fn read_request(request: IncomingRequest, limit: usize) -> Result<Request, Response> {
    let bad = |m: &str| web::error(StatusCode::BAD_REQUEST, "bad_request", m);
    let method = match request.method() {
        Method::Get => leasegate::Method::GET,
        Method::Head => leasegate::Method::HEAD,
        Method::Post => leasegate::Method::POST,
        Method::Put => leasegate::Method::PUT,
        Method::Delete => leasegate::Method::DELETE,
        Method::Connect => leasegate::Method::CONNECT,
        Method::Options => leasegate::Method::OPTIONS,
        Method::Trace => leasegate::Method::TRACE,
        Method::Patch => leasegate::Method::PATCH,
        Method::Other(other) => leasegate::Method::from_bytes(other.as_bytes())
            .map_err(|_| bad("the request line or headers are not valid"))?,
    };
    let mut parsed = Request::new(
        method,
        request.path_with_query().unwrap_or_else(|| "/".into()),
    );
    // A value that is not UTF-8 is left out, as if not sent: no handler reads such a value.
    // `spin-*` headers are left out too: Spin passes a client's own `spin-path-info` (and the
    // like) before the ones it adds, so no handler may trust them; handlers read the path.
    // The headers cross from the host once (each `headers()` is a call and a copy).
    let mut declared = None;
    for (name, value) in request.headers().entries() {
        if name.to_ascii_lowercase().starts_with("spin-") {
            continue;
        }
        let Ok(value) = String::from_utf8(value) else {
            continue;
        };
        if declared.is_none() && name.eq_ignore_ascii_case("content-length") {
            declared = Some(value.trim().parse::<u64>().ok());
        }
        parsed.headers_mut().append(&name, value);
    }
    let declared = declared.flatten();
    if declared.is_some_and(|n| n > DRAIN_LIMIT) {
        return Err(web::too_large(limit));
    }
    let unreadable = || bad("the request body could not be read");
    let mut stream = std::pin::pin!(request.into_body_stream());
    let mut body = Vec::new();
    let mut seen: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| unreadable())?;
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
    Ok(parsed.with_body(body))
}

/// Sends `response` the way that keeps it to one TCP write: the body is written and finished
/// *before* the response is set, with a `Content-Length`. (spin-sdk's `#[http_component]`,
/// given a whole response, sets it first and writes the body after; Spin then sends head and
/// body as two segments, and on a keep-alive connection without `TCP_NODELAY` the second waits
/// for the client's delayed ACK, about 40 ms.) A body larger than the host takes before the response is set is
/// written after it, as a stream.
pub fn respond(out: ResponseOutparam, response: Response) {
    let status = response.status();
    let mut entries = field_list(response.headers(), "content-length");
    let body = response.into_body();
    let bodiless = status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    if !bodiless {
        entries.push(("content-length".into(), body.len().to_string().into_bytes()));
    }
    let Ok(headers) = Fields::from_list(&entries) else {
        // Only a header Spin forbids gets here; the handlers set none.
        return respond(
            out,
            web::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the answer could not be sent",
            ),
        );
    };
    let outgoing = OutgoingResponse::new(headers);
    let _ = outgoing.set_status_code(status.as_u16());
    let Ok(outgoing_body) = outgoing.body() else {
        return;
    };
    let Ok(stream) = outgoing_body.write() else {
        return;
    };
    let body = if bodiless { &[][..] } else { &body[..] };
    // What the host takes now, without waiting (its buffer holds one chunk of up to 1 MiB).
    let mut written = 0;
    while written < body.len() {
        match stream.check_write() {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let end = body
                    .len()
                    .min(written.saturating_add(usize::try_from(n).unwrap_or(usize::MAX)));
                if stream.write(&body[written..end]).is_err() {
                    break;
                }
                written = end;
            }
        }
    }
    if written == body.len() {
        drop(stream);
        let _ = OutgoingBody::finish(outgoing_body, None);
        out.set(outgoing);
        return;
    }
    out.set(outgoing);
    for chunk in body[written..].chunks(4096) {
        if stream.blocking_write_and_flush(chunk).is_err() {
            return;
        }
    }
    drop(stream);
    let _ = OutgoingBody::finish(outgoing_body, None);
}

/// Spin's key-value store `default`, opened at the first use; a store that cannot be opened
/// fails every operation (the callers then ask storage).
#[derive(Default)]
pub struct SpinCache {
    store: std::cell::OnceCell<Option<key_value::Store>>,
}

impl SpinCache {
    fn store(&self) -> Result<&key_value::Store, crate::cache::Unavailable> {
        self.store
            .get_or_init(|| key_value::Store::open("default").ok())
            .as_ref()
            .ok_or(crate::cache::Unavailable)
    }
}

impl crate::cache::Cache for SpinCache {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, crate::cache::Unavailable> {
        self.store()?
            .get(key)
            .map_err(|_| crate::cache::Unavailable)
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<(), crate::cache::Unavailable> {
        self.store()?
            .set(key, value)
            .map_err(|_| crate::cache::Unavailable)
    }
    fn delete(&self, key: &str) -> Result<(), crate::cache::Unavailable> {
        self.store()?
            .delete(key)
            .map_err(|_| crate::cache::Unavailable)
    }
}

/// What a component's handler runs with in Spin: the Spin transport, variables and
/// key-value store.
pub struct SpinEnv {
    variables: SpinVariables,
    cache: SpinCache,
}

/// Makes the Spin transport for a timeout; response bodies are capped at
/// [`MAX_RESPONSE_BODY`].
fn spin_transport(timeout: Duration) -> SpinTransport {
    SpinTransport {
        timeout,
        max_body: MAX_RESPONSE_BODY,
    }
}

impl SpinEnv {
    /// The Spin environment (the handler reads its settings, `storage_timeout_ms` included,
    /// once, after authenticating the caller).
    pub fn new() -> Self {
        SpinEnv {
            variables: SpinVariables,
            cache: SpinCache::default(),
        }
    }

    /// The handler context, dated now.
    pub fn context(&self) -> Context<'_, SpinTransport> {
        Context {
            connect: &spin_transport,
            variables: &self.variables,
            now: SystemTime::now(),
            new_lease_id: &random_lease_id,
            sleep: &|d| Box::pin(Sleep::new(d)),
            cache: &self.cache,
            log_decisions: true,
        }
    }
}

impl Default for SpinEnv {
    fn default() -> Self {
        Self::new()
    }
}

/// Serves one request of a component's `#[spin_sdk::http_component]` entry point: reads the
/// request with a body cap of `limit` bytes (413 beyond, see [`read_request`]), calls
/// `handler(&Context, leasegate::Request) -> leasegate::Response` with the Spin environment and
/// sends the answer with [`respond`] (body before head, one write).
///
/// ```ignore
/// #[cfg(target_arch = "wasm32")]
/// #[spin_sdk::http_component]
/// async fn handle_request(
///     request: spin_sdk::http::IncomingRequest,
///     out: spin_sdk::http::ResponseOutparam,
/// ) {
///     leasegate_spin::spin::serve(request, out, MAX_BODY_BYTES, handle).await
/// }
/// ```
pub async fn serve(
    request: IncomingRequest,
    out: ResponseOutparam,
    limit: usize,
    handler: impl AsyncFnOnce(&Context<'_, SpinTransport>, Request) -> Response,
) {
    let env = SpinEnv::new();
    let response = match read_request(request, limit).await {
        Ok(request) => handler(&env.context(), request).await,
        Err(response) => response,
    };
    respond(out, response);
}

/// The Spin entry points of a timer function `$function` (a type implementing
/// [`crate::timer::TimerFunction`]): `#[spin_sdk::http_component]`, serving its routes and the
/// Azure Functions channel through [`crate::timer::handle_http`] with requests of at most
/// `$max_body` bytes, and the cron trigger's export ([`cron_export!`](crate::cron_export)) calling
/// [`crate::timer::handle_cron`]. Both are compiled for `wasm32` only. The crate needs
/// `spin-sdk` as a dependency (for the attribute).
///
/// ```ignore
/// leasegate_spin::timer_export!(crate::Leader, MAX_BODY_BYTES);
/// ```
#[macro_export]
macro_rules! timer_export {
    ($function:path, $max_body:expr) => {
        #[cfg(target_arch = "wasm32")]
        #[::spin_sdk::http_component]
        async fn handle_request(
            request: ::spin_sdk::http::IncomingRequest,
            out: ::spin_sdk::http::ResponseOutparam,
        ) {
            $crate::spin::serve(
                request,
                out,
                $max_body,
                $crate::timer::handle_http::<$function, _>,
            )
            .await
        }
        #[cfg(target_arch = "wasm32")]
        $crate::cron_export!($crate::timer::handle_cron::<$function, _>);
    };
}

/// Exports `handle-cron-event` of Spin's cron trigger (`fermyon:spin-cron@2.0.0`; its guest SDK
/// is not on crates.io, so the binding is generated from the WIT below with the wit-bindgen
/// spin-sdk re-exports), calling `$handler(&Context, timestamp) -> Result<(), String>` on Spin's
/// executor. Use it in a component crate that depends on this crate and on spin-sdk, next to its
/// `#[spin_sdk::http_component]` entry point (see [`serve`]). The plugin's later WIT
/// (`spin:cron@3.0.0`, trigger-cron 0.6) still calls this export.
#[macro_export]
macro_rules! cron_export {
    ($handler:path) => {
        /// The cron trigger's guest interface.
        mod cron {
            $crate::__private::wit_bindgen::generate!({
                inline: "
                    package fermyon:spin-cron@2.0.0;
                    interface cron-types {
                        record metadata { timestamp: u64 }
                        variant error { other(string) }
                    }
                    world spin-cron {
                        use cron-types.{metadata, error};
                        export handle-cron-event: func(metadata: metadata) -> result<_, error>;
                    }
                ",
                world: "spin-cron",
                runtime_path: "::leasegate_spin::__private::wit_bindgen::rt",
            });

            struct Cron;

            impl Guest for Cron {
                fn handle_cron_event(metadata: Metadata) -> Result<(), Error> {
                    $crate::__private::spin_executor::run(async move {
                        $handler(
                            &$crate::spin::SpinEnv::new().context(),
                            metadata.timestamp,
                        )
                        .await
                        .map_err(Error::Other)
                    })
                }
            }

            export!(Cron);
        }
    };
}
