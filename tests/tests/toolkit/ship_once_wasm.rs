//! The example `examples/ship-once` (a user's own function on `leasegate-spin`), built as
//! `.wasm` and served by two `spin up` instances of its own `spin.toml` at once, against one
//! Azurite container: each order ships once, whichever instance is asked.

use std::sync::Barrier;

use leasegate_tests::app::{bad, call, expect_clear_errors, Answer, App, Manifest, Setup};

const AUTH: (&str, &str) = ("authorization", "Bearer test-ship-token-2a6f");

fn ship(app: &App, order: &str) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/orders/{order}/ship")),
        &[AUTH],
        b"",
    )
}

/// Two deployments of the example sharing one container; both ship through the first's sink.
fn two_deployments() -> (App, App) {
    let setup = || Setup {
        manifest: Manifest::ShipOnce,
        ..Setup::default()
    };
    let a = App::start_with("ship", &[], setup());
    let b = App::start_with(
        "ship",
        &[("shipping_origin", &a.webhook.origin())],
        Setup {
            container: Some(a.container.clone()),
            ..setup()
        },
    );
    (a, b)
}

/// The losing call: 429 with `Retry-After` (whole seconds) and the same in its body.
fn assert_refused(answer: &Answer, order: &str) {
    assert_eq!(answer.status, 429, "{}", answer.text);
    let retry: u64 = answer.headers["retry-after"].parse().expect("Retry-After");
    assert!((1..=3600).contains(&retry), "{retry}");
    assert_eq!(answer.json["retryAfterSeconds"], retry);
    assert_eq!(answer.json["key"], order);
    let outcome = answer.json["outcome"].as_str().unwrap();
    assert!(["busy", "throttled"].contains(&outcome), "{outcome}");
}

#[test]
fn an_order_ships_once_across_two_deployments() {
    let (a, b) = two_deployments();
    // The same order to both deployments at once.
    let barrier = Barrier::new(2);
    let (first, second) = std::thread::scope(|s| {
        let one = s.spawn(|| {
            barrier.wait();
            ship(&a, "order-1")
        });
        let two = s.spawn(|| {
            barrier.wait();
            ship(&b, "order-1")
        });
        (one.join().unwrap(), two.join().unwrap())
    });
    let (won, lost) = if first.status == 200 {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(won.status, 200, "{}", won.text);
    assert_eq!(won.json["outcome"], "ran");
    assert_eq!(won.json["key"], "order-1");
    let token = won.json["fencingToken"].as_u64().expect("a fencing token");
    assert_refused(&lost, "order-1");
    // The webhook was called exactly once, with the order and the token.
    let calls = a.sink.received();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0].path, "/ship");
    assert_eq!(calls[0].body["order"], "order-1");
    assert_eq!(calls[0].body["fencingToken"], token);
    assert!(b.sink.received().is_empty());

    // Asked again within the hour, either deployment refuses it: the shipment is done (the
    // winner marked it), so for the rest of the hour, not "busy" for a minute.
    for app in [&a, &b] {
        let again = ship(app, "order-1");
        assert_refused(&again, "order-1");
        assert_eq!(again.json["outcome"], "throttled", "{}", again.text);
        let retry = again.json["retryAfterSeconds"].as_u64().unwrap();
        assert!(retry > 3500, "{retry}");
    }
    assert_eq!(a.sink.received().len(), 1);

    // Each decision logged its line, by the verb alone (the example writes no log line).
    let lines: Vec<serde_json::Value> = [&a, &b]
        .iter()
        .flat_map(|app| app.json_lines())
        .filter(|l| l["key"] == "order-1")
        .collect();
    assert_eq!(lines.len(), 4, "{lines:#?}");
    let ran: Vec<_> = lines.iter().filter(|l| l["decision"] == "ran").collect();
    assert_eq!(ran.len(), 1, "{lines:#?}");
    assert_eq!(ran[0]["verb"], "once_per_window");
    assert_eq!(ran[0]["fencingToken"], token);
    // The take (2 for an hour's lease record; the lock blob's and the container's first use
    // add their own) and the done mark (1, at the ETag the take left).
    let trips = ran[0]["storageRoundTrips"].as_u64().unwrap();
    assert!((4..=8).contains(&trips), "{trips}");
    assert!(ran[0]["durationMs"].is_u64());
    // A refusal is one HEAD; the concurrent loser may have raced the winner to the first use
    // (its create refused, a second HEAD; the container's create too) and found the work done
    // already, so it can be throttled with up to 4.
    let throttled: Vec<_> = lines
        .iter()
        .filter(|l| l["decision"] == "throttled")
        .collect();
    for line in &throttled {
        assert!(line.get("fencingToken").is_none(), "{line}");
        let n = line["storageRoundTrips"].as_u64().unwrap();
        assert!((1..=4).contains(&n), "{line}");
    }
    let single = throttled
        .iter()
        .filter(|l| l["storageRoundTrips"] == 1)
        .count();
    assert!(single >= 2, "{lines:#?}");

    // Another order ships on its own, with its own (larger) token.
    let other = ship(&b, "order-2");
    assert_eq!(other.status, 200, "{}", other.text);
    let token2 = other.json["fencingToken"].as_u64().unwrap();
    let calls = a.sink.received();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    assert_eq!(calls[1].body["order"], "order-2");
    assert_eq!(calls[1].body["fencingToken"], token2);
    a.assert_no_trap();
    b.assert_no_trap();
}

#[test]
fn a_webhook_that_refuses_leaves_the_order_to_ship_on_retry() {
    let (a, b) = two_deployments();
    a.sink.answer(503);
    let failed = ship(&a, "order-3");
    assert_eq!(failed.status, 502, "{}", failed.text);
    assert_eq!(failed.json["error"], "work_failed");
    assert_eq!(failed.json["released"], true);
    // The gate was given back: the retry (on the other deployment) ships.
    a.sink.answer(204);
    let shipped = ship(&b, "order-3");
    assert_eq!(shipped.status, 200, "{}", shipped.text);
    assert_eq!(a.sink.delivered().len(), 1);
    let calls = a.sink.received();
    assert_eq!(calls.len(), 2);
    // The retry repeats the idempotency key (the order), so a webhook that acted before it
    // failed can tell the retry is the same shipment; the fencing token rose.
    for call in &calls {
        assert_eq!(
            call.idempotency_key.as_deref(),
            Some("order-3"),
            "{calls:#?}"
        );
    }
    let tokens: Vec<u64> = calls
        .iter()
        .map(|c| c.body["fencingToken"].as_u64().unwrap())
        .collect();
    assert!(tokens[1] > tokens[0], "{tokens:?}");
}

#[test]
fn bad_input_gets_a_clear_json_error() {
    let (a, _b) = two_deployments();
    let long = format!("/api/orders/{}/ship", "x".repeat(300));
    let cases = [
        bad("POST", "/api/orders//ship", &[AUTH], b"", 400),
        bad("POST", &long, &[AUTH], b"", 400),
        bad("POST", "/api/orders/../ship", &[AUTH], b"", 400),
        bad("POST", "/api/orders/%ff/ship", &[AUTH], b"", 400),
        bad("POST", "/api/orders/order-9", &[AUTH], b"", 404),
        bad("GET", "/api/orders/order-9/ship", &[AUTH], b"", 405),
        bad("POST", "/api/orders/order-9/ship", &[], b"", 401),
        bad(
            "POST",
            "/api/orders/order-9/ship",
            &[("authorization", "Bearer wrong")],
            b"",
            401,
        ),
    ];
    expect_clear_errors(&a, &cases, &["test-ship-token-2a6f"]);
    // Nothing shipped.
    assert!(a.sink.received().is_empty());
}
