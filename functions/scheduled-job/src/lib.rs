//! `scheduled-job`: a job deployed on several nodes for redundancy runs each scheduled
//! occurrence on exactly one of them.
//!
//! A tick (Spin's cron trigger, an Azure Functions timer, `POST /api/jobs/{job}/tick`: the
//! toolkit's [`leasegate_spin::timer`] shell, [`ScheduledJob`] below) names a trigger time; the
//! **occurrence** is that time rounded to the nearest multiple of the job's period, so
//! deployments whose clocks or triggers differ by less than half a period agree on it. The tick
//! reserves the occurrence (a blob created only if absent), takes the job's lease, writes the
//! outcome `running` on the reservation by compare-and-swap (the one tick that writes it runs the
//! job), logs, runs the job with a fencing token and an idempotency key, releases the lease and
//! records the result. At most once, never twice. The steps, numbered once, and every rule are in
//! `docs/timer-functions.md` ("A tick, step by step").
//!
//! One component runs one job (the `job_*` variables) or every job of the `jobs` table
//! (`table`): a trigger ticks the jobs that are due (`due`, `many`), and each job has its
//! routes under `/api/jobs/{job}`.
//!
//! The modules: `table` (the jobs), `settings` (a job's settings), `error` (its errors and their answers),
//! `reservation` (the record of whether an occurrence ran), `log` (the reservation log, a view
//! of the last 10), `run` (a tick, step by step), `walk` (after a winning run: the earlier
//! occurrences no tick settled), `backfill` (a range run on purpose), `rerun` (one more attempt
//! of an occurrence, on purpose), `http` (the HTTP API and a tick's answer).
#![deny(missing_docs)]
// Helpers return `Err(Response)`: the finished 4xx answer, once per request.
#![allow(clippy::result_large_err)]

use std::time::{Instant, SystemTime};

use leasegate::{Request, Response, StatusCode, Transport};
use serde_json::Value;

use leasegate_spin::auth::Power;
use leasegate_spin::config::{ConfigError, Variables};
use leasegate_spin::timer::{self, Tick, TimerFunction};
use leasegate_spin::{log_line, Context};

mod attempt;
mod backfill;
mod due;
mod error;
mod http;
mod log;
mod many;
mod rerun;
mod reservation;
mod run;
mod settings;
mod table;
mod walk;

pub use attempt::skip::Skip;
pub use error::JobError;
pub use http::describe;
pub use log::{read_log, Counters, Log, LogEntry};
pub use reservation::{occurrence_token, RunStatus};
pub use run::{idempotency_key, tick, Ask, Decision, TickOutcome};
pub use settings::{check_job_name, lease_term, CatchUp, Overlap, Settings};
pub use table::{Job, Jobs, KEYS};
pub use walk::CatchUpReport;

/// Entries the reservation log keeps (the toolkit's record schema says).
pub use leasegate_spin::record::LOG_ENTRIES;

/// The longest job name, in bytes.
pub const MAX_JOB_NAME: usize = leasegate_spin::config::MAX_NAME;

/// Route prefix of the HTTP API.
pub const ROUTE_PREFIX: &str = "/api/jobs/";

/// The HTTP API's route.
pub const ROUTE: &str = "/api/jobs";

use leasegate::time::{at_unix_secs as at, unix_secs as unix};

/// The largest request body the HTTP routes read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// scheduled-job as a timer function: ticked by Spin's cron trigger (`Err` when the occurrence
/// was not settled: the job failed, storage failed, misconfiguration), an Azure Functions
/// timer, or `POST /api/jobs/{job}/tick`.
pub struct ScheduledJob;

impl TimerFunction for ScheduledJob {
    const NAME: &'static str = "scheduled-job";
    const ROUTES: &'static [&'static str] = &[ROUTE];
    type Settings = Jobs;
    type Answer = Value;

    fn load(vars: &dyn Variables) -> Result<Jobs, ConfigError> {
        Jobs::load(vars)
    }

    /// The job, as `job_name` names it (so a line about settings that cannot be used says
    /// which job's); none when the `jobs` table names the jobs (its error names the job).
    fn names(vars: &dyn Variables) -> Vec<(&'static str, String)> {
        if leasegate_spin::config::var(vars, "jobs").is_some() {
            return Vec::new();
        }
        let job = leasegate_spin::config::var(vars, "job_name").unwrap_or_else(|| "job".into());
        vec![("job", job)]
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

    /// The one job of the `job_*` variables, as ever; with a `jobs` table, every job due.
    async fn tick<T: Transport>(
        ctx: &Context<'_, T>,
        jobs: &Jobs,
        tick: &Tick,
        started: Instant,
    ) -> (StatusCode, Value) {
        match jobs.single() {
            Some(settings) => {
                let outcome = run::tick(ctx, settings, tick, Ask::default()).await;
                describe(settings, tick, &outcome, started)
            }
            None => many::tick_all(ctx, jobs, tick, tick.at, Ask::default(), started).await,
        }
    }

    fn summary(jobs: &Jobs, v: &Value) -> String {
        let Some(ticks) = v["ticks"].as_array() else {
            return summary_of(v);
        };
        let mut lines: Vec<String> = ticks.iter().map(summary_of).collect();
        if lines.is_empty() {
            lines.push(format!(
                "scheduled-job: none of {} jobs due",
                jobs.jobs.len()
            ));
        }
        lines.join("; ")
    }

    /// The log line of a tick: its answer without the entry, naming the function; with a
    /// `jobs` table, one line per job ticked (none when no job was due).
    fn log(v: &Value) {
        let one = |v: &Value| {
            let mut line = timer::with_fn(v, Self::NAME);
            if let Some(obj) = line.as_object_mut() {
                obj.shift_remove("entry");
            }
            log_line(line);
        };
        match v["ticks"].as_array() {
            Some(ticks) => ticks.iter().for_each(one),
            None => one(v),
        }
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
        http::api(ctx, request, rest, power, started).await
    }
}

/// An Azure Functions invocation's summary of one job's tick.
fn summary_of(v: &Value) -> String {
    format!(
        "scheduled-job {}: occurrence {} {} on {}",
        v["job"].as_str().unwrap_or(""),
        v["occurrence"].as_str().unwrap_or(""),
        v["decision"].as_str().or(v["error"].as_str()).unwrap_or(""),
        v["instance"].as_str().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 47, item 10: the cron trigger's `not_configured` line names the job.
    #[test]
    fn the_not_configured_line_names_the_job() {
        let vars: std::collections::HashMap<String, String> = [
            ("job_name", "invoice-export"),
            ("job_schedule", "0 61 * * * *"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let e = Settings::load(&vars).unwrap_err();
        let line = timer::not_configured_line::<ScheduledJob>(&vars, &e);
        assert_eq!(line["fn"], "scheduled-job");
        assert_eq!(line["job"], "invoice-export");
        assert_eq!(line["error"], "not_configured");
        assert!(
            line["message"].as_str().unwrap().contains("variable"),
            "{line}"
        );
    }
}

// The Spin entry points: the HTTP component (the routes and the Azure channel) and the cron
// trigger's export, both serving [`ScheduledJob`].
leasegate_spin::timer_export!(crate::ScheduledJob, MAX_BODY_BYTES);
