//! cron-probe: a test component for leasegate-host's cron trigger, in the style of Spin's own
//! `tests/test-components`. Built with spin-sdk 5.2 like the app's components, it exports:
//!
//! * `handle-cron-event` (`fermyon:spin-cron@2.0.0`, the `trigger-cron` plugin's world): prints
//!   `cron-probe timestamp=<timestamp> wall_ms=<the guest's wall clock, Unix ms>`, GETs the
//!   `probe_url` variable once (printing `cron-probe probe answered <status>`), and returns
//!   `Err(other("odd"))` for an odd timestamp, `Ok` for an even one; for the timestamp
//!   `u64::MAX` it panics instead (a trap, before printing anything);
//! * `wasi:http/incoming-handler`: answers every request 200 `probe`.

use std::time::{SystemTime, UNIX_EPOCH};

use spin_sdk::http::{Request, Response};
use spin_sdk::http_component;

/// The plugin's guest world, bound the way its SDK's `#[cron_component]` binds it.
mod bindings {
    spin_sdk::wit_bindgen::generate!({
        world: "spin-cron",
        path: "wit/spin-cron.wit",
        runtime_path: "::spin_sdk::wit_bindgen::rt",
    });

    /// The exported world.
    pub struct Probe;

    export!(Probe);
}

use bindings::fermyon::spin_cron::cron_types::{Error, Metadata};

impl bindings::Guest for bindings::Probe {
    fn handle_cron_event(metadata: Metadata) -> Result<(), Error> {
        if metadata.timestamp == u64::MAX {
            panic!("cron-probe traps on purpose");
        }
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        println!(
            "cron-probe timestamp={} wall_ms={wall_ms}",
            metadata.timestamp
        );
        let url = spin_sdk::variables::get("probe_url")
            .map_err(|e| Error::Other(format!("variable probe_url: {e}")))?;
        let answered = spin_executor::run(async move {
            let response: Response = spin_sdk::http::send(Request::get(url).build()).await?;
            Ok::<_, spin_sdk::http::SendError>(*response.status())
        });
        match answered {
            Ok(status) => println!("cron-probe probe answered {status}"),
            Err(e) => return Err(Error::Other(format!("probe request failed: {e}"))),
        }
        if metadata.timestamp % 2 == 1 {
            return Err(Error::Other("odd".to_string()));
        }
        Ok(())
    }
}

/// Every HTTP request: 200 `probe`.
#[http_component]
fn handle(_request: Request) -> Response {
    Response::new(200, "probe")
}
