//! The rules of `docs/protocol.md` that need storage to answer on cue, each against scripted
//! storage answers: each request dated when it is sent; a lost or 5xx answer gives back only
//! what the call may have granted, and never a lease the caller held or an id it chose; a lock
//! blob's first create names nobody; a holder in the last second of its native lease keeps its
//! token; a claim write never lowers a token; a copy answer without a status is pending. The
//! transport answers from a script, records what it was sent, and (where a test needs one) has
//! a clock of its own.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use leasegate::lease::{Acquire, Acquiring, HeldState, IdOrigin, Locks, Release, Start, Term};
use leasegate::ops::{CopyBlob, CopyOutcome, CopyStatus};
use leasegate::{
    Account, BlobName, ContainerName, Error, LeaseDuration, LeaseId, LockName, Method, Request,
    Response, StatusCode, Transport, TransportError, TransportErrorKind,
};

/// The storage server's clock in every scripted answer.
const SERVER_SECS: u64 = 1_795_096_800;

fn server_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(SERVER_SECS)
}

/// One scripted answer.
type Answer = Box<dyn Fn(&Request) -> Result<Response, TransportError>>;

/// What the transport was sent.
#[derive(Debug, Clone)]
struct Sent {
    method: Method,
    uri: String,
    /// `x-ms-date`.
    date: String,
    /// The time of the transport's clock when it was sent.
    sent_at: Option<SystemTime>,
    lease_action: Option<String>,
    holder: Option<String>,
    /// `x-ms-meta-leasegate_token`.
    token: Option<String>,
    /// `x-ms-meta-leasegate_expires`.
    expires: Option<String>,
    /// The claim's metadata as sent (`leasegate_*`), for a scripted read of the blob it made.
    claim: Vec<(&'static str, String)>,
    /// `If-Match`.
    if_match: Option<String>,
}

impl Sent {
    fn is_metadata_write(&self) -> bool {
        self.method == Method::PUT && self.uri.contains("comp=metadata")
    }
}

/// Answers each request with the next answer of its script; its clock (if any) moves by
/// `step` after every request.
struct Scripted {
    answers: RefCell<VecDeque<Answer>>,
    sent: RefCell<Vec<Sent>>,
    clock: Cell<Option<SystemTime>>,
    step: Duration,
}

impl Scripted {
    fn new(answers: Vec<Answer>) -> Self {
        Scripted {
            answers: RefCell::new(answers.into()),
            sent: RefCell::new(Vec::new()),
            clock: Cell::new(None),
            step: Duration::ZERO,
        }
    }

    fn with_clock(mut self, start: SystemTime, step: Duration) -> Self {
        self.clock.set(Some(start));
        self.step = step;
        self
    }

    fn sent(&self) -> Vec<Sent> {
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

fn answer(status: u16) -> Response {
    Response::new(StatusCode::from_u16(status).unwrap())
        .with_header("date", httpdate::fmt_http_date(server_now()))
        .with_header("x-ms-request-id", "0f6d1b0e-501e-0035-5a1c-1c2b3a000000")
}

fn reply(response: Response) -> Answer {
    Box::new(move |_| Ok(response.clone()))
}

/// A HEAD answer for the lock blob: its lease state, ETag and metadata.
fn head(lease_state: &str, etag: &str, metadata: &[(&str, String)]) -> Answer {
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

fn missing() -> Answer {
    reply(answer(404).with_header("x-ms-error-code", "BlobNotFound"))
}

/// A granted lease: 201 with the proposed id.
fn granted() -> Answer {
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
fn granted_later(later: u64) -> Answer {
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
fn lease_present() -> Answer {
    reply(answer(409).with_header("x-ms-error-code", "LeaseAlreadyPresent"))
}

fn written(etag: &str) -> Answer {
    reply(answer(200).with_header("etag", format!("\"{etag}\"")))
}

fn busy_503() -> Answer {
    reply(answer(503).with_header("x-ms-error-code", "ServerBusy"))
}

fn lost_answer() -> Answer {
    Box::new(|_| {
        Err(TransportError::new(
            TransportErrorKind::Other,
            "the connection was reset",
        ))
    })
}

/// A native claim of `id`'s: 30 s, token 7, expiring at `expires` (server seconds).
fn native_claim(id: LeaseId, expires: u64) -> Vec<(&'static str, String)> {
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
fn record_of(id: LeaseId, expires: u64) -> Vec<(&'static str, String)> {
    vec![
        ("leasegate_holder", id.to_string()),
        ("leasegate_term", "record".into()),
        ("leasegate_since", SERVER_SECS.to_string()),
        ("leasegate_expires", expires.to_string()),
        ("leasegate_token", ((SERVER_SECS + 1) << 16).to_string()),
        ("leasegate_label", String::new()),
    ]
}

fn precondition_failed() -> Answer {
    reply(answer(412).with_header("x-ms-error-code", "ConditionNotMet"))
}

fn created(etag: &str) -> Answer {
    reply(answer(201).with_header("etag", format!("\"{etag}\"")))
}

fn released_record(s: &Sent) -> bool {
    s.is_metadata_write() && s.holder.as_deref() == Some("")
}

fn lease_released(s: &Sent) -> bool {
    s.lease_action.as_deref() == Some("release")
}

fn locks(transport: &Scripted) -> Locks<&Scripted> {
    Locks::new(
        transport,
        Account::from_connection_string("UseDevelopmentStorage=true").unwrap(),
        ContainerName::try_new("leasegate").unwrap(),
    )
}

fn id(n: u8) -> LeaseId {
    LeaseId::from_random_bytes([n; 16])
}

fn name() -> LockName {
    LockName::try_new("jobs/nightly").unwrap()
}

fn native30() -> Term {
    Term::Native(LeaseDuration::Seconds(30))
}

/// Issue 21.1: every request is dated when it is sent, by the transport's clock, not with the
/// time the call began (storage refuses SharedKey requests dated more than 15 minutes off).
#[test]
fn each_request_is_dated_when_it_is_sent() {
    let started = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
    let step = Duration::from_secs(20 * 60);
    // A free lock blob: HEAD, acquire, claim.
    let t = Scripted::new(vec![head("available", "a", &[]), granted(), written("b")])
        .with_clock(started + Duration::from_secs(5), step);
    let outcome =
        pollster::block_on(locks(&t).acquire(&name(), Acquiring::new(native30(), id(1)), started));
    assert!(matches!(outcome, Ok(Acquire::Acquired(_))), "{outcome:?}");
    let sent = t.sent();
    assert_eq!(sent.len(), 3, "{sent:#?}");
    for (i, s) in sent.iter().enumerate() {
        let at = s.sent_at.expect("the clock runs");
        assert_eq!(at, started + Duration::from_secs(5) + step * i as u32);
        assert_eq!(
            s.date,
            httpdate::fmt_http_date(at),
            "request {i} ({} {}) is dated when it is sent",
            s.method,
            s.uri
        );
    }
}

/// Without a clock in the transport, the caller's `now` dates the requests (as before).
#[test]
fn without_a_clock_the_callers_time_dates_the_requests() {
    let started = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
    let t = Scripted::new(vec![head("available", "a", &[]), granted(), written("b")]);
    pollster::block_on(locks(&t).acquire(&name(), Acquiring::new(native30(), id(1)), started))
        .unwrap();
    for s in t.sent() {
        assert_eq!(s.date, httpdate::fmt_http_date(started));
    }
}

/// Issue 21.3, with review finding 3: a record lock's first create whose answer is lost (it
/// may have landed) names nobody, so the key is free right after the error: nothing to clear.
#[test]
fn a_lost_first_create_of_a_record_leaves_nothing_to_clear() {
    for origin in [IdOrigin::Fresh, IdOrigin::Known] {
        let t = Scripted::new(vec![missing(), lost_answer()]);
        let term = Term::Record(Duration::from_secs(120));
        let outcome = pollster::block_on(locks(&t).acquire(
            &name(),
            Acquiring::new(term, id(3)).origin(origin),
            server_now(),
        ));
        assert!(
            matches!(outcome, Err(Error::Transport(_))),
            "the error is reported: {outcome:?}"
        );
        let sent = t.sent();
        assert_eq!(sent.len(), 2, "{origin:?}: {sent:#?}");
        assert!(
            sent[1].holder.as_deref().unwrap_or("").is_empty(),
            "the create names nobody: {sent:#?}"
        );
    }
}

/// A create answered 503 (which may have landed) names nobody either: the error, nothing else.
#[test]
fn a_first_create_answered_503_names_nobody() {
    let t = Scripted::new(vec![missing(), busy_503()]);
    let term = Term::Record(Duration::from_secs(120));
    let outcome = first_use(&t, term, id(4));
    assert!(matches!(outcome, Err(Error::Storage(_))), "{outcome:?}");
    assert_eq!(t.sent().len(), 2, "{:#?}", t.sent());
}

/// A call that generated its id gives back a record whose compare-and-swap answer was lost
/// (it landed): the key is free right after the error.
#[test]
fn a_fresh_id_clears_a_record_whose_answer_was_lost() {
    let me = id(9);
    let t = Scripted::new(vec![
        head("available", "a", &[]),
        lost_answer(),
        head("available", "c", &record_of(me, SERVER_SECS + 120)),
        written("d"),
    ]);
    let term = Term::Record(Duration::from_secs(120));
    let outcome = first_use(&t, term, me);
    assert!(matches!(outcome, Err(Error::Transport(_))), "{outcome:?}");
    let sent = t.sent();
    assert!(sent.iter().any(released_record), "{sent:#?}");
}

/// Issue 21.8: a holder re-acquiring in the last second of its native lease (its claim's
/// expiry is rounded down to whole seconds while storage still holds the lease) keeps its
/// token.
#[test]
fn a_holder_in_the_last_second_of_its_lease_keeps_its_token() {
    let me = id(5);
    let t = Scripted::new(vec![
        head("leased", "a", &native_claim(me, SERVER_SECS)),
        granted(),
        written("b"),
    ]);
    let outcome = pollster::block_on(locks(&t).acquire(
        &name(),
        Acquiring::new(native30(), me),
        server_now(),
    ));
    match outcome {
        Ok(Acquire::Acquired(held)) => {
            assert_eq!(held.fencing_token, Some(7), "the token is kept");
            assert!(held.extended, "an extension");
        }
        other => panic!("acquired: {other:?}"),
    }
}

/// Issue 21.8: a transient failure of that re-acquire does not release the lease the holder
/// held before the call.
#[test]
fn a_failed_reacquire_never_releases_the_holders_lease() {
    let me = id(6);
    for expires in [SERVER_SECS, SERVER_SECS + 20] {
        let t = Scripted::new(vec![
            head("leased", "a", &native_claim(me, expires)),
            busy_503(),
        ]);
        let outcome = pollster::block_on(locks(&t).acquire(
            &name(),
            Acquiring::new(native30(), me),
            server_now(),
        ));
        assert!(matches!(outcome, Err(Error::Storage(_))), "{outcome:?}");
        let sent = t.sent();
        assert!(
            !sent
                .iter()
                .any(|s| s.lease_action.as_deref() == Some("release")),
            "expires {expires}: the holder's own lease is not released: {sent:#?}"
        );
    }
}

/// A leased lock blob without a live claim may be leased by the caller itself (a holder that
/// stopped between its grant and its claim): a failed acquire does not release it either.
#[test]
fn a_failed_acquire_of_a_leased_blob_without_claim_releases_nothing() {
    let t = Scripted::new(vec![head("leased", "a", &[]), busy_503()]);
    let outcome = pollster::block_on(locks(&t).acquire(
        &name(),
        Acquiring::new(native30(), id(7)),
        server_now(),
    ));
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(
        !t.sent()
            .iter()
            .any(|s| s.lease_action.as_deref() == Some("release")),
        "{:#?}",
        t.sent()
    );
}

/// A new holder whose acquire may have been granted (503) still gives it back, when this call
/// generated its id.
#[test]
fn a_new_holder_still_gives_back_what_a_503_may_have_granted() {
    let t = Scripted::new(vec![
        head("available", "a", &[]),
        busy_503(),
        reply(answer(200)),
    ]);
    let outcome = first_use(&t, native30(), id(8));
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(
        t.sent()
            .iter()
            .any(|s| s.lease_action.as_deref() == Some("release")),
        "{:#?}",
        t.sent()
    );
}

/// "Also" of issue 21: a Copy Blob answer without `x-ms-copy-status` is pending (poll the
/// destination), never taken for success.
#[test]
fn a_copy_answer_without_a_status_is_pending() {
    let t = Scripted::new(vec![reply(
        answer(202)
            .with_header("etag", "\"e\"")
            .with_header("x-ms-copy-id", "c0py"),
    )]);
    let copy = CopyBlob::new(
        ContainerName::try_new("src").unwrap(),
        BlobName::try_new("a").unwrap(),
        ContainerName::try_new("dead").unwrap(),
        BlobName::try_new("a").unwrap(),
    );
    let (outcome, _) = pollster::block_on(locks(&t).client().execute(&copy, server_now())).unwrap();
    match outcome {
        CopyOutcome::Started {
            status, copy_id, ..
        } => {
            assert_eq!(status, CopyStatus::Pending);
            assert_eq!(copy_id.as_deref(), Some("c0py"));
        }
        other => panic!("started: {other:?}"),
    }
}

/// Review finding 1 (native): a call whose acquire answer was lost must not release a lease
/// id that the caller chose (a client's retry with the same `Lease-Id` may hold the lock under
/// it by now: two calls, one id). Call 2, the retry, found the blob leased with no claim,
/// acquired and wrote its claim; call 1 then sees its own acquire's answer lost.
#[test]
fn a_lost_answer_never_releases_a_lease_id_the_caller_chose() {
    let me = id(10);
    let retry = Scripted::new(vec![head("leased", "a", &[]), granted(), written("b")]);
    let got = pollster::block_on(locks(&retry).acquire(
        &name(),
        Acquiring::new(native30(), me),
        server_now(),
    ));
    assert!(matches!(got, Ok(Acquire::Acquired(_))), "{got:?}");
    let first = Scripted::new(vec![
        head("available", "a", &[]),
        lost_answer(),
        reply(answer(200)),
    ]);
    let outcome = pollster::block_on(locks(&first).acquire(
        &name(),
        Acquiring::new(native30(), me),
        server_now(),
    ));
    assert!(outcome.is_err(), "{outcome:?}");
    let sent = first.sent();
    assert!(
        !sent.iter().any(lease_released),
        "the retry's lease is released under it: {sent:#?}"
    );
}

/// Review finding 1 (record): a call whose record write's answer was lost must not clear the
/// record of a lease id the caller chose: a concurrent call with that id found the record its
/// own and answered "acquired".
#[test]
fn a_lost_answer_never_clears_a_record_of_a_lease_id_the_caller_chose() {
    let me = id(11);
    let term = Term::Record(Duration::from_secs(120));
    let retry = Scripted::new(vec![head(
        "available",
        "c",
        &record_of(me, SERVER_SECS + 120),
    )]);
    let got =
        pollster::block_on(locks(&retry).acquire(&name(), Acquiring::new(term, me), server_now()));
    assert!(matches!(got, Ok(Acquire::Acquired(_))), "{got:?}");
    // The first call's first create, and its compare-and-swap on a free blob: each answer lost.
    for before in [vec![missing()], vec![head("available", "a", &[])]] {
        let mut script = before;
        script.extend([
            lost_answer(),
            head("available", "c", &record_of(me, SERVER_SECS + 120)),
            written("d"),
        ]);
        let first = Scripted::new(script);
        let outcome = pollster::block_on(locks(&first).acquire(
            &name(),
            Acquiring::new(term, me),
            server_now(),
        ));
        assert!(outcome.is_err(), "{outcome:?}");
        let sent = first.sent();
        assert!(
            !sent.iter().any(released_record),
            "the retry's record is cleared under it: {sent:#?}"
        );
    }
}

/// Review finding 5: the native claim's compare-and-swap never writes a token below the one
/// the blob holds. The holder extends (token 7); its claim write is refused (412); the re-read
/// shows the blob leased (by its id) but claimed by another holder with token 8.
#[test]
fn a_claim_write_never_puts_a_lower_token_over_a_higher_one() {
    let me = id(12);
    let mut other = native_claim(id(13), SERVER_SECS + 25);
    for (k, v) in other.iter_mut() {
        if *k == "leasegate_token" {
            *v = "8".into();
        }
    }
    let t = Scripted::new(vec![
        head("leased", "a", &native_claim(me, SERVER_SECS + 20)),
        granted(),
        precondition_failed(),
        head("leased", "b", &other),
        written("c"),
    ]);
    let outcome = pollster::block_on(locks(&t).acquire(
        &name(),
        Acquiring::new(native30(), me),
        server_now(),
    ));
    let sent = t.sent();
    let writes: Vec<&Sent> = sent.iter().filter(|s| s.is_metadata_write()).collect();
    assert_eq!(writes.len(), 1, "only the refused write: {sent:#?}");
    assert_eq!(writes[0].token.as_deref(), Some("7"), "{sent:#?}");
    assert!(
        !matches!(outcome, Ok(Acquire::Acquired(_))),
        "not acquired over a higher token: {outcome:?}"
    );
}

/// Review finding 3: a record lock's first create names nobody (holder empty, first token), and
/// the record is then taken with the ordinary compare-and-swap; a create that lands late (after
/// its answer was lost) so grants nothing, and there is nothing to clear.
#[test]
fn a_record_locks_first_create_names_nobody() {
    let me = id(14);
    let term = Term::Record(Duration::from_secs(120));
    let t = Scripted::new(vec![missing(), created("c"), written("d")]);
    let outcome =
        pollster::block_on(locks(&t).acquire(&name(), Acquiring::new(term, me), server_now()));
    match outcome {
        Ok(Acquire::Acquired(a)) => {
            assert_eq!(a.lease_id, me);
            assert_eq!(a.fencing_token, Some((SERVER_SECS + 1) << 16));
        }
        other => panic!("acquired: {other:?}"),
    }
    let sent = t.sent();
    assert_eq!(sent.len(), 3, "HEAD, create, compare-and-swap: {sent:#?}");
    let create = &sent[1];
    assert!(
        create.method == Method::PUT && !create.uri.contains("comp="),
        "{create:?}"
    );
    assert!(
        create.holder.as_deref().unwrap_or("").is_empty(),
        "the create names nobody: {create:?}"
    );
    assert_eq!(sent[2].holder.as_deref(), Some(me.to_string().as_str()));
}

/// Review (issue 34): a step-down whose release landed but whose answer was lost. Before, the
/// release's failure was the step-down's error (the leader answers 503: try again); now the
/// fast release's failure is swallowed and the read after it finds the lease gone, so the
/// step-down answers `NotHeld`: the leader says "this instance does not lead" although it led
/// and has just stepped down.
#[test]
fn a_step_down_whose_release_answer_was_lost_is_not_told_not_held() {
    let me = id(9);
    let t = Scripted::new(vec![
        head("leased", "a", &native_claim(me, SERVER_SECS + 20)),
        written("b"),
        lost_answer(),
        head("available", "b", &native_claim(me, SERVER_SECS + 20)),
    ]);
    let r = pollster::block_on(locks(&t).step_down(
        &name(),
        me,
        std::time::Duration::from_secs(30),
        server_now(),
    ));
    assert!(
        !matches!(r, Ok(leasegate::lease::Release::NotHeld)),
        "a holder that just stepped down is told it did not hold the lock: {r:?}"
    );
}

/// An acquire with an id the call generated and no label (as device-alerts' gates).
fn first_use(t: &Scripted, term: Term, id: LeaseId) -> Result<Acquire, Error> {
    pollster::block_on(locks(t).acquire(
        &name(),
        Acquiring::new(term, id).origin(IdOrigin::Fresh),
        server_now(),
    ))
}

/// Issue 34: a native lock's first holder, with an id the call generated and no label, has
/// its claim written by the create (by the read's `Date`): a grant in the same second finds it
/// there, and the first use is 3 requests (HEAD, create, acquire at the create's ETag).
#[test]
fn a_fresh_unlabelled_first_holder_claims_in_its_create() {
    let me = id(21);
    let t = Scripted::new(vec![missing(), created("c"), granted()]);
    let outcome = first_use(&t, native30(), me);
    let first = (SERVER_SECS + 1) << 16;
    match outcome {
        Ok(Acquire::Acquired(a)) => {
            assert_eq!(a.lease_id, me);
            assert_eq!(a.fencing_token, Some(first));
            assert_eq!(a.expires_at, Some(server_now() + Duration::from_secs(30)));
        }
        other => panic!("acquired: {other:?}"),
    }
    let sent = t.sent();
    assert_eq!(sent.len(), 3, "HEAD, create, acquire: {sent:#?}");
    let create = &sent[1];
    assert_eq!(create.holder.as_deref(), Some(me.to_string().as_str()));
    assert_eq!(create.token.as_deref(), Some(first.to_string().as_str()));
    assert_eq!(
        create.expires.as_deref(),
        Some((SERVER_SECS + 30).to_string().as_str())
    );
    assert!(
        create
            .claim
            .contains(&("leasegate_unconfirmed", "1".to_string())),
        "marked as the create's claim: {create:?}"
    );
    assert_eq!(sent[2].lease_action.as_deref(), Some("acquire"));
    assert!(sent[2].uri.contains("comp=lease"), "{:?}", sent[2]);
}

/// The same, granted in a later second than the read: the claim's expiry (from the grant's
/// `Date`) is written under the lease, as for any other first holder.
#[test]
fn a_first_holder_granted_in_a_later_second_writes_its_claim() {
    let me = id(22);
    let t = Scripted::new(vec![
        missing(),
        created("c"),
        granted_later(1),
        written("d"),
    ]);
    let outcome = first_use(&t, native30(), me);
    assert!(matches!(outcome, Ok(Acquire::Acquired(_))), "{outcome:?}");
    let sent = t.sent();
    assert_eq!(sent.len(), 4, "{sent:#?}");
    assert!(sent[3].is_metadata_write(), "{:?}", sent[3]);
    assert_eq!(
        sent[3].expires.as_deref(),
        Some((SERVER_SECS + 31).to_string().as_str())
    );
}

/// A create whose lease another caller took first (at the new blob's ETag): busy, nothing
/// given back (this call was granted nothing), no further request.
#[test]
fn a_creator_whose_lease_was_taken_first_is_busy() {
    let t = Scripted::new(vec![missing(), created("c"), lease_present()]);
    let outcome = first_use(&t, native30(), id(23));
    assert!(matches!(outcome, Ok(Acquire::Busy { .. })), "{outcome:?}");
    assert_eq!(t.sent().len(), 3, "{:#?}", t.sent());
}

/// A label, or an id the caller chose (which other calls may hold too), is never named by a
/// create: another caller can take the lease at the new blob first, and a reader must not see
/// the creator named on it. The claim is written under the lease.
#[test]
fn a_labelled_or_chosen_first_holder_is_named_only_under_its_lease() {
    for (origin, label) in [(IdOrigin::Fresh, "node-a"), (IdOrigin::Known, "")] {
        let me = id(24);
        let t = Scripted::new(vec![missing(), created("c"), granted(), written("d")]);
        let outcome = pollster::block_on(locks(&t).acquire(
            &name(),
            Acquiring::new(native30(), me).origin(origin).label(label),
            server_now(),
        ));
        assert!(matches!(outcome, Ok(Acquire::Acquired(_))), "{outcome:?}");
        let sent = t.sent();
        assert_eq!(sent.len(), 4, "{origin:?} {label:?}: {sent:#?}");
        assert!(
            sent[1].holder.as_deref().unwrap_or("").is_empty()
                && !sent[1]
                    .claim
                    .iter()
                    .any(|(k, _)| *k == "leasegate_unconfirmed"),
            "the create names nobody: {:?}",
            sent[1]
        );
        assert_eq!(sent[3].holder.as_deref(), Some(me.to_string().as_str()));
    }
}

/// Review (issue 34): a caller with a chosen id takes the lease at the new blob's ETag before
/// its creator (a fresh id with no label, whose create carries its claim), and the chosen id's
/// claim write is lost: the blob is leased by it, with the creator's claim. Acquiring again
/// with its id must settle it (storage grants its own lease), not answer busy until the
/// creator's claim runs out (never, for an infinite lease).
#[test]
fn a_chosen_id_racing_a_claiming_create_settles_its_lease_by_acquiring_again() {
    for term in [Term::Native(LeaseDuration::Infinite), native30()] {
        let (creator, chosen) = (id(31), id(32));
        let ta = Scripted::new(vec![missing(), created("c"), lease_present()]);
        let busy = first_use(&ta, term, creator);
        assert!(matches!(busy, Ok(Acquire::Busy { .. })), "{busy:?}");
        let created_with = ta.sent()[1].claim.clone();
        assert!(!created_with.is_empty(), "{:?}", ta.sent()[1]);
        let t = Scripted::new(vec![
            // The chosen id's first call: the blob as created, free; granted; the claim lost.
            head("available", "c", &created_with),
            granted(),
            lost_answer(),
            // Its retry: the blob leased (by it), the creator's claim on it.
            head("leased", "c", &created_with),
            granted(),
            written("d"),
        ]);
        let l = locks(&t);
        let first =
            pollster::block_on(l.acquire(&name(), Acquiring::new(term, chosen), server_now()));
        assert!(first.is_err(), "{first:?}");
        let again =
            pollster::block_on(l.acquire(&name(), Acquiring::new(term, chosen), server_now()));
        match again {
            Ok(Acquire::Acquired(a)) => {
                assert_eq!(a.lease_id, chosen);
                let sent = t.sent();
                let claim = sent.last().unwrap();
                assert!(claim.is_metadata_write(), "{sent:#?}");
                assert_eq!(claim.holder.as_deref(), Some(chosen.to_string().as_str()));
                assert_eq!(a.fencing_token.map(|t| t.to_string()), claim.token);
            }
            other => panic!("{term:?}: the chosen id holds the lease: {other:?}"),
        }
    }
}

/// A native claim of another's (`term`: the lease's seconds, `-1` infinite), token 7, expiring
/// at `expires`, as the blob's create wrote it (`marked`) or as a holder's own write.
fn claim_of(
    holder: LeaseId,
    term: &str,
    expires: u64,
    marked: bool,
) -> Vec<(&'static str, String)> {
    let mut claim = native_claim(holder, expires);
    claim[1].1 = term.to_string();
    if marked {
        claim.push(("leasegate_unconfirmed", "1".into()));
    }
    claim
}

/// Review (issue 34): a chosen id that finds the blob leased under a claim the create wrote
/// asks storage; refused, it is told what the claim says (the time left, the token), as a
/// caller told busy by the claim alone.
#[test]
fn a_chosen_id_refused_under_a_marked_claim_is_told_the_claims_time_left() {
    let claim = claim_of(id(51), "30", SERVER_SECS + 20, true);
    let t = Scripted::new(vec![head("leased", "c", &claim), lease_present()]);
    let outcome = pollster::block_on(locks(&t).acquire(
        &name(),
        Acquiring::new(native30(), id(52)),
        server_now(),
    ));
    match outcome {
        Ok(Acquire::Busy {
            retry_after,
            holder: Some(holder),
            ..
        }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(20)));
            assert_eq!(holder.token, 7);
        }
        other => panic!("busy, with the claim's time left: {other:?}"),
    }
    assert_eq!(t.sent().len(), 2, "{:#?}", t.sent());
}

/// Review (issue 34): an infinite lease's claim never moves, so its first holder's create
/// names nobody (a claim the create wrote would stay the create's for the whole lease).
#[test]
fn an_infinite_first_holder_is_named_only_under_its_lease() {
    let me = id(53);
    let t = Scripted::new(vec![missing(), created("c"), granted(), written("d")]);
    let outcome = first_use(&t, Term::Native(LeaseDuration::Infinite), me);
    assert!(matches!(outcome, Ok(Acquire::Acquired(_))), "{outcome:?}");
    let sent = t.sent();
    assert_eq!(sent.len(), 4, "{sent:#?}");
    assert!(sent[1]
        .claim
        .iter()
        .all(|(k, v)| *k != "leasegate_holder" || v.is_empty()));
    assert_eq!(sent[3].holder.as_deref(), Some(me.to_string().as_str()));
}

/// Review (issue 34; older than it): an infinite holder released, its claim stays; a chosen id
/// took the lease and lost its claim's write. Acquiring again with its id settles it (storage
/// grants its own lease), where the claim in place, which never runs out, made it busy for
/// good.
#[test]
fn a_chosen_id_settles_an_infinite_lease_under_a_released_holders_claim() {
    let claim = claim_of(id(54), "-1", 0, false);
    let me = id(55);
    let t = Scripted::new(vec![head("leased", "c", &claim), granted(), written("d")]);
    let outcome = pollster::block_on(locks(&t).acquire(
        &name(),
        Acquiring::new(Term::Native(LeaseDuration::Infinite), me),
        server_now(),
    ));
    match outcome {
        Ok(Acquire::Acquired(a)) => {
            assert_eq!(a.lease_id, me);
            assert!(a.fencing_token > Some(7), "{a:?}");
        }
        other => panic!("the chosen id holds its lease: {other:?}"),
    }
    assert_eq!(t.sent()[2].holder.as_deref(), Some(me.to_string().as_str()));
}

/// Issue 34: a record released by its holder's one conditional write is kept as that write left
/// it (the release's answer), and the next holder starts from it: one write, the record and its
/// claim at the release's ETag, with a token above the last.
#[test]
fn a_record_its_holder_released_is_taken_from_the_kept_state_in_one_write() {
    let record = Term::Record(Duration::from_secs(90));
    let t = Scripted::new(vec![
        head("available", "a", &[]),
        written("b"),
        written("c"),
        written("d"),
    ]);
    let l = locks(&t);
    let first = match pollster::block_on(l.acquire(
        &name(),
        Acquiring::new(record, id(60)),
        server_now(),
    )) {
        Ok(Acquire::Acquired(a)) => a,
        other => panic!("the first holder: {other:?}"),
    };
    let (released, left) = pollster::block_on(l.release(
        &name(),
        first.lease_id,
        Start::Acquired(&first),
        server_now(),
    ))
    .expect("released");
    assert_eq!(released, Release::Released);
    let left = left.expect("the state the release left");
    assert!(!left.is_held_by(id(60)));
    let kept = HeldState::from_json(&left.to_json()).expect("kept as JSON");
    let outcome = pollster::block_on(
        l.acquire(
            &name(),
            Acquiring::new(record, id(61))
                .origin(IdOrigin::Fresh)
                .label("node-b")
                .start(Start::Kept(&kept, server_now())),
            server_now(),
        ),
    );
    let next = match outcome {
        Ok(Acquire::Acquired(a)) => a,
        other => panic!("the next holder: {other:?}"),
    };
    assert!(
        next.fencing_token > first.fencing_token,
        "{next:?} {first:?}"
    );
    let sent = t.sent();
    assert_eq!(sent.len(), 4, "{sent:#?}");
    assert!(released_record(&sent[2]), "{:?}", sent[2]);
    assert!(sent[3].is_metadata_write(), "{:?}", sent[3]);
    assert_eq!(sent[3].if_match.as_deref(), Some("\"c\""));
    assert_eq!(sent[3].holder.as_deref(), Some(id(61).to_string().as_str()));
}

/// Issue 34: a record kept live (its holder's release failed, or may have landed unanswered) is
/// read first, never refused on the kept state's word; and a kept state of the other term is
/// read first too.
#[test]
fn a_kept_record_still_live_or_of_the_other_term_is_read_first() {
    let record = Term::Record(Duration::from_secs(90));
    let t = Scripted::new(vec![head("available", "a", &[]), written("b")]);
    let l = locks(&t);
    let held = match pollster::block_on(l.acquire(
        &name(),
        Acquiring::new(record, id(62)),
        server_now(),
    )) {
        Ok(Acquire::Acquired(a)) => a,
        other => panic!("the holder: {other:?}"),
    };
    let live = held.held_state().expect("an ETag");
    // The release landed unanswered: the blob says released.
    let released = record_of(id(62), 0)
        .into_iter()
        .map(|(k, v)| match k {
            "leasegate_holder" | "leasegate_label" => (k, String::new()),
            _ => (k, v),
        })
        .collect::<Vec<_>>();
    for (term, state) in [(record, &live), (native30(), &live)] {
        let mut answers = vec![head("available", "e", &released)];
        if term != record {
            answers.push(granted());
        }
        answers.push(written("f"));
        let t = Scripted::new(answers);
        let outcome = pollster::block_on(
            locks(&t).acquire(
                &name(),
                Acquiring::new(term, id(63))
                    .origin(IdOrigin::Fresh)
                    .start(Start::Kept(state, server_now())),
                server_now(),
            ),
        );
        let sent = t.sent();
        assert_eq!(sent[0].method, Method::HEAD, "{term:?}: {sent:#?}");
        if term == record {
            assert!(matches!(outcome, Ok(Acquire::Acquired(_))), "{outcome:?}");
            assert_eq!(sent[1].if_match.as_deref(), Some("\"e\""));
        }
    }
}

/// Review (issue 34): a kept record of another holder that ran out by the `date` given is read
/// first, never taken on the caller's word about the time (a clock ahead of storage's would take
/// a record still live); only a record its holder released is taken from the kept state.
#[test]
fn a_kept_record_of_another_holder_that_ran_out_is_read_first() {
    let record = Term::Record(Duration::from_secs(90));
    let t = Scripted::new(vec![head("available", "a", &[]), written("b")]);
    let held = match pollster::block_on(locks(&t).acquire(
        &name(),
        Acquiring::new(record, id(64)),
        server_now(),
    )) {
        Ok(Acquire::Acquired(a)) => a,
        other => panic!("the holder: {other:?}"),
    };
    let kept = held.held_state().expect("an ETag");
    let expires = held.expires_at.expect("a record expires");
    // The caller says its clock is past the record's expiry; storage says it is still live.
    let later = expires + Duration::from_secs(10);
    let live = record_of(id(64), SERVER_SECS + 90);
    let t = Scripted::new(vec![head("available", "b", &live)]);
    let outcome = pollster::block_on(
        locks(&t).acquire(
            &name(),
            Acquiring::new(record, id(65))
                .origin(IdOrigin::Fresh)
                .start(Start::Kept(&kept, later)),
            server_now(),
        ),
    );
    let sent = t.sent();
    assert_eq!(sent[0].method, Method::HEAD, "{sent:#?}");
    assert!(matches!(outcome, Ok(Acquire::Busy { .. })), "{outcome:?}");
}
