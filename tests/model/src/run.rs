//! Running a check: exhaustive (depth-first over every state up to the bound) or a seeded random
//! simulation, with a report of what was explored and every counterexample as a trace.

use std::time::{Duration, Instant};

use stateright::{Checker, Model, UniformChooser};

use crate::trace;
use crate::world::{Protocol, World};

/// What a check explored and found.
#[derive(Debug)]
pub struct Report {
    /// What was checked.
    pub name: String,
    /// States visited.
    pub states: usize,
    /// Distinct states.
    pub unique: usize,
    /// The longest path.
    pub depth: usize,
    /// How long it took.
    pub elapsed: Duration,
    /// Every state up to the bound was explored (not cut by the time limit).
    pub complete: bool,
    /// Each property broken, with its counterexample step by step.
    pub counterexamples: Vec<(String, String)>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} states ({} distinct), depth {}, {:.1} s, {}, {}",
            self.name,
            self.states,
            self.unique,
            self.depth,
            self.elapsed.as_secs_f64(),
            if self.complete {
                "every state up to the bound"
            } else {
                "cut by the time limit"
            },
            match self.counterexamples.len() {
                0 => "no counterexample".to_string(),
                n => format!("{n} COUNTEREXAMPLE(S)"),
            }
        )
    }
}

/// Explores every state of `protocol` up to its bound (or until `limit`), on `threads` threads.
pub fn exhaustive<P: Protocol>(name: &str, protocol: P, threads: usize, limit: Duration) -> Report {
    let started = Instant::now();
    let checker = World::new(protocol)
        .checker()
        .threads(threads)
        .timeout(limit)
        .spawn_dfs()
        .join();
    report(name, &checker, started, limit)
}

/// Random walks through `protocol`'s states from `seed` until `limit` (one thread, so that a
/// seed replays the same walks).
pub fn simulate<P: Protocol>(name: &str, protocol: P, seed: u64, limit: Duration) -> Report {
    let started = Instant::now();
    let checker = World::new(protocol)
        .checker()
        .threads(1)
        .timeout(limit)
        .spawn_simulation(seed, UniformChooser)
        .join();
    let mut report = report(name, &checker, started, limit);
    report.complete = false;
    report
}

fn report<P: Protocol>(
    name: &str,
    checker: &impl Checker<World<P>>,
    started: Instant,
    limit: Duration,
) -> Report {
    let elapsed = started.elapsed();
    let mut counterexamples: Vec<(String, String)> = checker
        .discoveries()
        .into_iter()
        .map(|(property, path)| (property.to_string(), trace::explain(checker.model(), &path)))
        .collect();
    counterexamples.sort();
    Report {
        name: name.to_string(),
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        elapsed,
        // The checker stops at its time limit: a run that ended before it explored everything.
        complete: elapsed + Duration::from_millis(500) < limit,
        counterexamples,
    }
}

/// Panics unless `report` explored its whole bound and found no counterexample (the tests'
/// assertion), printing it either way.
pub fn assert_holds(report: Report) {
    eprintln!("{report}");
    assert!(
        report.complete,
        "the bound was not explored in time: {report}"
    );
    if let Some((property, trace)) = report.counterexamples.first() {
        panic!("{property}:\n{trace}");
    }
}

/// The tests' time limit for one bounded check (far above what one takes).
pub const TEST_LIMIT: Duration = Duration::from_secs(600);
