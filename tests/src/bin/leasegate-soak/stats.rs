//! What is counted of each answer the app gives: by kind of request and status, JSON 503s by
//! their `error`, the decisions, the answers kept in full, and the recovery after a restart.

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

use leasegate_tests::load::Answer;

use crate::report;
use crate::Soak;

/// The kinds of request sent to the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Telemetry,
    GatePost,
    GateDelete,
    JobTick,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Telemetry => "POST /api/telemetry",
            Kind::GatePost => "POST /api/gate/{key}",
            Kind::GateDelete => "DELETE /api/gate/{key}",
            Kind::JobTick => "POST /api/jobs/{job}/tick",
        }
    }
}

/// Answers outside 2xx/429/JSON 503 (and, under `--plain`, every non-2xx) kept in full.
const KEPT: usize = 200;

/// Everything counted while the soak runs.
#[derive(Debug, Default)]
pub struct Stats {
    /// Answers by kind and status (0: no answer, the connection failed).
    pub statuses: BTreeMap<(Kind, u16), u64>,
    /// JSON 503 answers by their `error`.
    pub codes: BTreeMap<String, u64>,
    /// Telemetry decisions (`throttled (cached)` apart).
    pub decisions: BTreeMap<String, u64>,
    /// Job tick decisions.
    pub ticks: BTreeMap<String, u64>,
    /// Answers outside 2xx, 429 and JSON 503: how many, and the first [`KEPT`] in full.
    pub outside: u64,
    pub outside_kept: Vec<String>,
    /// Every non-2xx answer (kept under `--plain`): how many, and the first [`KEPT`] in full.
    pub non_2xx: u64,
    pub non_2xx_kept: Vec<String>,
    /// Gate clients: grants, grants that came too late to work, holders that worked, fence
    /// writes refused, releases answered 204.
    pub gate: GateStats,
}

/// What the gate clients saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct GateStats {
    pub granted: u64,
    pub late: u64,
    pub worked: u64,
    pub fence_refused: u64,
    pub released: u64,
}

impl Stats {
    pub(crate) fn requests(&self) -> u64 {
        self.statuses.values().sum()
    }
}

/// One storage restart.
#[derive(Debug, Clone)]
pub struct Restart {
    /// When Azurite was stopped, from the soak's start.
    pub stopped: Duration,
    /// How long it was down (stopped until listening again).
    pub down: Duration,
    /// How long starting it took.
    pub start_took: Duration,
    /// When it listened again.
    pub back: Option<Instant>,
    /// Per deployment: the first 2xx decision that needed storage, sent after it was back.
    pub first_ok: Vec<Option<Duration>>,
}

/// One minute's memory reading.
#[derive(Debug, Clone)]
pub struct Sample {
    pub minute: f64,
    pub requests: u64,
    /// Per deployment: Spin's memory, and its open file descriptors.
    pub memory: Vec<report::Memory>,
    pub fds: Vec<usize>,
}

/// The JSON body of an answer (`Null` if it is not JSON).
pub(crate) fn json(a: &Answer) -> serde_json::Value {
    serde_json::from_slice(&a.body).unwrap_or(serde_json::Value::Null)
}

fn describe(kind: Kind, d: usize, a: &io::Result<Answer>) -> String {
    match a {
        Ok(a) => format!(
            "{} on deployment {d}: {} {}",
            kind.name(),
            a.status,
            String::from_utf8_lossy(&a.body)
                .chars()
                .take(600)
                .collect::<String>()
        ),
        Err(e) => format!("{} on deployment {d}: no answer: {e}", kind.name()),
    }
}

impl Soak<'_> {
    /// Counts one answer; `storage_ok` says whether it was a 2xx decision that needed storage.
    pub(crate) fn count(
        &self,
        kind: Kind,
        d: usize,
        sent: Instant,
        a: &io::Result<Answer>,
        storage_ok: bool,
    ) {
        let status = a.as_ref().map_or(0, |a| a.status);
        let body = a.as_ref().map(json).unwrap_or_default();
        let json_503 = status == 503 && body["error"].is_string();
        let allowed = (200..300).contains(&status) || status == 429 || json_503;
        {
            let mut s = self.stats.lock().expect("stats");
            *s.statuses.entry((kind, status)).or_insert(0) += 1;
            if json_503 {
                let code = body["error"].as_str().unwrap_or("").to_string();
                *s.codes.entry(code).or_insert(0) += 1;
            }
            if !allowed {
                s.outside += 1;
                if s.outside_kept.len() < KEPT {
                    s.outside_kept.push(describe(kind, d, a));
                }
            }
            if !(200..300).contains(&status) {
                s.non_2xx += 1;
                if self.options.plain && s.non_2xx_kept.len() < KEPT {
                    s.non_2xx_kept.push(describe(kind, d, a));
                }
            }
            match kind {
                Kind::Telemetry => {
                    for decision in body["decisions"].as_array().into_iter().flatten() {
                        let mut name = decision["decision"].as_str().unwrap_or("?").to_string();
                        if decision["cached"] == true {
                            name.push_str(" (cached)");
                        }
                        *s.decisions.entry(name).or_insert(0) += 1;
                    }
                }
                Kind::JobTick => {
                    let name = body["decision"].as_str().unwrap_or("(no decision)");
                    *s.ticks.entry(name.to_string()).or_insert(0) += 1;
                }
                _ => {}
            }
        }
        if storage_ok {
            let now = Instant::now();
            let mut restarts = self.restarts.lock().expect("restarts");
            if let Some(r) = restarts.last_mut() {
                if let Some(back) = r.back.filter(|back| sent >= *back) {
                    if r.first_ok[d].is_none() {
                        r.first_ok[d] = Some(now - back);
                    }
                }
            }
        }
    }
}
