//! The checker finds what it should: each planted mistake (a rewrite of the core's requests on
//! their way, made only here) breaks a property, and the counterexample reads step by step.

use leasegate_model::job::{self, JobProtocol};
use leasegate_model::lease::{self, LeaseProtocol};
use leasegate_model::trace;
use leasegate_model::world::{Protocol, World};
use stateright::{Checker, HasDiscoveries, Model};

fn counterexample<P: Protocol>(protocol: P, property: &'static str) -> String {
    let checker = World::new(protocol)
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf([property].into()))
        .timeout(std::time::Duration::from_secs(120))
        .spawn_dfs()
        .join();
    let found: Vec<&str> = checker.discoveries().keys().copied().collect();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("the checker missed the mistake: found only {found:?}"));
    let trace = trace::explain(checker.model(), &path);
    eprintln!("{property}:\n{trace}");
    trace
}

#[test]
fn a_claim_written_without_if_match_makes_two_holders() {
    let trace = counterexample(
        LeaseProtocol::bounded().with_mistake(lease::Mistake::ClaimWithoutIfMatch),
        "one holder at a time",
    );
    assert!(trace.contains("?comp=metadata"), "{trace}");
    assert!(trace.contains("Granted"), "{trace}");
}

#[test]
fn a_token_from_the_callers_clock_goes_back() {
    let trace = counterexample(
        LeaseProtocol::bounded().with_mistake(lease::Mistake::TokenFromCallerClock),
        "fencing tokens rise across holders, stay on extension",
    );
    assert!(trace.contains("token="), "{trace}");
}

#[test]
fn an_outcome_written_without_compare_and_swap_runs_an_attempt_twice() {
    let trace = counterexample(
        JobProtocol::bounded(0).with_mistake(job::Mistake::OutcomeWithoutCompareAndSwap),
        "each attempt of an occurrence is called at most once",
    );
    assert!(trace.contains("run=running"), "{trace}");
}
