//! init-once, as the release `.wasm` under the real `spin up`, against Azurite: many callers,
//! one initialization; what a caller is told when storage fails after it ran.
//!
//! One binary: `cargo test -p leasegate-tests --test init_once`. A module per concern; its
//! name ends `_wasm` when its tests run the components under `spin up`.

mod callers_wasm;
mod storage_fails_wasm;
