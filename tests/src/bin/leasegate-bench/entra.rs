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
//! row). A second pair, storage alone, tells where a difference comes from: the same HEAD sent
//! by the load generator through a proxy to the same Azurite over HTTPS, signed with the key or
//! carrying a token (one minted by the test token service, as the app's are).
//!
//! At c=1 and c=16 the two arms of a pair take turns in short rounds, [`PAIRS`] pairs of
//! rounds, the first of each pair alternating (ABBAAB...), so that a drift or a burst in the
//! machine's load (the 2-core machine is shared) falls on both alike. Each round opens its
//! connections anew; the first round of an arm at a level runs after the bench's warm-up, the
//! others after [`SETTLE`] (the app's own connections to storage are pooled and stay warm). An
//! arm's rounds are merged into its cell; the ratio of each pair's two rates is kept too, and
//! their median and range printed, as a figure a burst in one round cannot move much.
//!
//! Storage requests (and the scheme they were signed with) are counted at the proxy in front of
//! Azurite and token requests at the app's token server, over every exchange of the rounds,
//! warm-ups included. It prints figures and asserts none.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};

use leasegate::ops::{build, CreateContainer, GetProperties, PutBlob, WriteOutcome};
use leasegate::{AccessToken, Account, BlobEndpoint, BlobName, Credential, TokenSource};
use leasegate::{DEV_ACCOUNT_KEY, DEV_ACCOUNT_NAME};
use leasegate_tests::app::{App, Entra, Setup};
use leasegate_tests::entra::{mint, TokenServer, DEFAULT_LIFETIME};
use leasegate_tests::proxy::Proxy;
use leasegate_tests::unique_container;

use crate::{
    hold_devices, load_average, ms, print_lines, setup_op, start_app_with, telemetry_request,
    throttled_expect, wire, Bench, Figures, Tokens,
};
use leasegate_tests::load::{Cell, Expect, Measured};

/// The concurrencies of the section (the benchmark: c=1 and c=16).
pub const LEVELS: [usize; 2] = [1, 16];
/// Cells the section adds to the bench's progress count (two pairs of arms per level).
pub const CELLS: usize = 4 * LEVELS.len();
/// Pairs of rounds per level.
const PAIRS: u32 = 10;
/// The app arms' measured time per level, in `--seconds` (a cell of the main table): more
/// than one, as the ratio of two arms is the figure sought here. Storage alone gets one.
const APP_SHARE: u32 = 2;
/// The warm-up of a round after the arm's first at a level.
const SETTLE: Duration = Duration::from_millis(20);
/// How long before it expires the app replaces a kept token (`leasegate_spin::token::
/// REFRESH_AHEAD`, not a dependency of the tests).
const REFRESH_AHEAD: Duration = Duration::from_secs(300);

/// One arm: where its load goes, and what its rounds measured.
struct Arm<'a> {
    name: &'static str,
    addr: SocketAddr,
    request: Box<dyn Fn(usize) -> Vec<u8> + Sync + 'a>,
    expect: Expect,
    /// The proxy in front of Azurite that the arm's storage requests pass.
    proxy: &'a Proxy,
    /// The app's token server (an app arm).
    token_server: Option<&'a TokenServer>,
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

impl<'a> Arm<'a> {
    fn new(
        name: &'static str,
        addr: SocketAddr,
        request: Box<dyn Fn(usize) -> Vec<u8> + Sync + 'a>,
        expect: Expect,
        proxy: &'a Proxy,
        token_server: Option<&'a TokenServer>,
    ) -> Arm<'a> {
        Arm {
            name,
            addr,
            request,
            expect,
            proxy,
            token_server,
            cells: LEVELS.iter().map(|_| None).collect(),
            storage: 0,
            token_requests: 0,
            exchanges: 0,
            auth: BTreeSet::new(),
        }
    }

    /// An app arm: the throttled reading, storage behind the app's proxy.
    fn app(name: &'static str, app: &'a App, tokens: &Tokens) -> Arm<'a> {
        Arm::new(
            name,
            app.spin.addr(),
            Box::new(telemetry_request(
                &app.spin.addr().to_string(),
                &tokens.telemetry,
                36.0,
            )),
            throttled_expect(),
            &app.storage,
            app.tokens.as_ref(),
        )
    }

    fn token_count(&self) -> usize {
        self.token_server.map_or(0, TokenServer::count)
    }

    /// One round of `c` connections: a warm-up, then `measure`.
    fn round(&mut self, c: usize, warmup: Duration, measure: Duration) -> Measured {
        let storage_before = self.proxy.count();
        let tokens_before = self.token_count();
        let measured = Cell {
            addr: self.addr,
            connections: c,
            warmup,
            measure,
            request: &*self.request,
            expect: &self.expect,
            then: None,
        }
        .run();
        let seen = self.proxy.seen();
        self.auth
            .extend(seen.iter().skip(storage_before).map(|s| s.auth));
        self.storage += seen.len().saturating_sub(storage_before);
        self.token_requests += self.token_count() - tokens_before;
        self.exchanges += measured.exchanges;
        measured
    }
}

/// A pair of arms, A (SharedKey) and B (bearer), measured in turns.
struct Pair<'a> {
    arms: [Arm<'a>; 2],
    /// Each arm's measured time per level, in `--seconds`.
    share: u32,
    /// Per level, each pair of rounds' B rate ÷ A rate, ascending.
    ratios: Vec<Vec<f64>>,
}

impl Pair<'_> {
    fn run(&mut self, bench: &mut Bench) {
        let measure = bench.measure() * self.share / PAIRS;
        for (k, &c) in LEVELS.iter().enumerate() {
            let mut rounds: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
            let mut ratios = Vec::new();
            for pair in 0..PAIRS {
                let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
                for a in order {
                    let warmup = if pair == 0 { bench.warmup() } else { SETTLE };
                    let measured = self.arms[a].round(c, warmup, measure);
                    rounds[a].push(measured);
                }
                if let (Some(a), Some(b)) = (rounds[0].last(), rounds[1].last()) {
                    if a.rate() > 0.0 {
                        ratios.push(b.rate() / a.rate());
                    }
                }
            }
            ratios.sort_by(f64::total_cmp);
            self.ratios.push(ratios);
            for (a, r) in rounds.into_iter().enumerate() {
                let m = merged(r);
                let name = format!("Entra ID: {}", self.arms[a].name);
                bench.progress(&name, c, &Figures::from(&m));
                self.arms[a].cells[k] = Some(m);
            }
        }
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

/// An app for the section: [`Setup::entra`] with `extra` variables, its devices notified.
fn start(tokens: &Tokens, extra: &[(&str, &str)]) -> App {
    let setup = Setup {
        entra: Some(Entra::ManagedIdentity),
        ..super::setup()
    };
    let mut vars = vec![("kv_cache", "off")];
    vars.extend_from_slice(extra);
    let app = start_app_with("bench-entra", tokens, &vars, setup);
    hold_devices(&app, tokens, LEVELS.iter().copied().max().unwrap_or(1));
    app
}

/// The development account at `proxy` (plain HTTP in front of the HTTPS Azurite), signing with
/// `credential`.
fn account(proxy: &Proxy, credential: Credential) -> Result<Account, String> {
    let endpoint = format!("{}/{DEV_ACCOUNT_NAME}", proxy.origin());
    let endpoint = BlobEndpoint::try_new(&endpoint).map_err(|e| e.to_string())?;
    Ok(Account::new(DEV_ACCOUNT_NAME, endpoint, credential))
}

/// The storage pair's requests: a HEAD of one blob per connection, with the key and with a
/// token.
type HeadRequests = [(Account, Vec<GetProperties>); 2];

/// A blob per connection behind `proxy`, and a HEAD of each with the key and with a token.
fn storage_requests(proxy: &Proxy) -> Result<HeadRequests, String> {
    let key = leasegate::AccountKey::try_new(DEV_ACCOUNT_KEY).map_err(|e| e.to_string())?;
    let shared_key = account(proxy, Credential::SharedKey(key))?;
    let token = AccessToken::try_new(&mint(DEFAULT_LIFETIME)).map_err(|e| e.to_string())?;
    let bearer = account(proxy, Credential::Bearer(TokenSource::Fixed(token)))?;
    let container = unique_container("bench-entra");
    setup_op(
        &CreateContainer {
            container: container.clone(),
        },
        &shared_key,
    )?;
    let mut heads = Vec::new();
    for i in 0..LEVELS.iter().copied().max().unwrap_or(1) {
        let blob = BlobName::try_new(&format!("bench/head-{i}")).map_err(|e| e.to_string())?;
        let put = PutBlob::block(container.clone(), blob.clone(), Vec::new());
        match setup_op(&put, &shared_key)? {
            WriteOutcome::Written(_) => {}
            other => return Err(format!("creating {}: {other:?}", blob.as_str())),
        }
        heads.push(GetProperties {
            container: container.clone(),
            blob,
        });
    }
    Ok([(shared_key, heads.clone()), (bearer, heads)])
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
        let shared_key = start(
            &tokens,
            &[("storage_auth", ""), ("storage_key", DEV_ACCOUNT_KEY)],
        );
        let bearer = start(
            &tokens,
            &[
                ("storage_auth", "managed_identity"),
                ("storage_token_cache", "on"),
            ],
        );
        (shared_key, bearer)
    }));
    let (shared_key, bearer) = match started {
        Ok(apps) => apps,
        Err(panic) => {
            bench.cells_done += CELLS;
            println!(
                "\nEntra ID section skipped: the apps did not start: {}",
                panic_text(&*panic)
            );
            return;
        }
    };
    let tokens_at_start = bearer.tokens().count();
    let mut apps = Pair {
        arms: [
            Arm::app("app: SharedKey (the development key)", &shared_key, &tokens),
            Arm::app(
                "app: bearer (managed identity, token kept in the key-value store)",
                &bearer,
                &tokens,
            ),
        ],
        share: APP_SHARE,
        ratios: Vec::new(),
    };
    apps.run(bench);

    // Storage alone, through the SharedKey app's inspecting proxy (plain HTTP in, HTTPS to the
    // same Azurite).
    let proxy = shared_key
        .inspect
        .as_ref()
        .expect("an app under Setup::entra has its inspecting proxy");
    let mut storage = match storage_requests(proxy) {
        Ok(requests) => {
            let arm = |name, (account, heads): (Account, Vec<GetProperties>)| {
                let request = move |i: usize| {
                    wire(&build(&heads[i], &account, SystemTime::now()).expect("a HEAD builds"))
                };
                Arm::new(
                    name,
                    proxy.authority().parse().expect("the proxy's address"),
                    Box::new(request),
                    Expect {
                        status: 200,
                        body_contains: None,
                    },
                    proxy,
                    None,
                )
            };
            let [a, b] = requests;
            Some(Pair {
                arms: [
                    arm("storage alone: HEAD, SharedKey", a),
                    arm("storage alone: HEAD, bearer token", b),
                ],
                share: 1,
                ratios: Vec::new(),
            })
        }
        Err(e) => {
            eprintln!("bench: warning: Entra ID, storage alone: could not prepare the blobs: {e}");
            bench.cells_done += 2 * LEVELS.len();
            None
        }
    };
    if let Some(pair) = storage.as_mut() {
        pair.run(bench);
    }

    print_header(bench, &load_before);
    let pairs: Vec<&Pair> = std::iter::once(&apps).chain(storage.as_ref()).collect();
    print_table(&pairs);
    println!("\nbearer ÷ SharedKey:");
    for pair in &pairs {
        print_ratios(pair);
    }
    let [_, bearer_arm] = &apps.arms;
    let decisions: u64 = bearer_arm.cells.iter().flatten().map(|m| m.decisions).sum();
    println!(
        "\nToken requests: the bearer app {} during the rounds ({} exchanges, {} of them measured \
         decisions), {} since it started ({tokens_at_start} before the rounds: its first \
         invocations); the SharedKey app {}.",
        bearer_arm.token_requests,
        bearer_arm.exchanges,
        decisions,
        bearer.tokens().count(),
        shared_key.tokens().count(),
    );
    // A kept token is replaced REFRESH_AHEAD before it expires: one request per this long.
    let reuse = DEFAULT_LIFETIME.saturating_sub(REFRESH_AHEAD).as_secs_f64();
    if let Some(rate) = bearer_arm
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
    for pair in &pairs {
        for arm in &pair.arms {
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
}

fn print_header(bench: &Bench, load_before: &str) {
    let round = |share: u32| bench.options.seconds * f64::from(share) / f64::from(PAIRS);
    println!(
        "\nEntra ID: bearer token vs SharedKey over HTTPS, one Azurite --oauth basic. The app: \
         the throttled decision (kv_cache=off: one HEAD), Spin → HTTPS → test proxy → HTTPS → \
         Azurite (a proxy per app). Storage alone: the HEAD from the load generator → test \
         proxy → HTTPS → Azurite. Per arm and level {PAIRS} rounds of {} s (storage alone {} s), \
         the arms of a pair taking turns (ABBAAB...), after a {} s warm-up (the first round of \
         each arm) or {} ms; {} CPUs, load average {load_before} before and {} after",
        round(APP_SHARE),
        round(1),
        bench.options.warmup,
        SETTLE.as_millis(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    println!();
}

fn print_table(pairs: &[&Pair]) {
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
    for arm in pairs.iter().flat_map(|p| &p.arms) {
        let per_1000 = arm
            .token_server
            .filter(|_| arm.exchanges > 0)
            .map(|_| arm.token_requests as f64 * 1000.0 / arm.exchanges as f64);
        let mut line = vec![
            arm.name.to_string(),
            arm.auth.iter().copied().collect::<Vec<_>>().join(", "),
            crate::storage_per_decision(arm.storage, arm.exchanges)
                .map_or_else(|| "–".into(), |v| format!("{v:.2}")),
            per_1000.map_or_else(|| "–".into(), |v| format!("{v:.2}")),
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

fn print_ratios(pair: &Pair) {
    let [a, b] = &pair.arms;
    let what = b.name.split(':').next().unwrap_or("");
    for (k, c) in LEVELS.iter().enumerate() {
        let (Some(b), Some(a)) = (&b.cells[k], &a.cells[k]) else {
            continue;
        };
        let ratio = |x: Option<Duration>, y: Option<Duration>| match (x, y) {
            (Some(x), Some(y)) if !y.is_zero() => {
                format!("{:.2}×", x.as_secs_f64() / y.as_secs_f64())
            }
            _ => "–".into(),
        };
        let rate = if a.rate() > 0.0 {
            let r = b.rate() / a.rate();
            format!("{r:.2}× ({:+.1} %)", (r - 1.0) * 100.0)
        } else {
            "–".into()
        };
        let ratios = pair.ratios.get(k).map(Vec::as_slice).unwrap_or_default();
        let paired = match (median(ratios), ratios.first(), ratios.last()) {
            (Some(m), Some(lo), Some(hi)) => format!(
                "   the {} pairs of rounds: median {m:.2}× (from {lo:.2}× to {hi:.2}×)",
                ratios.len()
            ),
            _ => String::new(),
        };
        println!(
            "  {what:<13} c={c:<2}  decisions/s {rate}   p50 {}   p90 {}   p99 {}{paired}",
            ratio(b.percentile(500), a.percentile(500)),
            ratio(b.percentile(900), a.percentile(900)),
            ratio(b.percentile(990), a.percentile(990)),
        );
    }
}
