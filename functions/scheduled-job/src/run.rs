//! A tick, step by step, numbered as in `docs/timer-functions.md` ("A tick, step by step"):
//! 1 reserve, 2 refuse an occurrence out of range, 3 skip one settled already or take the
//! job's lease, 4 write the outcome, 5 log, 6 call the job, then record its result, release,
//! settle earlier occurrences left without an outcome and clean up.

use leasegate::lease::{Acquire, IdOrigin, Locks};
use leasegate::ops::{Condition, Metadata, PutBlob, SetMetadata, WriteOutcome};
use leasegate::BlobClient;
use leasegate::{Counting, LockName, Transport, TransportErrorKind};
use leasegate_spin::storage::execute_creating_container;
use leasegate_spin::timer::{self, Tick};
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::Context;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime};

use crate::error::JobError;
use crate::log::{advance_settled, append, change_log, update, Log, LogEntry, LogRefusal};
use crate::reservation::{
    abandoned, clean_up, commit, head, label_occurrence, occurrence_token, outcome_of, take_back,
    uncommit, Commit, Reservation, ReservationBody, RunStatus, META_RESERVED_BY, META_RUN,
    META_TRIGGER,
};
use crate::settings::{term_length, Overlap, Settings};
use crate::{at, unix};

/// A tick may write `skipped_overlap` on an occurrence at most this far ahead of the storage
/// server's clock (its `Date` is whole seconds, so an occurrence due within the second reads
/// one second ahead).
pub(crate) const DUE_GRACE_SECS: u64 = 1;

/// Earlier occurrences a winning tick settles at most (each costs a read, and a write when its
/// reserver left it without an outcome).
pub(crate) const SETTLE_MAX: usize = 4;

/// What a tick came to.
#[derive(Debug)]
pub enum Decision {
    /// This instance ran the occurrence; the job answered 2xx.
    Ran {
        /// The run's log entry.
        entry: LogEntry,
    },
    /// Another instance reserved it (or this one did, on an earlier tick).
    Skipped {
        /// Who reserved it, as its reservation says.
        reserved_by: Option<String>,
        /// Why.
        reason: String,
    },
    /// This instance reserved it, but a previous run still holds the job's lease.
    Overlapped {
        /// The log entry.
        entry: LogEntry,
    },
    /// This instance ran it and the job failed (not retried).
    JobFailed {
        /// The run's log entry.
        entry: LogEntry,
    },
    /// This instance's lease for this occurrence is held (by another tick of it, or by a
    /// tick that failed before writing its outcome and could not release) and the reservation
    /// has no outcome: not settled, to be retried after `retry_after` (the lease's time left).
    InProgress {
        /// How long the lease has left.
        retry_after: Duration,
    },
    /// The occurrence is older than the retention (or than the log's clean-up): refused,
    /// whoever asks and however often.
    TooOld {
        /// The retention.
        retention: Duration,
    },
    /// The occurrence is further ahead of the storage server's clock than `job_early_seconds`:
    /// refused (a clock or a caller running ahead would take future occurrences).
    TooEarly {
        /// The tolerance.
        early: Duration,
    },
    /// A run of an earlier occurrence holds the job's lease and this occurrence is not due yet
    /// by the storage server's clock: nothing is recorded (no tick skips an occurrence before
    /// it is due); a tick once it is due decides.
    NotDue {
        /// How long until it is due.
        retry_after: Duration,
    },
}

impl Decision {
    /// `ran`, `skipped`, `overlapped`, `failed` or `too_old`.
    pub fn name(&self) -> &'static str {
        match self {
            Decision::Ran { .. } => "ran",
            Decision::Skipped { .. } => "skipped",
            Decision::Overlapped { .. } => "overlapped",
            Decision::JobFailed { .. } => "failed",
            Decision::TooOld { .. } => "too_old",
            Decision::TooEarly { .. } => "too_early",
            Decision::InProgress { .. } => "in_progress",
            Decision::NotDue { .. } => "not_due",
        }
    }
}

/// A tick's outcome: the occurrence, the decision (or the storage failure), the storage
/// requests it took.
#[derive(Debug)]
pub struct TickOutcome {
    /// The occurrence (Unix seconds).
    pub occurrence: u64,
    /// What happened.
    pub decision: Result<Decision, JobError>,
    /// Storage requests sent.
    pub round_trips: u32,
}

/// Runs one tick: reserve, lease, log, run, log, release, clean up.
pub async fn tick<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    tick: &Tick,
) -> TickOutcome {
    let occurrence = timer::occurrence(tick.at, settings.period, settings.offset);
    let occurrence = unix(occurrence);
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let job_transport = (ctx.connect)(settings.timeout);
    let decision = run_tick(ctx, &counting, &job_transport, settings, tick, occurrence).await;
    TickOutcome {
        occurrence,
        decision,
        round_trips: counting.sent(),
    }
}

pub(crate) async fn run_tick<T, S: Transport, J: Transport>(
    ctx: &Context<'_, T>,
    storage: &S,
    job: &J,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
) -> Result<Decision, JobError> {
    let s = &settings.storage;
    let blobs = BlobClient::new(storage, s.account.clone(), s.container.clone());
    let blob = settings.reservation(occurrence)?;
    // 1. Reserve.
    let mut metadata = Metadata::new();
    metadata.insert(META_RESERVED_BY.into(), settings.instance_id.clone());
    metadata.insert(META_TRIGGER.into(), tick.source.as_str().into());
    let body = ReservationBody {
        job: settings.job.clone(),
        occurrence: rfc3339(at(occurrence)),
        instance: settings.instance_id.clone(),
    };
    // Three strings: serializing cannot fail.
    let body = serde_json::to_vec(&body).expect("a reservation serializes");
    let put = PutBlob::block(s.container.clone(), blob.clone(), body)
        .with_content_type("application/json")
        .with_condition(Condition::IfNotExists)
        .with_metadata(metadata.clone());
    let (reserved, date) = execute_creating_container(&blobs, &s.container, &put, ctx.now).await?;
    let (reserved_at, server_now, reservation) = match reserved {
        WriteOutcome::Written(w) => {
            let t = w.server_date.or(date).unwrap_or(ctx.now);
            let r = Reservation {
                blob,
                etag: w.etag,
                metadata,
                created: true,
            };
            (t, t, r)
        }
        WriteOutcome::Refused(_) => {
            let (props, date) = head(&blobs, &blob, ctx.now).await?;
            let props = props.unwrap_or_default();
            let server_now = date.unwrap_or(ctx.now);
            let reserved_by = props.metadata.get(META_RESERVED_BY).cloned();
            // This instance reserved it on an earlier tick (or another tick of it is at work
            // on it now), or its reserver left it without an outcome past its deadline (any
            // instance takes it over): the outcome on the reservation says whether it is
            // settled, and its compare-and-swap lets one tick run it.
            if reserved_by.as_deref() != Some(settings.instance_id.as_str())
                && !abandoned(&props, server_now, settings)
            {
                return Ok(Decision::Skipped {
                    reserved_by,
                    reason: "another instance reserved it".into(),
                });
            }
            let t = props.last_modified.unwrap_or(ctx.now);
            let r = Reservation {
                blob,
                etag: props.etag,
                metadata: props.metadata,
                created: false,
            };
            (t, date.unwrap_or(ctx.now), r)
        }
    };
    // 2. Occurrences too far from the storage server's clock are refused, every time: the
    // reservation this tick made is taken back.
    let refusal = if unix(server_now).saturating_sub(settings.retention.as_secs()) > occurrence {
        Some(Decision::TooOld {
            retention: settings.retention,
        })
    } else if occurrence > unix(server_now).saturating_add(settings.early.as_secs()) {
        Some(Decision::TooEarly {
            early: settings.early,
        })
    } else {
        None
    };
    if let Some(refusal) = refusal {
        if reservation.created {
            take_back(&blobs, &reservation, ctx.now).await;
        }
        return Ok(refusal);
    }
    run_reserved(
        ctx,
        &blobs,
        job,
        settings,
        tick,
        occurrence,
        (reserved_at, server_now),
        reservation,
    )
    .await
}

/// Steps 3 to 6 of [`run_tick`], once the occurrence is reserved and in range.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_reserved<T, S: Transport, J: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    job: &J,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
    (reserved_at, server_now): (SystemTime, SystemTime),
    reservation: Reservation,
) -> Result<Decision, JobError> {
    let reserved_by = reservation.metadata.get(META_RESERVED_BY).cloned();
    let settled = |run: &RunStatus| Decision::Skipped {
        reserved_by: reserved_by.clone(),
        reason: if *run == RunStatus::Missed {
            "it was recorded missed: its reserver wrote no outcome by its deadline".into()
        } else if reserved_by.as_deref() == Some(settings.instance_id.as_str()) {
            format!("this instance settled it on an earlier tick ({run})")
        } else {
            format!("it was settled after its reserver's deadline ({run})")
        },
    };
    // 3. A reservation with an outcome already is settled: `skipped`. Otherwise the job's lease
    // (below).
    if let Some(run) = outcome_of(&reservation.metadata) {
        return Ok(settled(&run));
    }
    let token = occurrence_token(occurrence)?;
    let mut entry = LogEntry {
        occurrence: rfc3339(at(occurrence)),
        occurrence_unix: occurrence,
        instance: settings.instance_id.clone(),
        reserved_at: rfc3339(reserved_at),
        status: RunStatus::Running,
        fencing_token: Some(token),
        trigger: tick.source.as_str().into(),
        past_due: tick.past_due,
        finished_at: None,
        reason: None,
    };
    let nonce = (ctx.new_lease_id)().to_string();
    // Still 3: the job's lease (skip: one run at a time), labelled with the instance and the
    // occurrence, so that a tick finding its own occurrence's run in it leaves that run alone.
    let job_locks =
        Locks::from_client(blobs.clone()).with_prefix(&format!("jobs/{}/", settings.job));
    let lock_name = LockName::try_new("lock")?;
    let label = format!("{} {occurrence}", settings.instance_id);
    let lease_id = (ctx.new_lease_id)();
    let leased = match settings.overlap {
        Overlap::Allow => false,
        Overlap::Skip => match job_locks
            .acquire_with(
                &lock_name,
                settings.lease_term,
                lease_id,
                IdOrigin::Fresh,
                &label,
                ctx.now,
            )
            .await?
        {
            Acquire::Acquired(_) => true,
            Acquire::Busy {
                holder: Some(h), ..
            } if label_occurrence(&h.label) != Some(occurrence) => {
                // Another occurrence's run: this occurrence is skipped, once, but only once it
                // is due (by the storage server's clock, give or take its second): a tick ahead
                // of it records nothing, and a tick once it is due decides.
                let due_in = occurrence.saturating_sub(unix(server_now));
                if due_in > DUE_GRACE_SECS {
                    if reservation.created {
                        take_back(blobs, &reservation, ctx.now).await;
                    }
                    return Ok(Decision::NotDue {
                        retry_after: Duration::from_secs(due_in),
                    });
                }
                entry.status = RunStatus::SkippedOverlap;
                entry.reason = Some("the previous run still holds the job's lease".into());
                let written = match commit(
                    blobs,
                    &reservation,
                    &entry.status,
                    &nonce,
                    Some(token),
                    ctx.now,
                )
                .await?
                {
                    Commit::Settled(run) => return Ok(settled(&run)),
                    Commit::Written(w) => w,
                };
                return match append(blobs, settings, &entry, ctx.now).await {
                    Ok(Err(LogRefusal::TooOld)) => {
                        uncommit(blobs, &reservation, &written, ctx.now).await;
                        Ok(Decision::TooOld {
                            retention: settings.retention,
                        })
                    }
                    // The skip is recorded on the reservation; the log is its view.
                    Ok(Ok(())) | Err(_) => Ok(Decision::Overlapped { entry }),
                };
            }
            Acquire::Busy { retry_after, .. } => {
                // This occurrence's lease (or one with no claim yet): settled only if the
                // reservation now shows an outcome. Else its holder may be dead (its outcome
                // write and its release failed): not settled, retried once the lease ends.
                let (props, _) = head(blobs, &reservation.blob, ctx.now).await?;
                if let Some(run) = props.as_ref().and_then(|p| outcome_of(&p.metadata)) {
                    return Ok(settled(&run));
                }
                let wait = retry_after.unwrap_or(term_length(settings.lease_term));
                return Ok(Decision::InProgress {
                    retry_after: wait.max(Duration::from_secs(1)),
                });
            }
        },
    };
    let release = || {
        let (job_locks, lock_name) = (&job_locks, &lock_name);
        async move {
            if leased {
                let _ = job_locks.release(lock_name, lease_id, ctx.now).await;
            }
        }
    };
    // 4. The outcome "running" on the reservation: the one tick that writes it runs the job.
    let running = RunStatus::Running;
    let written = match commit(blobs, &reservation, &running, &nonce, Some(token), ctx.now).await {
        Ok(Commit::Written(w)) => w,
        Ok(Commit::Settled(run)) => {
            release().await;
            return Ok(settled(&run));
        }
        Err(e) => {
            release().await;
            return Err(e);
        }
    };
    // 5. Log the run before it starts, so a run that never ends still shows; the log refuses an
    // occurrence below its clean-up watermark. Either refusal, or a storage failure, undoes
    // the outcome: the job was not called, and a later tick decides afresh.
    match append(blobs, settings, &entry, ctx.now).await {
        Ok(Ok(())) => {}
        refused => {
            uncommit(blobs, &reservation, &written, ctx.now).await;
            release().await;
            return match refused {
                Err(e) => Err(e),
                Ok(_) => Ok(Decision::TooOld {
                    retention: settings.retention,
                }),
            };
        }
    }
    // 6. Call the job, then record the result on the reservation and in the log (raising the
    // clean-up watermark), release, settle earlier occurrences and clean up below the watermark.
    let result = call_job(job, settings, &entry).await;
    let (status, reason) = match &result {
        Ok(()) => (RunStatus::Succeeded, None),
        Err(reason) => (RunStatus::Failed, Some(reason.clone())),
    };
    entry.status = status.clone();
    entry.reason = reason;
    if let Some(etag) = written.etag.clone() {
        let mut metadata = written.metadata.clone();
        metadata.insert(META_RUN.into(), status.to_string());
        let write = SetMetadata {
            container: blobs.container().clone(),
            blob: written.blob.clone(),
            metadata,
            lease_id: None,
            condition: Condition::IfMatch(etag),
        };
        let _ = blobs.execute(&write, ctx.now).await;
    }
    let finished = update(blobs, settings, &entry, ctx.now).await;
    release().await;
    if let Ok((end, log)) = &finished {
        entry.finished_at = Some(rfc3339(*end));
        // Earlier occurrences whose reservers left them without an outcome: settled here, as a
        // redundant deployment is for. Best effort: a later winner goes on from the log.
        let _ = settle_earlier(ctx, blobs, settings, tick, occurrence, log).await;
        let _ = clean_up(blobs, settings, log.cleaned_before, ctx.now).await;
    }
    Ok(match result {
        Ok(()) => Decision::Ran { entry },
        Err(_) => Decision::JobFailed { entry },
    })
}

/// What the job is POSTed: the occurrence, its fencing token and idempotency key, who runs it
/// and why.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JobRequest<'a> {
    job: &'a str,
    occurrence: &'a str,
    occurrence_unix: u64,
    fencing_token: Option<u64>,
    idempotency_key: &'a str,
    instance: &'a str,
    trigger: &'a str,
    past_due: bool,
}

/// POSTs the occurrence to the job; `Err` says why it did not confirm (no URL, no secret).
pub(crate) async fn call_job<J: Transport>(
    job: &J,
    settings: &Settings,
    entry: &LogEntry,
) -> Result<(), String> {
    let key = idempotency_key(&settings.job, entry.occurrence_unix);
    let body = serde_json::to_vec(&JobRequest {
        job: &settings.job,
        occurrence: &entry.occurrence,
        occurrence_unix: entry.occurrence_unix,
        fencing_token: entry.fencing_token,
        idempotency_key: &key,
        instance: &settings.instance_id,
        trigger: &entry.trigger,
        past_due: entry.past_due,
    })
    .map_err(|e| format!("the job request could not be built: {e}"))?;
    let request = web::json_post(&settings.job_url, &key, body)
        .ok_or_else(|| "the job request could not be built".to_string())?;
    match job.send_for_status(request).await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("the job answered {}", r.status().as_u16())),
        Err(e) if e.kind == TransportErrorKind::Connect => {
            Err(format!("the job is unreachable: {}", e.message))
        }
        Err(e) => Err(format!("the job did not confirm: {}", e.message)),
    }
}

/// The idempotency key of an occurrence's run: the same for any resend of it, another for every
/// other occurrence or job.
pub fn idempotency_key(job: &str, occurrence: u64) -> String {
    let digest = Sha256::new()
        .chain_update(b"leasegate job v1\0")
        .chain_update(job.as_bytes())
        .chain_update(b"\0")
        .chain_update(occurrence.to_string().as_bytes())
        .finalize();
    leasegate_spin::web::hex(&digest[..16])
}

/// Settles the occurrences between the log's `settled_through` and `occurrence` (this tick's,
/// which it ran) that have no entry in the log, oldest first, at most [`SETTLE_MAX`]: a
/// reservation its reserver left without an outcome past its deadline ([`abandoned`]) gets the
/// outcome `missed` (by the same compare-and-swap as any outcome, so a reserver that comes
/// back late finds it settled) and an entry in the log; one that nobody reserved, or that has
/// an outcome, is settled as it is. The first one still within its reserver's deadline stops
/// the walk: a later winner looks again. Nothing is read when the watermark is at the
/// occurrence before this one, as it is whenever every tick has a winner.
pub(crate) async fn settle_earlier<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
    log: &Log,
) -> Result<(), JobError> {
    let mut candidates = Vec::new();
    let mut next = settings.next_occurrence(log.settled_through);
    while log.settled_through != 0 && next < occurrence && candidates.len() < SETTLE_MAX {
        if next >= log.cleaned_before && !log.entries.iter().any(|e| e.occurrence_unix == next) {
            candidates.push(next);
        }
        next = settings.next_occurrence(next);
    }
    if candidates.is_empty() {
        return Ok(());
    }
    let mut missed = Vec::new();
    let mut through = 0;
    for o in candidates {
        let blob = settings.reservation(o)?;
        let (props, date) = head(blobs, &blob, ctx.now).await?;
        let Some(props) = props else {
            through = o;
            continue;
        };
        // `running` with no log entry: its runner's log write is on its way, or failed and
        // will undo the outcome (a later winner looks again; the lookback bounds the wait).
        match outcome_of(&props.metadata) {
            Some(RunStatus::Running) => break,
            Some(_) => {
                through = o;
                continue;
            }
            None => {}
        }
        if !abandoned(&props, date.unwrap_or(ctx.now), settings) {
            break;
        }
        let reserved_by = props.metadata.get(META_RESERVED_BY).cloned();
        let reservation = Reservation {
            blob,
            etag: props.etag,
            metadata: props.metadata,
            created: false,
        };
        let nonce = (ctx.new_lease_id)().to_string();
        let missed_run = RunStatus::Missed;
        let written = match commit(blobs, &reservation, &missed_run, &nonce, None, ctx.now).await? {
            Commit::Settled(RunStatus::Running) => break,
            Commit::Settled(_) => false,
            Commit::Written(_) => true,
        };
        if written {
            let at_now = date.unwrap_or(ctx.now);
            missed.push(LogEntry {
                occurrence: rfc3339(at(o)),
                occurrence_unix: o,
                instance: reserved_by.clone().unwrap_or_default(),
                reserved_at: rfc3339(props.last_modified.unwrap_or(at_now)),
                status: RunStatus::Missed,
                fencing_token: None,
                trigger: tick.source.as_str().into(),
                past_due: false,
                finished_at: Some(rfc3339(at_now)),
                reason: Some(format!(
                    "its reserver ({}) wrote no outcome within {} s; settled by {}",
                    reserved_by.as_deref().unwrap_or("unknown"),
                    settings.reservation_deadline().as_secs(),
                    settings.instance_id
                )),
            });
        }
        through = o;
    }
    if through == 0 {
        return Ok(());
    }
    let _ = change_log(blobs, settings, ctx.now, |log, read_at| {
        for entry in &missed {
            if !log
                .entries
                .iter()
                .any(|e| e.occurrence_unix == entry.occurrence_unix)
            {
                log.entries.push(entry.clone());
            }
        }
        advance_settled(log, settings, occurrence, through, read_at);
        Ok::<(), ()>(())
    })
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reservation::ReservationBody;

    #[test]
    fn records_keep_their_field_names() {
        let body = serde_json::to_string(&ReservationBody {
            job: "j".into(),
            occurrence: "1970-01-01T00:01:00Z".into(),
            instance: "i".into(),
        })
        .unwrap();
        assert_eq!(
            body,
            r#"{"job":"j","occurrence":"1970-01-01T00:01:00Z","instance":"i"}"#
        );
        let call = serde_json::to_string(&JobRequest {
            job: "j",
            occurrence: "1970-01-01T00:01:00Z",
            occurrence_unix: 60,
            fencing_token: Some(3_932_160),
            idempotency_key: "k",
            instance: "i",
            trigger: "http",
            past_due: false,
        })
        .unwrap();
        assert_eq!(
            call,
            r#"{"job":"j","occurrence":"1970-01-01T00:01:00Z","occurrenceUnix":60,"fencingToken":3932160,"idempotencyKey":"k","instance":"i","trigger":"http","pastDue":false}"#
        );
    }
}
