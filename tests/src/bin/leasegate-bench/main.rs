//! `leasegate-bench` (`scripts/dev.sh bench`): decisions per second and latency at several
//! concurrencies, in one table from one run, against an Azurite it starts itself:
//!
//! 1. the storage ceiling: a SharedKey Lease Acquire signed with the `leasegate` crate, sent
//!    straight to Azurite, answered 201 (the holder acquiring again) and 409 (another id);
//! 2. the same two acquires through the Azure SDK for Python (`scripts/bench_sdk.py`, run with
//!    the interpreter given by `--python`; skipped without it) and through the Azure SDK for
//!    JavaScript (`tests/bench-js/bench_sdk.mjs`, `@azure/storage-blob` as its lock file pins it,
//!    run with the `node` given by `--node`; skipped without it);
//! 3. the app's decisions under the real `spin up` (`spin.toml`'s release components), with
//!    the storage requests per decision counted by the test proxy between Spin and Azurite
//!    (that hop is in the app's figures, not in the ceiling's): the answer with no storage
//!    request, the throttle from the key-value cache (`kv_cache=on`, no storage request) and
//!    the throttle that asks storage (`kv_cache=off`) side by side, and the gate's rows; beside
//!    them the **hello world** (`tests/bench-hello`: spin-sdk 5.2's `#[http_component]`, the
//!    same reading parsed, a fixed answer), the floor's reference, served the same way;
//! 4. the throttle again with nothing between Spin and storage (a second app, its
//!    `storage_origin` the bench's Azurite, as the SDKs go), at every level; then at c=1, in
//!    turns: the **limit** of the throttled decision (the app's no-storage answer and then one
//!    raw storage request, the throttle's HEAD signed here, back to back on two keep-alive
//!    connections), the throttle, and the hello world sending the same signed HEAD through
//!    spin-sdk's `send` and through the `wasi` outgoing handler (`floor.rs`). The
//!    p50/p90/p99 columns at c=1 are each answer kind's latency series on one keep-alive
//!    connection: an answer that leaves in two writes stalls on the client's delayed ACK and
//!    shows as a p90 near 40 ms.
//!
//! One blocking keep-alive connection per thread, one blob, device or gate key per connection,
//! a warm-up then a fixed measured time per cell. It only prints figures: it asserts none, and
//! counts and shows every answer that is not the expected one.
//!
//! Then the Entra ID section (`entra.rs`): the throttled decision with a bearer token kept in
//! the key-value store against the same decision with SharedKey, both over HTTPS to the same
//! Azurite (`--oauth basic`), at c=1 and c=16, with the token requests per 1,000 decisions.
//!
//! Then it prints what the components' size costs (compiling, starting, answering; see
//! `coldstart.rs`), for the release build or for each `--components DIR` given (to compare two
//! builds); `--components-only` (or `--only components`) skips the decisions table, `--only
//! entra` runs the Entra ID section alone, `--only floor` compares builds of device-alerts
//! (each `--components DIR`) on the floor and the throttle against the hello world's two.
//!
//! Every `spin up` the bench starts runs without `RUST_BACKTRACE`, as deployed ([`spin_env`]).
//!
//! `leasegate-bench [--python PATH] [--node PATH] [--seconds 2.5] [--warmup 0.5] [--concurrency 1,4,16]
//! [--components DIR]... [--components-only] [--only entra|components|floor]`

mod coldstart;
mod entra;
mod floor;

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use leasegate::ops::{
    build, CreateContainer, Lease, LeaseAction, LeaseOutcome, Operation, PutBlob, WriteOutcome,
};
use leasegate::{Account, BlobName, ContainerName, LeaseDuration, LeaseId};
use leasegate_cli::NativeTransport;
use leasegate_tests::app::{call, root, App, Setup};
use leasegate_tests::{unique_container, Azurite};

use leasegate_tests::load::{http_request, Cell, Expect, Measured};

/// The gate window of the re-acquire row: the default, a native blob lease.
const GATE_WINDOW: &str = "60";
/// The alert window of the telemetry rows: long enough that no device's gate runs out during
/// the bench (a lease record; a throttled reading costs one HEAD either way).
const ALERT_WINDOW: &str = "3600";
const GATE_HOLDER: &str = "bench-holder";
/// device-alerts' lock blobs.
const ALERT_PREFIX: &str = "alerts/";

struct Options {
    python: Option<PathBuf>,
    node: Option<PathBuf>,
    seconds: f64,
    warmup: f64,
    concurrency: Vec<usize>,
    components: Vec<PathBuf>,
    /// Only this section (`--only`, `--components-only`); `None`: all of them.
    only: Option<Section>,
}

/// A section that can run alone (`--only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    /// Bearer token against SharedKey over HTTPS (`entra.rs`).
    Entra,
    /// The components' size and what it costs (`coldstart.rs`).
    Components,
    /// The floor per build of device-alerts against the hello world (`floor.rs`).
    Floor,
}

const USAGE: &str =
    "usage: leasegate-bench [--python PATH] [--node PATH] [--seconds S] [--warmup S] \
                     [--concurrency 1,4,16] [--components DIR]... [--components-only] \
                     [--only entra|components|floor]";

fn options() -> Result<Options, String> {
    let mut o = Options {
        python: None,
        node: None,
        seconds: 2.5,
        warmup: 0.5,
        concurrency: vec![1, 4, 16],
        components: Vec::new(),
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--python" => o.python = Some(PathBuf::from(value()?)),
            "--node" => o.node = Some(PathBuf::from(value()?)),
            "--seconds" => o.seconds = value()?.parse().map_err(|_| "bad --seconds")?,
            "--warmup" => o.warmup = value()?.parse().map_err(|_| "bad --warmup")?,
            "--concurrency" => {
                o.concurrency = value()?
                    .split(',')
                    .map(|c| c.trim().parse::<usize>().ok().filter(|&c| c > 0))
                    .collect::<Option<_>>()
                    .ok_or("bad --concurrency")?
            }
            "--components" => o.components.push(PathBuf::from(value()?)),
            "--components-only" => o.only = Some(Section::Components),
            "--only" => {
                o.only = Some(match value()?.as_str() {
                    "entra" => Section::Entra,
                    "components" => Section::Components,
                    "floor" => Section::Floor,
                    other => return Err(format!("unknown section {other}; {USAGE}")),
                })
            }
            _ => return Err(format!("unknown argument {arg}; {USAGE}")),
        }
    }
    if !(o.seconds > 0.0 && o.warmup >= 0.0) || o.concurrency.is_empty() {
        return Err("--seconds must be positive, --warmup not negative".into());
    }
    Ok(o)
}

/// One cell's figures, from the Rust load generator or from the SDK script.
struct Figures {
    rate: f64,
    p50: Option<Duration>,
    p90: Option<Duration>,
    p99: Option<Duration>,
    errors: u64,
    samples: Vec<String>,
}

impl From<&Measured> for Figures {
    fn from(m: &Measured) -> Figures {
        Figures {
            rate: m.rate(),
            p50: m.percentile(500),
            p90: m.percentile(900),
            p99: m.percentile(990),
            errors: m.errors,
            samples: m.samples.clone(),
        }
    }
}

/// Storage requests per decision.
enum Storage {
    /// One by construction (a single Lease Acquire).
    One,
    /// Counted at the proxy (`None`: nothing exchanged).
    Counted(Option<f64>),
    /// None by construction (the hello world has no storage).
    None,
}

struct Row {
    name: String,
    storage: Storage,
    /// One per concurrency; `None` where it did not run.
    cells: Vec<Option<Figures>>,
    skipped: Option<String>,
    /// The acquire status (201 or 409) of the storage rows this app row is compared with.
    reference: Option<u16>,
}

impl Row {
    fn new(name: impl Into<String>, storage: Storage, levels: usize) -> Row {
        Row {
            name: name.into(),
            storage,
            cells: (0..levels).map(|_| None).collect(),
            skipped: None,
            reference: None,
        }
    }

    fn skipped(name: impl Into<String>, levels: usize, why: impl Into<String>) -> Row {
        let mut row = Row::new(name, Storage::Counted(None), levels);
        row.skipped = Some(why.into());
        row
    }
}

struct Bench {
    options: Options,
    cells_total: usize,
    cells_done: usize,
}

impl Bench {
    fn measure(&self) -> Duration {
        Duration::from_secs_f64(self.options.seconds)
    }

    fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.options.warmup)
    }

    fn max_connections(&self) -> usize {
        self.options.concurrency.iter().copied().max().unwrap_or(1)
    }

    fn progress(&mut self, row: &str, c: usize, f: &Figures) {
        self.cells_done += 1;
        eprintln!(
            "bench: [{}/{}] {row} c={c}: {:.0}/s p50 {} p90 {} p99 {} ms, {} errors",
            self.cells_done,
            self.cells_total,
            f.rate,
            ms(f.p50),
            ms(f.p90),
            ms(f.p99),
            f.errors
        );
    }

    /// Runs `row` at every concurrency; returns how many exchanges it made in all.
    fn run_row(
        &mut self,
        row: &mut Row,
        addr: SocketAddr,
        request: &(dyn Fn(usize) -> Vec<u8> + Sync),
        expect: &Expect,
    ) -> u64 {
        let mut exchanges = 0;
        for (k, &c) in self.options.concurrency.clone().iter().enumerate() {
            let measured = Cell {
                addr,
                connections: c,
                warmup: self.warmup(),
                measure: self.measure(),
                request,
                expect,
                then: None,
            }
            .run();
            let figures = Figures::from(&measured);
            self.progress(&row.name, c, &figures);
            row.cells[k] = Some(figures);
            exchanges += measured.exchanges;
        }
        exchanges
    }
}

fn ms(d: Option<Duration>) -> String {
    match d {
        Some(d) => format!("{:.2}", d.as_secs_f64() * 1000.0),
        None => "–".into(),
    }
}

/// A signed storage request, as it goes on the wire.
fn wire(request: &leasegate::Request) -> Vec<u8> {
    let mut out = format!(
        "{} {} HTTP/1.1\r\nhost: {}\r\n",
        request.method(),
        request.path_and_query(),
        request.authority().unwrap_or("")
    )
    .into_bytes();
    for (name, value) in request.headers().iter() {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(request.body());
    out
}

/// Sends one setup operation with the native transport.
fn setup_op<O: Operation>(op: &O, account: &Account) -> Result<O::Output, String> {
    let request = build(op, account, SystemTime::now()).map_err(|e| e.to_string())?;
    let response = NativeTransport::default()
        .send_blocking(request)
        .map_err(|e| e.to_string())?;
    op.parse(&response).map_err(|e| e.to_string())
}

/// The storage ceiling's blobs: one per connection, each leased (infinitely) by `holder`.
fn lease_blobs(
    account: &Account,
    container: &ContainerName,
    n: usize,
    holder: &LeaseId,
) -> Result<Vec<BlobName>, String> {
    // Created, or already there: either will do.
    setup_op(
        &CreateContainer {
            container: container.clone(),
        },
        account,
    )?;
    let mut blobs = Vec::new();
    for i in 0..n {
        let blob = BlobName::try_new(&format!("bench/lease-{i}")).map_err(|e| e.to_string())?;
        let put = PutBlob::block(container.clone(), blob.clone(), Vec::new());
        match setup_op(&put, account)? {
            WriteOutcome::Written(_) => {}
            other => return Err(format!("creating {}: {other:?}", blob.as_str())),
        }
        let acquire = Lease::new(container.clone(), blob.clone(), acquire(holder));
        match setup_op(&acquire, account)? {
            LeaseOutcome::Held { .. } => {}
            other => return Err(format!("leasing {}: {other:?}", blob.as_str())),
        }
        blobs.push(blob);
    }
    Ok(blobs)
}

fn acquire(id: &LeaseId) -> LeaseAction {
    LeaseAction::Acquire {
        duration: LeaseDuration::Infinite,
        proposed: *id,
    }
}

fn new_lease_id() -> LeaseId {
    LeaseId::from_random_bytes(*uuid::Uuid::new_v4().as_bytes())
}

/// The storage ceiling rows: the signed acquire straight to Azurite, granted and refused.
fn ceiling(
    bench: &mut Bench,
    azurite: &Azurite,
    blobs: &[BlobName],
    container: &ContainerName,
    holder: &LeaseId,
) -> Vec<Row> {
    let account = azurite.account();
    let addr = SocketAddr::from(([127, 0, 0, 1], azurite.port()));
    let other = new_lease_id();
    let levels = bench.options.concurrency.len();
    let mut rows = Vec::new();
    for (name, id, expect) in [
        (
            "storage ceiling: Lease acquire 201 (holder again)",
            holder,
            Expect {
                status: 201,
                body_contains: None,
            },
        ),
        (
            "storage ceiling: Lease acquire 409 (other id)",
            &other,
            Expect {
                status: 409,
                body_contains: Some("LeaseAlreadyPresent"),
            },
        ),
    ] {
        let ops: Vec<Lease> = blobs
            .iter()
            .map(|b| Lease::new(container.clone(), b.clone(), acquire(id)))
            .collect();
        let request = |i: usize| {
            wire(&build(&ops[i], &account, SystemTime::now()).expect("a lease request builds"))
        };
        let mut row = Row::new(name, Storage::One, levels);
        bench.run_row(&mut row, addr, &request, &expect);
        rows.push(row);
    }
    rows
}

/// An Azure SDK the bench runs beside the app: its script prints `scripts/bench_sdk.py`'s JSON.
struct Peer {
    /// In the rows' names: "Azure SDK for Python".
    name: &'static str,
    /// In the rows' names once its version is known: "Python SDK".
    short: &'static str,
    /// The interpreter (`--python`, `--node`); `None`: the rows are skipped.
    program: Option<PathBuf>,
    /// The option that names it, for the skip note.
    option: &'static str,
    /// The script, from the workspace root.
    script: &'static str,
}

/// The SDK rows of `peer`, from its script's JSON.
fn sdk(
    bench: &mut Bench,
    peer: &Peer,
    azurite: &Azurite,
    blobs: &[BlobName],
    container: &ContainerName,
    holder: &LeaseId,
) -> Vec<Row> {
    let levels = bench.options.concurrency.len();
    let names = [
        (
            "granted",
            format!("{}: acquire 201 (holder again)", peer.name),
        ),
        ("refused", format!("{}: acquire 409 (other id)", peer.name)),
    ];
    let script = peer.script.rsplit('/').next().unwrap_or(peer.script);
    let Some(program) = peer.program.clone() else {
        bench.cells_done += 2 * levels;
        return names
            .iter()
            .map(|(_, n)| Row::skipped(n.clone(), levels, format!("no {} given", peer.option)))
            .collect();
    };
    let levels_arg: Vec<String> = bench
        .options
        .concurrency
        .iter()
        .map(|c| c.to_string())
        .collect();
    let blob_arg: Vec<&str> = blobs.iter().map(|b| b.as_str()).collect();
    let output = Command::new(&program)
        .arg(root().join(peer.script))
        .args(["--container", container.as_str()])
        .args(["--blobs", &blob_arg.join(",")])
        .args(["--holder", &holder.to_string()])
        .args(["--other", &new_lease_id().to_string()])
        .args(["--concurrency", &levels_arg.join(",")])
        .args(["--warmup", &bench.options.warmup.to_string()])
        .args(["--seconds", &bench.options.seconds.to_string()])
        // The key travels in the environment, never on a command line or in output.
        .env(
            "LEASEGATE_BENCH_CONNECTION_STRING",
            azurite.connection_string(),
        )
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output();
    let failed = |why: String| -> Vec<Row> {
        names
            .iter()
            .map(|(_, n)| Row::skipped(n.clone(), levels, why.clone()))
            .collect()
    };
    bench.cells_done += 2 * levels;
    let output = match output {
        Ok(o) if o.status.success() => o,
        Ok(o) => return failed(format!("{script} failed ({})", o.status)),
        Err(e) => return failed(format!("could not run {}: {e}", program.display())),
    };
    let json: serde_json::Value = match serde_json::from_slice(&output.stdout) {
        Ok(v) => v,
        Err(e) => return failed(format!("{script} printed no JSON: {e}")),
    };
    let version = json["sdk"].as_str().unwrap_or("?");
    let mut rows = Vec::new();
    for (case, name) in names {
        let mut row = Row::new(
            name.replace(peer.name, &format!("{} ({version})", peer.short)),
            Storage::One,
            levels,
        );
        for cell in json["cells"].as_array().into_iter().flatten() {
            if cell["case"] != case {
                continue;
            }
            let c = cell["concurrency"].as_u64().unwrap_or(0) as usize;
            let Some(k) = bench.options.concurrency.iter().position(|&x| x == c) else {
                continue;
            };
            let duration = |key: &str| {
                cell[key]
                    .as_f64()
                    .map(|v| Duration::from_secs_f64(v / 1000.0))
            };
            let seconds = cell["seconds"].as_f64().unwrap_or(bench.options.seconds);
            let figures = Figures {
                rate: cell["decisions"].as_f64().unwrap_or(0.0) / seconds,
                p50: duration("p50_ms"),
                p90: duration("p90_ms"),
                p99: duration("p99_ms"),
                errors: cell["unexpected"].as_u64().unwrap_or(0),
                samples: cell["samples"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect(),
            };
            row.cells[k] = Some(figures);
        }
        rows.push(row);
    }
    rows
}

/// Storage requests per decision: what the proxy in front of storage counted during a row,
/// over the exchanges the row made.
fn storage_per_decision(requests: usize, exchanges: u64) -> Option<f64> {
    (exchanges > 0).then(|| requests as f64 / exchanges as f64)
}

struct Tokens {
    telemetry: String,
    gate: String,
}

fn start_app(tokens: &Tokens, kv_cache: Option<&str>) -> App {
    let kv: Vec<(&str, &str)> = kv_cache.map(|v| ("kv_cache", v)).into_iter().collect();
    start_app_with("bench", tokens, &kv, setup())
}

/// The environment of every `spin up` the bench starts: Spin as deployed, without
/// `RUST_BACKTRACE` (a development machine's environment may set it; Spin then captures a
/// backtrace for an error it makes and drops on every request, a cost no deployment pays).
fn spin_env() -> Vec<(String, String)> {
    vec![
        ("RUST_BACKTRACE".into(), "0".into()),
        ("RUST_LIB_BACKTRACE".into(), "0".into()),
    ]
}

/// The app's setup in the bench: the defaults, with [`spin_env`], every variable from memory (a
/// static provider, as docs/configuration.md advises: no read reaches Spin's environment
/// provider) and `spin up --quiet` (each log line written once, to the component's log file,
/// not also to Spin's own output).
fn setup() -> Setup {
    Setup {
        spin_env: spin_env(),
        variables_in_memory: true,
        spin_quiet: true,
        ..Setup::default()
    }
}

/// The app with the bench's tokens and alert window, then `extra` variables, from `setup`.
fn start_app_with(tag: &str, tokens: &Tokens, extra: &[(&str, &str)], setup: Setup) -> App {
    let secret = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let mut vars = vec![
        ("telemetry_token", tokens.telemetry.as_str()),
        ("gate_token", tokens.gate.as_str()),
        ("lease_id_secret", secret.as_str()),
        ("alert_window_seconds", ALERT_WINDOW),
    ];
    vars.extend_from_slice(extra);
    App::start_with(tag, &vars, setup)
}

fn reading(i: usize, temperature: f64) -> Vec<u8> {
    serde_json::json!({"deviceId": format!("bench-device-{i}"), "temperature": temperature})
        .to_string()
        .into_bytes()
}

/// Each device alerts once, so that its gate is held for the rest of the bench.
fn hold_devices(app: &App, tokens: &Tokens, n: usize) {
    hold_devices_at(&app.url("/api/telemetry"), &tokens.telemetry, n);
}

/// Devices 0 to `n` alert once each at `url` (device-alerts' route), with the bearer `token`.
fn hold_devices_at(url: &str, token: &str, n: usize) {
    let auth = format!("Bearer {token}");
    for i in 0..n {
        let a = call(
            "POST",
            url,
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
            ],
            &reading(i, 35.0),
        );
        let decision = &a.json["decisions"][0]["decision"];
        if a.status != 200 || decision != "notified" {
            eprintln!(
                "bench: warning: device {i} did not alert first: {} {decision}",
                a.status
            );
        }
    }
}

/// Each gate key is taken by the bench's holder; returns each key's lease id (a holder extends
/// its gate by sending it back in the `Lease-Id` header).
fn hold_gates(app: &App, tokens: &Tokens, n: usize) -> Vec<String> {
    let auth = format!("Bearer {}", tokens.gate);
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let a = call(
            "POST",
            &app.url(&format!(
                "/api/gate/bench%2Fgate-{i}?window={GATE_WINDOW}&holder={GATE_HOLDER}"
            )),
            &[("authorization", &auth)],
            b"",
        );
        if a.status != 200 {
            eprintln!("bench: warning: gate {i} not taken: {}", a.status);
        }
        ids.push(a.json["leaseId"].as_str().unwrap_or_default().to_string());
    }
    ids
}

fn telemetry_request(
    host: &str,
    token: &str,
    temperature: f64,
) -> impl Fn(usize) -> Vec<u8> + Sync {
    let auth = format!("Bearer {token}");
    let host = host.to_string();
    move |i| {
        http_request(
            "POST",
            "/api/telemetry",
            &host,
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
            ],
            &reading(i, temperature),
        )
    }
}

fn app_row(
    bench: &mut Bench,
    app: &App,
    name: &str,
    request: &(dyn Fn(usize) -> Vec<u8> + Sync),
    expect: Expect,
) -> Row {
    let mut row = Row::new(
        name,
        Storage::Counted(None),
        bench.options.concurrency.len(),
    );
    let before = app.storage.count();
    let exchanges = bench.run_row(&mut row, app.spin.addr(), request, &expect);
    row.storage = Storage::Counted(storage_per_decision(
        app.storage.count() - before,
        exchanges,
    ));
    row
}

fn throttled_expect() -> Expect {
    Expect {
        status: 200,
        body_contains: Some("\"throttled\""),
    }
}

/// The app's rows served with `kv_cache` off (or undeclared): the throttled one, then the
/// others in table order; and the app, kept until the table is printed.
fn app_rows(bench: &mut Bench, tokens: &Tokens, kv_declared: bool) -> (Row, Vec<Row>, App) {
    let n = bench.max_connections();
    let app = start_app(tokens, kv_declared.then_some("off"));
    let host = app.spin.addr().to_string();
    hold_devices(&app, tokens, n);
    let throttled_name = if kv_declared {
        "app: telemetry throttled, kv_cache=off"
    } else {
        "app: telemetry throttled"
    };
    let mut throttled = app_row(
        bench,
        &app,
        throttled_name,
        &telemetry_request(&host, &tokens.telemetry, 36.0),
        throttled_expect(),
    );
    throttled.reference = Some(409);
    let lease_ids = hold_gates(&app, tokens, n);
    let auth = format!("Bearer {}", tokens.gate);
    let get = |i: usize| {
        http_request(
            "GET",
            &format!("/api/gate/bench%2Fgate-{i}"),
            &host,
            &[("authorization", &auth)],
            b"",
        )
    };
    let mut gate_get = app_row(
        bench,
        &app,
        "app: gate GET (held)",
        &get,
        Expect {
            status: 200,
            body_contains: Some("\"held\""),
        },
    );
    gate_get.reference = Some(201);
    let tag = if kv_declared { ", kv_cache=off" } else { "" };
    let gate_post = reacquire_row(bench, &app, tokens, &lease_ids, tag);
    let below = telemetry_request(&host, &tokens.telemetry, 12.0);
    let none = app_row(
        bench,
        &app,
        "app: no storage (reading below threshold)",
        &below,
        Expect {
            status: 200,
            body_contains: Some("\"below_threshold\""),
        },
    );
    let others = vec![gate_get, gate_post, none];
    (throttled, others, app)
}

/// The gate's re-acquire by its holder, every connection its own gate (taken with
/// `lease_ids`, [`hold_gates`]): `kv_cache` says whether the deployment keeps the holders' gates
/// (a read first, or not), `tag` says so.
fn reacquire_row(
    bench: &mut Bench,
    app: &App,
    tokens: &Tokens,
    lease_ids: &[String],
    tag: &str,
) -> Row {
    let auth = format!("Bearer {}", tokens.gate);
    let host = app.spin.addr().to_string();
    let post = |i: usize| {
        http_request(
            "POST",
            &format!("/api/gate/bench%2Fgate-{i}?window={GATE_WINDOW}&holder={GATE_HOLDER}"),
            &host,
            &[("authorization", &auth), ("lease-id", &lease_ids[i])],
            b"",
        )
    };
    app_row(
        bench,
        app,
        &format!("app: gate re-acquire by its holder (window={GATE_WINDOW}){tag}"),
        &post,
        Expect {
            status: 200,
            body_contains: Some("\"extended\":true"),
        },
    )
}

/// The throttled row with `kv_cache=on`, on a second app (its own container), the gate's
/// re-acquire there, and that app.
fn kv_row(bench: &mut Bench, tokens: &Tokens) -> (Vec<Row>, Option<App>) {
    let name = "app: telemetry throttled, kv_cache=on";
    let levels = bench.options.concurrency.len();
    let started = std::panic::catch_unwind(AssertUnwindSafe(|| start_app(tokens, Some("on"))));
    let app = match started {
        Ok(app) => app,
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            bench.cells_done += 2 * levels;
            let why = format!("the app did not start with kv_cache=on: {why}");
            return (vec![Row::skipped(name, levels, why)], None);
        }
    };
    hold_devices(&app, tokens, bench.max_connections());
    let request = telemetry_request(&app.spin.addr().to_string(), &tokens.telemetry, 36.0);
    let mut row = app_row(bench, &app, name, &request, throttled_expect());
    row.reference = Some(409);
    let lease_ids = hold_gates(&app, tokens, bench.max_connections());
    let reacquire = reacquire_row(bench, &app, tokens, &lease_ids, ", kv_cache=on");
    (vec![row, reacquire], Some(app))
}

/// The 1-minute load average (Linux), to tell a quiet machine from a busy one.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn declares_kv_cache() -> bool {
    std::fs::read_to_string(root().join("spin.toml"))
        .ok()
        .and_then(|text| toml::from_str::<toml::Table>(&text).ok())
        .is_some_and(|m| m.get("variables").and_then(|v| v.get("kv_cache")).is_some())
}

fn print_table(levels: &[usize], rows: &[Row]) {
    let mut header = vec!["decision".to_string(), "storage req/decision".to_string()];
    for c in levels {
        header.push(format!("c={c} dec/s"));
        header.push("p50 ms".into());
        header.push("p90 ms".into());
        header.push("p99 ms".into());
    }
    header.push("errors".into());
    let mut lines = vec![header];
    for row in rows {
        let mut line = vec![
            row.name.clone(),
            match &row.storage {
                Storage::One => "1".into(),
                Storage::None => "0".into(),
                Storage::Counted(Some(v)) => format!("{v:.2}"),
                Storage::Counted(None) => "–".into(),
            },
        ];
        let mut errors = 0;
        for cell in &row.cells {
            match cell {
                Some(f) => {
                    line.push(format!("{:.0}", f.rate));
                    line.push(ms(f.p50));
                    line.push(ms(f.p90));
                    line.push(ms(f.p99));
                    errors += f.errors;
                }
                None => line.extend(["–".to_string(), "–".into(), "–".into(), "–".into()]),
            }
        }
        line.push(if row.skipped.is_some() {
            "skipped".into()
        } else {
            errors.to_string()
        });
        lines.push(line);
    }
    print_lines(&lines);
}

/// A Markdown table: the first line is the header; the first column left-aligned, the others
/// right-aligned.
fn print_lines(lines: &[Vec<String>]) {
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|k| {
            lines
                .iter()
                .map(|l| l[k].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let render = |line: &Vec<String>| {
        let cells: Vec<String> = line
            .iter()
            .enumerate()
            .map(|(k, s)| {
                if k == 0 {
                    format!("{s:<w$}", w = widths[k])
                } else {
                    format!("{s:>w$}", w = widths[k])
                }
            })
            .collect();
        format!("| {} |", cells.join(" | "))
    };
    println!("{}", render(&lines[0]));
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(k, w)| {
            if k == 0 {
                "-".repeat(w + 2)
            } else {
                format!("{}:", "-".repeat(w + 1))
            }
        })
        .collect();
    println!("|{}|", rule.join("|"));
    for line in &lines[1..] {
        println!("{}", render(line));
    }
}

/// App ÷ SDK and app ÷ ceiling for the app's 1-request decisions, against the refused acquire.
fn print_ratios(levels: &[usize], rows: &[Row]) {
    let storage_row = |prefix: &str, status: u16| {
        rows.iter().find(|r| {
            r.name.starts_with(prefix)
                && r.name.contains(&format!("acquire {status}"))
                && r.skipped.is_none()
        })
    };
    let one_request: Vec<&Row> = rows
        .iter()
        .filter(|r| r.reference.is_some())
        .filter(|r| matches!(r.storage, Storage::Counted(Some(v)) if (v - 1.0).abs() < 0.005))
        .collect();
    if one_request.is_empty() {
        println!("\nNo app row made exactly 1 storage request per decision: no ratios.");
        return;
    }
    println!(
        "\nThe app's 1-request decisions against the storage acquire with the same outcome \
         (throttled: the refused 409; gate GET: the granted 201), decisions/s ratio (p50 ratio):"
    );
    let width = one_request
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0);
    for row in one_request {
        let status = row.reference.unwrap_or(409);
        let sdk = storage_row("Python SDK", status);
        let js = storage_row("JS SDK", status);
        let ceiling = storage_row("storage ceiling", status);
        for (label, reference) in [("÷ SDK", sdk), ("÷ JS SDK", js), ("÷ ceiling", ceiling)] {
            let Some(reference) = reference else {
                println!("  {:<width$}  {label:<9}  (no reference row)", row.name);
                continue;
            };
            let parts: Vec<String> = levels
                .iter()
                .enumerate()
                .map(|(k, c)| match (&row.cells[k], &reference.cells[k]) {
                    (Some(a), Some(b)) if b.rate > 0.0 => {
                        let p50 = match (a.p50, b.p50) {
                            (Some(x), Some(y)) if !y.is_zero() => {
                                format!("{:.2}×", x.as_secs_f64() / y.as_secs_f64())
                            }
                            _ => "–".into(),
                        };
                        format!("c={c} {:.2}× ({p50})", a.rate / b.rate)
                    }
                    _ => format!("c={c} –"),
                })
                .collect();
            println!("  {:<width$}  {label:<9}  {}", row.name, parts.join("   "));
        }
    }
}

/// The components' size and what it costs, for each folder asked for (the release build by
/// default).
fn components(options: &Options) {
    let dirs = if options.components.is_empty() {
        vec![root().join("target/wasm32-wasip2/release")]
    } else {
        options.components.clone()
    };
    let mut folders = Vec::new();
    for dir in &dirs {
        eprintln!("bench: component size and cost: {}", dir.display());
        match coldstart::measure(dir) {
            Ok(f) => folders.push(f),
            Err(e) => eprintln!("bench: warning: {}: {e}", dir.display()),
        }
    }
    coldstart::print(&folders);
}

fn main() {
    let options = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    match options.only {
        Some(Section::Components) => {
            components(&options);
            return;
        }
        Some(Section::Floor) => {
            let mut bench = Bench {
                cells_total: 0,
                cells_done: 0,
                options,
            };
            floor::floor_section(&mut bench);
            return;
        }
        Some(Section::Entra) => {
            let mut bench = Bench {
                cells_total: entra::CELLS,
                cells_done: 0,
                options,
            };
            entra::section(&mut bench);
            return;
        }
        None => {}
    }
    let levels = options.concurrency.clone();
    let kv_declared = declares_kv_cache();
    // The app's rows, the hello world's, the throttle straight to Azurite; the four rows
    // measured in turns with the limit, one cell each.
    let app_rows_n = if kv_declared { 6 } else { 4 } + 2;
    let mut bench = Bench {
        cells_total: levels.len() * (6 + app_rows_n) + 4 + entra::CELLS,
        cells_done: 0,
        options,
    };
    let load_before = load_average();
    eprintln!("bench: starting Azurite");
    let azurite = Azurite::shared();
    let account = azurite.account();
    let container = unique_container("bench");
    let holder = new_lease_id();
    let blobs = match lease_blobs(&account, &container, bench.max_connections(), &holder) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("bench: could not prepare the lease blobs: {e}");
            std::process::exit(1);
        }
    };
    let mut rows = ceiling(&mut bench, azurite, &blobs, &container, &holder);
    eprintln!("bench: the Azure SDK for Python");
    let python = Peer {
        name: "Azure SDK for Python",
        short: "Python SDK",
        program: bench.options.python.clone(),
        option: "--python",
        script: "scripts/bench_sdk.py",
    };
    rows.extend(sdk(
        &mut bench, &python, azurite, &blobs, &container, &holder,
    ));
    eprintln!("bench: the Azure SDK for JavaScript");
    let js = Peer {
        name: "Azure SDK for JavaScript",
        short: "JS SDK",
        program: bench.options.node.clone(),
        option: "--node",
        script: "tests/bench-js/bench_sdk.mjs",
    };
    rows.extend(sdk(&mut bench, &js, azurite, &blobs, &container, &holder));
    eprintln!("bench: starting the app (spin up, release components)");
    let tokens = Tokens {
        telemetry: format!("bench-{}", uuid::Uuid::new_v4().simple()),
        gate: format!("bench-{}", uuid::Uuid::new_v4().simple()),
    };
    let (throttled, others, app) = app_rows(&mut bench, &tokens, kv_declared);
    rows.push(throttled);
    // The apps live until the table is printed: whatever their teardown does comes after it.
    let mut apps = vec![app];
    if kv_declared {
        eprintln!("bench: starting the app again with kv_cache=on");
        let (kv_rows, app) = kv_row(&mut bench, &tokens);
        rows.extend(kv_rows);
        apps.extend(app);
    }
    rows.extend(others);
    eprintln!("bench: the hello world (tests/bench-hello) under its own spin up");
    let (hello, hello_spin) = floor::hello_row(&mut bench);
    rows.push(hello);
    eprintln!("bench: the throttle straight to Azurite, its limit and the hello world's HEAD");
    let (straight, straight_kept) = floor::straight_rows(&mut bench, &tokens, azurite);
    rows.extend(straight);

    println!(
        "\nleasegate bench: {} s per cell after a {} s warm-up; one keep-alive connection per \
         thread, one blob/device/key per connection; Azurite and the app on 127.0.0.1, {} CPUs, \
         load average {load_before} before and {} after",
        bench.options.seconds,
        bench.options.warmup,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    println!();
    print_table(&levels, &rows);
    print_ratios(&levels, &rows);
    floor::print_issue_ratios(&levels, &rows);
    let mut notes = Vec::new();
    if !kv_declared {
        notes.push(
            "spin.toml declares no kv_cache variable: the kv_cache=on row is skipped".to_string(),
        );
    }
    for row in &rows {
        if let Some(why) = &row.skipped {
            notes.push(format!("{}: skipped: {why}", row.name));
        }
        for (k, cell) in row.cells.iter().enumerate() {
            if let Some(f) = cell.as_ref().filter(|f| f.errors > 0) {
                notes.push(format!(
                    "ERROR {} c={}: {} unexpected answers, e.g. {}",
                    row.name,
                    levels[k],
                    f.errors,
                    f.samples.join(" | ")
                ));
            }
        }
    }
    if !notes.is_empty() {
        println!();
        for n in notes {
            println!("{n}");
        }
    }
    drop(apps);
    drop(hello_spin);
    drop(straight_kept);
    entra::section(&mut bench);
    components(&bench.options);
    // Azurite stops, and its data folder goes, when this process ends and closes its pipe
    // (tests/azurite/run.js).
}
