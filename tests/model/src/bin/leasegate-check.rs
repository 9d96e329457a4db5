//! `leasegate-check`: the model checker from the command line (`scripts/dev.sh check`).
//!
//! * no flags: the bounded checks the test suite runs (`tests/model/tests/`), with their report;
//! * `--deep [--minutes N] [--seed S]`: larger bounds explored exhaustively for up to half the
//!   time, then seeded random walks through still larger ones for the rest; every run prints the
//!   states it explored, and a counterexample its seed (`--seed S` replays it) and its trace.
//!
//! Exits 1 when any property is broken.

use std::time::{Duration, SystemTime};

use leasegate_model::fence::FenceProtocol;
use leasegate_model::job::JobProtocol;
use leasegate_model::lease::LeaseProtocol;
use leasegate_model::run::{self, Report};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut deep = false;
    let mut minutes = 10.0_f64;
    let mut seed: Option<u64> = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--deep" => deep = true,
            "--minutes" => minutes = number(it.next(), "--minutes"),
            "--seed" => seed = Some(number(it.next(), "--seed")),
            "-h" | "--help" => {
                println!("usage: leasegate-check [--deep [--minutes N] [--seed S]]");
                return;
            }
            other => fail(&format!("unknown argument {other} (try --help)")),
        }
    }
    let reports = if deep {
        deep_checks(Duration::from_secs_f64(minutes * 60.0), seed)
    } else {
        bounded_checks()
    };
    let broken: Vec<&Report> = reports
        .iter()
        .filter(|r| !r.counterexamples.is_empty())
        .collect();
    println!();
    for report in &reports {
        println!("{report}");
    }
    for report in &broken {
        for (property, trace) in &report.counterexamples {
            println!("\n{}: property broken: {property}\n{trace}", report.name);
        }
    }
    if !broken.is_empty() {
        std::process::exit(1);
    }
}

fn number<T: std::str::FromStr>(value: Option<&String>, flag: &str) -> T {
    value
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fail(&format!("{flag} takes a number")))
}

fn fail(message: &str) -> ! {
    eprintln!("leasegate-check: {message}");
    std::process::exit(2)
}

fn announce(what: &str) {
    println!("checking {what} ...");
}

fn done(report: Report) -> Report {
    println!("  {report}");
    report
}

/// What `cargo test -p leasegate-model` checks.
fn bounded_checks() -> Vec<Report> {
    let limit = Duration::from_secs(600);
    let mut reports = Vec::new();
    for (name, protocol) in [
        ("claim protocol, one fault", LeaseProtocol::bounded()),
        (
            "claim protocol, clock advances",
            LeaseProtocol::bounded_clock(),
        ),
        (
            "claim protocol from kept states, one fault",
            LeaseProtocol::bounded_kept(1, 0),
        ),
        (
            "claim protocol from kept states, clock advances",
            LeaseProtocol::bounded_kept(0, 1),
        ),
        (
            "a new holder from a kept state, one fault",
            LeaseProtocol::bounded_new_holder(1, 0),
        ),
        (
            "a new holder from a kept state, clock advances",
            LeaseProtocol::bounded_new_holder(0, 1),
        ),
        (
            "a new record holder from the state a release left, one fault",
            LeaseProtocol::bounded_new_record_holder(1, 0),
        ),
        (
            "a new record holder from the state a release left, clock advances",
            LeaseProtocol::bounded_new_record_holder(0, 1),
        ),
        (
            "claim protocol, the claim in the first create, one fault",
            LeaseProtocol::bounded_first_create(1, 0),
        ),
        (
            "claim protocol, the claim in the first create, clock advances",
            LeaseProtocol::bounded_first_create(0, 1),
        ),
        (
            "claim protocol, a chosen id racing the claim in the first create, one fault",
            LeaseProtocol::bounded_first_create_chosen(),
        ),
    ] {
        announce(name);
        reports.push(done(run::exhaustive(name, protocol, 2, limit)));
    }
    for (name, protocol) in [
        (
            "fence, two holders from nothing, one fault",
            FenceProtocol::bounded(),
        ),
        ("fence, two holders, one fault", FenceProtocol::faulty()),
        (
            "fence, two holders, two faults",
            FenceProtocol::two_faults(),
        ),
        ("fence, three holders from nothing", FenceProtocol::three()),
    ] {
        announce(name);
        reports.push(done(run::exhaustive(name, protocol, 2, limit)));
    }
    for retries in [0, 1] {
        for (what, protocol) in [
            ("a late tick", JobProtocol::bounded(retries)),
            ("one fault, one crash", JobProtocol::faulty(retries)),
            ("a brand-new job, one crash", JobProtocol::fresh(retries)),
        ] {
            let name = format!("job protocol, {retries} retries, {what}");
            announce(&name);
            reports.push(done(run::exhaustive(&name, protocol, 2, limit)));
        }
    }
    reports
}

/// Larger bounds: exhaustive for half of `time`, then seeded walks.
fn deep_checks(time: Duration, seed: Option<u64>) -> Vec<Report> {
    let seed = seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let quarter = time / 4;
    let mut reports = Vec::new();

    let mut lease = LeaseProtocol::bounded();
    lease.faults = 2;
    lease.advances = 2;
    let name = "claim protocol, 2 faults, 2 clock advances (exhaustive)";
    announce(name);
    reports.push(done(run::exhaustive(name, lease.clone(), 2, quarter)));

    let mut job = JobProtocol::faulty(1);
    job.faults = 2;
    job.advances = 1;
    let name = "job protocol, 1 retry, 2 faults, 1 crash, 1 clock advance (exhaustive)";
    announce(name);
    reports.push(done(run::exhaustive(name, job.clone(), 2, quarter)));

    let name = "job protocol, a brand-new job, a slow first tick (exhaustive)";
    announce(name);
    reports.push(done(run::exhaustive(
        name,
        JobProtocol::fresh_slow_first(0),
        2,
        quarter,
    )));

    let mut fence = FenceProtocol::bounded();
    for h in &mut fence.holders {
        h.writes.push(leasegate_model::fence::Write::Table);
    }
    let name = "fence, two holders from nothing, four writes each, one fault (exhaustive)";
    announce(name);
    reports.push(done(run::exhaustive(name, fence, 2, quarter)));

    let mut fence = FenceProtocol::three();
    fence.faults = 1;
    let name = "fence, three holders, one fault (exhaustive)";
    announce(name);
    reports.push(done(run::exhaustive(name, fence, 2, quarter)));

    lease.faults = 4;
    lease.advances = 4;
    let name = format!("claim protocol, 4 faults, 4 clock advances (random walks, seed {seed})");
    announce(&name);
    reports.push(done(run::simulate(&name, lease, seed, quarter)));

    let mut job = JobProtocol::bounded(1);
    job.tickers
        .insert(1, JobProtocol::faulty(1).tickers[1].clone());
    job.faults = 4;
    job.crashes = 2;
    job.advances = 3;
    let name = format!(
        "job protocol, 4 deployments, 4 faults, 2 crashes, 3 clock advances (random walks, seed {seed})"
    );
    announce(&name);
    reports.push(done(run::simulate(&name, job, seed, quarter)));
    reports
}
