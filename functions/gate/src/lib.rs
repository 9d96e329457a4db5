//! `POST|GET|DELETE /api/gate/{key}`: the generic gate API.
//! The logic is in `leasegate_functions::gate`; this is the Spin entry point.

use leasegate_functions::gate::handle as handle_gate;
use leasegate_functions::spin::{read_request, SpinEnv};
use spin_sdk::http::IncomingRequest;
use spin_sdk::http_component;

/// Gate requests carry no meaningful body; anything larger than this is refused.
const MAX_BODY_BYTES: usize = 64 * 1024;

#[http_component]
async fn handle(request: IncomingRequest) -> http::Response<Vec<u8>> {
    match read_request(request, MAX_BODY_BYTES).await {
        Ok(request) => handle_gate(&SpinEnv::new().context(), request).await,
        Err(response) => response,
    }
}
