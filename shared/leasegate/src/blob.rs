//! A client of one container's blobs: it signs each request with the account's credential
//! (SharedKey, a SAS or an Entra ID bearer token), dates it, sends it through a [`Transport`]
//! and parses the answer of an [`Operation`]. The lease rules ([`crate::lease::Locks`]) keep
//! their lock blobs through one; a function uses one directly for plain blob work (a
//! reservation, a log, a state blob). Like the rest of the crate it does no IO of its own.
//!
//! ```
//! use std::time::SystemTime;
//! use leasegate::BlobClient;
//! use leasegate::ops::GetProperties;
//! use leasegate::{Account, BlobName, ContainerName, Transport};
//! # struct NoNetwork;
//! # impl Transport for NoNetwork {
//! #     async fn send(&self, _: leasegate::Request) -> Result<leasegate::Response, leasegate::TransportError> {
//! #         Ok(leasegate::Response::new(leasegate::StatusCode::NOT_FOUND))
//! #     }
//! # }
//! let container = ContainerName::try_new("leasegate").unwrap();
//! let account = Account::development("http://127.0.0.1:10000/devstoreaccount1").unwrap();
//! let blobs = BlobClient::new(NoNetwork, account, container.clone());
//! let head = GetProperties { container, blob: BlobName::try_new("jobs/x/log.json").unwrap() };
//! let (properties, _date) = leasegate_block_on(blobs.execute(&head, SystemTime::now())).unwrap();
//! assert!(properties.is_none()); // 404: no such blob
//! # fn leasegate_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     let mut f = std::pin::pin!(f);
//! #     let waker = std::task::Waker::noop();
//! #     loop {
//! #         if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut std::task::Context::from_waker(&waker)) { return v; }
//! #     }
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::time::SystemTime;

use crate::message::{Request, Response};
use crate::names::ContainerName;
use crate::ops::{server_date, token_refused, Operation};
use crate::signing::authorize_with;
use crate::{AccessToken, Account, Credential, Error, TokenSource, Transport};

/// Blobs of one container, reached through a [`Transport`] with an [`Account`]'s credential.
#[derive(Debug, Clone)]
pub struct BlobClient<T> {
    transport: T,
    account: Account,
    container: ContainerName,
}

impl<T: Transport> BlobClient<T> {
    /// The blobs of `container` in `account`, reached through `transport`.
    pub fn new(transport: T, account: Account, container: ContainerName) -> Self {
        BlobClient {
            transport,
            account,
            container,
        }
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The account.
    pub fn account(&self) -> &Account {
        &self.account
    }

    /// The container.
    pub fn container(&self) -> &ContainerName {
        &self.container
    }

    /// One round trip: builds, sends and parses `op`; also returns the server's `Date`.
    pub async fn execute<O: Operation>(
        &self,
        op: &O,
        now: SystemTime,
    ) -> Result<(O::Output, Option<SystemTime>), Error> {
        let response = self.round_trip(op.request(&self.account), now).await?;
        Ok((op.parse(&response)?, server_date(&response)))
    }

    /// What [`BlobClient::execute`] does whatever the operation: signs and sends. Kept apart (and
    /// behind a pointer) so the sending state machine exists once in a component rather than
    /// once per operation type.
    ///
    /// The request is dated (`x-ms-date`) when it is signed, right before it is sent: by the
    /// transport's clock when it has one ([`Transport::now`]), else with `now`.
    fn round_trip(
        &self,
        request: Result<Request, Error>,
        now: SystemTime,
    ) -> Pin<Box<dyn Future<Output = Result<Response, Error>> + '_>> {
        Box::pin(send_authorized(
            &self.transport,
            &self.account,
            request,
            now,
            authorize_with,
        ))
    }
}

/// Signs `request` with `authorize` (the Blob or the Table service's rules) and sends it: dated
/// by the transport's clock when it has one ([`Transport::now`]), else with `now`. With a
/// bearer credential, a token storage refuses (expired, revoked) did nothing: the request goes
/// once more with a new one (a fixed token has none); a refusal of the new one is the
/// caller's answer.
pub(crate) async fn send_authorized<T: Transport>(
    transport: &T,
    account: &Account,
    request: Result<Request, Error>,
    now: SystemTime,
    authorize: fn(&mut Request, &Account, SystemTime, Option<&AccessToken>) -> Result<(), Error>,
) -> Result<Response, Error> {
    let mut request = request?;
    let date = transport.now().unwrap_or(now);
    let Credential::Bearer(source) = account.credential() else {
        authorize(&mut request, account, date, None)?;
        return Ok(transport.send(request).await?);
    };
    let fixed = matches!(source, TokenSource::Fixed(_));
    let mut refresh = false;
    loop {
        let token = transport.access_token(source, refresh).await?;
        let mut attempt = request.clone();
        authorize(&mut attempt, account, date, Some(&token))?;
        let response = transport.send(attempt).await?;
        if refresh || fixed || !token_refused(&response) {
            return Ok(response);
        }
        refresh = true;
    }
}
