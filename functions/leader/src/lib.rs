//! `leader`: one leader among the instances of a worker, elected by lease renewal, stateless.
//!
//! On every tick (Spin's cron trigger, an Azure Functions timer, `POST /api/leader/tick`) the
//! instance acquires the group's lease (`leader/{group}`, a native lease of
//! `leader_lease_seconds`) with its own stable lease id, derived from `instance_id` under the
//! server-side key: the leader extends (its term, the fencing token, stays), a follower tries to
//! take over and learns who leads. The leader does its housekeeping each tick: it POSTs a
//! heartbeat with its term and an idempotency key to `leader_url`, and the receiver can refuse a
//! term lower than the highest it has seen.
//!
//! When the leader stops ticking, its lease runs out and the next follower tick takes over,
//! with a larger term; a leader that comes back after a pause finds another's claim and reports
//! `follower`. `DELETE /api/leader` (the serving instance steps down) releases the lease and
//! bars this instance from taking it again for one lease length (a bar kept in the lock blob's
//! metadata, since an instance remembers nothing between invocations): another instance's next
//! tick takes over, and this instance's ticks meanwhile answer `follower` with
//! `steppedDownUntil`.
//! `GET /api/leader` reads who leads without taking the lease.
#![deny(missing_docs)]
// Helpers return `Err(Response)`: the finished 4xx answer, once per request.
#![allow(clippy::result_large_err)]

use std::time::{Instant, SystemTime};

use leasegate::lease::{LockStatus, Release};
use leasegate::{
    Counting, HolderKey, LeaseDuration, LeaseId, LockName, Transport, TransportErrorKind,
};
use leasegate::{Request, Response, StatusCode};
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use leasegate_spin::auth::Power;
use leasegate_spin::config::check_name;
use leasegate_spin::config::{self, ConfigError, Storage, Variables};
use leasegate_spin::leader::{lead, Leadership};
use leasegate_spin::timer::{self, Source, Tick, TimerFunction};
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{auth, elapsed_ms, log_line, Context};

/// Route prefix of the HTTP API.
pub const ROUTE: &str = "/api/leader";
/// Blob name prefix of the election locks.
pub const PREFIX: &str = "leader/";

/// The leader function's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Storage.
    pub storage: Storage,
    /// This deployment's identity.
    pub instance_id: String,
    /// The election's name.
    pub group: String,
    /// The leader lease's length (15 to 60 s): a follower takes over at its first tick after
    /// the leader's lease ran out (this long after the leader's last tick, plus up to a second).
    pub lease: LeaseDuration,
    /// Where the leader's heartbeat goes.
    pub url: String,
    /// The key this instance's lease id is derived under (`lease_id_secret`, required).
    pub lease_id_key: HolderKey,
}

impl Settings {
    /// Reads the settings from variables.
    pub fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        let instance_id = timer::instance_id(vars)?;
        let group = config::var(vars, "leader_group").unwrap_or_else(|| "example-group".into());
        check_name(&group, "group name")
            .map_err(|e| ConfigError(format!("variable leader_group: {e}")))?;
        let secs = config::number(vars, "leader_lease_seconds", 30.0, 15..=60)?;
        if secs.fract() != 0.0 {
            return Err(ConfigError(
                "variable leader_lease_seconds must be whole seconds".into(),
            ));
        }
        let lease = LeaseDuration::try_from_secs(secs as i64)
            .map_err(|_| ConfigError("variable leader_lease_seconds must be 15 to 60".into()))?;
        let url = config::url(vars, "leader_url")?;
        let storage = config::storage(vars)?;
        let lease_id_key = storage.lease_id_key()?.clone();
        Ok(Settings {
            storage,
            instance_id,
            group,
            lease,
            url,
            lease_id_key,
        })
    }

    /// This instance's lease id on `lock`: derived from `instance_id` for the purpose
    /// `leader`, so no id of another purpose (a gate holder of the same name) is the same.
    fn lease_id(&self, lock: &LockName) -> LeaseId {
        LeaseId::for_holder(&self.lease_id_key, "leader", &self.instance_id, lock)
    }

    fn lock(&self) -> Result<LockName, leasegate::Error> {
        LockName::try_new(&self.group)
    }
}

/// The idempotency key of one heartbeat: the group, the term and the grant's second.
pub(crate) fn heartbeat_key(group: &str, term: u64, at: SystemTime) -> String {
    let secs = leasegate::time::unix_secs(at);
    let digest = Sha256::new()
        .chain_update(b"leasegate heartbeat v1\0")
        .chain_update(group.as_bytes())
        .chain_update(format!("\0{term}\0{secs}").as_bytes())
        .finalize();
    leasegate_spin::web::hex(&digest[..16])
}

/// One tick: the answer's status (2xx: settled) and its JSON.
pub(crate) async fn tick<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    tick: &Tick,
    started: Instant,
) -> (StatusCode, Value) {
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let locks = settings.storage.locks(&counting, PREFIX);
    let mut v = json!({
        "group": settings.group,
        "instance": settings.instance_id,
        "trigger": tick.source.as_str(),
    });
    // The toolkit's verb, as a user's leader-gated function asks it.
    let outcome = match settings.lock() {
        Ok(lock) => {
            lead(
                // The tick's own line logs the decision (TimerFunction::log).
                &Context {
                    log_decisions: false,
                    ..*ctx
                },
                &locks,
                &lock,
                &settings.instance_id,
                &settings.lease_id_key,
                settings.lease,
            )
            .await
        }
        Err(e) => Err(e),
    };
    let status = match outcome {
        Ok(Leadership::Leader {
            term,
            since,
            expires_at,
            took_over,
            granted_at,
            ..
        }) => {
            v["role"] = json!("leader");
            v["term"] = json!(term);
            v["since"] = json!(rfc3339(since));
            v["expiresAt"] = json!(expires_at.map(rfc3339));
            v["tookOver"] = json!(took_over);
            let key = heartbeat_key(&settings.group, term, granted_at);
            v["idempotencyKey"] = json!(key);
            match heartbeat(&transport, settings, term, (since, expires_at), &key).await {
                Ok(()) => {
                    v["heartbeat"] = json!("delivered");
                    StatusCode::OK
                }
                Err(reason) => {
                    v["heartbeat"] = json!("failed");
                    v["error"] = json!("heartbeat_failed");
                    v["message"] = json!(reason);
                    StatusCode::BAD_GATEWAY
                }
            }
        }
        Ok(Leadership::Follower {
            leader,
            term,
            since,
            expires_at,
            stepped_down_until,
            ..
        }) => {
            v["role"] = json!("follower");
            if let Some(until) = stepped_down_until {
                // This instance stepped down: it leaves the lease to the others until then.
                v["steppedDownUntil"] = json!(rfc3339(until));
            }
            if let Some(leader) = leader {
                v["leader"] = json!(leader);
                v["term"] = json!(term);
                v["since"] = json!(since.map(rfc3339));
                v["expiresAt"] = json!(expires_at.map(rfc3339));
            }
            StatusCode::OK
        }
        Err(e) => {
            v["role"] = json!("unknown");
            v["error"] = json!(web::storage_error_code(&e));
            v["message"] = json!(web::storage_failed(
                &e,
                "this instance does not act as leader"
            ));
            web::storage_status(&e)
        }
    };
    v["storageRoundTrips"] = json!(counting.sent());
    v["durationMs"] = json!(elapsed_ms(started));
    (status, v)
}

/// The heartbeat's body, as `leader_url` receives it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Heartbeat<'a> {
    group: &'a str,
    leader: &'a str,
    /// The leader's term (its fencing token): refuse one lower than the highest seen.
    term: u64,
    since: String,
    expires_at: Option<String>,
    idempotency_key: &'a str,
}

async fn heartbeat<T: Transport>(
    transport: &T,
    settings: &Settings,
    term: u64,
    (since, expires_at): (SystemTime, Option<SystemTime>),
    key: &str,
) -> Result<(), String> {
    let body = Heartbeat {
        group: &settings.group,
        leader: &settings.instance_id,
        term,
        since: rfc3339(since),
        expires_at: expires_at.map(rfc3339),
        idempotency_key: key,
    };
    // Serializing strings and an integer cannot fail.
    let body = serde_json::to_vec(&body).expect("a heartbeat serializes");
    let request = web::json_post(&settings.url, key, body)
        .ok_or_else(|| "the heartbeat request could not be built".to_string())?;
    match transport.send_for_status(request).await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("the heartbeat receiver answered {}", r.status())),
        Err(e) if e.kind == TransportErrorKind::Connect => Err(format!(
            "the heartbeat receiver is unreachable: {}",
            e.message
        )),
        Err(e) => Err(format!("the heartbeat was not confirmed: {}", e.message)),
    }
}

/// The largest request body the routes read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The leader as a timer function: ticked by Spin's cron trigger, an Azure Functions timer, or
/// `POST /api/leader/tick`.
pub struct Leader;

impl TimerFunction for Leader {
    const NAME: &'static str = "leader";
    const ROUTES: &'static [&'static str] = &[ROUTE];
    type Settings = Settings;
    type Answer = Value;

    fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        Settings::load(vars)
    }

    /// Every tick is the same question, whatever its time: who leads now?
    async fn tick<T: Transport>(
        ctx: &Context<'_, T>,
        settings: &Settings,
        t: &Tick,
        started: Instant,
    ) -> (StatusCode, Value) {
        tick(ctx, settings, t, started).await
    }

    fn summary(settings: &Settings, v: &Value) -> String {
        format!(
            "leader {}: {} is {} (term {})",
            settings.group,
            settings.instance_id,
            v["role"].as_str().unwrap_or("unknown"),
            v["term"]
        )
    }

    /// `POST /api/leader/tick`, `GET /api/leader` (bearer `timer_token` or `admin_token`),
    /// `DELETE /api/leader[?instance=ID]` (bearer `admin_token` only).
    async fn api<T: Transport>(
        ctx: &Context<'_, T>,
        request: &Request,
        power: Power,
        started: Instant,
    ) -> Response {
        let path = request.path().trim_end_matches('/');
        let action = path[ROUTE.len()..].trim_start_matches('/');
        let method = request.method().clone();
        match (action, &method) {
            ("", &leasegate::Method::GET)
            | ("", &leasegate::Method::DELETE)
            | ("tick", &leasegate::Method::POST) => {}
            ("", _) => return web::method_not_allowed("GET, DELETE"),
            ("tick", _) => return web::method_not_allowed("POST"),
            _ => {
                return web::error(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "routes: GET|DELETE /api/leader, POST /api/leader/tick",
                )
            }
        }
        if method == leasegate::Method::DELETE {
            if let Err(r) = auth::require_admin(ctx.variables, power, "a step-down") {
                return r;
            }
        }
        let instance = match query_instance(request.query()) {
            Ok(i) => i,
            Err(m) => return web::error(StatusCode::BAD_REQUEST, "invalid_query", m),
        };
        let settings = match Settings::load(ctx.variables) {
            Ok(s) => s,
            Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
        };
        if method == leasegate::Method::POST {
            if !request.body().iter().all(u8::is_ascii_whitespace) {
                return web::error(
                    StatusCode::BAD_REQUEST,
                    "invalid_tick",
                    "a leader tick takes no body",
                );
            }
            let t = Tick {
                at: ctx.now,
                source: Source::Http,
                past_due: false,
            };
            let (status, v) = tick(ctx, &settings, &t, started).await;
            Self::log(&v);
            return web::json(status, &v);
        }
        if method == leasegate::Method::GET {
            return status_answer(ctx, &settings).await;
        }
        if let Some(want) = instance {
            if want != settings.instance_id {
                return web::error(
                    StatusCode::CONFLICT,
                    "wrong_instance",
                    format!(
                        "this deployment is {}, not {want}: send the step-down to the leader's own deployment",
                        settings.instance_id
                    ),
                );
            }
        }
        step_down(ctx, &settings).await
    }
}

fn query_instance(query: Option<&str>) -> Result<Option<String>, String> {
    let mut instance = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "instance" if instance.is_none() => {
                let value = percent_encoding::percent_decode_str(value)
                    .decode_utf8()
                    .map_err(|_| "instance is not UTF-8".to_string())?;
                instance = Some(value.into_owned());
            }
            "instance" => return Err("query parameter instance is given twice".into()),
            other => {
                let shown: String = other.chars().take(32).collect();
                return Err(format!("unknown query parameter '{shown}' (use instance)"));
            }
        }
    }
    Ok(instance)
}

/// `GET /api/leader`: who leads, since when, with which term, until when, without taking the
/// lease (one HEAD).
async fn status_answer<T: Transport>(ctx: &Context<'_, T>, settings: &Settings) -> Response {
    let transport = (ctx.connect)(settings.storage.timeout);
    // Counted like the other paths: one instance of the lease code per component.
    let transport = Counting::new(&transport);
    let locks = settings.storage.locks(&transport, PREFIX);
    let info = match settings.lock() {
        Ok(lock) => locks.inspect(&lock, ctx.now).await,
        Err(e) => Err(e),
    };
    match info {
        Ok(info) => {
            let mut v = json!({ "group": settings.group, "instance": settings.instance_id });
            match info.status {
                LockStatus::Held {
                    expires_at,
                    since,
                    label,
                    ..
                } => {
                    v["state"] = json!("led");
                    v["leader"] = json!(label);
                    v["since"] = json!(since.map(rfc3339));
                    v["expiresAt"] = json!(expires_at.map(rfc3339));
                    v["term"] = json!(info.fencing_token);
                }
                LockStatus::Available => {
                    v["state"] = json!("vacant");
                    v["lastTerm"] = json!(info.fencing_token);
                }
            }
            v["serverTime"] = json!(info.server_date.map(rfc3339));
            web::json(StatusCode::OK, &v)
        }
        Err(e) => web::storage_unavailable(&e),
    }
}

/// `DELETE /api/leader`: the serving instance steps down if it leads, and stays a follower for
/// one lease length ([`leasegate::lease::Locks::step_down`]).
async fn step_down<T: Transport>(ctx: &Context<'_, T>, settings: &Settings) -> Response {
    let transport = (ctx.connect)(settings.storage.timeout);
    // Counted like the other paths: one instance of the lease code per component.
    let transport = Counting::new(&transport);
    let locks = settings.storage.locks(&transport, PREFIX);
    let released = match settings.lock() {
        Ok(lock) => {
            let id = settings.lease_id(&lock);
            let bar = settings
                .lease
                .as_duration()
                .unwrap_or(std::time::Duration::from_secs(60));
            let stepped = locks.step_down(&lock, id, bar, ctx.now).await;
            // What this instance's ticks kept is stale now (the bar moved the ETag): one
            // request saved. Another instance's entry (a shared store) is left alone.
            leasegate_spin::held::forget_own(ctx.cache, &locks, &lock, id);
            stepped
        }
        Err(e) => Err(e),
    };
    match released {
        Ok(r) => {
            let stepped = r == Release::Released;
            log_line(
                json!({"fn": "leader", "group": settings.group, "instance": settings.instance_id, "decision": if stepped { "stepped_down" } else { "not_leader" }}),
            );
            web::json(
                StatusCode::OK,
                &json!({
                    "group": settings.group,
                    "instance": settings.instance_id,
                    "steppedDown": stepped,
                    "reason": if stepped { "the lease was released, and this instance stays a follower for one lease length: another instance's next tick takes over" } else { "this instance does not lead" },
                }),
            )
        }
        Err(e) => web::storage_unavailable(&e),
    }
}

// The Spin entry points: the HTTP component (the routes and the Azure channel) and the cron
// trigger's export, both serving [`Leader`].
leasegate_spin::timer_export!(crate::Leader, MAX_BODY_BYTES);
