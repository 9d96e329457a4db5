//! The job's reservation protocol: scheduled-job's own tick (`scheduled_job::tick`: reserve the
//! occurrence, take the job's lease, write the outcome `running` by compare-and-swap with a
//! nonce, call the job, record the result, settle earlier occurrences, retries and takeover),
//! run by several deployments on one occurrence, over the model's storage and network. The job
//! itself is a host of the model's that counts every call it receives.

use std::cell::Cell;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use leasegate::LeaseId;
use leasegate_spin::cache::NoCache;
use leasegate_spin::timer::{Source, Tick};
use leasegate_spin::{Context, Pause};
use stateright::Property;

use crate::storage::Storage;
use crate::wire::{WireRequest, WireResponse};
use crate::world::{Io, Protocol, Run, State, Status, World, CONNECTION_STRING, START};

/// The job's host: its calls are counted here, never sent anywhere.
pub const JOB_HOST: &str = "job.model";

/// The schedule's period (seconds).
pub const PERIOD: u64 = 60;

/// A deployment's tick.
#[derive(Debug, Clone)]
pub struct Ticker {
    /// Its `instance_id`.
    pub instance: &'static str,
    /// Its clock's offset from storage's (seconds).
    pub skew: u64,
    /// The occurrence it ticks, as a multiple of the period after [`START`].
    pub occurrence: u64,
    /// It starts after this many seconds of storage's clock (a trigger that fired late, a
    /// slow invocation): the others go on meanwhile.
    pub delay: u64,
    /// It starts when every other tick has finished or vanished (the liveness check: it
    /// settles what they left), and the network delivers its requests (fair delivery).
    pub last: bool,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Note {
    /// The job received a call (noted by the job's host, whether or not its answer arrives).
    Called {
        /// The occurrence (Unix seconds).
        occurrence: u64,
        /// The attempt.
        attempt: u32,
        /// The fencing token.
        token: u64,
    },
    /// A tick ended with this decision.
    Decided(String),
    /// A run's start landed in the log with this fencing token: the token was issued (noted by
    /// storage's side when the write is applied, whether or not its answer arrives).
    Issued {
        /// The token.
        token: u64,
    },
}

/// A planted mistake (tests only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mistake {
    /// The outcome `running` written without the reservation's `If-Match`.
    OutcomeWithoutCompareAndSwap,
    /// The job called with its occurrence's token (`occurrence x 2^16 + attempt - 1`), as
    /// before tokens were issued by the log: a retry of an older occurrence after a newer one's
    /// run gets a lower token.
    TokensByOccurrence,
}

/// The job's reservation protocol under check.
#[derive(Debug, Clone)]
pub struct JobProtocol {
    /// The ticks.
    pub tickers: Vec<Ticker>,
    /// `job_retries`.
    pub retries: u32,
    /// Fault budget.
    pub faults: u8,
    /// Storage starts with no log (a brand-new job) instead of a job that has run before.
    pub fresh: bool,
    /// Crash budget.
    pub crashes: u8,
    /// Clock advances allowed (1 s or 20 s: past the job's run deadline).
    pub advances: u8,
    /// A planted mistake, or none.
    pub mistake: Option<Mistake>,
}

impl JobProtocol {
    /// A bound CI checks: a deployment ticks an occurrence and another ticks it 20 s late (past
    /// a reservation's deadline: a trigger that fired late, while the first may still be at
    /// work), then a third ticks the next occurrence and settles what they left; `retries`
    /// retries; no fault.
    pub fn bounded(retries: u32) -> Self {
        JobProtocol {
            tickers: vec![
                ticker("node-a", 0, 0, 0, false),
                ticker("node-c", 0, 0, 20, false),
                ticker("node-d", 0, 1, PERIOD + 2, true),
            ],
            retries,
            faults: 0,
            fresh: false,
            crashes: 0,
            advances: 0,
            mistake: None,
        }
    }

    /// The other bound CI checks: two deployments tick an occurrence on time (clocks a second
    /// apart), with one fault (any kind, on any request, the job's call included) and one crash
    /// among them, then a third ticks the next occurrence and settles what they left.
    pub fn faulty(retries: u32) -> Self {
        JobProtocol {
            tickers: vec![
                ticker("node-a", 0, 0, 0, false),
                ticker("node-b", 1, 0, 0, false),
                ticker("node-d", 0, 1, PERIOD + 2, true),
            ],
            faults: 1,
            crashes: 1,
            ..JobProtocol::bounded(retries)
        }
    }

    /// A brand-new job (no log, no container): a deployment ticks the first occurrence and may
    /// vanish at any step (one crash), another ticks it late, and a third ticks the next and
    /// settles what they left; its walk starts from the log it creates.
    pub fn fresh(retries: u32) -> Self {
        JobProtocol {
            fresh: true,
            crashes: 1,
            ..JobProtocol::bounded(retries)
        }
    }

    /// A brand-new job whose first tick is slow: the next occurrence's tick comes while it is at
    /// work (its outcome not written yet, the log not yet there), then a third occurrence's
    /// tick settles what they left; no crash (the interleavings alone).
    pub fn fresh_slow_first(retries: u32) -> Self {
        JobProtocol {
            tickers: vec![
                ticker("node-a", 0, 0, 0, false),
                ticker("node-c", 0, 1, PERIOD, false),
                ticker("node-d", 0, 2, 2 * PERIOD + 2, true),
            ],
            crashes: 0,
            ..JobProtocol::fresh(retries)
        }
    }

    /// Without the last tick (nothing settles what the others leave: the liveness property must
    /// then fail, which shows it can).
    pub fn without_last(mut self) -> Self {
        self.tickers.retain(|t| !t.last);
        self
    }

    /// With a planted mistake.
    pub fn with_mistake(mut self, mistake: Mistake) -> Self {
        self.mistake = Some(mistake);
        self
    }

    /// Every tick but the last has finished or vanished, and no request is in flight.
    fn others_done(&self, state: &State<Note>) -> bool {
        state.in_flight.is_empty()
            && state
                .callers
                .iter()
                .enumerate()
                .all(|(j, c)| self.tickers[j].last || !matches!(c.status, Status::Waiting(_)))
    }

    fn variables(&self, instance: &str) -> HashMap<String, String> {
        [
            ("instance_id", instance),
            ("job_name", "job"),
            ("job_url", "http://job.model/run"),
            ("job_period_seconds", "60"),
            ("job_timeout_seconds", "1"),
            ("storage_timeout_ms", "1000"),
            ("job_retry_delay_seconds", "0"),
            ("storage_origin", "http://127.0.0.1:10000"),
            ("storage_connection_string", CONNECTION_STRING),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain([("job_retries".to_string(), self.retries.to_string())])
        .collect()
    }
}

fn ticker(instance: &'static str, skew: u64, occurrence: u64, delay: u64, last: bool) -> Ticker {
    Ticker {
        instance,
        skew,
        occurrence,
        delay,
        last,
    }
}

async fn run_tick(i: usize, protocol: JobProtocol, io: Io<Note>) {
    let ticker = &protocol.tickers[i];
    let waited = ticker.delay;
    if waited > 0 {
        io.sleep(waited).await;
    }
    let vars = protocol.variables(ticker.instance);
    let settings = match scheduled_job::Settings::load(&vars) {
        Ok(s) => s,
        Err(e) => panic!("the model's settings do not load: {e}"),
    };
    let connect = {
        let io = io.clone();
        move |_timeout: Duration| io.clone()
    };
    let ids = Cell::new(0u8);
    let new_lease_id = || {
        ids.set(ids.get() + 1);
        let mut bytes = [0u8; 16];
        bytes[0] = 0xB0 | i as u8;
        bytes[1] = ids.get();
        LeaseId::from_random_bytes(bytes)
    };
    let sleep = {
        let io = io.clone();
        move |d: Duration| -> Pause {
            let io = io.clone();
            Box::pin(async move { io.sleep(d.as_secs()).await })
        }
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(START + ticker.skew + waited);
    let ctx = Context {
        connect: &connect,
        variables: &vars,
        now,
        new_lease_id: &new_lease_id,
        sleep: &sleep,
        cache: &NoCache,
        log_decisions: false,
    };
    let tick = Tick {
        at: SystemTime::UNIX_EPOCH + Duration::from_secs(START + ticker.occurrence * PERIOD),
        source: Source::Cron,
        past_due: false,
    };
    let outcome = scheduled_job::tick(&ctx, &settings, &tick, scheduled_job::Ask::default()).await;
    io.note(Note::Decided(format!("{:?}", outcome.decision)));
}

/// A write of the job's log.
fn is_log_write(request: &WireRequest) -> bool {
    request.method == "PUT" && request.path().ends_with("/jobs/job/log.json")
}

/// The outcome `running` written on a reservation.
fn is_running_write(request: &WireRequest) -> bool {
    request.method == "PUT"
        && request.path().contains("/occurrences/")
        && request.query("comp").as_deref() == Some("metadata")
        && request.header("x-ms-meta-leasegate_run") == Some("running")
}

impl Protocol for JobProtocol {
    type Note = Note;

    fn callers(&self) -> usize {
        self.tickers.len()
    }

    fn run(&self, i: usize, io: Io<Note>) -> Run {
        Box::pin(run_tick(i, self.clone(), io))
    }

    /// A job that has run before: its log exists, every occurrence before the checked one
    /// settled; or, [`JobProtocol::fresh`], nothing at all (not even the container).
    fn storage(&self) -> Storage {
        let mut storage = Storage::new(START);
        if self.fresh {
            return storage;
        }
        storage.create_container("leasegate");
        let log = serde_json::json!({
            "job": "job",
            "entries": [],
            "settledThrough": START - PERIOD,
        });
        storage.seed_blob(
            "leasegate",
            "jobs/job/log.json",
            log.to_string().into_bytes(),
        );
        storage
    }

    fn budgets(&self) -> (u8, u8, u8) {
        (self.faults, self.advances, self.crashes)
    }

    fn advances(&self) -> &[u64] {
        &[1, 20]
    }

    fn may_act(&self, i: usize, state: &State<Note>) -> bool {
        !self.tickers[i].last || self.others_done(state)
    }

    /// Fair delivery for the last tick: the clock moves only by its own wait once it runs.
    fn may_advance(&self, state: &State<Note>) -> bool {
        !self.others_done(state)
    }

    /// Fair delivery for the late tick: the network fails only the first ticks' requests, and
    /// only they may vanish.
    fn may_fail(&self, i: usize, request: &WireRequest) -> bool {
        !self.tickers[i].last && request.host() != crate::world::CLOCK_HOST
    }

    fn outside(
        &self,
        i: usize,
        request: &WireRequest,
        log: &mut Vec<(usize, Note)>,
    ) -> WireResponse {
        if request.host() != JOB_HOST {
            return WireResponse::new(404);
        }
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap_or_default();
        let occurrence = body["occurrenceUnix"].as_u64().unwrap_or(0);
        let attempt = body["attempt"].as_u64().unwrap_or(0) as u32;
        let token = match self.mistake {
            Some(Mistake::TokensByOccurrence) => (occurrence << 16) + u64::from(attempt) - 1,
            _ => body["fencingToken"].as_u64().unwrap_or(0),
        };
        log.push((
            i,
            Note::Called {
                occurrence,
                attempt,
                token,
            },
        ));
        WireResponse::new(200)
    }

    /// The log as it was before a write of it.
    fn before(&self, request: &WireRequest, storage: &Storage) -> Option<Vec<u8>> {
        is_log_write(request).then(|| {
            storage
                .blob("leasegate", "jobs/job/log.json")
                .map(|b| b.body.clone())
                .unwrap_or_default()
        })
    }

    /// A run's start written to the log: each `running` entry the write adds (not in the log
    /// before it, as that entry) is a token issued then, even if the same token was issued
    /// before (which the token property then catches).
    fn observe(
        &self,
        i: usize,
        request: &WireRequest,
        response: &WireResponse,
        before: Option<Vec<u8>>,
        log: &mut Vec<(usize, Note)>,
    ) {
        if !is_log_write(request) || !(200..300).contains(&response.status) {
            return;
        }
        let Ok(written) = serde_json::from_slice::<scheduled_job::Log>(&request.body) else {
            return;
        };
        let before: Option<scheduled_job::Log> =
            before.and_then(|b| serde_json::from_slice(&b).ok());
        for entry in written.entries {
            let Some(token) = entry.fencing_token else {
                continue;
            };
            let known = before.as_ref().is_some_and(|b| b.entries.contains(&entry));
            if entry.status == scheduled_job::RunStatus::Running && !known {
                log.push((i, Note::Issued { token }));
            }
        }
    }

    fn mutate(&self, request: &mut WireRequest) {
        if self.mistake == Some(Mistake::OutcomeWithoutCompareAndSwap) && is_running_write(request)
        {
            request.remove_header("if-match");
        }
    }

    fn properties() -> Vec<Property<World<Self>>> {
        vec![
            Property::always(
                "each attempt of an occurrence is called at most once",
                |_, s| each_attempt_once(s),
            ),
            Property::always(
                "tokens strictly rise in the order runs start: each call's was issued, and every \
                 token issued after a call is above it",
                |_, s| tokens_rise(s),
            ),
            Property::always("never more attempts than job_retries allows", |m, s| {
                attempts_within(m, s)
            }),
            Property::eventually(
                "every occurrence ticked is settled, in its reservation or its log entry, and \
                 no log entry is left running",
                |m, s| ended(s) && settled(m, s),
            ),
        ]
    }
}

fn calls(state: &State<Note>) -> Vec<(u64, u32, u64)> {
    state
        .log
        .iter()
        .filter_map(|(_, n)| match n {
            Note::Called {
                occurrence,
                attempt,
                token,
            } => Some((*occurrence, *attempt, *token)),
            _ => None,
        })
        .collect()
}

fn each_attempt_once(state: &State<Note>) -> bool {
    let calls = calls(state);
    calls
        .iter()
        .enumerate()
        .all(|(k, a)| calls[k + 1..].iter().all(|b| (a.0, a.1) != (b.0, b.1)))
}

/// Tokens are issued in rising order when each run's start lands in the log, every call
/// carries a token issued before it, and a token issued after the job received a call is
/// above that call's. Not by arrival alone: an attempt whose call timed out may still arrive
/// after a later run's (the checker finds it: a late request), and the job's receiver refuses
/// it by its lower token.
fn tokens_rise(state: &State<Note>) -> bool {
    let mut issued = Vec::new();
    let mut called = Vec::new();
    for (_, note) in &state.log {
        match note {
            Note::Issued { token } => {
                if issued.last().is_some_and(|t| t >= token) || called.iter().any(|c| c >= token) {
                    return false;
                }
                issued.push(*token);
            }
            Note::Called { attempt, token, .. } => {
                if *attempt < 1 || !issued.contains(token) {
                    return false;
                }
                called.push(*token);
            }
            Note::Decided(_) => {}
        }
    }
    true
}

fn attempts_within(model: &World<JobProtocol>, state: &State<Note>) -> bool {
    let most = model.protocol.retries + 1;
    let calls = calls(state);
    calls.iter().all(|(occurrence, attempt, _)| {
        *attempt >= 1
            && *attempt <= most
            && calls.iter().filter(|c| c.0 == *occurrence).count() <= most as usize
    })
}

/// Every tick has finished or vanished and no request is in flight (the liveness property
/// judges the end: before the first reservation, "every reservation is settled" holds
/// trivially).
fn ended(state: &State<Note>) -> bool {
    state.in_flight.is_empty()
        && state
            .callers
            .iter()
            .all(|c| !matches!(c.status, Status::Waiting(_)))
}

/// Every occurrence a tick named, and every one with a reservation, is settled: its
/// reservation has an outcome that no longer changes (not `running`, `pending` or none), or the
/// log records a final result for it (a runner that logged its result and vanished before
/// writing it on the reservation: the log is what every later tick reads first). And no log
/// entry is left `running` or `pending` (a log entry is what operators read). A reservation
/// that was deleted while the log said `running` is therefore caught: its occurrence has
/// neither. An occurrence due before the job's history began (the log's `historyFrom`) is
/// settled by definition: a job's history begins at its first tick.
fn settled(model: &World<JobProtocol>, state: &State<Note>) -> bool {
    let log: Option<scheduled_job::Log> = state
        .storage
        .blob("leasegate", "jobs/job/log.json")
        .and_then(|b| serde_json::from_slice(&b.body).ok());
    let open = |status: &scheduled_job::RunStatus| {
        matches!(
            status,
            scheduled_job::RunStatus::Running | scheduled_job::RunStatus::Pending
        )
    };
    let logged = |occurrence: u64| {
        log.as_ref().is_some_and(|log| {
            log.entries
                .iter()
                .any(|e| e.occurrence_unix == occurrence && !open(&e.status))
        })
    };
    let reserved = |occurrence: u64| {
        state
            .storage
            .blob(
                "leasegate",
                &format!("jobs/job/occurrences/{occurrence:012}"),
            )
            .and_then(|b| b.metadata.get("leasegate_run").cloned())
            .is_some_and(|run| run != "running" && run != "pending")
    };
    let ticked = model
        .protocol
        .tickers
        .iter()
        .map(|t| START + t.occurrence * PERIOD);
    let stored = state
        .storage
        .blobs()
        .filter_map(|((_, name), _)| name.strip_prefix("jobs/job/occurrences/")?.parse().ok());
    // Due before the job's history began (its first tick came later than the tolerance):
    // not in the history, nothing to settle (a reservation a late first tick left as it
    // vanished is deleted by the clean-up in time, like every reservation).
    let before_history = |occurrence: u64| {
        let reservation = state.storage.blob(
            "leasegate",
            &format!("jobs/job/occurrences/{occurrence:012}"),
        );
        log.as_ref()
            .is_some_and(|log| occurrence < log.history_from)
            && reservation.is_none_or(|b| {
                b.metadata.get("leasegate_past_due").map(String::as_str) == Some("true")
            })
    };
    let none_open = log
        .as_ref()
        .is_none_or(|log| log.entries.iter().all(|e| !open(&e.status)));
    none_open
        && ticked
            .chain(stored)
            .all(|o| reserved(o) || logged(o) || before_history(o))
}
