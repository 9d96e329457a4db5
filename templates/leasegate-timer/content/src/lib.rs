//! {{project-description}}.
//!
{%- if gate == "leader" %}
//! **Leader only.** On every tick each deployment asks whether it leads
//! (`leasegate_spin::leader::lead`, a 30 s lease that the leader's ticks extend): the leader runs
//! the work (here: a webhook call handed its term, a fencing token), every other deployment
//! answers `follower`, naming the leader. When the leader stops ticking, the next deployment to
//! tick after its lease ran out takes over, with a larger term. Tick every deployment more often
//! than the lease (every 10 s). Needs `lease_id_secret` (the leader's lease id is derived from
//! `instance_id` under it) and a unique `instance_id` per deployment.
{%- else %}
//! **Once per occurrence.** A tick names the latest occurrence of `work_schedule` (in
//! `work_time_zone`) at or before it, up to 10 s early naming the coming one; the deployment
//! whose reservation of it is written first runs the work (here: a webhook call handed the
//! occurrence, its fencing token and an idempotency key), every other one answers
//! `already_run`, naming who reserved it (`leasegate_spin::occurrence::once_per_occurrence`).
//! At most once: a work that fails is not run again for that occurrence (for retries and
//! catch-up, use leasegate's scheduled-job function). Needs a unique `instance_id` per deployment.
//! Work that is only a POST to a URL on a schedule needs no code: scheduled-job's `jobs` table
//! runs many such jobs in one component (leasegate's docs/many-jobs.md); write a function like
//! this one when the work needs code, secrets of its own, or a rule of its own.
{%- endif %}
//!
//! A tick comes from Spin's cron trigger (`spin-cron.toml`), from any HTTP scheduler (`POST
//! {{route}}/tick` with `Authorization: Bearer <timer_token>`), or from an Azure Functions timer
//! (where `azure_functions = on`). The toolkit's timer shell (`leasegate_spin::timer`) checks the
//! tick token before anything else, reads the settings (503 `not_configured` naming the
//! variable), logs one line per tick and answers each trigger in its form.

use std::time::Instant;

{% if gate == "leader" -%}
use leasegate::{HolderKey, LeaseDuration, LockName};
{% endif -%}
use leasegate::{Method, Request, Response, StatusCode, Transport};
use leasegate_spin::auth::Power;
use leasegate_spin::config::{self, ConfigError, Storage, Variables};
{%- if gate == "leader" %}
use leasegate_spin::leader::{lead, Leadership};
{%- else %}
use leasegate_spin::occurrence::{once_per_occurrence, PerOccurrence};
use leasegate_spin::schedule::Schedule;
{%- endif %}
use leasegate_spin::timer::{self, Source, Tick, TimerFunction};
use leasegate_spin::{elapsed_ms, once, web, Context};
use serde_json::{json, Value};

/// The HTTP API's route.
pub const ROUTE: &str = "{{route}}";
/// The tick of HTTP schedulers.
pub const TICK: &str = "{{route}}/tick";
/// Where this function's blobs live in the container.
const PREFIX: &str = "{{project-name | kebab_case}}/";
{%- if gate == "leader" %}
/// The leader's lease, 15 to 60 s: another deployment takes over once the leader has not ticked
/// for this long.
const LEASE: LeaseDuration = LeaseDuration::Seconds(30);
{%- endif %}

/// The function's settings, read on every tick.
pub struct Settings {
    /// Storage (`storage_*`, `container`, ...).
    storage: Storage,
    /// This deployment's name (`instance_id`).
    instance: String,
    /// The work's webhook (`work_url`).
    work_url: String,
{%- if gate == "leader" %}
    /// The key the leader's lease id is derived under (`lease_id_secret`).
    lease_id_key: HolderKey,
{%- else %}
    /// When the work is due (`work_schedule` in `work_time_zone`).
    schedule: Schedule,
{%- endif %}
}

impl Settings {
    /// Reads the settings; `Err` names the variable that cannot be used.
    pub fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        let storage = config::storage(vars)?;
        Ok(Settings {
            instance: timer::instance_id(vars)?,
            work_url: config::url(vars, "work_url")?,
{%- if gate == "leader" %}
            lease_id_key: storage.lease_id_key()?.clone(),
{%- else %}
            schedule: schedule(vars)?,
{%- endif %}
            storage,
        })
    }
}
{%- if gate == "occurrence" %}

/// `work_schedule` in `work_time_zone`.
fn schedule(vars: &dyn Variables) -> Result<Schedule, ConfigError> {
    let required = |name: &str| {
        config::var(vars, name).ok_or_else(|| ConfigError(format!("variable {name} is not set")))
    };
    Schedule::parse(&required("work_schedule")?, &required("work_time_zone")?)
        .map_err(|e| ConfigError(format!("variables work_schedule, work_time_zone: {e}")))
}
{%- endif %}

/// One tick: the answer's status (2xx: settled) and its JSON.
{%- if gate == "leader" %}
pub async fn tick<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    tick: &Tick,
    started: Instant,
) -> (StatusCode, Value) {
    let transport = (ctx.connect)(settings.storage.timeout);
    let locks = settings.storage.locks(&transport, PREFIX);
    let group = LockName::try_new("leader").expect("\"leader\" is a lock name");
    let (instance, key) = (&settings.instance, &settings.lease_id_key);
    let mut v = json!({ "instance": instance, "trigger": tick.source.as_str() });
    let status = match lead(ctx, &locks, &group, instance, key, LEASE).await {
        Ok(Leadership::Leader {
            term, granted_at, ..
        }) => {
            v["role"] = json!("leader");
            v["term"] = json!(term);
            // Your leader-only work goes here. Hand it the term: a receiver refuses a term
            // lower than the highest it has seen (a deposed leader's late call). The key names
            // the term and the second of this grant (the storage server's clock): ticks in one
            // second share it, so a receiver that dedupes on it acts once for them.
            let granted_at = web::rfc3339(granted_at);
            let key = format!("{PREFIX}{term}/{granted_at}");
            let body = json!({ "leader": instance, "term": term, "at": granted_at });
            match once::post_json(&transport, &settings.work_url, &key, &body).await {
                Ok(_) => StatusCode::OK,
                Err(reason) => {
                    v["error"] = json!("work_failed");
                    v["message"] = json!(reason);
                    StatusCode::BAD_GATEWAY
                }
            }
        }
        Ok(Leadership::Follower { leader, term, .. }) => {
            v["role"] = json!("follower");
            v["leader"] = json!(leader);
            v["term"] = json!(term);
            StatusCode::OK
        }
        // Storage failed: this deployment does not know whether it leads, so it does not act.
        Err(e) => {
            v["role"] = json!("unknown");
            v["error"] = json!(web::storage_error_code(&e));
            v["message"] = json!(web::storage_failed(&e, "the work did not run"));
            web::storage_status(&e)
        }
    };
    v["durationMs"] = json!(elapsed_ms(started));
    (status, v)
}
{%- else %}
pub async fn tick<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    tick: &Tick,
    started: Instant,
) -> (StatusCode, Value) {
    let transport = (ctx.connect)(settings.storage.timeout);
    let blobs = settings.storage.blobs(&transport);
    let instance = &settings.instance;
    let mut v = json!({ "instance": instance, "trigger": tick.source.as_str() });
    let ran = once_per_occurrence(
        &blobs,
        PREFIX,
        &settings.schedule,
        instance,
        tick.at,
        async |due| {
            // Your once-per-occurrence work goes here. Hand it the fencing token (it rises
            // with the occurrence); the idempotency key is the same for every call that names
            // this occurrence. Return Err when it failed: it is not run again.
            let body = json!({ "occurrence": due.local_time, "fencingToken": due.fencing_token });
            once::post_json(&transport, &settings.work_url, &due.idempotency_key, &body).await
        },
    );
    let status = match ran.await {
        Ok(PerOccurrence::Ran { occurrence, .. }) => {
            v["outcome"] = json!("ran");
            v["occurrence"] = json!(occurrence.local_time);
            v["fencingToken"] = json!(occurrence.fencing_token);
            StatusCode::OK
        }
        Ok(PerOccurrence::AlreadyRun {
            occurrence,
            reserved_by,
            outcome,
        }) => {
            v["outcome"] = json!("already_run");
            v["occurrence"] = json!(occurrence.local_time);
            v["reservedBy"] = json!(reserved_by);
            v["run"] = json!(outcome);
            StatusCode::OK
        }
        Ok(PerOccurrence::NoOccurrence) => {
            v["outcome"] = json!("no_occurrence");
            StatusCode::OK
        }
        Ok(PerOccurrence::Failed { occurrence, error }) => {
            v["error"] = json!("work_failed");
            v["occurrence"] = json!(occurrence.local_time);
            v["message"] = json!(format!("{error} (not run again for this occurrence)"));
            StatusCode::BAD_GATEWAY
        }
        // Storage failed before the work ran: it did not run.
        Err(e) => {
            v["error"] = json!(web::storage_error_code(&e));
            v["message"] = json!(web::storage_failed(&e, "the work did not run"));
            web::storage_status(&e)
        }
    };
    v["durationMs"] = json!(elapsed_ms(started));
    (status, v)
}
{%- endif %}

/// The function as the toolkit's timer shell runs it: ticked by Spin's cron trigger, an Azure
/// Functions timer, or `POST {{route}}/tick`.
pub struct {{project-name | pascal_case}};

impl TimerFunction for {{project-name | pascal_case}} {
    const NAME: &'static str = "{{project-name | kebab_case}}";
    const ROUTES: &'static [&'static str] = &[ROUTE];
    type Settings = Settings;
    type Answer = Value;

    fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        Settings::load(vars)
    }

    async fn tick<T: Transport>(
        ctx: &Context<'_, T>,
        settings: &Settings,
        t: &Tick,
        started: Instant,
    ) -> (StatusCode, Value) {
        tick(ctx, settings, t, started).await
    }

    fn summary(_: &Settings, v: &Value) -> String {
        let said = ["role", "outcome", "error"]
            .iter()
            .find_map(|k| v.get(*k).and_then(Value::as_str));
        format!("{}: {}", Self::NAME, said.unwrap_or("unknown"))
    }

    /// `POST {{route}}/tick`, after the shell checked the tick token.
    async fn api<T: Transport>(
        ctx: &Context<'_, T>,
        request: &Request,
        _: Power,
        started: Instant,
    ) -> Response {
        if request.path().trim_end_matches('/') != TICK {
            let routes = format!("the route is POST {TICK}");
            return web::error(StatusCode::NOT_FOUND, "not_found", routes);
        }
        if *request.method() != Method::POST {
            return web::method_not_allowed("POST");
        }
        let settings = match Settings::load(ctx.variables) {
            Ok(settings) => settings,
            Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
        };
        let t = Tick {
            at: ctx.now,
            source: Source::Http,
            past_due: false,
        };
        let (status, v) = tick(ctx, &settings, &t, started).await;
        Self::log(&v);
        web::json(status, &v)
    }
}

/// Ticks carry no body worth reading; anything larger is refused (413).
pub const MAX_BODY_BYTES: usize = 4 * 1024;

// The entry points: `#[spin_sdk::http_component]` (the HTTP ticks, the Azure Functions channel)
// and the cron trigger's `handle-cron-event`, both compiled for wasm32 only.
leasegate_spin::timer_export!(crate::{{project-name | pascal_case}}, MAX_BODY_BYTES);
