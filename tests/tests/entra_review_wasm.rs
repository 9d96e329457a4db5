//! Review of issue 24 under the real `spin up`: the token requests of one invocation when the
//! token endpoint fails or storage refuses the tokens, when the token is short-lived, a kept
//! token still valid when its early refresh fails, and a refused token never sent again.

use std::time::Duration;

use leasegate_tests::app::{post_telemetry, App, Entra};
use leasegate_tests::entra::TokenFault;
use leasegate_tests::wait_for;
use serde_json::json;

/// A batch of `n` readings above the threshold, devices `{prefix}-{i}`.
fn batch(prefix: &str, n: usize) -> serde_json::Value {
    json!((0..n)
        .map(|i| json!({ "deviceId": format!("{prefix}-{i}"), "temperature": 40.0 }))
        .collect::<Vec<_>>())
}

#[test]
fn a_batch_asks_a_failing_token_endpoint_once() {
    let app = App::start_entra(
        "entra-review-down",
        Entra::ManagedIdentity,
        &[("kv_cache", "off"), ("storage_timeout_ms", "1000")],
    );
    app.tokens().set_fault(Some(TokenFault::Status(503)));
    let (a, seen) = app.counted(|| post_telemetry(&app, &batch("down", 24)));
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "token_unavailable", "{}", a.text);
    assert!(seen.is_empty(), "{seen:#?}");
    // The 16 requests in flight waited for the first one's token request: its failure is
    // theirs (each asking again in turn multiplies the wait on an endpoint that hangs).
    assert_eq!(app.tokens().count(), 1, "{:#?}", app.tokens().requests());

    // An endpoint that hangs past the timeout: one token request, so one timeout, for all.
    app.tokens()
        .set_fault(Some(TokenFault::Delay(Duration::from_secs(3))));
    let a = post_telemetry(&app, &batch("hung", 24));
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "token_unavailable", "{}", a.text);
    // The server records a delayed request once it has answered it.
    wait_for("the hung request recorded", Duration::from_secs(10), || {
        (app.tokens().count() >= 2).then_some(())
    });
    assert_eq!(app.tokens().count(), 2, "{:#?}", app.tokens().requests());
    assert!(app.sink.received().is_empty());
}

#[test]
fn a_batch_whose_tokens_storage_refuses_asks_anew_once() {
    let app = App::start_entra(
        "entra-review-refused",
        Entra::ManagedIdentity,
        &[("kv_cache", "off")],
    );
    // Tokens for another resource: storage refuses each.
    app.tokens().set_audience("https://vault.azure.net");
    let a = post_telemetry(&app, &batch("refused", 24));
    assert_eq!(a.status, 502, "{}", a.text);
    assert_eq!(a.json["error"], "storage_forbidden", "{}", a.text);
    // One token, refused; one new one for the whole batch, not one per refused request.
    assert_eq!(
        app.tokens().token_count(),
        2,
        "{:#?}",
        app.tokens().requests()
    );
    assert!(app.sink.received().is_empty());
}

#[test]
fn a_short_lived_token_serves_its_whole_invocation() {
    let app = App::start_entra("entra-review-short", Entra::ClientSecret, &[]);
    // Four minutes and a half to live: inside the five minutes of early refresh at once, yet
    // good for the few storage requests of an invocation.
    app.tokens().set_lifetime(Duration::from_secs(270));
    let a = post_telemetry(&app, &json!({ "deviceId": "short-1", "temperature": 40.0 }));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["decisions"][0]["decision"], "notified", "{}", a.text);
    assert_eq!(
        app.tokens().token_count(),
        1,
        "{:#?}",
        app.tokens().requests()
    );
}

#[test]
fn a_kept_token_still_valid_serves_while_its_early_refresh_fails() {
    let app = App::start_entra("entra-review-ahead", Entra::ClientSecret, &[]);
    // Inside the five minutes of early refresh at once: every invocation tries to replace it.
    app.tokens().set_lifetime(Duration::from_secs(270));
    let a = post_telemetry(&app, &json!({ "deviceId": "ahead-1", "temperature": 40.0 }));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(app.tokens().token_count(), 1);

    // The endpoint fails: the kept token, good for minutes more, still serves.
    app.tokens().set_fault(Some(TokenFault::Status(503)));
    let b = post_telemetry(&app, &json!({ "deviceId": "ahead-2", "temperature": 40.0 }));
    assert_eq!(b.status, 200, "{}", b.text);
    assert_eq!(b.json["decisions"][0]["decision"], "notified", "{}", b.text);
    assert_eq!(app.sink.for_device("ahead-2").len(), 1);
    assert_eq!(app.tokens().token_count(), 1);

    // Back: the next invocation replaces it.
    app.tokens().set_fault(None);
    let c = post_telemetry(&app, &json!({ "deviceId": "ahead-3", "temperature": 40.0 }));
    assert_eq!(c.status, 200, "{}", c.text);
    assert_eq!(app.tokens().token_count(), 2);
}

#[test]
fn a_refused_token_is_not_sent_again_when_no_new_one_can_be_had() {
    let app = App::start_entra(
        "entra-review-dropped",
        Entra::ManagedIdentity,
        &[("kv_cache", "off")],
    );
    // A token storage refuses is kept (the new one asked for is refused too)...
    app.tokens().set_audience("https://vault.azure.net");
    let a = post_telemetry(
        &app,
        &json!({ "deviceId": "dropped-0", "temperature": 40.0 }),
    );
    assert_eq!(a.status, 502, "{}", a.text);
    assert_eq!(app.tokens().token_count(), 2);

    // ... then the endpoint fails. The 16 requests in flight go with the kept token and are
    // refused; no new token can be had, and the other 8 devices do not send the refused one.
    app.tokens().set_fault(Some(TokenFault::Status(503)));
    let (b, seen) = app.counted(|| post_telemetry(&app, &batch("dropped", 24)));
    assert_eq!(b.status, 503, "{}", b.text);
    assert_eq!(seen.len(), 16, "{seen:#?}");
    assert!(app.sink.received().is_empty());
}
