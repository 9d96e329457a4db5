//! The references of issue 34's ratios: the hello-world component (the floor's reference), the
//! limit of the throttled decision at c=1, and the ratios the issue names, from one run.
//!
//! The `--only floor` section, builds of device-alerts against the hello world, is
//! `floor/builds.rs`.

mod builds;

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::time::SystemTime;

use leasegate::ops::{build, GetProperties};
use leasegate::{Account, BlobName};
use leasegate_tests::app::{root, App};
use leasegate_tests::load::{http_request, Cell, Expect, Measured, Then};
use leasegate_tests::spin::{Spin, SpinConfig};
use leasegate_tests::Azurite;

use super::{reading, Bench, Figures, Row, Storage, Tokens, ALERT_PREFIX};

pub use builds::floor_section;

/// The hello world's row name.
pub const HELLO: &str = "hello world: spin-sdk 5.2 #[http_component], the reading parsed";
/// The limit's row name.
pub const LIMIT: &str =
    "limit of the throttle, c=1: no-storage answer + raw HEAD straight to Azurite, back to back";

/// The hello world (`tests/bench-hello`) under its own `spin up`, sent the below-threshold
/// reading at every level; the Spin is returned so that it lives until the table is printed.
pub fn hello_row(bench: &mut Bench) -> (Row, Option<Spin>) {
    let levels = bench.options.concurrency.len();
    let wasm = root().join("target/wasm32-wasip2/release/bench_hello.wasm");
    if !wasm.exists() {
        bench.cells_done += levels;
        let why = format!(
            "{} is not built (cargo build --release --target wasm32-wasip2 -p bench-hello)",
            wasm.display()
        );
        return (Row::skipped(HELLO, levels, why), None);
    }
    let started = std::panic::catch_unwind(AssertUnwindSafe(|| {
        Spin::start(&SpinConfig {
            manifest: root().join("tests/bench-hello/spin.toml"),
            variables: Vec::new(),
            variable_files: Vec::new(),
            http: true,
            clock_offset_ms: 0,
            runtime_config: None,
            env: super::spin_env(),
            quiet: true,
        })
    }));
    let Ok(spin) = started else {
        bench.cells_done += levels;
        return (
            Row::skipped(HELLO, levels, "spin up of tests/bench-hello failed"),
            None,
        );
    };
    let host = spin.addr().to_string();
    let request = move |i: usize| {
        http_request(
            "POST",
            "/api/telemetry",
            &host,
            &[
                ("authorization", "Bearer not-checked"),
                ("content-type", "application/json"),
            ],
            &reading(i, 12.0),
        )
    };
    let mut row = Row::new(HELLO, Storage::None, levels);
    bench.run_row(
        &mut row,
        spin.addr(),
        &request,
        &Expect {
            status: 200,
            body_contains: Some("\"below_threshold\""),
        },
    );
    (row, Some(spin))
}

/// The rows measured straight to storage.
pub const DIRECT: &str = "app: telemetry throttled, kv_cache=off, straight to Azurite";
/// The throttled row measured in turns with the limit.
pub const PAIRED: &str = "app: telemetry throttled, straight to Azurite, in turns with the limit";
/// The hello world's storage rows, in turns with the limit.
pub const HELLO_SDK: &str = "hello world + the same signed HEAD, spin-sdk send, in turns";
/// The same through the `wasi` outgoing handler.
pub const HELLO_WASI: &str = "hello world + the same signed HEAD, wasi outgoing-handler, in turns";

/// Turns of the limit and the decisions it bounds: each 0.5 s, in rotation, so that all see
/// the same machine (the other rows of the table ran minutes apart).
const LIMIT_TURNS: usize = 6;

/// What [`straight_rows`] keeps running until the table is printed (dropping it stops them).
pub struct Straight {
    /// The app whose storage origin is Azurite itself.
    _app: Option<App>,
    /// The hello world with the signed HEAD.
    _hello: Option<Spin>,
}

/// The throttle with nothing between Spin and storage, as the SDKs go (the table's other app
/// rows go through the counting proxy, which adds a hop): a second app whose `storage_origin`
/// is the bench's Azurite, `kv_cache = off`, its throttled row at every level ([`DIRECT`],
/// compared with the JavaScript SDK); then at c=1, in turns of 0.5 s:
///
/// * the **limit**: the app's no-storage answer and then the throttle's one storage request, a
///   HEAD of the device's lock blob signed here and sent straight to Azurite, back to back on
///   two keep-alive connections;
/// * the throttled decision ([`PAIRED`]);
/// * the hello world sending the same signed HEAD through spin-sdk's `send` and through the
///   `wasi` outgoing handler ([`HELLO_SDK`], [`HELLO_WASI`]): the least any spin-sdk component
///   does for a decision that asks storage once, and which of the two is faster.
pub fn straight_rows(
    bench: &mut Bench,
    tokens: &Tokens,
    azurite: &Azurite,
) -> (Vec<Row>, Straight) {
    let levels = bench.options.concurrency.len();
    let origin = format!("http://{}", azurite.authority());
    let mut overrides = vec![("storage_origin", origin.as_str())];
    if super::declares_kv_cache() {
        overrides.push(("kv_cache", "off"));
    }
    let started = std::panic::catch_unwind(AssertUnwindSafe(|| {
        super::start_app_with("bench-direct", tokens, &overrides, super::setup())
    }));
    let names = [DIRECT, PAIRED, LIMIT, HELLO_SDK, HELLO_WASI];
    let Ok(app) = started else {
        bench.cells_done += levels + 4;
        let rows = names
            .iter()
            .map(|n| Row::skipped(*n, levels, "the app did not start"))
            .collect();
        return (
            rows,
            Straight {
                _app: None,
                _hello: None,
            },
        );
    };
    super::hold_devices(&app, tokens, bench.max_connections());
    let host = app.spin.addr().to_string();
    let throttled = super::telemetry_request(&host, &tokens.telemetry, 36.0);
    let below = super::telemetry_request(&host, &tokens.telemetry, 12.0);
    let mut direct = Row::new(DIRECT, Storage::One, levels);
    bench.run_row(
        &mut direct,
        app.spin.addr(),
        &throttled,
        &super::throttled_expect(),
    );
    direct.reference = Some(409);

    let mut turns: Vec<Row> = [PAIRED, LIMIT, HELLO_SDK, HELLO_WASI]
        .iter()
        .map(|n| Row::new(*n, Storage::One, levels))
        .collect();
    let Some(k) = bench.options.concurrency.iter().position(|&c| c == 1) else {
        for row in &mut turns {
            row.skipped = Some("c=1 is not among the levels".into());
        }
        bench.cells_done += turns.len();
        let mut rows = vec![direct];
        rows.extend(turns);
        return (
            rows,
            Straight {
                _app: Some(app),
                _hello: None,
            },
        );
    };
    let sent = Sent {
        app: &app,
        origin: &origin,
        azurite,
        throttled: &throttled,
        below: &below,
    };
    let hello = limit_in_turns(bench, &sent, &mut turns, k);
    let mut rows = vec![direct];
    rows.extend(turns);
    (
        rows,
        Straight {
            _app: Some(app),
            _hello: hello,
        },
    )
}

/// What the rows in turns send to the app of [`straight_rows`]: its throttled and its
/// below-threshold reading, and its storage (Azurite at `origin`).
struct Sent<'a> {
    app: &'a App,
    origin: &'a str,
    azurite: &'a Azurite,
    throttled: &'a (dyn Fn(usize) -> Vec<u8> + Sync),
    below: &'a (dyn Fn(usize) -> Vec<u8> + Sync),
}

/// One target of the rows in turns: (address, request, expected answer, then).
type Turn<'a> = (
    SocketAddr,
    &'a (dyn Fn(usize) -> Vec<u8> + Sync),
    &'a Expect,
    Option<Then<'a>>,
);

/// The rows of [`straight_rows`] measured at c=1 (level `k`) in turns: the throttled decision,
/// the limit, and the hello world sending the same signed HEAD both ways (started here, and
/// returned so that it lives until the table is printed).
fn limit_in_turns(bench: &mut Bench, sent: &Sent, turns: &mut [Row], k: usize) -> Option<Spin> {
    let (app, origin) = (sent.app, sent.origin);
    let account = Account::development(&format!("{origin}/{}", leasegate::DEV_ACCOUNT_NAME))
        .expect("Azurite's endpoint");
    let heads: Vec<GetProperties> = (0..bench.max_connections())
        .map(|i| GetProperties {
            container: app.container.clone(),
            blob: BlobName::try_new(&format!("{ALERT_PREFIX}bench-device-{i}"))
                .expect("a blob name"),
        })
        .collect();
    let head = |i: usize| {
        super::wire(&build(&heads[i], &account, SystemTime::now()).expect("a HEAD builds"))
    };
    let hello = std::panic::catch_unwind(AssertUnwindSafe(|| {
        hello_with_head(&account, origin, &heads[0])
    }))
    .ok();
    let hello_host = hello
        .as_ref()
        .map(|s| s.addr().to_string())
        .unwrap_or_default();
    let hello_request = |route: &'static str| {
        let host = hello_host.clone();
        move |i: usize| {
            http_request(
                "POST",
                route,
                &host,
                &[("content-type", "application/json")],
                &reading(i, 12.0),
            )
        }
    };
    let via_sdk = hello_request("/api/head/sdk");
    let via_wasi = hello_request("/api/head/wasi");
    let below_expect = Expect {
        status: 200,
        body_contains: Some("\"below_threshold\""),
    };
    let found = Expect {
        status: 200,
        body_contains: None,
    };
    let throttle = super::throttled_expect();
    let head_answered = Expect {
        status: 200,
        body_contains: Some("\"storageStatus\":200"),
    };
    let azurite_addr: SocketAddr = sent
        .azurite
        .authority()
        .parse()
        .expect("Azurite listens on an IP address");
    // Each target, in `turns`' order.
    let mut targets: Vec<Turn> = vec![
        (app.spin.addr(), sent.throttled, &throttle, None),
        (
            app.spin.addr(),
            sent.below,
            &below_expect,
            Some(Then {
                addr: azurite_addr,
                request: &head,
                expect: &found,
            }),
        ),
    ];
    if let Some(spin) = &hello {
        targets.push((spin.addr(), &via_sdk, &head_answered, None));
        targets.push((spin.addr(), &via_wasi, &head_answered, None));
    } else {
        for row in &mut turns[2..] {
            row.skipped = Some("spin up of tests/bench-hello failed".into());
        }
    }
    let mut sums = take_turns(bench, &targets);
    for (row, m) in turns.iter_mut().zip(sums.iter_mut()) {
        m.latencies.sort_unstable();
        m.samples.truncate(3);
        let figures = Figures::from(&*m);
        bench.progress(&row.name, 1, &figures);
        row.cells[k] = Some(figures);
    }
    bench.cells_done += turns.len() - targets.len();
    hello
}

/// [`LIMIT_TURNS`] turns of the targets at c=1, 0.5 s each, in rotation: each target's cells
/// together.
fn take_turns(bench: &Bench, targets: &[Turn]) -> Vec<Measured> {
    let mut sums: Vec<Measured> = targets.iter().map(|_| Measured::default()).collect();
    for turn in 0..LIMIT_TURNS {
        for t in 0..targets.len() {
            let t = (t + turn) % targets.len();
            let (addr, request, expect, then) = targets[t];
            let m = Cell {
                addr,
                connections: 1,
                warmup: if turn == 0 {
                    bench.warmup()
                } else {
                    std::time::Duration::from_millis(50)
                },
                measure: std::time::Duration::from_millis(500),
                request,
                expect,
                then,
            }
            .run();
            add(&mut sums[t], m);
        }
    }
    sums
}

/// Adds cell `m` to the target's sum of cells.
fn add(s: &mut Measured, m: Measured) {
    s.decisions += m.decisions;
    s.seconds += m.seconds;
    s.latencies.extend(m.latencies);
    s.errors += m.errors;
    s.samples.extend(m.samples);
}

/// The ratios issue 34 names, each within this run: decisions/s of `a` over `b` at level `c`.
pub fn print_issue_ratios(levels: &[usize], rows: &[Row]) {
    let find = |prefix: &str| {
        rows.iter()
            .find(|r| r.name.starts_with(prefix) && r.skipped.is_none())
    };
    let rate = |row: Option<&Row>, c: usize| -> Option<f64> {
        let k = levels.iter().position(|&l| l == c)?;
        row?.cells[k].as_ref().map(|f| f.rate).filter(|r| *r > 0.0)
    };
    let direct = find(DIRECT);
    let paired = find(PAIRED);
    let via_sdk = find(HELLO_SDK);
    let via_wasi = find(HELLO_WASI);
    let cached = find("app: telemetry throttled, kv_cache=on");
    let floor = find("app: no storage");
    let hello = find(HELLO);
    let limit = find(LIMIT);
    let js = rows
        .iter()
        .find(|r| r.name.starts_with("JS SDK") && r.name.contains("409") && r.skipped.is_none());
    let python = rows.iter().find(|r| {
        r.name.starts_with("Python SDK") && r.name.contains("409") && r.skipped.is_none()
    });
    // The deployment keeping its holders' gates where the build can (`kv_cache=on`).
    let reacquire = rows
        .iter()
        .find(|r| {
            r.name.starts_with("app: gate re-acquire")
                && r.name.ends_with("kv_cache=on")
                && r.skipped.is_none()
        })
        .or_else(|| find("app: gate re-acquire"));
    println!("\nIssue 34's ratios, decisions/s within this run (target in brackets):");
    let line = |label: &str, a: Option<&Row>, b: Option<&Row>, cs: &[usize], target: &str| {
        let parts: Vec<String> = cs
            .iter()
            .filter(|c| levels.contains(c))
            .map(|&c| match (rate(a, c), rate(b, c)) {
                (Some(x), Some(y)) => format!("c={c} {:.2}×", x / y),
                _ => format!("c={c} –"),
            })
            .collect();
        println!("  {label:<40} {:<34} [{target}]", parts.join("   "));
    };
    line(
        "throttled ÷ limit (in turns)",
        paired,
        limit,
        &[1],
        "≥ 0.90",
    );
    line(
        "  hello + HEAD ÷ limit: Spin's share",
        via_sdk,
        limit,
        &[1],
        "–",
    );
    line(
        "  throttled ÷ hello + HEAD: the app's",
        paired,
        via_sdk,
        &[1],
        "–",
    );
    line(
        "wasi handler ÷ spin-sdk send (in turns)",
        via_wasi,
        via_sdk,
        &[1],
        "> 1: use wasi",
    );
    line("throttled ÷ JS SDK (409)", direct, js, &[1, 16], "≥ 1.2");
    line(
        "throttled ÷ Python SDK (409)",
        direct,
        python,
        &[1, 16],
        "–",
    );
    line("cached throttle ÷ floor", cached, floor, levels, "≥ 0.95");
    line("floor ÷ hello world", floor, hello, levels, "≥ 0.90");
    let parts: Vec<String> = levels
        .iter()
        .map(|&c| match rate(reacquire, c) {
            Some(r) => format!("c={c} {r:.0}/s"),
            None => format!("c={c} –"),
        })
        .collect();
    println!(
        "  {:<40} {:<34} [2× today's]",
        "gate re-acquire by its holder",
        parts.join("   ")
    );
}

/// The hello world under its own `spin up`, sending `head` on its `/api/head` routes, signed
/// here once (a SharedKey signature stays valid while its date is within Azurite's allowance;
/// the bench's sections take seconds to minutes).
fn hello_with_head(account: &Account, origin: &str, head: &GetProperties) -> Spin {
    let signed = build(head, account, SystemTime::now()).expect("a HEAD builds");
    let header_lines: Vec<String> = signed
        .headers()
        .iter()
        .map(|(name, value)| format!("{name}: {value}"))
        .collect();
    Spin::start(&SpinConfig {
        manifest: root().join("tests/bench-hello/spin.toml"),
        variables: vec![
            ("head_origin".into(), origin.to_string()),
            ("head_path".into(), signed.path_and_query()),
            ("head_headers".into(), header_lines.join("\n")),
        ],
        variable_files: Vec::new(),
        http: true,
        clock_offset_ms: 0,
        runtime_config: None,
        env: super::spin_env(),
        quiet: true,
    })
}
