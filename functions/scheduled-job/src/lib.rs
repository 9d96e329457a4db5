//! `scheduled-job`: each scheduled occurrence runs on exactly one deployment.
//! The logic is in `leasegate_functions::jobs`; these are the Spin entry points: the HTTP
//! trigger (an HTTP scheduler's ticks, the reservation log, Azure Functions timer invocations)
//! and Spin's cron trigger (`handle-cron-event`).

use leasegate_functions::jobs::{handle_http, MAX_BODY_BYTES};
use leasegate_functions::spin::{read_request, SpinEnv};
use spin_sdk::http::IncomingRequest;
use spin_sdk::http_component;

#[http_component]
async fn handle(request: IncomingRequest) -> http::Response<Vec<u8>> {
    match read_request(request, MAX_BODY_BYTES).await {
        Ok(request) => handle_http(&SpinEnv::new().context(), request).await,
        Err(response) => response,
    }
}

leasegate_functions::cron_export!(leasegate_functions::jobs::handle_cron);
