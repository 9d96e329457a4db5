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
//! Its parts: `args.rs` the command line, `rows.rs` a row's figures and its run at every
//! concurrency, `storage.rs` the storage ceiling, `sdk.rs` the Azure SDKs, `apps.rs` the app's
//! rows, `report.rs` what it prints; the sections `entra.rs`, `floor.rs` and `coldstart.rs`.
//!
//! `leasegate-bench [--python PATH] [--node PATH] [--seconds 2.5] [--warmup 0.5] [--concurrency 1,4,16]
//! [--components DIR]... [--components-only] [--only entra|components|floor]`

mod apps;
mod args;
mod coldstart;
mod entra;
mod floor;
mod report;
mod rows;
mod sdk;
mod storage;

use leasegate_tests::app::root;
use leasegate_tests::{unique_container, Azurite};

use apps::{app_rows, declares_kv_cache, kv_row};
use args::{options, Options, Section};
use report::{load_average, print_notes, print_ratios, print_table};
use sdk::{sdk, Peer};
use storage::{ceiling, lease_blobs, new_lease_id};

// What the sections (`coldstart.rs`, `entra.rs`, `floor.rs`) take from the bench's modules, by
// `super::` and `crate::` paths.
use apps::{
    hold_devices, hold_devices_at, reading, setup, spin_env, start_app_with, telemetry_request,
    throttled_expect, Tokens, ALERT_PREFIX, ALERT_WINDOW,
};
use report::print_lines;
use rows::{ms, storage_per_decision, Bench, Figures, Row, Storage};
use storage::{setup_op, wire};

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
    print_notes(&levels, &rows, kv_declared);
    drop(apps);
    drop(hello_spin);
    drop(straight_kept);
    entra::section(&mut bench);
    components(&bench.options);
    // Azurite stops, and its data folder goes, when this process ends and closes its pipe
    // (tests/azurite/run.js).
}
