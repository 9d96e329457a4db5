//! The claim protocol, model-checked: every interleaving of three callers with mixed windows
//! (native and record), a fault or a clock advance at any step, and a prober after them,
//! against the core's own `Locks` (`LeaseProtocol::bounded`, `bounded_clock`); and holders
//! that extend from what they kept of their last call (`LeaseProtocol::bounded_kept`), and a new
//! holder that acquires from what the last one kept (`LeaseProtocol::bounded_new_holder`, and
//! a record's from the state its holder's release left: `bounded_new_record_holder`); and
//! first holders that claim a native lock in its blob's create
//! (`LeaseProtocol::bounded_first_create`, and a caller of its own id racing one:
//! `bounded_first_create_chosen`).

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

#[test]
fn calls_from_a_kept_state_with_one_fault_break_no_property() {
    assert_holds(run::exhaustive(
        "claim protocol from kept states, one fault",
        LeaseProtocol::bounded_kept(1, 0),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn calls_from_a_kept_state_with_a_clock_advance_break_no_property() {
    assert_holds(run::exhaustive(
        "claim protocol from kept states, clock advances",
        LeaseProtocol::bounded_kept(0, 1),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn a_new_holder_from_a_kept_state_with_one_fault_breaks_no_property() {
    assert_holds(run::exhaustive(
        "a new holder from a kept state, one fault",
        LeaseProtocol::bounded_new_holder(1, 0),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn a_new_holder_from_a_kept_state_with_a_clock_advance_breaks_no_property() {
    assert_holds(run::exhaustive(
        "a new holder from a kept state, clock advances",
        LeaseProtocol::bounded_new_holder(0, 1),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn a_new_record_holder_from_a_released_state_with_one_fault_breaks_no_property() {
    assert_holds(run::exhaustive(
        "a new record holder from the state a release left, one fault",
        LeaseProtocol::bounded_new_record_holder(1, 0),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn a_new_record_holder_from_a_released_state_with_a_clock_advance_breaks_no_property() {
    assert_holds(run::exhaustive(
        "a new record holder from the state a release left, clock advances",
        LeaseProtocol::bounded_new_record_holder(0, 1),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn first_holders_claiming_in_the_create_with_one_fault_break_no_property() {
    assert_holds(run::exhaustive(
        "claim protocol, the claim in the first create, one fault",
        LeaseProtocol::bounded_first_create(1, 0),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn first_holders_claiming_in_the_create_with_a_clock_advance_break_no_property() {
    assert_holds(run::exhaustive(
        "claim protocol, the claim in the first create, clock advances",
        LeaseProtocol::bounded_first_create(0, 1),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn a_chosen_id_racing_a_claiming_create_with_one_fault_breaks_no_property() {
    assert_holds(run::exhaustive(
        "claim protocol, a chosen id racing the claim in the first create, one fault",
        LeaseProtocol::bounded_first_create_chosen(),
        2,
        TEST_LIMIT,
    ));
}
