//! The world the checker explores: callers running the project's real code, one storage, a
//! network whose every answer is the checker's choice, and a clock.
//!
//! A caller is the real async code (the core's `Locks`, the scheduled job's tick) driven through
//! a [`Io`] transport. Its requests are the only way it acts, and it is deterministic given the
//! answers it got, so a caller's state is the list of its answers: to step it, the checker builds
//! its future anew, feeds it the answers it had, and polls it once (no executor, no threads:
//! the core is sans-IO). Where it stops is its next request, or its end.
//!
//! Each step is one of:
//! * **deliver** a caller's request: storage applies it and answers;
//! * a **fault** on it: connection refused (nothing sent), `503 ServerBusy` (nothing done), answer
//!   **lost** after storage applied it, **timed out** before it arrived, or **late**: the caller
//!   times out now and the request lands at a later step of the checker's choosing;
//! * **land** a late request;
//! * **advance** the storage clock;
//! * **crash** a caller (it vanishes between two requests, as an invocation killed mid-run).
//!
//! Faults, clock advances and crashes each come from a budget, which bounds the search.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::SystemTime;

use leasegate::{Request, Response, Transport, TransportError, TransportErrorKind};

use crate::storage::Storage;
use crate::wire::{WireRequest, WireResponse};

/// The storage clock when a check starts (2026-11-19T14:00:00Z, a whole minute).
pub const START: u64 = 1_795_096_800;

/// The host a caller's [`Io::sleep`] goes to: the model's clock.
pub const CLOCK_HOST: &str = "clock.model";

/// What a caller got for one request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Answer {
    /// An answer.
    Response(WireResponse),
    /// No answer: the transport failed this way.
    Failed(Failure),
}

/// How a transport failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failure {
    /// Nothing was sent.
    Refused,
    /// No answer in time (the request may have taken effect).
    TimedOut,
}

/// A fault the network may inject on a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Connection refused: nothing is sent.
    Refused,
    /// `503 ServerBusy`: storage did nothing.
    Busy,
    /// `500 OperationTimedOut` after storage applied it.
    FailedAfter,
    /// Storage applied it and the answer was lost (the caller times out).
    Lost,
    /// It never arrived (the caller times out).
    TimedOut,
    /// The caller times out now; the request lands at a later step.
    Late,
}

/// The faults the checker chooses from. `Lost` and `Late` differ: a lost request has landed by
/// the time its caller hears of the failure, a late one may land at any later step.
pub const FAULTS: [Fault; 6] = [
    Fault::Refused,
    Fault::Busy,
    Fault::FailedAfter,
    Fault::Lost,
    Fault::TimedOut,
    Fault::Late,
];

/// The transport a caller's code runs over, for one replay: it answers from the answers the
/// caller already had, and stops at the first request without one.
#[derive(Clone)]
pub struct Io<N> {
    inner: Rc<IoInner<N>>,
}

struct IoInner<N> {
    answers: RefCell<VecDeque<Answer>>,
    /// The requests the answers were for: a replay that asks anything else is not
    /// deterministic, and the check would be wrong.
    asked: RefCell<VecDeque<WireRequest>>,
    pending: RefCell<Option<WireRequest>>,
    notes: RefCell<Vec<N>>,
    last_date: Cell<Option<u64>>,
    faults_seen: Cell<u32>,
}

impl<N> Io<N> {
    fn new(answers: &[Answer], asked: &[WireRequest]) -> Self {
        Io {
            inner: Rc::new(IoInner {
                answers: RefCell::new(answers.iter().cloned().collect()),
                asked: RefCell::new(asked.iter().cloned().collect()),
                pending: RefCell::new(None),
                notes: RefCell::new(Vec::new()),
                last_date: Cell::new(None),
                faults_seen: Cell::new(0),
            }),
        }
    }

    /// Records what the caller saw or did, for the properties.
    pub fn note(&self, note: N) {
        self.inner.notes.borrow_mut().push(note);
    }

    /// The storage clock of the last answer the caller had (its `Date`).
    pub fn last_date(&self) -> Option<u64> {
        self.inner.last_date.get()
    }

    /// How many answers so far were failures (a transport error, a 5xx).
    pub fn faults_seen(&self) -> u32 {
        self.inner.faults_seen.get()
    }

    /// Waits `secs` of the model's clock (the clock moves on by that much when the checker
    /// delivers it).
    pub async fn sleep(&self, secs: u64) {
        let request = Request::new(
            leasegate::Method::POST,
            format!("http://{CLOCK_HOST}/sleep?secs={secs}"),
        );
        let _ = self.exchange(&request).await;
    }

    async fn exchange(&self, request: &Request) -> Result<Response, TransportError> {
        let next = self.inner.answers.borrow_mut().pop_front();
        if next.is_some() {
            let asked = self.inner.asked.borrow_mut().pop_front();
            let now = WireRequest::from(request);
            assert!(
                asked.as_ref() == Some(&now),
                "a caller's replay asked another request than it did before: its code is not \
                 deterministic given its answers (a clock, a random number?): {asked:?}, then \
                 {now:?}"
            );
        }
        let failed = match &next {
            Some(Answer::Response(r)) => r.status >= 500,
            Some(Answer::Failed(_)) => true,
            None => false,
        };
        if failed {
            self.inner.faults_seen.set(self.inner.faults_seen.get() + 1);
        }
        match next {
            Some(Answer::Response(r)) => {
                let date = r
                    .header("date")
                    .and_then(|d| httpdate::parse_http_date(d).ok())
                    .map(unix);
                if date.is_some() {
                    self.inner.last_date.set(date);
                }
                Ok(r.to_response())
            }
            Some(Answer::Failed(Failure::Refused)) => Err(TransportError::new(
                TransportErrorKind::Connect,
                "connection refused (model)",
            )),
            Some(Answer::Failed(Failure::TimedOut)) => Err(TransportError::new(
                TransportErrorKind::Timeout,
                "no answer in time (model)",
            )),
            None => {
                *self.inner.pending.borrow_mut() = Some(WireRequest::from(request));
                std::future::pending().await
            }
        }
    }
}

impl<N> Transport for Io<N> {
    async fn send(&self, request: Request) -> Result<Response, TransportError> {
        self.exchange(&request).await
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A caller's code, started on an [`Io`].
pub type Run = Pin<Box<dyn Future<Output = ()>>>;

/// Where a caller is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Status {
    /// Waiting for the answer to this request.
    Waiting(WireRequest),
    /// Finished.
    Done,
    /// Vanished (crashed).
    Crashed,
}

/// One caller: the answers it had, and where that left it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    /// Every answer, in order.
    pub answers: Vec<Answer>,
    /// The request each answer was for.
    pub asked: Vec<WireRequest>,
    /// Where it is.
    pub status: Status,
    /// How many notes it has made (its notes are in [`State::log`]).
    pub noted: usize,
}

/// One state of the world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State<N> {
    /// Storage.
    pub storage: Storage,
    /// The callers.
    pub callers: Vec<Caller>,
    /// Late requests still to land, with their caller.
    pub in_flight: Vec<(usize, WireRequest)>,
    /// What happened, in order: each caller's notes and the protocol's own (at its outside
    /// hosts), by caller.
    pub log: Vec<(usize, N)>,
    /// Faults the network may still inject.
    pub faults_left: u8,
    /// Clock advances still allowed.
    pub advances_left: u8,
    /// Crashes still allowed.
    pub crashes_left: u8,
}

/// A step.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// Storage (or the outside host) answers caller `.0`'s request.
    Deliver(usize),
    /// The network fails caller `.0`'s request.
    Fail(usize, Fault),
    /// The late request `.0` of [`State::in_flight`] lands.
    Land(usize),
    /// The storage clock moves on this many seconds.
    Advance(u64),
    /// Caller `.0` vanishes.
    Crash(usize),
}

/// What a protocol under check gives the world.
pub trait Protocol: Send + Sync + Sized + 'static {
    /// What callers note (and the outside hosts record).
    type Note: Clone + Debug + Hash + Eq + Send + Sync + 'static;

    /// How many callers.
    fn callers(&self) -> usize;

    /// Caller `i`'s code on `io`.
    fn run(&self, i: usize, io: Io<Self::Note>) -> Run;

    /// The state storage starts in.
    fn storage(&self) -> Storage;

    /// The states storage may start in, each explored ([`Protocol::storage`] alone by
    /// default): a protocol that depends on a behaviour Azure and Azurite differ on checks both.
    fn storages(&self) -> Vec<Storage> {
        vec![self.storage()]
    }

    /// Budgets: faults, clock advances, crashes.
    fn budgets(&self) -> (u8, u8, u8);

    /// The clock advances the checker may choose (seconds).
    fn advances(&self) -> &[u64];

    /// Whether caller `i` may act now (a caller that waits for the others to finish says no
    /// until then).
    fn may_act(&self, _i: usize, _state: &State<Self::Note>) -> bool {
        true
    }

    /// Whether the checker may advance the storage clock now (fair delivery for a caller that
    /// checks liveness: the clock does not jump in the middle of its calls).
    fn may_advance(&self, _state: &State<Self::Note>) -> bool {
        true
    }

    /// Whether caller `i`'s request may be failed by the network (or the caller crash there).
    fn may_fail(&self, _i: usize, request: &WireRequest) -> bool {
        request.host() != CLOCK_HOST
    }

    /// Answers a request to a host that is not storage (a job's webhook), noting what it
    /// wants in `log` for caller `i`.
    fn outside(
        &self,
        _i: usize,
        _request: &WireRequest,
        _log: &mut Vec<(usize, Self::Note)>,
    ) -> WireResponse {
        WireResponse::new(404)
    }

    /// A planted mistake: rewrites a request on its way (only the tests' mutants do).
    fn mutate(&self, _request: &mut WireRequest) {}

    /// What of storage [`Protocol::observe`] wants as it was before `request` is applied (a
    /// blob's body, say): `None` by default.
    fn before(&self, _request: &WireRequest, _storage: &Storage) -> Option<Vec<u8>> {
        None
    }

    /// Storage applied caller `i`'s `request` and answered `response` (whether or not the
    /// answer reaches the caller); `before` is what [`Protocol::before`] kept: notes what the
    /// properties judge at that moment in `log`.
    fn observe(
        &self,
        _i: usize,
        _request: &WireRequest,
        _response: &WireResponse,
        _before: Option<Vec<u8>>,
        _log: &mut Vec<(usize, Self::Note)>,
    ) {
    }

    /// The properties it is checked against.
    fn properties() -> Vec<stateright::Property<World<Self>>>;

    /// Notes the world makes when caller `i` notes `note` (e.g. what storage holds at that
    /// moment): a hook for the properties that judge a moment.
    fn on_note(
        &self,
        _i: usize,
        note: Self::Note,
        _storage: &Storage,
        _in_flight: &[(usize, WireRequest)],
    ) -> Self::Note {
        note
    }
}

/// Replays caller `i` from its answers: where it stops, and every note it made.
fn replay<P: Protocol>(
    p: &P,
    i: usize,
    answers: &[Answer],
    asked: &[WireRequest],
) -> (Status, Vec<P::Note>) {
    let io = Io::new(answers, asked);
    let mut run = p.run(i, io.clone());
    let mut cx = Context::from_waker(Waker::noop());
    let status = match run.as_mut().poll(&mut cx) {
        Poll::Ready(()) => Status::Done,
        Poll::Pending => match io.inner.pending.borrow_mut().take() {
            Some(request) => Status::Waiting(request),
            // Pending on something that is not a request: a caller may only wait on the model.
            None => panic!("caller {i} waits on something other than the model's network"),
        },
    };
    drop(run);
    let notes = io.inner.notes.borrow().clone();
    (status, notes)
}

/// The world of protocol `P`.
pub struct World<P> {
    /// The protocol.
    pub protocol: P,
}

impl<P: Protocol> World<P> {
    /// The world of `protocol`.
    pub fn new(protocol: P) -> Self {
        World { protocol }
    }

    /// Caller `i` has a new answer: run it on and log its new notes.
    fn answer(&self, state: &mut State<P::Note>, i: usize, answer: Answer) {
        let Status::Waiting(asked) = &state.callers[i].status else {
            return;
        };
        let asked = asked.clone();
        state.callers[i].asked.push(asked);
        state.callers[i].answers.push(answer);
        let caller = &state.callers[i];
        let (status, notes) = replay(&self.protocol, i, &caller.answers, &caller.asked);
        let noted = state.callers[i].noted;
        for note in notes.into_iter().skip(noted) {
            state.callers[i].noted += 1;
            let note = self
                .protocol
                .on_note(i, note, &state.storage, &state.in_flight);
            state.log.push((i, note));
        }
        state.callers[i].status = status;
    }

    /// Applies `request` where it goes; the answer.
    fn apply(&self, state: &mut State<P::Note>, i: usize, request: &WireRequest) -> WireResponse {
        let mut request = request.clone();
        if request.host() == CLOCK_HOST {
            let secs: u64 = request
                .query("secs")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            state.storage.clock += secs;
            return WireResponse::new(200);
        }
        let table = request.host() == TABLE_HOST;
        if request.host() != STORAGE_HOST && !table {
            return self.protocol.outside(i, &request, &mut state.log);
        }
        self.protocol.mutate(&mut request);
        let before = self.protocol.before(&request, &state.storage);
        let response = if table {
            state.storage.handle_table(&request)
        } else {
            state.storage.handle(&request)
        };
        self.protocol
            .observe(i, &request, &response, before, &mut state.log);
        response
    }
}

/// The storage host of the model's account.
pub const STORAGE_HOST: &str = "127.0.0.1:10000";

/// Whether `request` goes to the model's storage (its blobs or its tables).
pub fn is_storage(request: &WireRequest) -> bool {
    request.host() == STORAGE_HOST || request.host() == TABLE_HOST
}

/// The table host of the model's account (Azurite's port: the table endpoint a connection
/// string's `UseDevelopmentStorage=true` derives).
pub const TABLE_HOST: &str = "127.0.0.1:10002";

/// [`CONNECTION_STRING`] with the account's table endpoint as well, at [`TABLE_HOST`].
pub const CONNECTION_STRING_WITH_TABLES: &str = "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;TableEndpoint=http://127.0.0.1:10002/devstoreaccount1;SharedAccessSignature=sv=2021-12-02&ss=bt&srt=sco&sp=rwdlacut&se=2099-01-01T00:00:00Z&sig=model";

/// The model's account: path style at [`STORAGE_HOST`], a SAS (requests are not signed with a
/// key: the model does not check signatures, and HMAC per replayed request would be the
/// checker's main cost).
pub const CONNECTION_STRING: &str = "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;SharedAccessSignature=sv=2021-12-02&ss=b&srt=sco&sp=rwdlac&se=2099-01-01T00:00:00Z&sig=model";

impl<P: Protocol> stateright::Model for World<P> {
    type State = State<P::Note>;
    type Action = Action;

    fn init_states(&self) -> Vec<Self::State> {
        let (faults, advances, crashes) = self.protocol.budgets();
        let mut callers = Vec::new();
        let mut log = Vec::new();
        for i in 0..self.protocol.callers() {
            let (status, notes) = replay(&self.protocol, i, &[], &[]);
            callers.push(Caller {
                answers: Vec::new(),
                asked: Vec::new(),
                status,
                noted: notes.len(),
            });
            for note in notes {
                log.push((i, note));
            }
        }
        let mut states = Vec::new();
        for storage in self.protocol.storages() {
            let state = State {
                storage,
                callers: callers.clone(),
                in_flight: Vec::new(),
                log: log.clone(),
                faults_left: faults,
                advances_left: advances,
                crashes_left: crashes,
            };
            // Leases run out at a millisecond of storage's clock: in the second of their
            // expiry, or through it (a lease acquired late in its second). The model's clock
            // has whole seconds: both worlds are explored.
            let mut through = state.clone();
            through.storage.leases_last_through_their_second = true;
            states.push(state);
            states.push(through);
        }
        states
    }

    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>) {
        for (i, caller) in state.callers.iter().enumerate() {
            let Status::Waiting(request) = &caller.status else {
                continue;
            };
            if !self.protocol.may_act(i, state) {
                continue;
            }
            actions.push(Action::Deliver(i));
            let may_fail = self.protocol.may_fail(i, request);
            if state.faults_left > 0 && may_fail {
                for fault in FAULTS {
                    actions.push(Action::Fail(i, fault));
                }
            }
            if state.crashes_left > 0 && may_fail {
                actions.push(Action::Crash(i));
            }
        }
        for k in 0..state.in_flight.len() {
            actions.push(Action::Land(k));
        }
        if state.advances_left > 0 && self.protocol.may_advance(state) {
            for secs in self.protocol.advances() {
                actions.push(Action::Advance(*secs));
            }
        }
    }

    fn next_state(&self, last: &Self::State, action: Self::Action) -> Option<Self::State> {
        let mut state = last.clone();
        match action {
            Action::Deliver(i) => {
                let Status::Waiting(request) = &state.callers[i].status else {
                    return None;
                };
                let request = request.clone();
                let response = self.apply(&mut state, i, &request);
                self.answer(&mut state, i, Answer::Response(response));
            }
            Action::Fail(i, fault) => {
                let Status::Waiting(request) = &state.callers[i].status else {
                    return None;
                };
                let request = request.clone();
                state.faults_left -= 1;
                let answer = match fault {
                    Fault::Refused => Answer::Failed(Failure::Refused),
                    Fault::Busy => Answer::Response(state.storage.busy()),
                    Fault::FailedAfter => {
                        let _ = self.apply(&mut state, i, &request);
                        Answer::Response(state.storage.timed_out())
                    }
                    Fault::Lost => {
                        let _ = self.apply(&mut state, i, &request);
                        Answer::Failed(Failure::TimedOut)
                    }
                    Fault::TimedOut => Answer::Failed(Failure::TimedOut),
                    Fault::Late => {
                        state.in_flight.push((i, request));
                        Answer::Failed(Failure::TimedOut)
                    }
                };
                self.answer(&mut state, i, answer);
            }
            Action::Land(k) => {
                let (i, request) = state.in_flight.remove(k);
                let _ = self.apply(&mut state, i, &request);
            }
            Action::Advance(secs) => {
                state.advances_left -= 1;
                state.storage.clock += secs;
            }
            Action::Crash(i) => {
                state.crashes_left -= 1;
                state.callers[i].status = Status::Crashed;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<stateright::Property<Self>> {
        P::properties()
    }

    fn format_step(&self, last: &Self::State, action: Self::Action) -> Option<String> {
        Some(crate::trace::step(self, last, &action))
    }
}
