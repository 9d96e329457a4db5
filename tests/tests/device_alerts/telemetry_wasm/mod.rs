//! device-alerts, as the release `.wasm` served by the real `spin up` from `spin.toml`, against
//! a real Azurite behind a counting, fault-injecting proxy, with notifications counted at a
//! webhook sink (behind a proxy of its own). Also an invocation deadline after which no device
//! is started, `Retry-After` growing with the kind of failure, and devices not on `device_ids`
//! costing nothing.

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{Acquiring, Locks, Term};
use leasegate::{LeaseId, LockName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{call, post_telemetry, App, TELEMETRY_AUTH};
use leasegate_tests::proxy::Fault;
use leasegate_tests::sink::Behaviour;
use leasegate_tests::{wait_for, Azurite};
use serde_json::{json, Value};

use crate::door::Door;

mod faults_and_logs;
mod webhooks;
mod windows;

fn reading(device: &str, temperature: f64) -> Value {
    json!({ "deviceId": device, "temperature": temperature })
}

fn decision(answer: &leasegate_tests::app::Answer, i: usize) -> &Value {
    &answer.json["decisions"][i]
}

/// Runs `f` (one decision at a time on `app`) and returns what it gave and how many requests
/// reached storage and the webhook meanwhile.
fn costs<T>(app: &App, f: impl FnOnce() -> T) -> (T, usize, usize) {
    let ((out, storage), webhook) = app.webhook.during(|| app.counted(f));
    (out, storage.len(), webhook.len())
}
