//! Which jobs of the `jobs` table a trigger ticks. The trigger fires at the finest cadence any
//! job needs, so most of its ticks find a job with nothing to do: each instance notes in the
//! key-value store, after a tick of a job, until when that job needs none (its next
//! occurrence, or sooner when a retry or a run in progress may want one), and a tick before
//! then costs the job no storage request. A missing or unreadable note ticks the job (the
//! reservations, not the note, keep a run to once).

use leasegate_spin::cache::{self, Cache};
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime};

use crate::attempt::skip::Skip;
use crate::run::{Decision, TickOutcome};
use crate::settings::Settings;
use crate::unix;

/// Until when a job needs no tick on this instance: ticks are skipped until the trigger names
/// `occurrence` (the job's next one) or, when set, until this instance's clock reaches `time`.
/// `written`: this instance's clock when it wrote the note; a tick on a clock behind it (set
/// back) ticks the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Quiet {
    occurrence: u64,
    time: Option<u64>,
    written: u64,
}

/// The note's key: the instance, the job and every setting a tick's outcome depends on (a job
/// whose settings change starts afresh: a shorter retry delay, another schedule or URL, a
/// retry more are looked at on the next trigger, not after the old note's wait).
fn key(settings: &Settings) -> String {
    let name = format!(
        "{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{:?}",
        settings.instance_id,
        settings.job,
        settings.schedule.expression(),
        settings.schedule.zone(),
        settings.period.as_secs(),
        settings.early.as_millis(),
        settings.catch_up.as_str(),
        settings.catch_up_window.as_secs(),
        settings.overlap.as_str(),
        settings.retries,
        settings.retry_delay.as_secs(),
        settings.timeout.as_secs(),
        settings.job_url,
        settings.lease_term,
    );
    cache::Scope::of(&settings.storage).quiet_job_key(&name)
}

/// Whether a trigger that names `occurrence` (Unix seconds) ticks the job, this instance's
/// clock reading `now`: no note says it needs none.
pub(crate) fn due(
    cache: &dyn Cache,
    settings: &Settings,
    occurrence: u64,
    now: SystemTime,
) -> bool {
    let Ok(Some(bytes)) = cache.get(&key(settings)) else {
        return true;
    };
    let Ok(quiet) = serde_json::from_slice::<Quiet>(&bytes) else {
        return true;
    };
    let now = unix(now);
    now < quiet.written || occurrence >= quiet.occurrence || quiet.time.is_some_and(|t| now >= t)
}

/// Notes after a tick at `now` until when the job needs no other (best effort).
pub(crate) fn note(cache: &dyn Cache, settings: &Settings, now: SystemTime, outcome: &TickOutcome) {
    let key = key(settings);
    match quiet(settings, now, outcome) {
        Some(q) => {
            let _ = cache.set(&key, &serde_json::to_vec(&q).unwrap_or_default());
        }
        None => {
            let _ = cache.delete(&key);
        }
    }
}

/// The note a tick's outcome leaves: `None` when every trigger should tick the job (storage
/// failed, more to catch up, an occurrence buffered or refused as early).
fn quiet(settings: &Settings, now: SystemTime, outcome: &TickOutcome) -> Option<Quiet> {
    let Ok(decision) = &outcome.decision else {
        return None;
    };
    if outcome.catch_up.more {
        return None;
    }
    let occurrence = settings.next_occurrence(outcome.occurrence);
    let after = |wait: Duration| Some(unix(now) + wait.as_secs().max(1));
    let time = match decision {
        Decision::Ran { .. }
        | Decision::Missed { .. }
        | Decision::Paused { .. }
        | Decision::Overlapped { .. }
        | Decision::TooOld { .. } => None,
        Decision::JobFailed { entry } if entry.attempt.unwrap_or(1) <= settings.retries => {
            after(settings.retry_delay)
        }
        Decision::JobFailed { .. } => None,
        Decision::Skipped { reason, .. } => skipped_wake(settings, reason).and_then(after),
        Decision::InProgress { retry_after } | Decision::NotDue { retry_after } => {
            after(*retry_after)
        }
        Decision::Buffered { .. } | Decision::TooEarly { .. } => return None,
    };
    Some(Quiet {
        occurrence,
        time,
        written: unix(now),
    })
}

/// How soon an instance whose tick skipped an occurrence for `reason` looks at it again
/// (`None`: at the job's next occurrence, the occurrence being settled).
fn skipped_wake(settings: &Settings, reason: &Skip) -> Option<Duration> {
    match reason {
        // Reserved elsewhere, outcome unknown (or buffered behind a run): its reserver may
        // vanish, so look again once its deadline has passed, when a tick takes it over; with
        // retries, once a failed attempt's retry may start (its runner may fail and vanish).
        Skip::ReservedAlready
        | Skip::ReservedByOther
        | Skip::BufferedAlready
        | Skip::OtherBuffered => Some(match settings.retries {
            0 => settings.run_deadline(),
            _ => settings.run_deadline().min(settings.retry_delay),
        }),
        // A failed attempt whose next may start in `wait_secs`.
        Skip::RetryWait { wait_secs, .. } => Some(Duration::from_secs(*wait_secs)),
        // A retry waiting for a resume: the resume is another instance's request, so this one
        // looks again every minute (a tick that finds the job paused costs one read).
        Skip::PausedRetry { .. } => Some(PAUSED_RETRY_LOOK),
        Skip::RunNowTaken
        | Skip::FinishedInLog
        | Skip::SettledElsewhere
        | Skip::Logged(_)
        | Skip::MissedByDeadline
        | Skip::BeforeHistoryRecorded
        | Skip::SettledHere(_)
        | Skip::SettledLate(_)
        | Skip::SettledByTick(_)
        | Skip::MissedInLog
        | Skip::Paused
        | Skip::BeforeHistory { .. }
        | Skip::FinishedMeanwhile(_) => None,
    }
}

/// How often an instance looks again at a retry that waits for a resume.
const PAUSED_RETRY_LOOK: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::tests::settings_with;
    use crate::CatchUpReport;
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Store(RefCell<HashMap<String, Vec<u8>>>);

    impl Cache for Store {
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, cache::Unavailable> {
            Ok(self.0.borrow().get(key).cloned())
        }
        fn set(&self, key: &str, value: &[u8]) -> Result<(), cache::Unavailable> {
            self.0.borrow_mut().insert(key.into(), value.into());
            Ok(())
        }
        fn delete(&self, key: &str) -> Result<(), cache::Unavailable> {
            self.0.borrow_mut().remove(key);
            Ok(())
        }
    }

    const DAY: u64 = 1_796_083_200; // 2026-12-01T00:00:00Z, a Tuesday

    fn t(s: u64) -> SystemTime {
        crate::at(s)
    }

    /// Whether a tick of every job at `by` (the trigger's time, this instance's clock) ticks it.
    fn due_at(store: &Store, s: &Settings, by: SystemTime) -> bool {
        let occurrence = unix(crate::many::occurrence_by(s, by, by).occurrence);
        due(store, s, occurrence, by)
    }

    fn outcome(occurrence: u64, decision: Decision) -> TickOutcome {
        TickOutcome {
            occurrence,
            decision: Ok(decision),
            round_trips: 3,
            catch_up: CatchUpReport::default(),
        }
    }

    fn skipped() -> Decision {
        Skip::SettledElsewhere.decision(None)
    }

    #[test]
    fn a_settled_occurrence_quiets_the_job_until_its_next() {
        let s = settings_with(&[("job_schedule", "30 6 * * *")]);
        let store = Store::default();
        let o = DAY + 6 * 3600 + 1800;
        assert!(due_at(&store, &s, t(o)), "no note: ticked");
        note(&store, &s, t(o + 2), &outcome(o, skipped()));
        for later in [o + 10, o + 60, o + 3600, o + 86_400 - 2] {
            assert!(!due_at(&store, &s, t(later)), "{later}");
        }
        // A tick of the table for another job a little before the next: not this job's.
        assert!(!due_at(&store, &s, t(o + 86_400 - 5)));
        assert!(due_at(&store, &s, t(o + 86_400)));
        assert!(due_at(&store, &s, t(o + 86_400 + 60)), "missed: caught up");
        // Another schedule, another note.
        let other = settings_with(&[("job_schedule", "45 6 * * *")]);
        assert!(due_at(&store, &other, t(o + 60)));
    }

    #[test]
    fn a_failure_with_retries_left_or_a_run_in_progress_wakes_it_sooner() {
        let s = settings_with(&[
            ("job_schedule", "0 * * * *"),
            ("job_retries", "1"),
            ("job_retry_delay_seconds", "120"),
        ]);
        let store = Store::default();
        let o = DAY + 3600;
        let wait = Skip::RetryWait {
            failed: 1,
            wait_secs: 120,
        };
        note(&store, &s, t(o), &outcome(o, wait.decision(None)));
        assert!(!due_at(&store, &s, t(o + 119)));
        assert!(due_at(&store, &s, t(o + 120)));
        // Reserved elsewhere, outcome unknown: looked at again after its reserver's deadline.
        for reserved in [
            Skip::ReservedByOther.decision(Some("node-b".into())),
            Skip::ReservedAlready.decision(None),
        ] {
            note(&store, &s, t(o), &outcome(o, reserved));
            let deadline = s.run_deadline().as_secs();
            assert!(!due_at(&store, &s, t(o + deadline - 1)));
            assert!(due_at(&store, &s, t(o + deadline)));
        }
        // Settled elsewhere: not before the next occurrence.
        note(&store, &s, t(o), &outcome(o, skipped()));
        assert!(!due_at(&store, &s, t(o + 3000)));
        note(
            &store,
            &s,
            t(o),
            &outcome(
                o,
                Decision::InProgress {
                    retry_after: Duration::from_secs(30),
                },
            ),
        );
        assert!(!due_at(&store, &s, t(o + 29)));
        assert!(due_at(&store, &s, t(o + 30)));
    }

    #[test]
    fn storage_failing_or_more_to_catch_up_ticks_every_time() {
        let s = settings_with(&[("job_period_seconds", "3600")]);
        let store = Store::default();
        let o = DAY;
        note(&store, &s, t(o), &outcome(o, skipped()));
        assert!(!due_at(&store, &s, t(o + 60)));
        let mut more = outcome(o, skipped());
        more.catch_up.more = true;
        note(&store, &s, t(o), &more);
        assert!(due_at(&store, &s, t(o + 60)));
        note(&store, &s, t(o), &outcome(o, skipped()));
        let failed = TickOutcome {
            decision: Err(crate::JobError::Contended("the log kept changing".into())),
            ..outcome(o, skipped())
        };
        note(&store, &s, t(o), &failed);
        assert!(due_at(&store, &s, t(o + 60)));
        // An unreadable note ticks.
        store.set(&key(&s), b"garbage").unwrap();
        assert!(due_at(&store, &s, t(o + 60)));
    }

    #[test]
    fn a_clock_set_back_behind_the_note_ticks_the_job() {
        let s = settings_with(&[("job_schedule", "0 * * * *"), ("job_retries", "1")]);
        let store = Store::default();
        let o = DAY + 3600;
        let wait = Skip::RetryWait {
            failed: 1,
            wait_secs: 300,
        };
        note(&store, &s, t(o + 60), &outcome(o, wait.decision(None)));
        assert!(!due_at(&store, &s, t(o + 120)), "the retry's wait");
        // This instance's clock goes back 40 s (NTP stepped it): its note cannot be trusted.
        assert!(due_at(&store, &s, t(o + 20)));
    }

    #[test]
    fn a_job_whose_settings_change_is_looked_at_afresh() {
        let before = settings_with(&[
            ("job_schedule", "0 * * * *"),
            ("job_retries", "1"),
            ("job_retry_delay_seconds", "600"),
        ]);
        let store = Store::default();
        let o = DAY + 3600;
        let wait = Skip::RetryWait {
            failed: 1,
            wait_secs: 600,
        };
        note(&store, &before, t(o), &outcome(o, wait.decision(None)));
        assert!(!due_at(&store, &before, t(o + 60)));
        // The user shortens the retry delay, adds a retry, moves the job: the next trigger
        // ticks it rather than waiting out the old note.
        for changed in [
            vec![("job_retry_delay_seconds", "30")],
            vec![("job_retries", "2")],
            vec![("job_url", "http://127.0.0.1:3001/elsewhere")],
            vec![("job_timeout_seconds", "5")],
        ] {
            let mut vars = vec![
                ("job_schedule", "0 * * * *"),
                ("job_retries", "1"),
                ("job_retry_delay_seconds", "600"),
            ];
            for (k, v) in &changed {
                vars.retain(|(name, _)| name != k);
                vars.push((k, v));
            }
            let after = settings_with(&vars);
            assert!(due_at(&store, &after, t(o + 60)), "{changed:?}");
        }
    }

    /// Every tick between two occurrences names the same occurrence; the retry's wait runs by
    /// this instance's clock, so the retry is ticked once its delay has passed.
    #[test]
    fn a_retry_is_ticked_by_the_clock_while_ticks_name_the_same_occurrence() {
        let s = settings_with(&[
            ("job_schedule", "0 * * * *"),
            ("job_retries", "1"),
            ("job_retry_delay_seconds", "5"),
        ]);
        let store = Store::default();
        let o = DAY + 3600;
        let wait = Skip::RetryWait {
            failed: 1,
            wait_secs: 5,
        };
        note(&store, &s, t(o), &outcome(o, wait.decision(None)));
        assert!(!due(&store, &s, o, t(o + 4)));
        assert!(due(&store, &s, o, t(o + 5)));
    }

    /// Reserved by another deployment whose attempt may fail: with retries, the job is looked
    /// at again once a retry may start, not only after the reserver's deadline (an hour for a
    /// job of `timeout_seconds = 3600`).
    #[test]
    fn reserved_elsewhere_with_retries_is_looked_at_after_the_retry_delay() {
        let s = settings_with(&[
            ("job_schedule", "0 * * * *"),
            ("job_timeout_seconds", "3600"),
            ("job_retries", "2"),
            ("job_retry_delay_seconds", "60"),
        ]);
        let store = Store::default();
        let o = DAY + 3600;
        note(
            &store,
            &s,
            t(o),
            &outcome(o, Skip::ReservedByOther.decision(Some("node-a".into()))),
        );
        assert!(!due(&store, &s, o, t(o + 59)));
        assert!(due(&store, &s, o, t(o + 60)));
    }
}
