//! The attempt's plan stepped without storage: each test scripts the answers a real attempt
//! gets (a lease held or busy, a write refused, an answer lost, slow storage) and asserts the
//! steps the plan asks for, in order, and what it comes to.

use super::*;
use crate::reservation::META_RUN;
use crate::settings::tests::settings_with;
use leasegate::ETag;

const OCCURRENCE: u64 = 1_796_083_200; // 2026-12-01T00:00:00Z

fn t(s: u64) -> SystemTime {
    at(s)
}

fn settings(extra: &[(&str, &str)]) -> Settings {
    let mut vars = vec![("job_period_seconds", "60")];
    vars.extend_from_slice(extra);
    settings_with(&vars)
}

fn reservation(settings: &Settings, outcome: Option<&str>, created: bool) -> Reservation {
    let mut metadata = leasegate::ops::Metadata::new();
    if let Some(outcome) = outcome {
        metadata.insert(META_RUN.into(), outcome.into());
    }
    Reservation {
        blob: settings.reservation(OCCURRENCE).unwrap(),
        etag: Some(ETag::new("\"0x1\"")),
        metadata,
        created,
    }
}

fn knows<'a>(settings: &'a Settings, reservation: &'a Reservation) -> Knows<'a> {
    Knows {
        settings,
        source: Source::Cron,
        occurrence: OCCURRENCE,
        attempt: 1,
        now: t(OCCURRENCE),
        server_now: t(OCCURRENCE),
        reservation,
        reserved_by: Some(settings.instance_id.clone()),
        skip_late: false,
        token_refused: false,
        entry: LogEntry {
            occurrence: rfc3339(t(OCCURRENCE)),
            occurrence_unix: OCCURRENCE,
            instance: settings.instance_id.clone(),
            reserved_at: rfc3339(t(OCCURRENCE)),
            status: RunStatus::Running,
            fencing_token: Some(7),
            trigger: "cron".into(),
            past_due: false,
            finished_at: None,
            reason: None,
            attempt: Some(1),
        },
    }
}

/// The log as a write left it, at `date`, with the run's entry carrying `token`.
fn log_at(date: SystemTime, token: Option<u64>) -> LogWrite {
    let mut log = crate::log::Log {
        job: "j".into(),
        ..Default::default()
    };
    if let Some(token) = token {
        let mut entry = knows_entry();
        entry.fencing_token = Some(token);
        entry.finished_at = Some(rfc3339(date));
        log.entries.push(entry);
    }
    LogWrite::read(log, Some(ETag::new("\"0x2\"")), date)
}

fn knows_entry() -> LogEntry {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    knows(&s, &r).entry
}

/// A pause as an operator's `POST /api/jobs/{job}/pause` records it.
fn paused() -> Paused {
    Paused {
        since: "2026-12-01T00:00:00Z".into(),
        note: None,
    }
}

fn held() -> Lease {
    Lease::Held {
        expires_at: Some(t(OCCURRENCE + 60)),
        state: None,
    }
}

fn busy(label: &str) -> Lease {
    Lease::Busy {
        retry_after: Some(Duration::from_secs(20)),
        holder: Some(Holder {
            label: label.into(),
            since: None,
            expires_at: None,
            token: 1,
            held_for: None,
            marks: Default::default(),
        }),
    }
}

/// A step's name, as the test's expected path spells it.
fn name(step: &Step) -> &'static str {
    match step {
        Step::ReadLog => "read log",
        Step::Acquire(Some(_)) => "acquire from kept",
        Step::Acquire(None) => "acquire",
        Step::ReadReservation => "read reservation",
        Step::Commit { .. } => "commit",
        Step::Append { .. } => "append",
        Step::Overwrite { .. } => "overwrite",
        Step::AppendAgain { .. } => "append again",
        Step::CallJob(_) => "call job",
        Step::Release => "release",
        Step::Update { .. } => "update",
        Step::RecordResult { .. } => "record result",
        Step::PutBack(PutBack::TakeBack) => "take back",
        Step::PutBack(PutBack::Restore(_)) => "restore",
        Step::PutBack(PutBack::Uncommit(_)) => "uncommit",
        Step::PutBack(PutBack::Undo(..)) => "undo",
        Step::Done(..) => "done",
        Step::Fail(_) => "fail",
    }
}

/// Storage and the job as an attempt meets them: every step answers as `answer` says, or as
/// on a good day.
struct Script {
    lease: Vec<Lease>,
    commit: Option<Result<Committed, Failed>>,
    append: Option<Result<Result<LogWrite, LogRefusal>, Failed>>,
    job: Result<(), String>,
    reread: Option<RunStatus>,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            lease: vec![held()],
            commit: None,
            append: None,
            job: Ok(()),
            reread: None,
        }
    }
}

/// Steps the plan to its end: the steps it asked for, and the last (done or fail).
fn walk(k: &Knows, script: Script) -> (Vec<&'static str>, Step) {
    let mut a = Answers::default();
    let mut steps = Vec::new();
    let mut leases = script.lease.into_iter();
    for _ in 0..MAX {
        let step = next(k, &a);
        if matches!(step, Step::Done(..) | Step::Fail(_)) {
            return (steps, step);
        }
        steps.push(name(&step));
        match step {
            Step::ReadLog => a.log = Some(Ok((log_at(k.server_now, None), Some(k.server_now)))),
            Step::Acquire(_) => a.lease.push(leases.next().expect("a lease answer")),
            Step::ReadReservation => a.reread = Some(Ok(script.reread.clone())),
            Step::Commit { .. } => {
                let written = Committed::Written(k.reservation.clone());
                a.committed = Some(script.commit.clone().unwrap_or(Ok(written)));
            }
            Step::Append { .. } => {
                let started = Ok(Ok(log_at(k.server_now + Duration::from_secs(1), Some(99))));
                a.appended = Some(script.append.clone().unwrap_or(started));
            }
            Step::Overwrite { .. } => a.overwritten = Some(Ok(true)),
            Step::AppendAgain { .. } => a.appended_again = Some(Ok(())),
            Step::CallJob(_) => a.called = Some(script.job.clone()),
            Step::Release => a.released = Some(None),
            Step::Update { entry, .. } => {
                let mut log = log_at(k.server_now + Duration::from_secs(3), Some(99));
                log.log.entries[0] = entry;
                a.finished = Some(Some(log));
            }
            Step::RecordResult { .. } => a.recorded = true,
            Step::PutBack(_) => a.put_back = true,
            Step::Done(..) | Step::Fail(_) => unreachable!(),
        }
    }
    panic!("the plan took more than {MAX} steps: {steps:?}");
}

const MAX: usize = super::super::MAX_STEPS;

const RUN: [&str; 8] = [
    "read log",
    "acquire",
    "commit",
    "append",
    "call job",
    "release",
    "update",
    "record result",
];

#[test]
fn a_first_attempt_takes_the_lease_logs_calls_releases_and_records() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let (steps, last) = walk(&knows(&s, &r), Script::default());
    assert_eq!(steps, RUN);
    let Step::Done(Decision::Ran { entry }, Some(_)) = last else {
        panic!("{last:?}");
    };
    assert_eq!(entry.status, RunStatus::Succeeded);
    // The token the log issued, not the occurrence's own.
    assert_eq!(entry.fencing_token, Some(99));
    assert_eq!(entry.finished_at, Some(rfc3339(t(OCCURRENCE + 3))));
}

#[test]
fn the_run_starts_from_the_lease_the_log_keeps() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let k = knows(&s, &r);
    // The state a holder's release of a lease record left: a claim naming nobody.
    let released = r#"{"etag":"0x9","leased":false,
        "metadata":{"leasegate_term":"record","leasegate_token":"5"}}"#;
    let state = HeldState::from_json(released);
    let mut log = log_at(k.server_now, None);
    log.log.lock = serde_json::from_str(&state.as_ref().unwrap().to_json()).ok();
    let a = Answers {
        log: Some(Ok((log, Some(k.server_now)))),
        ..Default::default()
    };
    assert_eq!(name(&next(&k, &a)), "acquire from kept");
}

#[test]
fn with_overlap_allowed_no_lease_is_taken_or_released() {
    let s = settings(&[("job_overlap", "allow")]);
    let r = reservation(&s, None, true);
    let (steps, last) = walk(&knows(&s, &r), Script::default());
    assert_eq!(
        steps,
        ["commit", "append", "call job", "update", "record result"]
    );
    assert!(matches!(last, Step::Done(Decision::Ran { .. }, _)));
}

#[test]
fn a_job_that_fails_is_recorded_failed_with_its_reason() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let script = Script {
        job: Err("the job answered 500".into()),
        ..Default::default()
    };
    let (steps, last) = walk(&knows(&s, &r), script);
    assert_eq!(steps, RUN);
    let Step::Done(Decision::JobFailed { entry }, _) = last else {
        panic!("{last:?}");
    };
    assert_eq!(entry.status, RunStatus::Failed);
    assert_eq!(entry.reason.as_deref(), Some("the job answered 500"));
}

#[test]
fn an_occurrence_settled_already_is_skipped_without_a_request() {
    let s = settings(&[]);
    let r = reservation(&s, Some("succeeded"), false);
    let mut k = knows(&s, &r);
    k.reserved_by = Some("another".into());
    let (steps, last) = walk(&k, Script::default());
    assert!(steps.is_empty());
    let Step::Done(Decision::Skipped { reason, .. }, None) = last else {
        panic!("{last:?}");
    };
    assert_eq!(reason, Skip::SettledLate(RunStatus::Succeeded));
}

#[test]
fn a_backfill_runs_an_occurrence_recorded_missed_over_its_outcome() {
    let s = settings(&[]);
    let r = reservation(&s, Some("missed"), false);
    let mut k = knows(&s, &r);
    k.source = Source::Backfill;
    let a = Answers {
        log: Some(Ok((log_at(k.server_now, None), None))),
        lease: vec![held()],
        ..Default::default()
    };
    let Step::Commit { attempt, over, .. } = next(&k, &a) else {
        panic!("a commit");
    };
    assert_eq!((attempt, over), (1, Over::NeverRan));
    // A scheduled tick does not.
    k.source = Source::Cron;
    assert!(matches!(
        next(&k, &a),
        Step::Done(Decision::Skipped { .. }, _)
    ));
}

#[test]
fn a_retry_writes_over_the_failed_attempt_and_waits_for_any_run_in_the_lease() {
    let s = settings(&[("job_retries", "2")]);
    let r = reservation(&s, Some("failed"), false);
    let mut k = knows(&s, &r);
    k.attempt = 2;
    let a = Answers {
        log: Some(Ok((log_at(k.server_now, None), None))),
        lease: vec![held()],
        ..Default::default()
    };
    let Step::Commit { attempt, over, .. } = next(&k, &a) else {
        panic!("a commit");
    };
    assert_eq!((attempt, over), (2, Over::Attempt(1)));
    let script = Script {
        lease: vec![busy("other-instance 1796083140")],
        ..Default::default()
    };
    let (steps, last) = walk(&k, script);
    assert_eq!(steps, ["read log", "acquire"]);
    let Step::Done(Decision::InProgress { retry_after }, None) = last else {
        panic!("{last:?}");
    };
    assert_eq!(retry_after, Duration::from_secs(20));
}

#[test]
fn a_lost_answer_to_the_acquire_is_tried_once_more_from_a_read() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let script = Script {
        lease: vec![Lease::Failed { unknown: true }, held()],
        ..Default::default()
    };
    let (steps, last) = walk(&knows(&s, &r), script);
    let mut expected = RUN.to_vec();
    expected.insert(2, "acquire");
    assert_eq!(steps, expected);
    assert!(matches!(last, Step::Done(Decision::Ran { .. }, _)));
    // Twice lost, or refused outright: the reservation this tick created is taken back.
    for lease in [
        vec![
            Lease::Failed { unknown: true },
            Lease::Failed { unknown: true },
        ],
        vec![Lease::Failed { unknown: false }],
    ] {
        let tries = lease.len();
        let script = Script {
            lease,
            ..Default::default()
        };
        let (steps, last) = walk(&knows(&s, &r), script);
        let mut expected = vec!["read log"];
        expected.extend(std::iter::repeat_n("acquire", tries));
        expected.push("take back");
        assert_eq!(steps, expected);
        assert!(matches!(last, Step::Fail(None)));
    }
}

#[test]
fn a_failed_outcome_write_releases_then_takes_back_and_a_found_one_keeps_it() {
    let s = settings(&[]);
    let created = reservation(&s, None, true);
    let script = || Script {
        commit: Some(Err(Failed)),
        ..Default::default()
    };
    let (steps, last) = walk(&knows(&s, &created), script());
    assert_eq!(
        steps,
        ["read log", "acquire", "commit", "release", "take back"]
    );
    assert!(matches!(last, Step::Fail(None)));
    // A reservation this tick found (did not create) is never deleted.
    let found = reservation(&s, None, false);
    let (steps, _) = walk(&knows(&s, &found), script());
    assert_eq!(steps, ["read log", "acquire", "commit", "release"]);
    // Another tick wrote the outcome first: released, skipped.
    let script = Script {
        commit: Some(Ok(Committed::Settled(RunStatus::Running))),
        ..Default::default()
    };
    let (steps, last) = walk(&knows(&s, &found), script);
    assert_eq!(steps, ["read log", "acquire", "commit", "release"]);
    assert!(matches!(last, Step::Done(Decision::Skipped { .. }, None)));
}

#[test]
fn after_the_outcome_running_a_failed_log_write_restores_the_reservation_first() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let script = Script {
        append: Some(Err(Failed)),
        ..Default::default()
    };
    let (steps, last) = walk(&knows(&s, &r), script);
    assert_eq!(
        steps,
        ["read log", "acquire", "commit", "append", "restore", "release"]
    );
    assert!(matches!(last, Step::Fail(None)));
}

#[test]
fn a_paused_job_records_skipped_paused_and_a_paused_retry_waits() {
    let s = settings(&[("job_retries", "1")]);
    let r = reservation(&s, None, true);
    let paused = LogRefusal::Paused(paused());
    let script = || Script {
        append: Some(Ok(Err(paused.clone()))),
        ..Default::default()
    };
    let (steps, last) = walk(&knows(&s, &r), script());
    assert_eq!(
        steps,
        [
            "read log",
            "acquire",
            "commit",
            "append",
            "release",
            "overwrite",
            "append again"
        ]
    );
    let Step::Done(Decision::Paused { entry }, None) = last else {
        panic!("{last:?}");
    };
    assert_eq!(entry.status, RunStatus::SkippedPaused);
    assert_eq!(
        entry.reason.as_deref(),
        Some("the job is paused since 2026-12-01T00:00:00Z")
    );
    let failed = reservation(&s, Some("failed"), false);
    let mut k = knows(&s, &failed);
    k.attempt = 2;
    let (steps, last) = walk(&k, script());
    assert_eq!(
        steps,
        ["read log", "acquire", "commit", "append", "uncommit", "release"]
    );
    let Step::Done(Decision::Skipped { reason, .. }, None) = last else {
        panic!("{last:?}");
    };
    assert!(matches!(reason, Skip::PausedRetry { attempt: 2, .. }));
}

#[test]
fn an_entry_the_log_refuses_is_undone_and_answered() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let script = Script {
        append: Some(Ok(Err(LogRefusal::TooOld))),
        ..Default::default()
    };
    let (steps, last) = walk(&knows(&s, &r), script);
    assert_eq!(
        steps,
        ["read log", "acquire", "commit", "append", "undo", "release"]
    );
    assert!(matches!(last, Step::Done(Decision::TooOld { .. }, None)));
}

#[test]
fn slow_storage_before_the_call_puts_the_reservation_back_and_calls_nothing() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let k = knows(&s, &r);
    // The log's write answered when the run's deadline had less than the job's timeout left.
    let late = k.server_now + s.run_deadline() - s.timeout;
    let script = Script {
        append: Some(Ok(Ok(log_at(late, Some(99))))),
        ..Default::default()
    };
    let (steps, last) = walk(&k, script);
    assert_eq!(
        steps,
        ["read log", "acquire", "commit", "append", "restore", "release"]
    );
    let Step::Fail(Some(why)) = last else {
        panic!("{last:?}");
    };
    assert!(
        why.starts_with("storage was slow before the job's call"),
        "{why}"
    );
}

/// Steps the plan from `a` until it asks something other than a release, or ends.
fn after(k: &Knows, a: &mut Answers) -> Step {
    loop {
        match next(k, a) {
            Step::Release => a.released = Some(None),
            step => return step,
        }
    }
}

#[test]
fn an_occurrence_settled_already_is_skipped_even_when_too_far_ahead_for_a_token() {
    let s = settings(&[]);
    let r = reservation(&s, Some("succeeded"), false);
    let mut k = knows(&s, &r);
    k.token_refused = true;
    assert!(matches!(next(&k, &Answers::default()), Step::Done(..)));
    let fresh = reservation(&s, None, true);
    let mut k = knows(&s, &fresh);
    k.token_refused = true;
    assert!(matches!(next(&k, &Answers::default()), Step::Fail(None)));
}

/// A lease state as a holder's release of a lease record leaves it (a claim naming nobody).
fn released_state(etag: &str) -> HeldState {
    let json = format!(
        r#"{{"etag":"{etag}","leased":false,"metadata":{{"leasegate_term":"record","leasegate_token":"5"}}}}"#
    );
    HeldState::from_json(&json).unwrap()
}

#[test]
fn the_second_acquire_after_a_lost_answer_starts_from_a_read_not_the_kept_state() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let k = knows(&s, &r);
    let mut log = log_at(k.server_now, None);
    log.log.lock = serde_json::from_str(&released_state("0x9").to_json()).ok();
    let mut a = Answers {
        log: Some(Ok((log, Some(k.server_now)))),
        ..Default::default()
    };
    assert_eq!(name(&next(&k, &a)), "acquire from kept");
    a.lease.push(Lease::Failed { unknown: true });
    assert_eq!(name(&next(&k, &a)), "acquire");
}

#[test]
fn the_log_keeps_the_lease_as_the_release_left_it() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let k = knows(&s, &r);
    let acquired = released_state("0x10");
    let left = released_state("0x11");
    let mut read = log_at(k.server_now, None);
    read.log.lock = serde_json::from_str(&released_state("0x9").to_json()).ok();
    let base = || Answers {
        log: Some(Ok((read.clone(), Some(k.server_now)))),
        lease: vec![Lease::Held {
            expires_at: Some(t(OCCURRENCE + 60)),
            state: Some(acquired.clone()),
        }],
        committed: Some(Ok(Committed::Written(r.clone()))),
        released: Some(Some(left.clone())),
        overwritten: Some(Ok(true)),
        ..Default::default()
    };
    // A run's end: the released state, in place of the one the run's start kept.
    let mut a = base();
    let started = log_at(k.server_now + Duration::from_secs(1), Some(99));
    a.appended = Some(Ok(Ok(started.clone())));
    a.called = Some(Ok(()));
    let Step::Update { keep, .. } = next(&k, &a) else {
        panic!("an update");
    };
    assert_eq!(keep, Some(left.clone()));
    // A paused skip: the released state, in place of the log's lock as this tick read it.
    let mut a = base();
    a.appended = Some(Ok(Err(LogRefusal::Paused(paused()))));
    let Step::AppendAgain {
        keep: Some(keep), ..
    } = next(&k, &a)
    else {
        panic!("an append again");
    };
    assert_eq!(keep.state, left);
    assert_eq!(keep.over, Some(read.log.lock.clone()));
    // The release failed: the state the acquire left.
    a.released = Some(None);
    let Step::AppendAgain {
        keep: Some(keep), ..
    } = next(&k, &a)
    else {
        panic!("an append again");
    };
    assert_eq!(keep.state, acquired);
}

mod records;
