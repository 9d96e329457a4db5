//! Entra ID: the throttled decision with a bearer token against the same decision with
//! SharedKey, both over HTTPS to the same Azurite.
//!
//! Two apps under the real `spin up`, started alike ([`Setup::entra`]): each reaches the
//! Azurite that checks bearer tokens (`--oauth basic`, HTTPS; it accepts SharedKey too) through
//! its own test proxy in TLS-to-TLS mode, Spin → HTTPS → proxy → HTTPS → Azurite, and each has
//! its own token server. They differ only in how they sign:
//!
//! - **SharedKey**: `storage_auth` emptied and the development key given back;
//! - **bearer**: `storage_auth = managed_identity` against the token server's identity
//!   endpoint, the token kept in the key-value store between invocations
//!   (`storage_token_cache = on`).
//!
//! Both serve the throttled decision with `kv_cache = off`: a reading of a device already
//! notified, one HEAD of its lock blob (as the main table's "telemetry throttled, kv_cache=off"
//! row). At c=1 and c=16 the arms take turns in short rounds, [`PAIRS`] pairs of them making
//! [`CELL_SHARE`] times `--seconds` per arm, the first of each pair alternating (ABBAAB...),
//! so that a drift or a burst in the machine's load (the 2-core machine is shared) falls on
//! both alike. Each round opens its connections anew; the first round of an arm at a level
//! runs after the bench's warm-up, the others after [`SETTLE`] (the app's own connections to
//! storage are pooled and stay warm). An arm's rounds are merged into its cell; the ratio of
//! each pair's two rates is kept too, and their median and range printed, as a figure a burst
//! in one round cannot move much.
//!
//! Storage requests (and the scheme they were signed with) are counted at each app's proxy and
//! token requests at its token server, over every exchange of the rounds, warm-ups included.
//! It prints figures and asserts none.

use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use leasegate::account::DEV_ACCOUNT_KEY;
use leasegate_tests::app::{App, Entra, Setup};
use leasegate_tests::entra::DEFAULT_LIFETIME;

use crate::load::{Cell, Measured};
use crate::{
    hold_devices, load_average, ms, print_lines, start_app_with, telemetry_request,
    throttled_expect, Bench, Figures, Tokens,
};

/// The concurrencies of the section (the benchmark: c=1 and c=16).
pub const LEVELS: [usize; 2] = [1, 16];
/// Cells the section adds to the bench's progress count (two arms per level).
pub const CELLS: usize = 2 * LEVELS.len();
/// Pairs of rounds per level.
const PAIRS: u32 = 10;
/// Each arm's measured time per level, in `--seconds` (a cell of the main table): more than
/// one, as the ratio of two arms is the figure sought here.
const CELL_SHARE: u32 = 2;
/// The warm-up of a round after the arm's first at a level.
const SETTLE: Duration = Duration::from_millis(50);
/// How long before it expires the app replaces a kept token (`leasegate_spin::token::
/// REFRESH_AHEAD`, not a dependency of the tests).
const REFRESH_AHEAD: Duration = Duration::from_secs(300);

/// One arm: an app and what its rounds measured.
struct Arm {
    name: &'static str,
    app: App,
    /// Per level, the arm's rounds merged.
    cells: Vec<Option<Measured>>,
    /// Storage requests counted at the proxy during the rounds.
    storage: usize,
    /// Token requests counted at the token server during the rounds.
    token_requests: usize,
    /// Exchanges of the rounds (warm-ups and unexpected answers included).
    exchanges: u64,
    /// How the storage requests of the rounds were signed, as the proxy saw them.
    auth: BTreeSet<&'static str>,
}

impl Arm {
    fn start(name: &'static str, tokens: &Tokens, extra: &[(&str, &str)]) -> Arm {
        let setup = Setup {
            entra: Some(Entra::ManagedIdentity),
            ..Setup::default()
        };
        let app = start_app_with("bench-entra", tokens, extra, setup);
        hold_devices(&app, tokens, LEVELS.iter().copied().max().unwrap_or(1));
        Arm {
            name,
            app,
            cells: LEVELS.iter().map(|_| None).collect(),
            storage: 0,
            token_requests: 0,
            exchanges: 0,
            auth: BTreeSet::new(),
        }
    }

    /// One round of `c` connections: a warm-up, then `measure`.
    fn round(
        &mut self,
        tokens: &Tokens,
        c: usize,
        warmup: Duration,
        measure: Duration,
    ) -> Measured {
        let storage_before = self.app.storage.count();
        let tokens_before = self.app.tokens().count();
        let request = telemetry_request(&self.app.spin.addr().to_string(), &tokens.telemetry, 36.0);
        let measured = Cell {
            addr: self.app.spin.addr(),
            connections: c,
            warmup,
            measure,
            request: &request,
            expect: &throttled_expect(),
        }
        .run();
        let seen = self.app.storage.seen();
        self.auth
            .extend(seen.iter().skip(storage_before).map(|s| s.auth));
        self.storage += seen.len().saturating_sub(storage_before);
        self.token_requests += self.app.tokens().count() - tokens_before;
        self.exchanges += measured.exchanges;
        measured
    }

    fn per_1000(&self, count: usize) -> Option<f64> {
        (self.exchanges > 0).then(|| count as f64 * 1000.0 / self.exchanges as f64)
    }
}

/// Rounds run one after the other, as one cell: their decisions, times and latencies summed.
fn merged(rounds: Vec<Measured>) -> Measured {
    let mut all = Measured::default();
    for r in rounds {
        all.decisions += r.decisions;
        all.seconds += r.seconds;
        all.latencies.extend(r.latencies);
        all.errors += r.errors;
        all.exchanges += r.exchanges;
        for s in r.samples {
            if all.samples.len() < 3 {
                all.samples.push(s);
            }
        }
    }
    all.latencies.sort_unstable();
    all
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Runs the section and prints its table.
pub fn section(bench: &mut Bench) {
    eprintln!(
        "bench: Entra ID: starting Azurite --oauth basic and two apps (SharedKey, bearer token)"
    );
    let load_before = load_average();
    let tokens = Tokens {
        telemetry: format!("bench-{}", uuid::Uuid::new_v4().simple()),
        gate: format!("bench-{}", uuid::Uuid::new_v4().simple()),
    };
    let started = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let shared_key = Arm::start(
            "SharedKey (the development key)",
            &tokens,
            &[
                ("kv_cache", "off"),
                ("storage_auth", ""),
                ("storage_key", DEV_ACCOUNT_KEY),
            ],
        );
        let bearer = Arm::start(
            "bearer (managed identity, token kept in the key-value store)",
            &tokens,
            &[
                ("kv_cache", "off"),
                ("storage_auth", "managed_identity"),
                ("storage_token_cache", "on"),
            ],
        );
        [shared_key, bearer]
    }));
    let mut arms = match started {
        Ok(arms) => arms,
        Err(panic) => {
            bench.cells_done += CELLS;
            println!(
                "\nEntra ID section skipped: the apps did not start: {}",
                panic_text(&*panic)
            );
            return;
        }
    };
    let tokens_at_start: Vec<usize> = arms.iter().map(|a| a.app.tokens().count()).collect();
    let measure = bench.measure() * CELL_SHARE / PAIRS;
    // Per level, each pair's bearer rate ÷ SharedKey rate.
    let mut pair_ratios: Vec<Vec<f64>> = Vec::new();
    for (k, &c) in LEVELS.iter().enumerate() {
        let mut rounds: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
        let mut ratios = Vec::new();
        for pair in 0..PAIRS {
            let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
            for a in order {
                let warmup = if pair == 0 { bench.warmup() } else { SETTLE };
                let measured = arms[a].round(&tokens, c, warmup, measure);
                rounds[a].push(measured);
            }
            let (s, b) = (rounds[0].last(), rounds[1].last());
            if let (Some(s), Some(b)) = (s, b) {
                if s.rate() > 0.0 {
                    ratios.push(b.rate() / s.rate());
                }
            }
        }
        ratios.sort_by(f64::total_cmp);
        pair_ratios.push(ratios);
        for (a, r) in rounds.into_iter().enumerate() {
            let m = merged(r);
            bench.progress(
                &format!("Entra ID: {}", arms[a].name),
                c,
                &Figures::from(&m),
            );
            arms[a].cells[k] = Some(m);
        }
    }
    print(bench, &arms, &pair_ratios, &tokens_at_start, &load_before);
}

/// The median of ascending `v`.
fn median(v: &[f64]) -> Option<f64> {
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn print(
    bench: &Bench,
    arms: &[Arm; 2],
    pair_ratios: &[Vec<f64>],
    tokens_at_start: &[usize],
    load_before: &str,
) {
    println!(
        "\nEntra ID: bearer token vs SharedKey over HTTPS. The throttled decision (kv_cache=off: \
         one HEAD), Spin → HTTPS → test proxy → HTTPS → Azurite --oauth basic (one Azurite, one \
         proxy per app); per arm and level {PAIRS} rounds of {} s, the arms taking turns \
         (ABBAAB...), after a {} s warm-up (the first round of each arm) or {} ms; {} CPUs, \
         load average {load_before} before and {} after",
        bench.options.seconds * f64::from(CELL_SHARE) / f64::from(PAIRS),
        bench.options.warmup,
        SETTLE.as_millis(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    println!();
    let mut header = vec![
        "arm".to_string(),
        "signed at the proxy".into(),
        "storage req/decision".into(),
        "token req/1,000 decisions".into(),
    ];
    for c in LEVELS {
        header.push(format!("c={c} dec/s"));
        header.push("p50 ms".into());
        header.push("p90 ms".into());
        header.push("p99 ms".into());
    }
    header.push("errors".into());
    let mut lines = vec![header];
    for arm in arms {
        let mut line = vec![
            arm.name.to_string(),
            arm.auth.iter().copied().collect::<Vec<_>>().join(", "),
            crate::storage_per_decision(arm.storage, arm.exchanges)
                .map_or_else(|| "–".into(), |v| format!("{v:.2}")),
            arm.per_1000(arm.token_requests)
                .map_or_else(|| "–".into(), |v| format!("{v:.2}")),
        ];
        let mut errors = 0;
        for cell in &arm.cells {
            match cell {
                Some(m) => {
                    line.push(format!("{:.0}", m.rate()));
                    line.push(ms(m.percentile(500)));
                    line.push(ms(m.percentile(900)));
                    line.push(ms(m.percentile(990)));
                    errors += m.errors;
                }
                None => line.extend(["–".to_string(), "–".into(), "–".into(), "–".into()]),
            }
        }
        line.push(errors.to_string());
        lines.push(line);
    }
    print_lines(&lines);

    let [shared_key, bearer] = arms;
    println!("\nbearer ÷ SharedKey:");
    for (k, c) in LEVELS.iter().enumerate() {
        let (Some(b), Some(s)) = (&bearer.cells[k], &shared_key.cells[k]) else {
            continue;
        };
        let ratio = |x: Option<Duration>, y: Option<Duration>| match (x, y) {
            (Some(x), Some(y)) if !y.is_zero() => {
                format!("{:.2}×", x.as_secs_f64() / y.as_secs_f64())
            }
            _ => "–".into(),
        };
        let rate = if s.rate() > 0.0 {
            let r = b.rate() / s.rate();
            format!("{r:.2}× ({:+.1} %)", (r - 1.0) * 100.0)
        } else {
            "–".into()
        };
        let pairs = &pair_ratios[k];
        let paired = match (median(pairs), pairs.first(), pairs.last()) {
            (Some(m), Some(lo), Some(hi)) => format!(
                "   the {} pairs' decisions/s: median {m:.2}× (from {lo:.2}× to {hi:.2}×)",
                pairs.len()
            ),
            _ => String::new(),
        };
        println!(
            "  c={c:<2}  decisions/s {rate}   p50 {}   p90 {}   p99 {}{paired}",
            ratio(b.percentile(500), s.percentile(500)),
            ratio(b.percentile(900), s.percentile(900)),
            ratio(b.percentile(990), s.percentile(990)),
        );
    }
    let since_start = bearer.app.tokens().count();
    let decisions: u64 = bearer.cells.iter().flatten().map(|m| m.decisions).sum();
    println!(
        "\nToken requests: the bearer app {} during the rounds ({} exchanges, {} of them measured \
         decisions), {since_start} since it started ({} before the rounds: its first \
         invocations); the SharedKey app {}.",
        bearer.token_requests,
        bearer.exchanges,
        decisions,
        tokens_at_start[1],
        shared_key.app.tokens().count(),
    );
    // A kept token is replaced REFRESH_AHEAD before it expires: one request per this long.
    let reuse = DEFAULT_LIFETIME.saturating_sub(REFRESH_AHEAD).as_secs_f64();
    if let Some(rate) = bearer
        .cells
        .last()
        .and_then(|m| m.as_ref())
        .map(|m| m.rate())
    {
        if rate > 0.0 && reuse > 0.0 {
            println!(
                "A token lives {} s and is replaced {} s ahead: one request per {reuse:.0} s per \
                 key-value store, {:.4} per 1,000 decisions at c={}'s {rate:.0}/s.",
                DEFAULT_LIFETIME.as_secs(),
                REFRESH_AHEAD.as_secs(),
                1000.0 / (rate * reuse),
                LEVELS[LEVELS.len() - 1],
            );
        }
    }
    for arm in arms {
        for (k, cell) in arm.cells.iter().enumerate() {
            if let Some(m) = cell.as_ref().filter(|m| m.errors > 0) {
                println!(
                    "ERROR Entra ID {} c={}: {} unexpected answers, e.g. {}",
                    arm.name,
                    LEVELS[k],
                    m.errors,
                    m.samples.join(" | ")
                );
            }
        }
    }
}
