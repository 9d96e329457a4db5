//! Outbound responses whose bodies misbehave (break off, are far too large, trickle), read by
//! the release `.wasm` components served by the real `spin up`: storage or the webhook is a
//! misbehaving stub server. Never a trap, never a 500: storage problems are a 503
//! `storage_unavailable`, a webhook answer that breaks off a `notify_failed` decision, and a
//! webhook answer with a huge body is not read (its status confirms the notification).

use std::time::{Duration, Instant};

use leasegate_tests::app::{call, post_telemetry, Answer, App};
use leasegate_tests::stub::{Behaviour, Heads, Stub};
use serde_json::{json, Value};

const AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

fn gate(app: &App, method: &str, path_and_query: &str) -> Answer {
    call(
        method,
        &app.url(&format!("/api/gate/{path_and_query}")),
        &[AUTH],
        b"",
    )
}

/// The guest answered by itself: no 500, no trap or panic in its output or Spin's.
fn assert_no_trap(app: &App, answer: &Answer, what: &str) {
    assert_ne!(answer.status, 500, "{what}: {}", answer.text);
    for line in app.log_lines() {
        assert!(
            !line.contains("trap") && !line.contains("panicked"),
            "{what}: the guest trapped: {line}"
        );
    }
}

/// A 503 `storage_unavailable` whose message contains `expect`.
fn assert_storage_unavailable(answer: &Answer, expect: &str, what: &str) {
    assert_eq!(answer.status, 503, "{what}: {}", answer.text);
    assert_eq!(
        answer.json["error"], "storage_unavailable",
        "{what}: {}",
        answer.text
    );
    let message = answer.json["message"].as_str().unwrap_or("");
    assert!(
        message.contains(expect),
        "{what}: the message should mention {expect:?}: {message}"
    );
    assert!(
        !message.contains("127.0.0.1") && !message.contains("devstoreaccount1"),
        "{what}: no URL in messages: {message}"
    );
}

/// Storage is the stub.
///
/// Acquiring a gate (`POST`) must reach a storage request whose answer has a body: the stub
/// answers HEADs (reading the lock blob's properties, where the lease module starts) with a
/// clean 404 and breaks the next answer's body; the 503 names the body problem (`expect`).
///
/// Reading a gate's state (`GET`) is a HEAD alone, whose answer has no body: a second stub
/// breaks the HEAD's answer the same way (its head breaks off, is endless, or trickles), which
/// must be a 503 too (naming `expect_head` when given).
fn storage_case(
    tag: &str,
    behaviour: Behaviour,
    timeout_ms: &str,
    expect: &str,
    expect_head: &str,
) -> Duration {
    let stub = Stub::start_with(behaviour, Heads::Missing);
    let app = App::start(
        tag,
        &[
            ("storage_origin", &stub.origin()),
            ("storage_timeout_ms", timeout_ms),
        ],
    );
    let started = Instant::now();
    let post = gate(&app, "POST", "k?window=30");
    let took = started.elapsed();
    assert_storage_unavailable(&post, expect, &format!("{tag} POST"));
    assert_no_trap(&app, &post, &format!("{tag} POST"));
    assert!(
        stub.seen().iter().any(|s| s.method == "PUT"),
        "{tag}: a request with an answer body reached the stub: {:?}",
        stub.seen()
    );
    drop((app, stub));

    let stub = Stub::start_with(behaviour, Heads::Misbehave);
    let app = App::start(
        tag,
        &[
            ("storage_origin", &stub.origin()),
            ("storage_timeout_ms", timeout_ms),
        ],
    );
    let get = gate(&app, "GET", "k");
    assert_storage_unavailable(&get, expect_head, &format!("{tag} GET"));
    assert_no_trap(&app, &get, &format!("{tag} GET"));
    assert!(
        stub.seen().iter().any(|s| s.method == "HEAD"),
        "{tag}: the HEAD reached the stub: {:?}",
        stub.seen()
    );
    took
}

#[test]
fn storage_body_reset_mid_read_is_503_not_a_trap() {
    storage_case(
        "resetbody",
        Behaviour::ResetMidBody,
        "3000",
        "the response body broke off after 10 bytes",
        "",
    );
}

#[test]
fn storage_body_closed_mid_read_is_503_not_a_trap() {
    storage_case(
        "closebody",
        Behaviour::CloseMidBody,
        "3000",
        "the response body broke off after 10 bytes",
        "",
    );
}

#[test]
fn storage_body_over_the_cap_is_503() {
    // A long timeout, so that it is the cap that stops the read, not the clock.
    storage_case(
        "hugebody",
        Behaviour::HugeBody,
        "20000",
        "response body over 16777216 bytes",
        "",
    );
}

#[test]
fn storage_body_declared_over_the_cap_is_503() {
    storage_case(
        "hugedeclared",
        Behaviour::HugeDeclaredBody,
        "20000",
        "response body over 16777216 bytes",
        "",
    );
}

#[test]
fn storage_body_trickling_is_cut_off_at_the_timeout() {
    let took = storage_case(
        "trickle",
        Behaviour::Trickle,
        "1000",
        "within 1000 ms",
        "within 1000 ms",
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// The webhook is the stub (storage is Azurite): the winning reading's notification fails,
/// which is a `notify_failed` decision, not a 500 or a trap.
fn webhook_case(tag: &str, behaviour: Behaviour, timeout_ms: &str) {
    let stub = Stub::start(behaviour);
    let app = App::start(
        tag,
        &[
            ("notify_origin", &stub.origin()),
            ("storage_timeout_ms", timeout_ms),
        ],
    );
    let answer = post_telemetry(&app, &json!({"deviceId": "d1", "temperature": 40}));
    assert_ne!(answer.status, 500, "{tag}: {}", answer.text);
    let decision = &answer.json["decisions"][0];
    assert_eq!(
        decision["decision"], "notify_failed",
        "{tag}: {}",
        answer.text
    );
    assert_no_trap(&app, &answer, tag);
    assert!(
        stub.seen().iter().any(|s| s.method == "POST"),
        "{tag}: the notification reached the stub: {:?}",
        stub.seen()
    );
}

#[test]
fn webhook_body_reset_mid_read_is_notify_failed() {
    webhook_case("hookreset", Behaviour::ResetMidBody, "3000");
}

/// Issue 25.7: an outbound answer whose body is not used (a webhook's) is read a few KB at
/// most. A webhook answering 200 with a huge body, to a batch of many devices at once: the
/// decision comes quickly, the notifications are confirmed by their status (the body is not
/// read to its end), and the component neither traps nor runs out of memory.
#[test]
fn huge_webhook_answers_are_not_read() {
    for (tag, behaviour) in [
        ("hookchunked", Behaviour::HugeBody),
        ("hookdeclared", Behaviour::HugeDeclaredBody),
    ] {
        let stub = Stub::start(behaviour);
        let app = App::start(
            tag,
            &[
                ("notify_origin", &stub.origin()),
                ("max_in_flight", "64"),
                ("storage_timeout_ms", "20000"),
            ],
        );
        let batch: Vec<Value> = (0..48)
            .map(|i| json!({"deviceId": format!("{tag}-{i}"), "temperature": 40}))
            .collect();
        let started = Instant::now();
        let answer = post_telemetry(&app, &json!(batch));
        let took = started.elapsed();
        assert_eq!(answer.status, 200, "{tag}: {}", answer.text);
        let decisions = answer.json["decisions"].as_array().unwrap();
        assert_eq!(decisions.len(), 48);
        for d in decisions {
            assert_eq!(d["decision"], "notified", "{tag}: {d}");
        }
        assert!(
            took < Duration::from_secs(20),
            "{tag}: the decision took {took:?}"
        );
        app.assert_no_trap();
        assert_eq!(
            stub.seen().iter().filter(|s| s.method == "POST").count(),
            48,
            "{tag}: every notification reached the webhook"
        );
    }
}
