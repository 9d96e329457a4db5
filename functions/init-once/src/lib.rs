//! `init-once`: a setup step runs once across every deployment.
//! The logic is in `leasegate_functions::init`; these are the Spin entry points: the HTTP
//! trigger (`/api/init/{name}`, Azure Functions timer invocations) and Spin's cron trigger.

use leasegate_functions::init::{handle_http, MAX_BODY_BYTES};
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

leasegate_functions::cron_export!(leasegate_functions::init::handle_cron);
