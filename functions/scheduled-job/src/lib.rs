//! `scheduled-job`: each scheduled occurrence runs on exactly one deployment.
//! The logic is in `leasegate_functions::jobs`; these are the Spin entry points: the HTTP
//! trigger (an HTTP scheduler's ticks, the reservation log, Azure Functions timer invocations)
//! and Spin's cron trigger (`handle-cron-event`).

use leasegate_functions::jobs::{handle_cron, handle_http, MAX_BODY_BYTES};
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

/// The cron trigger's guest interface (`fermyon:spin-cron@2.0.0`; its guest SDK is not on
/// crates.io, so the binding is generated here with the wit-bindgen that spin-sdk uses).
mod cron {
    spin_sdk::wit_bindgen::generate!({
        inline: "
            package fermyon:spin-cron@2.0.0;
            interface cron-types {
                record metadata { timestamp: u64 }
                variant error { other(string) }
            }
            world spin-cron {
                use cron-types.{metadata, error};
                export handle-cron-event: func(metadata: metadata) -> result<_, error>;
            }
        ",
        world: "spin-cron",
        runtime_path: "spin_sdk::wit_bindgen::rt",
    });

    struct Cron;

    impl Guest for Cron {
        fn handle_cron_event(metadata: Metadata) -> Result<(), Error> {
            spin_executor::run(async move {
                super::handle_cron(&super::SpinEnv::new().context(), metadata.timestamp)
                    .await
                    .map_err(Error::Other)
            })
        }
    }

    export!(Cron);
}
