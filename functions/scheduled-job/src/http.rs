//! The HTTP API, `POST /api/jobs/{job}/tick` and `GET /api/jobs/{job}`, and a tick's answer.

use leasegate::{Request, Response, StatusCode, Transport};
use leasegate_spin::timer::{self, Source, Tick};
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{auth, elapsed_ms, Context};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Instant, SystemTime};

use crate::log::read_log;
use crate::run::{tick, Decision, TickOutcome};
use crate::settings::{check_job_name, Overlap, Settings};
use crate::{at, ScheduledJob, MAX_BODY_BYTES};
use leasegate_spin::timer::TimerFunction;

/// The answer for a tick: its status (2xx when the occurrence is settled: run here, run
/// elsewhere, skipped on purpose) and a JSON value with the decision.
pub fn describe(
    settings: &Settings,
    tick: &Tick,
    outcome: &TickOutcome,
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
            v["error"] = json!(e.code());
            v["message"] = json!(e.message("the job did not run"));
            e.status()
        }
    };
    (status, v)
}

pub(crate) async fn api<T: Transport>(
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
        let blobs = settings.storage.blobs(&transport);
        return match read_log(&blobs, &settings, ctx.now).await {
            Ok((log, _, _)) => web::json(
                StatusCode::OK,
                &json!({
                    "job": settings.job,
                    "periodSeconds": settings.period.as_secs(),
                    "overlap": match settings.overlap { Overlap::Skip => "skip", Overlap::Allow => "allow" },
                    "reservations": log.entries,
                }),
            ),
            Err(e) => e.answer(),
        };
    }
    let at_time = match tick_time(request) {
        Ok(t) => t.unwrap_or(ctx.now),
        Err(m) => return web::error(StatusCode::BAD_REQUEST, "invalid_tick", m),
    };
    // The tick token names only the occurrence due now by this instance's clock (give or take
    // the tick tolerance, never one more than that ahead); any other, past or future, is a
    // manual run: the admin token's.
    let at_time = match settings.due_now(at_time, ctx.now) {
        Some(due) => due,
        None => {
            if let Err(r) = auth::require_admin(
                ctx.variables,
                power,
                "a tick naming an occurrence other than the one due now (a manual run)",
            ) {
                return r;
            }
            at_time
        }
    };
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
pub(crate) struct TickBody {
    #[serde(default, deserialize_with = "tick_at")]
    at: Option<String>,
}

/// `at`: a string or `null`; any other type is refused in fixed words naming the field
/// (serde's own would say only `invalid type: integer 5, expected a string`).
pub(crate) fn tick_at<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
        .map_err(|_| <D::Error as serde::de::Error>::custom("at must be a string"))
}

/// The longest part of a refused body's error that an answer repeats (serde's messages quote
/// what they refuse, a field name as long as the body included).
pub(crate) const MAX_ERROR_CHARS: usize = 200;

/// The optional `{"at": "RFC 3339"}` of a tick body (none when the body is empty).
pub(crate) fn tick_time(request: &Request) -> Result<Option<SystemTime>, String> {
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
mod tests {
    use super::*;

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
