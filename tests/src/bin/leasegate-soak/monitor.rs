//! The soak's progress every minute: requests, answers by status, storage faults, Spin's
//! memory and open files, each minute's sample kept for the report.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::report;
use crate::stats::Sample;
use crate::Soak;

impl Soak<'_> {
    /// Every minute: progress and memory.
    pub(crate) fn monitor(&self) {
        let mut next = self.started;
        loop {
            self.sample(false);
            next += Duration::from_secs(60);
            while Instant::now() < next {
                if !self.running() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    pub(crate) fn sample(&self, last: bool) {
        let minute = self.started.elapsed().as_secs_f64() / 60.0;
        let (requests, by_status) = {
            let s = self.stats.lock().expect("stats");
            let mut by_status: BTreeMap<u16, u64> = BTreeMap::new();
            for ((_, status), n) in &s.statuses {
                *by_status.entry(*status).or_insert(0) += n;
            }
            (s.requests(), by_status)
        };
        let memory: Vec<report::Memory> = self.apps.iter().map(report::memory).collect();
        let fds: Vec<usize> = self
            .apps
            .iter()
            .map(|a| report::open_fds(&a.spin))
            .collect();
        let faults: usize = self
            .apps
            .iter()
            .flat_map(|a| a.storage.faults_applied())
            .map(|(_, n)| n)
            .sum();
        eprintln!(
            "soak: {minute:.1} min{}: {requests} requests; answers {}; storage faults {faults}; \
             Spin RSS in MiB {}",
            if last { " (end)" } else { "" },
            by_status
                .iter()
                .map(|(s, n)| format!("{} {n}", report::status_name(*s)))
                .collect::<Vec<_>>()
                .join(", "),
            memory
                .iter()
                .enumerate()
                .map(|(d, m)| format!("d{d} {} ({} fds)", report::memory_line(m), fds[d]))
                .collect::<Vec<_>>()
                .join("; ")
        );
        self.samples.lock().expect("samples").push(Sample {
            minute,
            requests,
            memory,
            fds,
        });
    }
}
