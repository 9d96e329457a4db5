//! device-alerts, as the release `.wasm` under the real `spin up`, against Azurite behind a
//! counting, fault-injecting proxy: one notification per device per window, odd storage and
//! webhook answers, storage over TLS, the gate cache in Spin's key-value store.
//!
//! One binary: `cargo test -p leasegate-tests --test device_alerts`. A module per concern; its
//! name ends `_wasm` when its tests run the components under `spin up`.

mod cache_wasm;
mod door;
mod outbound_bodies_wasm;
mod storage_answers_wasm;
mod telemetry_wasm;
mod tls_wasm;
