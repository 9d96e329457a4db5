//! The toolkit for leasegate's Spin functions: what every gated function needs.
//!
//! * [`auth`]: bearer tokens, checked before any other setting is read.
//! * [`config`]: settings from Spin variables (storage account, container, thresholds), with
//!   errors that name variables, never their values.
//! * [`web`]: JSON answers, content-type and size checks.
//! * [`leader`]: the verb "am I the leader for this term".
//! * [`once`]: the verbs "run this at most once per key per window" and "run this once,
//!   ever", their outcomes and their HTTP answers.
//! * [`storage`]: storage steps more than one function takes.
//! * [`timer`]: ticks (Spin's cron trigger, the Azure Functions timer envelope, HTTP ticks).
//! * [`spin`]: the Spin side, on spin-sdk: outbound HTTP (with a timeout), variables, the
//!   key-value store, reading the incoming request with a size cap, and the entry points.
#![deny(missing_docs)]
// Handlers' helpers return `Err(leasegate::Response)`: the finished 4xx answer, once per request.
#![allow(clippy::result_large_err)]

pub mod auth;
pub mod cache;
pub mod config;
pub mod leader;
pub mod once;
pub mod spin;
pub mod storage;
pub mod timer;
pub mod web;

use std::time::{Duration, SystemTime};

use leasegate::LeaseId;

/// What a handler needs from its surroundings, so that the same logic runs in Spin and in
/// native unit tests.
pub struct Context<'a, T> {
    /// Makes the outbound HTTP transport (storage and webhooks) with the configured timeout
    /// per request (`storage_timeout_ms`, read once with the other settings).
    pub connect: &'a dyn Fn(Duration) -> T,
    /// Settings.
    pub variables: &'a dyn config::Variables,
    /// When the invocation began, by the caller's clock: the gate cache's time, and the date
    /// of storage requests only where the transport has no clock (the Spin transport dates each
    /// request when it sends it: [`leasegate::Transport::now`]).
    pub now: SystemTime,
    /// A source of fresh lease ids (per-event ids for throttles).
    pub new_lease_id: &'a dyn Fn() -> LeaseId,
    /// Waits without blocking the invocation's other work (a short pause before asking a busy
    /// lock again).
    pub sleep: &'a dyn Fn(Duration) -> Pause,
    /// The key-value store the gate cache lives in (see [`cache`]).
    pub cache: &'a dyn cache::Cache,
}

/// A pause: see [`Context::sleep`].
pub type Pause = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// What the export macros expand to in the component crates.
#[doc(hidden)]
pub mod __private {
    pub use spin_executor;
    pub use spin_sdk::wit_bindgen;
}

/// Writes one JSON log line to stdout. Callers put no secret in it.
pub fn log_line(fields: impl serde::Serialize) {
    if let Ok(line) = serde_json::to_string(&fields) {
        println!("{line}");
    }
}

/// Milliseconds since `start`, for log lines.
pub fn elapsed_ms(start: std::time::Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}
