//! The table's rows and their figures, and the bench's run of a row at every concurrency with
//! its progress line.

use std::net::SocketAddr;
use std::time::Duration;

use leasegate_tests::load::{Cell, Expect, Measured};

use crate::args::Options;

/// One cell's figures, from the Rust load generator or from the SDK script.
pub(crate) struct Figures {
    pub(crate) rate: f64,
    pub(crate) p50: Option<Duration>,
    pub(crate) p90: Option<Duration>,
    pub(crate) p99: Option<Duration>,
    pub(crate) errors: u64,
    pub(crate) samples: Vec<String>,
}

impl From<&Measured> for Figures {
    fn from(m: &Measured) -> Figures {
        Figures {
            rate: m.rate(),
            p50: m.percentile(500),
            p90: m.percentile(900),
            p99: m.percentile(990),
            errors: m.errors,
            samples: m.samples.clone(),
        }
    }
}

/// Storage requests per decision.
pub(crate) enum Storage {
    /// One by construction (a single Lease Acquire).
    One,
    /// Counted at the proxy (`None`: nothing exchanged).
    Counted(Option<f64>),
    /// None by construction (the hello world has no storage).
    None,
}

pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) storage: Storage,
    /// One per concurrency; `None` where it did not run.
    pub(crate) cells: Vec<Option<Figures>>,
    pub(crate) skipped: Option<String>,
    /// The acquire status (201 or 409) of the storage rows this app row is compared with.
    pub(crate) reference: Option<u16>,
}

impl Row {
    pub(crate) fn new(name: impl Into<String>, storage: Storage, levels: usize) -> Row {
        Row {
            name: name.into(),
            storage,
            cells: (0..levels).map(|_| None).collect(),
            skipped: None,
            reference: None,
        }
    }

    pub(crate) fn skipped(name: impl Into<String>, levels: usize, why: impl Into<String>) -> Row {
        let mut row = Row::new(name, Storage::Counted(None), levels);
        row.skipped = Some(why.into());
        row
    }
}

pub(crate) struct Bench {
    pub(crate) options: Options,
    pub(crate) cells_total: usize,
    pub(crate) cells_done: usize,
}

impl Bench {
    pub(crate) fn measure(&self) -> Duration {
        Duration::from_secs_f64(self.options.seconds)
    }

    pub(crate) fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.options.warmup)
    }

    pub(crate) fn max_connections(&self) -> usize {
        self.options.concurrency.iter().copied().max().unwrap_or(1)
    }

    pub(crate) fn progress(&mut self, row: &str, c: usize, f: &Figures) {
        self.cells_done += 1;
        eprintln!(
            "bench: [{}/{}] {row} c={c}: {:.0}/s p50 {} p90 {} p99 {} ms, {} errors",
            self.cells_done,
            self.cells_total,
            f.rate,
            ms(f.p50),
            ms(f.p90),
            ms(f.p99),
            f.errors
        );
    }

    /// Runs `row` at every concurrency; returns how many exchanges it made in all.
    pub(crate) fn run_row(
        &mut self,
        row: &mut Row,
        addr: SocketAddr,
        request: &(dyn Fn(usize) -> Vec<u8> + Sync),
        expect: &Expect,
    ) -> u64 {
        let mut exchanges = 0;
        for (k, &c) in self.options.concurrency.clone().iter().enumerate() {
            let measured = Cell {
                addr,
                connections: c,
                warmup: self.warmup(),
                measure: self.measure(),
                request,
                expect,
                then: None,
            }
            .run();
            let figures = Figures::from(&measured);
            self.progress(&row.name, c, &figures);
            row.cells[k] = Some(figures);
            exchanges += measured.exchanges;
        }
        exchanges
    }
}

pub(crate) fn ms(d: Option<Duration>) -> String {
    match d {
        Some(d) => format!("{:.2}", d.as_secs_f64() * 1000.0),
        None => "–".into(),
    }
}

/// Storage requests per decision: what the proxy in front of storage counted during a row,
/// over the exchanges the row made.
pub(crate) fn storage_per_decision(requests: usize, exchanges: u64) -> Option<f64> {
    (exchanges > 0).then(|| requests as f64 / exchanges as f64)
}
