//! "Run this at most once per occurrence of a schedule" ([`once_per_occurrence`]): send the
//! digest at 08:00 Berlin time on weekdays, once, however many deployments are ticked for it.
//!
//! A tick at `now` names one occurrence ([`due`]): the schedule's latest at or before `now`
//! plus a tolerance ([`tolerance`]: 10 s, or half the gap between the occurrences around `now`
//! when that is shorter), so a trigger that fires a little early names the coming occurrence,
//! not the one before. Every caller that names it tries to create its reservation blob
//! `{prefix}{unix:012}` (If-None-Match: `*`, the reservation rules scheduled-job follows): the
//! one whose write creates it runs the work, handed the [`Occurrence`] (its fencing token and
//! an idempotency key), and records the result on the blob (`leasegate_run` = `succeeded` or
//! `failed`, best effort); every other caller is told who reserved it ([`PerOccurrence::AlreadyRun`])
//! and runs nothing.
//!
//! **At most once**: a work that fails is not run again for that occurrence, by this verb or
//! any other call of it; neither is one whose caller died before its work ran, nor one whose
//! reservation was written but whose answer was lost (the call returned `Err`). For retries
//! of a failed or vanished run, catch-up of occurrences no deployment ticked, pause and
//! backfill, use leasegate's `scheduled-job` function, which keeps these reservations the same
//! way and adds those rules.
//!
//! Reservations are kept (a blob of about 100 bytes per occurrence). A tick names the latest
//! occurrence at or before it however late it comes, so a reservation may be deleted only once
//! the next occurrence is due: a storage lifecycle rule on the prefix deleting blobs older than
//! the schedule's longest gap plus a day (a weekday schedule: 4 days), never sooner.
//!
//! The log line cannot be turned off (the verb takes no [`crate::Context`]).
//!
//! Every call writes one JSON log line ([`crate::Decision`]: the reservation, the decision,
//! the fencing token, the storage requests, the time taken).
//!
//! Round trips: 1 for the call that runs (the reservation) plus its work plus 1 (the result);
//! 2 for the others (the refused reservation and a HEAD); 2 more on the container's first use.
//!
//! # Example
//! ```
//! use leasegate::{BlobClient, Response, Transport};
//! use leasegate_spin::occurrence::{self, once_per_occurrence};
//! use leasegate_spin::{once, schedule::Schedule, Context};
//!
//! /// Sends the digest once per occurrence of `schedule`, whichever deployment is ticked.
//! async fn tick<T, S: Transport>(
//!     ctx: &Context<'_, T>,
//!     blobs: &BlobClient<S>,
//!     schedule: &Schedule,
//!     instance: &str,
//!     webhook: &str,
//! ) -> Response {
//!     let sent = once_per_occurrence(blobs, "digest/", schedule, instance, ctx.now, async |due| {
//!         let body = serde_json::json!({ "occurrence": due.local_time, "fencingToken": due.fencing_token });
//!         // The same key for every send of this occurrence: the receiver dedupes on it.
//!         once::post_json(blobs.transport(), webhook, &due.idempotency_key, &body).await
//!     });
//!     // 200 {"outcome":"ran"|"already_run"|"no_occurrence",...}, 502 failed, 503 storage.
//!     occurrence::answer(sent.await)
//! }
//! ```

use std::time::{Duration, Instant, SystemTime};

use leasegate::ops::{Condition, GetProperties, Metadata, PutBlob, SetMetadata, WriteOutcome};
use leasegate::{BlobClient, BlobName, Counting, Error, Response, StatusCode, Transport};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::record::{self, ReservationBody};
use crate::schedule::Schedule;
use crate::storage::execute_creating_container;
use crate::{log_verb, web};

/// The reservation's metadata and outcomes, as [`record`] names them for every writer.
pub use crate::record::{FAILED, META_RESERVED_BY, META_RUN, SUCCEEDED};

/// The most a tick may come early and still name the coming occurrence (shorter for a
/// schedule whose occurrences are closer: [`tolerance`]).
pub const EARLY_BY: Duration = Duration::from_secs(10);

/// One occurrence of a schedule, as the work is handed it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Occurrence {
    /// Its Unix second: its identity (the reservation's name).
    pub unix: u64,
    /// The instant.
    pub at: SystemTime,
    /// The instant as the schedule's zone writes it (`2026-11-30T08:00:00+01:00`).
    pub local_time: String,
    /// `unix << 16` ([`record::occurrence_token`]): rises with the occurrence, so a receiver
    /// can refuse a stale one. The scheduled-job function hands the first attempt of an
    /// occurrence the same token.
    pub fencing_token: u64,
    /// 32 hex digits from the prefix and the occurrence: the same for every call that names
    /// this occurrence, another for every other occurrence or prefix.
    pub idempotency_key: String,
}

impl Occurrence {
    /// The occurrence at `unix` of `schedule`, reserved under `prefix`.
    fn new(schedule: &Schedule, prefix: &str, unix: u64) -> Occurrence {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(unix);
        Occurrence {
            unix,
            at,
            local_time: schedule.local_time(at),
            fencing_token: unix << 16,
            idempotency_key: idempotency_key(prefix, unix),
        }
    }
}

/// What became of one call of [`once_per_occurrence`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PerOccurrence<R, E> {
    /// This call reserved the occurrence and the work ran (it returned `Ok(output)`).
    Ran {
        /// The occurrence.
        occurrence: Occurrence,
        /// What the work returned.
        output: R,
    },
    /// This call reserved the occurrence and the work returned `Err(error)`. It is not run
    /// again for this occurrence.
    Failed {
        /// The occurrence.
        occurrence: Occurrence,
        /// What the work returned.
        error: E,
    },
    /// The occurrence was reserved before (by this deployment or another): nothing ran.
    AlreadyRun {
        /// The occurrence.
        occurrence: Occurrence,
        /// Who reserved it (its `instance`), where the reservation says.
        reserved_by: Option<String>,
        /// How its work ended, as recorded: [`SUCCEEDED`] or [`FAILED`]; `None` while it runs,
        /// or when its result could not be recorded.
        outcome: Option<String>,
    },
    /// The schedule has no occurrence at or before this tick: nothing ran.
    NoOccurrence,
}

/// How early a tick at `now` may come and still name the coming occurrence of `schedule`:
/// [`EARLY_BY`], or half the shortest gap between the occurrences around `now` when that is
/// shorter (so that a tick never names an occurrence more than one away).
pub fn tolerance(schedule: &Schedule, now: SystemTime) -> Duration {
    EARLY_BY.min(schedule.shortest_gap_near(now) / 2)
}

/// The occurrence a tick at `now` names: the latest at or before `now` plus [`tolerance`]
/// (`None`: the schedule has none yet).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use leasegate_spin::occurrence::due;
/// use leasegate_spin::schedule::Schedule;
///
/// let digest = Schedule::parse("0 8 * * MON-FRI", "Europe/Berlin").unwrap();
/// // Friday 2026-11-27 08:00 in Berlin is 07:00 UTC.
/// let friday = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_762_800);
/// // A tick 3 s early names Friday's occurrence; one 5 minutes late still does.
/// let early = due(&digest, "digest/", friday - Duration::from_secs(3)).unwrap();
/// let late = due(&digest, "digest/", friday + Duration::from_secs(300)).unwrap();
/// assert_eq!((early.at, early.local_time.as_str()), (friday, "2026-11-27T08:00:00+01:00"));
/// assert_eq!(early, late);
/// assert_eq!(early.fencing_token, 1_795_762_800 << 16);
/// // A minute early, it names Thursday's (already past).
/// let thursday = due(&digest, "digest/", friday - Duration::from_secs(60)).unwrap();
/// assert_eq!(thursday.local_time, "2026-11-26T08:00:00+01:00");
/// assert_ne!(thursday.idempotency_key, early.idempotency_key);
/// ```
pub fn due(schedule: &Schedule, prefix: &str, now: SystemTime) -> Option<Occurrence> {
    let at = schedule.latest_at_or_before(now + tolerance(schedule, now))?;
    let unix = at.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
    Some(Occurrence::new(schedule, prefix, unix))
}

/// The idempotency key of the occurrence at `unix` reserved under `prefix`.
fn idempotency_key(prefix: &str, unix: u64) -> String {
    let digest = Sha256::new()
        .chain_update(b"leasegate occurrence v1\0")
        .chain_update(prefix.as_bytes())
        .chain_update(b"\0")
        .chain_update(unix.to_string().as_bytes())
        .finalize();
    web::hex(&digest[..16])
}

/// Runs `work` at most once per occurrence of `schedule` among every caller of `blobs`'
/// container with this `prefix` (every deployment that shares them), handing it the
/// [`Occurrence`] that a tick at `now` names ([`due`]). See the [module](self) for the rules:
/// a failed work is not run again.
///
/// `instance` names this caller to the others (1 to 256 visible ASCII characters: an
/// instance id); the reservation is the blob `{prefix}{unix:012}` (`prefix` such as
/// `digest/`).
///
/// `Err` is a storage failure before the work ran (it did not run), or a `prefix` or
/// `instance` that cannot be used.
pub async fn once_per_occurrence<T, R, E>(
    blobs: &BlobClient<T>,
    prefix: &str,
    schedule: &Schedule,
    instance: &str,
    now: SystemTime,
    work: impl AsyncFnOnce(Occurrence) -> Result<R, E>,
) -> Result<PerOccurrence<R, E>, Error>
where
    T: Transport,
{
    let started = Instant::now();
    let counted = BlobClient::new(
        Counting::new(blobs.transport()),
        blobs.account().clone(),
        blobs.container().clone(),
    );
    let outcome = run_once_per_occurrence(&counted, prefix, schedule, instance, now, work).await;
    let reservation = |o: &Occurrence| record::reservation(prefix, o.unix);
    let (decision, key, fencing_token) = match &outcome {
        Ok(PerOccurrence::Ran { occurrence, .. }) => (
            "ran",
            reservation(occurrence),
            Some(occurrence.fencing_token),
        ),
        Ok(PerOccurrence::Failed { occurrence, .. }) => (
            "failed",
            reservation(occurrence),
            Some(occurrence.fencing_token),
        ),
        Ok(PerOccurrence::AlreadyRun { occurrence, .. }) => {
            ("already_run", reservation(occurrence), None)
        }
        Ok(PerOccurrence::NoOccurrence) => ("no_occurrence", prefix.to_string(), None),
        Err(Error::InvalidArgument(_) | Error::InvalidName { .. }) => {
            ("invalid_argument", prefix.to_string(), None)
        }
        Err(e) => (web::storage_error_code(e), prefix.to_string(), None),
    };
    log_verb(
        true,
        "once_per_occurrence",
        &key,
        Some(instance),
        (decision, fencing_token),
        counted.transport().sent(),
        started,
    );
    outcome
}

async fn run_once_per_occurrence<T, R, E>(
    blobs: &BlobClient<T>,
    prefix: &str,
    schedule: &Schedule,
    instance: &str,
    now: SystemTime,
    work: impl AsyncFnOnce(Occurrence) -> Result<R, E>,
) -> Result<PerOccurrence<R, E>, Error>
where
    T: Transport,
{
    if instance.is_empty()
        || instance.len() > 256
        || !instance.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(Error::InvalidArgument(
            "the instance must be 1 to 256 visible ASCII characters".into(),
        ));
    }
    let Some(occurrence) = due(schedule, prefix, now) else {
        return Ok(PerOccurrence::NoOccurrence);
    };
    let blob = BlobName::try_new(&record::reservation(prefix, occurrence.unix))?;
    let mut metadata = Metadata::new();
    metadata.insert(META_RESERVED_BY.into(), instance.into());
    let body = ReservationBody {
        job: None,
        occurrence: web::rfc3339(occurrence.at),
        instance: instance.to_string(),
    };
    let put = PutBlob::block(blobs.container().clone(), blob.clone(), web::to_json(&body))
        .with_content_type("application/json")
        .with_condition(Condition::IfNotExists)
        .with_metadata(metadata.clone());
    let container = blobs.container().clone();
    let written = match execute_creating_container(blobs, &container, &put, now)
        .await?
        .0
    {
        WriteOutcome::Written(written) => written,
        WriteOutcome::Refused(_) => {
            let head = GetProperties {
                container,
                blob: blob.clone(),
            };
            // Gone since (deleted by hand): reserved all the same, by whom is not known.
            let marks = blobs
                .execute(&head, now)
                .await?
                .0
                .unwrap_or_default()
                .metadata;
            return Ok(PerOccurrence::AlreadyRun {
                occurrence,
                reserved_by: marks.get(META_RESERVED_BY).cloned(),
                outcome: marks.get(META_RUN).cloned(),
            });
        }
    };
    let result = work(occurrence.clone()).await;
    // Best effort: a result not recorded leaves the reservation saying nothing of it.
    if let Some(etag) = written.etag {
        metadata.insert(
            META_RUN.into(),
            if result.is_ok() { SUCCEEDED } else { FAILED }.into(),
        );
        let record = SetMetadata {
            container: blobs.container().clone(),
            blob,
            metadata,
            lease_id: None,
            condition: Condition::IfMatch(etag),
        };
        let _ = blobs.execute(&record, now).await;
    }
    Ok(match result {
        Ok(output) => PerOccurrence::Ran { occurrence, output },
        Err(error) => PerOccurrence::Failed { occurrence, error },
    })
}

/// The JSON body of an answer of [`answer`].
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<R> {
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    occurrence: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    local_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fencing_token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    idempotency_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<R>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reserved_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run: Option<String>,
}

impl<R> Body<R> {
    fn of(outcome: &'static str, occurrence: Option<&Occurrence>) -> Self {
        Body {
            outcome,
            occurrence: occurrence.map(|o| web::rfc3339(o.at)),
            local_time: occurrence.map(|o| o.local_time.clone()),
            fencing_token: None,
            idempotency_key: None,
            output: None,
            reserved_by: None,
            run: None,
        }
    }
}

/// The HTTP answer for an outcome of [`once_per_occurrence`], alike [`crate::once::answer`]'s:
///
/// | outcome | status | body |
/// |---|---|---|
/// | [`PerOccurrence::Ran`] | 200 | `{"outcome":"ran","occurrence","localTime","fencingToken","idempotencyKey","output"}` |
/// | [`PerOccurrence::AlreadyRun`] | 200 | `{"outcome":"already_run","occurrence","localTime","reservedBy","run"}` (`run`: `succeeded`, `failed`, absent while it runs) |
/// | [`PerOccurrence::NoOccurrence`] | 200 | `{"outcome":"no_occurrence"}` |
/// | [`PerOccurrence::Failed`] | 502 | `{"error":"work_failed","occurrence","message","fencingToken"}` |
/// | a storage failure | 503 with `Retry-After` (502 for a refused credential) | see [`web::storage_unavailable`] |
/// | a prefix or instance that cannot be used | 500 | `{"error":"invalid_argument","message"}` |
///
/// The work's error (`E`) is shown to the caller: it must hold no secret.
pub fn answer<R: Serialize, E: std::fmt::Display>(
    outcome: Result<PerOccurrence<R, E>, Error>,
) -> Response {
    match outcome {
        Ok(PerOccurrence::Ran { occurrence, output }) => web::json(
            StatusCode::OK,
            &Body {
                fencing_token: Some(occurrence.fencing_token),
                idempotency_key: Some(occurrence.idempotency_key.clone()),
                output: Some(output),
                ..Body::of("ran", Some(&occurrence))
            },
        ),
        Ok(PerOccurrence::AlreadyRun {
            occurrence,
            reserved_by,
            outcome,
        }) => web::json(
            StatusCode::OK,
            &Body::<R> {
                reserved_by,
                run: outcome,
                ..Body::of("already_run", Some(&occurrence))
            },
        ),
        Ok(PerOccurrence::NoOccurrence) => {
            web::json(StatusCode::OK, &Body::<R>::of("no_occurrence", None))
        }
        Ok(PerOccurrence::Failed { occurrence, error }) => web::json(
            StatusCode::BAD_GATEWAY,
            &serde_json::json!({
                "error": "work_failed",
                "occurrence": web::rfc3339(occurrence.at),
                "message": format!("{error} (not run again for this occurrence)"),
                "fencingToken": occurrence.fencing_token,
            }),
        ),
        Err(e @ (Error::InvalidArgument(_) | Error::InvalidName { .. })) => {
            web::error(StatusCode::INTERNAL_SERVER_ERROR, "invalid_argument", e)
        }
        Err(e) => web::storage_unavailable(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    use leasegate::{Account, ContainerName, Method};

    use crate::once::tests::{reply, written, Scripted, SERVER_SECS};

    /// Every 5 minutes in UTC: `SERVER_SECS` (14:00) is an occurrence.
    fn five_minutes() -> Schedule {
        Schedule::parse("*/5 * * * *", "UTC").unwrap()
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// Runs the verb at `now` against `script`, with work that returns `result` and counts
    /// its runs.
    fn run(
        script: Vec<Response>,
        now: SystemTime,
        result: Result<&'static str, &'static str>,
    ) -> (
        Result<PerOccurrence<&'static str, &'static str>, Error>,
        Option<Occurrence>,
        Scripted,
    ) {
        let transport = Scripted::new(script);
        let blobs = BlobClient::new(
            &transport,
            Account::from_connection_string("UseDevelopmentStorage=true").unwrap(),
            ContainerName::try_new("leasegate").unwrap(),
        );
        let handed = std::cell::RefCell::new(None);
        let outcome = pollster::block_on(once_per_occurrence(
            &blobs,
            "digest/",
            &five_minutes(),
            "node-a",
            now,
            async |occurrence| {
                *handed.borrow_mut() = Some(occurrence);
                result
            },
        ));
        (outcome, handed.into_inner(), transport)
    }

    fn exists() -> Response {
        reply(409).with_header("x-ms-error-code", "BlobAlreadyExists")
    }

    fn head(marks: &[(&str, &str)]) -> Response {
        let mut r = reply(200)
            .with_header("etag", "\"e1\"")
            .with_header("x-ms-blob-type", "BlockBlob")
            .with_header("content-length", "40");
        for (k, v) in marks {
            r = r.with_header(&format!("x-ms-meta-{k}"), *v);
        }
        r
    }

    #[test]
    fn the_caller_that_reserves_runs_the_work_and_records_it() {
        let created = reply(201).with_header("etag", "\"e1\"");
        let (outcome, handed, t) = run(vec![created, written()], at(SERVER_SECS + 42), Ok("sent"));
        let Ok(PerOccurrence::Ran { occurrence, output }) = outcome else {
            panic!("{outcome:?}")
        };
        assert_eq!(output, "sent");
        assert_eq!(handed.as_ref(), Some(&occurrence));
        assert_eq!(occurrence.unix, SERVER_SECS);
        assert_eq!(occurrence.fencing_token, SERVER_SECS << 16);
        assert_eq!(occurrence.local_time, "2026-11-19T14:00:00Z");
        assert_eq!(occurrence.idempotency_key.len(), 32);
        let sent = t.sent.borrow();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(sent[0].0, Method::PUT);
        assert!(
            sent[0]
                .1
                .ends_with(&format!("/leasegate/digest/{SERVER_SECS:012}")),
            "{sent:?}"
        );
        assert!(sent[1].1.contains("comp=metadata"), "{sent:?}");
        let meta = t.metadata.borrow();
        let has = |i: usize, k: &str, v: &str| meta[i].iter().any(|(n, x)| n == k && x == v);
        assert!(has(0, "x-ms-meta-leasegate_reserved_by", "node-a"));
        assert!(has(1, "x-ms-meta-leasegate_reserved_by", "node-a"));
        assert!(has(1, "x-ms-meta-leasegate_run", "succeeded"));
    }

    #[test]
    fn failed_work_is_recorded_and_not_retried() {
        let created = reply(201).with_header("etag", "\"e1\"");
        let (outcome, _, t) = run(vec![created, written()], at(SERVER_SECS), Err("503"));
        let Ok(PerOccurrence::Failed { occurrence, error }) = outcome else {
            panic!("{outcome:?}")
        };
        assert_eq!((occurrence.unix, error), (SERVER_SECS, "503"));
        let meta = t.metadata.borrow();
        assert!(meta[1]
            .iter()
            .any(|(n, v)| n == "x-ms-meta-leasegate_run" && v == "failed"));
        // The next tick of the occurrence finds it reserved, its failure recorded.
        let marks = [
            ("leasegate_reserved_by", "node-a"),
            ("leasegate_run", "failed"),
        ];
        let (outcome, handed, _) = run(vec![exists(), head(&marks)], at(SERVER_SECS + 60), Ok("x"));
        assert_eq!(handed, None);
        let Ok(PerOccurrence::AlreadyRun {
            reserved_by,
            outcome,
            ..
        }) = outcome
        else {
            panic!("{outcome:?}")
        };
        assert_eq!(reserved_by.as_deref(), Some("node-a"));
        assert_eq!(outcome.as_deref(), Some("failed"));
    }

    #[test]
    fn a_reserved_occurrence_runs_nothing() {
        let marks = [("leasegate_reserved_by", "node-b")];
        let (outcome, handed, t) = run(vec![exists(), head(&marks)], at(SERVER_SECS), Ok("x"));
        assert_eq!(handed, None);
        let Ok(PerOccurrence::AlreadyRun {
            occurrence,
            reserved_by,
            outcome,
        }) = outcome
        else {
            panic!("{outcome:?}")
        };
        assert_eq!(occurrence.unix, SERVER_SECS);
        assert_eq!((reserved_by.as_deref(), outcome), (Some("node-b"), None));
        assert_eq!(t.sent.borrow()[1].0, Method::HEAD);
        // 412 (some peers' answer to If-None-Match: *) is the same refusal.
        let refused = reply(412).with_header("x-ms-error-code", "ConditionNotMet");
        let (outcome, handed, _) = run(vec![refused, head(&marks)], at(SERVER_SECS), Ok("x"));
        assert!(matches!(outcome, Ok(PerOccurrence::AlreadyRun { .. })));
        assert_eq!(handed, None);
    }

    #[test]
    fn a_tick_a_little_early_names_the_coming_occurrence() {
        let schedule = five_minutes();
        let name = |secs| due(&schedule, "digest/", at(secs)).unwrap().unix;
        assert_eq!(name(SERVER_SECS - 10), SERVER_SECS);
        assert_eq!(name(SERVER_SECS - 11), SERVER_SECS - 300);
        assert_eq!(name(SERVER_SECS + 289), SERVER_SECS);
        assert_eq!(name(SERVER_SECS + 290), SERVER_SECS + 300);
        // Every 5 seconds: half the gap, 2.5 s.
        let fast = Schedule::parse("*/5 * * * * *", "UTC").unwrap();
        assert_eq!(
            tolerance(&fast, at(SERVER_SECS)),
            Duration::from_millis(2500)
        );
        let due_fast = |secs| due(&fast, "p/", at(secs)).unwrap().unix;
        assert_eq!(due_fast(SERVER_SECS - 2), SERVER_SECS);
        assert_eq!(due_fast(SERVER_SECS - 3), SERVER_SECS - 5);
        // Keys differ by prefix and occurrence, and stay the same for one occurrence.
        let key = |prefix, secs| due(&schedule, prefix, at(secs)).unwrap().idempotency_key;
        assert_eq!(key("a/", SERVER_SECS), key("a/", SERVER_SECS + 1));
        assert_ne!(key("a/", SERVER_SECS), key("b/", SERVER_SECS));
        assert_ne!(key("a/", SERVER_SECS), key("a/", SERVER_SECS + 300));
    }

    /// review-33: docs/recipes.md says the digest's leader "outside 08:00" answers
    /// `no_occurrence` and that "a tick of the occurrence that comes more than a few seconds
    /// late names no occurrence". `due` names the latest past occurrence at any lateness: a
    /// leader ticking at 14:00, or on Sunday, names Friday 08:00 (and, with no reservation
    /// there, once_per_occurrence runs it: its reservation is `{prefix}{unix}`). The module doc's "lifecycle rule after a day" therefore lets a
    /// MON-FRI digest whose Friday reservation was deleted on Saturday run Friday again on
    /// Sunday.
    #[test]
    fn review_a_late_tick_names_the_past_occurrence_not_no_occurrence() {
        let digest = Schedule::parse("0 8 * * MON-FRI", "Europe/Berlin").unwrap();
        // Friday 2026-11-27 08:00 in Berlin.
        let friday = 1_795_762_800;
        let named = |secs: u64| due(&digest, "digest/", at(secs)).map(|o| o.unix);
        // Six hours late: still Friday's, not None (the recipe's no_occurrence).
        assert_eq!(named(friday + 6 * 3600), Some(friday));
        // Sunday noon: still Friday's (two days after).
        assert_eq!(named(friday + 2 * 86_400 + 4 * 3600), Some(friday));
    }

    #[test]
    fn no_occurrence_yet_runs_nothing_and_asks_nothing() {
        let transport = Scripted::new(vec![]);
        let blobs = BlobClient::new(
            &transport,
            Account::from_connection_string("UseDevelopmentStorage=true").unwrap(),
            ContainerName::try_new("leasegate").unwrap(),
        );
        // Daily, 2,000 s past midnight UTC: none yet 100 s after the epoch.
        let later =
            Schedule::interval(Duration::from_secs(86_400), Duration::from_secs(2_000)).unwrap();
        let ran = Cell::new(false);
        let outcome = pollster::block_on(once_per_occurrence(
            &blobs,
            "p/",
            &later,
            "node-a",
            at(100),
            async |_| {
                ran.set(true);
                Ok::<(), ()>(())
            },
        ));
        assert_eq!(outcome.unwrap(), PerOccurrence::NoOccurrence);
        assert!(!ran.get());
        assert!(transport.sent.borrow().is_empty());
        // An instance that cannot be told to others is refused before storage is asked.
        let outcome = pollster::block_on(once_per_occurrence(
            &blobs,
            "p/",
            &five_minutes(),
            "node a",
            at(SERVER_SECS),
            async |_| Ok::<(), ()>(()),
        ));
        assert!(
            matches!(outcome, Err(Error::InvalidArgument(_))),
            "{outcome:?}"
        );
        assert!(transport.sent.borrow().is_empty());
    }

    #[test]
    fn a_storage_failure_is_an_error_and_runs_nothing() {
        let failing = reply(503).with_header("x-ms-error-code", "ServerBusy");
        let (outcome, handed, _) = run(vec![failing], at(SERVER_SECS), Ok("x"));
        assert!(outcome.is_err(), "{outcome:?}");
        assert_eq!(handed, None);
        // A missing container is created, then the reservation made.
        let missing = reply(404).with_header("x-ms-error-code", "ContainerNotFound");
        let created = reply(201).with_header("etag", "\"e1\"");
        let script = vec![missing, reply(201), created, written()];
        let (outcome, _, t) = run(script, at(SERVER_SECS), Ok("x"));
        assert!(
            matches!(outcome, Ok(PerOccurrence::Ran { .. })),
            "{outcome:?}"
        );
        assert_eq!(t.sent.borrow().len(), 4);
    }

    fn body(r: &Response) -> serde_json::Value {
        serde_json::from_slice(r.body()).unwrap()
    }

    #[test]
    fn outcomes_are_answered_in_one_place() {
        let occurrence = Occurrence::new(&five_minutes(), "digest/", SERVER_SECS);
        let key = occurrence.idempotency_key.clone();
        let ran = answer::<u16, String>(Ok(PerOccurrence::Ran {
            occurrence: occurrence.clone(),
            output: 204,
        }));
        assert_eq!(ran.status(), 200);
        assert_eq!(
            body(&ran),
            serde_json::json!({
                "outcome": "ran", "occurrence": "2026-11-19T14:00:00Z",
                "localTime": "2026-11-19T14:00:00Z", "fencingToken": SERVER_SECS << 16,
                "idempotencyKey": key, "output": 204,
            })
        );
        let again = answer::<u16, String>(Ok(PerOccurrence::AlreadyRun {
            occurrence: occurrence.clone(),
            reserved_by: Some("node-b".into()),
            outcome: Some(SUCCEEDED.into()),
        }));
        assert_eq!(again.status(), 200);
        assert_eq!(
            body(&again),
            serde_json::json!({
                "outcome": "already_run", "occurrence": "2026-11-19T14:00:00Z",
                "localTime": "2026-11-19T14:00:00Z", "reservedBy": "node-b", "run": "succeeded",
            })
        );
        let none = answer::<u16, String>(Ok(PerOccurrence::NoOccurrence));
        assert_eq!(
            (none.status().as_u16(), body(&none)),
            (200, serde_json::json!({ "outcome": "no_occurrence" }))
        );
        let failed = answer::<u16, String>(Ok(PerOccurrence::Failed {
            occurrence,
            error: "the webhook answered 503".into(),
        }));
        assert_eq!(failed.status(), 502);
        assert_eq!(body(&failed)["error"], "work_failed");
        assert_eq!(body(&failed)["fencingToken"], SERVER_SECS << 16);
        let down = answer::<u16, String>(Err(leasegate::Error::Transport(
            leasegate::TransportError::new(leasegate::TransportErrorKind::Connect, "refused"),
        )));
        assert_eq!(down.status(), 503);
        assert_eq!(down.headers().get("retry-after"), Some("1"));
        let bad = answer::<u16, String>(Err(Error::InvalidArgument("x".into())));
        assert_eq!(bad.status(), 500);
        assert_eq!(body(&bad)["error"], "invalid_argument");
    }
}
