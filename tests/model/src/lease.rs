//! The claim protocol: callers running the core's own [`Locks`] on one lock, native leases and
//! lease records mixed, over the model's storage and network.

use std::time::{Duration, SystemTime};

use leasegate::lease::{
    Acquire, Acquired, Acquiring, HeldState, IdOrigin, Locks, Release, Start, Term,
};
use leasegate::ops::{GetBlob, PutBlob};
use leasegate::{Account, BlobName, ContainerName, LeaseDuration, LeaseId, LockName};
use stateright::Property;

use crate::storage::Storage;
use crate::wire::WireRequest;
use crate::world::{Io, Protocol, Run, State, World, CONNECTION_STRING};

pub use crate::world::START;

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
    fn others_done(&self, state: &State<Note>) -> bool {
        state.in_flight.is_empty()
            && state.callers.iter().enumerate().all(|(j, c)| {
                self.callers[j].prober || !matches!(c.status, crate::world::Status::Waiting(_))
            })
    }

    fn known_id(i: usize) -> LeaseId {
        LeaseId::from_random_bytes([0xA0 | i as u8; 16])
    }

    fn fresh_id(i: usize, step: usize, attempt: usize) -> LeaseId {
        let mut bytes = [0u8; 16];
        bytes[0] = 0xF0 | i as u8;
        bytes[1] = step as u8;
        bytes[2] = attempt as u8;
        LeaseId::from_random_bytes(bytes)
    }
}

fn at(secs: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64)
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn run_caller(i: usize, caller: Caller, io: Io<Note>) {
    let account = Account::from_connection_string(CONNECTION_STRING).expect("a valid account");
    let locks = Locks::new(
        io.clone(),
        account,
        ContainerName::try_new(CONTAINER).expect("a valid name"),
    );
    let lock = LockName::try_new("l").expect("a valid name");
    let now = at(START as i64 + caller.skew);
    // The holder's last grant: its release goes at the ETag that grant left (`Start::Acquired`).
    let mut held: Option<Acquired> = None;
    let tries = if caller.prober { 4 } else { 1 };
    let label = if caller.labelled { caller.name } else { "" };
    for (k, step) in caller.steps.iter().enumerate() {
        match step {
            Step::Acquire | Step::Extend | Step::AcquireKept => {
                for attempt in 0..tries {
                    let kept = match step {
                        Step::Extend => held.as_ref().and_then(|h| Some((h, h.held_state()?))),
                        _ => None,
                    };
                    // The state another holder published, and the read's `Date`.
                    let published = match step {
                        Step::AcquireKept => match read_kept(&locks, now).await {
                            Ok(found) => found,
                            Err(_) => {
                                io.note(Note::Busy);
                                continue;
                            }
                        },
                        _ => None,
                    };
                    let id = match (caller.origin, &kept) {
                        (_, Some((h, _))) => h.lease_id,
                        (IdOrigin::Fresh, None) => LeaseProtocol::fresh_id(i, k, attempt),
                        (IdOrigin::Known, None) => held
                            .as_ref()
                            .map_or(LeaseProtocol::known_id(i), |h| h.lease_id),
                    };
                    let faults = io.faults_seen();
                    let term = caller.window.term();
                    let answer = match (&kept, &published) {
                        (Some((_, state)), _) => {
                            let how = Acquiring::new(term, id)
                                .label(label)
                                .start(Start::Held(state));
                            locks.acquire(&lock, how, now).await
                        }
                        // (Nothing published: from a read.)
                        (None, published) => {
                            let start = published
                                .as_ref()
                                .map_or(Start::Read, |(state, date)| Start::Kept(state, *date));
                            let how = Acquiring::new(term, id)
                                .origin(caller.origin)
                                .label(label)
                                .start(start);
                            locks.acquire(&lock, how, now).await
                        }
                    };
                    match answer {
                        Ok(Acquire::Acquired(a)) => {
                            io.note(Note::Granted {
                                id: a.lease_id.to_string(),
                                token: a.fencing_token.unwrap_or(0),
                                recorded: None,
                                from: unix(a.server_date),
                                until: a.expires_at.map(unix),
                                extended: a.extended,
                            });
                            held = Some(a);
                            break;
                        }
                        Ok(Acquire::Busy { retry_after, .. }) => {
                            io.note(Note::Busy);
                            if caller.prober && attempt + 1 < tries {
                                let wait = retry_after.map_or(15, |d| d.as_secs()).clamp(1, 60);
                                io.sleep(wait).await;
                            }
                        }
                        Err(_) => {
                            io.note(Note::Failed {
                                id: id.to_string(),
                                fresh: caller.origin == IdOrigin::Fresh,
                                faults: io.faults_seen() - faults,
                                held: false,
                                in_flight: false,
                            });
                            if caller.prober && attempt + 1 < tries {
                                io.sleep(1).await;
                            }
                        }
                    }
                }
            }
            Step::Wait => io.sleep(1).await,
            Step::Publish => {
                let Some(state) = held.as_ref().and_then(Acquired::held_state) else {
                    continue;
                };
                let put = PutBlob::block(
                    locks.container().clone(),
                    BlobName::try_new(KEPT_BLOB).expect("a valid name"),
                    state.to_json().into_bytes(),
                );
                let _ = locks.client().execute(&put, now).await;
            }
            Step::Release => {
                let Some(h) = held.take() else { continue };
                io.note(Note::Releasing {
                    id: h.lease_id.to_string(),
                });
                match locks
                    .release(&lock, h.lease_id, Start::Acquired(&h), now)
                    .await
                {
                    Ok((Release::Released, _)) => io.note(Note::Released),
                    Ok((Release::NotHeld, _)) => io.note(Note::NotHeld),
                    Err(_) => io.note(Note::ReleaseFailed),
                }
            }
            Step::ReleasePublish => {
                let Some(h) = held.take() else { continue };
                io.note(Note::Releasing {
                    id: h.lease_id.to_string(),
                });
                let from = Start::Acquired(&h);
                let left = match locks.release(&lock, h.lease_id, from, now).await {
                    Ok((released, left)) => {
                        io.note(if released == Release::Released {
                            Note::Released
                        } else {
                            Note::NotHeld
                        });
                        left
                    }
                    Err(_) => {
                        io.note(Note::ReleaseFailed);
                        None
                    }
                };
                if let Some(state) = left {
                    let put = PutBlob::block(
                        locks.container().clone(),
                        BlobName::try_new(KEPT_BLOB).expect("a valid name"),
                        state.to_json().into_bytes(),
                    );
                    let _ = locks.client().execute(&put, now).await;
                }
            }
        }
    }
}

/// The state [`Step::Publish`] wrote, if any, and the read's `Date`.
async fn read_kept(
    locks: &Locks<Io<Note>>,
    now: SystemTime,
) -> Result<Option<(HeldState, SystemTime)>, leasegate::Error> {
    let get = GetBlob {
        container: locks.container().clone(),
        blob: BlobName::try_new(KEPT_BLOB).expect("a valid name"),
    };
    let (blob, date) = locks.client().execute(&get, now).await?;
    Ok(blob.and_then(|b| {
        let state = HeldState::from_json(std::str::from_utf8(&b.body).ok()?)?;
        Some((state, date?))
    }))
}

/// Who storage says holds the lock right now: the native lease's id, or an unexpired record's
/// holder.
pub fn holders(storage: &Storage) -> Vec<String> {
    let Some(blob) = storage.blob(CONTAINER, LOCK_BLOB) else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    if let Some(id) = blob.leased_by(storage.clock) {
        ids.push(id.to_string());
    }
    let record = blob.metadata.get("leasegate_term").map(String::as_str) == Some("record");
    let expires: u64 = blob
        .metadata
        .get("leasegate_expires")
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    if let Some(holder) = blob.metadata.get("leasegate_holder") {
        if record && !holder.is_empty() && expires > storage.clock && !ids.contains(holder) {
            ids.push(holder.clone());
        }
    }
    ids
}

fn recorded_token(storage: &Storage, id: &str) -> Option<u64> {
    let blob = storage.blob(CONTAINER, LOCK_BLOB)?;
    (blob.metadata.get("leasegate_holder").map(String::as_str) == Some(id))
        .then(|| blob.metadata.get("leasegate_token")?.parse().ok())
        .flatten()
}

/// The mistake's rewrite of a claim write: a `PUT ?comp=metadata` of the lock blob that names a
/// holder.
fn is_claim_write(request: &WireRequest) -> bool {
    request.method == "PUT"
        && request.path().ends_with(LOCK_BLOB)
        && request.query("comp").as_deref() == Some("metadata")
        && request
            .header("x-ms-meta-leasegate_holder")
            .is_some_and(|h| !h.is_empty())
}

impl Protocol for LeaseProtocol {
    type Note = Note;

    fn callers(&self) -> usize {
        self.callers.len()
    }

    fn run(&self, i: usize, io: Io<Note>) -> Run {
        Box::pin(run_caller(i, self.callers[i].clone(), io))
    }

    fn storage(&self) -> Storage {
        let mut storage = Storage::new(START);
        if self.container {
            storage.create_container(CONTAINER);
        }
        storage
    }

    fn budgets(&self) -> (u8, u8, u8) {
        (self.faults, self.advances, 0)
    }

    fn advances(&self) -> &[u64] {
        &self.steps
    }

    fn may_act(&self, i: usize, state: &State<Note>) -> bool {
        !self.callers[i].prober || self.others_done(state)
    }

    /// Fair delivery for the prober: the network fails only the other callers' requests...
    fn may_fail(&self, i: usize, request: &WireRequest) -> bool {
        !self.callers[i].prober && request.host() != crate::world::CLOCK_HOST
    }

    /// ... and the clock moves only by its own waits once it runs.
    fn may_advance(&self, state: &State<Note>) -> bool {
        !self.others_done(state)
    }

    fn mutate(&self, request: &mut WireRequest) {
        match self.mistake {
            Some(Mistake::ClaimWithoutIfMatch) if is_claim_write(request) => {
                request.remove_header("if-match");
            }
            Some(Mistake::TokenFromCallerClock) if is_claim_write(request) => {
                let caller_secs = request
                    .header("x-ms-date")
                    .and_then(|d| httpdate::parse_http_date(d).ok())
                    .map(unix)
                    .unwrap_or(0);
                request.set_header("x-ms-meta-leasegate_token", (caller_secs << 16).to_string());
            }
            _ => {}
        }
    }

    fn on_note(
        &self,
        i: usize,
        note: Note,
        storage: &Storage,
        in_flight: &[(usize, WireRequest)],
    ) -> Note {
        match note {
            Note::Granted {
                id,
                token,
                from,
                until,
                extended,
                ..
            } => Note::Granted {
                recorded: recorded_token(storage, &id),
                id,
                token,
                from,
                until,
                extended,
            },
            Note::Failed {
                id, fresh, faults, ..
            } => Note::Failed {
                held: holders(storage).contains(&id),
                in_flight: in_flight.iter().any(|(j, _)| *j == i),
                id,
                fresh,
                faults,
            },
            other => other,
        }
    }

    fn properties() -> Vec<Property<World<Self>>> {
        vec![
            Property::always("one holder at a time", |_, s| one_holder(s)),
            Property::always(
                "fencing tokens rise across holders, stay on extension",
                |_, s| tokens_rise(s),
            ),
            Property::always("a holder's token is the one its claim records", |_, s| {
                told_is_recorded(s)
            }),
            Property::always(
                "a failed call leaves no lock held by an id it generated",
                |_, s| nothing_left_by_failures(s),
            ),
            Property::eventually("a free lock is granted (the prober gets it)", |m, s| {
                prober_granted(m, s)
            }),
        ]
    }
}

/// A grant as the caller was told it, and when it ended: at its expiry by storage's clock, or
/// when its holder began to release it (the note's place in the log).
struct Tenure {
    id: String,
    /// The token the caller was told.
    token: u64,
    /// The token its claim records when the caller is told (`None`: the claim names another).
    recorded: Option<u64>,
    /// Where the grant is in the log.
    told: usize,
    /// Where its holder began to release it (`usize::MAX`: it did not).
    releasing: usize,
    /// The grant's `Date`.
    from: u64,
    /// Its expiry (`u64::MAX`: infinite).
    until: u64,
    extended: bool,
}

fn tenures(state: &State<Note>) -> Vec<Tenure> {
    let mut out = Vec::new();
    for (k, (i, note)) in state.log.iter().enumerate() {
        let Note::Granted {
            id,
            token,
            from,
            until,
            extended,
            recorded,
        } = note
        else {
            continue;
        };
        let releasing = state.log[k + 1..]
            .iter()
            .position(|(j, n)| j == i && matches!(n, Note::Releasing { id: r, .. } if r == id))
            .map_or(usize::MAX, |p| k + 1 + p);
        out.push(Tenure {
            id: id.clone(),
            token: *token,
            recorded: *recorded,
            told: k,
            releasing,
            from: *from,
            until: until.unwrap_or(u64::MAX),
            extended: *extended,
        });
    }
    out
}

/// When a caller is told it holds the lock, nobody else who was told so before is still a
/// holder: it has begun to release, or its grant ran out by the new grant's `Date`.
fn one_holder(state: &State<Note>) -> bool {
    let t = tenures(state);
    t.iter().all(|b| {
        t.iter()
            .all(|a| a.told >= b.told || a.id == b.id || a.releasing < b.told || a.until <= b.from)
    })
}

fn tokens_rise(state: &State<Note>) -> bool {
    let mut t = tenures(state);
    // In the order of the grants by storage's clock (holders never overlap: see one_holder).
    t.sort_by_key(|x| x.from);
    let recorded = |x: &Tenure| x.recorded.unwrap_or(x.token);
    t.iter().enumerate().all(|(k, b)| {
        let earlier = &t[..k];
        let extends = earlier.iter().rev().find(|a| a.id == b.id);
        if b.extended && extends.is_some_and(|a| a.token != b.token) {
            // An extension keeps the token of the tenure it extends.
            return false;
        }
        earlier.iter().all(|a| {
            if a.id == b.id && b.extended {
                recorded(b) >= recorded(a)
            } else {
                recorded(b) > recorded(a)
            }
        })
    })
}

/// The claim names the holder it was just told to, with its token.
fn told_is_recorded(state: &State<Note>) -> bool {
    tenures(state).iter().all(|t| t.recorded == Some(t.token))
}

fn nothing_left_by_failures(state: &State<Note>) -> bool {
    state.log.iter().all(|(_, note)| match note {
        Note::Failed {
            fresh: true,
            faults,
            held,
            in_flight,
            ..
        } => !*held || *faults > 1 || *in_flight,
        _ => true,
    })
}

fn prober_granted(model: &World<LeaseProtocol>, state: &State<Note>) -> bool {
    state
        .log
        .iter()
        .any(|(i, note)| model.protocol.callers[*i].prober && matches!(note, Note::Granted { .. }))
}
