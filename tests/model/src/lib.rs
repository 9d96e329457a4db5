//! A model checker over the project's own code: the lease core's [`Locks`](leasegate::lease::Locks)
//! and the scheduled job's tick, run as they are, against a small storage model
//! ([`storage`]) and a network whose every answer is the checker's choice ([`world`]), with
//! [stateright] exploring every interleaving up to a bound.
//!
//! * [`lease`]: the claim protocol (native leases and lease records on one blob, tokens, lost
//!   answers, expiry by the storage clock).
//! * [`fence`]: fenced writes (a blob under its tag condition, a table batch under its fence
//!   entity's `If-Match`), by holders of one lock with rising tokens, all at once.
//! * [`job`]: the job's reservation protocol (reservation, outcome compare-and-swap with a
//!   nonce, retries and takeover).
//! * [`storage`]: the Blob service (and, in [`table`], the Table service) the callers talk to
//!   (from `leasegate-test-support`, `tests/support`).
//! * [`trace`]: a counterexample, step by step; [`run`]: a check and its report.
//!
//! What is modeled and what is not, and the bounds: `docs/protocol.md`, "The model checker".

pub mod fence;
pub mod job;
pub mod lease;
pub mod run;
pub mod trace;
pub mod world;

// The storage model lives in the test-support crate (the functions' native tests use it too);
// its modules keep their paths here.
pub use leasegate_test_support::{storage, table, tags, wire};
