//! `POST /api/orders/{id}/ship`: calls the shipping webhook at most once per order per hour,
//! across every deployment that shares the storage container, and hands the webhook the
//! fencing token (`{"order": id, "fencingToken": n}`, `Idempotency-Key: {id}`: a retry after
//! an uncertain failure sends the same key, so the webhook must dedupe on it). The losing call
//! answers 429 with `Retry-After`.

use std::time::Duration;

use leasegate::{Method, Request, Response, StatusCode, Transport};
use leasegate_spin::once::{self, once_per_window};
use leasegate_spin::{auth, config, web, Context};
use serde_json::json;

/// Handles `POST /api/orders/{id}/ship`.
pub async fn handle<T: Transport>(ctx: &Context<'_, T>, request: Request) -> Response {
    if let Err(refused) = auth::authenticate(ctx.variables, "ship_token", "ship_auth", &request) {
        return refused;
    }
    if *request.method() != Method::POST {
        return web::method_not_allowed("POST");
    }
    let order = match once::key_in_path(&request, "/api/orders/", "/ship") {
        Ok(order) => order,
        Err(not_found_or_bad_id) => return not_found_or_bad_id,
    };
    let (storage, webhook) = match config::storage(ctx.variables)
        .and_then(|storage| Ok((storage, config::url(ctx.variables, "shipping_url")?)))
    {
        Ok(settings) => settings,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    let transport = (ctx.connect)(storage.timeout);
    let locks = storage.locks(&transport, "orders/");
    let hour = Duration::from_secs(3600);
    let shipped = once_per_window(ctx, &locks, &order, hour, async |fencing_token| {
        let body = json!({ "order": order.as_str(), "fencingToken": fencing_token });
        // The order is the idempotency key: a retry after an uncertain failure repeats it.
        once::post_json(&transport, &webhook, order.as_str(), &body).await
    });
    once::answer(order.as_str(), shipped.await)
}

// The Spin entry point.
/// Ship requests carry no body worth reading; anything larger is refused (413).
pub const MAX_BODY_BYTES: usize = 4 * 1024;

#[cfg(target_arch = "wasm32")]
#[spin_sdk::http_component]
async fn handle_request(
    request: spin_sdk::http::IncomingRequest,
    out: spin_sdk::http::ResponseOutparam,
) {
    leasegate_spin::spin::serve(request, out, MAX_BODY_BYTES, handle).await
}
