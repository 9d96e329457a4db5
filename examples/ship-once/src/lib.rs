//! `POST /api/orders/{id}/ship`: calls the shipping webhook at most once per order per hour,
//! across every deployment that shares the storage container, and hands the webhook the
//! fencing token (`{"order": id, "fencingToken": n}`). The losing call answers 429 with
//! `Retry-After`.

use std::time::Duration;

use leasegate::{Method, Request, Response, StatusCode, Transport};
use leasegate_spin::once::{self, once_per_window};
use leasegate_spin::{auth, config, web, Context};

/// Handles `POST /api/orders/{id}/ship`.
pub async fn handle<T: Transport>(ctx: &Context<'_, T>, request: Request) -> Response {
    if let Err(refused) = auth::authenticate(ctx.variables, "ship_token", "ship_auth", &request) {
        return refused;
    }
    if *request.method() != Method::POST {
        return web::method_not_allowed("POST");
    }
    let path = request.path().strip_prefix("/api/orders/");
    let Some(id) = path.and_then(|p| p.strip_suffix("/ship")) else {
        return web::error(
            StatusCode::NOT_FOUND,
            "not_found",
            "POST /api/orders/{id}/ship",
        );
    };
    let order = match once::key(id) {
        Ok(order) => order,
        Err(bad_request) => return bad_request,
    };
    let (storage, webhook) = match config::storage(ctx.variables)
        .and_then(|s| Ok((s, config::url(ctx.variables, "shipping_url")?)))
    {
        Ok(settings) => settings,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    let transport = (ctx.connect)(storage.timeout);
    let locks = storage.locks(&transport, "orders/");
    let hour = Duration::from_secs(3600);
    let shipped = once_per_window(ctx, &locks, &order, hour, async |fencing_token| {
        let body = serde_json::json!({ "order": order.as_str(), "fencingToken": fencing_token });
        let key = format!("{}/{fencing_token}", order.as_str());
        let request = web::json_post(&webhook, &key, body.to_string().into_bytes());
        match transport
            .send_for_status(request.ok_or("bad shipping_url")?)
            .await
        {
            Ok(answer) if answer.status().is_success() => Ok(answer.status().as_u16()),
            Ok(answer) => Err(format!("the shipping webhook answered {}", answer.status())),
            Err(e) => Err(format!("the shipping webhook could not be reached: {e}")),
        }
    });
    once::answer(order.as_str(), shipped.await)
}

// The Spin entry point.
/// Ship requests carry no body worth reading; anything larger is refused (413).
pub const MAX_BODY_BYTES: usize = 4 * 1024;

#[cfg(target_arch = "wasm32")]
leasegate_spin::http_export!(handle, MAX_BODY_BYTES);
