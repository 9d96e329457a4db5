//! Settling a reservation without a run: the takeover rule's `Settle` (a reserver that left
//! it without an outcome, a runner that vanished with no attempts left).

use super::*;

/// A reservation the takeover rule settles without a run: as read, the outcome to write, and
/// the storage server's clock at the read.
#[derive(Debug)]
pub(crate) struct Vanished {
    /// The reservation as read (what the compare-and-swap writes over).
    pub(crate) reservation: Reservation,
    /// Its properties as read.
    pub(crate) props: leasegate::ops::BlobProperties,
    /// The outcome to write: `missed` or `failed`.
    pub(crate) status: RunStatus,
    /// The storage server's clock at the read.
    pub(crate) server_now: SystemTime,
}

/// Settles a reservation without a run (the takeover rule's [`Takeover::Settle`]): `missed` on
/// one its reserver left without an outcome (recorded in the log by the caller's walk), or
/// `failed` on a run whose runner vanished with no attempts left (recorded in the log here).
/// By compare-and-swap: `None` when another tick settled it first.
pub(crate) async fn settle_vanished<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<&S>,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
    vanished: &Vanished,
) -> Result<Option<LogEntry>, JobError> {
    let Vanished {
        reservation,
        props,
        status,
        server_now,
    } = vanished;
    let (status, server_now) = (status.clone(), *server_now);
    let reserved_by = props.metadata.get(META_RESERVED_BY).cloned();
    let attempt = attempt_of(&props.metadata);
    let nonce = (ctx.new_lease_id)().to_string();
    let over = if status == RunStatus::Failed {
        Over::Attempt(attempt)
    } else {
        Over::Nothing
    };
    let write = OutcomeWrite {
        outcome: &status,
        attempt,
        over,
        nonce: &nonce,
    };
    match commit(blobs, reservation, &write, ctx.now).await? {
        Commit::Settled(_) => return Ok(None),
        Commit::Written(_) => {}
    }
    let who = reserved_by.as_deref().unwrap_or("unknown");
    let reason = if status == RunStatus::Missed {
        format!(
            "its reserver ({who}) wrote no outcome within {} s; settled by {}",
            settings.reservation_deadline().as_secs(),
            settings.instance_id
        )
    } else {
        format!(
            "its runner ({who}) wrote no outcome within the run's deadline ({} s) of attempt \
             {attempt}, the last of {} (job_retries = {}): not run again; settled by {}",
            settings.run_deadline().as_secs(),
            settings.retries + 1,
            settings.retries,
            settings.instance_id
        )
    };
    let entry = LogEntry {
        occurrence: rfc3339(at(occurrence)),
        occurrence_unix: occurrence,
        instance: reserved_by.clone().unwrap_or_default(),
        reserved_at: rfc3339(props.last_modified.unwrap_or(server_now)),
        status: status.clone(),
        fencing_token: (status == RunStatus::Failed)
            .then(|| attempt_token(occurrence, attempt).ok())
            .flatten(),
        trigger: tick.source.as_str().into(),
        past_due: false,
        finished_at: Some(rfc3339(server_now)),
        reason: Some(reason),
        attempt: (status == RunStatus::Failed).then_some(attempt),
    };
    if status == RunStatus::Failed {
        let _ = change_log(blobs, settings, ctx.now, |log, _| {
            // The token its run was issued, as its start logged it.
            let mut entry = entry.clone();
            entry.fencing_token = log.token_of(occurrence).or(entry.fencing_token);
            log.entries.retain(|e| e.occurrence_unix != occurrence);
            log.entries.push(entry);
            log.counters.failed += 1;
            Ok::<(), ()>(())
        })
        .await;
    }
    Ok(Some(entry))
}
