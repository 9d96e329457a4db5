//! scheduled-job, as `.wasm` served by the real `spin up`, against Azurite: every occurrence
//! runs exactly once across redundant deployments that tick through Spin's cron trigger (the
//! real plugin), through Azure Functions timer invocations and through HTTP ticks, with clocks
//! that disagree; the reservation log; clean-up; storage faults; overlap; failed jobs; bad
//! input.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::Locks;
use leasegate::ops::{Condition, GetBlob, ListBlobs, PutBlob};
use leasegate::BlobName;
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{
    bad, call, expect_clear_errors, Answer, App, Manifest, Setup, ADMIN_AUTH, GATE_TOKEN,
    TIMER_AUTH, TIMER_TOKEN,
};
use leasegate_tests::jobs::{azure_timer_payload, decisions};
use leasegate_tests::proxy::Fault;
use leasegate_tests::sink::Behaviour;
use leasegate_tests::{rfc3339_millis, unix_now};
use leasegate_tests::{wait_for, Azurite};
use serde_json::{json, Value};

mod deployments;
mod faults_and_input;

const JOB: &str = "example-job";

/// A second-level schedule for the cron plugin, and the period that matches it.
const EVERY_2S: (&str, &str) = ("scheduled-job", "*/2 * * * * *");

/// An Azure Functions timer invocation body for a trigger time (a job every minute).
fn azure_payload(secs: u64, millis: u64, past_due: bool) -> Vec<u8> {
    azure_timer_payload(secs - 60, secs, secs * 1000 + millis, past_due)
}

/// What one deployment's tick came to: the decision and who reserved it.
#[derive(Debug, Clone)]
struct Tick {
    decision: String,
    reserved_by: Option<String>,
}

/// An HTTP tick (`POST /api/jobs/{job}/tick`) for a trigger time the test chose: a manual run
/// (the admin token), since the tick token names only the occurrence due now.
fn tick_http(app: &App, secs: u64, millis: u64) -> Answer {
    tick_http_as(app, secs, millis, ADMIN_AUTH)
}

/// An HTTP tick with the `auth` header (the admin token's for an occurrence more than
/// `job_early_seconds` before the current one: a manual run of a past occurrence).
fn tick_http_as(app: &App, secs: u64, millis: u64, auth: (&'static str, &'static str)) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/jobs/{JOB}/tick")),
        &[auth, ("content-type", "application/json")],
        json!({"at": rfc3339_millis(secs, millis)})
            .to_string()
            .as_bytes(),
    )
}

fn tick_azure(app: &App, secs: u64, millis: u64) -> Answer {
    call(
        "POST",
        &app.url("/scheduled-job"),
        &[("content-type", "application/json")],
        &azure_payload(secs, millis, false),
    )
}

fn job_posts(apps: &[App]) -> Vec<Value> {
    apps.iter()
        .flat_map(|a| a.sink.received())
        .filter(|r| r.path == "/job")
        .map(|r| r.body)
        .collect()
}

fn locks(container: &leasegate::ContainerName) -> Locks<NativeTransport> {
    Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        container.clone(),
    )
}

/// Creates a reservation blob directly, as an earlier run long ago would have.
fn old_reservation(container: &leasegate::ContainerName, occurrence: u64) {
    let locks = locks(container);
    let blob = BlobName::try_new(&format!("jobs/{JOB}/occurrences/{occurrence:012}")).unwrap();
    block_on(locks.client().execute(
        &leasegate::ops::CreateContainer {
            container: container.clone(),
        },
        SystemTime::now(),
    ))
    .unwrap();
    block_on(
        locks.client().execute(
            &PutBlob::block(container.clone(), blob, b"{}".to_vec())
                .with_condition(Condition::IfNotExists),
            SystemTime::now(),
        ),
    )
    .unwrap();
}

fn reservations(container: &leasegate::ContainerName) -> Vec<u64> {
    let list = ListBlobs {
        prefix: Some(format!("jobs/{JOB}/occurrences/")),
        ..ListBlobs::new(container.clone())
    };
    let (page, _) = block_on(locks(container).client().execute(&list, SystemTime::now())).unwrap();
    page.blobs
        .iter()
        .map(|b| b.name.rsplit('/').next().unwrap().parse().unwrap())
        .collect()
}

/// The reservation log blob (`jobs/{job}/log.json`), read from storage directly (a cron-only
/// app serves no HTTP).
fn stored_log(container: &leasegate::ContainerName) -> Value {
    let get = GetBlob {
        container: container.clone(),
        blob: BlobName::try_new(&format!("jobs/{JOB}/log.json")).unwrap(),
    };
    let (blob, _) = block_on(locks(container).client().execute(&get, SystemTime::now())).unwrap();
    let blob = blob.expect("the reservation log exists");
    serde_json::from_slice(&blob.body).expect("the log is JSON")
}
