//! The `leasegate` CLI: its commands, the locks the functions take, `leasegate status` against
//! the app under the real `spin up`.
//!
//! One binary: `cargo test -p leasegate-tests --test cli`. A module per concern; its
//! name ends `_wasm` when its tests run the components under `spin up`.

mod commands;
mod locks;
mod overview_wasm;
mod status_wasm;
