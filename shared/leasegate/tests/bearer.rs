//! Entra ID bearer tokens in the core, against a scripted transport: the header on every
//! request, the copy source's authorization, a refused token asked anew once (and only once),
//! a missing role not retried, a token that cannot be had sends nothing.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use leasegate::lease::Locks;
use leasegate::ops::{build, CopyBlob, Lease, LeaseAction, LeaseOutcome};
use leasegate::token::{ClientSecret, TokenError, TokenSource};
use leasegate::{
    AccessToken, Account, BlobEndpoint, BlobName, ContainerName, Credential, Error, ErrorClass,
    LeaseDuration, LeaseId, Request, Response, StatusCode, Transport, TransportError,
};

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_096_800)
}

fn account(source: TokenSource) -> Account {
    Account::new(
        "acct",
        BlobEndpoint::try_new("https://acct.blob.core.windows.net").unwrap(),
        Credential::Bearer(source),
    )
}

fn client_secret() -> TokenSource {
    TokenSource::ClientSecret(
        ClientSecret::new(
            "https://login.example",
            "tenant-1",
            "client-1",
            "the-secret",
        )
        .unwrap(),
    )
}

/// Answers storage requests from a script and hands out tokens `t1`, `t2`, ... (or fails).
#[derive(Default)]
struct Scripted {
    answers: RefCell<VecDeque<Response>>,
    sent: RefCell<Vec<Request>>,
    asked: RefCell<Vec<bool>>,
    token_fails: bool,
}

impl Scripted {
    fn answering(answers: Vec<Response>) -> Self {
        Scripted {
            answers: RefCell::new(answers.into()),
            ..Scripted::default()
        }
    }
    fn auth_headers(&self) -> Vec<String> {
        self.sent
            .borrow()
            .iter()
            .map(|r| r.headers().get("authorization").unwrap_or("").to_string())
            .collect()
    }
}

impl Transport for Scripted {
    async fn send(&self, request: Request) -> Result<Response, TransportError> {
        self.sent.borrow_mut().push(request);
        Ok(self
            .answers
            .borrow_mut()
            .pop_front()
            .expect("a scripted answer"))
    }

    async fn access_token(&self, _: &TokenSource, refresh: bool) -> Result<AccessToken, Error> {
        self.asked.borrow_mut().push(refresh);
        if self.token_fails {
            return Err(Error::Token(TokenError {
                message: "the token endpoint could not be reached".into(),
                retryable: true,
            }));
        }
        let n = self.asked.borrow().len();
        Ok(AccessToken::try_new(&format!("t{n}")).unwrap())
    }
}

fn acquire_op() -> Lease {
    Lease::new(
        ContainerName::try_new("leasegate").unwrap(),
        BlobName::try_new("locks/a").unwrap(),
        LeaseAction::Acquire {
            duration: LeaseDuration::try_from_secs(15).unwrap(),
            proposed: LeaseId::from_random_bytes([1; 16]),
        },
    )
}

fn acquired() -> Response {
    Response::new(StatusCode::CREATED).with_header(
        "x-ms-lease-id",
        LeaseId::from_random_bytes([1; 16]).to_string(),
    )
}

fn refused(status: StatusCode, code: &str) -> Response {
    Response::new(status).with_header("x-ms-error-code", code)
}

fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    pollster::block_on(f)
}

#[test]
fn every_request_carries_the_transports_token() {
    let transport = Scripted::answering(vec![acquired()]);
    let locks = Locks::new(
        &transport,
        account(client_secret()),
        ContainerName::try_new("leasegate").unwrap(),
    );
    let (outcome, _) = run(locks.client().execute(&acquire_op(), now())).unwrap();
    assert!(matches!(outcome, LeaseOutcome::Held { .. }), "{outcome:?}");
    assert_eq!(transport.auth_headers(), ["Bearer t1"]);
    assert_eq!(*transport.asked.borrow(), [false]);
    let sent = transport.sent.borrow();
    assert!(sent[0].headers().get("x-ms-version").is_some());
    assert!(sent[0].headers().get("x-ms-date").is_some());
    assert!(!sent[0].uri().contains("sig="));
}

#[test]
fn a_refused_token_is_asked_anew_once() {
    for first in [
        refused(StatusCode::UNAUTHORIZED, "InvalidAuthenticationInfo"),
        refused(StatusCode::FORBIDDEN, "AuthenticationFailed"),
    ] {
        let transport = Scripted::answering(vec![first, acquired()]);
        let locks = Locks::new(
            &transport,
            account(client_secret()),
            ContainerName::try_new("leasegate").unwrap(),
        );
        let (outcome, _) = run(locks.client().execute(&acquire_op(), now())).unwrap();
        assert!(matches!(outcome, LeaseOutcome::Held { .. }), "{outcome:?}");
        assert_eq!(transport.auth_headers(), ["Bearer t1", "Bearer t2"]);
        assert_eq!(*transport.asked.borrow(), [false, true]);
    }

    // Refused again: the answer is the caller's, after two requests, not a loop.
    let transport = Scripted::answering(vec![
        refused(StatusCode::UNAUTHORIZED, "InvalidAuthenticationInfo"),
        refused(StatusCode::UNAUTHORIZED, "InvalidAuthenticationInfo"),
    ]);
    let locks = Locks::new(
        &transport,
        account(client_secret()),
        ContainerName::try_new("leasegate").unwrap(),
    );
    let err = run(locks.client().execute(&acquire_op(), now())).unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::Auth), "{err}");
    assert!(!err.outcome_unknown());
    assert_eq!(transport.sent.borrow().len(), 2);
}

#[test]
fn a_missing_role_or_shared_key_off_is_not_retried() {
    for code in [
        "AuthorizationPermissionMismatch",
        "KeyBasedAuthenticationNotPermitted",
        "AuthorizationFailure",
    ] {
        let transport = Scripted::answering(vec![refused(StatusCode::FORBIDDEN, code)]);
        let locks = Locks::new(
            &transport,
            account(client_secret()),
            ContainerName::try_new("leasegate").unwrap(),
        );
        let err = run(locks.client().execute(&acquire_op(), now())).unwrap_err();
        assert_eq!(err.class(), Some(ErrorClass::Auth), "{code}: {err}");
        assert_eq!(transport.sent.borrow().len(), 1, "{code}");
        assert!(err.to_string().contains(code), "{err}");
    }
}

#[test]
fn no_token_sends_nothing() {
    let transport = Scripted {
        token_fails: true,
        ..Scripted::default()
    };
    let locks = Locks::new(
        &transport,
        account(client_secret()),
        ContainerName::try_new("leasegate").unwrap(),
    );
    let err = run(locks.client().execute(&acquire_op(), now())).unwrap_err();
    assert!(matches!(err, Error::Token(ref e) if e.retryable), "{err:?}");
    assert!(!err.outcome_unknown());
    assert!(transport.sent.borrow().is_empty());
    assert_eq!(
        err.to_string(),
        "no access token: the token endpoint could not be reached"
    );
}

#[test]
fn a_copy_authorizes_its_source_with_the_token() {
    let token = AccessToken::try_new("eyJ.fixed.token").unwrap();
    let account = account(TokenSource::Fixed(token));
    let copy = CopyBlob::new(
        ContainerName::try_new("data").unwrap(),
        BlobName::try_new("a.txt").unwrap(),
        ContainerName::try_new("dead").unwrap(),
        BlobName::try_new("a.txt").unwrap(),
    );
    let request = build(&copy, &account, now()).unwrap();
    let h = request.headers();
    assert_eq!(h.get("authorization"), Some("Bearer eyJ.fixed.token"));
    assert_eq!(
        h.get("x-ms-copy-source-authorization"),
        Some("Bearer eyJ.fixed.token")
    );
    assert_eq!(
        h.get("x-ms-copy-source"),
        Some("https://acct.blob.core.windows.net/data/a.txt")
    );

    // Not on other requests.
    let lease = build(&acquire_op(), &account, now()).unwrap();
    assert_eq!(lease.headers().get("x-ms-copy-source-authorization"), None);

    // A fetched source needs the token in hand.
    let err = build(&acquire_op(), &super_account(), now()).unwrap_err();
    assert!(err.to_string().contains("authorize_with"), "{err}");
    assert!(!format!("{:?}", super_account()).contains("the-secret"));
}

fn super_account() -> Account {
    account(client_secret())
}

/// The default `access_token` fetches through the transport's own `send`.
#[test]
fn the_default_fetches_a_token_every_time() {
    struct Plain(RefCell<Vec<String>>);
    impl Transport for Plain {
        async fn send(&self, request: Request) -> Result<Response, TransportError> {
            self.0.borrow_mut().push(request.uri().to_string());
            if request.uri().contains("/oauth2/") {
                return Ok(Response::new(StatusCode::OK).with_body(
                    br#"{"token_type":"Bearer","expires_in":3599,"access_token":"eyJ.from.endpoint"}"#.to_vec(),
                ));
            }
            assert_eq!(
                request.headers().get("authorization"),
                Some("Bearer eyJ.from.endpoint")
            );
            Ok(acquired())
        }
    }
    let transport = Plain(RefCell::new(Vec::new()));
    let locks = Locks::new(
        &transport,
        account(client_secret()),
        ContainerName::try_new("leasegate").unwrap(),
    );
    run(locks.client().execute(&acquire_op(), now())).unwrap();
    run(locks.client().execute(&acquire_op(), now())).unwrap();
    let uris = transport.0.borrow();
    assert_eq!(uris.len(), 4, "{uris:?}");
    assert_eq!(uris[0], "https://login.example/tenant-1/oauth2/v2.0/token");
}

#[test]
fn a_refused_fixed_token_is_not_sent_again() {
    // The source of a fixed token has no other: the same request again would be refused too.
    let transport = Scripted::answering(vec![refused(
        StatusCode::UNAUTHORIZED,
        "InvalidAuthenticationInfo",
    )]);
    let fixed = TokenSource::Fixed(AccessToken::try_new("eyJ.fixed.token").unwrap());
    let locks = Locks::new(
        &transport,
        account(fixed),
        ContainerName::try_new("leasegate").unwrap(),
    );
    let err = run(locks.client().execute(&acquire_op(), now())).unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::Auth), "{err}");
    assert_eq!(transport.sent.borrow().len(), 1);
    assert_eq!(*transport.asked.borrow(), [false]);
}
