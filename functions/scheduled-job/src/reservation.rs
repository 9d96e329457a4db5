//! An occurrence's reservation, `jobs/{job}/occurrences/{unix:012}`: the record of whether it
//! ran. Its outcome is written by compare-and-swap on its ETag; its reserver's chance ends at
//! its deadline; reservations older than the retention are deleted.

use leasegate::ops::{
    Condition, DeleteBlob, GetProperties, ListBlobs, Metadata, SetMetadata, WriteOutcome,
};
use leasegate::BlobClient;
use leasegate::{BlobName, Transport};
use serde::{Deserialize, Serialize};
use std::time::SystemTime;

use crate::error::JobError;
use crate::log::LOG_ATTEMPTS;
use crate::settings::Settings;

/// Reservation metadata: the instance that reserved the occurrence, and the tick's source.
pub(crate) const META_RESERVED_BY: &str = "leasegate_reserved_by";

pub(crate) const META_TRIGGER: &str = "leasegate_trigger";

/// Reservation metadata: the occurrence's outcome (`running`, `succeeded`, `failed`,
/// `skipped_overlap`), written by compare-and-swap before the job is called: the one record
/// that says whether the occurrence ran, kept as long as the reservation.
pub(crate) const META_RUN: &str = "leasegate_run";

/// Reservation metadata: a nonce of the tick that wrote the outcome (to recognise one's own
/// write after a lost answer), and the run's fencing token.
pub(crate) const META_RUN_TICK: &str = "leasegate_run_tick";

pub(crate) const META_RUN_TOKEN: &str = "leasegate_run_token";

/// The body of a reservation blob (what is in it is for people; the metadata is what ticks
/// read). A stored record: no field renamed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReservationBody {
    pub(crate) job: String,
    pub(crate) occurrence: String,
    pub(crate) instance: String,
}

/// A reservation as this tick knows it: its ETag and metadata (what a compare-and-swap
/// writes over), and whether this tick created it.
#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    pub(crate) blob: BlobName,
    pub(crate) etag: Option<leasegate::ETag>,
    pub(crate) metadata: Metadata,
    pub(crate) created: bool,
}

/// The fencing token of an occurrence's run: the occurrence in Unix seconds times 2^16 (the
/// scale of the lease tokens, which are server seconds times 2^16), so tokens rise with the
/// occurrence whatever the overlap policy and whenever each run starts. One run per occurrence
/// (its reservation's outcome), so one token per run.
pub fn occurrence_token(occurrence: u64) -> Result<u64, leasegate::Error> {
    occurrence
        .checked_mul(1 << 16)
        .filter(|t| *t <= leasegate::lease::MAX_TOKEN)
        .ok_or_else(|| {
            leasegate::Error::InvalidArgument(format!(
                "occurrence {occurrence} is too far ahead for a fencing token"
            ))
        })
}

/// Whether a reservation has been left without an outcome past its deadline: its reserver's
/// chance has passed, and any instance may settle it. The deadline is the reservation's time
/// (its `Last-Modified`, by the storage server's clock) plus the job's lease term, which
/// bounds the reserver's steps up to its outcome (the lease, then the outcome's write); the
/// reserver's own lease on the job, if it took one, has run out by then too. Taking over
/// early would still run the occurrence at most once (the outcome's compare-and-swap decides).
pub(crate) fn abandoned(
    props: &leasegate::ops::BlobProperties,
    server_now: SystemTime,
    settings: &Settings,
) -> bool {
    !props.metadata.contains_key(META_RUN)
        && props
            .last_modified
            .is_some_and(|t| t + settings.reservation_deadline() <= server_now)
}

/// The occurrence a job's lease label names (`{instance} {occurrence}`).
pub(crate) fn label_occurrence(label: &str) -> Option<u64> {
    label.rsplit(' ').next()?.parse().ok()
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

/// What became of an occurrence: the outcome on its reservation (`leasegate_run`) and the status
/// of its log entry, written as `running`, `succeeded`, `failed`, `skipped_overlap` or `missed`.
/// A value this version does not know (a newer version's) is kept as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStatus {
    /// The job was called (or is being called) by the tick that wrote it.
    Running,
    /// The job answered 2xx.
    Succeeded,
    /// The job answered otherwise, or did not answer.
    Failed,
    /// A run of an earlier occurrence held the job's lease when this one was due.
    SkippedOverlap,
    /// Its reserver wrote no outcome by its deadline: settled by another instance, not run.
    Missed,
    /// Another value (a newer version's), kept as written.
    Other(String),
}

impl RunStatus {
    /// The value as stored.
    pub fn as_str(&self) -> &str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::SkippedOverlap => "skipped_overlap",
            RunStatus::Missed => "missed",
            RunStatus::Other(other) => other,
        }
    }

    /// The status a stored value stands for.
    pub fn parse(value: &str) -> RunStatus {
        match value {
            "running" => RunStatus::Running,
            "succeeded" => RunStatus::Succeeded,
            "failed" => RunStatus::Failed,
            "skipped_overlap" => RunStatus::SkippedOverlap,
            "missed" => RunStatus::Missed,
            other => RunStatus::Other(other.to_string()),
        }
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RunStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RunStatus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| RunStatus::parse(&s))
    }
}

/// The outcome a reservation's metadata records, if any.
pub(crate) fn outcome_of(metadata: &Metadata) -> Option<RunStatus> {
    metadata.get(META_RUN).map(|v| RunStatus::parse(v))
}

/// What writing an outcome on a reservation came to.
pub(crate) enum Commit {
    /// This tick wrote it: the reservation as written.
    Written(Reservation),
    /// A tick before it wrote one (this outcome).
    Settled(RunStatus),
}

/// Writes `outcome` on the reservation by compare-and-swap, unless it has one already: of all
/// the ticks of one occurrence, one writes an outcome, and only that one runs the job (or
/// records the skip). A write whose answer is lost is read back (its `nonce`).
pub(crate) async fn commit<T: Transport>(
    blobs: &BlobClient<T>,
    reservation: &Reservation,
    outcome: &RunStatus,
    nonce: &str,
    token: Option<u64>,
    now: SystemTime,
) -> Result<Commit, JobError> {
    let mut seen = reservation.clone();
    for _ in 0..LOG_ATTEMPTS {
        if let Some(run) = outcome_of(&seen.metadata) {
            return Ok(Commit::Settled(run));
        }
        if let Some(etag) = seen.etag.clone() {
            let mut metadata = seen.metadata.clone();
            metadata.insert(META_RUN.into(), outcome.to_string());
            metadata.insert(META_RUN_TICK.into(), nonce.into());
            if let Some(token) = token {
                metadata.insert(META_RUN_TOKEN.into(), token.to_string());
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

/// Undoes this tick's outcome before the job was called (the log refused the occurrence, or
/// storage failed): a reservation this tick created is deleted, an older one gets its metadata
/// back, so a later tick decides afresh. Best effort.
pub(crate) async fn uncommit<T: Transport>(
    blobs: &BlobClient<T>,
    original: &Reservation,
    written: &Reservation,
    now: SystemTime,
) {
    let Some(etag) = written.etag.clone() else {
        return;
    };
    if original.created {
        take_back(blobs, written, now).await;
        return;
    }
    let write = SetMetadata {
        container: blobs.container().clone(),
        blob: original.blob.clone(),
        metadata: original.metadata.clone(),
        lease_id: None,
        condition: Condition::IfMatch(etag),
    };
    let _ = blobs.execute(&write, now).await;
}

/// Deletes reservations before the log's clean-up watermark (oldest first, a page at a time):
/// the watermark was raised first, so a tick for such an occurrence is refused, whatever
/// retention its deployment has, and none can run twice.
pub(crate) async fn clean_up<T: Transport>(
    blobs: &BlobClient<T>,
    settings: &Settings,
    cutoff: u64,
    now: SystemTime,
) -> Result<usize, leasegate::Error> {
    let list = ListBlobs {
        prefix: Some(settings.occurrences_prefix()),
        max_results: Some(16),
        ..ListBlobs::new(blobs.container().clone())
    };
    let (page, _) = blobs.execute(&list, now).await?;
    let mut deleted = 0;
    for item in page.blobs {
        let occurrence: u64 = item
            .name
            .rsplit('/')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX);
        if occurrence >= cutoff {
            break;
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
            deleted += 1;
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_statuses_keep_their_stored_words_and_newer_ones() {
        for (word, status) in [
            ("running", RunStatus::Running),
            ("succeeded", RunStatus::Succeeded),
            ("failed", RunStatus::Failed),
            ("skipped_overlap", RunStatus::SkippedOverlap),
            ("missed", RunStatus::Missed),
            ("paused_by_v9", RunStatus::Other("paused_by_v9".into())),
        ] {
            assert_eq!(RunStatus::parse(word), status);
            assert_eq!(status.as_str(), word);
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{word}\""));
            assert_eq!(serde_json::from_str::<RunStatus>(&json).unwrap(), status);
        }
    }

    #[test]
    fn tokens_rise_with_the_occurrence() {
        let a = occurrence_token(1_795_574_280).unwrap();
        let b = occurrence_token(1_795_574_281).unwrap();
        assert!(a < b);
        assert!(occurrence_token(u64::MAX / 2).is_err());
    }
}
