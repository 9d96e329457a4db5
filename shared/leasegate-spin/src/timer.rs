//! What the timer functions share: the three ways a tick arrives, the deployment's identity,
//! and the Azure Functions answer envelope.
//!
//! A timer function is invoked on a schedule by whatever runs it, on every redundant deployment
//! at once; the lease decides who acts. A tick comes
//! * from **Spin's cron trigger** (the `trigger-cron` plugin): `handle-cron-event` with the
//!   scheduled time in Unix seconds;
//! * from an **Azure Functions timer** (custom handler): `POST /{FunctionName}` with the
//!   invocation payload, answered with the `{"Outputs","Logs","ReturnValue"}` envelope;
//! * from **any HTTP scheduler** (a Kubernetes CronJob with curl): `POST .../tick`,
//!   bearer-protected.

use std::time::{Duration, Instant, SystemTime};

use leasegate::{Request, Response, StatusCode, Transport};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use crate::auth::{self, Power};
use crate::config::{self, ConfigError, Variables};
use crate::{log_line, web, Context};

/// A timer function: what it writes so that the three ways a tick arrives reach it through one
/// shell ([`handle_cron`], [`handle_http`]): its name and routes, its settings, its tick, and
/// what its answer says. Ours (scheduled-job, leader, init-once, ttl-sweeper) and a user's are
/// written the same way.
///
/// The shell reads the settings (a `not_configured` log line, or answer, when they cannot be
/// used), authenticates the function's routes with the tick or admin token before anything
/// else, serves the Azure Functions timer channel only where it is turned on, writes one log
/// line per tick and answers in the form each trigger expects.
// A Spin instance runs one invocation on one thread: the futures need no `Send` bound.
#[allow(async_fn_in_trait)]
pub trait TimerFunction {
    /// The function's name in log lines (`"fn"`) and in messages.
    const NAME: &'static str;
    /// The function's HTTP routes: a path is the function's when it is a route (with or without
    /// a trailing `/`) or below it. Every other path is the Azure Functions timer channel.
    const ROUTES: &'static [&'static str];
    /// Its settings.
    type Settings;
    /// What a tick answers (and logs).
    type Answer: serde::Serialize;

    /// Reads the settings.
    fn load(vars: &dyn Variables) -> Result<Self::Settings, ConfigError>;

    /// The trigger time of a cron event at `timestamp` (Unix seconds): by default the
    /// instance's clock, `now` (a function whose tick asks "what now?" needs no more); `Err`
    /// refuses the event with that message.
    fn cron_time(timestamp: u64, now: SystemTime) -> Result<SystemTime, String> {
        let _ = timestamp;
        Ok(now)
    }

    /// What the function acts on, for the log line of settings that cannot be used (a job's
    /// `job`, say), read from the variables as far as they go. None by default.
    fn names(vars: &dyn Variables) -> Vec<(&'static str, String)> {
        let _ = vars;
        Vec::new()
    }

    /// One tick: its status and answer.
    async fn tick<T: Transport>(
        ctx: &Context<'_, T>,
        settings: &Self::Settings,
        tick: &Tick,
        started: Instant,
    ) -> (StatusCode, Self::Answer);

    /// Why a tick that did not answer 2xx failed: the cron trigger's error. By default the
    /// answer's `message`, else "the tick failed".
    fn failure(answer: &Self::Answer) -> String {
        serde_json::to_value(answer)
            .ok()
            .and_then(|v| v.get("message")?.as_str().map(str::to_string))
            .unwrap_or_else(|| "the tick failed".to_string())
    }

    /// The one-line summary of an Azure Functions invocation's `Logs`.
    fn summary(settings: &Self::Settings, answer: &Self::Answer) -> String;

    /// The status an Azure Functions invocation answers for a tick's `status` (2xx: done).
    fn azure_status(status: StatusCode) -> StatusCode {
        status
    }

    /// Writes the tick's log line: its answer with `"fn"` last.
    fn log(answer: &Self::Answer) {
        log_line(with_fn(answer, Self::NAME));
    }

    /// Serves the function's routes ([`TimerFunction::ROUTES`]), once the caller has shown the
    /// tick or the admin token (`power`).
    async fn api<T: Transport>(
        ctx: &Context<'_, T>,
        request: &Request,
        power: Power,
        started: Instant,
    ) -> Response;
}

/// `answer` as a JSON object with `"fn": name` added last (a log line). An answer that is not
/// a JSON object (a user's string, list or number) is logged under `answer`.
pub fn with_fn(answer: &impl serde::Serialize, name: &str) -> serde_json::Value {
    let mut line = match serde_json::to_value(answer).unwrap_or_default() {
        line @ (serde_json::Value::Object(_) | serde_json::Value::Null) => line,
        other => serde_json::json!({ "answer": other }),
    };
    line["fn"] = serde_json::json!(name);
    line
}

/// Handles `handle-cron-event` (Spin's cron trigger) for `F`: one tick; `Err` when it did not
/// answer 2xx (the trigger logs it), or when the settings cannot be used (logged too).
pub async fn handle_cron<F: TimerFunction, T: Transport>(
    ctx: &Context<'_, T>,
    timestamp: u64,
) -> Result<(), String> {
    let started = Instant::now();
    let settings = F::load(ctx.variables).map_err(|e| {
        log_line(not_configured_line::<F>(ctx.variables, &e));
        e.to_string()
    })?;
    let tick = Tick {
        at: F::cron_time(timestamp, ctx.now)?,
        source: Source::Cron,
        past_due: false,
    };
    let (status, answer) = F::tick(ctx, &settings, &tick, started).await;
    F::log(&answer);
    if status.is_success() {
        Ok(())
    } else {
        Err(F::failure(&answer))
    }
}

/// The log line of a tick whose settings cannot be used: the function, what it acts on
/// ([`TimerFunction::names`]) and why.
pub fn not_configured_line<F: TimerFunction>(
    vars: &dyn Variables,
    e: &ConfigError,
) -> serde_json::Value {
    let mut line = serde_json::json!({"fn": F::NAME});
    for (key, value) in F::names(vars) {
        line[key] = serde_json::json!(value);
    }
    line["error"] = serde_json::json!("not_configured");
    line["message"] = serde_json::json!(e.to_string());
    line
}

/// Whether `path` is `route` (with or without a trailing `/`) or below it.
pub fn on_route(path: &str, route: &str) -> bool {
    path.trim_end_matches('/') == route
        || path
            .strip_prefix(route)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Handles a timer function's HTTP requests: its routes ([`TimerFunction::api`], after the
/// tick or admin token), and `POST /{FunctionName}` on any other path (an Azure Functions
/// timer invocation, served only where [`azure_channel`] is on).
pub async fn handle_http<F: TimerFunction, T: Transport>(
    ctx: &Context<'_, T>,
    request: Request,
) -> Response {
    let started = Instant::now();
    if F::ROUTES.iter().any(|r| on_route(request.path(), r)) {
        let power = match auth::authenticate_timer(ctx.variables, &request) {
            Ok(p) => p,
            Err(r) => return r,
        };
        return F::api(ctx, &request, power, started).await;
    }
    if !azure_channel(ctx.variables) {
        return no_route();
    }
    let (settings, tick) =
        match azure_invocation(ctx.variables, &request, ctx.now, F::NAME, F::load) {
            Ok(started_with) => started_with,
            Err(answer) => return answer,
        };
    let (status, answer) = F::tick(ctx, &settings, &tick, started).await;
    F::log(&answer);
    let summary = F::summary(&settings, &answer);
    azure_answer(F::azure_status(status), &answer, vec![summary])
}

/// Where a tick came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Spin's cron trigger.
    Cron,
    /// An Azure Functions timer invocation.
    Azure,
    /// An HTTP scheduler's `POST .../tick`.
    Http,
    /// A run an operator asked for (`POST /api/jobs/{job}/run`, an admin naming an
    /// occurrence): not a scheduler's.
    Manual,
    /// An operator's backfill of occurrences that never ran (`POST /api/jobs/{job}/backfill`).
    Backfill,
    /// An operator's one more attempt of a failed or missed occurrence
    /// (`POST /api/jobs/{job}/rerun`).
    Rerun,
}

impl Source {
    /// `cron`, `azure`, `http`, `manual`, `backfill` or `rerun`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Cron => "cron",
            Source::Azure => "azure",
            Source::Http => "http",
            Source::Manual => "manual",
            Source::Backfill => "backfill",
            Source::Rerun => "rerun",
        }
    }
}

/// One tick of a timer function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// The trigger time: the second the cron trigger fired, the invocation's `UtcNow`
    /// (Azure), the time given by the caller or the instance's clock (HTTP).
    pub at: SystemTime,
    /// Where it came from.
    pub source: Source,
    /// Azure's `IsPastDue`: the invocation is late (the host was down or busy).
    pub past_due: bool,
}

/// The longest instance id, in bytes.
pub const MAX_INSTANCE_ID: usize = 64;

/// The deployment's identity, `instance_id`: required by timer functions, 1 to 64 letters,
/// digits, `.`, `_` or `-`.
pub fn instance_id(vars: &dyn Variables) -> Result<String, ConfigError> {
    let id = config::var(vars, "instance_id").ok_or_else(|| {
        ConfigError(
            "instance_id is not set: give every deployment its own name (spin up --variable \
             instance_id=node-a, or SPIN_VARIABLE_INSTANCE_ID)"
                .into(),
        )
    })?;
    let valid = id.len() <= MAX_INSTANCE_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if valid {
        Ok(id)
    } else {
        Err(ConfigError(format!(
            "variable instance_id must be 1 to {MAX_INSTANCE_ID} letters, digits, '.', '_' or '-'"
        )))
    }
}

/// The occurrence a trigger time stands for: the nearest multiple of `period` since the Unix
/// epoch (plus `offset`). Deployments whose clocks or triggers differ by less than half a
/// period agree on it.
pub fn occurrence(at: SystemTime, period: Duration, offset: Duration) -> SystemTime {
    let p = period.as_secs().max(1);
    let o = offset.as_secs() % p;
    let t = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let n = ((t - o as f64) / p as f64).round().max(0.0) as u64;
    SystemTime::UNIX_EPOCH + Duration::from_secs(n.saturating_mul(p).saturating_add(o))
}

/// The storage server's time now, as far as an instance can tell without a request: `date`
/// (a `Date` storage answered) plus the time since that answer came (`answered`, this
/// instance's monotonic clock), in whole seconds, rounded down as a `Date` is. It never runs
/// ahead of storage's clock; it lags it by the answer's latency and the rounding.
pub fn server_time_since(date: SystemTime, answered: Instant) -> SystemTime {
    let now = date + answered.elapsed();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// Reads a time as Azure Functions writes them, leniently: RFC 3339 with any fraction and `Z`,
/// `+00:00`, another offset or none (UTC), `T` or a space between date and time.
pub fn parse_time(s: &str) -> Option<SystemTime> {
    // Times before 1970 are refused too: nothing leasegate keeps is that old, and they cannot
    // be written back in the forms the answers use.
    parse_any_time(s.trim()).filter(|t| *t <= latest_time() && *t >= SystemTime::UNIX_EPOCH)
}

/// The latest trigger time accepted: 9000-01-01 (occurrences, expiries and the log's times
/// stay writable in RFC 3339).
pub fn latest_time() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(221_845_392_000)
}

fn parse_any_time(s: &str) -> Option<SystemTime> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Some(t);
    }
    // An offset other than +00:00: `...+02:00` or `...-05:30`.
    let split = s
        .len()
        .checked_sub(6)
        .filter(|i| s.is_char_boundary(*i))
        .map(|i| s.split_at(i));
    let (base, sign, offset) = match split {
        Some((base, off)) if off.starts_with(['+', '-']) && off.as_bytes()[3] == b':' => (
            base,
            if off.starts_with('+') { 1i64 } else { -1 },
            &off[1..],
        ),
        _ => return None,
    };
    let hours: i64 = offset[..2].parse().ok()?;
    let minutes: i64 = offset[3..].parse().ok()?;
    let local = humantime::parse_rfc3339_weak(base).ok()?;
    let shift = Duration::from_secs(u64::try_from(hours * 3600 + minutes * 60).ok()?);
    // Local time = UTC + offset, so UTC = local - offset.
    if sign > 0 {
        local.checked_sub(shift)
    } else {
        local.checked_add(shift)
    }
}

/// Reads an Azure Functions timer invocation body (`{"Data":{"timer":{...}},"Metadata":{...}}`)
/// leniently: the trigger time is `Metadata.sys.UtcNow`, else the timer's `ScheduleStatus.Next`
/// or `Last`, else `fallback` (the instance's clock); `IsPastDue` may be missing, a boolean or
/// a string; `ScheduleStatus` may be null. `Err` says what is wrong with the body, naming the
/// field.
pub fn parse_azure_timer(body: &[u8], fallback: SystemTime) -> Result<Tick, String> {
    let not_json = |e| format!("the invocation body is not JSON: {e}");
    // A struct also reads from an array: refuse anything but an object first.
    if !body.trim_ascii_start().starts_with(b"{") {
        serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(not_json)?;
        return Err("the invocation body must be a JSON object".into());
    }
    let invocation: Invocation = serde_json::from_slice(body).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            not_json(e)
        } else {
            format!("the invocation body is not a timer invocation: {e}")
        }
    })?;
    let timer = invocation.timer;
    // The invocation's own fields first, then the same ones inside the timer's value; UtcNow,
    // else Next, else Last. Only the one chosen has to be a time: .NET writes a timer that
    // never ran as `Last: 0001-01-01T00:00:00`, which is no time here.
    let chosen = [
        ("Metadata/sys/UtcNow", invocation.metadata.sys.utc_now),
        ("Metadata/sys/UtcNow", timer.metadata.sys.utc_now),
        ("ScheduleStatus/Next", invocation.schedule_status.next),
        ("ScheduleStatus/Next", timer.schedule_status.next),
        ("ScheduleStatus/Last", invocation.schedule_status.last),
        ("ScheduleStatus/Last", timer.schedule_status.last),
    ]
    .into_iter()
    .find_map(|(name, text)| Some((name, text.filter(|s| !s.trim().is_empty())?)));
    let at = match chosen {
        Some((name, text)) => parse_time(&text).ok_or_else(|| format!("{name} is not a time"))?,
        None => fallback,
    };
    Ok(Tick {
        at,
        source: Source::Azure,
        past_due: timer.is_past_due,
    })
}

/// An Azure Functions invocation: [the custom handler's request
/// payload](https://learn.microsoft.com/azure/azure-functions/functions-custom-handlers#request-payload).
/// Every field may be missing; fields not read are ignored.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Invocation {
    /// The trigger's binding (named `timer` in this app's `function.json`, but any name is
    /// taken when it is the only one).
    #[serde(rename = "Data", deserialize_with = "timer_binding")]
    timer: TimerInfo,
    #[serde(rename = "Metadata", deserialize_with = "object_or_default")]
    metadata: InvocationMetadata,
    /// Not where Azure writes it, but read there too.
    #[serde(rename = "ScheduleStatus", deserialize_with = "object_or_default")]
    schedule_status: ScheduleStatus,
}

/// The timer binding's value: `TimerInfo`.
#[derive(Default, Deserialize)]
#[serde(default)]
struct TimerInfo {
    #[serde(rename = "ScheduleStatus", deserialize_with = "object_or_default")]
    schedule_status: ScheduleStatus,
    #[serde(rename = "IsPastDue", deserialize_with = "past_due")]
    is_past_due: bool,
    /// Not where Azure writes it, but read there too.
    #[serde(rename = "Metadata", deserialize_with = "object_or_default")]
    metadata: InvocationMetadata,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct ScheduleStatus {
    #[serde(rename = "Next", deserialize_with = "next")]
    next: Option<String>,
    #[serde(rename = "Last", deserialize_with = "last")]
    last: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct InvocationMetadata {
    #[serde(deserialize_with = "object_or_default")]
    sys: Sys,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Sys {
    #[serde(rename = "UtcNow", deserialize_with = "utc_now")]
    utc_now: Option<String>,
}

/// `Data`: the binding named `timer`, else the first one. Its value may also arrive as a JSON
/// string holding the object. Anything that is not an object reads as an empty timer.
fn timer_binding<'de, D: Deserializer<'de>>(d: D) -> Result<TimerInfo, D::Error> {
    let data = serde_json::Value::deserialize(d)?;
    let Some(bindings) = data.as_object() else {
        return Ok(TimerInfo::default());
    };
    let binding = bindings
        .get("timer")
        .or_else(|| bindings.values().next())
        .cloned();
    let value = match binding {
        Some(serde_json::Value::String(s)) => serde_json::from_str(&s).unwrap_or_default(),
        Some(v) => v,
        None => return Ok(TimerInfo::default()),
    };
    if value.is_object() {
        TimerInfo::deserialize(value).map_err(D::Error::custom)
    } else {
        Ok(TimerInfo::default())
    }
}

/// An object read as `T`; `null` or anything else that is not an object as `T`'s default.
fn object_or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + serde::de::DeserializeOwned,
{
    let value = serde_json::Value::deserialize(d)?;
    if value.is_object() {
        T::deserialize(value).map_err(D::Error::custom)
    } else {
        Ok(T::default())
    }
}

/// `IsPastDue`: missing or `null` (false), a boolean, or `"true"`/`"false"` in any case.
fn past_due<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Flag {
        Bool(bool),
        Text(String),
    }
    match Option::<Flag>::deserialize(d) {
        Ok(None) => Ok(false),
        Ok(Some(Flag::Bool(b))) => Ok(b),
        Ok(Some(Flag::Text(s))) if s.eq_ignore_ascii_case("true") => Ok(true),
        Ok(Some(Flag::Text(s))) if s.eq_ignore_ascii_case("false") => Ok(false),
        _ => Err(D::Error::custom("IsPastDue must be true or false")),
    }
}

fn utc_now<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    time_field(d, "Metadata/sys/UtcNow")
}

fn next<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    time_field(d, "ScheduleStatus/Next")
}

fn last<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    time_field(d, "ScheduleStatus/Last")
}

/// A time field (`name` is its path, for the error): missing or `null` is `None`, a string is
/// kept as written (read by [`parse_time`] only if it is the field chosen), anything else is
/// refused.
fn time_field<'de, D: Deserializer<'de>>(d: D, name: &str) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
        .map_err(|_| D::Error::custom(format!("{name} must be a string")))
}

/// Whether this deployment takes Azure Functions timer invocations (`POST /{FunctionName}`):
/// only when `azure_functions` is `on`, which the Azure Functions deployment's manifest sets.
/// Anywhere else that path would be a public, unauthenticated way to tick the function.
pub fn azure_channel(vars: &dyn Variables) -> bool {
    config::var(vars, "azure_functions").as_deref() == Some("on")
}

/// The answer for a path that is neither the function's API nor (here) the Azure channel.
pub fn no_route() -> Response {
    web::error(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such route (the Azure Functions timer channel is on only in that deployment)",
    )
}

/// The start every timer function's Azure Functions invocation shares: POST only (405), the
/// function's settings read by `load` (503 `not_configured` in the envelope), the invocation
/// body read (400 `invalid_invocation` in the envelope, `fallback` the time when it names
/// none). `Err` is the finished answer; `function` names the function in its log lines.
pub fn azure_invocation<S>(
    vars: &dyn Variables,
    request: &Request,
    fallback: SystemTime,
    function: &str,
    load: impl FnOnce(&dyn Variables) -> Result<S, ConfigError>,
) -> Result<(S, Tick), Response> {
    if request.method() != leasegate::Method::POST {
        return Err(web::method_not_allowed("POST"));
    }
    let settings = load(vars).map_err(|e| {
        azure_answer(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"error": "not_configured", "message": e.to_string()}),
            vec![format!("{function}: {e}")],
        )
    })?;
    let tick = parse_azure_timer(request.body(), fallback).map_err(|m| {
        azure_answer(
            StatusCode::BAD_REQUEST,
            serde_json::json!({"error": "invalid_invocation", "message": m}),
            vec![format!("{function}: {m}")],
        )
    })?;
    Ok((settings, tick))
}

/// The answer to an Azure Functions invocation: `status` (2xx: done; any other marks the
/// invocation failed) and `{"Outputs":{},"Logs":[...],"ReturnValue":...}`. An empty body would
/// hang the invocation until the function timeout, so there is always one.
pub fn azure_answer(
    status: StatusCode,
    return_value: impl serde::Serialize,
    logs: Vec<String>,
) -> Response {
    web::json(
        status,
        &serde_json::json!({ "Outputs": {}, "Logs": logs, "ReturnValue": return_value }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    #[test]
    fn routes_are_the_route_or_below_it() {
        for (path, on) in [
            ("/api/jobs", true),
            ("/api/jobs/", true),
            ("/api/jobs//", true),
            ("/api/jobs/x/tick", true),
            ("/api/jobsx", false),
            ("/api/job", false),
            ("/scheduled-job", false),
            ("/", false),
        ] {
            assert_eq!(on_route(path, "/api/jobs"), on, "{path}");
        }
    }

    #[test]
    fn log_lines_end_with_the_function() {
        let line = with_fn(&serde_json::json!({"b": 1, "a": 2}), "leader");
        let keys: Vec<&String> = line.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["b", "a", "fn"]);
        // A user's answer that is not a JSON object is logged under `answer`, not a trap.
        for other in [
            serde_json::json!("done"),
            serde_json::json!([1, 2]),
            serde_json::json!(7),
        ] {
            let line = with_fn(&other, "mine");
            assert_eq!(line, serde_json::json!({"answer": other, "fn": "mine"}));
        }
        assert_eq!(
            with_fn(&serde_json::Value::Null, "mine"),
            serde_json::json!({"fn": "mine"})
        );
    }

    #[test]
    fn occurrences_round_to_the_nearest_period() {
        let p = Duration::from_secs(60);
        let zero = Duration::ZERO;
        let want = at("2026-11-21T14:55:00Z");
        for t in [
            "2026-11-21T14:54:31Z",
            "2026-11-21T14:54:58Z",
            "2026-11-21T14:55:00Z",
            "2026-11-21T14:55:02Z",
            "2026-11-21T14:55:29Z",
        ] {
            assert_eq!(occurrence(at(t), p, zero), want, "{t}");
        }
        assert_eq!(
            occurrence(at("2026-11-21T14:55:31Z"), p, zero),
            at("2026-11-21T14:56:00Z")
        );
        // Nightly at 02:00: a day's period, two hours' offset.
        let day = Duration::from_secs(86_400);
        assert_eq!(
            occurrence(at("2026-11-21T01:59:58Z"), day, Duration::from_secs(7200)),
            at("2026-11-21T02:00:00Z")
        );
    }

    #[test]
    fn azure_payloads_are_read_leniently() {
        let now = at("2026-11-21T00:00:00Z");
        let full = br#"{"Data":{"timer":{"Schedule":{"AdjustForDST":true},"ScheduleStatus":{"Last":"2026-11-21T14:50:00+00:00","Next":"2026-11-21T14:55:00+00:00","LastUpdated":"2026-11-21T14:50:00.0001234+00:00"},"IsPastDue":false}},"Metadata":{"sys":{"MethodName":"scheduled-job","UtcNow":"2026-11-21T14:55:00.0123456Z","RandGuid":"8c6cbf6e-d1f0-4b5b-9c1a-1f2e3d4c5b6a"}}}"#;
        let t = parse_azure_timer(full, now).unwrap();
        assert_eq!(t.source, Source::Azure);
        assert!(!t.past_due);
        let d = t.at.duration_since(at("2026-11-21T14:55:00Z")).unwrap();
        assert!(d < Duration::from_millis(20), "{d:?}");
        let null_status = br#"{"Data":{"timer":{"ScheduleStatus":null,"IsPastDue":"True"}},"Metadata":{"sys":{"UtcNow":"2026-11-21 14:55:00"}}}"#;
        let t = parse_azure_timer(null_status, now).unwrap();
        assert!(t.past_due);
        assert_eq!(t.at, at("2026-11-21T14:55:00Z"));
        let offset = br#"{"Metadata":{"sys":{"UtcNow":"2026-11-21T15:55:00+01:00"}}}"#;
        assert_eq!(
            parse_azure_timer(offset, now).unwrap().at,
            at("2026-11-21T14:55:00Z")
        );
        let only_next = br#"{"Data":{"timer":{"ScheduleStatus":{"Next":"2026-11-21T14:55:00Z"}}}}"#;
        assert_eq!(
            parse_azure_timer(only_next, now).unwrap().at,
            at("2026-11-21T14:55:00Z")
        );
        assert_eq!(parse_azure_timer(b"{}", now).unwrap().at, now);
        // A binding of another name, its value a JSON string holding the object.
        let renamed = br#"{"Data":{"myTimer":"{\"IsPastDue\":true,\"ScheduleStatus\":{\"Last\":\"2026-11-21T14:50:00Z\"}}"}}"#;
        let t = parse_azure_timer(renamed, now).unwrap();
        assert!(t.past_due);
        assert_eq!(t.at, at("2026-11-21T14:50:00Z"));
        // Fields this reader does not know, and containers of other kinds, are ignored.
        let odd = br#"{"Data":[],"Metadata":"x","Extra":{"IsPastDue":3}}"#;
        assert_eq!(parse_azure_timer(odd, now).unwrap().at, now);
        for (bad, want) in [
            (&b"nope"[..], "not JSON"),
            (b"[1]", "JSON object"),
            (b" \"x\"", "JSON object"),
            (b"{\"Data\":", "not JSON"),
            (br#"{"Data":{"timer":{"IsPastDue":3}}}"#, "IsPastDue"),
            (
                br#"{"Metadata":{"sys":{"UtcNow":"yesterday"}}}"#,
                "UtcNow is not a time",
            ),
            (
                br#"{"Metadata":{"sys":{"UtcNow":5}}}"#,
                "UtcNow must be a string",
            ),
        ] {
            let err = parse_azure_timer(bad, now).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn azure_times_not_chosen_need_not_parse() {
        let now = at("2026-11-21T00:00:00Z");
        // .NET's "never ran" Last, and UtcNow there: the tick is at UtcNow.
        let never_ran = br#"{"Data":{"timer":{"ScheduleStatus":{"Last":"0001-01-01T00:00:00","Next":"2026-11-21T14:55:00+00:00"},"IsPastDue":false}},"Metadata":{"sys":{"UtcNow":"2026-11-21T14:55:00Z"}}}"#;
        assert_eq!(
            parse_azure_timer(never_ran, now).unwrap().at,
            at("2026-11-21T14:55:00Z")
        );
        // No UtcNow: Next is chosen, the bad Last is not read.
        let no_now = br#"{"Data":{"timer":{"ScheduleStatus":{"Last":"garbage","Next":"2026-11-21T14:55:00Z"}}}}"#;
        assert_eq!(
            parse_azure_timer(no_now, now).unwrap().at,
            at("2026-11-21T14:55:00Z")
        );
        // The top-level UtcNow wins over a bad one inside the timer's value.
        let inner_bad = br#"{"Data":{"timer":{"Metadata":{"sys":{"UtcNow":"yesterday"}}}},"Metadata":{"sys":{"UtcNow":"2026-11-21T14:55:00Z"}}}"#;
        assert_eq!(
            parse_azure_timer(inner_bad, now).unwrap().at,
            at("2026-11-21T14:55:00Z")
        );
        // The chosen field must parse: Last when it is the only one.
        let only_last = br#"{"Data":{"timer":{"ScheduleStatus":{"Last":"0001-01-01T00:00:00"}}}}"#;
        let err = parse_azure_timer(only_last, now).unwrap_err();
        assert!(err.contains("ScheduleStatus/Last is not a time"), "{err}");
        // Only the timer's UtcNow, and it is bad.
        let only_inner = br#"{"Data":{"timer":{"Metadata":{"sys":{"UtcNow":"yesterday"}}}}}"#;
        let err = parse_azure_timer(only_inner, now).unwrap_err();
        assert!(err.contains("UtcNow is not a time"), "{err}");
        // A field of another type is refused even when not chosen, naming it.
        let number = br#"{"Data":{"timer":{"ScheduleStatus":{"Last":5}}},"Metadata":{"sys":{"UtcNow":"2026-11-21T14:55:00Z"}}}"#;
        let err = parse_azure_timer(number, now).unwrap_err();
        assert!(
            err.contains("ScheduleStatus/Last must be a string"),
            "{err}"
        );
    }

    #[test]
    fn instance_ids_are_required_and_checked() {
        let vars = |v: &str| -> std::collections::HashMap<String, String> {
            [("instance_id".to_string(), v.to_string())].into()
        };
        assert!(instance_id(&vars(""))
            .unwrap_err()
            .0
            .contains("instance_id is not set"));
        assert!(instance_id(&vars("node a")).is_err());
        assert!(instance_id(&vars(&"n".repeat(65))).is_err());
        assert_eq!(instance_id(&vars("node-a.eu_1")).unwrap(), "node-a.eu_1");
    }
}
