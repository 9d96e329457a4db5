//! `POST {{route-prefix}}{key}`: {{project-description}}.
//!
//! The work (here: a webhook call handed the key and the fencing token) runs at most once per
//! key per window across every deployment that shares the storage container; the other calls
//! answer 429 with `Retry-After`. Put your own side effect in place of the webhook. A retry
//! after an uncertain failure (a timeout, a 5xx) runs the work again with the same
//! `Idempotency-Key` (the key): the receiver must dedupe on it.

use std::time::Duration;

use leasegate::{Method, Request, Response, StatusCode, Transport};
use leasegate_spin::once::{self, once_per_window};
use leasegate_spin::{auth, config, web, Context};
use serde_json::json;

/// At most once per key in this window.
const WINDOW: Duration = Duration::from_secs({{window-seconds}});
// A window is 1 s to a year.
const _: () = assert!(WINDOW.as_secs() >= 1 && WINDOW.as_secs() <= 31_536_000);

/// Handles `POST {{route-prefix}}{key}`.
pub async fn handle<T: Transport>(ctx: &Context<'_, T>, request: Request) -> Response {
    if let Err(refused) = auth::authenticate(ctx.variables, "api_token", "api_auth", &request) {
        return refused;
    }
    if *request.method() != Method::POST {
        return web::method_not_allowed("POST");
    }
    let key = match once::key_in_path(&request, "{{route-prefix}}", "") {
        Ok(key) => key,
        Err(not_found_or_bad_key) => return not_found_or_bad_key,
    };
    let (storage, work_url) = match config::storage(ctx.variables)
        .and_then(|storage| Ok((storage, config::url(ctx.variables, "work_url")?)))
    {
        Ok(settings) => settings,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    let transport = (ctx.connect)(storage.timeout);
    let locks = storage.locks(&transport, "once/");
    let outcome = once_per_window(ctx, &locks, &key, WINDOW, async |fencing_token| {
        // Your side effect goes here; hand it the fencing token. Return Err only when it
        // certainly did not happen (the lock is then given back and a retry runs it).
        let body = json!({ "key": key.as_str(), "fencingToken": fencing_token });
        // The key is the idempotency key: a retry after an uncertain failure repeats it.
        once::post_json(&transport, &work_url, key.as_str(), &body).await
    });
    once::answer(key.as_str(), outcome.await)
}

/// Requests carry no body worth reading; anything larger is refused (413).
pub const MAX_BODY_BYTES: usize = 4 * 1024;

#[cfg(target_arch = "wasm32")]
#[spin_sdk::http_component]
async fn handle_request(
    request: spin_sdk::http::IncomingRequest,
    out: spin_sdk::http::ResponseOutparam,
) {
    leasegate_spin::spin::serve(request, out, MAX_BODY_BYTES, handle).await
}
