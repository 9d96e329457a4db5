//! What the lease algorithms need from the outside world: "send this request, give me the
//! response". Implementations live outside the core (a native one in `leasegate-cli`, a
//! Spin one beside the functions).

use std::cell::Cell;
use std::future::Future;
use std::time::SystemTime;

use crate::message::{Request, Response};
use crate::token::{AccessToken, TokenSource};
use crate::{Error, TransportError};

/// Exchanges one HTTP request for its response. Any status is a response; only a failure to
/// exchange (connection refused, timeout, broken stream) is an error.
pub trait Transport {
    /// Sends `request` and returns the whole response.
    fn send(&self, request: Request) -> impl Future<Output = Result<Response, TransportError>>;

    /// The time to date a request with (`x-ms-date`), asked right before each request is
    /// signed and sent: a transport that reads a clock answers it, so every request of a long
    /// call carries its own send time (storage refuses SharedKey requests dated more than 15
    /// minutes off). `None` (the default): the `now` the caller passed dates every request.
    fn now(&self) -> Option<SystemTime> {
        None
    }

    /// Sends `request` for its status and headers only: the caller does not use the answer's
    /// body (a webhook's, say), so an implementation may read only a little of it and drop
    /// the rest; the body of the response it returns may then be empty. The default reads it
    /// whole, as [`Transport::send`] does.
    fn send_for_status(
        &self,
        request: Request,
    ) -> impl Future<Output = Result<Response, TransportError>> {
        self.send(request)
    }

    /// The bearer token for a storage request of an account whose credential is
    /// [`Credential::Bearer`](crate::Credential::Bearer), asked right before each such request
    /// is sent. `refresh`: storage refused the token this transport gave last (expired,
    /// revoked): give a new one from the source, not a kept one.
    ///
    /// The default fetches a token from `source` every time (one token request per storage
    /// request; a fixed token as it is). A transport that keeps tokens between requests and
    /// invocations, refreshing them ahead of their expiry, overrides it: the Spin toolkit
    /// keeps them in the app's key-value store.
    fn access_token(
        &self,
        source: &TokenSource,
        refresh: bool,
    ) -> impl Future<Output = Result<AccessToken, Error>> {
        let _ = refresh;
        async move {
            let now = self.now().unwrap_or(std::time::UNIX_EPOCH);
            Ok(crate::token::fetch(self, source, now).await?.value)
        }
    }
}

impl<T: Transport + ?Sized> Transport for &T {
    fn send(&self, request: Request) -> impl Future<Output = Result<Response, TransportError>> {
        (**self).send(request)
    }

    fn now(&self) -> Option<SystemTime> {
        (**self).now()
    }

    fn send_for_status(
        &self,
        request: Request,
    ) -> impl Future<Output = Result<Response, TransportError>> {
        (**self).send_for_status(request)
    }

    fn access_token(
        &self,
        source: &TokenSource,
        refresh: bool,
    ) -> impl Future<Output = Result<AccessToken, Error>> {
        (**self).access_token(source, refresh)
    }
}

/// A transport that counts the requests it passes on: round trips per decision, for logs and
/// tests. Not `Sync`: make one per decision.
#[derive(Debug)]
pub struct Counting<T> {
    inner: T,
    sent: Cell<u32>,
}

impl<T> Counting<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        Counting {
            inner,
            sent: Cell::new(0),
        }
    }

    /// Requests sent so far.
    pub fn sent(&self) -> u32 {
        self.sent.get()
    }
}

impl<T: Transport> Transport for Counting<T> {
    async fn send(&self, request: Request) -> Result<Response, TransportError> {
        self.sent.set(self.sent.get() + 1);
        self.inner.send(request).await
    }

    fn now(&self) -> Option<SystemTime> {
        self.inner.now()
    }

    async fn send_for_status(&self, request: Request) -> Result<Response, TransportError> {
        self.sent.set(self.sent.get() + 1);
        self.inner.send_for_status(request).await
    }

    async fn access_token(
        &self,
        source: &TokenSource,
        refresh: bool,
    ) -> Result<AccessToken, Error> {
        self.inner.access_token(source, refresh).await
    }
}
