//! The references of issue 34's ratios: the hello-world component (the floor's reference), the
//! limit of the throttled decision at c=1, and the ratios the issue names, from one run.

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::time::SystemTime;

use leasegate::ops::{build, GetProperties};
use leasegate::ContainerName;
use leasegate::{Account, BlobName};
use leasegate_tests::app::{root, App};
use leasegate_tests::load::{http_request, Cell, Expect, Measured, Then};
use leasegate_tests::sink::Sink;
use leasegate_tests::spin::{Spin, SpinConfig};
use leasegate_tests::Azurite;

use super::{reading, Bench, Figures, Row, Storage, Tokens, ALERT_PREFIX};

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
    let account = Account::development(&format!(
        "{origin}/{}",
        leasegate::account::DEV_ACCOUNT_NAME
    ))
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
        hello_with_head(&account, &origin, &heads[0])
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
    let azurite_addr: SocketAddr = azurite
        .authority()
        .parse()
        .expect("Azurite listens on an IP address");
    // (address, request, expected answer, then) of each target, in `turns`' order.
    type Target<'a> = (
        SocketAddr,
        &'a (dyn Fn(usize) -> Vec<u8> + Sync),
        &'a Expect,
        Option<Then<'a>>,
    );
    let mut targets: Vec<Target> = vec![
        (app.spin.addr(), &throttled, &throttle, None),
        (
            app.spin.addr(),
            &below,
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
            let s = &mut sums[t];
            s.decisions += m.decisions;
            s.seconds += m.seconds;
            s.latencies.extend(m.latencies);
            s.errors += m.errors;
            s.samples.extend(m.samples);
        }
    }
    for (row, m) in turns.iter_mut().zip(sums.iter_mut()) {
        m.latencies.sort_unstable();
        m.samples.truncate(3);
        let figures = Figures::from(&*m);
        bench.progress(&row.name, 1, &figures);
        row.cells[k] = Some(figures);
    }
    bench.cells_done += turns.len() - targets.len();
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

/// Rounds per level of the floor section: its targets take turns, so that a burst of other
/// work on the machine falls on all of them alike.
const ROUNDS: usize = 8;

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

/// One target of the floor section.
struct Target<'a> {
    label: String,
    /// The index of the target its ratio is to.
    reference: usize,
    addr: SocketAddr,
    request: Box<dyn Fn(usize) -> Vec<u8> + Sync>,
    expect: &'a Expect,
}

/// `--only floor`: two decisions of device-alerts from each `--components DIR`'s
/// `device_alerts.wasm` (the release build by default), each build under its own `spin up`
/// with its storage straight to the bench's Azurite (its own container, `kv_cache = off`) and
/// every variable from a static provider ([`leasegate_tests::spin::variables_in_memory`]):
///
/// * the below-threshold answer (no storage, no key-value store), against the hello world;
/// * the throttle (one HEAD), against the hello world sending the same kind of signed HEAD
///   through spin-sdk's `send` (tests/bench-hello's `/api/head/sdk`);
///
/// the throttle from the cache (`kv_cache = on`) against the build's own floor; and the first
/// two again with the variables read through Spin's environment provider (`spin up`'s default),
/// in turns of 0.5 s at every level. For comparing builds: one run, ratios within it.
pub fn floor_section(bench: &mut Bench) {
    let release = root().join("target/wasm32-wasip2/release");
    let dirs = if bench.options.components.is_empty() {
        vec![release.clone()]
    } else {
        bench.options.components.clone()
    };
    eprintln!("bench: starting Azurite and the webhook sink");
    let azurite = Azurite::shared();
    let origin = format!("http://{}", azurite.authority());
    let sink = Sink::start();
    let token = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let auth = format!("Bearer {token}");
    let connections = bench.max_connections();
    let manifest = std::fs::read_to_string(root().join("spin.toml")).expect("read spin.toml");
    // Per build: its label, its app with `kv_cache = off` and that app's container, and its app
    // with `kv_cache = on` (its own container: each device's alert there writes its entry).
    let mut builds: Vec<(String, Spin, ContainerName, Spin, Spin)> = Vec::new();
    for dir in &dirs {
        // The manifest lives elsewhere: its sources are absolute.
        let dir = &std::fs::canonicalize(dir).unwrap_or_else(|_| root().join(dir));
        let copy = root()
            .join("target")
            .join(format!("floor-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&copy).expect("make the manifest's folder");
        let text = manifest
            .replace(
                "source = \"target/wasm32-wasip2/release/device_alerts.wasm\"",
                &format!("source = \"{}/device_alerts.wasm\"", dir.display()),
            )
            .replace(
                "source = \"target/wasm32-wasip2/release/",
                &format!("source = \"{}/", release.display()),
            );
        let path = copy.join("spin.toml");
        std::fs::write(&path, text).expect("write the manifest");
        // `in_memory`: every variable from a static provider, as deployments are advised to
        // give them (the bench's default); else Spin's environment provider answers the reads
        // of the variables not given (`spin up`'s default).
        let start = |kv_cache: &str, container: &ContainerName, in_memory: bool| {
            let variables: Vec<(String, String)> = vec![
                ("telemetry_token".into(), token.clone()),
                ("storage_origin".into(), origin.clone()),
                ("container".into(), container.as_str().to_string()),
                ("kv_cache".into(), kv_cache.into()),
                ("alert_window_seconds".into(), super::ALERT_WINDOW.into()),
                ("notify_origin".into(), sink.origin()),
            ];
            let spin = Spin::start(&SpinConfig {
                manifest: path.clone(),
                runtime_config: in_memory
                    .then(|| leasegate_tests::spin::variables_in_memory(None, &path, &variables)),
                variables,
                variable_files: Vec::new(),
                http: true,
                clock_offset_ms: 0,
                env: super::spin_env(),
                quiet: true,
            });
            // Each connection's device alerts once: its gate is held for the rest of the run
            // (and, with the cache on, the alert's entry says so).
            super::hold_devices_at(
                &format!("http://{}/api/telemetry", spin.addr()),
                &token,
                connections,
            );
            spin
        };
        let container = leasegate_tests::unique_container("floor");
        let spin = start("off", &container, true);
        let cached = start("on", &leasegate_tests::unique_container("floor-kv"), true);
        let from_env = start(
            "off",
            &leasegate_tests::unique_container("floor-env"),
            false,
        );
        let label = dir
            .strip_prefix(root())
            .unwrap_or(dir)
            .display()
            .to_string();
        builds.push((
            format!("device-alerts: {label}"),
            spin,
            container,
            cached,
            from_env,
        ));
    }
    // The hello world's HEAD: the first build's device 0, signed once.
    let account = Account::development(&format!(
        "{origin}/{}",
        leasegate::account::DEV_ACCOUNT_NAME
    ))
    .expect("Azurite's endpoint");
    let hello = hello_with_head(
        &account,
        &origin,
        &GetProperties {
            container: builds[0].2.clone(),
            blob: BlobName::try_new(&format!("{ALERT_PREFIX}bench-device-0")).expect("a blob name"),
        },
    );
    let request = |addr: SocketAddr, path: &'static str, temperature: f64| {
        let host = addr.to_string();
        let auth = auth.clone();
        Box::new(move |i: usize| {
            http_request(
                "POST",
                path,
                &host,
                &[
                    ("authorization", &auth),
                    ("content-type", "application/json"),
                ],
                &reading(i, temperature),
            )
        }) as Box<dyn Fn(usize) -> Vec<u8> + Sync>
    };
    let below = Expect {
        status: 200,
        body_contains: Some("\"below_threshold\""),
    };
    let throttled = super::throttled_expect();
    let throttled_from_cache = Expect {
        status: 200,
        body_contains: Some("\"cached\":true"),
    };
    let head_answered = Expect {
        status: 200,
        body_contains: Some("\"storageStatus\":200"),
    };
    // The builds' floors, the hello world, the builds' throttles, the hello world's HEAD, the
    // builds' throttles from the cache; each build's ratio is to the hello world of its
    // decision, the cached throttle's to the build's own floor.
    let n = builds.len();
    let target =
        |label: String, reference: usize, spin: &Spin, path: &'static str, temperature| Target {
            label,
            reference,
            addr: spin.addr(),
            request: request(spin.addr(), path, temperature),
            expect: &below,
        };
    let mut targets: Vec<Target> = Vec::new();
    for (label, spin, _, _, _) in &builds {
        targets.push(target(
            format!("{label}, below threshold"),
            n,
            spin,
            "/api/telemetry",
            12.0,
        ));
    }
    targets.push(target(HELLO.to_string(), n, &hello, "/api/telemetry", 12.0));
    for (label, spin, _, _, _) in &builds {
        targets.push(Target {
            expect: &throttled,
            ..target(
                format!("{label}, throttled (kv_cache=off)"),
                2 * n + 1,
                spin,
                "/api/telemetry",
                36.0,
            )
        });
    }
    targets.push(Target {
        expect: &head_answered,
        ..target(
            "hello world + one signed HEAD (spin-sdk send)".to_string(),
            2 * n + 1,
            &hello,
            "/api/head/sdk",
            12.0,
        )
    });
    for (i, (label, _, _, cached, _)) in builds.iter().enumerate() {
        targets.push(Target {
            expect: &throttled_from_cache,
            ..target(
                format!("{label}, throttled from the cache (kv_cache=on) ÷ its floor"),
                i,
                cached,
                "/api/telemetry",
                36.0,
            )
        });
    }
    // The same two decisions with the variables read through Spin's environment provider.
    for (label, _, _, _, from_env) in &builds {
        let below_label = format!("{label}, below threshold, variables from the environment");
        targets.push(target(below_label, n, from_env, "/api/telemetry", 12.0));
        targets.push(Target {
            expect: &throttled,
            ..target(
                format!("{label}, throttled (kv_cache=off), variables from the environment"),
                2 * n + 1,
                from_env,
                "/api/telemetry",
                36.0,
            )
        });
    }
    let levels = bench.options.concurrency.clone();
    // Per target and level, its rounds together.
    let mut sums: Vec<Vec<Measured>> = (0..targets.len())
        .map(|_| (0..levels.len()).map(|_| Measured::default()).collect())
        .collect();
    for (k, &c) in levels.iter().enumerate() {
        for round in 0..ROUNDS {
            for t in 0..targets.len() {
                let t = (t + round) % targets.len();
                let target = &targets[t];
                let m = Cell {
                    addr: target.addr,
                    connections: c,
                    warmup: std::time::Duration::from_millis(if round == 0 { 500 } else { 50 }),
                    measure: std::time::Duration::from_millis(500),
                    request: &*target.request,
                    expect: target.expect,
                    then: None,
                }
                .run();
                let s = &mut sums[t][k];
                s.decisions += m.decisions;
                s.seconds += m.seconds;
                s.latencies.extend(m.latencies);
                s.errors += m.errors;
                s.samples.extend(m.samples);
            }
        }
        eprintln!("bench: floor c={c} done");
    }
    println!(
        "\nThe floor and the throttle: device-alerts per build (storage straight to Azurite), \
         against the hello world and the hello world with one HEAD, and the throttle from the \
         cache against the build's floor; {ROUNDS} turns of 0.5 s per level, one keep-alive \
         connection per thread; load average {}\n",
        super::load_average()
    );
    let mut header = vec!["target".to_string()];
    for c in &levels {
        header.push(format!("c={c} dec/s"));
        header.push("p50 ms".into());
        header.push("÷ ref".into());
    }
    header.push("errors".into());
    let mut lines = vec![header];
    for s in sums.iter_mut().flatten() {
        s.latencies.sort_unstable();
    }
    let mut samples = Vec::new();
    for (target, measured) in targets.iter().zip(&sums) {
        let label = &target.label;
        let mut line = vec![label.clone()];
        let mut errors = 0;
        for (s, r) in measured.iter().zip(&sums[target.reference]) {
            line.push(format!("{:.0}", s.rate()));
            line.push(super::ms(s.percentile(500)));
            line.push(format!("{:.2}×", s.rate() / r.rate().max(1e-9)));
            errors += s.errors;
            samples.extend(s.samples.iter().take(2).map(|x| format!("{label}: {x}")));
        }
        line.push(errors.to_string());
        lines.push(line);
    }
    super::print_lines(&lines);
    for sample in samples.iter().take(6) {
        println!("ERROR {sample}");
    }
}
