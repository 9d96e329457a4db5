//! Guest bindings of the Spin interfaces leasegate's components import:
//! `fermyon:spin/variables@2.0.0` and `fermyon:spin/key-value@2.0.0`, the same interfaces (from
//! the same WIT) spin-sdk 5.2 binds, generated with the wit-bindgen it uses. Only these two:
//! spin-sdk's whole surface is far more code in a component than the few calls made.
//!
//! `wit_bindgen` is re-exported for the cron trigger's export, which each component generates
//! (see `leasegate_spin::cron_export!`).

wit_bindgen::generate!({
    path: "wit/spin.wit",
    world: "imports",
});

pub use fermyon::spin::{key_value, variables};
#[doc(hidden)]
pub use wit_bindgen;
