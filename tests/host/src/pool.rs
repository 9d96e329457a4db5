//! Outbound connections pooled per destination, as Spin does by default (its runtime config's
//! `[outbound_http] connection_pooling`, on unless set to `false`): a component's request to
//! an origin reuses an idle keep-alive connection to it when there is one. Plain `http://` only:
//! `https://` goes through wasmtime-wasi-http's default sender (a connection per request), which
//! the tests never use.
//!
//! Errors keep the meaning the default sender gives them, because the components act on it: a
//! connection that could not be made is `Connect` (nothing was sent; for a refused connection
//! the guest sees `connection-refused`), anything after that is a protocol error or a timeout
//! (the request may have arrived).

use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody};

/// How long an idle connection is kept. Below Node's default keep-alive timeout (5 s, Azurite's),
/// so the pool lets go of a connection before the server does.
const IDLE: Duration = Duration::from_secs(2);

/// The pool, one per host.
pub struct Pool(Client<HttpConnector, WasiBody>);

impl Default for Pool {
    fn default() -> Pool {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        Pool(
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(IDLE)
                .pool_timer(TokioTimer::new())
                .build(connector),
        )
    }
}

impl Pool {
    /// Sends `request` on a pooled connection.
    pub async fn send(
        &self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> Result<http::Response<WasiBody>, Error> {
        let first_byte = options
            .and_then(|o| o.first_byte_timeout)
            .unwrap_or(Duration::from_secs(600));
        let response = tokio::time::timeout(first_byte, self.0.request(request))
            .await
            .map_err(|_| Error::ConnectionReadTimeout)?
            .map_err(classify)?;
        Ok(response.map(|body| body.map_err(Error::from).boxed_unsync()))
    }
}

/// The default sender's error for what went wrong.
fn classify(e: hyper_util::client::legacy::Error) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if e.is_connect() {
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::TimedOut {
                    return Error::ConnectionTimeout;
                }
                return Error::Connect(std::io::Error::new(io.kind(), io.to_string()));
            }
        }
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            if h.is_timeout() {
                return Error::HttpResponseTimeout;
            }
        }
        source = s.source();
    }
    if e.is_connect() {
        Error::ConnectionRefused
    } else {
        Error::HttpProtocolError
    }
}
