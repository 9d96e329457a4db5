//! Storage requests per operation, counted at the proxy between the real `spin up` and Azurite:
//! one test per row of docs/protocol.md's table "Requests per operation" (issue 34's table).
//! Each asserts **today's** count exactly (the counts are deterministic: one decision at a
//! time, and where the count depends on the storage server's second, the test waits for a
//! later second first), so a regression fails, and the reductions of issue 34 change only the
//! numbers here. Each test names the target in a comment and checks that the answer's
//! own `storageRoundTrips` (where it has one) says the same as the proxy.

use std::time::{Duration, SystemTime};

use leasegate::lease::{Acquire, Acquiring, LockStatus, Locks, Start, Term};
use leasegate::ops::{Condition, CreateContainer, Metadata, SetMetadata, WriteOutcome};
use leasegate::{ContainerName, LeaseId, LockName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{call, post_telemetry, Answer, App, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::jobs::{
    clear_of_a_clean_up, early_in_a_period, occurrence_of, tick, tick_naming_the_reserver, JOB,
};
use leasegate_tests::proxy::{Fault, Seen};
use leasegate_tests::sink::Behaviour;
use leasegate_tests::{next_second, unique_container, unix_now, unix_secs, wait_for};
use serde_json::json;

mod http;
mod timers;

const GATE_AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

/// One storage request as the docs name it: method, the blob below the container, and the
/// query's `comp`/`restype` and lease action.
fn describe(s: &Seen) -> String {
    let path = s.path().splitn(4, '/').nth(3).unwrap_or("");
    let query: Vec<&str> = s
        .target
        .split_once('?')
        .map(|(_, q)| {
            q.split('&')
                .filter(|p| p.starts_with("comp=") || p.starts_with("restype="))
                .collect()
        })
        .unwrap_or_default();
    let action = s
        .header("x-ms-lease-action")
        .map(|a| format!(" lease={a}"))
        .unwrap_or_default();
    format!("{} /{path}?{}{action}", s.method, query.join("&"))
}

/// Runs `f` (one operation) and asserts it made `expected` storage requests, listing them if
/// not; returns the answer.
fn expect_requests(app: &App, label: &str, expected: usize, f: impl FnOnce() -> Answer) -> Answer {
    let (answer, seen) = app.counted(f);
    let listed: Vec<String> = seen.iter().map(describe).collect();
    println!("{label}: {} storage requests: {listed:#?}", seen.len());
    assert_eq!(
        seen.len(),
        expected,
        "{label}: {listed:#?}\nanswer {} {}",
        answer.status,
        answer.text
    );
    answer
}

/// As [`expect_requests`] for an operation whose count is one fewer within one second of the
/// storage server's clock: a native lock's first holder (an id the call generated, no label)
/// has its claim written by the lock blob's create, by the `Date` of the read before it, and
/// only a grant in a later second writes it again. Started early in a second (waiting for the
/// next to begin); where a loaded machine still takes it into the next second, the one request
/// more is accepted only as that claim write, after requests that did cross a second.
fn expect_requests_in_a_second(
    app: &App,
    label: &str,
    expected: usize,
    f: impl FnOnce() -> Answer,
) -> Answer {
    next_second();
    let (answer, seen) = app.counted(f);
    let listed: Vec<String> = seen.iter().map(describe).collect();
    println!("{label}: {} storage requests: {listed:#?}", seen.len());
    let second = |s: &Seen| unix_secs(s.at);
    let crossed = seen.len() == expected + 1
        && seen.last().is_some_and(|last| {
            describe(last).starts_with("PUT ") && describe(last).contains("comp=metadata")
        })
        && seen.first().map(second) != seen.iter().rev().nth(1).map(second);
    assert!(
        seen.len() == expected || crossed,
        "{label}: expected {expected}: {listed:#?}\nanswer {} {}",
        answer.status,
        answer.text
    );
    answer
}

/// The app's container, created before the counted operation (so that it costs nothing there).
fn create_container(app: &App) {
    create(&app.container);
}

fn create(container: &ContainerName) {
    let locks = Locks::new(
        NativeTransport::default(),
        leasegate_tests::Azurite::shared().account(),
        container.clone(),
    );
    block_on(locks.client().execute(
        &CreateContainer {
            container: container.clone(),
        },
        SystemTime::now(),
    ))
    .expect("create the container");
}

/// The decision's own count (device-alerts logs and answers none per decision; its log line
/// has it): compared where the answer carries `storageRoundTrips`.
fn says(a: &Answer, n: usize) {
    assert_eq!(a.json["storageRoundTrips"], n, "{}", a.text);
}
