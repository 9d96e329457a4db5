//! The writes that put an attempt's outcome right: the undo after the log refused its entry,
//! an outcome written over this attempt's own, the run's result.

use super::*;

/// Undoes this tick's outcome after the log refused its entry: taken back
/// ([`crate::reservation::uncommit`]), except for an occurrence due before the job's history,
/// whose reservation is marked `before_history` (not recorded missed anywhere): a later tick
/// of it, late, stops at the read it makes first. Best effort.
pub(super) async fn undo<S: Transport>(
    blobs: &BlobClient<&S>,
    reservation: &Reservation,
    written: &Reservation,
    refusal: &LogRefusal,
    now: SystemTime,
) {
    if let LogRefusal::BeforeHistory(_) = refusal {
        if let Ok(true) = overwrite_outcome(blobs, written, &RunStatus::BeforeHistory, now).await {
            return;
        }
    }
    uncommit(blobs, reservation, written, now).await;
}

/// Writes `status` over the outcome this tick wrote (`written`), by compare-and-swap: a
/// `running` or `pending` that called nothing becomes `skipped_paused` or `skipped_overlap`.
/// `Ok(false)`: refused (the reservation changed since).
pub(super) async fn overwrite_outcome<S: Transport>(
    blobs: &BlobClient<&S>,
    written: &Reservation,
    status: &RunStatus,
    now: SystemTime,
) -> Result<bool, leasegate::Error> {
    let Some(etag) = written.etag.clone() else {
        return Ok(false);
    };
    let mut metadata = written.metadata.clone();
    metadata.insert(META_RUN.into(), status.to_string());
    let write = SetMetadata {
        container: blobs.container().clone(),
        blob: written.blob.clone(),
        metadata,
        lease_id: None,
        condition: Condition::IfMatch(etag),
    };
    let (outcome, _) = blobs.execute(&write, now).await?;
    Ok(matches!(outcome, WriteOutcome::Written(_)))
}

/// Writes a run's result (and its fencing token) over its own `running` (the reservation as
/// this tick wrote it, its `nonce`), retried after a failure or a lost answer while the reservation still holds this
/// tick's `running`: a result left unwritten would look like a vanished runner to the takeover
/// rule. Should every try fail, the log still records the result and the takeover rule reads it
/// there ([`logged_result`]).
pub(super) async fn record_result<S: Transport>(
    blobs: &BlobClient<&S>,
    written: &Reservation,
    status: &RunStatus,
    token: Option<u64>,
    nonce: &str,
    now: SystemTime,
) {
    let mut seen = written.clone();
    for _ in 0..3 {
        if let Some(token) = token {
            seen.metadata
                .insert(META_RUN_TOKEN.into(), token.to_string());
        }
        if seen.etag.is_none()
            || matches!(overwrite_outcome(blobs, &seen, status, now).await, Ok(true))
        {
            return;
        }
        // Failed, refused or lost: read it back; go on only while it is this tick's `running`.
        let Ok((Some(props), _)) = head(blobs, &seen.blob, now).await else {
            continue;
        };
        let mine = props.metadata.get(META_RUN_TICK).map(String::as_str) == Some(nonce);
        if !mine || outcome_of(&props.metadata) != Some(RunStatus::Running) {
            return;
        }
        seen.etag = props.etag;
        seen.metadata = props.metadata;
    }
}
