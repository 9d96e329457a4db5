//! Storage restarted while the soak runs: Azurite stopped, kept down, started again on its port
//! with its data, each restart timed.

use std::time::{Duration, Instant};

use crate::stats::Restart;
use crate::Soak;

impl Soak<'_> {
    /// Stops and starts storage `restarts` times, evenly spread over the run.
    pub(crate) fn restarter(&self) {
        let n = self.options.restarts;
        let total = self.end - self.started;
        for k in 1..=n {
            let at = self.started + total.mul_f64(k as f64 / (n + 1) as f64);
            while Instant::now() < at {
                if !self.running() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("soak: restart {k}: stopping storage");
            let stopping = Instant::now();
            self.restarts.lock().expect("restarts").push(Restart {
                stopped: stopping - self.started,
                down: Duration::ZERO,
                start_took: Duration::ZERO,
                back: None,
                first_ok: vec![None; self.apps.len()],
            });
            self.azurite.stop();
            std::thread::sleep(self.options.outage);
            let start_took = self.azurite.start_again();
            let back = Instant::now();
            {
                let mut restarts = self.restarts.lock().expect("restarts");
                let r = restarts.last_mut().expect("pushed above");
                r.down = back - stopping;
                r.start_took = start_took;
                r.back = Some(back);
            }
            eprintln!(
                "soak: restart {k}: storage back after {:.1} s (starting took {:.1} s)",
                (back - stopping).as_secs_f64(),
                start_took.as_secs_f64()
            );
        }
    }
}
