//! `POST /api/digest/tick`: sends the digest at most once per occurrence of its schedule (by
//! default 08:00 Berlin time on weekdays: `digest_schedule`, `digest_time_zone`), however many
//! deployments a scheduler ticks, and however often. Tick it at the scheduled time (a few
//! seconds early is fine). The digest webhook gets `{"occurrence", "fencingToken"}` with an
//! `Idempotency-Key` that is the same for every send of one occurrence.
//!
//! At most once: a send that fails is not retried for that occurrence (leasegate's
//! scheduled-job function retries and catches up).

use leasegate::{Method, Request, Response, StatusCode, Transport};
use leasegate_spin::config::{self, ConfigError};
use leasegate_spin::occurrence::{self, once_per_occurrence};
use leasegate_spin::schedule::Schedule;
use leasegate_spin::{auth, once, timer, web, Context};
use serde_json::json;

/// Handles `POST /api/digest/tick`.
pub async fn handle<T: Transport>(ctx: &Context<'_, T>, request: Request) -> Response {
    if let Err(refused) = auth::authenticate(ctx.variables, "digest_token", "digest_auth", &request)
    {
        return refused;
    }
    if request.path() != "/api/digest/tick" {
        return web::error(
            StatusCode::NOT_FOUND,
            "not_found",
            "the route is /api/digest/tick",
        );
    }
    if *request.method() != Method::POST {
        return web::method_not_allowed("POST");
    }
    let (storage, schedule, instance, webhook) = match settings(ctx) {
        Ok(settings) => settings,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    let transport = (ctx.connect)(storage.timeout);
    let blobs = storage.blobs(&transport);
    let sent = once_per_occurrence(
        &blobs,
        "digest/",
        &schedule,
        &instance,
        ctx.now,
        async |due| {
            let body = json!({ "occurrence": due.local_time, "fencingToken": due.fencing_token });
            // The same key for every send of this occurrence: the webhook dedupes on it.
            once::post_json(&transport, &webhook, &due.idempotency_key, &body).await
        },
    );
    // 200 ran / already_run / no_occurrence, 502 the send failed, 503 storage unavailable.
    occurrence::answer(sent.await)
}

/// Storage, the schedule in its zone, this deployment's name and the digest webhook.
fn settings<T>(
    ctx: &Context<'_, T>,
) -> Result<(config::Storage, Schedule, String, String), ConfigError> {
    let required = |name: &str| {
        config::var(ctx.variables, name)
            .ok_or_else(|| ConfigError(format!("variable {name} is not set")))
    };
    let schedule = Schedule::parse(
        &required("digest_schedule")?,
        &required("digest_time_zone")?,
    )
    .map_err(|e| ConfigError(format!("variables digest_schedule, digest_time_zone: {e}")))?;
    Ok((
        config::storage(ctx.variables)?,
        schedule,
        timer::instance_id(ctx.variables)?,
        config::url(ctx.variables, "digest_url")?,
    ))
}

// The Spin entry point.
/// Ticks carry no body worth reading; anything larger is refused (413).
pub const MAX_BODY_BYTES: usize = 4 * 1024;

#[cfg(target_arch = "wasm32")]
#[spin_sdk::http_component]
async fn handle_request(
    request: spin_sdk::http::IncomingRequest,
    out: spin_sdk::http::ResponseOutparam,
) {
    leasegate_spin::spin::serve(request, out, MAX_BODY_BYTES, handle).await
}
