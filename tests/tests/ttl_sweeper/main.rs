//! ttl-sweeper, as the release `.wasm` under the real `spin up`, against Azurite: sweeps by
//! listing and by tags, moves, storage as it keeps blobs, the defaults.
//!
//! One binary: `cargo test -p leasegate-tests --test ttl_sweeper`. A module per concern; its
//! name ends `_wasm` when its tests run the components under `spin up`.

mod defaults_wasm;
mod moves_and_prefixes_wasm;
mod storage_wasm;
mod sweep_wasm;
mod tags_wasm;
