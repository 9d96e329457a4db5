//! "Run this at most once per key per window" ([`once_per_window`]) and "run this once, ever"
//! ([`once_ever`], an initialization), across every deployment of an app, each handing the
//! work a fencing token and returning an outcome value ([`Once`], [`Ever`]) that [`answer`] /
//! [`answer_ever`] turn into HTTP answers in one place.
//!
//! [`once_per_window`] takes the key's lock for the window (a native lease for 15 to 60 s, a
//! lease record for any other length up to a year: [`Term::for_window`](leasegate::lease::Term::for_window)) with a fresh lease
//! id, runs the work with the lock's fencing token, and keeps the lock for the rest of the
//! window: every other call for the key in that window, in this deployment or another, is
//! refused without running anything. Work that fails (returns `Err`) gives the lock back, so
//! a retry can run it; return `Err` only when the work certainly did not happen.
//!
//! The outcome says what happened ([`Once`]), and [`answer`] is the one place that turns it
//! into an HTTP answer: 200 for the call that ran, **429 with `Retry-After`** for every call
//! that lost, whichever way the race fell: `busy` while the work may still be running
//! elsewhere (come back when it has settled: it may fail and give the lock back), `throttled`
//! once it is done (the holder marks the lock when its work returns `Ok`: come back when the
//! window ends).
//!
//! Every call writes one JSON log line (see [`crate::Decision`]): the key, the decision, the
//! fencing token, the storage requests and the time taken.
//!
//! Round trips: a refused call 1 (a HEAD); the call that runs 2 for a record (HEAD and
//! compare-and-swap) or 3 for a native lease, plus its work, plus 1 for the done mark (or 1
//! when failed work gives the lock back: each a request at the ETag the call's own last write
//! left, no HEAD first).
//!
//! # Example
//! ```
//! use std::time::Duration;
//! use leasegate::lease::Locks;
//! use leasegate::{LockName, Response, Transport};
//! use leasegate_spin::once::{self, once_per_window};
//! use leasegate_spin::Context;
//!
//! /// Sends the invoice of `order` at most once an hour, whatever calls us and however often.
//! async fn invoice<T, S: Transport>(ctx: &Context<'_, T>, locks: &Locks<S>, order: &str) -> Response {
//!     let key = match once::key(order) {
//!         Ok(key) => key,
//!         Err(bad_request) => return bad_request,
//!     };
//!     let outcome = once_per_window(ctx, locks, &key, Duration::from_secs(3600), async |fencing_token| {
//!         // The side effect, handed the token: the receiver refuses a token lower than the
//!         // highest it has seen, so a stale holder cannot act after its successor.
//!         Ok::<_, String>(fencing_token)
//!     })
//!     .await;
//!     // 200 {"key","outcome":"ran","fencingToken","output"}, or 429 with Retry-After.
//!     once::answer(key.as_str(), outcome)
//! }
//! ```

mod answer;
mod ever;
mod request;
mod window;

pub use answer::{answer, answer_ever};
pub use ever::{once_ever, once_ever_as, Ever};
pub use request::{key, key_in_path, post_json};
pub use window::{once_per_window, Once, RAN_TOKEN, RUNNING_FOR};

#[cfg(test)]
pub(crate) mod tests;
