//! The claim protocol, model-checked: every interleaving of three callers with mixed windows
//! (native and record), a fault or a clock advance at any step, and a prober after them,
//! against the core's own `Locks` (`LeaseProtocol::bounded`, `bounded_clock`).

use leasegate_model::lease::LeaseProtocol;
use leasegate_model::run::{self, assert_holds, TEST_LIMIT};

#[test]
fn one_fault_anywhere_breaks_no_property() {
    assert_holds(run::exhaustive(
        "claim protocol, one fault",
        LeaseProtocol::bounded(),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn a_clock_advance_anywhere_breaks_no_property() {
    assert_holds(run::exhaustive(
        "claim protocol, clock advances",
        LeaseProtocol::bounded_clock(),
        2,
        TEST_LIMIT,
    ));
}
