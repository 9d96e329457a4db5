//! The app under `spin up` as the bench serves it (its tokens, variables and environment), the
//! devices and gates it holds first, and the app's rows: throttled, gate, no storage.

use std::panic::AssertUnwindSafe;

use leasegate_tests::app::{call, root, App, Setup};
use leasegate_tests::load::{http_request, Expect};

use crate::rows::{storage_per_decision, Bench, Row, Storage};

/// The gate window of the re-acquire row: the default, a native blob lease.
pub(crate) const GATE_WINDOW: &str = "60";
/// The alert window of the telemetry rows: long enough that no device's gate runs out during
/// the bench (a lease record; a throttled reading costs one HEAD either way).
pub(crate) const ALERT_WINDOW: &str = "3600";
pub(crate) const GATE_HOLDER: &str = "bench-holder";
/// device-alerts' lock blobs.
pub(crate) const ALERT_PREFIX: &str = "alerts/";

pub(crate) struct Tokens {
    pub(crate) telemetry: String,
    pub(crate) gate: String,
}

pub(crate) fn start_app(tokens: &Tokens, kv_cache: Option<&str>) -> App {
    let kv: Vec<(&str, &str)> = kv_cache.map(|v| ("kv_cache", v)).into_iter().collect();
    start_app_with("bench", tokens, &kv, setup())
}

/// The environment of every `spin up` the bench starts: Spin as deployed, without
/// `RUST_BACKTRACE` (a development machine's environment may set it; Spin then captures a
/// backtrace for an error it makes and drops on every request, a cost no deployment pays).
pub(crate) fn spin_env() -> Vec<(String, String)> {
    vec![
        ("RUST_BACKTRACE".into(), "0".into()),
        ("RUST_LIB_BACKTRACE".into(), "0".into()),
    ]
}

/// The app's setup in the bench: the defaults, with [`spin_env`], every variable from memory (a
/// static provider, as docs/configuration.md advises: no read reaches Spin's environment
/// provider) and `spin up --quiet` (each log line written once, to the component's log file,
/// not also to Spin's own output).
pub(crate) fn setup() -> Setup {
    Setup {
        spin_env: spin_env(),
        variables_in_memory: true,
        spin_quiet: true,
        ..Setup::default()
    }
}

/// The app with the bench's tokens and alert window, then `extra` variables, from `setup`.
pub(crate) fn start_app_with(
    tag: &str,
    tokens: &Tokens,
    extra: &[(&str, &str)],
    setup: Setup,
) -> App {
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

pub(crate) fn reading(i: usize, temperature: f64) -> Vec<u8> {
    serde_json::json!({"deviceId": format!("bench-device-{i}"), "temperature": temperature})
        .to_string()
        .into_bytes()
}

/// Each device alerts once, so that its gate is held for the rest of the bench.
pub(crate) fn hold_devices(app: &App, tokens: &Tokens, n: usize) {
    hold_devices_at(&app.url("/api/telemetry"), &tokens.telemetry, n);
}

/// Devices 0 to `n` alert once each at `url` (device-alerts' route), with the bearer `token`.
pub(crate) fn hold_devices_at(url: &str, token: &str, n: usize) {
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
pub(crate) fn hold_gates(app: &App, tokens: &Tokens, n: usize) -> Vec<String> {
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

pub(crate) fn telemetry_request(
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

pub(crate) fn app_row(
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

pub(crate) fn throttled_expect() -> Expect {
    Expect {
        status: 200,
        body_contains: Some("\"throttled\""),
    }
}

/// The app's rows served with `kv_cache` off (or undeclared): the throttled one, then the
/// others in table order; and the app, kept until the table is printed.
pub(crate) fn app_rows(
    bench: &mut Bench,
    tokens: &Tokens,
    kv_declared: bool,
) -> (Row, Vec<Row>, App) {
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
pub(crate) fn reacquire_row(
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
pub(crate) fn kv_row(bench: &mut Bench, tokens: &Tokens) -> (Vec<Row>, Option<App>) {
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

pub(crate) fn declares_kv_cache() -> bool {
    std::fs::read_to_string(root().join("spin.toml"))
        .ok()
        .and_then(|text| toml::from_str::<toml::Table>(&text).ok())
        .is_some_and(|m| m.get("variables").and_then(|v| v.get("kv_cache")).is_some())
}
