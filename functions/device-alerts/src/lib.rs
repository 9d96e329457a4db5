//! `POST /api/telemetry`: device alerts, at most one per device per window.
//! The logic is in `leasegate_functions::telemetry`; this is the Spin entry point.

use leasegate_functions::spin::{read_request, SpinEnv};
use leasegate_functions::telemetry::{handle as handle_telemetry, MAX_BODY_BYTES};
use spin_sdk::http::IncomingRequest;
use spin_sdk::http_component;

#[http_component]
async fn handle(request: IncomingRequest) -> http::Response<Vec<u8>> {
    match read_request(request, MAX_BODY_BYTES).await {
        Ok(request) => handle_telemetry(&SpinEnv::new().context(), request).await,
        Err(response) => response,
    }
}
