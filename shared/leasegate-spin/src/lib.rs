//! Write Spin functions that do their work once across every deployment: the toolkit on which
//! leasegate's own functions are built, for gated functions of your own ("at most once per order
//! per hour", "only on the leader", "once per occurrence").
//!
//! A handler is plain async Rust over a [`Context`] (its transport, settings, clock, lease ids
//! and cache) and [`leasegate::Request`]/[`leasegate::Response`] values, so the same code runs
//! as a Spin component (through [`spin::SpinEnv`] and the [`spin::serve`] entry point) and in
//! native unit tests (with a `HashMap` of variables and a scripted transport). Locks are the
//! [`leasegate`] core's: Azure Blob Storage leases over signed REST, with fencing tokens.
//!
//! * [`auth`]: bearer tokens, checked before any other setting is read.
//! * [`config`]: settings from Spin variables (storage account, container, thresholds), with
//!   errors that name variables, never their values.
//! * [`web`]: JSON answers, content-type and size checks.
//! * [`leader`]: the verb "am I the leader for this term".
//! * [`once`]: the verbs "run this at most once per key per window" and "run this once,
//!   ever", their outcomes and their HTTP answers.
//! * [`occurrence`]: the verb "run this at most once per occurrence of a schedule" ("send the
//!   digest at 08:00 Berlin time on weekdays, once"), its outcome and its HTTP answer.
//! * [`fence`]: the verbs "write this blob" and "commit this table batch", fenced: storage
//!   refuses a stale holder's write.
//! * [`record`]: the occurrence record as stored (a reservation's metadata and body, a job's
//!   log), one schema for the verb, scheduled-job and the CLI.
//! * [`storage`]: storage steps more than one function takes.
//! * [`cache`]: the key-value store: every entry's key, and the gate cache (a refusal answered
//!   without a storage round trip).
//! * [`token`]: Entra ID bearer tokens kept between invocations in the key-value store.
//! * [`schedule`]: when a job's occurrences are: cron expressions in a time zone, intervals.
//! * [`timer`]: ticks (Spin's cron trigger, the Azure Functions timer envelope, HTTP ticks).
//! * [`spin`]: the Spin side, on spin-sdk: outbound HTTP (with a timeout), variables, the
//!   key-value store, reading the incoming request with a size cap, and the entry points.
//!
//! # Example: a gated handler, run natively
//! `POST /api/orders/{id}/ship` ships an order at most once per hour across every deployment
//! and hands the shipment the lock's fencing token; a caller that loses answers 429 with
//! `Retry-After`. The test below runs it with no storage reachable.
//! ```
//! use std::collections::HashMap;
//! use std::time::{Duration, SystemTime};
//!
//! use leasegate::{LeaseId, Method, Request, Response, StatusCode, Transport};
//! use leasegate_spin::once::{self, once_per_window};
//! use leasegate_spin::{auth, config, web, Context};
//!
//! async fn ship<T: Transport>(ctx: &Context<'_, T>, request: Request) -> Response {
//!     // Authenticate first: an unauthenticated caller learns nothing of the setup.
//!     if let Err(refusal) = auth::authenticate(ctx.variables, "ship_token", "ship_auth", &request) {
//!         return refusal;
//!     }
//!     let order = match once::key_in_path(&request, "/api/orders/", "/ship") {
//!         Ok(order) => order,
//!         Err(not_found_or_bad_id) => return not_found_or_bad_id,
//!     };
//!     let storage = match config::storage(ctx.variables) {
//!         Ok(storage) => storage,
//!         Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
//!     };
//!     let transport = (ctx.connect)(storage.timeout);
//!     let locks = storage.locks(&transport, "orders/");
//!     let hour = Duration::from_secs(3600);
//!     let shipped = once_per_window(ctx, &locks, &order, hour, async |fencing_token| {
//!         // ... call the shipping webhook here, handing it `fencing_token` ...
//!         Ok::<u64, String>(fencing_token)
//!     });
//!     // 200 ran, 429 with Retry-After (busy or throttled), 502 failed, 503 storage down.
//!     once::answer(order.as_str(), shipped.await)
//! }
//!
//! // A native test: settings from a HashMap, and a transport whose storage is down.
//! struct Down;
//! impl Transport for Down {
//!     async fn send(&self, _: Request) -> Result<Response, leasegate::TransportError> {
//!         let kind = leasegate::TransportErrorKind::Connect;
//!         Err(leasegate::TransportError::new(kind, "connection refused"))
//!     }
//! }
//! let variables: HashMap<String, String> = [
//!     ("ship_token", "t0ken"),
//!     ("storage_account", "devstoreaccount1"),
//!     ("storage_key", leasegate::DEV_ACCOUNT_KEY),
//!     ("storage_origin", "http://127.0.0.1:10000"),
//! ]
//! .into_iter()
//! .map(|(k, v)| (k.to_string(), v.to_string()))
//! .collect();
//! let ctx = Context {
//!     connect: &|_timeout| Down,
//!     variables: &variables,
//!     now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_096_800),
//!     new_lease_id: &|| LeaseId::from_random_bytes([7; 16]),
//!     sleep: &|_| Box::pin(async {}),
//!     cache: &leasegate_spin::cache::NoCache,
//!     log_decisions: false,
//! };
//! let request = Request::new(Method::POST, "/api/orders/o-17/ship");
//! let answer = pollster::block_on(ship(&ctx, request.clone()));
//! assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
//!
//! let request = request.with_header("authorization", "Bearer t0ken");
//! let answer = pollster::block_on(ship(&ctx, request));
//! assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE); // nothing was shipped
//! assert_eq!(answer.headers().get("retry-after"), Some("1"));
//! ```
//! In a component crate (`crate-type = ["cdylib", "rlib"]`), the entry point is one line,
//! compiled for `wasm32-wasip2` only so that `cargo test` runs the handler natively (the
//! crate depends on `spin-sdk` for the attribute):
//! ```
//! # use leasegate::{Request, Response, Transport};
//! # async fn handle<T: Transport>(_: &leasegate_spin::Context<'_, T>, _: Request) -> Response {
//! #     Response::new(leasegate::StatusCode::OK)
//! # }
//! #[cfg(target_arch = "wasm32")]
//! #[spin_sdk::http_component]
//! async fn handle_request(
//!     request: spin_sdk::http::IncomingRequest,
//!     out: spin_sdk::http::ResponseOutparam,
//! ) {
//!     // The handler, and the request body cap (413 beyond).
//!     leasegate_spin::spin::serve(request, out, 1 << 20, handle).await
//! }
//! ```
//!
//! # Versions
//! The Spin side is built on spin-sdk 5.2 and its WASI 0.2 bindings (`wasi:http@0.2.0`,
//! target `wasm32-wasip2`): WASI 0.2 runs on every host this project deploys to (Spin 3 and
//! 4.0, SpinKube's shim, Fermyon's platforms). spin-sdk 7 targets WASI 0.3 final, which only
//! Spin's main branch runs so far, and spin-sdk 6 a WASI 0.3 release candidate. The move to 7.x
//! is meant to touch this crate and each component's small entry point, nothing else.
#![deny(missing_docs)]
// Handlers' helpers return `Err(leasegate::Response)`: the finished 4xx answer, once per request.
#![allow(clippy::result_large_err)]

// The README's examples are compiled and run as doctests too.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// So are the recipes (docs/recipes.md): each a whole function a user would write.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/recipes.md")]
struct RecipesDoctests;

pub mod auth;
pub mod cache;
pub mod config;
pub mod fence;
pub mod held;
pub mod leader;
pub mod occurrence;
pub mod once;
pub mod record;
pub mod schedule;
pub mod spin;
pub mod storage;
pub mod timer;
pub mod token;
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
    /// Whether the toolkit's verbs ([`once::once_per_window`], [`once::once_ever`],
    /// [`leader::lead`]) write one JSON log line per decision ([`log_decision`]); `true` in
    /// Spin. A function that logs each decision itself turns it off for its calls:
    /// `&Context { log_decisions: false, ..*ctx }`. ([`occurrence::once_per_occurrence`] takes
    /// no `Context` and always logs.)
    pub log_decisions: bool,
}

impl<T> Clone for Context<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Context<'_, T> {}

/// A pause: see [`Context::sleep`].
pub type Pause = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// What the export macros expand to in the component crates.
#[doc(hidden)]
pub mod __private {
    pub use spin_executor;
    pub use spin_sdk::wit_bindgen;
}

/// Writes one JSON log line to stdout. Callers put no secret in it. A line that cannot be
/// written is dropped: `println!` would panic, a trap in the component, possibly after the
/// request's side effects were done.
pub fn log_line(fields: impl serde::Serialize) {
    use std::io::Write;
    // Escaped as answers are (web::to_json): no raw control or reordering character in a log.
    let mut line = web::to_json(&fields);
    line.push(b'\n');
    let _ = std::io::stdout().lock().write_all(&line);
}

/// The log line of one decision of a toolkit verb, the shape of leasegate's own functions'
/// lines (never a secret):
/// `{"verb","key","instance"?,"decision","fencingToken"?,"storageRoundTrips","durationMs"}`.
/// `decision` is the outcome the answer names (`ran`, `busy`, `throttled`, `leader`, ...) or,
/// for a failure, its error code (`storage_unavailable`, `storage_forbidden`, ...).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision<'a> {
    /// The verb: `once_per_window`, `once_ever`, `lead`, `once_per_occurrence`.
    pub verb: &'a str,
    /// The key, group or occurrence decided on.
    pub key: &'a str,
    /// The caller's instance id, for the verbs that take one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<&'a str>,
    /// What was decided.
    pub decision: &'a str,
    /// The fencing token (or term) the decision handed out or saw, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<u64>,
    /// Storage requests the verb sent (the work's own requests not counted).
    pub storage_round_trips: u32,
    /// Milliseconds the verb took, the work included.
    pub duration_ms: u64,
}

/// Writes `decision`'s log line when `enabled` (see [`Context::log_decisions`]).
pub fn log_decision(enabled: bool, decision: &Decision<'_>) {
    if enabled {
        log_line(decision);
    }
}

/// A verb's decision line ([`log_decision`]): what it decided, the storage requests it `sent`
/// and the time since it `started`.
pub(crate) fn log_verb(
    enabled: bool,
    verb: &str,
    key: &str,
    instance: Option<&str>,
    (decision, fencing_token): (&str, Option<u64>),
    sent: u32,
    started: std::time::Instant,
) {
    let line = Decision {
        verb,
        key,
        instance,
        decision,
        fencing_token,
        storage_round_trips: sent,
        duration_ms: elapsed_ms(started),
    };
    log_decision(enabled, &line);
}

/// Milliseconds since `start`, for log lines.
pub fn elapsed_ms(start: std::time::Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}
