//! The gate API and bad input to both functions, as `.wasm` served by the real `spin up`: the
//! gate key from the request's own path (never a client's `spin-path-info`), lease ids (never
//! revealed by a holder name, never computed from it, never shared with the leader's, derived
//! only with `lease_id_secret`), format characters kept out of keys and device ids, and a
//! `lock_unusable` answer naming a command that works.

use std::time::Duration;

use leasegate::lease::Locks;
use leasegate::ops::{GetProperties, Metadata, SetMetadata};
use leasegate::LockName;
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{
    call, post_telemetry, Answer, App, GATE_TOKEN, TELEMETRY_AUTH, TELEMETRY_TOKEN, TIMER_AUTH,
};
use leasegate_tests::proxy::{Fault, Proxy};
use leasegate_tests::Azurite;
use serde_json::{json, Value};

mod bad_input;
mod contract;
mod holders;

const AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

fn gate(app: &App, method: &str, path_and_query: &str, headers: &[(&str, &str)]) -> Answer {
    call(
        method,
        &app.url(&format!("/api/gate/{path_and_query}")),
        headers,
        b"",
    )
}

/// The metadata of the lock blob of `lock` under `prefix`, read straight from Azurite.
fn metadata(app: &App, prefix: &str, lock: &str) -> Metadata {
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix(prefix);
    let blob = locks.blob_name(&LockName::try_new(lock).unwrap()).unwrap();
    let (props, _) = block_on(locks.client().execute(
        &GetProperties {
            container: app.container.clone(),
            blob,
        },
        std::time::SystemTime::now(),
    ))
    .unwrap();
    props.expect("the lock blob exists").metadata
}
