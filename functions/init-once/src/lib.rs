//! `init-once`: a setup step (seeding data after a deployment) runs once; the other instances
//! see that it runs or is done and do not repeat it.
//!
//! A call (`POST /api/init/{name}`, or a tick of Spin's cron trigger or an Azure Functions timer
//! for `init_name`) reads the lock `init/{name}` (one HEAD): marked `progress=done`, it answers
//! `done`; held, `running` (202 with `Retry-After`). Otherwise it takes the lock (a fresh lease
//! id, for `init_lease_seconds`), checks the mark again as it was at the grant, and runs the
//! initialization: a POST of the name, the fencing token and an idempotency key to `init_url`.
//! Only when that answers 2xx does it mark the lock `progress=done` (under its lease: a caller
//! that lost the lock meanwhile cannot), then it lets the lock go. A failed initialization is
//! not marked done; the next call runs it again.
//!
//! An initializer that dies leaves its lease to run out, and the next caller runs the
//! initialization again, with a larger fencing token: the action can repeat then, so it should
//! check the token (refuse a lower one than the highest it has seen) or be idempotent by the
//! idempotency key, which is one per name and token. `DELETE /api/init/{name}` resets it, for
//! operators.
#![deny(missing_docs)]
// Helpers return `Err(Response)`: the finished 4xx answer, once per request.
#![allow(clippy::result_large_err)]

use std::time::{Duration, Instant};

use leasegate::lease::{Acquire, Acquiring, IdOrigin, LockStatus, Locks, Start, Term};
use leasegate::ops::Metadata;
use leasegate::{Counting, LockName, Transport, TransportErrorKind};
use leasegate::{Request, Response, StatusCode};
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use leasegate_spin::auth::Power;
use leasegate_spin::config::check_name;
use leasegate_spin::config::{self, ConfigError, Storage, Variables};
use leasegate_spin::once::{once_ever_as, Ever};
use leasegate_spin::timer::{self, Source, Tick, TimerFunction};
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{auth, elapsed_ms, log_line, Context};

/// Route prefix of the HTTP API.
pub const ROUTE_PREFIX: &str = "/api/init/";
/// The HTTP API's route.
pub const ROUTE: &str = "/api/init";
/// Blob name prefix of the do-once locks.
pub const PREFIX: &str = "init/";
/// The mark of a finished initialization.
pub const DONE: &str = "done";

/// The init-once settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Storage.
    pub storage: Storage,
    /// This deployment's identity.
    pub instance_id: String,
    /// The name the timer forms run (`init_name`).
    pub name: String,
    /// Where the initialization is POSTed.
    pub url: String,
    /// How long one run may hold the lock; past it, the next caller runs it again.
    pub lease: Duration,
    /// How long the initialization's call may take.
    pub timeout: Duration,
}

impl Settings {
    /// Reads the settings from variables.
    pub fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        let instance_id = timer::instance_id(vars)?;
        let name = config::var(vars, "init_name").unwrap_or_else(|| "example-init".into());
        check_name(&name, "name").map_err(|e| ConfigError(format!("variable init_name: {e}")))?;
        let whole = |var: &str, default: f64, range: std::ops::RangeInclusive<i64>| {
            let v = config::number(vars, var, default, range)?;
            if v.fract() != 0.0 {
                return Err(ConfigError(format!("variable {var} must be whole seconds")));
            }
            Ok(Duration::from_secs(v as u64))
        };
        let lease = whole("init_lease_seconds", 60.0, 15..=86_400)?;
        let timeout = whole("init_timeout_seconds", 30.0, 1..=3600)?;
        let url = config::url(vars, "init_url")?;
        let storage = config::storage(vars)?;
        let (needed, requests) = lease_needed(timeout, storage.timeout, lease);
        if needed > lease {
            return Err(ConfigError(format!(
                "variable init_timeout_seconds ({}s) plus {requests} storage requests ({} ms \
                 each, storage_timeout_ms) must fit within init_lease_seconds ({}s): raise \
                 init_lease_seconds to at least {}, or lower init_timeout_seconds",
                timeout.as_secs(),
                storage.timeout.as_millis(),
                lease.as_secs(),
                lease_suggested(timeout, storage.timeout, lease).as_secs(),
            )));
        }
        Ok(Settings {
            storage,
            instance_id,
            name,
            url,
            lease,
            timeout,
        })
    }
}

/// How long the run's lock must last for `init_lease_seconds = lease`, and the storage
/// requests counted in it: the call and the marking after it (a HEAD and a write, each up to
/// `storage_timeout`), and for a native lease (15 to 60 s) also the claim write after the
/// grant (the lease runs from the grant). Otherwise another caller takes the lock while the run
/// still goes on, and duplicate initializations become routine.
pub(crate) fn lease_needed(
    timeout: Duration,
    storage_timeout: Duration,
    lease: Duration,
) -> (Duration, u32) {
    let requests = if matches!(Term::for_window(lease), Ok(Term::Native(_))) {
        3
    } else {
        2
    };
    (timeout + storage_timeout * requests, requests)
}

/// The smallest whole-second `init_lease_seconds` from `lease` up that [`lease_needed`]
/// accepts.
pub(crate) fn lease_suggested(
    timeout: Duration,
    storage_timeout: Duration,
    lease: Duration,
) -> Duration {
    let mut secs = lease.as_secs().max(1);
    // Ends: at `timeout + 3 x storage_timeout` (rounded up) every term is long enough.
    loop {
        let l = Duration::from_secs(secs);
        if lease_needed(timeout, storage_timeout, l).0 <= l {
            return l;
        }
        secs += 1;
    }
}

/// The idempotency key of one run: the name and the run's fencing token.
pub(crate) fn idempotency_key(name: &str, token: u64) -> String {
    let digest = Sha256::new()
        .chain_update(b"leasegate init v1\0")
        .chain_update(name.as_bytes())
        .chain_update(format!("\0{token}").as_bytes())
        .finalize();
    leasegate_spin::web::hex(&digest[..16])
}

/// What a call came to.
#[derive(Debug)]
pub(crate) enum State {
    /// Done: by this call (`ran`) or earlier.
    Done {
        /// Whether this call ran it.
        ran: bool,
        /// The run's fencing token, when this call ran it.
        token: Option<u64>,
    },
    /// Someone runs it now.
    Running {
        /// Who, as its claim says.
        by: String,
        /// How long its lock has left.
        retry_after: Option<Duration>,
    },
    /// This call ran it and the initialization failed: not marked done.
    Failed {
        /// Why.
        reason: String,
        /// The run's fencing token.
        token: u64,
    },
    /// This call ran it, but lost the lock before it could mark it done (its lease ran out
    /// while the initialization ran): not marked done; another caller may be running it.
    LostLock {
        /// The run's fencing token.
        token: u64,
    },
    /// This call ran it (the initialization answered 2xx), but storage failed while it marked
    /// it done: the mark may or may not have landed.
    MarkFailed {
        /// The run's fencing token.
        token: u64,
        /// What storage did.
        error: String,
    },
}

/// Runs one call for `name`. Storage requests: one when done or running, five when this call
/// runs it on a lock blob that exists (the read; the acquire from that read: acquire and claim
/// for a native lease, one compare-and-swap for a record; the mark; the release), one more for
/// a name never used (the lock blob's create).
pub(crate) async fn call<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    name: &str,
) -> (Result<State, leasegate::Error>, u32) {
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let locks = settings.storage.locks(&counting, PREFIX);
    let action = (ctx.connect)(settings.timeout);
    let state = run(ctx, &locks, &action, settings, name).await;
    (state, counting.sent())
}

async fn run<T, S: Transport, A: Transport>(
    ctx: &Context<'_, T>,
    locks: &Locks<S>,
    action: &A,
    settings: &Settings,
    name: &str,
) -> Result<State, leasegate::Error> {
    let lock = LockName::try_new(name)?;
    // The toolkit's verb, as a user's do-once function calls it: this instance's name as the
    // holder's label, and who did it beside the done mark.
    let mut marks = Metadata::new();
    marks.insert("done_by".into(), settings.instance_id.clone());
    let ever = once_ever_as(
        // The call's own line logs the decision (TimerFunction::log).
        &Context {
            log_decisions: false,
            ..*ctx
        },
        locks,
        &lock,
        settings.lease,
        &settings.instance_id,
        &marks,
        async |token| post(action, settings, name, token).await.map(|()| token),
    )
    .await?;
    Ok(match ever {
        Ever::Done => State::Done {
            ran: false,
            token: None,
        },
        Ever::Busy {
            retry_after,
            holder,
        } => State::Running {
            by: holder.unwrap_or_default(),
            retry_after: Some(retry_after),
        },
        Ever::Ran { fencing_token, .. } => State::Done {
            ran: true,
            token: Some(fencing_token),
        },
        Ever::Failed {
            fencing_token,
            error,
            ..
        } => State::Failed {
            reason: error,
            token: fencing_token,
        },
        Ever::Unmarked {
            fencing_token,
            storage_error: None,
            ..
        } => State::LostLock {
            token: fencing_token,
        },
        Ever::Unmarked {
            fencing_token,
            storage_error: Some(error),
            ..
        } => State::MarkFailed {
            token: fencing_token,
            error,
        },
    })
}

fn is_done(marks: &Metadata) -> bool {
    marks.get("progress").map(String::as_str) == Some(DONE)
}

/// The initialization's body, as `init_url` receives it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Initialization<'a> {
    name: &'a str,
    /// The run's fencing token: refuse one lower than the highest seen.
    fencing_token: u64,
    /// One per name and token: a repeated run of the same token carries the same key.
    idempotency_key: &'a str,
    instance: &'a str,
}

async fn post<A: Transport>(
    action: &A,
    settings: &Settings,
    name: &str,
    token: u64,
) -> Result<(), String> {
    let key = idempotency_key(name, token);
    let body = Initialization {
        name,
        fencing_token: token,
        idempotency_key: &key,
        instance: &settings.instance_id,
    };
    // Serializing strings and an integer cannot fail.
    let body = serde_json::to_vec(&body).expect("an initialization serializes");
    let request = web::json_post(&settings.url, &key, body)
        .ok_or_else(|| "the initialization request could not be built".to_string())?;
    match action.send_for_status(request).await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("the initialization answered {}", r.status())),
        Err(e) if e.kind == TransportErrorKind::Connect => {
            Err(format!("the initialization is unreachable: {}", e.message))
        }
        Err(e) => Err(format!("the initialization did not confirm: {}", e.message)),
    }
}

/// The answer for a call: its status and JSON.
pub(crate) fn describe(
    settings: &Settings,
    name: &str,
    state: &Result<State, leasegate::Error>,
    round_trips: u32,
    started: Instant,
    source: Source,
) -> (StatusCode, Value, Option<u64>) {
    let mut v = json!({
        "name": name,
        "instance": settings.instance_id,
        "trigger": source.as_str(),
        "storageRoundTrips": round_trips,
        "durationMs": elapsed_ms(started),
    });
    let mut retry = None;
    let status = match state {
        Ok(State::Done { ran, token }) => {
            v["state"] = json!("done");
            v["ran"] = json!(ran);
            if let Some(t) = token {
                v["fencingToken"] = json!(t);
            }
            StatusCode::OK
        }
        Ok(State::Running { by, retry_after }) => {
            v["state"] = json!("running");
            v["runningOn"] = json!(by);
            let secs = retry_after.map_or(1, |d| d.as_secs().max(1));
            v["retryAfterSeconds"] = json!(secs);
            retry = Some(secs);
            StatusCode::ACCEPTED
        }
        Ok(State::Failed { reason, token }) => {
            v["state"] = json!("failed");
            v["fencingToken"] = json!(token);
            v["error"] = json!("init_failed");
            v["message"] = json!(format!(
                "{reason}; not marked done: the next call runs it again"
            ));
            StatusCode::BAD_GATEWAY
        }
        Ok(State::LostLock { token }) => {
            v["state"] = json!("unknown");
            v["fencingToken"] = json!(token);
            v["error"] = json!("lease_lost");
            v["message"] = json!(
                "the initialization answered, but this call's lease ran out before it could be marked done; another caller may run it again"
            );
            StatusCode::CONFLICT
        }
        Ok(State::MarkFailed { token, error }) => {
            v["state"] = json!("unknown");
            v["ran"] = json!(true);
            v["fencingToken"] = json!(token);
            v["error"] = json!("mark_failed");
            v["message"] = json!(format!(
                "the initialization ran (it answered 2xx) but marking it done failed ({error}): GET tells whether the mark landed; if not, the next call runs it again with a larger fencing token"
            ));
            retry = Some(1);
            StatusCode::SERVICE_UNAVAILABLE
        }
        Err(e) => {
            v["state"] = json!("unknown");
            v["error"] = json!(web::storage_error_code(e));
            v["message"] = json!(web::storage_failed(e, "nothing was run"));
            let status = web::storage_status(e);
            retry = (status == StatusCode::SERVICE_UNAVAILABLE).then_some(1);
            status
        }
    };
    (status, v, retry)
}

/// The largest request body the routes read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// init-once as a timer function: `init_name` run by Spin's cron trigger or an Azure Functions
/// timer, any name by `POST /api/init/{name}`.
pub struct InitOnce;

impl TimerFunction for InitOnce {
    const NAME: &'static str = "init-once";
    const ROUTES: &'static [&'static str] = &[ROUTE];
    type Settings = Settings;
    type Answer = Value;

    fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        Settings::load(vars)
    }

    /// A call for `init_name`: `Ok` to the cron trigger when done or running elsewhere.
    async fn tick<T: Transport>(
        ctx: &Context<'_, T>,
        settings: &Settings,
        tick: &Tick,
        started: Instant,
    ) -> (StatusCode, Value) {
        let name = settings.name.clone();
        let (state, trips) = call(ctx, settings, &name).await;
        let (status, v, _) = describe(settings, &name, &state, trips, started, tick.source);
        (status, v)
    }

    fn failure(v: &Value) -> String {
        v["message"]
            .as_str()
            .unwrap_or("the call failed")
            .to_string()
    }

    fn summary(settings: &Settings, v: &Value) -> String {
        format!(
            "init-once {}: {} on {}",
            settings.name,
            v["state"].as_str().unwrap_or("unknown"),
            settings.instance_id
        )
    }

    /// A run still going elsewhere is settled for this invocation: 2xx.
    fn azure_status(status: StatusCode) -> StatusCode {
        if status == StatusCode::ACCEPTED {
            StatusCode::OK
        } else {
            status
        }
    }

    /// `POST|GET /api/init/{name}` (bearer `timer_token` or `admin_token`), `DELETE
    /// /api/init/{name}` (the reset: bearer `admin_token` only).
    async fn api<T: Transport>(
        ctx: &Context<'_, T>,
        request: &Request,
        power: Power,
        started: Instant,
    ) -> Response {
        if request.method() == leasegate::Method::DELETE {
            if let Err(r) = auth::require_admin(ctx.variables, power, "a reset") {
                return r;
            }
        }
        let name = request
            .path()
            .strip_prefix(ROUTE_PREFIX)
            .unwrap_or("")
            .trim_end_matches('/');
        if let Err(m) = check_name(name, "name") {
            return web::error(StatusCode::BAD_REQUEST, "invalid_name", m);
        }
        let method = request.method().clone();
        if method != leasegate::Method::POST
            && method != leasegate::Method::GET
            && method != leasegate::Method::DELETE
        {
            return web::method_not_allowed("GET, POST, DELETE");
        }
        if !request.body().iter().all(u8::is_ascii_whitespace) {
            return web::error(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                "these routes take no body",
            );
        }
        let settings = match Settings::load(ctx.variables) {
            Ok(s) => s,
            Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
        };
        if method == leasegate::Method::GET {
            return state_answer(ctx, &settings, name).await;
        }
        if method == leasegate::Method::DELETE {
            return reset(ctx, &settings, name).await;
        }
        let (state, trips) = call(ctx, &settings, name).await;
        let (status, v, retry) = describe(&settings, name, &state, trips, started, Source::Http);
        Self::log(&v);
        let mut r = web::json(status, &v);
        if let Some(secs) = retry {
            r.headers_mut().insert("retry-after", secs.to_string());
        }
        r
    }
}

/// `GET /api/init/{name}`: `pending`, `running` (and on which instance) or `done` (by whom,
/// with which token): one HEAD.
async fn state_answer<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    name: &str,
) -> Response {
    let transport = (ctx.connect)(settings.storage.timeout);
    // Counted like the other paths: one instance of the lease code per component.
    let transport = Counting::new(&transport);
    let locks = settings.storage.locks(&transport, PREFIX);
    let info = match LockName::try_new(name) {
        Ok(lock) => locks.inspect(&lock, ctx.now).await,
        Err(e) => Err(e),
    };
    match info {
        Ok(info) => {
            let mut v = json!({ "name": name });
            if is_done(&info.marks) {
                v["state"] = json!("done");
                v["doneBy"] = json!(info.marks.get("done_by"));
                v["doneToken"] = json!(info
                    .marks
                    .get("done_token")
                    .and_then(|t| t.parse::<u64>().ok()));
            } else if let LockStatus::Held {
                label,
                since,
                expires_at,
                ..
            } = &info.status
            {
                v["state"] = json!("running");
                v["runningOn"] = json!(label);
                v["since"] = json!(since.map(rfc3339));
                v["expiresAt"] = json!(expires_at.map(rfc3339));
            } else {
                v["state"] = json!("pending");
            }
            v["fencingToken"] = json!(info.fencing_token);
            web::json(StatusCode::OK, &v)
        }
        Err(e) => web::storage_unavailable(&e),
    }
}

/// `DELETE /api/init/{name}`: forgets that it is done (the next call runs it again). Refused
/// (409) while a run holds the lock.
async fn reset<T: Transport>(ctx: &Context<'_, T>, settings: &Settings, name: &str) -> Response {
    let transport = (ctx.connect)(settings.storage.timeout);
    // Counted like the other paths: one instance of the lease code per component.
    let transport = Counting::new(&transport);
    let locks = settings.storage.locks(&transport, PREFIX);
    let result = async {
        let lock = LockName::try_new(name)?;
        let id = (ctx.new_lease_id)();
        let term = Term::for_window(settings.lease)?;
        match locks
            .acquire(
                &lock,
                Acquiring::new(term, id)
                    .origin(IdOrigin::Fresh)
                    .label(&settings.instance_id),
                ctx.now,
            )
            .await?
        {
            Acquire::Busy { holder, .. } => Ok(Err(holder.map(|h| h.label).unwrap_or_default())),
            Acquire::Acquired(mut held) => {
                let mut marks = Metadata::new();
                for k in ["progress", "done_by", "done_token"] {
                    marks.insert(k.to_string(), String::new());
                }
                let cleared = locks
                    .set_marks_held(&lock, &mut held, &marks, ctx.now)
                    .await;
                // Released even when clearing failed: the lock is not left taken.
                let from = Start::Acquired(&held);
                let _ = locks.release(&lock, held.lease_id, from, ctx.now).await;
                Ok(Ok(cleared?))
            }
        }
    }
    .await;
    match result {
        Ok(Ok(true)) => {
            log_line(json!({"fn": "init-once", "name": name, "decision": "reset"}));
            web::json(StatusCode::OK, &json!({"name": name, "state": "pending"}))
        }
        Ok(Ok(false)) => web::error(
            StatusCode::CONFLICT,
            "busy",
            "the lock was taken while resetting; try again",
        ),
        Ok(Err(by)) => web::error(
            StatusCode::CONFLICT,
            "running",
            format!("the initialization is running (on {by}): reset it once that run ends"),
        ),
        Err(e) => web::storage_unavailable(&e),
    }
}

// The Spin entry points: the HTTP component (the routes and the Azure channel) and the cron
// trigger's export, both serving [`InitOnce`].
leasegate_spin::timer_export!(crate::InitOnce, MAX_BODY_BYTES);

#[cfg(test)]
mod tests {
    use super::Settings;
    use std::collections::HashMap;

    fn load(lease: &str, timeout: &str, storage_ms: &str) -> Result<Settings, String> {
        let vars: HashMap<String, String> = [
            ("instance_id", "node-a"),
            ("init_url", "http://127.0.0.1:9/init"),
            ("storage_origin", "http://127.0.0.1:10000"),
            ("storage_account", "devstoreaccount1"),
            ("storage_key", "RXhhbXBsZUtleUZvclVuaXRUZXN0c09ubHk="),
            ("init_lease_seconds", lease),
            ("init_timeout_seconds", timeout),
            ("storage_timeout_ms", storage_ms),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Settings::load(&vars).map_err(|e| e.to_string())
    }

    /// A native lease (15 to 60 s) runs from its grant: the claim write after it counts too,
    /// so the lease must hold the call and three storage requests; a record (above 60 s) is
    /// written with its claim, so two.
    #[test]
    fn the_lease_holds_the_call_and_its_storage_requests() {
        // 10 s + 3 x 2 s = 16 s > 15 s (native): refused, naming the lease needed.
        let Err(e) = load("15", "10", "2000") else {
            panic!("accepted")
        };
        assert!(e.contains("3 storage requests"), "{e}");
        assert!(e.contains("at least 16"), "{e}");
        load("16", "10", "2000").unwrap();
        load("15", "10", "1500").unwrap();
        // 50 s + 3 x 5 s = 65 s > 60 s; a 61 s record needs 50 + 2 x 5 = 60 s.
        let Err(e) = load("60", "50", "5000") else {
            panic!("accepted")
        };
        assert!(e.contains("at least 61"), "{e}");
        load("61", "50", "5000").unwrap();
        // A record: two requests.
        let Err(e) = load("120", "115", "5000") else {
            panic!("accepted")
        };
        assert!(
            e.contains("2 storage requests") && e.contains("at least 125"),
            "{e}"
        );
        load("125", "115", "5000").unwrap();
    }
}
