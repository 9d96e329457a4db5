//! `--only floor`: builds of device-alerts on the floor and the throttle, each against the
//! hello world's two, in rounds at every level.

use std::net::SocketAddr;
use std::path::Path;

use leasegate::ops::GetProperties;
use leasegate::{Account, BlobName, ContainerName};
use leasegate_tests::app::root;
use leasegate_tests::load::{http_request, Cell, Expect, Measured};
use leasegate_tests::sink::Sink;
use leasegate_tests::spin::{Spin, SpinConfig};
use leasegate_tests::Azurite;

use super::{add, hello_with_head, HELLO};
use crate::{reading, Bench, ALERT_PREFIX};

/// Rounds per level of the floor section: its targets take turns, so that a burst of other
/// work on the machine falls on all of them alike.
const ROUNDS: usize = 8;

/// One target of the floor section.
struct Target<'a> {
    label: String,
    /// The index of the target its ratio is to.
    reference: usize,
    addr: SocketAddr,
    request: Box<dyn Fn(usize) -> Vec<u8> + Sync>,
    expect: &'a Expect,
}

/// One build of device-alerts in the floor section, each app under its own `spin up`.
struct Build {
    /// `device-alerts: {its folder}`.
    label: String,
    /// Its app with `kv_cache = off`.
    spin: Spin,
    /// That app's container.
    container: ContainerName,
    /// Its app with `kv_cache = on` (its own container: each device's alert there writes its
    /// entry).
    cached: Spin,
    /// Its app with `kv_cache = off`, its variables read through Spin's environment provider.
    from_env: Spin,
}

/// What every build's apps are given: the telemetry token, storage (the bench's Azurite), the
/// webhook sink, the connections whose devices they hold.
struct Given<'a> {
    token: &'a str,
    origin: &'a str,
    sink: &'a Sink,
    connections: usize,
}

/// The answers the floor section's targets count as decisions.
struct Expected {
    below: Expect,
    throttled: Expect,
    throttled_from_cache: Expect,
    head_answered: Expect,
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
    let given = Given {
        token: &token,
        origin: &origin,
        sink: &sink,
        connections,
    };
    let builds: Vec<Build> = dirs
        .iter()
        .map(|dir| start_build(dir, &release, &manifest, &given))
        .collect();
    // The hello world's HEAD: the first build's device 0, signed once.
    let account = Account::development(&format!("{origin}/{}", leasegate::DEV_ACCOUNT_NAME))
        .expect("Azurite's endpoint");
    let hello = hello_with_head(
        &account,
        &origin,
        &GetProperties {
            container: builds[0].container.clone(),
            blob: BlobName::try_new(&format!("{ALERT_PREFIX}bench-device-0")).expect("a blob name"),
        },
    );
    let expected = Expected {
        below: Expect {
            status: 200,
            body_contains: Some("\"below_threshold\""),
        },
        throttled: crate::throttled_expect(),
        throttled_from_cache: Expect {
            status: 200,
            body_contains: Some("\"cached\":true"),
        },
        head_answered: Expect {
            status: 200,
            body_contains: Some("\"storageStatus\":200"),
        },
    };
    let targets = floor_targets(&builds, &hello, &auth, &expected);
    let levels = bench.options.concurrency.clone();
    let mut sums = floor_rounds(&targets, &levels);
    println!(
        "\nThe floor and the throttle: device-alerts per build (storage straight to Azurite), \
         against the hello world and the hello world with one HEAD, and the throttle from the \
         cache against the build's floor; {ROUNDS} turns of 0.5 s per level, one keep-alive \
         connection per thread; load average {}\n",
        crate::load_average()
    );
    print_floor(&targets, &mut sums, &levels);
}

/// A build's three apps (`kv_cache = off`, `kv_cache = on`, and off with the variables from
/// the environment), from a copy of `spin.toml` (`manifest`) whose device-alerts is `dir`'s and
/// whose other components are the release build's.
fn start_build(dir: &Path, release: &Path, manifest: &str, given: &Given) -> Build {
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
    let container = leasegate_tests::unique_container("floor");
    let spin = start_floor_app(&path, given, "off", &container, true);
    let cached = start_floor_app(
        &path,
        given,
        "on",
        &leasegate_tests::unique_container("floor-kv"),
        true,
    );
    let from_env = start_floor_app(
        &path,
        given,
        "off",
        &leasegate_tests::unique_container("floor-env"),
        false,
    );
    let label = dir
        .strip_prefix(root())
        .unwrap_or(dir)
        .display()
        .to_string();
    Build {
        label: format!("device-alerts: {label}"),
        spin,
        container,
        cached,
        from_env,
    }
}

/// One app of a build, served from the manifest at `path`, with its device of each connection
/// holding its gate. `in_memory`: every variable from a static provider, as deployments are
/// advised to give them (the bench's default); else Spin's environment provider answers the
/// reads of the variables not given (`spin up`'s default).
fn start_floor_app(
    path: &Path,
    given: &Given,
    kv_cache: &str,
    container: &ContainerName,
    in_memory: bool,
) -> Spin {
    let variables: Vec<(String, String)> = vec![
        ("telemetry_token".into(), given.token.to_string()),
        ("storage_origin".into(), given.origin.to_string()),
        ("container".into(), container.as_str().to_string()),
        ("kv_cache".into(), kv_cache.into()),
        ("alert_window_seconds".into(), crate::ALERT_WINDOW.into()),
        ("notify_origin".into(), given.sink.origin()),
    ];
    let spin = Spin::start(&SpinConfig {
        manifest: path.to_path_buf(),
        runtime_config: in_memory
            .then(|| leasegate_tests::spin::variables_in_memory(None, path, &variables)),
        variables,
        variable_files: Vec::new(),
        http: true,
        clock_offset_ms: 0,
        env: crate::spin_env(),
        quiet: true,
    });
    // Each connection's device alerts once: its gate is held for the rest of the run (and,
    // with the cache on, the alert's entry says so).
    crate::hold_devices_at(
        &format!("http://{}/api/telemetry", spin.addr()),
        given.token,
        given.connections,
    );
    spin
}

/// The floor section's targets: the builds' floors, the hello world, the builds' throttles, the
/// hello world's HEAD, the builds' throttles from the cache, then each build's two decisions
/// with the variables from the environment. Each build's ratio is to the hello world of its
/// decision, the cached throttle's to the build's own floor.
fn floor_targets<'a>(
    builds: &[Build],
    hello: &Spin,
    auth: &str,
    expected: &'a Expected,
) -> Vec<Target<'a>> {
    let request = |addr: SocketAddr, path: &'static str, temperature: f64| {
        let host = addr.to_string();
        let auth = auth.to_string();
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
    let n = builds.len();
    let target =
        |label: String, reference: usize, spin: &Spin, path: &'static str, temperature| Target {
            label,
            reference,
            addr: spin.addr(),
            request: request(spin.addr(), path, temperature),
            expect: &expected.below,
        };
    let mut targets: Vec<Target> = Vec::new();
    for b in builds {
        targets.push(target(
            format!("{}, below threshold", b.label),
            n,
            &b.spin,
            "/api/telemetry",
            12.0,
        ));
    }
    targets.push(target(HELLO.to_string(), n, hello, "/api/telemetry", 12.0));
    for b in builds {
        targets.push(Target {
            expect: &expected.throttled,
            ..target(
                format!("{}, throttled (kv_cache=off)", b.label),
                2 * n + 1,
                &b.spin,
                "/api/telemetry",
                36.0,
            )
        });
    }
    targets.push(Target {
        expect: &expected.head_answered,
        ..target(
            "hello world + one signed HEAD (spin-sdk send)".to_string(),
            2 * n + 1,
            hello,
            "/api/head/sdk",
            12.0,
        )
    });
    for (i, b) in builds.iter().enumerate() {
        targets.push(Target {
            expect: &expected.throttled_from_cache,
            ..target(
                format!(
                    "{}, throttled from the cache (kv_cache=on) ÷ its floor",
                    b.label
                ),
                i,
                &b.cached,
                "/api/telemetry",
                36.0,
            )
        });
    }
    // The same two decisions with the variables read through Spin's environment provider.
    for b in builds {
        let below_label = format!(
            "{}, below threshold, variables from the environment",
            b.label
        );
        targets.push(target(below_label, n, &b.from_env, "/api/telemetry", 12.0));
        targets.push(Target {
            expect: &expected.throttled,
            ..target(
                format!(
                    "{}, throttled (kv_cache=off), variables from the environment",
                    b.label
                ),
                2 * n + 1,
                &b.from_env,
                "/api/telemetry",
                36.0,
            )
        });
    }
    targets
}

/// [`ROUNDS`] rounds of the targets at each level, 0.5 s each, in rotation: per target and
/// level, its rounds together.
fn floor_rounds(targets: &[Target], levels: &[usize]) -> Vec<Vec<Measured>> {
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
                add(&mut sums[t][k], m);
            }
        }
        eprintln!("bench: floor c={c} done");
    }
    sums
}

/// The floor section's table: per target and level its decisions/s, p50 and ratio to its
/// reference, and its errors; then a few of the errors.
fn print_floor(targets: &[Target], sums: &mut [Vec<Measured>], levels: &[usize]) {
    let mut header = vec!["target".to_string()];
    for c in levels {
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
    for (target, measured) in targets.iter().zip(&*sums) {
        let label = &target.label;
        let mut line = vec![label.clone()];
        let mut errors = 0;
        for (s, r) in measured.iter().zip(&sums[target.reference]) {
            line.push(format!("{:.0}", s.rate()));
            line.push(crate::ms(s.percentile(500)));
            line.push(format!("{:.2}×", s.rate() / r.rate().max(1e-9)));
            errors += s.errors;
            samples.extend(s.samples.iter().take(2).map(|x| format!("{label}: {x}")));
        }
        line.push(errors.to_string());
        lines.push(line);
    }
    crate::print_lines(&lines);
    for sample in samples.iter().take(6) {
        println!("ERROR {sample}");
    }
}
