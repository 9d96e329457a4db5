//! The job's tick run natively, as each deployment's cron trigger runs it (`scheduled_job::tick`
//! with the settings its variables give), against the in-memory storage
//! (`leasegate-test-support`), the job itself a stub at `job.test` that counts its calls. What
//! each case checks is what the job received, the tick's decision, and what storage holds: the
//! occurrence's reservation (its outcome in metadata) and the job's log.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use leasegate::{Method, Request};
use leasegate_spin::auth::Power;
use leasegate_spin::record::{META_ATTEMPT, META_RESERVED_BY, META_RUN};
use leasegate_spin::timer::{Source, Tick, TimerFunction};
use leasegate_test_support::instance::Instance;
use leasegate_test_support::memory::{together, Memory};
use leasegate_test_support::wire::WireResponse;
use scheduled_job::{Ask, Log, RunStatus, ScheduledJob, Settings};

/// 2026-11-19T14:00:00Z, an occurrence of every job of a minute's period.
const START: u64 = 1_795_096_800;
const PERIOD: u64 = 60;

/// The job at `job.test`: each call it got (occurrence, attempt, fencing token), and the
/// statuses it answers, in turn (the last one from then on).
struct Job {
    calls: RefCell<Vec<(u64, u64, u64)>>,
    answers: RefCell<Vec<u16>>,
    answered: Cell<usize>,
}

impl Job {
    /// The job, answering `answers` in turn.
    fn at(memory: &Memory, answers: &[u16]) -> Rc<Job> {
        let job = Rc::new(Job {
            calls: RefCell::new(Vec::new()),
            answers: RefCell::new(answers.to_vec()),
            answered: Cell::new(0),
        });
        let stub = job.clone();
        memory.route("job.test", move |r| {
            let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            let field = |name: &str| body[name].as_u64().unwrap_or(0);
            stub.calls.borrow_mut().push((
                field("occurrenceUnix"),
                field("attempt"),
                field("fencingToken"),
            ));
            let answers = stub.answers.borrow();
            let k = stub.answered.get().min(answers.len() - 1);
            stub.answered.set(stub.answered.get() + 1);
            WireResponse::new(answers[k])
        });
        job
    }

    fn calls(&self) -> Vec<(u64, u64, u64)> {
        self.calls.borrow().clone()
    }
}

/// A deployment of the job `nightly`, every minute, calling `job.test`; `more` beside.
fn deployment(memory: &Memory, instance: &str, more: &[(&str, &str)]) -> Instance {
    let mut variables = vec![
        ("job_name", "nightly"),
        ("job_url", "http://job.test/run"),
        ("job_period_seconds", "60"),
        ("job_timeout_seconds", "5"),
    ];
    variables.extend_from_slice(more);
    Instance::new(memory, instance, &variables)
}

/// A cron tick of `instance` now, for the trigger time `at` (Unix seconds): the decision's
/// name (or the error's text).
async fn tick_at(instance: &Instance, at: u64) -> String {
    let ctx = instance.context();
    let settings = Settings::load(instance.variables()).expect("the settings load");
    let t = Tick {
        at: SystemTime::UNIX_EPOCH + Duration::from_secs(at),
        source: Source::Cron,
        past_due: false,
    };
    let outcome = scheduled_job::tick(&ctx, &settings, &t, Ask::default()).await;
    match outcome.decision {
        Ok(d) => d.name().to_string(),
        Err(e) => format!("error: {e}"),
    }
}

fn tick(instance: &Instance, at: u64) -> String {
    pollster::block_on(tick_at(instance, at))
}

/// The metadata value `name` of the reservation of `occurrence`.
fn reservation(memory: &Memory, occurrence: u64, name: &str) -> Option<String> {
    let storage = memory.storage();
    let blob = storage.blob(
        "leasegate",
        &format!("jobs/nightly/occurrences/{occurrence:012}"),
    )?;
    blob.metadata.get(name).cloned()
}

/// The job's log as storage holds it.
fn log(memory: &Memory) -> Log {
    let storage = memory.storage();
    let blob = storage
        .blob("leasegate", "jobs/nightly/log.json")
        .expect("the job's log");
    serde_json::from_slice(&blob.body).expect("the log parses")
}

/// The log's entry for `occurrence`: its status, instance and attempt.
fn entry(memory: &Memory, occurrence: u64) -> Option<(RunStatus, String, Option<u32>)> {
    log(memory)
        .entries
        .into_iter()
        .find(|e| e.occurrence_unix == occurrence)
        .map(|e| (e.status, e.instance, e.attempt))
}

#[test]
fn a_first_tick_runs_its_occurrence_once() {
    let memory = Memory::new(START);
    let job = Job::at(&memory, &[200]);
    let a = deployment(&memory, "node-a", &[]);
    assert_eq!(tick(&a, START), "ran");
    let calls = job.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!((calls[0].0, calls[0].1), (START, 1));
    assert_eq!(
        reservation(&memory, START, META_RUN).as_deref(),
        Some("succeeded")
    );
    assert_eq!(
        reservation(&memory, START, META_RESERVED_BY).as_deref(),
        Some("node-a")
    );
    assert_eq!(
        entry(&memory, START),
        Some((RunStatus::Succeeded, "node-a".into(), Some(1)))
    );
    // The token the job got is the one the log issued.
    let logged = log(&memory).entries[0].fencing_token;
    assert_eq!(logged, Some(calls[0].2));
}

#[test]
fn another_instance_ticking_the_same_occurrence_skips_it() {
    let memory = Memory::new(START);
    let job = Job::at(&memory, &[200]);
    let (a, b) = (
        deployment(&memory, "node-a", &[]),
        deployment(&memory, "node-b", &[]),
    );
    assert_eq!(tick(&a, START), "ran");
    // node-b's trigger fires a second later, for the same occurrence.
    memory.advance(Duration::from_secs(1));
    assert_eq!(tick(&b, START + 1), "skipped");
    assert_eq!(job.calls().len(), 1, "{:?}", job.calls());
    assert_eq!(
        reservation(&memory, START, META_RESERVED_BY).as_deref(),
        Some("node-a")
    );
    assert_eq!(
        entry(&memory, START).map(|e| e.0),
        Some(RunStatus::Succeeded)
    );
}

#[test]
fn two_instances_ticking_at_once_run_it_once() {
    let memory = Memory::new(START);
    let job = Job::at(&memory, &[200]);
    let (a, b) = (
        deployment(&memory, "node-a", &[]),
        deployment(&memory, "node-b", &[]),
    );
    memory.take_turns(true);
    let (da, db) = together(tick_at(&a, START), tick_at(&b, START));
    let mut decisions = [da, db];
    decisions.sort();
    assert_eq!(decisions, ["ran", "skipped"]);
    assert_eq!(job.calls().len(), 1, "{:?}", job.calls());
    assert_eq!(
        reservation(&memory, START, META_RUN).as_deref(),
        Some("succeeded")
    );
}

#[test]
fn a_failed_job_is_retried_on_a_later_tick() {
    let memory = Memory::new(START);
    let job = Job::at(&memory, &[500, 200]);
    let retries = [("job_retries", "1"), ("job_retry_delay_seconds", "30")];
    let (a, b) = (
        deployment(&memory, "node-a", &retries),
        deployment(&memory, "node-b", &retries),
    );
    assert_eq!(tick(&a, START), "failed");
    assert_eq!(
        reservation(&memory, START, META_RUN).as_deref(),
        Some("failed")
    );
    // Within the retry delay, another tick of it does not call the job.
    memory.advance(Duration::from_secs(2));
    assert_eq!(tick(&b, START + 2), "skipped");
    assert_eq!(job.calls().len(), 1);
    // The next minute's tick runs its own occurrence and retries the failed one: attempt 2.
    memory.set_clock(START + PERIOD);
    assert_eq!(tick(&b, START + PERIOD), "ran");
    let attempts: Vec<(u64, u64)> = job.calls().iter().map(|c| (c.0, c.1)).collect();
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    assert!(attempts.contains(&(START, 2)), "{attempts:?}");
    assert!(attempts.contains(&(START + PERIOD, 1)), "{attempts:?}");
    assert_eq!(
        reservation(&memory, START, META_RUN).as_deref(),
        Some("succeeded")
    );
    assert_eq!(
        reservation(&memory, START, META_ATTEMPT).as_deref(),
        Some("2")
    );
    assert_eq!(
        entry(&memory, START),
        Some((RunStatus::Succeeded, "node-b".into(), Some(2)))
    );
    // Each attempt's token is above the one before.
    let tokens: Vec<u64> = job.calls().iter().map(|c| c.2).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[test]
fn a_paused_job_is_not_run_until_it_is_resumed() {
    let memory = Memory::new(START - PERIOD);
    let job = Job::at(&memory, &[200]);
    let a = deployment(&memory, "node-a", &[]);
    // Its history begins: the tick of the minute before.
    assert_eq!(tick(&a, START - PERIOD), "ran");
    // The operator's routes, with the admin token: a pause with its note, a resume.
    let admin = |action: &str| {
        let body = if action == "pause" {
            br#"{"note": "maintenance"}"#.to_vec()
        } else {
            Vec::new()
        };
        let uri = format!("http://app.test/api/jobs/nightly/{action}");
        let request = Request::new(Method::POST, uri).with_body(body);
        let answer = pollster::block_on(ScheduledJob::api(
            &a.context(),
            &request,
            Power::Admin,
            Instant::now(),
        ));
        assert_eq!(
            answer.status().as_u16(),
            200,
            "{action}: {}",
            String::from_utf8_lossy(answer.body())
        );
    };
    admin("pause");
    assert!(log(&memory).paused.is_some());
    memory.set_clock(START);
    assert_eq!(tick(&a, START), "paused");
    assert_eq!(job.calls().len(), 1, "not called while paused");
    assert_eq!(
        reservation(&memory, START, META_RUN).as_deref(),
        Some("skipped_paused")
    );
    assert_eq!(
        entry(&memory, START).map(|e| e.0),
        Some(RunStatus::SkippedPaused)
    );
    admin("resume");
    memory.set_clock(START + PERIOD);
    assert_eq!(tick(&a, START + PERIOD), "ran");
    assert_eq!(
        job.calls().iter().map(|c| c.0).collect::<Vec<_>>(),
        [START - PERIOD, START + PERIOD]
    );
}
