//! The scripted storage every test talks to: answers on cue, a record of what it was sent,
//! and (where a test needs one) a clock of its own; the answers and lock names the tests share.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use leasegate::lease::{Acquire, Acquiring, IdOrigin, Locks, Term};
use leasegate::{
    Account, ContainerName, Error, LeaseDuration, LeaseId, LockName, Method, Request, Response,
    StatusCode, Transport, TransportError, TransportErrorKind,
};

/// The storage server's clock in every scripted answer.
pub(crate) const SERVER_SECS: u64 = 1_795_096_800;

pub(crate) fn server_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(SERVER_SECS)
}

/// One scripted answer.
pub(crate) type Answer = Box<dyn Fn(&Request) -> Result<Response, TransportError>>;

/// What the transport was sent.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub(crate) method: Method,
    pub(crate) uri: String,
    /// `x-ms-date`.
    pub(crate) date: String,
    /// The time of the transport's clock when it was sent.
    pub(crate) sent_at: Option<SystemTime>,
    pub(crate) lease_action: Option<String>,
    pub(crate) holder: Option<String>,
    /// `x-ms-meta-leasegate_token`.
    pub(crate) token: Option<String>,
    /// `x-ms-meta-leasegate_expires`.
    pub(crate) expires: Option<String>,
    /// The claim's metadata as sent (`leasegate_*`), for a scripted read of the blob it made.
    pub(crate) claim: Vec<(&'static str, String)>,
    /// `If-Match`.
    pub(crate) if_match: Option<String>,
}

impl Sent {
    pub(crate) fn is_metadata_write(&self) -> bool {
        self.method == Method::PUT && self.uri.contains("comp=metadata")
    }
}

/// Answers each request with the next answer of its script; its clock (if any) moves by
/// `step` after every request.
pub(crate) struct Scripted {
    answers: RefCell<VecDeque<Answer>>,
    sent: RefCell<Vec<Sent>>,
    clock: Cell<Option<SystemTime>>,
    step: Duration,
}

impl Scripted {
    pub(crate) fn new(answers: Vec<Answer>) -> Self {
        Scripted {
            answers: RefCell::new(answers.into()),
            sent: RefCell::new(Vec::new()),
            clock: Cell::new(None),
            step: Duration::ZERO,
        }
    }

    pub(crate) fn with_clock(mut self, start: SystemTime, step: Duration) -> Self {
        self.clock.set(Some(start));
        self.step = step;
        self
    }

    pub(crate) fn sent(&self) -> Vec<Sent> {
        self.sent.borrow().clone()
    }
}

impl Transport for Scripted {
    async fn send(&self, request: Request) -> Result<Response, TransportError> {
        let h = request.headers();
        self.sent.borrow_mut().push(Sent {
            method: request.method().clone(),
            uri: request.uri().to_string(),
            date: h.get("x-ms-date").unwrap_or("").to_string(),
            sent_at: self.clock.get(),
            lease_action: h.get("x-ms-lease-action").map(str::to_string),
            holder: h.get("x-ms-meta-leasegate_holder").map(str::to_string),
            token: h.get("x-ms-meta-leasegate_token").map(str::to_string),
            expires: h.get("x-ms-meta-leasegate_expires").map(str::to_string),
            claim: [
                "leasegate_holder",
                "leasegate_term",
                "leasegate_since",
                "leasegate_expires",
                "leasegate_token",
                "leasegate_label",
                "leasegate_unconfirmed",
            ]
            .into_iter()
            .filter_map(|k| Some((k, h.get(&format!("x-ms-meta-{k}"))?.to_string())))
            .collect(),
            if_match: h.get("if-match").map(str::to_string),
        });
        if let Some(t) = self.clock.get() {
            self.clock.set(Some(t + self.step));
        }
        let answer = self
            .answers
            .borrow_mut()
            .pop_front()
            .unwrap_or_else(|| panic!("no scripted answer left for {request:?}"));
        answer(&request)
    }

    fn now(&self) -> Option<SystemTime> {
        self.clock.get()
    }
}

pub(crate) fn answer(status: u16) -> Response {
    Response::new(StatusCode::from_u16(status).unwrap())
        .with_header("date", httpdate::fmt_http_date(server_now()))
        .with_header("x-ms-request-id", "0f6d1b0e-501e-0035-5a1c-1c2b3a000000")
}

pub(crate) fn reply(response: Response) -> Answer {
    Box::new(move |_| Ok(response.clone()))
}

/// A HEAD answer for the lock blob: its lease state, ETag and metadata.
pub(crate) fn head(lease_state: &str, etag: &str, metadata: &[(&str, String)]) -> Answer {
    let mut r = answer(200)
        .with_header("etag", format!("\"{etag}\""))
        .with_header("x-ms-lease-state", lease_state)
        .with_header("x-ms-blob-type", "PageBlob")
        .with_header("content-length", "0");
    for (k, v) in metadata {
        r = r.with_header(&format!("x-ms-meta-{k}"), v.as_str());
    }
    reply(r)
}

pub(crate) fn missing() -> Answer {
    reply(answer(404).with_header("x-ms-error-code", "BlobNotFound"))
}

/// A granted lease: 201 with the proposed id.
pub(crate) fn granted() -> Answer {
    Box::new(|request| {
        let id = request
            .headers()
            .get("x-ms-proposed-lease-id")
            .expect("an acquire proposes its id")
            .to_string();
        Ok(answer(201)
            .with_header("x-ms-lease-id", id)
            .with_header("etag", "\"same\""))
    })
}

/// A granted lease, dated `later` seconds after the scripted server clock.
pub(crate) fn granted_later(later: u64) -> Answer {
    Box::new(move |request| {
        let id = request
            .headers()
            .get("x-ms-proposed-lease-id")
            .expect("an acquire proposes its id")
            .to_string();
        Ok(Response::new(StatusCode::CREATED)
            .with_header(
                "date",
                httpdate::fmt_http_date(server_now() + Duration::from_secs(later)),
            )
            .with_header("x-ms-lease-id", id)
            .with_header("etag", "\"same\""))
    })
}

/// A lease refused: another holder's lease is there.
pub(crate) fn lease_present() -> Answer {
    reply(answer(409).with_header("x-ms-error-code", "LeaseAlreadyPresent"))
}

pub(crate) fn written(etag: &str) -> Answer {
    reply(answer(200).with_header("etag", format!("\"{etag}\"")))
}

pub(crate) fn busy_503() -> Answer {
    reply(answer(503).with_header("x-ms-error-code", "ServerBusy"))
}

pub(crate) fn lost_answer() -> Answer {
    Box::new(|_| {
        Err(TransportError::new(
            TransportErrorKind::Other,
            "the connection was reset",
        ))
    })
}

/// A native claim of `id`'s: 30 s, token 7, expiring at `expires` (server seconds).
pub(crate) fn native_claim(id: LeaseId, expires: u64) -> Vec<(&'static str, String)> {
    vec![
        ("leasegate_holder", id.to_string()),
        ("leasegate_term", "30".into()),
        ("leasegate_since", (SERVER_SECS - 100).to_string()),
        ("leasegate_expires", expires.to_string()),
        ("leasegate_token", "7".into()),
        ("leasegate_label", String::new()),
    ]
}

/// A live record of `id`'s expiring at `expires` (server seconds), with the first token of
/// the server's second.
pub(crate) fn record_of(id: LeaseId, expires: u64) -> Vec<(&'static str, String)> {
    vec![
        ("leasegate_holder", id.to_string()),
        ("leasegate_term", "record".into()),
        ("leasegate_since", SERVER_SECS.to_string()),
        ("leasegate_expires", expires.to_string()),
        ("leasegate_token", ((SERVER_SECS + 1) << 16).to_string()),
        ("leasegate_label", String::new()),
    ]
}

pub(crate) fn precondition_failed() -> Answer {
    reply(answer(412).with_header("x-ms-error-code", "ConditionNotMet"))
}

pub(crate) fn created(etag: &str) -> Answer {
    reply(answer(201).with_header("etag", format!("\"{etag}\"")))
}

pub(crate) fn released_record(s: &Sent) -> bool {
    s.is_metadata_write() && s.holder.as_deref() == Some("")
}

pub(crate) fn lease_released(s: &Sent) -> bool {
    s.lease_action.as_deref() == Some("release")
}

pub(crate) fn locks(transport: &Scripted) -> Locks<&Scripted> {
    Locks::new(
        transport,
        Account::from_connection_string("UseDevelopmentStorage=true").unwrap(),
        ContainerName::try_new("leasegate").unwrap(),
    )
}

pub(crate) fn id(n: u8) -> LeaseId {
    LeaseId::from_random_bytes([n; 16])
}

pub(crate) fn name() -> LockName {
    LockName::try_new("jobs/nightly").unwrap()
}

pub(crate) fn native30() -> Term {
    Term::Native(LeaseDuration::Seconds(30))
}

/// An acquire with an id the call generated and no label (as device-alerts' gates).
pub(crate) fn first_use(t: &Scripted, term: Term, id: LeaseId) -> Result<Acquire, Error> {
    pollster::block_on(locks(t).acquire(
        &name(),
        Acquiring::new(term, id).origin(IdOrigin::Fresh),
        server_now(),
    ))
}
