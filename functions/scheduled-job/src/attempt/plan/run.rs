//! Steps 4 to 6 of an attempt that may run: the outcome `running`, the log's start (which
//! issues the token), the job's call if its run can end in time, the release, the result in
//! the log and on the reservation; and what is put back when one of them fails.

use super::*;

/// The lease as this attempt holds it: when it runs out, its state, the log as read before.
pub(super) type Held<'a> = (Option<SystemTime>, Option<&'a HeldState>, &'a LogWrite);

/// 4 to 6: the outcome `running`, the log's start (which issues the token), the job's call if
/// its run can end in time, the release, the result in the log and on the reservation.
/// `held`: the job's lease (none with `job_overlap = allow`).
pub(super) fn run(k: &Knows, a: &Answers, held: Option<Held>) -> Step {
    let release_then = |then| release_then(a, held.is_some(), then);
    let put_back_then = |how, then| put_back_then(a, how, then);
    // 4. The outcome "running" on the reservation: the one tick that writes it runs the job.
    let written = match &a.committed {
        None => {
            let (attempt, over) = (k.attempt, over(k));
            let outcome = RunStatus::Running;
            return Step::Commit {
                outcome,
                attempt,
                over,
            };
        }
        Some(Err(Failed)) => return release_then(fail_before_outcome(k, a, None)),
        Some(Ok(Committed::Settled(run))) => {
            return release_then(Step::Done(settled(k, run), None))
        }
        Some(Ok(Committed::Written(w))) => w,
    };
    // 5. Log the run before it starts, so a run that never ends still shows.
    let (expires_at, kept, read) = match held {
        Some((expires_at, kept, read)) => (expires_at, kept, Some(read)),
        None => (None, None, None),
    };
    let started = match &a.appended {
        None => {
            return Step::Append {
                entry: k.entry.clone(),
                known: read.cloned(),
                keep: kept.map(|state| Keep {
                    state: state.clone(),
                    over: None,
                }),
            }
        }
        // Storage failed and the log may hold the run's start: the reservation is put back as
        // it was before the outcome, never deleted, for the takeover rule to settle with the log.
        Some(Err(Failed)) => {
            let restore = PutBack::Restore(written.clone());
            return put_back_then(restore, release_then(Step::Fail(None)));
        }
        // Paused: not run. A retry is not an occurrence of its own: the previous attempt's
        // `failed` is put back and the retry waits for the resume.
        Some(Ok(Err(LogRefusal::Paused(_)))) if k.attempt > 1 => {
            let skip = Skip::PausedRetry {
                attempt: k.attempt,
                job: k.settings.job.clone(),
            };
            let done = Step::Done(skip.decision(k.reserved_by.clone()), None);
            return put_back_then(PutBack::Uncommit(written.clone()), release_then(done));
        }
        Some(Ok(Err(LogRefusal::Paused(paused)))) => {
            let step = paused_skip(k, a, written, paused, kept, read);
            return release_then(step);
        }
        Some(Ok(Err(refusal))) => {
            let done = Step::Done(refused_by_log(k.settings, refusal.clone()), None);
            let undo = PutBack::Undo(written.clone(), refusal.clone());
            return put_back_then(undo, release_then(done));
        }
        Some(Ok(Ok(started))) => started,
    };
    // 6. The job is called only if its run can end within the job's lease and the run's
    // deadline, by the storage server's clock.
    if let Err(slow) = time_left(k.settings, expires_at, k.server_now, started.date) {
        let restore = PutBack::Restore(written.clone());
        return put_back_then(restore, release_then(Step::Fail(Some(slow))));
    }
    // The token the log's compare-and-swap issued: above every earlier run's.
    let mut entry = k.entry.clone();
    entry.fencing_token = started.log.token_of(k.occurrence).or(entry.fencing_token);
    let Some(result) = &a.called else {
        return Step::CallJob(entry);
    };
    (entry.status, entry.reason) = match result {
        Ok(()) => (RunStatus::Succeeded, None),
        Err(reason) => (RunStatus::Failed, Some(reason.clone())),
    };
    // Release first: the log keeps the lease as the release left it. Then the log (a takeover
    // reads it before acting), then the reservation.
    let Some(finished) = &a.finished else {
        let keep = a.released.clone().flatten();
        return release_then(Step::Update {
            entry,
            started: started.clone(),
            keep,
        });
    };
    if !a.recorded {
        return Step::RecordResult {
            written: written.clone(),
            status: entry.status.clone(),
            token: entry.fencing_token,
        };
    }
    if let Some(written) = finished {
        // The end as the log records it, to the answer (the same instant).
        let end = written
            .log
            .entries
            .iter()
            .find(|e| e.occurrence_unix == k.occurrence);
        entry.finished_at = end
            .and_then(|e| e.finished_at.clone())
            .or_else(|| Some(rfc3339(written.date)));
    }
    let decision = match result {
        Ok(()) => Decision::Ran { entry },
        Err(_) => Decision::JobFailed { entry },
    };
    Step::Done(decision, finished.clone())
}

/// The job is paused (a first attempt): its `running` becomes `skipped_paused` (it called
/// nothing), then the log says why, the lease kept in place of the state this tick acquired
/// from, as read: a run that took the lease since has kept a newer one. `kept`: the lease's
/// state as the acquire left it; `read`: the log as read before.
fn paused_skip(
    k: &Knows,
    a: &Answers,
    written: &Reservation,
    paused: &Paused,
    kept: Option<&HeldState>,
    read: Option<&LogWrite>,
) -> Step {
    match &a.overwritten {
        None => {
            let written = written.clone();
            let outcome = RunStatus::SkippedPaused;
            return Step::Overwrite { written, outcome };
        }
        Some(Err(Failed)) => return Step::Fail(None),
        Some(Ok(_)) => {}
    }
    let mut entry = k.entry.clone();
    entry.status = RunStatus::SkippedPaused;
    entry.fencing_token = None;
    entry.attempt = None;
    let note = paused.note.as_deref().map(|n| format!(": {n}"));
    let since = &paused.since;
    entry.reason = Some(format!(
        "the job is paused since {since}{}",
        note.unwrap_or_default()
    ));
    match &a.appended_again {
        None => {
            // As this tick's release left the lease; as its acquire left it if the release failed.
            let state = a.released.clone().flatten().or_else(|| kept.cloned());
            let over = Some(read.and_then(|r| r.log.lock.clone()));
            let keep = state.map(|state| Keep { state, over });
            let on = written.clone();
            Step::AppendAgain { entry, keep, on }
        }
        Some(Err(Failed)) => Step::Fail(None),
        Some(Ok(())) => Step::Done(Decision::Paused { entry }, None),
    }
}

/// What a run's call needs ahead of it beyond the job's timeout: `Date` is whole seconds, and
/// the call leaves a moment after the log's answer.
const CALL_MARGIN: Duration = Duration::from_secs(2);

/// `Ok` if a run whose log entry was written at `logged` (the write's `Date`) can still end
/// within the job's lease (running out at `lease`; none with `job_overlap = allow`) and within
/// the run's deadline, counted from `reserved` (the reservation's time as this tick read or
/// wrote it, at or before its outcome `running`, so the deadline is never later than the one
/// other ticks count), all by the storage server's clock, with the job's timeout and a margin
/// to spare. Else why not: the job is not called.
fn time_left(
    settings: &Settings,
    lease: Option<SystemTime>,
    reserved: SystemTime,
    logged: SystemTime,
) -> Result<(), String> {
    let deadline = reserved + settings.run_deadline();
    let ends = lease.map_or(deadline, |lease| lease.min(deadline));
    let left = ends.duration_since(logged).unwrap_or_default();
    if left >= settings.timeout + CALL_MARGIN {
        return Ok(());
    }
    Err(format!(
        "storage was slow before the job's call: the job's lease or its run's deadline has {} s \
         left, less than job_timeout_seconds ({} s) and {} s, so the run could outlive it; the \
         reservation was put back as it was",
        left.as_secs(),
        settings.timeout.as_secs(),
        CALL_MARGIN.as_secs()
    ))
}
