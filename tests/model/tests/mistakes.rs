//! The checker finds what it should: each planted mistake (a rewrite of the core's requests on
//! their way, made only here) breaks a property, and the counterexample reads step by step.

use leasegate_model::fence::{self, FenceProtocol};
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
        // Found in about a minute on a quiet 2-core machine (the outcome's compare-and-swap
        // takes the longest); the margin is for a machine building or testing beside it.
        .timeout(std::time::Duration::from_secs(360))
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
    // A record's claim lands with no condition, over what another caller was granted.
    assert!(
        trace.lines().any(|l| l.contains("?comp=metadata")
            && l.contains("holder=")
            && l.contains("term=record")
            && !l.contains("if-match=")),
        "{trace}"
    );
    assert!(trace.matches("concludes: Granted").count() >= 2, "{trace}");
}

#[test]
fn a_token_from_the_callers_clock_goes_back() {
    let trace = counterexample(
        LeaseProtocol::bounded().with_mistake(lease::Mistake::TokenFromCallerClock),
        "fencing tokens rise across holders, stay on extension",
    );
    // Caller b's clock is 30 s behind storage's: its claim records that clock's token.
    let behind = (leasegate_model::world::START - 30) << 16;
    assert!(
        trace.contains(&format!("recorded: Some({behind})")),
        "{trace}"
    );
}

/// The job protocol's liveness property, by its name.
const LIVENESS: &str = "every occurrence ticked is settled, in its reservation or its log entry, \
                        and no log entry is left running";

/// The job protocol's token property, by its name.
const TOKENS: &str = "tokens strictly rise in the order runs start: each call's was issued, and \
                      every token issued after a call is above it";

#[test]
fn tokens_by_occurrence_go_back_for_a_retry_after_a_newer_run() {
    let trace = counterexample(
        JobProtocol::faulty(1).with_mistake(job::Mistake::TokensByOccurrence),
        TOKENS,
    );
    // A second attempt of the first occurrence is called after the next occurrence's run.
    let first = leasegate_model::world::START;
    assert!(
        trace.contains(&format!("Called {{ occurrence: {first}, attempt: 2,")),
        "{trace}"
    );
}

#[test]
fn an_outcome_written_without_compare_and_swap_runs_an_attempt_twice() {
    // Two late ticks find the first tick's reservation left without an outcome (its tick
    // vanished) past its deadline: only the outcome's compare-and-swap keeps them from both
    // running it. (With one late tick, the run-deadline check before the job's call already
    // stops a reserver that comes back too late.)
    let mut protocol =
        JobProtocol::bounded(0).with_mistake(job::Mistake::OutcomeWithoutCompareAndSwap);
    let mut second = protocol.tickers[1].clone();
    second.instance = "node-e";
    protocol.tickers.insert(2, second);
    protocol.crashes = 1;
    let trace = counterexample(
        protocol,
        "each attempt of an occurrence is called at most once",
    );
    let occurrence = leasegate_model::world::START;
    let first = format!("Called {{ occurrence: {occurrence}, attempt: 1,");
    assert_eq!(trace.matches(&first).count(), 2, "{trace}");
    // Two writes of `running` with no condition.
    assert!(
        trace
            .lines()
            .filter(|l| l.contains("run=running") && !l.contains("if-match="))
            .count()
            >= 2,
        "{trace}"
    );
}

#[test]
fn a_vanished_reserver_with_no_later_tick_is_found_unsettled() {
    let trace = counterexample(JobProtocol::faulty(0).without_last(), LIVENESS);
    // A reservation is made and nothing after it writes its outcome.
    assert!(
        trace.contains("occurrences/001795096800 if-none-match=* -> 201"),
        "{trace}"
    );
}

#[test]
fn a_blob_write_without_its_tag_condition_lands_after_a_newer_holders() {
    let mut protocol = FenceProtocol::bounded()
        .only(fence::Write::Blob, 1)
        .with_mistake(fence::Mistake::FenceLeftOut);
    protocol.faults = 0;
    let trace = counterexample(
        protocol,
        "no write of the blob lands after a newer holder's fenced write",
    );
    // Token 1's put lands with no tag condition, after token 2's.
    let stale = trace
        .lines()
        .position(|l| {
            l.contains("PUT data/ledger/book.json")
                && l.contains("leasegate_fence=00000000000000000001")
                && !l.contains("if-tags=")
                && l.contains("-> 201")
        })
        .unwrap_or_else(|| panic!("{trace}"));
    assert!(
        trace
            .lines()
            .take(stale)
            .any(|l| l.contains("leasegate_fence=00000000000000000002") && l.contains("-> 201")),
        "{trace}"
    );
}

#[test]
fn a_batch_without_the_fence_entitys_if_match_lands_after_a_newer_holders() {
    let mut protocol = FenceProtocol::faulty()
        .only(fence::Write::Table, 1)
        .with_mistake(fence::Mistake::FenceLeftOut);
    protocol.faults = 0;
    let trace = counterexample(
        protocol,
        "no entity of the partition is inserted after a newer holder's fenced batch",
    );
    // Token 1's batch moves the fence entity back with no If-Match, after token 2's batch.
    assert!(
        trace
            .lines()
            .any(|l| l.contains("$batch [PUT leasegate-fence-")
                && l.contains("fencingToken=1] [POST e-1-0")
                && !l.contains("if-match=")
                && l.contains("-> 202")),
        "{trace}"
    );
}
