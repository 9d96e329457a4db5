//! A tick's first steps stepped without storage: each test scripts what storage answers (a
//! create refused, a reservation left by a vanished runner, a failed run waiting for its
//! retry) and asserts the steps the plan asks for and what it comes to.

use super::*;
use crate::reservation::{META_ATTEMPT, META_RUN};
use crate::settings::tests::settings_with;
use leasegate::ops::Metadata;
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

fn knows<'a>(settings: &'a Settings, blob: &'a BlobName, now: SystemTime) -> Knows<'a> {
    Knows {
        settings,
        source: Source::Cron,
        occurrence: OCCURRENCE,
        blob,
        now,
        asked: Asked::default(),
    }
}

fn created(settings: &Settings) -> Reserved {
    let reservation = Reservation {
        blob: settings.reservation(OCCURRENCE).unwrap(),
        etag: Some(ETag::new("\"0x1\"")),
        metadata: Metadata::new(),
        created: true,
    };
    Reserved::Created(reservation, t(OCCURRENCE))
}

/// A reservation as a read finds it: reserved by `by`, last written at `since`, with `meta`.
fn found(by: &str, since: u64, meta: &[(&str, &str)]) -> Read {
    let mut metadata = Metadata::new();
    metadata.insert(META_RESERVED_BY.into(), by.into());
    for (k, v) in meta {
        metadata.insert(k.to_string(), v.to_string());
    }
    let props = BlobProperties {
        etag: Some(ETag::new("\"0x1\"")),
        last_modified: Some(t(since)),
        metadata,
        ..Default::default()
    };
    (Some(props), Some(t(since)))
}

fn name(step: &Step) -> &'static str {
    match step {
        Step::ReadFirst => "read first",
        Step::Reserve { late: false } => "reserve",
        Step::Reserve { late: true } => "reserve late",
        Step::AskFailedHere => "ask failed here",
        Step::Read => "read",
        Step::CheckLog { .. } => "check log",
        Step::SettleVanished(_) => "settle vanished",
        Step::TakeBack(_) => "take back",
        Step::Attempt(_) => "attempt",
        Step::Done(_) => "done",
    }
}

/// What storage and the store answer the tick's steps.
#[derive(Clone, Default)]
struct Script {
    first: Option<Read>,
    exists: bool,
    failed_here: bool,
    read: Option<Read>,
    finished_in_log: bool,
    settled: Option<String>,
}

/// Steps the plan to its end: the steps it asked for, and the last (an attempt, or done).
fn walk(k: &Knows, script: Script) -> (Vec<&'static str>, Step) {
    let mut a = Answers::default();
    let mut steps = Vec::new();
    for _ in 0..12 {
        let step = next(k, &a);
        if matches!(step, Step::Done(_) | Step::Attempt(_)) {
            return (steps, step);
        }
        steps.push(name(&step));
        let s = script.clone();
        match step {
            Step::ReadFirst => a.first = Some(s.first.unwrap_or((None, Some(k.now)))),
            Step::Reserve { .. } if s.exists => a.reserved = Some(Reserved::Exists),
            Step::Reserve { .. } => a.reserved = Some(created(k.settings)),
            Step::AskFailedHere => a.failed_here = Some(s.failed_here),
            Step::Read => a.read = Some(s.read.unwrap_or((None, Some(k.now)))),
            Step::CheckLog { .. } => a.finished_in_log = Some(s.finished_in_log),
            Step::SettleVanished(_) => a.settled = Some(s.settled),
            Step::TakeBack(_) => a.taken_back = true,
            Step::Attempt(_) | Step::Done(_) => unreachable!(),
        }
    }
    panic!("more than 12 steps: {steps:?}");
}

fn skipped(step: &Step) -> &Skip {
    match step {
        Step::Done(Decision::Skipped { reason, .. }) => reason,
        other => panic!("not skipped: {other:?}"),
    }
}

#[test]
fn an_on_time_tick_reserves_and_hands_the_first_attempt_on() {
    let s = settings(&[]);
    let blob = s.reservation(OCCURRENCE).unwrap();
    let (steps, last) = walk(&knows(&s, &blob, t(OCCURRENCE + 1)), Script::default());
    assert_eq!(steps, ["reserve"]);
    let Step::Attempt(run) = last else {
        panic!("{last:?}");
    };
    assert_eq!((run.attempt, run.reservation.created), (1, true));
    assert_eq!(run.server_now, t(OCCURRENCE));
}

#[test]
fn a_refused_create_on_time_is_the_ticks_one_request() {
    let s = settings(&[]);
    let blob = s.reservation(OCCURRENCE).unwrap();
    let k = knows(&s, &blob, t(OCCURRENCE + 1));
    let script = Script {
        exists: true,
        ..Default::default()
    };
    let (steps, last) = walk(&k, script.clone());
    assert_eq!(steps, ["reserve", "ask failed here"]);
    assert_eq!(skipped(&last), &Skip::ReservedAlready);
    // Unless a tick of it failed here (its reservation may be this deployment's: read it) ...
    let mine = Script {
        failed_here: true,
        read: Some(found(&s.instance_id, OCCURRENCE, &[])),
        ..script.clone()
    };
    let (steps, last) = walk(&k, mine);
    assert_eq!(steps, ["reserve", "ask failed here", "read"]);
    assert!(matches!(last, Step::Attempt(ref run) if run.attempt == 1));
    // ... or the caller asked who reserved it.
    let mut named = knows(&s, &blob, t(OCCURRENCE + 1));
    named.asked.name_reserver = true;
    let other = Script {
        read: Some(found("other-instance", OCCURRENCE, &[])),
        ..script
    };
    let (steps, last) = walk(&named, other);
    assert_eq!(steps, ["reserve", "read"]);
    assert_eq!(skipped(&last), &Skip::ReservedByOther);
    let Step::Done(Decision::Skipped { reserved_by, .. }) = last else {
        unreachable!()
    };
    assert_eq!(reserved_by.as_deref(), Some("other-instance"));
}

#[test]
fn with_retries_a_refused_create_reads_the_reservation() {
    let s = settings(&[("job_retries", "1")]);
    let blob = s.reservation(OCCURRENCE).unwrap();
    let script = Script {
        exists: true,
        read: Some(found("other-instance", OCCURRENCE, &[])),
        ..Default::default()
    };
    let (steps, _) = walk(&knows(&s, &blob, t(OCCURRENCE + 1)), script);
    assert_eq!(steps, ["reserve", "read"]);
}

#[test]
fn a_late_tick_reads_first_and_creates_only_what_it_does_not_find() {
    let s = settings(&[]);
    let blob = s.reservation(OCCURRENCE).unwrap();
    let late = knows(&s, &blob, t(OCCURRENCE + 50));
    let script = Script {
        first: Some(found(
            "other-instance",
            OCCURRENCE,
            &[("leasegate_run", "succeeded")],
        )),
        ..Default::default()
    };
    let (steps, last) = walk(&late, script);
    assert_eq!(steps, ["read first"]);
    assert_eq!(skipped(&last), &Skip::ReservedByOther);
    let (steps, last) = walk(&late, Script::default());
    assert_eq!(steps, ["read first", "reserve late"]);
    assert!(matches!(last, Step::Attempt(_)));
}

#[test]
fn a_run_now_never_touches_an_occurrence_that_exists() {
    let s = settings(&[]);
    let blob = s.reservation(OCCURRENCE).unwrap();
    let mut k = knows(&s, &blob, t(OCCURRENCE + 50));
    k.asked.fresh_only = true;
    let script = Script {
        exists: true,
        ..Default::default()
    };
    let (steps, last) = walk(&k, script);
    assert_eq!(steps, ["reserve late"]);
    assert_eq!(skipped(&last), &Skip::RunNowTaken);
}

#[test]
fn an_occurrence_out_of_range_is_refused_and_its_new_reservation_taken_back() {
    let s = settings(&[("job_retention_seconds", "3600")]);
    let blob = s.reservation(OCCURRENCE).unwrap();
    // Storage's clock two hours past the occurrence; this instance's clock agrees.
    let k = knows(&s, &blob, t(OCCURRENCE + 7200));
    let mut a = Answers {
        first: Some((None, Some(t(OCCURRENCE + 7200)))),
        ..Default::default()
    };
    let mut reserved = created(&s);
    if let Reserved::Created(_, at) = &mut reserved {
        *at = t(OCCURRENCE + 7200);
    }
    a.reserved = Some(reserved);
    assert_eq!(name(&next(&k, &a)), "take back");
    a.taken_back = true;
    assert!(matches!(next(&k, &a), Step::Done(Decision::TooOld { .. })));
}

#[test]
fn a_failed_run_waits_for_its_retry_delay_then_runs_the_next_attempt() {
    let s = settings(&[("job_retries", "2"), ("job_retry_delay_seconds", "30")]);
    let blob = s.reservation(OCCURRENCE).unwrap();
    let failed = [(META_RUN, "failed"), (META_ATTEMPT, "1")];
    let k = knows(&s, &blob, t(OCCURRENCE + 10));
    let script = Script {
        exists: true,
        // Failed at +5; storage's clock at the read, +10.
        read: Some((
            found("other-instance", OCCURRENCE + 5, &failed).0,
            Some(t(OCCURRENCE + 10)),
        )),
        ..Default::default()
    };
    let (steps, last) = walk(&k, script);
    assert_eq!(steps, ["reserve", "read"]);
    assert_eq!(
        skipped(&last),
        &Skip::RetryWait {
            failed: 1,
            wait_secs: 25
        }
    );
    // Past the delay (a later tick, late: it reads first): the log is checked, then attempt 2.
    let later = knows(&s, &blob, t(OCCURRENCE + 40));
    let (read, _) = found("other-instance", OCCURRENCE + 5, &failed);
    let script = Script {
        first: Some((read, Some(t(OCCURRENCE + 40)))),
        ..Default::default()
    };
    let (steps, last) = walk(&later, script);
    assert_eq!(steps, ["read first", "check log"]);
    let Step::Attempt(run) = last else {
        panic!("{last:?}");
    };
    assert_eq!((run.attempt, run.skip_late), (2, false));
    assert_eq!(run.server_now, t(OCCURRENCE + 40));
}

#[test]
fn a_vanished_runner_with_no_attempts_left_is_settled_failed_once() {
    let s = settings(&[]);
    let blob = s.reservation(OCCURRENCE).unwrap();
    let running = [(META_RUN, "running"), (META_ATTEMPT, "1")];
    let k = knows(&s, &blob, t(OCCURRENCE + 3600));
    let first = Some((
        found("other-instance", OCCURRENCE, &running).0,
        Some(t(OCCURRENCE + 3600)),
    ));
    let script = Script {
        first: first.clone(),
        settled: Some("its runner vanished".into()),
        ..Default::default()
    };
    let (steps, last) = walk(&k, script);
    assert_eq!(steps, ["read first", "check log", "settle vanished"]);
    assert_eq!(skipped(&last), &Skip::Logged("its runner vanished".into()));
    // The log says the attempt finished: brought in line, nothing to take over.
    let script = Script {
        first,
        finished_in_log: true,
        ..Default::default()
    };
    let (steps, last) = walk(&k, script);
    assert_eq!(steps, ["read first", "check log"]);
    assert_eq!(skipped(&last), &Skip::FinishedInLog);
}

#[test]
fn a_late_tick_with_catch_up_none_hands_on_a_first_attempt_to_record_missed() {
    let s = settings(&[("job_catch_up", "none")]);
    let blob = s.reservation(OCCURRENCE).unwrap();
    let mut k = knows(&s, &blob, t(OCCURRENCE + 50));
    k.asked.skip_late = true;
    let (steps, last) = walk(&k, Script::default());
    assert_eq!(steps, ["read first", "reserve late"]);
    assert!(matches!(last, Step::Attempt(ref run) if run.skip_late && run.attempt == 1));
}
