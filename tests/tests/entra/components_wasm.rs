//! Storage with Microsoft Entra ID tokens under the real `spin up`: the Azurite that checks
//! bearer tokens (`--oauth basic`, over HTTPS through the TLS proxy), tokens from the test's
//! token server as the managed identity endpoint or the client-credentials authority. Every
//! storage request carries `Bearer`, one token serves many invocations (kept in the key-value
//! store), a token nearing its expiry is replaced, a token storage refuses is asked anew once,
//! an endpoint that is down answers a clear 503 and sends nothing, and no secret shows. The
//! token requests of one invocation: one for a whole batch when the endpoint fails or hangs or
//! storage refuses the tokens, one for a short-lived token, none while a kept token still
//! valid serves through a failing early refresh, and a refused token never sent again.

use std::time::Duration;

use leasegate_tests::app::{call, post_telemetry, Answer, App, Entra};
use leasegate_tests::entra::{assert_all_bearer, TokenFault};
use leasegate_tests::proxy::Fault;
use leasegate_tests::wait_for;
use serde_json::json;

const AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

fn take_gate(app: &App, key: &str) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/gate/{key}?window=30")),
        &[AUTH],
        b"",
    )
}

/// A batch of `n` readings above the threshold, devices `{prefix}-{i}`.
fn batch(prefix: &str, n: usize) -> serde_json::Value {
    json!((0..n)
        .map(|i| json!({ "deviceId": format!("{prefix}-{i}"), "temperature": 40.0 }))
        .collect::<Vec<_>>())
}

#[test]
fn the_gate_takes_leases_with_a_managed_identity_token() {
    let app = App::start_entra("entra-gate", Entra::ManagedIdentity, &[]);
    let (a, seen) = app.counted(|| take_gate(&app, "k1"));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["acquired"], true, "{}", a.text);
    assert_all_bearer(&seen);
    // The identity endpoint was asked once, with its header.
    let asked = app.tokens().requests();
    assert_eq!(asked.len(), 1, "{asked:#?}");
    assert_eq!(asked[0].status, 200, "{asked:#?}");

    // The gate is held: another caller is refused by storage, which the token reached.
    let (b, seen) = app.counted(|| take_gate(&app, "k1"));
    assert_eq!(b.status, 429, "{}", b.text);
    assert_eq!(b.json["acquired"], false, "{}", b.text);
    assert_all_bearer(&seen);

    // One token across many invocations: it is kept in the key-value store.
    for i in 0..20 {
        let r = take_gate(&app, &format!("many-{i}"));
        assert_eq!(r.status, 200, "{}", r.text);
    }
    assert_eq!(app.tokens().token_count(), 1);
    app.assert_no_secret(&[&a, &b]);
    app.assert_no_trap();
}

#[test]
fn device_alerts_notify_once_with_a_client_secret_token() {
    let app = App::start_entra("entra-alerts", Entra::ClientSecret, &[("kv_cache", "off")]);
    let reading = json!({ "deviceId": "dev-entra", "temperature": 41.0 });
    let (first, seen) = app.counted(|| post_telemetry(&app, &reading));
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(
        first.json["decisions"][0]["decision"], "notified",
        "{}",
        first.text
    );
    assert_all_bearer(&seen);
    let (second, seen) = app.counted(|| post_telemetry(&app, &reading));
    assert_eq!(second.status, 200, "{}", second.text);
    assert_eq!(
        second.json["decisions"][0]["decision"], "throttled",
        "{}",
        second.text
    );
    // A hot decision: one storage request, no token request.
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_all_bearer(&seen);
    assert_eq!(app.sink.for_device("dev-entra").len(), 1);
    assert_eq!(app.tokens().token_count(), 1);
    app.assert_no_secret(&[&first, &second]);
}

#[test]
fn a_token_endpoint_that_is_down_answers_503_and_sends_nothing() {
    let app = App::start_entra("entra-down", Entra::ManagedIdentity, &[]);
    let reading = json!({ "deviceId": "dev-down", "temperature": 45.0 });
    // Busy, refusing, and slower than storage_timeout_ms (3 s here).
    for fault in [
        TokenFault::Status(503),
        TokenFault::Refuse,
        TokenFault::Delay(Duration::from_secs(6)),
    ] {
        let name = format!("{fault:?}");
        app.tokens().set_fault(Some(fault));
        let (a, seen) = app.counted(|| post_telemetry(&app, &reading));
        assert_eq!(a.status, 503, "{name}: {}", a.text);
        assert!(a.headers.contains_key("retry-after"), "{}", a.text);
        assert_eq!(a.json["error"], "token_unavailable", "{}", a.text);
        assert!(
            a.json["message"]
                .as_str()
                .unwrap()
                .contains("identity endpoint"),
            "{}",
            a.text
        );
        assert!(
            seen.is_empty(),
            "no storage request without a token: {seen:#?}"
        );
        let g = take_gate(&app, "down");
        assert_eq!(g.status, 503, "{}", g.text);
        assert_eq!(g.json["error"], "token_unavailable", "{}", g.text);
        app.assert_no_secret(&[&a, &g]);
    }
    assert!(app.sink.for_device("dev-down").is_empty());

    // Back: the next call works, and notifies once.
    app.tokens().set_fault(None);
    let a = post_telemetry(&app, &reading);
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["decisions"][0]["decision"], "notified", "{}", a.text);
    let b = post_telemetry(&app, &reading);
    assert_eq!(
        b.json["decisions"][0]["decision"], "throttled",
        "{}",
        b.text
    );
    assert_eq!(app.sink.for_device("dev-down").len(), 1);
}

#[test]
fn a_refused_client_secret_answers_502_naming_the_endpoints_code() {
    let app = App::start_entra(
        "entra-badsecret",
        Entra::ClientSecret,
        &[("entra_client_secret", "a-wrong-secret-value")],
    );
    let a = take_gate(&app, "k");
    assert_eq!(a.status, 502, "{}", a.text);
    assert_eq!(a.json["error"], "token_refused", "{}", a.text);
    let message = a.json["message"].as_str().unwrap();
    assert!(message.contains("invalid_client"), "{message}");
    assert!(message.contains("AADSTS7000215"), "{message}");
    assert!(!a.text.contains("a-wrong-secret-value"));
    assert!(!a.headers.contains_key("retry-after"));
    assert!(app.storage.seen().is_empty());
    app.assert_no_secret(&[&a]);
    for line in app.log_lines() {
        assert!(!line.contains("a-wrong-secret-value"), "{line}");
    }
}

#[test]
fn a_token_storage_refuses_is_asked_anew_once() {
    let app = App::start_entra("entra-refused", Entra::ManagedIdentity, &[]);
    // Tokens for another resource: storage refuses each (403 AuthenticationFailed).
    app.tokens().set_audience("https://vault.azure.net");
    let (a, seen) = app.counted(|| take_gate(&app, "k"));
    assert_eq!(a.status, 502, "{}", a.text);
    assert_eq!(a.json["error"], "storage_forbidden", "{}", a.text);
    assert_eq!(
        a.json["storageErrorCode"], "AuthenticationFailed",
        "{}",
        a.text
    );
    assert!(
        a.json["message"].as_str().unwrap().contains("access token"),
        "{}",
        a.text
    );
    // The refused token was dropped and a new one asked for, once: two tokens, two requests.
    assert_eq!(seen.len(), 2, "{seen:#?}");
    assert_eq!(app.tokens().token_count(), 2);

    // Storage accepts the endpoint's tokens again: the kept (refused) one is replaced once.
    app.tokens().clear_audience();
    let (b, seen) = app.counted(|| take_gate(&app, "k"));
    assert_eq!(b.status, 200, "{}", b.text);
    assert_eq!(b.json["acquired"], true, "{}", b.text);
    assert_all_bearer(&seen);
    assert_eq!(app.tokens().token_count(), 3);
    let c = take_gate(&app, "k2");
    assert_eq!(c.status, 200, "{}", c.text);
    assert_eq!(app.tokens().token_count(), 3);
    app.assert_no_secret(&[&a, &b, &c]);
}

#[test]
fn a_missing_role_and_shared_key_off_name_the_fix() {
    let app = App::start_entra("entra-role", Entra::ManagedIdentity, &[]);
    app.storage
        .set_fault(Some(Fault::Error(403, "AuthorizationPermissionMismatch")));
    let a = take_gate(&app, "k");
    assert_eq!(a.status, 502, "{}", a.text);
    assert_eq!(a.json["error"], "storage_forbidden", "{}", a.text);
    let message = a.json["message"].as_str().unwrap();
    assert!(
        message.contains("Storage Blob Data Contributor"),
        "{message}"
    );
    // A missing role is not cured by a new token: none was asked for.
    assert_eq!(app.tokens().token_count(), 1);

    app.storage.set_fault(Some(Fault::Error(
        403,
        "KeyBasedAuthenticationNotPermitted",
    )));
    let b = post_telemetry(
        &app,
        &json!({ "deviceId": "dev-role", "temperature": 50.0 }),
    );
    assert_eq!(b.status, 502, "{}", b.text);
    assert_eq!(b.json["error"], "storage_forbidden", "{}", b.text);
    let message = b.json["message"].as_str().unwrap();
    assert!(
        message.contains("Shared Key access is turned off"),
        "{message}"
    );
    assert!(message.contains("storage_auth"), "{message}");
    assert!(app.sink.for_device("dev-role").is_empty());
    app.storage.set_fault(None);
}

#[test]
fn a_token_nearing_its_expiry_is_replaced() {
    let app = App::start_entra("entra-expiry", Entra::ClientSecret, &[]);
    // Kept while more than 5 minutes are left: 20 s of use, then replaced.
    app.tokens().set_lifetime(Duration::from_secs(320));
    let a = take_gate(&app, "first");
    assert_eq!(a.status, 200, "{}", a.text);
    let b = take_gate(&app, "second");
    assert_eq!(b.status, 200, "{}", b.text);
    assert_eq!(
        app.tokens().token_count(),
        1,
        "the kept token served the second call"
    );
    app.tokens().set_lifetime(Duration::from_secs(3599));
    let mut n = 0;
    wait_for(
        "a new token once the kept one nears expiry",
        Duration::from_secs(90),
        || {
            n += 1;
            let r = take_gate(&app, &format!("later-{n}"));
            assert_eq!(r.status, 200, "{}", r.text);
            (app.tokens().token_count() == 2).then_some(())
        },
    );
    // The new one is kept in turn.
    let c = take_gate(&app, "after");
    assert_eq!(c.status, 200, "{}", c.text);
    assert_eq!(app.tokens().token_count(), 2);
}

#[test]
fn a_batch_and_concurrent_first_calls_share_their_tokens() {
    let app = App::start_entra(
        "entra-batch",
        Entra::ManagedIdentity,
        &[("kv_cache", "off")],
    );
    // A first invocation gating 24 devices at once (16 in flight): one token request.
    let batch: Vec<serde_json::Value> = (0..24)
        .map(|i| json!({ "deviceId": format!("batch-{i}"), "temperature": 40.0 }))
        .collect();
    let (a, seen) = app.counted(|| post_telemetry(&app, &json!(batch)));
    assert_eq!(a.status, 200, "{}", a.text);
    for d in a.json["decisions"].as_array().unwrap() {
        assert_eq!(d["decision"], "notified", "{}", a.text);
    }
    assert_all_bearer(&seen);
    assert_eq!(app.tokens().token_count(), 1);
    assert_eq!(app.sink.received().len(), 24);

    // Many invocations at once once a token is kept: no more token requests.
    std::thread::scope(|s| {
        for i in 0..8 {
            let app = &app;
            s.spawn(move || {
                let r = take_gate(app, &format!("concurrent-{i}"));
                assert_eq!(r.status, 200, "{}", r.text);
            });
        }
    });
    assert_eq!(app.tokens().token_count(), 1);
}

/// A bearer token (and a SAS) rides on every storage request as it is: a `storage_origin` at
/// plain http on another machine is refused before any token is asked for or any request sent
/// (review #1), naming the variable and the rule, never the secret.
#[test]
fn a_token_or_a_sas_is_never_sent_in_clear_to_another_machine() {
    let elsewhere = "http://acct.blob.core.windows.net";
    for entra in [Entra::ManagedIdentity, Entra::ClientSecret] {
        let app = App::start_entra("entra-clear", entra, &[("storage_origin", elsewhere)]);
        let a = take_gate(&app, "k");
        assert_eq!(a.status, 503, "{}", a.text);
        assert_eq!(a.json["error"], "not_configured", "{}", a.text);
        let message = a.json["message"].as_str().unwrap();
        assert!(
            message.contains("storage_origin: a bearer token")
                && message.contains("only over https"),
            "{message}"
        );
        assert_eq!(app.tokens().count(), 0, "a token was asked for");
        assert_eq!(app.storage.count(), 0, "a storage request was sent");
        app.assert_no_secret(&[&a]);
    }
    // A SAS: the same rule.
    let sas =
        "sv=2021-12-02&ss=b&srt=sco&sp=rwdlac&se=2099-01-01T00:00:00Z&sig=c2FzLXNlY3JldA%3D%3D";
    let app = App::start(
        "sas-clear",
        &[("storage_origin", elsewhere), ("storage_sas", sas)],
    );
    let a = take_gate(&app, "k");
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "not_configured", "{}", a.text);
    assert!(a.text.contains("storage_origin: a SAS"), "{}", a.text);
    assert!(!a.text.contains("c2FzLXNlY3JldA"), "{}", a.text);
    assert!(!app.spin.stderr().contains("c2FzLXNlY3JldA"));
    assert_eq!(app.storage.count(), 0, "a storage request was sent");
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
