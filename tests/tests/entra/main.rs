//! Microsoft Entra ID tokens: the harness (an Azurite that checks bearer tokens, a token
//! service), the components and the timer functions under the real `spin up`, and the CLI.
//!
//! One binary: `cargo test -p leasegate-tests --test entra`. A module per concern; its
//! name ends `_wasm` when its tests run the components under `spin up`.

mod cli;
mod components_wasm;
mod functions_wasm;
mod harness;
