//! The fence protocol, model-checked: the core's fenced blob write and fenced table batch
//! (`leasegate::fence`), run by holders of tokens 1, 2 (and 3) all at once, in every
//! interleaving (a holder paused past its lease waking at any step), over the model's blob
//! tags and table partition (`FenceProtocol::bounded`, `faulty`, `two_faults`, `three`).

use leasegate_model::fence::FenceProtocol;
use leasegate_model::run::{self, assert_holds, TEST_LIMIT};

#[test]
fn two_holders_first_writes_race_and_no_stale_write_lands() {
    assert_holds(run::exhaustive(
        "fence, two holders from nothing, one fault",
        FenceProtocol::bounded(),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn one_fault_anywhere_lets_no_stale_write_land() {
    assert_holds(run::exhaustive(
        "fence, two holders, one fault",
        FenceProtocol::faulty(),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn two_faults_let_no_stale_write_land() {
    assert_holds(run::exhaustive(
        "fence, two holders, two faults",
        FenceProtocol::two_faults(),
        2,
        TEST_LIMIT,
    ));
}

#[test]
fn three_holders_let_no_stale_write_land() {
    assert_holds(run::exhaustive(
        "fence, three holders from nothing",
        FenceProtocol::three(),
        2,
        TEST_LIMIT,
    ));
}
