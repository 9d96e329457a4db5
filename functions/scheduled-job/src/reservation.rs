//! An occurrence's reservation, `jobs/{job}/occurrences/{unix:012}`: the record of whether it
//! ran. Its outcome is written by compare-and-swap on its ETag; its reserver's chance ends at
//! its deadline; reservations older than the retention are deleted.

use leasegate::ops::{
    Condition, DeleteBlob, GetProperties, ListBlobs, Metadata, PutBlob, SetMetadata, WriteOutcome,
};
use leasegate::BlobClient;
use leasegate::{BlobName, Transport};
use leasegate_spin::storage::execute_creating_container;
use leasegate_spin::web::rfc3339;
use std::time::SystemTime;

use crate::error::JobError;
use crate::log::LOG_ATTEMPTS;
use crate::settings::Settings;

// The reservation's schema (its metadata names, its body, its outcomes) is the toolkit's
// `record`, shared with `once_per_occurrence` and the CLI.
pub(crate) use leasegate_spin::record::{
    attempt as attempt_of, outcome as outcome_of, reserved_on_time, ReservationBody, META_ATTEMPT,
    META_PAST_DUE, META_RESERVED_BY, META_RESERVE_TICK, META_RUN, META_RUN_TICK, META_RUN_TOKEN,
    META_TRIGGER,
};
pub use leasegate_spin::record::{occurrence_token, RunStatus};

/// The most attempts an occurrence may have (`job_retries` + 1): tokens keep below the next
/// occurrence's.
pub const MAX_ATTEMPTS: u32 = 1 << 15;

/// A reservation as this tick knows it: its ETag and metadata (what a compare-and-swap
/// writes over), and whether this tick created it.
#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    pub(crate) blob: BlobName,
    pub(crate) etag: Option<leasegate::ETag>,
    pub(crate) metadata: Metadata,
    pub(crate) created: bool,
}

/// An occurrence's own token for an attempt (1 for the first): `occurrence x 2^16 + attempt -
/// 1`, the floor of the token the attempt's run is issued. The first attempt's is
/// [`occurrence_token`]'s (attempts stay below 2^16).
pub fn attempt_token(occurrence: u64, attempt: u32) -> Result<u64, leasegate::Error> {
    let attempt = attempt.clamp(1, MAX_ATTEMPTS);
    occurrence_token(occurrence)?
        .checked_add(u64::from(attempt - 1))
        .filter(|t| *t <= leasegate::lease::MAX_TOKEN)
        .ok_or_else(|| {
            leasegate::Error::InvalidArgument(format!(
                "occurrence {occurrence} is too far ahead for a fencing token"
            ))
        })
}

/// What an instance may do with a reservation whose holder is gone or whose run failed: the one
/// rule for a reserver that vanished before its outcome, a runner that vanished during its run,
/// and a run that failed. A reservation with no outcome belongs to its reserver until its
/// deadline, its `Last-Modified` plus the job's lease term, which bounds the reserver's steps up
/// to its outcome (the lease, then the outcome's write); a `running` one to its runner until the
/// run's deadline (the same term from the outcome's write: the job's timeout and the storage
/// requests after it). Taking over early would still run each attempt at most once (the
/// outcome's compare-and-swap decides); the deadlines say who acts. Each deadline is by the storage server's clock, from the
/// reservation's `Last-Modified` (its last write: the reservation, the outcome `running`, the
/// outcome `failed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Takeover {
    /// Nothing to take over: settled, or someone is within its deadline.
    No,
    /// Run it: `attempt` (1: a reservation left without an outcome; more: a retry, or a run
    /// whose runner vanished, with attempts left).
    Run {
        /// The attempt to run.
        attempt: u32,
    },
    /// Settle it without a run: the outcome to write (`missed`: a reservation left without an
    /// outcome, looked at by a later winner; `failed`: a run whose runner vanished with no
    /// attempts left).
    Settle(RunStatus),
    /// A failed run with attempts left whose retry delay has not passed: wait this long.
    Wait(std::time::Duration),
}

/// The takeover rule (see [`Takeover`]). `later_winner`: the instance looking is the winner of
/// a later occurrence (a newer occurrence ran: a reservation left without an outcome is
/// recorded missed rather than run late).
pub(crate) fn takeover(
    props: &leasegate::ops::BlobProperties,
    server_now: SystemTime,
    settings: &Settings,
    later_winner: bool,
) -> Takeover {
    let Some(since) = props.last_modified else {
        return Takeover::No;
    };
    let attempt = attempt_of(&props.metadata);
    let attempts = settings.retries.saturating_add(1);
    match outcome_of(&props.metadata) {
        None if since + settings.reservation_deadline() <= server_now => {
            if later_winner {
                Takeover::Settle(RunStatus::Missed)
            } else {
                Takeover::Run { attempt: 1 }
            }
        }
        Some(RunStatus::Running) if since + settings.run_deadline() <= server_now => {
            if attempt < attempts {
                Takeover::Run {
                    attempt: attempt + 1,
                }
            } else {
                Takeover::Settle(RunStatus::Failed)
            }
        }
        // Buffered (`job_overlap = buffer_one`): run it (once the lease is free).
        Some(RunStatus::Pending) => Takeover::Run { attempt: 1 },
        Some(RunStatus::Failed) if attempt < attempts => {
            let due = since + settings.retry_delay;
            match due.duration_since(server_now) {
                Ok(wait) if !wait.is_zero() => Takeover::Wait(wait),
                _ => Takeover::Run {
                    attempt: attempt + 1,
                },
            }
        }
        _ => Takeover::No,
    }
}

/// The occurrence a job's lease label names (`{instance} {occurrence}`).
pub(crate) fn label_occurrence(label: &str) -> Option<u64> {
    label.rsplit(' ').next()?.parse().ok()
}

/// What creating an occurrence's reservation came to.
pub(crate) enum Reserved {
    /// This tick created it: the reservation as written, and the storage server's time of the
    /// write.
    Created(Reservation, SystemTime),
    /// It exists already (another tick's).
    Exists,
}

/// The tick that reserves an occurrence, as its reservation records it.
pub(crate) struct Reserving<'a> {
    /// What started the tick (`cron`, `http`, ...).
    pub(crate) trigger: &'a str,
    /// Whether the tick came later than the tick tolerance (`pastDue`).
    pub(crate) late: bool,
    /// The tick's nonce: how a create whose answer was lost is recognised as its own.
    pub(crate) nonce: &'a str,
}

/// Creates the reservation of `occurrence` (`If-None-Match: *`; the container too, if it is
/// missing), reserved by this instance for the tick `by`. A create whose answer is lost (or a
/// 5xx) is read back, one request on that path: the tick's nonce in the metadata says whether
/// the reservation there is its own, so the tick goes on with it instead of leaving it to the
/// takeover rule.
pub(crate) async fn reserve<T: Transport>(
    blobs: &BlobClient<T>,
    settings: &Settings,
    occurrence: u64,
    by: &Reserving<'_>,
    now: SystemTime,
) -> Result<Reserved, JobError> {
    let Reserving {
        trigger,
        late,
        nonce,
    } = *by;
    let blob = settings.reservation(occurrence)?;
    let mut metadata = Metadata::new();
    metadata.insert(META_RESERVED_BY.into(), settings.instance_id.clone());
    metadata.insert(META_TRIGGER.into(), trigger.into());
    metadata.insert(META_RESERVE_TICK.into(), nonce.into());
    if late {
        metadata.insert(META_PAST_DUE.into(), "true".into());
    }
    let body = ReservationBody {
        job: Some(settings.job.clone()),
        occurrence: rfc3339(crate::at(occurrence)),
        instance: settings.instance_id.clone(),
    };
    // Three strings: serializing cannot fail.
    let body = serde_json::to_vec(&body).expect("a reservation serializes");
    let container = blobs.container().clone();
    let put = PutBlob::block(container.clone(), blob.clone(), body)
        .with_content_type("application/json")
        .with_condition(Condition::IfNotExists)
        .with_metadata(metadata.clone());
    let reservation = |etag| Reservation {
        blob: blob.clone(),
        etag,
        metadata: metadata.clone(),
        created: true,
    };
    match execute_creating_container(blobs, &container, &put, now).await {
        Ok((WriteOutcome::Written(w), date)) => Ok(Reserved::Created(
            reservation(w.etag),
            w.server_date.or(date).unwrap_or(now),
        )),
        Ok((WriteOutcome::Refused(_), _)) => Ok(Reserved::Exists),
        Err(e) if e.outcome_unknown() => match head(blobs, &blob, now).await {
            Ok((Some(p), date))
                if p.metadata.get(META_RESERVE_TICK).map(String::as_str) == Some(nonce) =>
            {
                let at = p.last_modified.or(date).unwrap_or(now);
                Ok(Reserved::Created(
                    Reservation {
                        metadata: p.metadata,
                        ..reservation(p.etag)
                    },
                    at,
                ))
            }
            Ok((Some(_), _)) => Ok(Reserved::Exists),
            _ => Err(e.into()),
        },
        Err(e) => Err(e.into()),
    }
}

/// One HEAD of a reservation.
pub(crate) async fn head<T: Transport>(
    blobs: &BlobClient<T>,
    blob: &BlobName,
    now: SystemTime,
) -> Result<(Option<leasegate::ops::BlobProperties>, Option<SystemTime>), leasegate::Error> {
    blobs
        .execute(
            &GetProperties {
                container: blobs.container().clone(),
                blob: blob.clone(),
            },
            now,
        )
        .await
}

/// Deletes the reservation this tick made (as it last wrote it): best effort.
pub(crate) async fn take_back<T: Transport>(
    blobs: &BlobClient<T>,
    reservation: &Reservation,
    now: SystemTime,
) {
    if let Some(etag) = &reservation.etag {
        let delete = DeleteBlob {
            container: blobs.container().clone(),
            blob: reservation.blob.clone(),
            lease_id: None,
            condition: Condition::IfMatch(etag.clone()),
        };
        let _ = blobs.execute(&delete, now).await;
    }
}

/// The outcome a write on a reservation may replace (and only it): of all the ticks that find
/// one, one writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    /// None (or `pending`): a first attempt, a skip, a miss.
    Nothing,
    /// This attempt's `failed` or `running`: a retry, a takeover, a vanished run settled.
    Attempt(u32),
    /// An outcome of an occurrence that never ran (`missed`, `skipped_paused`,
    /// `skipped_overlap`, or none): a backfill's run.
    NeverRan,
}

/// What writing an outcome on a reservation came to.
pub(crate) enum Commit {
    /// This tick wrote it: the reservation as written.
    Written(Reservation),
    /// A tick before it wrote one (this outcome).
    Settled(RunStatus),
}

/// An outcome to write on a reservation ([`commit`]).
#[derive(Clone, Copy)]
pub(crate) struct OutcomeWrite<'a> {
    /// The outcome.
    pub(crate) outcome: &'a RunStatus,
    /// The attempt it belongs to (written when above 1).
    pub(crate) attempt: u32,
    /// The outcome it may replace.
    pub(crate) over: Over,
    /// The tick's nonce: how a write whose answer was lost is recognised as its own.
    pub(crate) nonce: &'a str,
}

/// Writes an outcome on the reservation by compare-and-swap, unless it has one already: of all
/// the ticks of one occurrence, one writes an outcome, and only that one runs the job (or
/// records the skip). A write whose answer is lost is read back (its nonce).
pub(crate) async fn commit<T: Transport>(
    blobs: &BlobClient<T>,
    reservation: &Reservation,
    write: &OutcomeWrite<'_>,
    now: SystemTime,
) -> Result<Commit, JobError> {
    let OutcomeWrite {
        outcome,
        attempt,
        over,
        nonce,
    } = *write;
    let mut seen = reservation.clone();
    for _ in 0..LOG_ATTEMPTS {
        // `over: None` writes over no outcome (a first attempt, a skip, a miss); `Some(a)` over
        // attempt `a`'s `failed` or `running` (a retry, a takeover, a vanished run settled), and
        // only that one: of all the ticks that find it, one writes.
        match (outcome_of(&seen.metadata), over) {
            // A buffered occurrence (`pending`) is decided like one with no outcome.
            (None | Some(RunStatus::Pending), Over::Nothing | Over::NeverRan) => {}
            (Some(RunStatus::Failed | RunStatus::Running), Over::Attempt(a))
                if attempt_of(&seen.metadata) == a => {}
            (
                Some(
                    RunStatus::Missed
                    | RunStatus::SkippedPaused
                    | RunStatus::SkippedOverlap
                    | RunStatus::BeforeHistory,
                ),
                Over::NeverRan,
            ) => {}
            (Some(run), _) => return Ok(Commit::Settled(run)),
            (None, _) => return Ok(Commit::Settled(RunStatus::Other("undone".into()))),
        }
        if let Some(etag) = seen.etag.clone() {
            let mut metadata = seen.metadata.clone();
            metadata.insert(META_RUN.into(), outcome.to_string());
            metadata.insert(META_RUN_TICK.into(), nonce.into());
            if attempt > 1 {
                metadata.insert(META_ATTEMPT.into(), attempt.to_string());
            }
            let write = SetMetadata {
                container: blobs.container().clone(),
                blob: seen.blob.clone(),
                metadata: metadata.clone(),
                lease_id: None,
                condition: Condition::IfMatch(etag),
            };
            match blobs.execute(&write, now).await {
                Ok((WriteOutcome::Written(w), _)) => {
                    return Ok(Commit::Written(Reservation {
                        etag: w.etag,
                        metadata,
                        ..seen
                    }))
                }
                Ok((WriteOutcome::Refused(_), _)) => {}
                Err(e) => {
                    // Storage may have written it: read back whose outcome is there.
                    return match head(blobs, &seen.blob, now).await {
                        Ok((Some(p), _))
                            if p.metadata.get(META_RUN_TICK).map(String::as_str) == Some(nonce) =>
                        {
                            Ok(Commit::Written(Reservation {
                                etag: p.etag,
                                metadata: p.metadata,
                                ..seen
                            }))
                        }
                        _ => Err(e.into()),
                    };
                }
            }
        }
        // Changed since it was read (or read without an ETag): read it again.
        let (props, _) = head(blobs, &seen.blob, now).await?;
        let Some(props) = props else {
            return Ok(Commit::Settled(RunStatus::Other("deleted".into())));
        };
        seen.etag = props.etag;
        seen.metadata = props.metadata;
    }
    Err(JobError::Contended(format!(
        "the reservation {} kept changing: gave up after {LOG_ATTEMPTS} tries",
        reservation.blob.as_str()
    )))
}

/// Undoes this tick's outcome before the job was called, where the log did not take the run
/// (it refused the occurrence): a reservation this tick created is deleted, an older one gets
/// its metadata back, so a later tick decides afresh. Best effort.
pub(crate) async fn uncommit<T: Transport>(
    blobs: &BlobClient<T>,
    original: &Reservation,
    written: &Reservation,
    now: SystemTime,
) {
    if original.created {
        take_back(blobs, written, now).await;
        return;
    }
    restore(blobs, original, written, now).await;
}

/// Undoes this tick's outcome before the job was called where the log may say the run started
/// (its write failed, its effect unknown): the reservation's metadata as before the outcome, at
/// the ETag the outcome left, also for one this tick created. Never deleted: the reservation
/// is the evidence that the occurrence was reserved and not run, and the takeover rule settles
/// it (a retry of this instance's resumes it; after its deadline, a tick naming it runs it and a
/// later winner records it `missed`, the log's `running` entry with it). Best effort.
pub(crate) async fn restore<T: Transport>(
    blobs: &BlobClient<T>,
    original: &Reservation,
    written: &Reservation,
    now: SystemTime,
) {
    let Some(etag) = written.etag.clone() else {
        return;
    };
    let write = SetMetadata {
        container: blobs.container().clone(),
        blob: original.blob.clone(),
        metadata: original.metadata.clone(),
        lease_id: None,
        condition: Condition::IfMatch(etag),
    };
    let _ = blobs.execute(&write, now).await;
}

/// Reservations listed per page of a clean-up.
const CLEAN_UP_PAGE: u32 = 16;

/// Pages one clean-up lists at most: 128 reservations, eight batches of 16 occurrences (see
/// [`Settings::clean_up_stride`]), so that what runs now and backfills added, or a batch a
/// failed listing left, is caught up within one tick.
pub(crate) const CLEAN_UP_PAGES: usize = 8;

/// Deletes reservations before the log's clean-up watermark (oldest first, a page at a time,
/// the next page while everything listed so far was below it): the watermark was raised first,
/// so a tick for such an occurrence is refused, whatever retention its deployment has, and
/// none can run twice.
pub(crate) async fn clean_up<T: Transport>(
    blobs: &BlobClient<T>,
    settings: &Settings,
    cutoff: u64,
    now: SystemTime,
) -> Result<usize, leasegate::Error> {
    let mut deleted = 0;
    let mut marker = None;
    for _ in 0..CLEAN_UP_PAGES {
        let list = ListBlobs {
            prefix: Some(settings.occurrences_prefix()),
            max_results: Some(CLEAN_UP_PAGE),
            marker: marker.take(),
            ..ListBlobs::new(blobs.container().clone())
        };
        let (page, _) = blobs.execute(&list, now).await?;
        let below = delete_below(blobs, page.blobs, cutoff, now, &mut deleted).await;
        // (Storage may answer a page shorter than asked, with a marker: go on while it has one.)
        marker = page.next_marker.filter(|_| below);
        if marker.is_none() {
            break;
        }
    }
    Ok(deleted)
}

/// Deletes the listed reservations before `cutoff` (counted in `deleted`). Returns whether
/// all of them were before `cutoff` (the next page may hold more).
async fn delete_below<T: Transport>(
    blobs: &BlobClient<T>,
    items: Vec<leasegate::ops::BlobItem>,
    cutoff: u64,
    now: SystemTime,
    deleted: &mut usize,
) -> bool {
    for item in items {
        let occurrence: u64 = item
            .name
            .rsplit('/')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX);
        if occurrence >= cutoff {
            return false;
        }
        let Ok(blob) = BlobName::try_new(&item.name) else {
            continue;
        };
        let delete = DeleteBlob {
            container: blobs.container().clone(),
            blob,
            lease_id: None,
            condition: item
                .properties
                .etag
                .map(Condition::IfMatch)
                .unwrap_or_default(),
        };
        if blobs.execute(&delete, now).await.is_ok() {
            *deleted += 1;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_rise_with_the_occurrence() {
        let a = occurrence_token(1_795_574_280).unwrap();
        let b = occurrence_token(1_795_574_281).unwrap();
        assert!(a < b);
        assert!(occurrence_token(u64::MAX / 2).is_err());
    }
}
