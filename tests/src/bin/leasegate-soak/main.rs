//! `leasegate-soak` (`scripts/dev.sh soak --minutes N`): the app under the real `spin up` for
//! minutes on end, with faults, checking that nothing is ever done twice.
//!
//! Two deployments of `spin.toml` (the release components) share one container on one Azurite,
//! each behind its own fault proxy, webhook sink and key-value store. For `--minutes`:
//!
//! * **telemetry** at c=16 (`--concurrency`): each thread posts one hot reading of a device
//!   drawn from 2,000 (`--devices`) to one deployment, then the other; alert windows of 90 s;
//! * **gates**: two clients per deployment take a gate key of 8 (`soak/k0`..`soak/k7`, windows
//!   of 3 s and 10 s mixed), "work" by writing `begin` and `end` with their fencing token to a
//!   fenced resource (the sink's `/fence`, which refuses a lower token than one it has seen
//!   and counts a holder beginning while another works within its lease: two holders at once),
//!   and release;
//! * **a job** on a per-second schedule (`job_schedule = "* * * * * *"`), ticked every second on
//!   both deployments (`POST /api/jobs/example-job/tick` with the timer token, at a random
//!   point of the second), its runs counted per occurrence at the sinks. `job_overlap = allow`:
//!   each occurrence is decided by its reservation alone, so every second can run. (With the
//!   default `skip`, a run whose release is lost keeps the job's lease for its term, 62 s
//!   here, and the occurrences meanwhile are `skipped_overlap`: `--var job_overlap=skip`.);
//! * **faults** on every storage request, drawn at random at each deployment's storage proxy
//!   (`--faults`, default `refuse=2,503=2,slow=2,lost=1` per cent: a refused connection, a 503
//!   `ServerBusy`, an answer 0.5 s late (three in four) or 4 s late (one in four; past the 3 s
//!   `storage_timeout_ms`), an answer lost after storage acted);
//! * **storage restarted** twice (`--restarts`), evenly spread: Azurite is stopped, kept down
//!   for 10 s (`--outage`), and started again on its port with its data (it saves on SIGTERM:
//!   nothing it acknowledged is lost, as in an Azure failover). Azurite 3.35 loses its native
//!   blob leases over a restart (`tests/tests/core/azurite_restart.rs`), which Azure never does, so
//!   every window here is a lease record (not 15-60 s), and the job's lease term is too (job
//!   timeout 40 s: a 62 s term).
//!
//! It prints progress every minute (requests, answers by status, each Spin's resident memory),
//! then a summary: requests and answers by status, each JSON 503's `error`, every answer
//! outside 2xx, 429 and JSON 503 with its body, notifications per device per window, job runs
//! per occurrence, gate holders per key at the fence, Spin's memory every minute (and by kind of
//! mapping at the start and the end) and the recovery after each restart: from storage back to
//! the first 2xx decision that needed storage, sent after it was back, per deployment. It exits
//! non-zero if a device was notified twice in a window, an occurrence ran twice, two gate
//! holders worked at once, an answer was outside 2xx/429/JSON 503, or a component trapped.
//!
//! `--plain` is the soak without faults: one deployment, telemetry only over hot devices with
//! an hour's window (each notified once, then throttled from the key-value cache), no faults,
//! no restarts, every non-2xx answer printed with its body. `--var k=v` sets an application
//! variable (`kv_cache=off`), `--spin-env K=V` an environment variable of `spin up`
//! (`SPIN_WASMTIME_POOLING=0`), `--cold` posts readings below the threshold (no storage, no
//! key-value store), `--concurrency 128:2,16` runs 128 threads for 2 minutes, then 16.
//!
//! Its parts: `args.rs` the command line, `stats.rs` what is counted of each answer,
//! `clients.rs` the requests sent to the app (telemetry, gates, the job's ticks),
//! `restarts.rs` storage's restarts, `monitor.rs` the progress every minute, `report.rs` what
//! it prints at the end.

mod args;
mod clients;
mod monitor;
mod report;
mod restarts;
mod stats;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use leasegate_tests::app::{App, Setup};
use leasegate_tests::sink::Sink;
use leasegate_tests::{unique_container, Azurite};

use args::{options, Options};
use stats::{Restart, Sample, Stats};

/// Gate keys the gate clients share.
const GATE_KEYS: usize = 8;
/// The gate windows, drawn per call: both lease records.
const GATE_WINDOWS: [u64; 2] = [3, 10];
/// How long a gate holder "works" between its two writes to the fence.
const GATE_WORK: Duration = Duration::from_millis(20);
/// A holder begins only with at least this much of its lease left.
const GATE_MARGIN: Duration = Duration::from_secs(1);
/// The job's timeout: its lease term (timeout + 4 x 3 s + 10 s = 62 s) is a lease record.
const JOB_TIMEOUT_SECONDS: &str = "40";
/// The job (`job_name`'s default).
const JOB: &str = "example-job";

struct Soak<'a> {
    options: &'a Options,
    apps: &'a [App],
    addrs: Vec<SocketAddr>,
    fence: &'a Sink,
    azurite: &'a Azurite,
    started: Instant,
    end: Instant,
    stats: Mutex<Stats>,
    restarts: Mutex<Vec<Restart>>,
    samples: Mutex<Vec<Sample>>,
    stop: AtomicBool,
}

impl Soak<'_> {
    fn running(&self) -> bool {
        Instant::now() < self.end && !self.stop.load(Ordering::Relaxed)
    }
}

fn main() {
    let options = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    leasegate_tests::app::build_components();
    eprintln!(
        "soak: starting Azurite (restartable) and {} deployment(s)",
        options.deployments
    );
    // Leaked: the apps hold it for the whole run; it is stopped and its folder removed at the
    // end.
    let azurite: &'static Azurite = Box::leak(Box::new(Azurite::start_restartable()));
    let container = unique_container("soak");
    let fence = Sink::start();
    let window = options.window.to_string();
    let apps: Vec<App> = (0..options.deployments)
        .map(|d| {
            let instance = format!("soak-{d}");
            let mut vars: Vec<(&str, &str)> = vec![
                ("instance_id", &instance),
                ("alert_window_seconds", &window),
                ("job_schedule", "* * * * * *"),
                ("job_timeout_seconds", JOB_TIMEOUT_SECONDS),
                ("job_overlap", "allow"),
            ];
            vars.extend(options.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let app = App::start_with(
                "soak",
                &vars,
                Setup {
                    azurite: Some(azurite),
                    container: Some(container.clone()),
                    spin_env: options.spin_env.clone(),
                    ..Setup::default()
                },
            );
            // Counts only: a long run would hold every request in memory.
            app.storage.set_recording(false);
            app.webhook.set_recording(false);
            app
        })
        .collect();
    let before: Vec<_> = apps.iter().map(report::memory).collect();
    for app in &apps {
        app.storage.set_random_faults(&options.faults);
    }
    let load_before = report::load_average();
    let started = Instant::now();
    let soak = Soak {
        options: &options,
        addrs: apps.iter().map(|a| a.spin.addr()).collect(),
        apps: &apps,
        fence: &fence,
        azurite,
        started,
        end: started + Duration::from_secs_f64(options.minutes * 60.0),
        stats: Mutex::new(Stats::default()),
        restarts: Mutex::new(Vec::new()),
        samples: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
    };
    eprintln!(
        "soak: running for {} min: {}",
        options.minutes,
        report::what(&options)
    );
    std::thread::scope(|s| {
        let soak = &soak;
        for t in 0..options.max_threads() {
            s.spawn(move || soak.telemetry(t));
        }
        for d in 0..apps.len() {
            for c in 0..options.gates {
                s.spawn(move || soak.gate(d, c));
            }
            if options.jobs {
                s.spawn(move || soak.ticker(d));
            }
        }
        if options.restarts > 0 {
            s.spawn(|| soak.restarter());
        }
        s.spawn(|| soak.monitor());
    });
    let sampled = soak
        .samples
        .lock()
        .expect("samples")
        .last()
        .map(|s| s.minute);
    if sampled.is_none_or(|m| options.minutes - m > 0.1) {
        soak.sample(true);
    }
    // Faults off, then let the last job runs and notifications land.
    for app in &apps {
        app.storage.set_random_faults(&[]);
    }
    std::thread::sleep(Duration::from_secs(3));
    let after: Vec<_> = apps.iter().map(report::memory).collect();
    let failed = report::print(&soak, &before, &after, &load_before);
    drop(apps);
    azurite.stop();
    let _ = std::fs::remove_dir_all(azurite.data_dir());
    if failed {
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::parse_faults;
    use leasegate_tests::{random_below, uniform};

    #[test]
    fn faults_parse_into_shares() {
        let f = parse_faults("refuse=2,503=1,slow=4,lost=1").unwrap();
        assert_eq!(f.len(), 5);
        let total: f64 = f.iter().map(|(_, p)| p).sum();
        assert!((total - 0.08).abs() < 1e-9, "{total}");
        assert!(parse_faults("none").unwrap().is_empty());
        assert!(parse_faults("refuse=200").is_err());
        assert!(parse_faults("explode=1").is_err());
        assert!(parse_faults("refuse=60,503=60").is_err());
    }

    #[test]
    fn concurrency_phases_run_in_turn() {
        let o = Options {
            concurrency: vec![(128, 2.0), (16, 0.0)],
            ..options_for_test()
        };
        assert_eq!(o.threads_at(Duration::from_secs(60)), 128);
        assert_eq!(o.threads_at(Duration::from_secs(121)), 16);
        assert_eq!(o.threads_at(Duration::from_secs(6000)), 16);
        assert_eq!(o.max_threads(), 128);
    }

    fn options_for_test() -> Options {
        Options {
            minutes: 1.0,
            faults_spec: "none".into(),
            restarts: 0,
            outage: Duration::ZERO,
            ..Options::default()
        }
    }

    #[test]
    fn uniform_draws_stay_in_range() {
        assert!((0..100).all(|_| random_below(3) < 3));
        assert_eq!(random_below(0), 0);
        assert!((0..100).all(|_| (0.0..1.0).contains(&uniform())));
    }
}
