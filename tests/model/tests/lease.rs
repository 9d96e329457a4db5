//! The claim protocol, model-checked: every interleaving of three callers with mixed windows
//! (native and record), a fault or a clock advance at any step, and a prober after them,
//! against the core's own `Locks` (`LeaseProtocol::bounded`, `bounded_clock`).

use std::time::Duration;

use leasegate_model::lease::LeaseProtocol;
use leasegate_model::run::{self, Report};

fn holds(report: Report) {
    eprintln!("{report}");
    assert!(
        report.complete,
        "the bound was not explored in time: {report}"
    );
    if let Some((property, trace)) = report.counterexamples.first() {
        panic!("{property}:\n{trace}");
    }
}

const LIMIT: Duration = Duration::from_secs(600);

#[test]
fn one_fault_anywhere_breaks_no_property() {
    holds(run::exhaustive(
        "claim protocol, one fault",
        LeaseProtocol::bounded(),
        2,
        LIMIT,
    ));
}

#[test]
fn a_clock_advance_anywhere_breaks_no_property() {
    holds(run::exhaustive(
        "claim protocol, clock advances",
        LeaseProtocol::bounded_clock(),
        2,
        LIMIT,
    ));
}
