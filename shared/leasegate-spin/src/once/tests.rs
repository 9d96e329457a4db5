//! Scripted storage for the verbs' unit tests (used by `leader` and `occurrence` too), and the tests of `once`.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use leasegate::lease::{Locks, Term};
use leasegate::ops::Metadata;
use leasegate::{Account, ContainerName, LeaseId, Method, TransportError};
use leasegate::{Error, LockName, Request, Response, StatusCode, Transport};
use serde::Serialize;

use super::*;
use crate::Context;

/// The storage server's clock in every scripted answer.
pub(crate) const SERVER_SECS: u64 = 1_795_096_800;
/// `SERVER_SECS` as an HTTP date.
pub(crate) const SERVER_DATE: &str = "Thu, 19 Nov 2026 14:00:00 GMT";
const HOUR: Duration = Duration::from_secs(3600);

/// Answers each request with the next scripted response and records what it was sent.
#[derive(Default)]
pub(crate) struct Scripted {
    answers: RefCell<VecDeque<Response>>,
    pub(crate) sent: RefCell<Vec<(Method, String)>>,
    /// The metadata headers of each request sent (`x-ms-meta-*`).
    pub(crate) metadata: RefCell<Vec<Vec<(String, String)>>>,
    /// The `If-Match` of each request sent.
    pub(crate) if_match: RefCell<Vec<Option<String>>>,
}

impl Scripted {
    pub(crate) fn new(answers: Vec<Response>) -> Self {
        Scripted {
            answers: RefCell::new(answers.into()),
            sent: RefCell::default(),
            metadata: RefCell::default(),
            if_match: RefCell::default(),
        }
    }
}

impl Transport for Scripted {
    async fn send(&self, request: Request) -> Result<Response, TransportError> {
        self.sent
            .borrow_mut()
            .push((request.method().clone(), request.uri().to_string()));
        self.if_match
            .borrow_mut()
            .push(request.headers().get("if-match").map(str::to_string));
        self.metadata.borrow_mut().push(
            request
                .headers()
                .iter()
                .filter(|(n, _)| n.starts_with("x-ms-meta-"))
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        );
        Ok(self
            .answers
            .borrow_mut()
            .pop_front()
            .unwrap_or_else(|| panic!("no scripted answer left for {request:?}")))
    }
}

pub(crate) fn reply(status: u16) -> Response {
    Response::new(StatusCode::from_u16(status).unwrap()).with_header("date", SERVER_DATE)
}

/// A HEAD of an existing, unleased lock blob with this record (if any).
pub(crate) fn head(record: Option<(LeaseId, u64)>) -> Response {
    head_marked(record, false)
}

/// [`head`], with the done mark when `done`.
fn head_marked(record: Option<(LeaseId, u64)>, done: bool) -> Response {
    let mut r = reply(200)
        .with_header("etag", "\"e1\"")
        .with_header("x-ms-lease-state", "available")
        .with_header("x-ms-blob-type", "PageBlob")
        .with_header("content-length", "0");
    if let Some((holder, since)) = record {
        for (k, v) in [
            ("holder", holder.to_string()),
            ("term", "record".into()),
            ("since", since.to_string()),
            ("expires", (since + 3600).to_string()),
            ("token", (7u64 << 16).to_string()),
            ("label", String::new()),
        ] {
            r = r.with_header(&format!("x-ms-meta-leasegate_{k}"), v);
        }
    }
    if done {
        r = r.with_header("x-ms-meta-progress", "done");
    }
    r
}

pub(crate) fn written() -> Response {
    reply(200).with_header("etag", "\"e2\"")
}

pub(crate) fn me() -> LeaseId {
    LeaseId::from_random_bytes([1; 16])
}

pub(crate) fn other() -> LeaseId {
    LeaseId::from_random_bytes([2; 16])
}

/// Runs `once_per_window` on "order-1" for an hour against `script`, with work that
/// returns `result` and records the token it was handed.
fn run(
    script: Vec<Response>,
    result: Result<&'static str, &'static str>,
) -> (
    Result<Once<&'static str, &'static str>, Error>,
    Option<u64>,
    Scripted,
) {
    let transport = Scripted::new(script);
    let locks = Locks::new(
        &transport,
        Account::from_connection_string("UseDevelopmentStorage=true").unwrap(),
        ContainerName::try_new("leasegate").unwrap(),
    )
    .with_prefix("orders/");
    let variables = HashMap::new();
    let ctx = Context {
        connect: &|_| (),
        variables: &variables,
        now: SystemTime::UNIX_EPOCH + Duration::from_secs(SERVER_SECS),
        new_lease_id: &me,
        sleep: &|_| Box::pin(async {}),
        cache: &crate::cache::NoCache,
        log_decisions: false,
    };
    let handed = RefCell::new(None);
    let outcome = pollster::block_on(once_per_window(
        &ctx,
        &locks,
        &LockName::try_new("order-1").unwrap(),
        HOUR,
        async |token| {
            *handed.borrow_mut() = Some(token);
            result
        },
    ));
    (outcome, handed.into_inner(), transport)
}

/// Runs `once_ever` on "init" with an hour's lease against `script`, with work that
/// returns `result` and records the token it was handed.
fn run_ever(
    script: Vec<Response>,
    result: Result<&'static str, &'static str>,
) -> (
    Result<Ever<&'static str, &'static str>, Error>,
    Option<u64>,
    Scripted,
) {
    run_ever_as(script, result, "", &Metadata::new())
}

fn run_ever_as(
    script: Vec<Response>,
    result: Result<&'static str, &'static str>,
    holder: &str,
    marks: &Metadata,
) -> (
    Result<Ever<&'static str, &'static str>, Error>,
    Option<u64>,
    Scripted,
) {
    let transport = Scripted::new(script);
    let locks = Locks::new(
        &transport,
        Account::from_connection_string("UseDevelopmentStorage=true").unwrap(),
        ContainerName::try_new("leasegate").unwrap(),
    );
    let variables = HashMap::new();
    let ctx = Context {
        connect: &|_| (),
        variables: &variables,
        now: SystemTime::UNIX_EPOCH + Duration::from_secs(SERVER_SECS),
        new_lease_id: &me,
        sleep: &|_| Box::pin(async {}),
        cache: &crate::cache::NoCache,
        log_decisions: false,
    };
    let handed = RefCell::new(None);
    let outcome = pollster::block_on(once_ever_as(
        &ctx,
        &locks,
        &LockName::try_new("init").unwrap(),
        HOUR,
        holder,
        marks,
        async |token| {
            *handed.borrow_mut() = Some(token);
            result
        },
    ));
    (outcome, handed.into_inner(), transport)
}

#[test]
fn once_ever_runs_marks_and_lets_go() {
    // The read, the record's compare-and-swap (from that read: no HEAD of its own), the
    // done mark and the release (each at the ETag the last write left: no HEAD).
    let script = vec![head(None), written(), written(), written()];
    let (outcome, handed, t) = run_ever(script, Ok("initialized"));
    let Ok(Ever::Ran {
        fencing_token,
        output,
    }) = outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!((handed, output), (Some(fencing_token), "initialized"));
    let sent = t.sent.borrow();
    assert_eq!(sent.len(), 4, "{sent:?}");
    assert_eq!(sent[0].0, Method::HEAD);
    let if_match = t.if_match.borrow();
    assert_eq!(if_match[1].as_deref(), Some("\"e1\""), "{if_match:?}");
    assert_eq!(if_match[2].as_deref(), Some("\"e2\""), "{if_match:?}");
    assert_eq!(if_match[3].as_deref(), Some("\"e2\""), "{if_match:?}");
}

/// What init-once needs of the verb: its instance as the holder's label (told to other
/// callers), its own marks beside the done mark, and why a mark failed.
#[test]
fn once_ever_as_labels_the_holder_and_writes_the_marks() {
    let script = vec![head(None), written(), written(), written()];
    let mut marks = Metadata::new();
    marks.insert("done_by".into(), "node-a".into());
    let (outcome, _, t) = run_ever_as(script, Ok("x"), "node-a", &marks);
    assert!(matches!(outcome, Ok(Ever::Ran { .. })), "{outcome:?}");
    let sent = t.metadata.borrow();
    let has = |i: usize, k: &str, v: &str| sent[i].iter().any(|(n, x)| n == k && x == v);
    assert!(
        has(1, "x-ms-meta-leasegate_label", "node-a"),
        "{:?}",
        sent[1]
    );
    assert!(has(2, "x-ms-meta-done_by", "node-a"), "{:?}", sent[2]);
    assert!(has(2, "x-ms-meta-progress", "done"), "{:?}", sent[2]);
    // Another holder's label is told to a caller that finds it running.
    let mut running = head(Some((other(), SERVER_SECS - 100)));
    running
        .headers_mut()
        .insert("x-ms-meta-leasegate_label", "node-b");
    let (outcome, _, _) = run_ever_as(vec![running], Ok("x"), "node-a", &marks);
    let Ok(Ever::Busy { holder, .. }) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(holder.as_deref(), Some("node-b"));
}

#[test]
fn once_ever_does_nothing_once_done_or_while_running() {
    let (outcome, handed, t) = run_ever(vec![head_marked(None, true)], Ok("x"));
    assert_eq!(outcome.unwrap(), Ever::Done);
    assert_eq!((handed, t.sent.borrow().len()), (None, 1));
    let running = head(Some((other(), SERVER_SECS - 100)));
    let (outcome, handed, _) = run_ever(vec![running], Ok("x"));
    assert_eq!(
        outcome.unwrap(),
        Ever::Busy {
            retry_after: Duration::from_secs(3500),
            holder: Some(String::new()),
        }
    );
    assert_eq!(handed, None);
    // Marked done between the read and the grant: the compare-and-swap at the read's ETag
    // is refused, the acquire reads again and takes the lock, and the work is not run.
    let script = vec![
        head(None),
        reply(412).with_header("x-ms-error-code", "ConditionNotMet"),
        head_marked(None, true),
        written(),
        written(),
    ];
    let (outcome, handed, t) = run_ever(script, Ok("x"));
    assert_eq!((outcome.unwrap(), handed), (Ever::Done, None));
    assert_eq!(t.sent.borrow().len(), 5);
}

#[test]
fn once_ever_lets_failed_work_run_again() {
    let script = vec![head(None), written(), written()];
    let (outcome, _, _) = run_ever(script, Err("no"));
    let Ok(Ever::Failed {
        error, released, ..
    }) = outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!((error, released), ("no", true));
    let r = answer_ever::<u16, &str>(
        "init",
        Ok(Ever::Failed {
            fencing_token: 1,
            error: "no",
            released: true,
        }),
    );
    assert_eq!(r.status(), 502);
    assert_eq!(
        answer_ever::<u16, &str>("init", Ok(Ever::Done)).status(),
        200
    );
    let busy = answer_ever::<u16, &str>(
        "init",
        Ok(Ever::Busy {
            retry_after: Duration::from_secs(5),
            holder: None,
        }),
    );
    assert_eq!(busy.status(), 429);
    assert_eq!(busy.headers().get("retry-after"), Some("5"));
}

#[test]
fn a_free_key_runs_the_work_with_its_token_and_keeps_the_lock() {
    // The take (HEAD, write), then the done mark (a write at the ETag the take left).
    let script = vec![head(None), written(), written()];
    let (outcome, handed, t) = run(script, Ok("shipped"));
    let Ok(Once::Ran {
        fencing_token,
        expires_at,
        output,
    }) = outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!(output, "shipped");
    assert_eq!(handed, Some(fencing_token));
    assert!(fencing_token > 7 << 16, "{fencing_token}");
    assert_eq!(
        expires_at,
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(SERVER_SECS + 3600))
    );
    // A HEAD and the record's compare-and-swap, the mark's write; no release.
    let sent = t.sent.borrow();
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[0].0, Method::HEAD);
    assert!(sent[0].1.contains("/leasegate/orders/order-1"), "{sent:?}");
    assert_eq!(sent[1].0, Method::PUT);
    assert_eq!(sent[2].0, Method::PUT);
    assert_eq!(t.if_match.borrow()[2].as_deref(), Some("\"e2\""));
    // The mark names the holder's token, beside the claim it keeps.
    let written = &t.metadata.borrow()[2];
    let mark = ("x-ms-meta-ran_token".to_string(), fencing_token.to_string());
    assert!(written.contains(&mark), "{written:?}");
    assert!(
        written
            .iter()
            .any(|(k, _)| k == "x-ms-meta-leasegate_holder"),
        "{written:?}"
    );
}

/// Once the holder's work is done, a caller is told the window's real time left, not to
/// come back when the work may have settled; a mark left by an earlier holder (another
/// token) says nothing of this one.
#[test]
fn a_key_whose_work_is_done_is_throttled_for_the_rest_of_its_window() {
    let done = |token: u64| {
        head(Some((other(), SERVER_SECS - 10)))
            .with_header("x-ms-meta-ran_token", token.to_string())
    };
    let (outcome, handed, t) = run(vec![done(7 << 16)], Ok("x"));
    assert_eq!(
        outcome.unwrap(),
        Once::Throttled {
            retry_after: Duration::from_secs(3590)
        }
    );
    assert_eq!(handed, None);
    assert_eq!(t.sent.borrow().len(), 1);
    let (outcome, _, _) = run(vec![done(6 << 16)], Ok("x"));
    assert_eq!(
        outcome.unwrap(),
        Once::Busy {
            retry_after: Duration::from_secs(50)
        }
    );
}

#[test]
fn a_key_taken_a_moment_ago_is_busy_and_the_work_does_not_run() {
    let (outcome, handed, t) = run(vec![head(Some((other(), SERVER_SECS - 10)))], Ok("x"));
    assert_eq!(
        outcome.unwrap(),
        Once::Busy {
            retry_after: Duration::from_secs(50)
        }
    );
    assert_eq!(handed, None);
    assert_eq!(t.sent.borrow().len(), 1);
}

#[test]
fn a_key_taken_long_ago_is_throttled_for_the_rest_of_its_window() {
    let (outcome, handed, _) = run(vec![head(Some((other(), SERVER_SECS - 600)))], Ok("x"));
    assert_eq!(
        outcome.unwrap(),
        Once::Throttled {
            retry_after: Duration::from_secs(3000)
        }
    );
    assert_eq!(handed, None);
}

/// A holder with no expiry (an infinite lease taken by an operator): how long it has held
/// the key says nothing of whether it is at work, so the answer stays `busy`, as before
/// the holder's age came from the core.
#[test]
fn an_infinite_holder_keeps_a_key_busy() {
    let infinite = reply(200)
        .with_header("etag", "\"e1\"")
        .with_header("x-ms-lease-state", "leased")
        .with_header("x-ms-blob-type", "PageBlob")
        .with_header("content-length", "0")
        .with_header("x-ms-meta-leasegate_holder", other().to_string())
        .with_header("x-ms-meta-leasegate_term", "-1")
        .with_header("x-ms-meta-leasegate_since", (SERVER_SECS - 100).to_string())
        .with_header("x-ms-meta-leasegate_expires", "0")
        .with_header("x-ms-meta-leasegate_token", (7u64 << 16).to_string())
        .with_header("x-ms-meta-leasegate_label", "cli");
    let (outcome, handed, _) = run(vec![infinite.clone()], Ok("x"));
    assert_eq!(
        outcome.unwrap(),
        Once::Busy {
            retry_after: RUNNING_FOR
        }
    );
    assert_eq!(handed, None);
    // once_ever: the holder's expiry unknown, so ask again in a second (init-once's answer).
    let (outcome, _, _) = run_ever(vec![infinite], Ok("x"));
    assert_eq!(
        outcome.unwrap(),
        Ever::Busy {
            retry_after: Duration::from_secs(1),
            holder: Some("cli".into()),
        }
    );
}

#[test]
fn failed_work_gives_the_lock_back() {
    // Take (HEAD, write), the work fails, release (clear the record at the ETag the take
    // left).
    let script = vec![head(None), written(), written()];
    let (outcome, handed, t) = run(script, Err("the webhook answered 503"));
    let Ok(Once::Failed {
        fencing_token,
        error,
        released,
    }) = outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!(handed, Some(fencing_token));
    assert_eq!(error, "the webhook answered 503");
    assert!(released);
    assert_eq!(t.sent.borrow().len(), 3);
}

#[test]
fn a_storage_failure_is_an_error_and_runs_nothing() {
    let failing = reply(503).with_header("x-ms-error-code", "ServerBusy");
    let (outcome, handed, _) = run(vec![failing], Ok("x"));
    assert!(outcome.is_err(), "{outcome:?}");
    assert_eq!(handed, None);
}

fn body(r: &Response) -> serde_json::Value {
    serde_json::from_slice(r.body()).unwrap()
}

#[test]
fn outcomes_are_answered_in_one_place() {
    let ran: Result<Once<u16, String>, Error> = Ok(Once::Ran {
        fencing_token: 42,
        expires_at: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(SERVER_SECS)),
        output: 204,
    });
    let r = answer_of("order-1", ran);
    assert_eq!(r.status(), 200);
    assert_eq!(
        body(&r),
        serde_json::json!({
            "key": "order-1", "outcome": "ran", "fencingToken": 42,
            "expiresAt": "2026-11-19T14:00:00Z", "output": 204,
        })
    );
    // Whichever way the race fell, the loser gets 429 with Retry-After.
    for (once, name, secs) in [
        (
            Once::Busy {
                retry_after: Duration::from_millis(1500),
            },
            "busy",
            2,
        ),
        (
            Once::Throttled {
                retry_after: Duration::from_secs(3000),
            },
            "throttled",
            3000,
        ),
    ] {
        let r = answer_of::<u16, String>("order-1", Ok(once));
        assert_eq!(r.status(), 429);
        assert_eq!(
            r.headers().get("retry-after"),
            Some(secs.to_string().as_str())
        );
        assert_eq!(
            body(&r),
            serde_json::json!({"key": "order-1", "outcome": name, "retryAfterSeconds": secs})
        );
    }
    let failed: Result<Once<u16, String>, Error> = Ok(Once::Failed {
        fencing_token: 42,
        error: "the webhook answered 503".into(),
        released: true,
    });
    let r = answer_of("order-1", failed);
    assert_eq!(r.status(), 502);
    assert_eq!(body(&r)["error"], "work_failed");
    assert_eq!(body(&r)["released"], true);
    let r = answer_of::<u16, String>(
        "order-1",
        Err(Term::for_window(Duration::ZERO).unwrap_err()),
    );
    assert_eq!(r.status(), 500);
    assert_eq!(body(&r)["error"], "invalid_window");
}

fn answer_of<R: Serialize, E: std::fmt::Display>(
    key: &str,
    outcome: Result<Once<R, E>, Error>,
) -> Response {
    answer(key, outcome)
}

#[test]
fn keys_are_checked() {
    assert_eq!(key("order%2D1").unwrap().as_str(), "order-1");
    for bad in ["", "..", "%ff", "a%00b", &"k".repeat(300)] {
        let r = key(bad).unwrap_err();
        assert_eq!(r.status(), 400, "{bad}");
        assert_eq!(body(&r)["error"], "invalid_key");
    }
    let path = |p: &str| Request::new(Method::POST, format!("http://h{p}"));
    let k = key_in_path(&path("/api/orders/a%2Fb/ship"), "/api/orders/", "/ship");
    assert_eq!(k.unwrap().as_str(), "a/b");
    for (p, status) in [
        ("/api/orders//ship", 400),
        ("/api/orders/../ship", 400),
        ("/api/orders/x", 404),
        ("/api/other/x/ship", 404),
    ] {
        let r = key_in_path(&path(p), "/api/orders/", "/ship").unwrap_err();
        assert_eq!(r.status(), status, "{p}");
    }
}

#[test]
fn post_json_is_ok_only_for_a_2xx() {
    let t = Scripted::new(vec![reply(204), reply(503)]);
    let body = serde_json::json!({ "order": "order-1", "fencingToken": 9 });
    let url = "http://127.0.0.1:3001/ship";
    assert_eq!(
        pollster::block_on(post_json(&t, url, "order-1/9", &body)),
        Ok(204)
    );
    let refused = pollster::block_on(post_json(&t, url, "order-1/9", &body));
    assert_eq!(refused, Err("the webhook answered 503".into()));
    let unusable = pollster::block_on(post_json(&t, "ftp://x", "k", &body));
    assert!(unusable.unwrap_err().contains("not an absolute"));
    assert_eq!(t.sent.borrow().len(), 2);
}
