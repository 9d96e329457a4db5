//! What every component shares and the toolkit a user builds on, under the real `spin up`: the
//! answers' writes, pooled connections, the protocol seen from outside, the timer tokens,
//! variables from memory, storage requests per operation, shifted clocks, the `spin new`
//! templates, the examples (ship-once, daily-digest, ledger) and `scripts/dev.sh run`'s examples.
//!
//! One binary: `cargo test -p leasegate-tests --test toolkit`. A module per concern; its
//! name ends `_wasm` when its tests run the components under `spin up`.

mod clock_wasm;
mod daily_digest_wasm;
mod dev_examples_wasm;
mod ledger_wasm;
mod pooling_wasm;
mod protocol_wasm;
mod requests_per_operation_wasm;
mod responses_wasm;
mod ship_once_wasm;
mod template_wasm;
mod timer_tokens_wasm;
mod variables_wasm;
