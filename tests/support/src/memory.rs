//! A synchronous in-memory transport: every request answered at once by the storage model
//! ([`Storage::handle`] for the Blob service, [`Storage::handle_table`] for the Table service)
//! or by a host the test routes ([`Memory::route`]), on a clock the test sets and advances.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use leasegate::ops::{PutBlob, WriteOutcome};
//! use leasegate::{Account, BlobClient, BlobName, ContainerName};
//! use leasegate_test_support::memory::{Memory, CONNECTION_STRING};
//!
//! let memory = Memory::new(1_795_096_800);
//! memory.storage_mut().create_container("data");
//! let container = ContainerName::try_new("data").unwrap();
//! let account = Account::from_connection_string(CONNECTION_STRING).unwrap();
//! let blobs = BlobClient::new(memory.clone(), account, container.clone());
//! let put = PutBlob::block(container, BlobName::try_new("a.json").unwrap(), b"{}".to_vec());
//! memory.advance(Duration::from_secs(5));
//! let (outcome, _date) = pollster::block_on(blobs.execute(&put, memory.now())).unwrap();
//! assert!(matches!(outcome, WriteOutcome::Written(_)));
//! let storage = memory.storage();
//! assert_eq!(storage.blob("data", "a.json").unwrap().last_modified, 1_795_096_805);
//! assert_eq!(memory.storage_requests(), 1);
//! ```

use std::cell::{Cell, Ref, RefCell, RefMut};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use leasegate::{Request, Response, Transport, TransportError, TransportErrorKind};

use crate::storage::Storage;
use crate::wire::{WireRequest, WireResponse};

/// The Blob service's host (Azurite's port, as the model checker's world names it).
pub const BLOB_HOST: &str = "127.0.0.1:10000";

/// The Table service's host (Azurite's port: the table endpoint `UseDevelopmentStorage=true`
/// derives).
pub const TABLE_HOST: &str = "127.0.0.1:10002";

/// The development account at [`BLOB_HOST`], path style, with a SAS: requests are not signed
/// with a key (the model checks no signature).
pub const CONNECTION_STRING: &str = "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;SharedAccessSignature=sv=2021-12-02&ss=b&srt=sco&sp=rwdlacft&se=2099-01-01T00:00:00Z&sig=model";

/// The variables that point a function's storage settings at the model: `storage_origin` and
/// `storage_connection_string` ([`CONNECTION_STRING`]).
pub const STORAGE_VARIABLES: [(&str, &str); 2] = [
    ("storage_origin", "http://127.0.0.1:10000"),
    ("storage_connection_string", CONNECTION_STRING),
];

/// A host's answers: the request in, the answer out.
type Host = Rc<dyn Fn(&WireRequest) -> WireResponse>;

/// The storage model behind a [`Transport`], and the clock both read. Clones share one storage,
/// one clock, one count: give each caller (each function instance) a clone.
#[derive(Clone)]
pub struct Memory {
    inner: Rc<Inner>,
}

struct Inner {
    storage: RefCell<Storage>,
    /// Time past the storage clock's whole second (below a second).
    part: Cell<Duration>,
    hosts: RefCell<Vec<(String, Host)>>,
    sent: RefCell<Vec<WireRequest>>,
    turns: Cell<bool>,
}

impl Memory {
    /// An empty storage whose clock reads `clock` (Unix seconds).
    pub fn new(clock: u64) -> Self {
        Memory {
            inner: Rc::new(Inner {
                storage: RefCell::new(Storage::new(clock)),
                part: Cell::new(Duration::ZERO),
                hosts: RefCell::new(Vec::new()),
                sent: RefCell::new(Vec::new()),
                turns: Cell::new(false),
            }),
        }
    }

    /// The storage, to read back what the callers left.
    pub fn storage(&self) -> Ref<'_, Storage> {
        self.inner.storage.borrow()
    }

    /// The storage, to seed it (as a deployment's set-up or an application would).
    pub fn storage_mut(&self) -> RefMut<'_, Storage> {
        self.inner.storage.borrow_mut()
    }

    /// The time now: the storage clock's second and what has passed of it. Every answer's
    /// `Date` is the whole second, as Azure's is.
    pub fn now(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(self.clock()) + self.inner.part.get()
    }

    /// The storage clock (Unix seconds).
    pub fn clock(&self) -> u64 {
        self.inner.storage.borrow().clock
    }

    /// Sets the clock to the start of second `secs`.
    pub fn set_clock(&self, secs: u64) {
        self.inner.storage.borrow_mut().clock = secs;
        self.inner.part.set(Duration::ZERO);
    }

    /// Moves the clock on by `by`.
    pub fn advance(&self, by: Duration) {
        let total = self.inner.part.get() + by;
        self.inner.storage.borrow_mut().clock += total.as_secs();
        self.inner
            .part
            .set(total - Duration::from_secs(total.as_secs()));
    }

    /// A pause of `by` for a caller's `Context::sleep`: the clock moves on by `by`, and the
    /// caller gives the others a turn.
    pub fn pause(&self, by: Duration) -> Pin<Box<dyn Future<Output = ()>>> {
        let memory = self.clone();
        Box::pin(async move {
            memory.advance(by);
            YieldOnce(false).await;
        })
    }

    /// Answers every request to `host` (`name[:port]`) with `answer`: a webhook's receiver,
    /// a job. A host neither storage nor routed refuses the connection.
    pub fn route(&self, host: &str, answer: impl Fn(&WireRequest) -> WireResponse + 'static) {
        self.inner
            .hosts
            .borrow_mut()
            .push((host.to_string(), Rc::new(answer)));
    }

    /// Whether each request waits for its caller's next poll before it is answered, so that
    /// callers joined on one thread ([`together`]) take turns request by request instead of
    /// each running to its end. Off by default.
    pub fn take_turns(&self, on: bool) {
        self.inner.turns.set(on);
    }

    /// Every request sent so far, in order (storage's and the routed hosts').
    pub fn sent(&self) -> Vec<WireRequest> {
        self.inner.sent.borrow().clone()
    }

    /// How many requests went to storage (blobs and tables).
    pub fn storage_requests(&self) -> usize {
        self.inner
            .sent
            .borrow()
            .iter()
            .filter(|r| is_storage(r))
            .count()
    }

    /// The answer to `request`: storage's, a routed host's, or `None` (no such host).
    fn answer(&self, request: &WireRequest) -> Option<WireResponse> {
        match request.host() {
            BLOB_HOST => Some(self.inner.storage.borrow_mut().handle(request)),
            TABLE_HOST => Some(self.inner.storage.borrow_mut().handle_table(request)),
            host => {
                let answer = self
                    .inner
                    .hosts
                    .borrow()
                    .iter()
                    .find(|(h, _)| h == host)
                    .map(|(_, answer)| answer.clone())?;
                // Not borrowed while it answers: it may read the storage or the clock.
                Some(answer(request))
            }
        }
    }
}

/// Runs `a` and `b` on this thread to their ends, joined: with [`Memory::take_turns`] their
/// requests alternate (two deployments acting at once); the outputs, in order.
pub fn together<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    pollster::block_on(futures::future::join(a, b))
}

/// Whether `request` goes to the storage model (its blobs or its tables).
pub fn is_storage(request: &WireRequest) -> bool {
    matches!(request.host(), BLOB_HOST | TABLE_HOST)
}

impl Transport for Memory {
    async fn send(&self, request: Request) -> Result<Response, TransportError> {
        if self.inner.turns.get() {
            YieldOnce(false).await;
        }
        let request = WireRequest::from(&request);
        self.inner.sent.borrow_mut().push(request.clone());
        match self.answer(&request) {
            Some(answer) => Ok(answer.to_response()),
            None => Err(TransportError::new(
                TransportErrorKind::Connect,
                format!("connection refused: no host {} in memory", request.host()),
            )),
        }
    }

    /// The storage clock: every request is dated as storage reads it.
    fn now(&self) -> Option<SystemTime> {
        Some(Memory::now(self))
    }
}

/// Pending once (waking its task at once), then ready: the other futures joined with it run
/// meanwhile.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_keeps_what_passed_of_its_second() {
        let memory = Memory::new(100);
        memory.advance(Duration::from_millis(600));
        assert_eq!(memory.clock(), 100);
        memory.advance(Duration::from_millis(600));
        assert_eq!(memory.clock(), 101);
        assert_eq!(
            memory.now(),
            SystemTime::UNIX_EPOCH + Duration::from_millis(101_200)
        );
        memory.set_clock(50);
        assert_eq!(
            memory.now(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(50)
        );
    }
}
