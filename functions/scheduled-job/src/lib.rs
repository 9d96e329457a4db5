//! `scheduled-job`: a job deployed on several nodes for redundancy runs each scheduled
//! occurrence on exactly one of them.
//!
//! A tick (Spin's cron trigger, an Azure Functions timer, `POST /api/jobs/{job}/tick`; see
//! [`leasegate_spin::timer`]) names a trigger time; the **occurrence** is that time rounded to the
//! nearest multiple of the job's period, so deployments whose clocks or triggers differ by less
//! than half a period agree on it. Then:
//!
//! 1. **Reserve** the occurrence: create `jobs/{job}/occurrences/{unix}` only if absent
//!    (`If-None-Match: *`). Storage lets one creator win; the others answer `skipped`, naming
//!    the reserving instance (read from the reservation). A tick of the reserving instance
//!    itself (a retry, a manual tick beside the timer, replicas sharing an `instance_id`) goes
//!    on, unless the reservation already carries an outcome.
//! 2. With `job_overlap = skip` (the default), **take the job's lease** (`jobs/{job}/lock`, a
//!    fresh lease id per run, labelled with the instance and the occurrence, for the job's
//!    timeout plus the storage steps, rounded up to whole seconds). If a run of another
//!    occurrence holds it, the occurrence is skipped (outcome `skipped_overlap`, logged); if a
//!    tick of this same occurrence holds it, this tick leaves it alone. With `allow`, no lease:
//!    runs of successive occurrences may overlap.
//! 3. **Write the outcome `running` on the reservation** by compare-and-swap on its ETag,
//!    unless it has one: of all the ticks of an occurrence, the one that writes it runs the
//!    job, every other answers `skipped`. The reservation keeps the outcome as long as it
//!    exists (the retention), so a retry however late cannot run the occurrence again.
//! 4. **Log** the run in the reservation log (`jobs/{job}/log.json`: the last 10, newest first,
//!    with the storage server's time), by compare-and-swap on its ETag. The log refuses an
//!    occurrence below its clean-up watermark; that (or a storage failure before the job is
//!    called) undoes step 3, so a later tick decides afresh.
//! 5. **Run**: POST the occurrence, its fencing token (the occurrence times 2^16: tokens rise
//!    with the occurrence) and an idempotency key (one per job and occurrence) to `job_url`.
//! 6. **Record the result** on the reservation and in the log, give the lease back, and delete
//!    reservations older than the retention (a tick for an occurrence that old is refused, so
//!    none can run twice).
//!
//! A run is not retried: an occurrence whose job failed (or whose instance stopped after
//! writing `running`) is recorded so and the next occurrence runs normally. At most once,
//! never twice. The rules are in `docs/timer-functions.md`.
#![deny(missing_docs)]
// Helpers return `Err(Response)`: the finished 4xx answer, once per request.
#![allow(clippy::result_large_err)]

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{Acquire, IdOrigin, Locks, Term};
use leasegate::ops::{
    Condition, DeleteBlob, GetBlob, GetProperties, ListBlobs, Metadata, PutBlob, SetMetadata,
    WriteOutcome,
};
use leasegate::{BlobName, Counting, LockName, Transport, TransportErrorKind};
use leasegate::{Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use leasegate_spin::auth::Power;
use leasegate_spin::config::{self, check_name, ConfigError, Storage, Variables};
use leasegate_spin::storage::execute_creating_container;
use leasegate_spin::timer::{self, Source, Tick, TimerFunction};
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{auth, elapsed_ms, log_line, Context};

/// Entries the reservation log keeps.
pub const LOG_ENTRIES: usize = 10;
/// The longest job name, in bytes.
pub const MAX_JOB_NAME: usize = leasegate_spin::config::MAX_NAME;
/// A tick may write `skipped_overlap` on an occurrence at most this far ahead of the storage
/// server's clock (its `Date` is whole seconds, so an occurrence due within the second reads
/// one second ahead).
const DUE_GRACE_SECS: u64 = 1;
/// Earlier occurrences a winning tick settles at most (each costs a read, and a write when its
/// reserver left it without an outcome).
const SETTLE_MAX: usize = 4;
/// How many occurrences back a winning tick looks for ones to settle at most.
const SETTLE_LOOKBACK: u64 = 64;
/// How many times a compare-and-swap of the log is tried before giving up.
const LOG_ATTEMPTS: usize = 8;
/// Seconds added to the job's timeout for the lease: the lease outlives the call it guards.
const LEASE_MARGIN_SECS: u64 = 10;
/// Route prefix of the HTTP API.
pub const ROUTE_PREFIX: &str = "/api/jobs/";
/// The HTTP API's route.
pub const ROUTE: &str = "/api/jobs";

/// Whether a run may start while the previous one still holds the job's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Skip the occurrence (and log it).
    Skip,
    /// Run anyway, under a lease of its own.
    Allow,
}

/// The scheduled-job settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Storage.
    pub storage: Storage,
    /// This deployment's identity.
    pub instance_id: String,
    /// The job's name.
    pub job: String,
    /// Its period: occurrences are multiples of it (plus `offset`) since the Unix epoch.
    pub period: Duration,
    /// The occurrences' offset within the period (a nightly job at 02:00: 7200 s).
    pub offset: Duration,
    /// Where the job is POSTed.
    pub job_url: String,
    /// How long the job's call may take.
    pub timeout: Duration,
    /// Overlap policy.
    pub overlap: Overlap,
    /// Reservations are kept this long; older occurrences are refused.
    pub retention: Duration,
    /// How far ahead of the storage server's clock an occurrence may be; later ones are
    /// refused (a clock or a caller running ahead). Also how far behind this instance's
    /// clock an HTTP tick with the tick token may name an occurrence.
    pub early: Duration,
    /// The job's lease term (`job_overlap = skip`): the job's timeout, plus the storage steps
    /// around it (4 storage timeouts), plus a margin, rounded up to whole seconds; checked when
    /// the settings load.
    pub lease_term: Term,
}

/// A job name: 1 to 63 lowercase letters, digits, `-`, `_` or `.`, starting with a letter or
/// digit (it appears in blob names, URLs and Azure Functions function names).
pub fn check_job_name(name: &str) -> Result<(), String> {
    check_name(name, "job name")
}

impl Settings {
    /// Reads the settings from variables.
    pub fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        let instance_id = timer::instance_id(vars)?;
        let job = config::var(vars, "job_name").unwrap_or_else(|| "job".into());
        check_job_name(&job).map_err(|e| ConfigError(format!("variable job_name: {e}")))?;
        let whole = |name: &str, default: f64, range: std::ops::RangeInclusive<i64>| {
            let v = config::number(vars, name, default, range)?;
            if v.fract() != 0.0 {
                return Err(ConfigError(format!(
                    "variable {name} must be whole seconds"
                )));
            }
            Ok(Duration::from_secs(v as u64))
        };
        let period = whole("job_period_seconds", 60.0, 1..=31_536_000)?;
        let offset = whole("job_offset_seconds", 0.0, 0..=31_536_000)?;
        if offset >= period {
            return Err(ConfigError(
                "variable job_offset_seconds must be less than job_period_seconds".into(),
            ));
        }
        let timeout = whole("job_timeout_seconds", 30.0, 1..=3600)?;
        let default_retention = (period.as_secs() * LOG_ENTRIES as u64).max(3600) as f64;
        let retention = whole("job_retention_seconds", default_retention, 60..=31_536_000)?;
        if retention < period {
            return Err(ConfigError(
                "variable job_retention_seconds must be at least one period".into(),
            ));
        }
        let early = whole("job_early_seconds", 300.0, 1..=31_536_000)?;
        let overlap = match config::var(vars, "job_overlap").as_deref() {
            None | Some("skip") => Overlap::Skip,
            Some("allow") => Overlap::Allow,
            Some(_) => {
                return Err(ConfigError(
                    "variable job_overlap must be skip or allow".into(),
                ))
            }
        };
        let job_url = config::url(vars, "job_url")?;
        let storage = config::storage(vars)?;
        let lease_term = lease_term(timeout, storage.timeout)?;
        Ok(Settings {
            storage,
            lease_term,
            instance_id,
            job,
            period,
            offset,
            job_url,
            timeout,
            overlap,
            retention,
            early,
        })
    }

    /// How long a reservation's reserver has to write its outcome: the job's lease term (see
    /// [`abandoned`]).
    pub fn reservation_deadline(&self) -> Duration {
        term_length(self.lease_term)
    }

    /// How far the trigger time of a tick with the tick token may be from this instance's
    /// clock: `job_early_seconds`, but at most 10 s and half a period, so that the occurrence
    /// it names is the one due now (or, at a boundary, the one just before or after).
    pub fn tick_tolerance(&self) -> Duration {
        self.early.min(Duration::from_secs(10)).min(self.period / 2)
    }

    /// Whether a tick for trigger time `at` names the occurrence due at `now` (this instance's
    /// clock): the occurrence of a time within [`Settings::tick_tolerance`] of `now`.
    pub fn due_now(&self, at: SystemTime, now: SystemTime) -> bool {
        let named = timer::occurrence(at, self.period, self.offset);
        let tolerance = self.tick_tolerance();
        [
            now.checked_sub(tolerance).unwrap_or(now),
            now,
            now + tolerance,
        ]
        .iter()
        .any(|t| timer::occurrence(*t, self.period, self.offset) == named)
    }

    /// The first occurrence of the schedule after `t` (Unix seconds).
    fn next_occurrence(&self, t: u64) -> u64 {
        let (p, o) = (self.period.as_secs().max(1), self.offset.as_secs());
        if t < o {
            return o;
        }
        ((t - o) / p + 1).saturating_mul(p).saturating_add(o)
    }

    fn occurrences_prefix(&self) -> String {
        format!("jobs/{}/occurrences/", self.job)
    }

    fn reservation(&self, occurrence: u64) -> Result<BlobName, leasegate::Error> {
        BlobName::try_new(&format!("{}{occurrence:012}", self.occurrences_prefix()))
    }

    fn log_blob(&self) -> Result<BlobName, leasegate::Error> {
        BlobName::try_new(&format!("jobs/{}/log.json", self.job))
    }
}

/// The length of a lease term.
fn term_length(term: Term) -> Duration {
    match term {
        Term::Native(leasegate::LeaseDuration::Seconds(s)) => Duration::from_secs(u64::from(s)),
        Term::Record(d) => d,
        Term::Native(_) => Duration::from_secs(60),
    }
}

/// The job's lease term: `timeout + 4 x storage_timeout + 10 s`, rounded up to whole seconds
/// (terms are whole seconds; `storage_timeout_ms = 5100` makes 60.4 s, taken as 61 s).
pub fn lease_term(timeout: Duration, storage_timeout: Duration) -> Result<Term, ConfigError> {
    let window = timeout + storage_timeout * 4 + Duration::from_secs(LEASE_MARGIN_SECS);
    let secs = window.as_secs() + u64::from(window.subsec_nanos() > 0);
    Term::for_window(Duration::from_secs(secs)).map_err(|e| {
        ConfigError(format!(
            "variables job_timeout_seconds and storage_timeout_ms: the job's lease term \
             (job_timeout_seconds + 4 x storage_timeout_ms + {LEASE_MARGIN_SECS} s = {secs} s) \
             is not usable: {e}"
        ))
    })
}

/// One entry of the reservation log. A stored record: unknown fields are ignored and none is
/// renamed, so deployments of older and newer versions read each other's logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The occurrence (RFC 3339).
    pub occurrence: String,
    /// The occurrence in Unix seconds (what entries are ordered by).
    pub occurrence_unix: u64,
    /// The instance that reserved it.
    pub instance: String,
    /// When it was reserved, by the storage server's clock.
    pub reserved_at: String,
    /// `running`, `succeeded`, `failed`, `skipped_overlap`.
    pub status: String,
    /// The run's fencing token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<u64>,
    /// `cron`, `azure` or `http`.
    pub trigger: String,
    /// Azure's `IsPastDue`.
    #[serde(default)]
    pub past_due: bool,
    /// When the run ended, by the storage server's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Why it failed or was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The reservation log blob, written as indented JSON. A stored record, like [`Entry`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Log {
    /// The job.
    pub job: String,
    /// The last reservations, newest (latest occurrence) first.
    #[serde(default)]
    pub entries: Vec<Entry>,
    /// Reservations of occurrences before this one (Unix seconds) may have been deleted: a
    /// tick for them is refused, whatever retention its deployment has.
    #[serde(default)]
    pub cleaned_before: u64,
    /// Every occurrence of the schedule up to this one (Unix seconds) is settled: it has an
    /// outcome, or nobody reserved it. A winning tick looks at the occurrences after it
    /// (bounded) and settles a reservation its reserver left without an outcome
    /// ([`settle_earlier`]). 0: not known yet (a log written by an older version).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub settled_through: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a tick came to.
#[derive(Debug)]
pub enum Decision {
    /// This instance ran the occurrence; the job answered 2xx.
    Ran {
        /// The run's log entry.
        entry: Entry,
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
        entry: Entry,
    },
    /// This instance ran it and the job failed (not retried).
    JobFailed {
        /// The run's log entry.
        entry: Entry,
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

/// A tick's outcome: the occurrence, the decision (or the storage failure), the storage
/// requests it took.
#[derive(Debug)]
pub struct Outcome {
    /// The occurrence (Unix seconds).
    pub occurrence: u64,
    /// What happened.
    pub decision: Result<Decision, leasegate::Error>,
    /// Storage requests sent.
    pub round_trips: u32,
}

/// Runs one tick: reserve, lease, log, run, log, release, clean up.
pub async fn tick<T: Transport>(ctx: &Context<'_, T>, settings: &Settings, tick: &Tick) -> Outcome {
    let occurrence = timer::occurrence(tick.at, settings.period, settings.offset);
    let occurrence = unix(occurrence);
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let job_transport = (ctx.connect)(settings.timeout);
    let decision = run_tick(ctx, &counting, &job_transport, settings, tick, occurrence).await;
    Outcome {
        occurrence,
        decision,
        round_trips: counting.sent(),
    }
}

/// Reservation metadata: the instance that reserved the occurrence, and the tick's source.
const META_RESERVED_BY: &str = "leasegate_reserved_by";
const META_TRIGGER: &str = "leasegate_trigger";
/// Reservation metadata: the occurrence's outcome (`running`, `succeeded`, `failed`,
/// `skipped_overlap`), written by compare-and-swap before the job is called: the one record
/// that says whether the occurrence ran, kept as long as the reservation.
const META_RUN: &str = "leasegate_run";
/// Reservation metadata: a nonce of the tick that wrote the outcome (to recognise one's own
/// write after a lost answer), and the run's fencing token.
const META_RUN_TICK: &str = "leasegate_run_tick";
const META_RUN_TOKEN: &str = "leasegate_run_token";

/// The body of a reservation blob (what is in it is for people; the metadata is what ticks
/// read). A stored record: no field renamed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ReservationBody {
    job: String,
    occurrence: String,
    instance: String,
}

/// A reservation as this tick knows it: its ETag and metadata (what a compare-and-swap
/// writes over), and whether this tick created it.
#[derive(Debug, Clone)]
struct Reservation {
    blob: BlobName,
    etag: Option<leasegate::ETag>,
    metadata: Metadata,
    created: bool,
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

async fn run_tick<T, S: Transport, J: Transport>(
    ctx: &Context<'_, T>,
    storage: &S,
    job: &J,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
) -> Result<Decision, leasegate::Error> {
    let s = &settings.storage;
    let locks = Locks::new(storage, s.account.clone(), s.container.clone());
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
    let body = serde_json::to_vec(&body).map_err(|e| {
        leasegate::Error::InvalidArgument(format!("the reservation could not be written: {e}"))
    })?;
    let put = PutBlob::block(s.container.clone(), blob.clone(), body)
        .with_content_type("application/json")
        .with_condition(Condition::IfNotExists)
        .with_metadata(metadata.clone());
    let (reserved, date) = execute_creating_container(&locks, &put, ctx.now).await?;
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
            let (props, date) = head(&locks, &blob, ctx.now).await?;
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
            take_back(&locks, &reservation, ctx.now).await;
        }
        return Ok(refusal);
    }
    run_reserved(
        ctx,
        &locks,
        job,
        settings,
        tick,
        occurrence,
        (reserved_at, server_now),
        reservation,
    )
    .await
}

/// Whether a reservation has been left without an outcome past its deadline: its reserver's
/// chance has passed, and any instance may settle it. The deadline is the reservation's time
/// (its `Last-Modified`, by the storage server's clock) plus the job's lease term, which
/// bounds the reserver's steps up to its outcome (the lease, then the outcome's write); the
/// reserver's own lease on the job, if it took one, has run out by then too. Taking over
/// early would still run the occurrence at most once (the outcome's compare-and-swap decides).
fn abandoned(
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
fn label_occurrence(label: &str) -> Option<u64> {
    label.rsplit(' ').next()?.parse().ok()
}

/// One HEAD of a reservation.
async fn head<T: Transport>(
    locks: &Locks<T>,
    blob: &BlobName,
    now: SystemTime,
) -> Result<(Option<leasegate::ops::BlobProperties>, Option<SystemTime>), leasegate::Error> {
    locks
        .execute(
            &GetProperties {
                container: locks.container().clone(),
                blob: blob.clone(),
            },
            now,
        )
        .await
}

/// Deletes the reservation this tick made (as it last wrote it): best effort.
async fn take_back<T: Transport>(locks: &Locks<T>, reservation: &Reservation, now: SystemTime) {
    if let Some(etag) = &reservation.etag {
        let delete = DeleteBlob {
            container: locks.container().clone(),
            blob: reservation.blob.clone(),
            lease_id: None,
            condition: Condition::IfMatch(etag.clone()),
        };
        let _ = locks.execute(&delete, now).await;
    }
}

/// What writing an outcome on a reservation came to.
enum Commit {
    /// This tick wrote it: the reservation as written.
    Written(Reservation),
    /// A tick before it wrote one (this outcome).
    Settled(String),
}

/// Writes `outcome` on the reservation by compare-and-swap, unless it has one already: of all
/// the ticks of one occurrence, one writes an outcome, and only that one runs the job (or
/// records the skip). A write whose answer is lost is read back (its `nonce`).
async fn commit<T: Transport>(
    locks: &Locks<T>,
    reservation: &Reservation,
    outcome: &str,
    nonce: &str,
    token: Option<u64>,
    now: SystemTime,
) -> Result<Commit, leasegate::Error> {
    let mut seen = reservation.clone();
    for _ in 0..LOG_ATTEMPTS {
        if let Some(run) = seen.metadata.get(META_RUN) {
            return Ok(Commit::Settled(run.clone()));
        }
        if let Some(etag) = seen.etag.clone() {
            let mut metadata = seen.metadata.clone();
            metadata.insert(META_RUN.into(), outcome.into());
            metadata.insert(META_RUN_TICK.into(), nonce.into());
            if let Some(token) = token {
                metadata.insert(META_RUN_TOKEN.into(), token.to_string());
            }
            let write = SetMetadata {
                container: locks.container().clone(),
                blob: seen.blob.clone(),
                metadata: metadata.clone(),
                lease_id: None,
                condition: Condition::IfMatch(etag),
            };
            match locks.execute(&write, now).await {
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
                    return match head(locks, &seen.blob, now).await {
                        Ok((Some(p), _))
                            if p.metadata.get(META_RUN_TICK).map(String::as_str) == Some(nonce) =>
                        {
                            Ok(Commit::Written(Reservation {
                                etag: p.etag,
                                metadata: p.metadata,
                                ..seen
                            }))
                        }
                        _ => Err(e),
                    };
                }
            }
        }
        // Changed since it was read (or read without an ETag): read it again.
        let (props, _) = head(locks, &seen.blob, now).await?;
        let Some(props) = props else {
            return Ok(Commit::Settled("deleted".into()));
        };
        seen.etag = props.etag;
        seen.metadata = props.metadata;
    }
    Err(leasegate::Error::InvalidArgument(format!(
        "the reservation {} kept changing: gave up after {LOG_ATTEMPTS} tries",
        reservation.blob.as_str()
    )))
}

/// Undoes this tick's outcome before the job was called (the log refused the occurrence, or
/// storage failed): a reservation this tick created is deleted, an older one gets its metadata
/// back, so a later tick decides afresh. Best effort.
async fn uncommit<T: Transport>(
    locks: &Locks<T>,
    original: &Reservation,
    written: &Reservation,
    now: SystemTime,
) {
    let Some(etag) = written.etag.clone() else {
        return;
    };
    if original.created {
        take_back(locks, written, now).await;
        return;
    }
    let write = SetMetadata {
        container: locks.container().clone(),
        blob: original.blob.clone(),
        metadata: original.metadata.clone(),
        lease_id: None,
        condition: Condition::IfMatch(etag),
    };
    let _ = locks.execute(&write, now).await;
}

/// Steps 3 to 7 of [`run_tick`], once the occurrence is reserved and in range.
#[allow(clippy::too_many_arguments)]
async fn run_reserved<T, S: Transport, J: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<&S>,
    job: &J,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
    (reserved_at, server_now): (SystemTime, SystemTime),
    reservation: Reservation,
) -> Result<Decision, leasegate::Error> {
    let reserved_by = reservation.metadata.get(META_RESERVED_BY).cloned();
    let settled = |run: &str| Decision::Skipped {
        reserved_by: reserved_by.clone(),
        reason: if run == "missed" {
            "it was recorded missed: its reserver wrote no outcome by its deadline".into()
        } else if reserved_by.as_deref() == Some(settings.instance_id.as_str()) {
            format!("this instance settled it on an earlier tick ({run})")
        } else {
            format!("it was settled after its reserver's deadline ({run})")
        },
    };
    if let Some(run) = reservation.metadata.get(META_RUN) {
        return Ok(settled(run));
    }
    let token = occurrence_token(occurrence)?;
    let mut entry = Entry {
        occurrence: rfc3339(at(occurrence)),
        occurrence_unix: occurrence,
        instance: settings.instance_id.clone(),
        reserved_at: rfc3339(reserved_at),
        status: "running".into(),
        fencing_token: Some(token),
        trigger: tick.source.as_str().into(),
        past_due: tick.past_due,
        finished_at: None,
        reason: None,
    };
    let nonce = (ctx.new_lease_id)().to_string();
    // 3. The job's lease (skip: one run at a time), labelled with the instance and the
    // occurrence, so that a tick finding its own occurrence's run in it leaves that run alone.
    let job_locks = locks
        .clone()
        .with_prefix(&format!("jobs/{}/", settings.job));
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
                        take_back(locks, &reservation, ctx.now).await;
                    }
                    return Ok(Decision::NotDue {
                        retry_after: Duration::from_secs(due_in),
                    });
                }
                entry.status = "skipped_overlap".into();
                entry.reason = Some("the previous run still holds the job's lease".into());
                let written = match commit(
                    locks,
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
                return match append(locks, settings, &entry, ctx.now).await {
                    Ok(Err(LogRefusal::TooOld)) => {
                        uncommit(locks, &reservation, &written, ctx.now).await;
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
                let (props, _) = head(locks, &reservation.blob, ctx.now).await?;
                if let Some(run) = props.as_ref().and_then(|p| p.metadata.get(META_RUN)) {
                    return Ok(settled(run));
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
    let written = match commit(locks, &reservation, "running", &nonce, Some(token), ctx.now).await {
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
    match append(locks, settings, &entry, ctx.now).await {
        Ok(Ok(())) => {}
        refused => {
            uncommit(locks, &reservation, &written, ctx.now).await;
            release().await;
            return match refused {
                Err(e) => Err(e),
                Ok(_) => Ok(Decision::TooOld {
                    retention: settings.retention,
                }),
            };
        }
    }
    // 6. Run.
    let result = call_job(job, settings, &entry).await;
    // 7. Record the result on the reservation and in the log (raising the clean-up watermark),
    // release, clean up below it.
    let (status, reason) = match &result {
        Ok(()) => ("succeeded", None),
        Err(reason) => ("failed", Some(reason.clone())),
    };
    entry.status = status.into();
    entry.reason = reason;
    if let Some(etag) = written.etag.clone() {
        let mut metadata = written.metadata.clone();
        metadata.insert(META_RUN.into(), status.into());
        let write = SetMetadata {
            container: locks.container().clone(),
            blob: written.blob.clone(),
            metadata,
            lease_id: None,
            condition: Condition::IfMatch(etag),
        };
        let _ = locks.execute(&write, ctx.now).await;
    }
    let finished = update(locks, settings, &entry, ctx.now).await;
    release().await;
    if let Ok((end, log)) = &finished {
        entry.finished_at = Some(rfc3339(*end));
        // Earlier occurrences whose reservers left them without an outcome: settled here, as a
        // redundant deployment is for. Best effort: a later winner goes on from the log.
        let _ = settle_earlier(ctx, locks, settings, tick, occurrence, log).await;
        let _ = clean_up(locks, settings, log.cleaned_before, ctx.now).await;
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
struct JobRequest<'a> {
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
async fn call_job<J: Transport>(job: &J, settings: &Settings, entry: &Entry) -> Result<(), String> {
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

/// Reads the log: its content, its ETag (`None`: no log yet) and the server's `Date`.
pub async fn read_log<T: Transport>(
    locks: &Locks<T>,
    settings: &Settings,
    now: SystemTime,
) -> Result<(Log, Option<leasegate::ETag>, SystemTime), leasegate::Error> {
    let (blob, date) = locks
        .execute(
            &GetBlob {
                container: locks.container().clone(),
                blob: settings.log_blob()?,
            },
            now,
        )
        .await?;
    let date = date.unwrap_or(now);
    match blob {
        None => Ok((
            Log {
                job: settings.job.clone(),
                ..Log::default()
            },
            None,
            date,
        )),
        Some(content) => {
            let log: Log = serde_json::from_slice(&content.body).map_err(|_| {
                leasegate::Error::CorruptLock(format!(
                    "the reservation log of job {} is not valid JSON",
                    settings.job
                ))
            })?;
            Ok((log, content.properties.etag, date))
        }
    }
}

/// Changes the log with `change` (given the server's time of the read) by compare-and-swap,
/// retrying lost races. `change` may refuse (`Err`): nothing is written. Returns the server's
/// `Date` of the write and the log as written.
async fn change_log<T: Transport, R>(
    locks: &Locks<T>,
    settings: &Settings,
    now: SystemTime,
    change: impl Fn(&mut Log, SystemTime) -> Result<(), R>,
) -> Result<Result<(SystemTime, Log), R>, leasegate::Error> {
    for _ in 0..LOG_ATTEMPTS {
        let (mut log, etag, read_at) = read_log(locks, settings, now).await?;
        if let Err(refusal) = change(&mut log, read_at) {
            return Ok(Err(refusal));
        }
        // Newest first (a stable sort: entries of one occurrence keep their order).
        log.entries
            .sort_by_key(|e| std::cmp::Reverse(e.occurrence_unix));
        log.entries.truncate(LOG_ENTRIES);
        let body = serde_json::to_vec_pretty(&log).map_err(|e| {
            leasegate::Error::InvalidArgument(format!(
                "the reservation log of job {} could not be written: {e}",
                settings.job
            ))
        })?;
        let condition = match etag {
            Some(e) => Condition::IfMatch(e),
            None => Condition::IfNotExists,
        };
        let put = PutBlob::block(locks.container().clone(), settings.log_blob()?, body)
            .with_content_type("application/json")
            .with_condition(condition);
        match locks.execute(&put, now).await? {
            (WriteOutcome::Written(w), date) => {
                return Ok(Ok((w.server_date.or(date).unwrap_or(now), log)))
            }
            (WriteOutcome::Refused(_), _) => continue,
        }
    }
    Err(leasegate::Error::InvalidArgument(format!(
        "the reservation log of job {} kept changing: gave up after {LOG_ATTEMPTS} tries",
        settings.job
    )))
}

/// Why the log refused an entry.
enum LogRefusal {
    /// The occurrence is before the log's clean-up watermark.
    TooOld,
}

/// Adds the run's entry (in place of any entry for its occurrence), unless the occurrence is
/// before the clean-up watermark.
async fn append<T: Transport>(
    locks: &Locks<T>,
    settings: &Settings,
    entry: &Entry,
    now: SystemTime,
) -> Result<Result<(), LogRefusal>, leasegate::Error> {
    let changed = change_log(locks, settings, now, |log, _| {
        if entry.occurrence_unix < log.cleaned_before {
            return Err(LogRefusal::TooOld);
        }
        log.job = settings.job.clone();
        log.entries
            .retain(|e| e.occurrence_unix != entry.occurrence_unix);
        log.entries.push(entry.clone());
        advance_settled(log, settings, entry.occurrence_unix, 0);
        Ok(())
    })
    .await?;
    Ok(changed.map(|_| ()))
}

/// Moves the log's `settled_through` watermark up: over the occurrences that have an entry,
/// and up to `through` (occurrences [`settle_earlier`] found settled). A log without one
/// starts from its newest entry before `newest` (or the occurrence before it), and the
/// watermark never lags more than [`SETTLE_LOOKBACK`] occurrences behind `newest`.
fn advance_settled(log: &mut Log, settings: &Settings, newest: u64, through: u64) {
    let period = settings.period.as_secs().max(1);
    if log.settled_through == 0 {
        log.settled_through = log
            .entries
            .iter()
            .map(|e| e.occurrence_unix)
            .filter(|o| *o < newest)
            .max()
            .unwrap_or(newest.saturating_sub(period));
    }
    let floor = newest.saturating_sub(SETTLE_LOOKBACK.saturating_mul(period));
    log.settled_through = log.settled_through.max(through).max(floor);
    loop {
        let next = settings.next_occurrence(log.settled_through);
        let settled =
            next < log.cleaned_before || log.entries.iter().any(|e| e.occurrence_unix == next);
        if next > newest || !settled {
            break;
        }
        log.settled_through = next;
    }
}

/// Settles the occurrences between the log's `settled_through` and `occurrence` (this tick's,
/// which it ran) that have no entry in the log, oldest first, at most [`SETTLE_MAX`]: a
/// reservation its reserver left without an outcome past its deadline ([`abandoned`]) gets the
/// outcome `missed` (by the same compare-and-swap as any outcome, so a reserver that comes
/// back late finds it settled) and an entry in the log; one that nobody reserved, or that has
/// an outcome, is settled as it is. The first one still within its reserver's deadline stops
/// the walk: a later winner looks again. Nothing is read when the watermark is at the
/// occurrence before this one, as it is whenever every tick has a winner.
async fn settle_earlier<T, S: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<&S>,
    settings: &Settings,
    tick: &Tick,
    occurrence: u64,
    log: &Log,
) -> Result<(), leasegate::Error> {
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
        let (props, date) = head(locks, &blob, ctx.now).await?;
        let Some(props) = props else {
            through = o;
            continue;
        };
        if props.metadata.contains_key(META_RUN) {
            through = o;
            continue;
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
        if let Commit::Written(_) =
            commit(locks, &reservation, "missed", &nonce, None, ctx.now).await?
        {
            let at_now = date.unwrap_or(ctx.now);
            missed.push(Entry {
                occurrence: rfc3339(at(o)),
                occurrence_unix: o,
                instance: reserved_by.clone().unwrap_or_default(),
                reserved_at: rfc3339(props.last_modified.unwrap_or(at_now)),
                status: "missed".into(),
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
    let _ = change_log(locks, settings, ctx.now, |log, _| {
        for entry in &missed {
            if !log
                .entries
                .iter()
                .any(|e| e.occurrence_unix == entry.occurrence_unix)
            {
                log.entries.push(entry.clone());
            }
        }
        advance_settled(log, settings, occurrence, through);
        Ok::<(), ()>(())
    })
    .await?;
    Ok(())
}

/// Records the run's result, its end stamped with the server's clock, and moves the clean-up
/// watermark up to the retention. Returns the end and the log as written.
async fn update<T: Transport>(
    locks: &Locks<T>,
    settings: &Settings,
    entry: &Entry,
    now: SystemTime,
) -> Result<(SystemTime, Log), leasegate::Error> {
    let written = change_log(locks, settings, now, |log, read_at| {
        // The run's own entry (added again if the log lost it: the reservation holds the
        // outcome, the log shows it).
        log.entries
            .retain(|e| e.occurrence_unix != entry.occurrence_unix);
        let mut done = entry.clone();
        done.finished_at = Some(rfc3339(read_at));
        log.entries.push(done);
        let cutoff = unix(read_at).saturating_sub(settings.retention.as_secs());
        log.cleaned_before = log.cleaned_before.max(cutoff);
        advance_settled(log, settings, entry.occurrence_unix, 0);
        Ok::<(), ()>(())
    })
    .await?;
    Ok(written.unwrap_or_else(|()| (now, Log::default())))
}

/// Deletes reservations before the log's clean-up watermark (oldest first, a page at a time):
/// the watermark was raised first, so a tick for such an occurrence is refused, whatever
/// retention its deployment has, and none can run twice.
async fn clean_up<T: Transport>(
    locks: &Locks<T>,
    settings: &Settings,
    cutoff: u64,
    now: SystemTime,
) -> Result<usize, leasegate::Error> {
    let list = ListBlobs {
        prefix: Some(settings.occurrences_prefix()),
        max_results: Some(16),
        ..ListBlobs::new(locks.container().clone())
    };
    let (page, _) = locks.execute(&list, now).await?;
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
            container: locks.container().clone(),
            blob,
            lease_id: None,
            condition: item
                .properties
                .etag
                .map(Condition::IfMatch)
                .unwrap_or_default(),
        };
        if locks.execute(&delete, now).await.is_ok() {
            deleted += 1;
        }
    }
    Ok(deleted)
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
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

/// The answer for a tick: its status (2xx when the occurrence is settled: run here, run
/// elsewhere, skipped on purpose) and a JSON value with the decision.
pub fn describe(
    settings: &Settings,
    tick: &Tick,
    outcome: &Outcome,
    started: Instant,
) -> (StatusCode, Value) {
    let mut v = json!({
        "job": settings.job,
        "instance": settings.instance_id,
        "occurrence": rfc3339(at(outcome.occurrence)),
        "trigger": tick.source.as_str(),
        "storageRoundTrips": outcome.round_trips,
        "durationMs": elapsed_ms(started),
    });
    let status = match &outcome.decision {
        Ok(d) => {
            v["decision"] = json!(d.name());
            match d {
                Decision::Ran { entry } | Decision::Overlapped { entry } => {
                    v["entry"] = json!(entry);
                    StatusCode::OK
                }
                Decision::JobFailed { entry } => {
                    v["entry"] = json!(entry);
                    v["error"] = json!("job_failed");
                    v["message"] = json!(format!(
                        "{}; it is not retried: the next occurrence runs normally",
                        entry.reason.clone().unwrap_or_default()
                    ));
                    StatusCode::BAD_GATEWAY
                }
                Decision::Skipped {
                    reserved_by,
                    reason,
                } => {
                    v["reservedBy"] = json!(reserved_by);
                    v["reason"] = json!(reason);
                    StatusCode::OK
                }
                Decision::InProgress { retry_after } => {
                    v["error"] = json!("occurrence_in_progress");
                    v["message"] = json!(format!(
                        "this instance's lease for the occurrence is held but the occurrence has no outcome yet: retry in {} s (once the lease ends, a tick runs it)",
                        retry_after.as_secs()
                    ));
                    v["retryAfterSeconds"] = json!(retry_after.as_secs());
                    StatusCode::SERVICE_UNAVAILABLE
                }
                Decision::NotDue { retry_after } => {
                    v["error"] = json!("occurrence_not_due");
                    v["message"] = json!(format!(
                        "a run of an earlier occurrence holds the job's lease and this occurrence is not due for {} s by the storage server's clock: nothing was recorded; a tick once it is due decides",
                        retry_after.as_secs()
                    ));
                    v["retryAfterSeconds"] = json!(retry_after.as_secs());
                    StatusCode::SERVICE_UNAVAILABLE
                }
                Decision::TooEarly { early } => {
                    v["error"] = json!("occurrence_too_early");
                    v["message"] = json!(format!(
                        "the occurrence is more than {} s ahead of the storage server's clock (job_early_seconds): is this instance's clock ahead?",
                        early.as_secs()
                    ));
                    StatusCode::CONFLICT
                }
                Decision::TooOld { retention } => {
                    v["error"] = json!("occurrence_too_old");
                    v["message"] = json!(format!(
                        "the occurrence is more than {} s old (job_retention_seconds): it may have run, so it is not run",
                        retention.as_secs()
                    ));
                    StatusCode::CONFLICT
                }
            }
        }
        Err(e) => {
            v["decision"] = json!("storage_unavailable");
            v["error"] = json!(web::storage_error_code(e));
            v["message"] = json!(web::storage_failed(e, "the job did not run"));
            web::storage_status(e)
        }
    };
    (status, v)
}

/// The largest request body the HTTP routes read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// scheduled-job as a timer function: ticked by Spin's cron trigger (`Err` when the occurrence
/// was not settled: the job failed, storage failed, misconfiguration), an Azure Functions
/// timer, or `POST /api/jobs/{job}/tick`.
pub struct ScheduledJob;

impl TimerFunction for ScheduledJob {
    const NAME: &'static str = "scheduled-job";
    const ROUTES: &'static [&'static str] = &[ROUTE];
    type Settings = Settings;
    type Answer = Value;

    fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        Settings::load(vars)
    }

    /// The event's own time: the occurrence it stands for.
    fn cron_time(timestamp: u64, _now: SystemTime) -> Result<SystemTime, String> {
        let latest = unix(timer::latest_time());
        if timestamp > latest {
            return Err(format!(
                "the cron event's timestamp {timestamp} is out of range (after {latest})"
            ));
        }
        Ok(at(timestamp))
    }

    async fn tick<T: Transport>(
        ctx: &Context<'_, T>,
        settings: &Settings,
        tick: &Tick,
        started: Instant,
    ) -> (StatusCode, Value) {
        let outcome = self::tick(ctx, settings, tick).await;
        describe(settings, tick, &outcome, started)
    }

    fn failure(v: &Value) -> String {
        v["message"]
            .as_str()
            .unwrap_or("the tick failed")
            .to_string()
    }

    fn summary(settings: &Settings, v: &Value) -> String {
        format!(
            "scheduled-job {}: occurrence {} {} on {}",
            settings.job,
            v["occurrence"].as_str().unwrap_or(""),
            v["decision"].as_str().unwrap_or(""),
            settings.instance_id
        )
    }

    /// The log line of a tick: its answer without the entry, naming the function.
    fn log(v: &Value) {
        let mut line = timer::with_fn(v, Self::NAME);
        if let Some(obj) = line.as_object_mut() {
            obj.shift_remove("entry");
        }
        log_line(line);
    }

    /// * `POST /api/jobs/{job}/tick` (bearer `timer_token` or `admin_token`): a tick from an
    ///   HTTP scheduler, for the time in an optional JSON body `{"at": "2026-11-21T14:55:00Z"}`
    ///   (else now); with `timer_token` only the occurrence due now by this instance's clock
    ///   (give or take [`Settings::tick_tolerance`]): naming any other, past or future, is a
    ///   manual run, `admin_token` only;
    /// * `GET /api/jobs/{job}` (bearer, either token): the reservation log.
    async fn api<T: Transport>(
        ctx: &Context<'_, T>,
        request: &Request,
        power: Power,
        started: Instant,
    ) -> Response {
        let rest = request.path().strip_prefix(ROUTE_PREFIX).unwrap_or("");
        api(ctx, request, rest, power, started).await
    }
}

async fn api<T: Transport>(
    ctx: &Context<'_, T>,
    request: &Request,
    rest: &str,
    power: auth::Power,
    started: Instant,
) -> Response {
    let (job, action) = match rest.trim_end_matches('/').split_once('/') {
        Some((job, action)) => (job, Some(action)),
        None => (rest.trim_end_matches('/'), None),
    };
    if let Err(m) = check_job_name(job) {
        return web::error(StatusCode::BAD_REQUEST, "invalid_job", m);
    }
    let method = request.method().clone();
    match (action, &method) {
        (None, &leasegate::Method::GET) | (Some("tick"), &leasegate::Method::POST) => {}
        (None, _) => return web::method_not_allowed("GET"),
        (Some("tick"), _) => return web::method_not_allowed("POST"),
        (Some(_), _) => {
            return web::error(
                StatusCode::NOT_FOUND,
                "not_found",
                "routes: GET /api/jobs/{job}, POST /api/jobs/{job}/tick",
            )
        }
    }
    let settings = match Settings::load(ctx.variables) {
        Ok(s) => s,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    if job != settings.job {
        return web::error(
            StatusCode::NOT_FOUND,
            "unknown_job",
            format!("this component runs job {}", settings.job),
        );
    }
    if method == leasegate::Method::GET {
        let transport = (ctx.connect)(settings.storage.timeout);
        let locks = Locks::new(
            &transport,
            settings.storage.account.clone(),
            settings.storage.container.clone(),
        );
        return match read_log(&locks, &settings, ctx.now).await {
            Ok((log, _, _)) => web::json(
                StatusCode::OK,
                &json!({
                    "job": settings.job,
                    "periodSeconds": settings.period.as_secs(),
                    "overlap": match settings.overlap { Overlap::Skip => "skip", Overlap::Allow => "allow" },
                    "reservations": log.entries,
                }),
            ),
            Err(e) => web::storage_unavailable(&e),
        };
    }
    let at_time = match tick_time(request) {
        Ok(t) => t.unwrap_or(ctx.now),
        Err(m) => return web::error(StatusCode::BAD_REQUEST, "invalid_tick", m),
    };
    // The tick token names only the occurrence due now by this instance's clock (give or take
    // the tick tolerance); any other, past or future, is a manual run: the admin token's.
    if !settings.due_now(at_time, ctx.now) {
        if let Err(r) = auth::require_admin(
            ctx.variables,
            power,
            "a tick naming an occurrence other than the one due now (a manual run)",
        ) {
            return r;
        }
    }
    let tick = Tick {
        at: at_time,
        source: Source::Http,
        past_due: false,
    };
    let outcome = self::tick(ctx, &settings, &tick).await;
    let (status, v) = describe(&settings, &tick, &outcome, started);
    ScheduledJob::log(&v);
    let mut r = web::json(status, &v);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        let wait = v["retryAfterSeconds"].as_u64().unwrap_or(1).to_string();
        r.headers_mut().insert("retry-after", &wait);
    }
    r
}

/// The body of an HTTP tick: `{"at": "2026-11-21T14:55:00Z"}`, `at` optional. Any other field
/// is a caller's mistake (a misspelt `at` would tick now), so it is refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TickBody {
    #[serde(default, deserialize_with = "tick_at")]
    at: Option<String>,
}

/// `at`: a string or `null`; any other type is refused in fixed words naming the field
/// (serde's own would say only `invalid type: integer 5, expected a string`).
fn tick_at<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
        .map_err(|_| <D::Error as serde::de::Error>::custom("at must be a string"))
}

/// The longest part of a refused body's error that an answer repeats (serde's messages quote
/// what they refuse, a field name as long as the body included).
const MAX_ERROR_CHARS: usize = 200;

/// The optional `{"at": "RFC 3339"}` of a tick body (none when the body is empty).
fn tick_time(request: &Request) -> Result<Option<SystemTime>, String> {
    if request.body().iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if request.body().len() > MAX_BODY_BYTES {
        return Err(format!("the body may be at most {MAX_BODY_BYTES} bytes"));
    }
    let shown = |e: serde_json::Error| {
        let mut e = e.to_string();
        if let Some((cut, _)) = e.char_indices().nth(MAX_ERROR_CHARS) {
            e.truncate(cut);
            e.push_str("...");
        }
        e
    };
    let value: Value = serde_json::from_slice(request.body())
        .map_err(|e| format!("the body is not valid JSON: {}", shown(e)))?;
    // An object only: serde would also take a struct from an array (`["..."]`).
    if !value.is_object() {
        return Err(r#"the body must be a JSON object {"at": "<RFC 3339 time>"}"#.into());
    }
    let body = TickBody::deserialize(&value)
        .map_err(|e| format!("the body is not a tick: {}", shown(e)))?;
    match body.at {
        None => Ok(None),
        Some(s) => timer::parse_time(&s)
            .map(Some)
            .ok_or_else(|| "at must be an RFC 3339 time (2026-11-21T14:55:00Z)".to_string()),
    }
}

#[cfg(test)]
mod record_tests {
    use super::*;

    /// A log as the versions before serde wrote it (their own JSON writer): a run, a failure,
    /// an overlap skip (no fencing token, no end).
    const OLD_LOG: &str = r#"{
  "job": "nightly",
  "entries": [
    {
      "occurrence": "2026-11-21T14:55:00Z",
      "occurrenceUnix": 1795359300,
      "instance": "node-a",
      "reservedAt": "2026-11-21T14:55:00.412Z",
      "status": "succeeded",
      "fencingToken": 117660667084800,
      "trigger": "cron",
      "pastDue": false,
      "finishedAt": "2026-11-21T14:55:01.020Z"
    },
    {
      "occurrence": "2026-11-21T14:54:00Z",
      "occurrenceUnix": 1795359240,
      "instance": "node-b",
      "reservedAt": "2026-11-21T14:54:00.101Z",
      "status": "failed",
      "fencingToken": 117660663152640,
      "trigger": "azure",
      "pastDue": true,
      "finishedAt": "2026-11-21T14:54:30.500Z",
      "reason": "the job answered 500"
    },
    {
      "occurrence": "2026-11-21T14:53:00Z",
      "occurrenceUnix": 1795359180,
      "instance": "node-a",
      "reservedAt": "2026-11-21T14:53:00.007Z",
      "status": "skipped_overlap",
      "trigger": "http",
      "pastDue": false,
      "reason": "the previous run still holds the job's lease"
    }
  ],
  "cleanedBefore": 1795355700
}"#;

    #[test]
    fn old_logs_read_and_are_written_back_byte_for_byte() {
        let log: Log = serde_json::from_str(OLD_LOG).unwrap();
        assert_eq!(log.job, "nightly");
        assert_eq!(log.cleaned_before, 1_795_355_700);
        assert_eq!(log.entries.len(), 3);
        assert_eq!(
            log.entries[1],
            Entry {
                occurrence: "2026-11-21T14:54:00Z".into(),
                occurrence_unix: 1_795_359_240,
                instance: "node-b".into(),
                reserved_at: "2026-11-21T14:54:00.101Z".into(),
                status: "failed".into(),
                fencing_token: Some(occurrence_token(1_795_359_240).unwrap()),
                trigger: "azure".into(),
                past_due: true,
                finished_at: Some("2026-11-21T14:54:30.500Z".into()),
                reason: Some("the job answered 500".into()),
            }
        );
        assert_eq!(log.entries[2].fencing_token, None);
        assert_eq!(log.entries[2].finished_at, None);
        // What this version writes is what the old one wrote (and reads).
        let written = serde_json::to_vec_pretty(&log).unwrap();
        assert_eq!(String::from_utf8(written).unwrap(), OLD_LOG);
        let empty = Log {
            job: "x".into(),
            ..Log::default()
        };
        assert_eq!(
            serde_json::to_string_pretty(&empty).unwrap(),
            "{\n  \"job\": \"x\",\n  \"entries\": [],\n  \"cleanedBefore\": 0\n}"
        );
    }

    #[test]
    fn logs_of_other_versions_read() {
        // The first versions wrote no watermark; a newer one may add fields; absent options
        // and nulls are absent.
        let log: Log = serde_json::from_str(
            r#"{"job": "j", "addedLater": [1], "entries": [{"occurrence": "1970-01-01T00:01:00Z",
              "occurrenceUnix": 60, "instance": "i", "reservedAt": "1970-01-01T00:01:00Z",
              "status": "running", "trigger": "cron", "reason": null, "note": "new"}]}"#,
        )
        .unwrap();
        assert_eq!(log.cleaned_before, 0);
        let e = &log.entries[0];
        assert_eq!((e.occurrence_unix, e.past_due), (60, false));
        assert_eq!((&e.fencing_token, &e.reason), (&None, &None));
        // A log without its job or with a broken entry is refused, not half read.
        assert!(serde_json::from_str::<Log>(r#"{"entries": []}"#).is_err());
        assert!(serde_json::from_str::<Log>(r#"{"job": "j", "entries": [{}]}"#).is_err());
    }

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

    fn tick_body(body: &str) -> Result<Option<SystemTime>, String> {
        let request = Request::new(leasegate::Method::POST, "/api/jobs/j/tick")
            .with_body(body.as_bytes().to_vec());
        tick_time(&request)
    }

    #[test]
    fn tick_bodies() {
        assert_eq!(tick_body(""), Ok(None));
        assert_eq!(tick_body(" \n"), Ok(None));
        assert_eq!(tick_body("{}"), Ok(None));
        assert_eq!(tick_body(r#"{"at": null}"#), Ok(None));
        assert_eq!(
            tick_body(r#"{"at": "1970-01-01T00:01:00Z"}"#),
            Ok(Some(at(60)))
        );
        for (body, names) in [
            (r#"{"at": "yesterday"}"#, "RFC 3339"),
            (r#"{"at": 60}"#, "at must be a string"),
            (r#"{"at": {}}"#, "at must be a string"),
            (
                r#"{"when": "1970-01-01T00:01:00Z"}"#,
                "unknown field `when`",
            ),
            (r#"["1970-01-01T00:01:00Z"]"#, r#"a JSON object {"at""#),
            ("at=60", "not valid JSON"),
            (r#"{"at": "1970-01-01T00:01:00Z"} x"#, "trailing characters"),
        ] {
            let e = tick_body(body).unwrap_err();
            assert!(e.contains(names), "{body}: {e}");
        }
        // A long stray field is not repeated whole.
        let long = format!(r#"{{"{}": 1}}"#, "a".repeat(10_000));
        let e = tick_body(&long).unwrap_err();
        assert!(e.len() < 300 && e.ends_with("..."), "{e}");
    }
}

// The Spin entry points.
#[cfg(target_arch = "wasm32")]
#[spin_sdk::http_component]
async fn handle_request(
    request: spin_sdk::http::IncomingRequest,
    out: spin_sdk::http::ResponseOutparam,
) {
    use leasegate_spin::{spin, timer};
    spin::serve(
        request,
        out,
        MAX_BODY_BYTES,
        timer::handle_http::<ScheduledJob, _>,
    )
    .await
}
#[cfg(target_arch = "wasm32")]
leasegate_spin::cron_export!(leasegate_spin::timer::handle_cron::<crate::ScheduledJob, _>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_terms_round_up_to_whole_seconds() {
        let secs = Duration::from_secs;
        // 30 + 4 x 5.1 + 10 = 60.4 s: a 61 s record, not an error.
        assert_eq!(
            lease_term(secs(30), Duration::from_millis(5100)).unwrap(),
            Term::Record(secs(61))
        );
        assert_eq!(
            lease_term(secs(30), Duration::from_millis(5000)).unwrap(),
            Term::Native(leasegate::LeaseDuration::Seconds(60))
        );
        // Every setting in range gives a usable term (storage_timeout_ms: 100..=60000).
        for t in [1, 30, 3600] {
            for ms in [100, 101, 5100, 33_333, 60_000] {
                assert!(
                    lease_term(secs(t), Duration::from_millis(ms)).is_ok(),
                    "{t} {ms}"
                );
            }
        }
    }

    fn settings(period: u64, offset: u64, early: u64) -> Settings {
        let vars: std::collections::HashMap<String, String> = [
            ("instance_id", "node-u"),
            ("job_url", "http://127.0.0.1:9/job"),
            ("storage_origin", "http://127.0.0.1:10000"),
            ("storage_account", "devstoreaccount1"),
            ("storage_key", leasegate::account::DEV_ACCOUNT_KEY),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain([
            ("job_period_seconds".to_string(), period.to_string()),
            ("job_offset_seconds".to_string(), offset.to_string()),
            ("job_early_seconds".to_string(), early.to_string()),
        ])
        .collect();
        Settings::load(&vars).unwrap()
    }

    #[test]
    fn the_tick_token_names_the_occurrence_due_now() {
        // A per-minute job with the default job_early_seconds (300): 10 s of tolerance.
        let s = settings(60, 0, 300);
        assert_eq!(s.tick_tolerance(), Duration::from_secs(10));
        let now = at(1_795_765_625); // 5 s past the minute 1_795_765_620
                                     // Exactly: the occurrence of now, or of a time within the tolerance of now.
        assert!(s.due_now(at(1_795_765_620), now));
        assert!(!s.due_now(at(1_795_765_680), now));
        assert!(!s.due_now(at(1_795_765_560), now));
        // Near a boundary (3 s before the half minute), the neighbour is due too.
        let edge = at(1_795_765_647);
        assert!(s.due_now(at(1_795_765_620), edge) && s.due_now(at(1_795_765_680), edge));
        // A per-5-second job: at most half a period of tolerance, so never two ahead.
        let fast = settings(5, 0, 300);
        assert_eq!(fast.tick_tolerance(), Duration::from_millis(2500));
        assert!(!fast.due_now(at(1_795_765_630), at(1_795_765_620)));
        // A small job_early_seconds is the tolerance.
        assert_eq!(settings(60, 0, 3).tick_tolerance(), Duration::from_secs(3));
    }

    #[test]
    fn next_occurrences_follow_period_and_offset() {
        let s = settings(60, 7, 300);
        assert_eq!(s.next_occurrence(0), 7);
        assert_eq!(s.next_occurrence(7), 67);
        assert_eq!(s.next_occurrence(66), 67);
        assert_eq!(s.next_occurrence(100), 127);
        // Off the grid (a period changed): the next point of today's grid.
        assert_eq!(settings(5, 0, 300).next_occurrence(61), 65);
    }

    fn entry_at(o: u64, status: &str) -> Entry {
        Entry {
            occurrence: rfc3339(at(o)),
            occurrence_unix: o,
            instance: "i".into(),
            reserved_at: rfc3339(at(o)),
            status: status.into(),
            fencing_token: None,
            trigger: "cron".into(),
            past_due: false,
            finished_at: None,
            reason: None,
        }
    }

    #[test]
    fn the_settled_watermark_moves_over_logged_occurrences_only() {
        let s = settings(60, 0, 300);
        // A log of an older version (no watermark): it starts at the newest earlier entry.
        let mut log = Log {
            job: "j".into(),
            entries: vec![entry_at(600, "running"), entry_at(540, "succeeded")],
            ..Log::default()
        };
        advance_settled(&mut log, &s, 600, 0);
        assert_eq!(log.settled_through, 600);
        // 660 has no entry (abandoned, or nobody ticked): the watermark stops before it even
        // when 720 is logged.
        log.entries.push(entry_at(720, "running"));
        advance_settled(&mut log, &s, 720, 0);
        assert_eq!(log.settled_through, 600);
        // Settled by a winner (through 660): it moves on over 720.
        advance_settled(&mut log, &s, 720, 660);
        assert_eq!(log.settled_through, 720);
        // A new log starts at the occurrence before the first.
        let mut new = Log::default();
        new.entries.push(entry_at(1200, "running"));
        advance_settled(&mut new, &s, 1200, 0);
        assert_eq!(new.settled_through, 1200);
        // Never more than SETTLE_LOOKBACK occurrences behind.
        let mut far = Log {
            settled_through: 60,
            ..Log::default()
        };
        far.entries.push(entry_at(60 * 1000, "running"));
        advance_settled(&mut far, &s, 60 * 1000, 0);
        assert_eq!(far.settled_through, 60 * (1000 - SETTLE_LOOKBACK));
        // Below the clean-up watermark counts as settled.
        let mut cleaned = Log {
            settled_through: 600,
            cleaned_before: 800,
            ..Log::default()
        };
        cleaned.entries.push(entry_at(840, "running"));
        advance_settled(&mut cleaned, &s, 840, 0);
        assert_eq!(cleaned.settled_through, 840);
        // Written only once known: an old log is written back as it was.
        assert!(!serde_json::to_string(&Log::default())
            .unwrap()
            .contains("settledThrough"));
        assert!(serde_json::to_string(&log)
            .unwrap()
            .contains("\"settledThrough\":720"));
    }

    #[test]
    fn tokens_rise_with_the_occurrence() {
        let a = occurrence_token(1_795_574_280).unwrap();
        let b = occurrence_token(1_795_574_281).unwrap();
        assert!(a < b);
        assert!(occurrence_token(u64::MAX / 2).is_err());
    }
}
