//! scheduled-job's storage requests per tick, counted at the proxy in front of storage under
//! the real `spin up`: a tick that runs, a repeated tick of that occurrence, a follower's tick
//! (another deployment), a tick that catches up (records missed ones), and a takeover (a retry
//! of a failed run). The counts are deterministic: asserted, and printed for the docs.

use std::time::Duration;

use leasegate_tests::app::{App, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::jobs::{clear_of_a_clean_up, early_in_a_period, occurrence_of, tick};
use leasegate_tests::sink::Behaviour;
use leasegate_tests::{unique_container, unix_now, wait_for};

#[test]
fn storage_requests_per_kind_of_tick() {
    let container = unique_container("requests");
    let start = |instance: &str, extra: &[(&'static str, &'static str)]| {
        let mut vars = vec![
            ("instance_id", instance),
            ("job_period_seconds", "20"),
            ("job_retries", "1"),
            ("job_retry_delay_seconds", "0"),
        ];
        vars.extend_from_slice(extra);
        App::start_with(
            "requests",
            &vars,
            Setup {
                container: Some(container.clone()),
                ..Setup::default()
            },
        )
    };
    let (a, b) = (start("node-a", &[]), start("node-b", &[]));
    // The runs below move the clean-up watermark (the clock minus the retention, 1 h by
    // default) across no multiple of the clean-up stride (16 periods): none lists the
    // reservations (the first one does, in a new log).
    clear_of_a_clean_up(3600, 320, 130);
    early_in_a_period(20, 5000);
    // The first tick creates the container and the log: not counted.
    let (first, _) = a.storage_requests(|| tick(&a, TIMER_AUTH, None));
    assert_eq!(first.json["decision"], "ran", "{}", first.text);
    let o = occurrence_of(&first);
    wait_for("the next occurrence", Duration::from_secs(25), || {
        (unix_now() >= o + 20).then_some(())
    });
    let (run, run_n) = a.storage_requests(|| tick(&a, TIMER_AUTH, None));
    assert_eq!(run.json["decision"], "ran", "{}", run.text);
    let o2 = occurrence_of(&run);
    let (repeat, repeat_n) = a.storage_requests(|| tick(&a, TIMER_AUTH, Some(o2)));
    assert_eq!(repeat.json["decision"], "skipped", "{}", repeat.text);
    let (follower, follower_n) = b.storage_requests(|| tick(&b, TIMER_AUTH, Some(o2)));
    assert_eq!(follower.json["decision"], "skipped", "{}", follower.text);
    // Two occurrences nobody ticks, then a tick that records them missed.
    wait_for("two occurrences to pass", Duration::from_secs(70), || {
        (unix_now() >= o2 + 60).then_some(())
    });
    let (catch_up, catch_up_n) = a.storage_requests(|| tick(&a, TIMER_AUTH, None));
    assert_eq!(catch_up.json["catchUp"]["missed"], 2, "{}", catch_up.text);
    // A failed run, then its retry by the other deployment (a takeover of the occurrence).
    let o4 = occurrence_of(&catch_up) + 20;
    wait_for("the next occurrence", Duration::from_secs(25), || {
        (unix_now() >= o4).then_some(())
    });
    a.sink.behave(Behaviour::Answer(500));
    let failed = tick(&a, ADMIN_AUTH, Some(o4));
    assert_eq!(failed.json["decision"], "failed", "{}", failed.text);
    let (retry, retry_n) = b.storage_requests(|| tick(&b, ADMIN_AUTH, Some(o4)));
    assert_eq!(retry.json["decision"], "ran", "{}", retry.text);
    assert_eq!(retry.json["entry"]["attempt"], 2, "{}", retry.text);
    println!("| tick | storage requests |");
    println!("|---|---|");
    println!("| a tick that runs (winner) | {run_n} |");
    println!("| the same occurrence ticked again (this deployment) | {repeat_n} |");
    println!("| a follower's tick (another deployment) | {follower_n} |");
    println!("| a winner that records 2 missed occurrences | {catch_up_n} |");
    println!("| a takeover: the retry of a failed run by another deployment | {retry_n} |");
    // Deterministic: the answers say the same.
    for (a, n) in [
        (&run, run_n),
        (&repeat, repeat_n),
        (&follower, follower_n),
        (&catch_up, catch_up_n),
        (&retry, retry_n),
    ] {
        assert_eq!(a.json["storageRoundTrips"], n, "{}", a.text);
    }
    // The winner's log is read once, before the job's lease, a record it takes with its claim
    // in one write from the lease as the previous run's release left it (kept in the log: no
    // read of the lock blob); its release goes before the log's end, which keeps the lease as
    // the release left it and writes at the ETag the log's start left (8), and so does the
    // record of the missed ones after it (11 with two missed, one read each). With
    // `job_retries` set, a repeated or a follower's on-time tick reads the reservation (a retry
    // could be due): 2.
    assert_eq!(
        (run_n, repeat_n, follower_n, catch_up_n, retry_n),
        (8, 2, 2, 11, 9)
    );
}
