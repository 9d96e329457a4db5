//! What the soak saw, read back and printed: the invariants (notifications per device per
//! window, job runs per occurrence, gate holders at the fence, answers), the answers by status,
//! Spin's memory and the restarts.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use leasegate_tests::app::{call, App, TIMER_AUTH};
use leasegate_tests::process::{self, Breakdown};
use leasegate_tests::proxy::Fault;
use leasegate_tests::sink::FenceReport;
use leasegate_tests::spin::Spin;

use crate::stats::{Restart, Sample, Stats};
use crate::{Options, Soak, JOB};

/// A Spin's memory and what it wrote to disk.
#[derive(Debug, Clone, Default)]
pub struct Memory {
    /// Resident memory of `spin` (and what it started), KiB.
    pub rss_kib: u64,
    /// Spin's processes' resident memory by kind of mapping, KiB.
    pub breakdown: Breakdown,
    /// Bytes in its log folder and its own stdout and stderr files.
    pub log_bytes: u64,
    /// Bytes in its state folder (the key-value store).
    pub state_bytes: u64,
    /// Threads of Spin's processes.
    pub threads: u64,
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The app's Spin now.
pub fn memory(app: &App) -> Memory {
    let dir = app.spin.dir();
    let file = |name: &str| std::fs::metadata(dir.join(name)).map_or(0, |m| m.len());
    Memory {
        rss_kib: app.spin.rss_kib(),
        breakdown: app
            .spin
            .pids()
            .into_iter()
            .map(process::breakdown)
            .fold(Breakdown::default(), |a, b| a + b),
        log_bytes: dir_bytes(&dir.join("logs")) + file("spin.out") + file("spin.err"),
        state_bytes: dir_bytes(&dir.join("state")),
        threads: app.spin.pids().into_iter().map(process::threads).sum(),
    }
}

/// Open file descriptors of Spin's processes (sockets included: its connections).
pub fn open_fds(spin: &Spin) -> usize {
    spin.pids()
        .into_iter()
        .filter_map(|pid| std::fs::read_dir(format!("/proc/{pid}/fd")).ok())
        .map(|d| d.count())
        .sum()
}

/// `200`, or `no answer` for 0.
pub fn status_name(status: u16) -> String {
    if status == 0 {
        "no answer".into()
    } else {
        status.to_string()
    }
}

/// The load average now (1, 5, 15 minutes).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// What this run does, in a line.
pub fn what(o: &Options) -> String {
    let c = o
        .concurrency
        .iter()
        .map(|(c, m)| {
            if *m > 0.0 {
                format!("c={c} for {m} min")
            } else {
                format!("c={c}")
            }
        })
        .collect::<Vec<_>>()
        .join(", then ");
    let mut parts = vec![format!(
        "{} deployment(s); telemetry {c} over {} devices ({} readings, {} s windows)",
        o.deployments,
        o.devices,
        if o.cold { "cold" } else { "hot" },
        o.window
    )];
    if o.gates > 0 {
        parts.push(format!(
            "{} gate clients per deployment on {} keys (windows {:?} s)",
            o.gates,
            crate::GATE_KEYS,
            crate::GATE_WINDOWS
        ));
    }
    if o.jobs {
        parts.push("a per-second job ticked every second on each deployment".into());
    }
    parts.push(format!("storage faults {}", o.faults_spec));
    parts.push(format!(
        "{} storage restart(s) of {} s",
        o.restarts,
        o.outage.as_secs_f64()
    ));
    for (k, v) in &o.vars {
        parts.push(format!("{k}={v}"));
    }
    for (k, v) in &o.spin_env {
        parts.push(format!("spin env {k}={v}"));
    }
    parts.join("; ")
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn fault_name(f: &Fault) -> String {
    match f {
        Fault::Refuse => "refused".into(),
        Fault::Status(s) => format!("{s}"),
        Fault::Delay(d) => format!("late {:.1} s", d.as_secs_f64()),
        Fault::LoseAnswer => "answer lost".into(),
        other => format!("{other:?}"),
    }
}

/// Notifications per device: how many, on how many devices, the most one device got in one
/// window, duplicates (a device notified again before its previous window ended) and repeated
/// idempotency keys.
struct Notifications {
    total: usize,
    devices: usize,
    duplicates: Vec<String>,
    repeated_keys: usize,
}

fn notifications(apps: &[App]) -> Notifications {
    // deviceId -> (window start: token's seconds, window end, idempotency key)
    let mut by_device: BTreeMap<String, Vec<(u64, u64, String)>> = BTreeMap::new();
    let mut total = 0;
    for app in apps {
        for r in app.sink.delivered() {
            let Some(device) = r.body["deviceId"].as_str() else {
                continue;
            };
            total += 1;
            let token = r.body["fencingToken"].as_u64().unwrap_or(0);
            let end = r.body["windowEndsAt"]
                .as_str()
                .and_then(|t| humantime::parse_rfc3339(t).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            let key = r.body["idempotencyKey"].as_str().unwrap_or("").to_string();
            by_device
                .entry(device.to_string())
                .or_default()
                .push((token, end, key));
        }
    }
    let mut duplicates = Vec::new();
    let mut keys = HashSet::new();
    let mut repeated_keys = 0;
    for (device, list) in &mut by_device {
        list.sort();
        for pair in list.windows(2) {
            let (prev, next) = (&pair[0], &pair[1]);
            // A token's high bits are the storage server's second when the gate was taken.
            if next.0 >> 16 < prev.1 {
                duplicates.push(format!(
                    "{device}: token {} (taken at {}) inside the window of token {} (to {})",
                    next.0,
                    next.0 >> 16,
                    prev.0,
                    prev.1
                ));
            }
        }
        for (_, _, key) in list.iter() {
            if !keys.insert(key.clone()) {
                repeated_keys += 1;
            }
        }
    }
    Notifications {
        total,
        devices: by_device.len(),
        duplicates,
        repeated_keys,
    }
}

/// Job calls per occurrence at the sinks.
fn job_runs(apps: &[App]) -> BTreeMap<u64, usize> {
    leasegate_tests::jobs::runs(&apps.iter().collect::<Vec<_>>())
}

/// Lines of Spin's stderr and the components' stderr files that say a component trapped.
fn traps(spin: &Spin) -> Vec<String> {
    let mut files = vec![spin.dir().join("spin.err")];
    if let Ok(entries) = std::fs::read_dir(spin.dir().join("logs")) {
        files.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().contains("stderr")),
        );
    }
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    l.contains("panicked")
                        || l.contains("wasm trap")
                        || l.contains("error while executing")
                })
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `183.2 (wasm memories 60.1 in 52 warm slots, code 15.2, heap and stacks 38.0, files
/// 42.2)`, MiB.
pub fn memory_line(m: &Memory) -> String {
    let b = &m.breakdown;
    format!(
        "{} (wasm memories {} in {} warm slots, code {}, heap and stacks {}, files {})",
        mib(m.rss_kib),
        mib(b.wasm_memories),
        b.warm_slots,
        mib(b.code),
        mib(b.heap),
        mib(b.files)
    )
}

/// Prints the summary; `true` if an invariant broke.
pub fn print(soak: &Soak, before: &[Memory], after: &[Memory], load_before: &str) -> bool {
    let stats = soak.stats.lock().expect("stats");
    let restarts = soak.restarts.lock().expect("restarts").clone();
    let samples = soak.samples.lock().expect("samples").clone();
    print_heading(soak, load_before);
    let answers = Answers::of(soak, &stats);
    let checks = Checks::of(soak, &stats);
    print_figures(soak, &stats, &answers, &checks);
    print_spin_rss(soak, &samples);
    print_restarts(&restarts);
    print_by_request(soak, &stats);
    print_memory(soak, before, after, &samples);
    print_kept(soak.options, &stats, &checks);
    if checks.failures.is_empty() {
        println!("\nsoak: every invariant held");
    } else {
        println!("\nsoak: FAILED: {}", checks.failures.join("; "));
    }
    !checks.failures.is_empty()
}

/// What ran, on what machine, and the CPU it took.
fn print_heading(soak: &Soak, load_before: &str) {
    let o = soak.options;
    let minutes = o.minutes;
    let spin_cpu: Vec<String> = soak
        .apps
        .iter()
        .map(|a| {
            let s: f64 = a.spin.pids().into_iter().map(process::cpu_seconds).sum();
            format!("{s:.0}")
        })
        .collect();
    println!(
        "\nleasegate soak: {minutes} min; {}\n{} CPUs, load average {load_before} before and {} \
         after; CPU seconds used: Spin {} (per deployment), the soak itself {:.0}\n",
        what(o),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average(),
        spin_cpu.join(", "),
        process::cpu_seconds(std::process::id())
    );
}

/// The answers, as the figures show them: by status, JSON 503s by `error`, and the storage
/// requests at the proxies with the faults applied to them.
struct Answers {
    requests: u64,
    status_text: String,
    codes: String,
    storage: usize,
    fault_text: String,
    fault_total: usize,
}

impl Answers {
    fn of(soak: &Soak, stats: &Stats) -> Answers {
        let requests = stats.requests();
        let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
        for ((_, s), n) in &stats.statuses {
            *statuses.entry(*s).or_insert(0) += n;
        }
        let status_text = statuses
            .iter()
            .map(|(s, n)| format!("{} {}", status_name(*s), thousands(*n)))
            .collect::<Vec<_>>()
            .join(", ");
        let codes = stats
            .codes
            .iter()
            .map(|(c, n)| format!("{c} {}", thousands(*n)))
            .collect::<Vec<_>>()
            .join(", ");
        let mut storage = 0;
        let mut faults: BTreeMap<String, usize> = BTreeMap::new();
        for app in soak.apps {
            storage += app.storage.count();
            for (f, n) in app.storage.faults_applied() {
                *faults.entry(fault_name(&f)).or_insert(0) += n;
            }
        }
        let fault_text = if faults.is_empty() {
            "none".to_string()
        } else {
            faults
                .iter()
                .map(|(f, n)| format!("{f} {}", thousands(*n as u64)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let fault_total: usize = faults.values().sum();
        Answers {
            requests,
            status_text,
            codes,
            storage,
            fault_text,
            fault_total,
        }
    }
}

/// The invariants read back: notifications per device, job runs per occurrence, gate holders at
/// the fence, traps; and each one that broke.
struct Checks {
    notes: Notifications,
    runs: BTreeMap<u64, usize>,
    fence: FenceReport,
    trapped: Vec<String>,
    failures: Vec<String>,
}

impl Checks {
    fn of(soak: &Soak, stats: &Stats) -> Checks {
        let mut failures = Vec::new();
        let notes = notifications(soak.apps);
        if !notes.duplicates.is_empty() || notes.repeated_keys > 0 {
            failures.push(format!(
                "{} duplicate notifications, {} repeated idempotency keys",
                notes.duplicates.len(),
                notes.repeated_keys
            ));
        }
        let runs = job_runs(soak.apps);
        let twice = twice(&runs);
        if !twice.is_empty() {
            failures.push(format!("occurrences run more than once: {twice:?}"));
        }
        let fence = soak.fence.fence_report();
        if fence.overlaps > 0 {
            failures.push(format!("{} times two gate holders at once", fence.overlaps));
        }
        if stats.outside > 0 {
            failures.push(format!(
                "{} answers outside 2xx, 429 and JSON 503",
                stats.outside
            ));
        }
        let trapped: Vec<String> = soak.apps.iter().flat_map(|a| traps(&a.spin)).collect();
        if !trapped.is_empty() {
            failures.push(format!("{} trap lines", trapped.len()));
        }
        let stopped: Vec<usize> = (0..soak.apps.len())
            .filter(|d| !soak.apps[*d].spin.running())
            .collect();
        if !stopped.is_empty() {
            failures.push(format!("spin up stopped on deployment(s) {stopped:?}"));
        }
        Checks {
            notes,
            runs,
            fence,
            trapped,
            failures,
        }
    }
}

/// The occurrences that ran more than once, and how many times.
fn twice(runs: &BTreeMap<u64, usize>) -> Vec<(&u64, &usize)> {
    runs.iter().filter(|(_, n)| **n > 1).collect()
}

/// The table of figures: requests and answers, storage and its faults, the invariants.
fn print_figures(soak: &Soak, stats: &Stats, answers: &Answers, checks: &Checks) {
    let o = soak.options;
    let minutes = o.minutes;
    let (requests, storage, fault_total) = (answers.requests, answers.storage, answers.fault_total);
    let (status_text, codes, fault_text) =
        (&answers.status_text, &answers.codes, &answers.fault_text);
    let (notes, runs, fence) = (&checks.notes, &checks.runs, &checks.fence);
    let twice = twice(runs);
    let span = (minutes * 60.0).round() as u64;
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| requests to the app | {} ({:.0}/s) |",
        thousands(requests),
        requests as f64 / (minutes * 60.0)
    );
    println!("| answers by status | {status_text} |");
    println!(
        "| JSON 503 by `error` | {} |",
        if codes.is_empty() { "none" } else { codes }
    );
    println!(
        "| answers outside 2xx, 429, JSON 503 | {} |",
        thousands(stats.outside)
    );
    println!(
        "| storage requests at the proxies | {}; faults on {} ({:.1} %): {fault_text} |",
        thousands(storage as u64),
        thousands(fault_total as u64),
        if storage > 0 {
            100.0 * fault_total as f64 / storage as f64
        } else {
            0.0
        }
    );
    println!(
        "| notifications | {} to {} devices over {} window(s) of {} s; duplicates in a window {}, \
         repeated idempotency keys {} |",
        thousands(notes.total as u64),
        thousands(notes.devices as u64),
        span.div_ceil(o.window),
        o.window,
        notes.duplicates.len(),
        notes.repeated_keys
    );
    if o.jobs {
        let once = runs.values().filter(|n| **n == 1).count();
        println!(
            "| job runs per occurrence | {} occurrences in {span} s: {once} run once, {} twice, \
             {} not run |",
            span,
            twice.len(),
            span.saturating_sub(runs.len() as u64)
        );
    }
    if o.gates > 0 {
        let g = stats.gate;
        println!(
            "| gate holders at the fence | {} grants, {} worked ({} too late to work), {} \
             released; holders {}, two at once {}, stale writes refused {}, overruns {} |",
            thousands(g.granted),
            thousands(g.worked),
            g.late,
            thousands(g.released),
            thousands(fence.holders),
            fence.overlaps,
            fence.stale,
            fence.overruns
        );
    }
}

/// The figures' rows of Spin's resident memory, per deployment, every minute.
fn print_spin_rss(soak: &Soak, samples: &[Sample]) {
    for (d, _) in soak.apps.iter().enumerate() {
        let per_minute = samples
            .iter()
            .map(|s| mib(s.memory[d].rss_kib))
            .collect::<Vec<_>>()
            .join(" → ");
        println!("| Spin RSS, deployment {d}, MiB per minute | {per_minute} |");
    }
}

/// The figures' rows of the storage restarts: when, how long down, the recovery of each
/// deployment.
fn print_restarts(restarts: &[Restart]) {
    for (k, r) in restarts.iter().enumerate() {
        let recovery = r
            .first_ok
            .iter()
            .enumerate()
            .map(|(d, t)| match t {
                Some(t) => format!("deployment {d} {:.2} s", t.as_secs_f64()),
                None => format!("deployment {d} none"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "| storage restart {} at {:.1} min | down {:.1} s (start {:.1} s); recovery {recovery} |",
            k + 1,
            r.stopped.as_secs_f64() / 60.0,
            r.down.as_secs_f64(),
            r.start_took.as_secs_f64()
        );
    }
}

/// The answers by request and status, the telemetry decisions, the job's tick decisions and its
/// counters (asked of the first deployment).
fn print_by_request(soak: &Soak, stats: &Stats) {
    let o = soak.options;
    println!("\nAnswers by request and status:\n");
    println!("| request | status | answers |");
    println!("|---|---:|---:|");
    for ((kind, status), n) in &stats.statuses {
        println!(
            "| {} | {} | {} |",
            kind.name(),
            status_name(*status),
            thousands(*n)
        );
    }
    println!("\nTelemetry decisions:\n");
    for (d, n) in &stats.decisions {
        println!("  {d}: {}", thousands(*n));
    }
    if o.jobs {
        println!("\nJob tick decisions:\n");
        for (d, n) in &stats.ticks {
            println!("  {d}: {}", thousands(*n));
        }
        let status = call(
            "GET",
            &soak.apps[0].url(&format!("/api/jobs/{JOB}")),
            &[TIMER_AUTH],
            b"",
        );
        println!(
            "\nThe job's counters (GET /api/jobs/{JOB}): {}",
            status.json["counters"]
        );
    }
}

/// Spin's memory and disk from start to end, its resident memory every minute, and the
/// requests per minute.
fn print_memory(soak: &Soak, before: &[Memory], after: &[Memory], samples: &[Sample]) {
    println!("\nSpin's memory and disk, start → end:\n");
    for (d, (b, a)) in before.iter().zip(after).enumerate() {
        println!(
            "  deployment {d}: RSS in MiB {}  →  {}; logs {} → {} MB; key-value store {} → {} KB; \
             open fds {}",
            memory_line(b),
            memory_line(a),
            b.log_bytes / 1_000_000,
            a.log_bytes / 1_000_000,
            b.state_bytes / 1000,
            a.state_bytes / 1000,
            samples
                .iter()
                .map(|s| s.fds[d].to_string())
                .collect::<Vec<_>>()
                .join(" → ")
        );
    }
    println!("\nSpin's resident memory per minute, MiB:\n");
    println!(
        "| deployment | minute | requests | RSS | wasm memories | warm slots | code | heap and \
         stacks | files | threads | open fds |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for d in 0..soak.apps.len() {
        for s in samples {
            let (m, b) = (&s.memory[d], &s.memory[d].breakdown);
            println!(
                "| {d} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                s.minute,
                thousands(s.requests),
                mib(m.rss_kib),
                mib(b.wasm_memories),
                b.warm_slots,
                mib(b.code),
                mib(b.heap),
                mib(b.files),
                m.threads,
                s.fds[d]
            );
        }
    }
    println!("\nRequests per minute:");
    let mut last = 0;
    for s in samples {
        print!(" {}", s.requests - last);
        last = s.requests;
    }
    println!();
}

/// The answers kept in full (outside 2xx, 429 and JSON 503; under `--plain`, every non-2xx),
/// the duplicate notifications and the trap lines.
fn print_kept(o: &Options, stats: &Stats, checks: &Checks) {
    if stats.outside > 0 {
        println!(
            "\nEvery answer outside 2xx, 429 and JSON 503 ({}, the first {} shown):",
            stats.outside,
            stats.outside_kept.len()
        );
        for a in &stats.outside_kept {
            println!("  {a}");
        }
    }
    if o.plain && stats.non_2xx > 0 {
        println!(
            "\nEvery non-2xx answer ({}, the first {} shown):",
            stats.non_2xx,
            stats.non_2xx_kept.len()
        );
        for a in &stats.non_2xx_kept {
            println!("  {a}");
        }
    }
    for d in checks.notes.duplicates.iter().take(20) {
        println!("DUPLICATE {d}");
    }
    for t in checks.trapped.iter().take(20) {
        println!("TRAP {t}");
    }
}
