//! The plan when the job's lease is busy or the occurrence does not run: a late miss, an
//! overlap, an occurrence not due yet, this occurrence's own lease, buffering behind the
//! previous run, and what their writes' failures come to.

use super::*;

#[test]
fn a_late_tick_with_catch_up_none_records_the_occurrence_missed() {
    let s = settings(&[("job_catch_up", "none")]);
    let r = reservation(&s, None, true);
    let mut k = knows(&s, &r);
    k.skip_late = true;
    k.now = t(OCCURRENCE + 45);
    let mut a = Answers::default();
    let Step::Commit { outcome, .. } = next(&k, &a) else {
        panic!("a commit");
    };
    assert_eq!(outcome, RunStatus::Missed);
    a.committed = Some(Ok(Committed::Written(r.clone())));
    let Step::Append {
        entry, known: None, ..
    } = next(&k, &a)
    else {
        panic!("an append");
    };
    assert_eq!(entry.status, RunStatus::Missed);
    assert_eq!(entry.fencing_token, None);
    assert_eq!(
        entry.reason.as_deref(),
        Some("ticked 45 s late and job_catch_up is none: not run")
    );
    let (steps, last) = walk(&k, Script::default());
    assert_eq!(steps, ["commit", "append"]);
    assert!(matches!(last, Step::Done(Decision::Missed { .. }, None)));
    // Another tick recorded it first: skipped, nothing appended.
    let script = Script {
        commit: Some(Ok(Committed::Settled(RunStatus::Missed))),
        ..Default::default()
    };
    let (steps, last) = walk(&k, script);
    assert_eq!(steps, ["commit"]);
    assert!(matches!(last, Step::Done(Decision::Skipped { .. }, None)));
}

#[test]
fn an_occurrence_due_while_another_runs_is_skipped_as_an_overlap() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let script = Script {
        lease: vec![busy("other-instance 1796083140")],
        ..Default::default()
    };
    let k = knows(&s, &r);
    let a = Answers {
        log: Some(Ok((log_at(k.server_now, None), None))),
        lease: vec![busy("other-instance 1796083140")],
        committed: Some(Ok(Committed::Written(r.clone()))),
        ..Default::default()
    };
    let Step::Append { entry, known, .. } = next(&k, &a) else {
        panic!("an append");
    };
    assert_eq!(entry.status, RunStatus::SkippedOverlap);
    assert!(known.is_some(), "it starts from the log as read");
    let (steps, last) = walk(&k, script);
    assert_eq!(steps, ["read log", "acquire", "commit", "append"]);
    assert!(matches!(
        last,
        Step::Done(Decision::Overlapped { .. }, None)
    ));
}

#[test]
fn an_occurrence_not_due_yet_behind_another_run_records_nothing() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let mut k = knows(&s, &r);
    k.server_now = t(OCCURRENCE - 5);
    let script = Script {
        lease: vec![busy("other-instance 1796083140")],
        ..Default::default()
    };
    let (steps, last) = walk(&k, script);
    assert_eq!(steps, ["read log", "acquire", "take back"]);
    let Step::Done(Decision::NotDue { retry_after }, None) = last else {
        panic!("{last:?}");
    };
    assert_eq!(retry_after, Duration::from_secs(5));
}

#[test]
fn its_own_lease_held_is_in_progress_unless_the_reservation_now_shows_an_outcome() {
    let s = settings(&[]);
    let r = reservation(&s, None, true);
    let k = knows(&s, &r);
    let own = format!("{} {OCCURRENCE}", s.instance_id);
    let script = Script {
        lease: vec![busy(&own)],
        ..Default::default()
    };
    let (steps, last) = walk(&k, script);
    assert_eq!(
        steps,
        ["read log", "acquire", "read reservation", "take back"]
    );
    assert!(matches!(
        last,
        Step::Done(Decision::InProgress { .. }, None)
    ));
    let script = Script {
        lease: vec![busy(&own)],
        reread: Some(RunStatus::Succeeded),
        ..Default::default()
    };
    let (steps, last) = walk(&k, script);
    assert_eq!(steps, ["read log", "acquire", "read reservation"]);
    let Step::Done(Decision::Skipped { reason, .. }, None) = last else {
        panic!("{last:?}");
    };
    assert_eq!(reason, Skip::SettledHere(RunStatus::Succeeded));
}

#[test]
fn buffer_one_keeps_the_occurrence_behind_the_run_and_one_buffered_waits() {
    let s = settings(&[("job_overlap", "buffer_one")]);
    let r = reservation(&s, None, true);
    let script = || Script {
        lease: vec![busy("other-instance 1796083140")],
        ..Default::default()
    };
    let (steps, last) = walk(&knows(&s, &r), script());
    assert_eq!(steps, ["read log", "acquire", "commit", "append"]);
    assert!(matches!(last, Step::Done(Decision::Buffered { .. }, None)));
    let pending = reservation(&s, Some("pending"), false);
    let (steps, last) = walk(&knows(&s, &pending), script());
    assert_eq!(steps, ["read log", "acquire"]);
    let Step::Done(Decision::Skipped { reason, .. }, None) = last else {
        panic!("{last:?}");
    };
    assert_eq!(reason, Skip::BufferedAlready);
}

#[test]
fn with_another_occurrence_buffered_this_one_is_skipped_over_its_pending() {
    let s = settings(&[("job_overlap", "buffer_one")]);
    let r = reservation(&s, None, true);
    let script = Script {
        lease: vec![busy("other-instance 1796083140")],
        append: Some(Ok(Err(LogRefusal::Buffered(OCCURRENCE - 30)))),
        ..Default::default()
    };
    let (steps, last) = walk(&knows(&s, &r), script);
    assert_eq!(
        steps,
        [
            "read log",
            "acquire",
            "commit",
            "append",
            "overwrite",
            "append again"
        ]
    );
    let Step::Done(Decision::Overlapped { entry }, None) = last else {
        panic!("{last:?}");
    };
    assert_eq!(entry.status, RunStatus::SkippedOverlap);
    assert_eq!(
        entry.reason.as_deref(),
        Some(
            "the previous run (occurrence 2026-11-30T23:59:00Z) still holds the job's lease and \
             occurrence 2026-11-30T23:59:30Z is buffered already (job_overlap = buffer_one keeps \
             one)"
        )
    );
}

#[test]
fn a_buffered_occurrence_whose_log_write_failed_is_restored_before_the_error() {
    let s = settings(&[("job_overlap", "buffer_one")]);
    let r = reservation(&s, None, true);
    let script = Script {
        lease: vec![busy("other-instance 1796083140")],
        append: Some(Err(Failed)),
        ..Default::default()
    };
    let (steps, last) = walk(&knows(&s, &r), script);
    assert_eq!(
        steps,
        ["read log", "acquire", "commit", "append", "restore"]
    );
    assert!(matches!(last, Step::Fail(None)));
}

#[test]
fn an_overwrite_that_fails_ends_the_attempt_with_its_error() {
    // Buffer one, another occurrence buffered: the overwrite to `skipped_overlap` fails.
    let s = settings(&[("job_overlap", "buffer_one")]);
    let r = reservation(&s, None, true);
    let k = knows(&s, &r);
    let mut a = Answers {
        log: Some(Ok((log_at(k.server_now, None), None))),
        lease: vec![busy("other-instance 1796083140")],
        committed: Some(Ok(Committed::Written(r.clone()))),
        appended: Some(Ok(Err(LogRefusal::Buffered(OCCURRENCE - 30)))),
        ..Default::default()
    };
    assert_eq!(name(&next(&k, &a)), "overwrite");
    a.overwritten = Some(Err(Failed));
    assert!(matches!(next(&k, &a), Step::Fail(None)));
    // Paused: the same.
    let s = settings(&[]);
    let k = knows(&s, &r);
    let mut a = Answers {
        log: Some(Ok((log_at(k.server_now, None), None))),
        lease: vec![held()],
        committed: Some(Ok(Committed::Written(r.clone()))),
        appended: Some(Ok(Err(LogRefusal::Paused(paused())))),
        ..Default::default()
    };
    assert_eq!(name(&after(&k, &mut a)), "overwrite");
    a.overwritten = Some(Err(Failed));
    assert!(matches!(after(&k, &mut a), Step::Fail(None)));
}

#[test]
fn a_skip_the_log_counts_settled_already_keeps_its_outcome() {
    let s = settings(&[("job_catch_up", "none")]);
    let r = reservation(&s, None, true);
    let mut k = knows(&s, &r);
    k.skip_late = true;
    let script = Script {
        append: Some(Ok(Err(LogRefusal::Settled))),
        ..Default::default()
    };
    let (steps, last) = walk(&k, script);
    // Not undone: the outcome on the reservation is the record.
    assert_eq!(steps, ["commit", "append"]);
    assert!(matches!(last, Step::Done(Decision::Missed { .. }, None)));
}
