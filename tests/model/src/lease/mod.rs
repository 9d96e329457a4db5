//! The claim protocol: callers running the core's own [`Locks`] on one lock, native leases and
//! lease records mixed, over the model's storage and network.
//!
//! Its parts: the bounds CI checks (`bounds.rs`), a caller's run (`caller.rs`), the protocol as
//! the world runs it (`protocol.rs`: storage at the start, the faults' and the clock's limits,
//! the planted mistakes, the notes filled in) and its properties (`properties.rs`); the callers,
//! their steps and what they saw here.

mod bounds;
mod caller;
mod properties;
mod protocol;

use std::time::Duration;

use leasegate::lease::{IdOrigin, Term};
use leasegate::LeaseDuration;

// What the docs' links name.
#[cfg(doc)]
use leasegate::lease::{Acquired, Locks, Start};

pub use crate::world::START;
pub use protocol::holders;

/// The container the lock lives in.
pub const CONTAINER: &str = "leasegate";

/// The lock's blob.
pub const LOCK_BLOB: &str = "locks/l";

/// How a caller takes the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    /// A native lease of this many seconds.
    Native(u8),
    /// A lease record of this many seconds.
    Record(u64),
}

impl Window {
    fn term(self) -> Term {
        match self {
            Window::Native(s) => {
                Term::Native(LeaseDuration::try_from_secs(i64::from(s)).expect("15 to 60 seconds"))
            }
            Window::Record(s) => Term::Record(Duration::from_secs(s)),
        }
    }
}

/// One step of a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Acquire (or extend) the lock.
    Acquire,
    /// Acquire again, from what it kept of its last grant ([`Start::Held`]): as
    /// [`Step::Acquire`] when it kept nothing.
    Extend,
    /// Release what it holds.
    Release,
    /// Wait a second of the model's clock (so that an extension's claim moves).
    Wait,
    /// Write what it keeps of its last grant ([`Acquired::held_state`]) to the blob
    /// [`KEPT_BLOB`], where every caller reads it (as a job's run keeps its lease in the job's
    /// log).
    Publish,
    /// Release what it holds, as [`Locks::release`] from [`Start::Acquired`] does, and write the state its
    /// release left to [`KEPT_BLOB`] (as a job's run keeps its released record in the log's
    /// last write).
    ReleasePublish,
    /// Read [`KEPT_BLOB`] and acquire from the state there, as a new holder
    /// ([`Start::Kept`], dated by the read's `Date`); as [`Step::Acquire`] when
    /// there is none.
    AcquireKept,
}

/// Where [`Step::Publish`] keeps a holder's state for the others.
pub const KEPT_BLOB: &str = "kept";

/// A caller: its window, where its lease id comes from, its clock, its steps.
#[derive(Debug, Clone)]
pub struct Caller {
    /// A name for traces.
    pub name: &'static str,
    /// Its window.
    pub window: Window,
    /// `Fresh`: a new random id per acquire; `Known`: one id it keeps.
    pub origin: IdOrigin,
    /// Its clock's offset from storage's, in seconds (its requests' `x-ms-date`).
    pub skew: i64,
    /// What it does, in order.
    pub steps: Vec<Step>,
    /// A prober: starts when every other caller has finished, and asks until it is granted
    /// (at most 4 times, waiting what a refusal says): the liveness check.
    pub prober: bool,
    /// Whether it gives its name as its holder label (without one, and with a fresh id, a
    /// native lock's first create carries its claim).
    pub labelled: bool,
}

impl Caller {
    /// A caller of a native lease of 15 s with a fresh id per acquire, on storage's clock.
    fn fresh_native(name: &'static str, steps: Vec<Step>, labelled: bool) -> Caller {
        Caller {
            name,
            window: Window::Native(15),
            origin: IdOrigin::Fresh,
            skew: 0,
            steps,
            prober: false,
            labelled,
        }
    }
}

/// What a caller saw.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Note {
    /// Granted (or extended): what the caller was told, and the token its claim records at that
    /// moment (filled in by the world).
    Granted {
        /// The lease id.
        id: String,
        /// The fencing token the caller was told.
        token: u64,
        /// The token the lock blob's claim records when the caller is told (the world's read).
        recorded: Option<u64>,
        /// From (the grant's `Date`).
        from: u64,
        /// Until (`None`: infinite).
        until: Option<u64>,
        /// An extension of its own holding.
        extended: bool,
    },
    /// Refused: someone else holds it.
    Busy,
    /// Gives the lock up: it stops acting as the holder from here, whatever the release's
    /// answer.
    Releasing {
        /// The lease id.
        id: String,
    },
    /// Released.
    Released,
    /// Not held any more when it released.
    NotHeld,
    /// The acquire failed (an error): whether storage, at that moment, holds the lock for the
    /// id the call generated and did not report (filled in by the world).
    Failed {
        /// The id it asked with.
        id: String,
        /// It generated the id for this call.
        fresh: bool,
        /// Faults the call met (a give-back that itself fails cannot give back).
        faults: u32,
        /// Storage holds the lock for `id` right now.
        held: bool,
        /// One of the caller's requests is still in flight (it may land later).
        in_flight: bool,
    },
    /// A release failed.
    ReleaseFailed,
}

/// A planted mistake (tests only): the checker must find each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mistake {
    /// The claim written without `If-Match` (a blind write of the record).
    ClaimWithoutIfMatch,
    /// The token in a claim computed from the caller's clock (its `x-ms-date`), not from the
    /// lock's highest token and storage's clock.
    TokenFromCallerClock,
}

/// The claim protocol under check.
#[derive(Debug, Clone)]
pub struct LeaseProtocol {
    /// The callers.
    pub callers: Vec<Caller>,
    /// Fault budget.
    pub faults: u8,
    /// Clock advances allowed.
    pub advances: u8,
    /// The advances the checker chooses from, in seconds.
    pub steps: Vec<u64>,
    /// Whether the container exists at the start (else the callers create it).
    pub container: bool,
    /// A planted mistake, or none.
    pub mistake: Option<Mistake>,
}
