//! leader, as the release `.wasm` under the real `spin up`, against Azurite.
//!
//! One binary: `cargo test -p leasegate-tests --test leader`. A module per concern; its
//! name ends `_wasm` when its tests run the components under `spin up`.

mod leader_wasm;
