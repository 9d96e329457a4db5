//! The bounds CI checks: the callers of each check, its fault and clock budgets; and the ids a
//! caller asks with.

use leasegate::lease::IdOrigin;
use leasegate::LeaseId;

// What the docs' links name.
#[cfg(doc)]
use leasegate::lease::{Locks, Start};

use super::{Caller, LeaseProtocol, Mistake, Note, Step, Window};
use crate::world::State;

impl LeaseProtocol {
    /// A bound CI checks: three callers with mixed windows (a native lease of 15 s with a known
    /// id that acquires and releases, a record of 20 s with a fresh id and a clock 30 s behind,
    /// a record of 1 s with a known id and a clock 20 s ahead), then a prober that asks until it
    /// is granted; one fault (any kind, on any request), no clock advance but the prober's
    /// waits.
    pub fn bounded() -> Self {
        LeaseProtocol {
            callers: vec![
                Caller {
                    name: "a",
                    window: Window::Native(15),
                    origin: IdOrigin::Known,
                    skew: 0,
                    steps: vec![Step::Acquire, Step::Release],
                    prober: false,
                    labelled: true,
                },
                Caller {
                    name: "b",
                    window: Window::Record(20),
                    origin: IdOrigin::Fresh,
                    skew: -30,
                    steps: vec![Step::Acquire],
                    prober: false,
                    labelled: true,
                },
                Caller {
                    name: "c",
                    window: Window::Record(1),
                    origin: IdOrigin::Known,
                    skew: 20,
                    steps: vec![Step::Acquire],
                    prober: false,
                    labelled: true,
                },
                Caller {
                    name: "p",
                    window: Window::Native(15),
                    origin: IdOrigin::Known,
                    skew: 0,
                    steps: vec![Step::Acquire],
                    prober: true,
                    labelled: true,
                },
            ],
            faults: 1,
            advances: 0,
            steps: vec![1, 15],
            container: true,
            mistake: None,
        }
    }

    /// The bound CI checks for a holder's calls from what it kept of its last
    /// ([`Start::Held`], [`leasegate::lease::HeldState`]): a native lease of 15 s with a
    /// known id that acquires, waits a second, extends from what it kept (the renew and the
    /// claim's new expiry) and releases; a record of 20 s with a known id and a clock 3 s ahead
    /// that acquires and extends so (its reckoned expiry is off: always written again); the
    /// prober. One fault, or (`advances`) one clock advance.
    pub fn bounded_kept(faults: u8, advances: u8) -> Self {
        let mut p = LeaseProtocol::bounded();
        p.callers[0].steps = vec![Step::Acquire, Step::Wait, Step::Extend, Step::Release];
        p.callers[2] = Caller {
            name: "c",
            window: Window::Record(20),
            origin: IdOrigin::Known,
            skew: 3,
            steps: vec![Step::Acquire, Step::Extend],
            prober: false,
            labelled: true,
        };
        p.callers.remove(1);
        LeaseProtocol {
            faults,
            advances,
            ..p
        }
    }

    /// The bound CI checks for a new holder that acquires from what the last holder kept
    /// ([`Start::Kept`]): a native lease of 15 s with a fresh id that acquires,
    /// publishes its state and releases; another with a fresh id that reads the published
    /// state and acquires from it (whenever it runs: before the publish, while the first holds
    /// the lease, after its release); then the prober. One fault, or (`advances`) one clock
    /// advance.
    pub fn bounded_new_holder(faults: u8, advances: u8) -> Self {
        let native = |name, steps| Caller::fresh_native(name, steps, true);
        let mut p = LeaseProtocol::bounded();
        p.callers = vec![
            native("a", vec![Step::Acquire, Step::Publish, Step::Release]),
            native("b", vec![Step::AcquireKept]),
            p.callers[3].clone(),
        ];
        LeaseProtocol {
            faults,
            advances,
            ..p
        }
    }

    /// The bound CI checks for a new holder of a lease record that takes it from the state
    /// the last holder's release left ([`Locks::release`]'s answer, as a job's run keeps it in
    /// its log): a record of 20 s with a fresh id that acquires, publishes its state (live),
    /// then releases and publishes the state its release left; another with a fresh id that
    /// reads the published state and acquires from it (whenever it runs: before any publish,
    /// while the first holds the record, after its release); then the prober. One fault, or
    /// (`advances`) one clock advance.
    pub fn bounded_new_record_holder(faults: u8, advances: u8) -> Self {
        let record = |name, steps| Caller {
            window: Window::Record(20),
            ..Caller::fresh_native(name, steps, true)
        };
        let mut p = LeaseProtocol::bounded();
        p.callers = vec![
            record(
                "a",
                vec![Step::Acquire, Step::Publish, Step::ReleasePublish],
            ),
            record("b", vec![Step::AcquireKept]),
            p.callers[3].clone(),
        ];
        LeaseProtocol {
            faults,
            advances,
            ..p
        }
    }

    /// The bound CI checks for a native lock's first holder that claims it in the lock blob's
    /// create (a fresh id, no label): two such callers of a native lease of 15 s race to a
    /// lock blob nobody has created (one acquires and releases, one acquires), then the
    /// prober. One fault, or (`advances`) one clock advance (a grant in a later second than
    /// the create's read writes the claim under the lease).
    pub fn bounded_first_create(faults: u8, advances: u8) -> Self {
        let unlabelled = |name, steps| Caller::fresh_native(name, steps, false);
        let mut p = LeaseProtocol::bounded();
        p.callers = vec![
            unlabelled("a", vec![Step::Acquire, Step::Release]),
            unlabelled("b", vec![Step::Acquire]),
            p.callers[3].clone(),
        ];
        LeaseProtocol {
            faults,
            advances,
            ..p
        }
    }

    /// The bound CI checks for a caller of its own id racing such a creator: the creator (a
    /// fresh id, no label) acquires; a caller with an id it keeps (labelled) acquires twice (a
    /// second acquire settles a first whose claim write failed, though the create's claim names
    /// the creator); then the prober. One fault.
    pub fn bounded_first_create_chosen() -> Self {
        let mut p = LeaseProtocol::bounded_first_create(1, 0);
        let known = Caller {
            name: "k",
            steps: vec![Step::Acquire, Step::Acquire],
            ..LeaseProtocol::bounded().callers[0].clone()
        };
        p.callers = vec![
            Caller {
                steps: vec![Step::Acquire],
                ..p.callers[0].clone()
            },
            known,
            p.callers[2].clone(),
        ];
        p
    }

    /// The other bound CI checks: the same callers with no fault and one clock advance (1 s or
    /// 15 s, at any step: a record or a lease running out between two requests of a call).
    pub fn bounded_clock() -> Self {
        LeaseProtocol {
            faults: 0,
            advances: 1,
            ..LeaseProtocol::bounded()
        }
    }

    /// With a planted mistake.
    pub fn with_mistake(mut self, mistake: Mistake) -> Self {
        self.mistake = Some(mistake);
        self
    }

    /// Every caller but the prober has finished, and no request is in flight.
    pub(super) fn others_done(&self, state: &State<Note>) -> bool {
        state.in_flight.is_empty()
            && state.callers.iter().enumerate().all(|(j, c)| {
                self.callers[j].prober || !matches!(c.status, crate::world::Status::Waiting(_))
            })
    }

    pub(super) fn known_id(i: usize) -> LeaseId {
        LeaseId::from_random_bytes([0xA0 | i as u8; 16])
    }

    pub(super) fn fresh_id(i: usize, step: usize, attempt: usize) -> LeaseId {
        let mut bytes = [0u8; 16];
        bytes[0] = 0xF0 | i as u8;
        bytes[1] = step as u8;
        bytes[2] = attempt as u8;
        LeaseId::from_random_bytes(bytes)
    }
}
