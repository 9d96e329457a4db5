//! The references of issue 34's ratios: the hello-world component (the floor's reference), the
//! limit of the throttled decision at c=1, and the ratios the issue names, from one run.

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::time::SystemTime;

use leasegate::ops::{build, GetProperties};
use leasegate::{Account, BlobName};
use leasegate_tests::app::{root, App};
use leasegate_tests::load::{http_request, Cell, Expect, Measured, Then};
use leasegate_tests::spin::{Spin, SpinConfig};

use super::{reading, Bench, Figures, Row, Storage, ALERT_PREFIX};

/// The hello world's row name.
pub const HELLO: &str = "hello world: spin-sdk 5.2 #[http_component], the reading parsed";
/// The limit's row name.
pub const LIMIT: &str =
    "limit of the throttle, c=1: no-storage answer + raw HEAD via the proxy, back to back";

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
            http: true,
            clock_offset_ms: 0,
            runtime_config: None,
            env: Vec::new(),
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

/// The throttled row measured in turns with the limit.
pub const PAIRED: &str = "app: telemetry throttled, kv_cache=off, in turns with the limit";

/// Turns of the limit and the throttle it bounds: each 0.5 s, alternating, so that both see
/// the same machine (the other rows of the table ran minutes apart).
const LIMIT_TURNS: usize = 6;

/// The limit at c=1: the app's no-storage answer (`none`, the request of the below-threshold
/// row) and then the throttle's one storage request, a HEAD of the device's lock blob signed
/// here and sent through the app's own storage proxy (the path the app's request takes), back
/// to back on two keep-alive connections; measured in turns with the throttled decision
/// (`throttled`, `kv_cache = off`). Returns the limit's row and the paired throttle's.
pub fn limit_rows(
    bench: &mut Bench,
    app: &App,
    none: &(dyn Fn(usize) -> Vec<u8> + Sync),
    throttled: &(dyn Fn(usize) -> Vec<u8> + Sync),
) -> Vec<Row> {
    let levels = bench.options.concurrency.len();
    let mut limit = Row::new(LIMIT, Storage::One, levels);
    let mut paired = Row::new(PAIRED, Storage::One, levels);
    let Some(k) = bench.options.concurrency.iter().position(|&c| c == 1) else {
        limit.skipped = Some("c=1 is not among the levels".into());
        paired.skipped = Some("c=1 is not among the levels".into());
        return vec![paired, limit];
    };
    let origin = app.storage.origin();
    let proxy: SocketAddr = origin
        .trim_start_matches("http://")
        .parse()
        .expect("the storage proxy listens on an IP address");
    let account = Account::development(&format!(
        "{origin}/{}",
        leasegate::account::DEV_ACCOUNT_NAME
    ))
    .expect("the proxy's endpoint");
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
    let below = Expect {
        status: 200,
        body_contains: Some("\"below_threshold\""),
    };
    let found = Expect {
        status: 200,
        body_contains: None,
    };
    let throttle = Expect {
        status: 200,
        body_contains: Some("\"throttled\""),
    };
    let mut sums = [Measured::default(), Measured::default()];
    for turn in 0..LIMIT_TURNS {
        for which in [turn % 2, 1 - turn % 2] {
            let cell = Cell {
                addr: app.spin.addr(),
                connections: 1,
                warmup: if turn == 0 {
                    bench.warmup()
                } else {
                    std::time::Duration::from_millis(50)
                },
                measure: std::time::Duration::from_millis(500),
                request: if which == 0 { none } else { throttled },
                expect: if which == 0 { &below } else { &throttle },
                then: (which == 0).then_some(Then {
                    addr: proxy,
                    request: &head,
                    expect: &found,
                }),
            };
            let m = cell.run();
            let s = &mut sums[which];
            s.decisions += m.decisions;
            s.seconds += m.seconds;
            s.latencies.extend(m.latencies);
            s.errors += m.errors;
            s.samples.extend(m.samples);
        }
    }
    let mut rows = Vec::new();
    for (mut row, mut m) in [
        (paired, std::mem::take(&mut sums[1])),
        (limit, std::mem::take(&mut sums[0])),
    ] {
        m.latencies.sort_unstable();
        m.samples.truncate(3);
        let figures = Figures::from(&m);
        bench.progress(&row.name, 1, &figures);
        row.cells[k] = Some(figures);
        rows.push(row);
    }
    rows
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
    let throttled =
        find("app: telemetry throttled, kv_cache=off").or_else(|| find("app: telemetry throttled"));
    let paired = find(PAIRED);
    let cached = find("app: telemetry throttled, kv_cache=on");
    let floor = find("app: no storage");
    let hello = find("hello world");
    let limit = find("limit of the throttle");
    let js = rows
        .iter()
        .find(|r| r.name.starts_with("JS SDK") && r.name.contains("409") && r.skipped.is_none());
    let python = rows.iter().find(|r| {
        r.name.starts_with("Python SDK") && r.name.contains("409") && r.skipped.is_none()
    });
    let reacquire = find("app: gate re-acquire");
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
        println!("  {label:<36} {:<34} [{target}]", parts.join("   "));
    };
    line(
        "throttled ÷ limit (in turns)",
        paired,
        limit,
        &[1],
        "≥ 0.90",
    );
    line("throttled ÷ JS SDK (409)", throttled, js, &[1, 16], "≥ 1.2");
    line(
        "throttled ÷ Python SDK (409)",
        throttled,
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
        "  {:<36} {:<34} [2× today's]",
        "gate re-acquire by its holder",
        parts.join("   ")
    );
}

/// Rounds per level of the floor section: its targets take turns, so that a burst of other
/// work on the machine falls on all of them alike.
const ROUNDS: usize = 8;

/// `--only floor`: the below-threshold answer of device-alerts (no storage, no key-value store)
/// from each `--components DIR`'s `device_alerts.wasm` (the release build by default), and
/// the hello world, each under its own `spin up`, in turns of 0.5 s at every level. For
/// comparing builds of the floor: one run, ratios within it.
pub fn floor_section(bench: &mut Bench) {
    let release = root().join("target/wasm32-wasip2/release");
    let dirs = if bench.options.components.is_empty() {
        vec![release.clone()]
    } else {
        bench.options.components.clone()
    };
    let token = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let manifest = std::fs::read_to_string(root().join("spin.toml")).expect("read spin.toml");
    let mut spins: Vec<(String, Spin)> = Vec::new();
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
        let spin = Spin::start(&SpinConfig {
            manifest: path,
            variables: vec![("telemetry_token".into(), token.clone())],
            http: true,
            clock_offset_ms: 0,
            runtime_config: None,
            env: Vec::new(),
        });
        let label = dir
            .strip_prefix(root())
            .unwrap_or(dir)
            .display()
            .to_string();
        spins.push((format!("device-alerts below threshold: {label}"), spin));
    }
    spins.push((
        HELLO.to_string(),
        Spin::start(&SpinConfig {
            manifest: root().join("tests/bench-hello/spin.toml"),
            variables: Vec::new(),
            http: true,
            clock_offset_ms: 0,
            runtime_config: None,
            env: Vec::new(),
        }),
    ));
    let auth = format!("Bearer {token}");
    let requests: Vec<Box<dyn Fn(usize) -> Vec<u8> + Sync>> = spins
        .iter()
        .map(|(_, spin)| {
            let host = spin.addr().to_string();
            let auth = auth.clone();
            Box::new(move |i: usize| {
                http_request(
                    "POST",
                    "/api/telemetry",
                    &host,
                    &[
                        ("authorization", &auth),
                        ("content-type", "application/json"),
                    ],
                    &reading(i, 12.0),
                )
            }) as Box<dyn Fn(usize) -> Vec<u8> + Sync>
        })
        .collect();
    let expect = Expect {
        status: 200,
        body_contains: Some("\"below_threshold\""),
    };
    let levels = bench.options.concurrency.clone();
    // Per target and level, its rounds together.
    let mut sums: Vec<Vec<Measured>> = (0..spins.len())
        .map(|_| (0..levels.len()).map(|_| Measured::default()).collect())
        .collect();
    for (k, &c) in levels.iter().enumerate() {
        for round in 0..ROUNDS {
            for t in 0..spins.len() {
                let t = (t + round) % spins.len();
                let m = Cell {
                    addr: spins[t].1.addr(),
                    connections: c,
                    warmup: std::time::Duration::from_millis(if round == 0 { 500 } else { 50 }),
                    measure: std::time::Duration::from_millis(500),
                    request: &*requests[t],
                    expect: &expect,
                    then: None,
                }
                .run();
                let s = &mut sums[t][k];
                s.decisions += m.decisions;
                s.seconds += m.seconds;
                s.latencies.extend(m.latencies);
                s.errors += m.errors;
            }
        }
        eprintln!("bench: floor c={c} done");
    }
    println!(
        "\nThe floor: device-alerts' below-threshold answer per build, and the hello world; {ROUNDS} \
         turns of 0.5 s per level, one keep-alive connection per thread; load average {}\n",
        super::load_average()
    );
    let mut header = vec!["target".to_string()];
    for c in &levels {
        header.push(format!("c={c} dec/s"));
        header.push("p50 ms".into());
        header.push("÷ hello".into());
    }
    header.push("errors".into());
    let mut lines = vec![header];
    let hello = spins.len() - 1;
    for s in sums.iter_mut().flatten() {
        s.latencies.sort_unstable();
    }
    for ((label, _), target) in spins.iter().zip(&sums) {
        let mut line = vec![label.clone()];
        let mut errors = 0;
        for (s, reference) in target.iter().zip(&sums[hello]) {
            line.push(format!("{:.0}", s.rate()));
            line.push(super::ms(s.percentile(500)));
            line.push(format!("{:.2}×", s.rate() / reference.rate().max(1e-9)));
            errors += s.errors;
        }
        line.push(errors.to_string());
        lines.push(line);
    }
    super::print_lines(&lines);
}
