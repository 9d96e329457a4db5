//! What an attempt records when the occurrence does not run: `missed` (late, `job_catch_up =
//! none`), `skipped_overlap` (another run holds the job's lease), `pending` behind that run
//! (`job_overlap = buffer_one`). On the reservation by compare-and-swap first (of all the
//! ticks, one writes), then in the log.

use super::*;

/// Records `entry` (an outcome that is not a run) on the reservation, then in the log from
/// `known`; `done`: the decision once recorded. The reservation holds the outcome: a log write
/// that fails leaves it recorded there, and a log that refuses the entry has it undone.
pub(super) fn not_run(
    k: &Knows,
    a: &Answers,
    entry: LogEntry,
    known: Option<LogWrite>,
    done: fn(LogEntry) -> Decision,
) -> Step {
    let written = match &a.committed {
        None => return first_commit(&entry),
        Some(Err(Failed)) => return Step::Fail(None),
        Some(Ok(Committed::Settled(run))) => return Step::Done(settled(k, run), None),
        Some(Ok(Committed::Written(w))) => w,
    };
    match &a.appended {
        None => Step::Append {
            entry,
            known,
            keep: None,
        },
        // At or below the watermark with no entry: a winner counted the occurrence settled,
        // perhaps by this very outcome on its reservation. The outcome stays (it is the record;
        // undoing it would lose the occurrence).
        Some(Ok(Err(LogRefusal::Settled)) | Ok(Ok(_)) | Err(Failed)) => {
            Step::Done(done(entry), None)
        }
        Some(Ok(Err(refusal))) => {
            let undo = PutBack::Undo(written.clone(), refusal.clone());
            let refused = Step::Done(refused_by_log(k.settings, refusal.clone()), None);
            put_back_then(a, undo, refused)
        }
    }
}

/// The write of a first attempt's outcome that is not a run (over none, or `pending`).
fn first_commit(entry: &LogEntry) -> Step {
    Step::Commit {
        outcome: entry.status.clone(),
        attempt: 1,
        over: Over::Nothing,
    }
}

/// `job_catch_up = none` and the tick is late (or beyond the catch-up window): the entry that
/// records it missed.
pub(super) fn missed_entry(k: &Knows) -> LogEntry {
    let settings = k.settings;
    let mut entry = k.entry.clone();
    entry.status = RunStatus::Missed;
    entry.fencing_token = None;
    entry.finished_at = Some(rfc3339(k.server_now));
    let late_by = unix(k.now).saturating_sub(k.occurrence);
    entry.reason = Some(if late_by > settings.catch_up_window.as_secs() {
        format!(
            "ticked {late_by} s late, beyond job_catch_up_window_seconds ({} s): not run",
            settings.catch_up_window.as_secs()
        )
    } else {
        format!("ticked {late_by} s late and job_catch_up is none: not run")
    });
    entry
}

/// Another occurrence's run holds the job's lease: the entry that records this one skipped.
pub(super) fn overlap_entry(k: &Knows) -> LogEntry {
    let mut entry = k.entry.clone();
    entry.status = RunStatus::SkippedOverlap;
    entry.fencing_token = None;
    entry.reason = Some("the previous run still holds the job's lease".into());
    entry
}

/// `job_overlap = buffer_one`: the previous run (`holder`, its lease's label) holds the job's
/// lease when this occurrence is due. It is kept `pending` (on its reservation and in the log)
/// for the first tick after that run ends; if another occurrence is pending already, it is
/// skipped (`skipped_overlap`) instead: one buffered at most.
pub(super) fn buffer(k: &Knows, a: &Answers, known: Option<LogWrite>, holder: &str) -> Step {
    let running = label_occurrence(holder)
        .map(|o| rfc3339(at(o)))
        .unwrap_or_default();
    let mut entry = k.entry.clone();
    entry.status = RunStatus::Pending;
    // No run, no token: the run that takes it up later is issued one.
    entry.fencing_token = None;
    entry.reason = Some(format!(
        "the previous run (occurrence {running}) still holds the job's lease: it runs when that \
         run ends (job_overlap = buffer_one)"
    ));
    let written = match &a.committed {
        None => return first_commit(&entry),
        Some(Err(Failed)) => return Step::Fail(None),
        Some(Ok(Committed::Settled(run))) => {
            let skip = Skip::SettledByTick(run.clone());
            return Step::Done(skip.decision(k.reserved_by.clone()), None);
        }
        Some(Ok(Committed::Written(w))) => w,
    };
    let other = match &a.appended {
        None => {
            return Step::Append {
                entry,
                known,
                keep: None,
            }
        }
        Some(Ok(Ok(_))) => return Step::Done(Decision::Buffered { entry }, None),
        // The log must know what is buffered (one at most): undone, a later tick decides. The
        // reservation is put back, not deleted (the log may hold the entry).
        Some(Err(Failed)) => {
            let restore = PutBack::Restore(written.clone());
            return put_back_then(a, restore, Step::Fail(None));
        }
        Some(Ok(Err(LogRefusal::Buffered(other)))) => *other,
        Some(Ok(Err(refusal))) => {
            let undo = PutBack::Undo(written.clone(), refusal.clone());
            let refused = Step::Done(refused_by_log(k.settings, refusal.clone()), None);
            return put_back_then(a, undo, refused);
        }
    };
    // One is buffered already: this one is skipped (over this tick's `pending`).
    match &a.overwritten {
        None => {
            let written = written.clone();
            let outcome = RunStatus::SkippedOverlap;
            return Step::Overwrite { written, outcome };
        }
        Some(Err(Failed)) => return Step::Fail(None),
        Some(Ok(_)) => {}
    }
    entry.status = RunStatus::SkippedOverlap;
    entry.reason = Some(format!(
        "the previous run (occurrence {running}) still holds the job's lease and occurrence {} \
         is buffered already (job_overlap = buffer_one keeps one)",
        rfc3339(at(other))
    ));
    match &a.appended_again {
        // In the log for the record (a failed write leaves it on the reservation).
        None => Step::AppendAgain {
            entry,
            keep: None,
            on: k.reservation.clone(),
        },
        Some(_) => Step::Done(Decision::Overlapped { entry }, None),
    }
}
