//! cron-only-probe: a test component for leasegate-host's cron trigger that exports only
//! `handle-cron-event` (`fermyon:spin-cron@2.0.0`), no `wasi:http/incoming-handler`. It prints
//! `cron-only-probe timestamp=<timestamp> greeting=<the greeting variable>` and returns `Ok`.

/// The plugin's guest world.
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
        let greeting = spin_sdk::variables::get("greeting")
            .map_err(|e| Error::Other(format!("variable greeting: {e}")))?;
        println!(
            "cron-only-probe timestamp={} greeting={greeting}",
            metadata.timestamp
        );
        Ok(())
    }
}
