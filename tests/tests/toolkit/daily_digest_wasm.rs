//! The example `examples/daily-digest` (a verb per occurrence of a schedule, on
//! `leasegate-spin`), built as `.wasm` and served by two `spin up` instances of its own
//! `spin.toml` at once, against one Azurite container, on a schedule of every 5 seconds in UTC
//! (the shipped one is 08:00 Berlin time on weekdays): each occurrence is sent once, whichever
//! deployment is ticked and however often.

use std::sync::Barrier;
use std::time::{Duration, SystemTime};

use leasegate_tests::app::{bad, call, expect_clear_errors, Answer, App, Manifest, Setup};

const AUTH: (&str, &str) = ("authorization", "Bearer test-digest-token-8c5d");
const EVERY: u64 = 5;

fn tick(app: &App) -> Answer {
    call("POST", &app.url("/api/digest/tick"), &[AUTH], b"")
}

/// Two deployments of the example (`node-a`, `node-b`) sharing one container; both send
/// through the first's sink.
fn two_deployments() -> (App, App) {
    let schedule = [
        ("digest_schedule", "*/5 * * * * *"),
        ("digest_time_zone", "UTC"),
    ];
    let setup = || Setup {
        manifest: Manifest::DailyDigest,
        ..Setup::default()
    };
    let a = App::start_with(
        "digest",
        &[&schedule[..], &[("instance_id", "node-a")]].concat(),
        setup(),
    );
    let origin = a.webhook.origin();
    let b = App::start_with(
        "digest",
        &[
            &schedule[..],
            &[("instance_id", "node-b"), ("digest_origin", &origin)],
        ]
        .concat(),
        Setup {
            container: Some(a.container.clone()),
            ..setup()
        },
    );
    (a, b)
}

fn unix_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

/// Sleeps until 2 s before the next occurrence of the schedule (at least 1 s from now) and
/// returns that occurrence's Unix second: a tick from then until 2.5 s after the occurrence
/// names it (the verb's tolerance is half the gap, 2.5 s, for a tick that comes early).
fn two_seconds_before_an_occurrence() -> u64 {
    let now = unix_ms();
    let mut next = (now / 1000 / EVERY + 1) * EVERY;
    while next * 1000 - 2000 < now + 1000 {
        next += EVERY;
    }
    std::thread::sleep(Duration::from_millis(next * 1000 - 2000 - now));
    next
}

#[test]
fn an_occurrence_is_sent_once_across_two_deployments() {
    let (a, b) = two_deployments();
    let occurrence = two_seconds_before_an_occurrence();
    // Both deployments ticked at once, 2 s early: both name the coming occurrence.
    let barrier = Barrier::new(2);
    let (first, second) = std::thread::scope(|s| {
        let one = s.spawn(|| {
            barrier.wait();
            tick(&a)
        });
        let two = s.spawn(|| {
            barrier.wait();
            tick(&b)
        });
        (one.join().unwrap(), two.join().unwrap())
    });
    let (won, lost) = if first.json["outcome"] == "ran" {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(won.status, 200, "{}", won.text);
    assert_eq!(won.json["outcome"], "ran", "{}", won.text);
    assert_eq!(won.json["fencingToken"], occurrence << 16, "{}", won.text);
    assert_eq!(lost.status, 200, "{}", lost.text);
    assert_eq!(lost.json["outcome"], "already_run", "{}", lost.text);
    assert_eq!(lost.json["occurrence"], won.json["occurrence"]);
    let reserved_by = lost.json["reservedBy"].as_str().unwrap().to_string();
    assert!(["node-a", "node-b"].contains(&reserved_by.as_str()));

    // The webhook was called exactly once, with the occurrence, its token and its key.
    let calls = a.sink.received();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0].path, "/digest");
    assert_eq!(calls[0].body["fencingToken"], occurrence << 16);
    assert_eq!(calls[0].body["occurrence"], won.json["localTime"]);
    let key = won.json["idempotencyKey"].as_str().unwrap();
    assert_eq!(calls[0].idempotency_key.as_deref(), Some(key));
    assert!(b.sink.received().is_empty());

    // Ticked again for the same occurrence, either deployment says it ran, and who ran it.
    for app in [&a, &b] {
        let again = tick(app);
        assert_eq!(again.status, 200, "{}", again.text);
        assert_eq!(again.json["outcome"], "already_run", "{}", again.text);
        assert_eq!(again.json["occurrence"], won.json["occurrence"]);
        assert_eq!(
            again.json["reservedBy"].as_str(),
            Some(reserved_by.as_str())
        );
        assert_eq!(again.json["run"], "succeeded", "{}", again.text);
    }
    assert_eq!(a.sink.received().len(), 1);

    // Each tick logged its decision, by the verb alone (the example writes no log line).
    let reservation = format!("digest/{occurrence:012}");
    let lines: Vec<serde_json::Value> = [&a, &b]
        .iter()
        .flat_map(|app| app.json_lines())
        .filter(|l| l["key"] == reservation.as_str())
        .collect();
    let decisions: Vec<&str> = lines
        .iter()
        .map(|l| l["decision"].as_str().unwrap())
        .collect();
    assert_eq!(
        decisions.iter().filter(|d| **d == "ran").count(),
        1,
        "{lines:#?}"
    );
    assert_eq!(
        decisions.iter().filter(|d| **d == "already_run").count(),
        3,
        "{lines:#?}"
    );
    let ran = lines.iter().find(|l| l["decision"] == "ran").unwrap();
    assert_eq!(ran["verb"], "once_per_occurrence");
    assert_eq!(ran["fencingToken"], occurrence << 16);
    assert_eq!(ran["instance"].as_str(), Some(reserved_by.as_str()));
    assert!(ran["storageRoundTrips"].as_u64().unwrap() >= 2, "{ran}");

    // The next occurrence is sent on its own, with a larger token and another key.
    let next = two_seconds_before_an_occurrence();
    let sent = tick(&b);
    assert_eq!(sent.json["outcome"], "ran", "{}", sent.text);
    assert_eq!(sent.json["fencingToken"], next << 16);
    let calls = a.sink.received();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    assert!(calls[1].body["fencingToken"].as_u64() > calls[0].body["fencingToken"].as_u64());
    assert_ne!(calls[1].idempotency_key, calls[0].idempotency_key);
    a.assert_no_trap();
    b.assert_no_trap();
}

#[test]
fn a_failed_send_is_not_retried_for_its_occurrence() {
    let (a, b) = two_deployments();
    a.sink.answer(503);
    let occurrence = two_seconds_before_an_occurrence();
    let failed = tick(&a);
    assert_eq!(failed.status, 502, "{}", failed.text);
    assert_eq!(failed.json["error"], "work_failed");
    assert_eq!(failed.json["fencingToken"], occurrence << 16);
    // At most once: the other deployment's tick of the occurrence sends nothing, and says why.
    a.sink.answer(204);
    let again = tick(&b);
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["outcome"], "already_run");
    assert_eq!(again.json["reservedBy"], "node-a");
    assert_eq!(again.json["run"], "failed");
    assert_eq!(a.sink.received().len(), 1);
    assert!(a.sink.delivered().is_empty());
}

#[test]
fn bad_input_and_settings_get_a_clear_json_error() {
    let setup = Setup {
        manifest: Manifest::DailyDigest,
        ..Setup::default()
    };
    let app = App::start_with("digest", &[("digest_time_zone", "Mars/Olympus")], setup);
    let cases = [
        bad("POST", "/api/digest/tick", &[], b"", 401),
        bad(
            "POST",
            "/api/digest/tick",
            &[("authorization", "Bearer wrong")],
            b"",
            401,
        ),
        bad("POST", "/api/digest/other", &[AUTH], b"", 404),
        bad("GET", "/api/digest/tick", &[AUTH], b"", 405),
        bad("POST", "/api/digest/tick", &[AUTH], b"", 503),
    ];
    expect_clear_errors(&app, &cases, &["test-digest-token-8c5d"]);
    let unconfigured = tick(&app);
    assert_eq!(unconfigured.json["error"], "not_configured");
    let message = unconfigured.json["message"].as_str().unwrap();
    assert!(message.contains("digest_time_zone"), "{message}");
    assert!(message.contains("Mars/Olympus"), "{message}");
    assert!(app.sink.received().is_empty());
}
