//! `ttl-sweeper`: blobs past their time-to-live are deleted (or moved) exactly once by several
//! workers. The logic is in `leasegate_functions::ttl`; these are the Spin entry points: the
//! HTTP trigger (`/api/ttl/...` marking, `/api/sweeper/...`, Azure Functions timer invocations)
//! and Spin's cron trigger.

use leasegate_functions::spin::{read_request, SpinEnv};
use leasegate_functions::ttl::{handle_http, MAX_BODY_BYTES};
use spin_sdk::http::IncomingRequest;
use spin_sdk::http_component;

#[http_component]
async fn handle(request: IncomingRequest) -> http::Response<Vec<u8>> {
    match read_request(request, MAX_BODY_BYTES).await {
        Ok(request) => handle_http(&SpinEnv::new().context(), request).await,
        Err(response) => response,
    }
}

leasegate_functions::cron_export!(leasegate_functions::ttl::handle_cron);
