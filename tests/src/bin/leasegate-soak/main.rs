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

mod report;

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use leasegate_tests::app::{App, Setup, GATE_TOKEN, TELEMETRY_TOKEN, TIMER_TOKEN};
use leasegate_tests::load::{http_request, Answer, Connection};
use leasegate_tests::proxy::Fault;
use leasegate_tests::sink::Sink;
use leasegate_tests::{random_below, unique_container, Azurite};

const USAGE: &str = "usage: leasegate-soak --minutes N [--plain] [--deployments 2] \
                     [--concurrency 16 | C:MIN,...,C] [--devices 2000] \
                     [--faults refuse=2,503=2,slow=2,lost=1 | none] [--restarts 2] \
                     [--outage SECONDS] [--window SECONDS] [--gates 2] [--no-jobs] [--cold] \
                     [--var k=v]... [--spin-env K=V]...";

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

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    minutes: f64,
    plain: bool,
    deployments: usize,
    /// Telemetry threads per phase: (threads, minutes); the last phase runs to the end.
    concurrency: Vec<(usize, f64)>,
    devices: usize,
    /// Storage faults and their probability.
    faults: Vec<(Fault, f64)>,
    /// How the faults were asked for (for the report).
    faults_spec: String,
    restarts: usize,
    outage: Duration,
    window: u64,
    gates: usize,
    jobs: bool,
    cold: bool,
    vars: Vec<(String, String)>,
    spin_env: Vec<(String, String)>,
}

/// The soak the issue describes: two deployments, c=16 over 2,000 devices, random storage
/// faults, two storage restarts, gates and a per-second job.
impl Default for Options {
    fn default() -> Self {
        Options {
            minutes: 0.0,
            plain: false,
            deployments: 2,
            concurrency: vec![(16, 0.0)],
            devices: 2000,
            faults: Vec::new(),
            faults_spec: "refuse=2,503=2,slow=2,lost=1".into(),
            restarts: 2,
            outage: Duration::from_secs(10),
            window: 90,
            gates: 2,
            jobs: true,
            cold: false,
            vars: Vec::new(),
            spin_env: Vec::new(),
        }
    }
}

fn pairs(text: &str, what: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or(format!("{what} wants NAME=VALUE, got {text}"))
}

/// `refuse=2,503=2,slow=2,lost=1` (per cent) as the proxy's chances; `none` for none.
fn parse_faults(spec: &str) -> Result<Vec<(Fault, f64)>, String> {
    if spec == "none" {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for part in spec.split(',') {
        let (kind, pct) = part
            .split_once('=')
            .ok_or(format!("bad fault {part}: KIND=PERCENT"))?;
        let p: f64 = pct.parse().map_err(|_| format!("bad per cent in {part}"))?;
        if !(0.0..=100.0).contains(&p) {
            return Err(format!("bad per cent in {part}"));
        }
        let p = p / 100.0;
        match kind {
            "refuse" => out.push((Fault::Refuse, p)),
            "503" => out.push((Fault::Status(503), p)),
            "lost" => out.push((Fault::LoseAnswer, p)),
            // Three in four a little late, one in four past the storage timeout.
            "slow" => {
                out.push((Fault::Delay(Duration::from_millis(500)), p * 0.75));
                out.push((Fault::Delay(Duration::from_secs(4)), p * 0.25));
            }
            _ => return Err(format!("unknown fault {kind}: refuse, 503, slow or lost")),
        }
    }
    if out.iter().map(|(_, p)| p).sum::<f64>() > 1.0 {
        return Err("the faults add up to more than 100 %".into());
    }
    Ok(out)
}

fn options() -> Result<Options, String> {
    let mut o = Options::default();
    let (mut deployments, mut faults, mut restarts, mut window, mut gates, mut jobs) =
        (None, None, None, None, None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value; {USAGE}"));
        let number = |v: String| v.parse::<usize>().map_err(|_| format!("bad {arg}: {v}"));
        match arg.as_str() {
            "--minutes" => {
                o.minutes = value()?
                    .parse()
                    .ok()
                    .filter(|m: &f64| *m > 0.0 && *m <= 24.0 * 60.0)
                    .ok_or("--minutes: more than 0, at most a day")?
            }
            "--plain" => o.plain = true,
            "--deployments" => deployments = Some(number(value()?)?.clamp(1, 8)),
            "--concurrency" => {
                let mut phases = Vec::new();
                for part in value()?.split(',') {
                    let (c, m) = match part.split_once(':') {
                        Some((c, m)) => (c, m.parse().map_err(|_| "bad --concurrency")?),
                        None => (part, 0.0),
                    };
                    let c: usize = c.parse().map_err(|_| "bad --concurrency")?;
                    if c == 0 || c > 512 {
                        return Err("--concurrency: 1 to 512 threads".into());
                    }
                    phases.push((c, m));
                }
                o.concurrency = phases;
            }
            "--devices" => o.devices = number(value()?)?.max(1),
            "--faults" => faults = Some(value()?),
            "--restarts" => restarts = Some(number(value()?)?.min(10)),
            "--outage" => {
                o.outage = Duration::from_secs_f64(
                    value()?
                        .parse()
                        .ok()
                        .filter(|s: &f64| (0.0..=600.0).contains(s))
                        .ok_or("--outage: 0 to 600 seconds")?,
                )
            }
            "--window" => window = Some(number(value()?)? as u64),
            "--gates" => gates = Some(number(value()?)?.min(16)),
            "--no-jobs" => jobs = Some(false),
            "--cold" => o.cold = true,
            "--var" => o.vars.push(pairs(&value()?, "--var")?),
            "--spin-env" => o.spin_env.push(pairs(&value()?, "--spin-env")?),
            _ => return Err(format!("unknown argument {arg}; {USAGE}")),
        }
    }
    if o.minutes == 0.0 {
        return Err(format!("--minutes is needed; {USAGE}"));
    }
    if o.plain {
        // The plain soak: one deployment, hot devices with an hour's window, nothing else.
        o.deployments = 1;
        o.faults_spec = "none".into();
        o.restarts = 0;
        o.window = 3600;
        o.gates = 0;
        o.jobs = false;
    }
    o.deployments = deployments.unwrap_or(o.deployments);
    o.faults_spec = faults.unwrap_or(o.faults_spec);
    o.faults = parse_faults(&o.faults_spec)?;
    o.restarts = restarts.unwrap_or(o.restarts);
    o.window = window.unwrap_or(o.window);
    if (15..=60).contains(&o.window) {
        eprintln!(
            "soak: warning: a {} s window is a native lease, which Azurite forgets when it \
             restarts: duplicates after a restart would be Azurite's",
            o.window
        );
    }
    o.gates = gates.unwrap_or(o.gates);
    o.jobs = jobs.unwrap_or(o.jobs);
    Ok(o)
}

impl Options {
    /// Telemetry threads at `elapsed` into the run.
    fn threads_at(&self, elapsed: Duration) -> usize {
        let mut upto = 0.0;
        for (c, minutes) in &self.concurrency {
            upto += minutes;
            if *minutes == 0.0 || elapsed.as_secs_f64() < upto * 60.0 {
                return *c;
            }
        }
        self.concurrency.last().map_or(16, |(c, _)| *c)
    }

    fn max_threads(&self) -> usize {
        self.concurrency.iter().map(|(c, _)| *c).max().unwrap_or(16)
    }
}

/// The kinds of request sent to the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Telemetry,
    GatePost,
    GateDelete,
    JobTick,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Telemetry => "POST /api/telemetry",
            Kind::GatePost => "POST /api/gate/{key}",
            Kind::GateDelete => "DELETE /api/gate/{key}",
            Kind::JobTick => "POST /api/jobs/{job}/tick",
        }
    }
}

/// Answers outside 2xx/429/JSON 503 (and, under `--plain`, every non-2xx) kept in full.
const KEPT: usize = 200;

/// Everything counted while the soak runs.
#[derive(Debug, Default)]
pub struct Stats {
    /// Answers by kind and status (0: no answer, the connection failed).
    pub statuses: BTreeMap<(Kind, u16), u64>,
    /// JSON 503 answers by their `error`.
    pub codes: BTreeMap<String, u64>,
    /// Telemetry decisions (`throttled (cached)` apart).
    pub decisions: BTreeMap<String, u64>,
    /// Job tick decisions.
    pub ticks: BTreeMap<String, u64>,
    /// Answers outside 2xx, 429 and JSON 503: how many, and the first [`KEPT`] in full.
    pub outside: u64,
    pub outside_kept: Vec<String>,
    /// Every non-2xx answer (kept under `--plain`): how many, and the first [`KEPT`] in full.
    pub non_2xx: u64,
    pub non_2xx_kept: Vec<String>,
    /// Gate clients: grants, grants that came too late to work, holders that worked, fence
    /// writes refused, releases answered 204.
    pub gate: GateStats,
}

/// What the gate clients saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct GateStats {
    pub granted: u64,
    pub late: u64,
    pub worked: u64,
    pub fence_refused: u64,
    pub released: u64,
}

impl Stats {
    fn requests(&self) -> u64 {
        self.statuses.values().sum()
    }
}

/// One storage restart.
#[derive(Debug, Clone)]
pub struct Restart {
    /// When Azurite was stopped, from the soak's start.
    pub stopped: Duration,
    /// How long it was down (stopped until listening again).
    pub down: Duration,
    /// How long starting it took.
    pub start_took: Duration,
    /// When it listened again.
    pub back: Option<Instant>,
    /// Per deployment: the first 2xx decision that needed storage, sent after it was back.
    pub first_ok: Vec<Option<Duration>>,
}

/// One minute's memory reading.
#[derive(Debug, Clone)]
pub struct Sample {
    pub minute: f64,
    pub requests: u64,
    /// Per deployment: Spin's memory, and its open file descriptors.
    pub memory: Vec<report::Memory>,
    pub fds: Vec<usize>,
}

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

fn auth(token: &str) -> String {
    format!("Bearer {token}")
}

/// The JSON body of an answer (`Null` if it is not JSON).
fn json(a: &Answer) -> serde_json::Value {
    serde_json::from_slice(&a.body).unwrap_or(serde_json::Value::Null)
}

fn describe(kind: Kind, d: usize, a: &io::Result<Answer>) -> String {
    match a {
        Ok(a) => format!(
            "{} on deployment {d}: {} {}",
            kind.name(),
            a.status,
            String::from_utf8_lossy(&a.body)
                .chars()
                .take(600)
                .collect::<String>()
        ),
        Err(e) => format!("{} on deployment {d}: no answer: {e}", kind.name()),
    }
}

impl Soak<'_> {
    fn running(&self) -> bool {
        Instant::now() < self.end && !self.stop.load(Ordering::Relaxed)
    }

    /// Counts one answer; `storage_ok` says whether it was a 2xx decision that needed storage.
    fn count(&self, kind: Kind, d: usize, sent: Instant, a: &io::Result<Answer>, storage_ok: bool) {
        let status = a.as_ref().map_or(0, |a| a.status);
        let body = a.as_ref().map(json).unwrap_or_default();
        let json_503 = status == 503 && body["error"].is_string();
        let allowed = (200..300).contains(&status) || status == 429 || json_503;
        {
            let mut s = self.stats.lock().expect("stats");
            *s.statuses.entry((kind, status)).or_insert(0) += 1;
            if json_503 {
                let code = body["error"].as_str().unwrap_or("").to_string();
                *s.codes.entry(code).or_insert(0) += 1;
            }
            if !allowed {
                s.outside += 1;
                if s.outside_kept.len() < KEPT {
                    s.outside_kept.push(describe(kind, d, a));
                }
            }
            if !(200..300).contains(&status) {
                s.non_2xx += 1;
                if self.options.plain && s.non_2xx_kept.len() < KEPT {
                    s.non_2xx_kept.push(describe(kind, d, a));
                }
            }
            match kind {
                Kind::Telemetry => {
                    for decision in body["decisions"].as_array().into_iter().flatten() {
                        let mut name = decision["decision"].as_str().unwrap_or("?").to_string();
                        if decision["cached"] == true {
                            name.push_str(" (cached)");
                        }
                        *s.decisions.entry(name).or_insert(0) += 1;
                    }
                }
                Kind::JobTick => {
                    let name = body["decision"].as_str().unwrap_or("(no decision)");
                    *s.ticks.entry(name.to_string()).or_insert(0) += 1;
                }
                _ => {}
            }
        }
        if storage_ok {
            let now = Instant::now();
            let mut restarts = self.restarts.lock().expect("restarts");
            if let Some(r) = restarts.last_mut() {
                if let Some(back) = r.back.filter(|back| sent >= *back) {
                    if r.first_ok[d].is_none() {
                        r.first_ok[d] = Some(now - back);
                    }
                }
            }
        }
    }

    /// A telemetry thread: one reading at a time, deployments in turn, devices at random.
    fn telemetry(&self, thread: usize) {
        let mut conns: Vec<Connection> = self.addrs.iter().map(|a| Connection::new(*a)).collect();
        let token = auth(TELEMETRY_TOKEN);
        let temperature = if self.options.cold { 12.0 } else { 35.0 };
        let mut n = thread;
        while self.running() {
            if thread >= self.options.threads_at(self.started.elapsed()) {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            let d = n % conns.len();
            n += 1;
            let device = random_below(self.options.devices);
            let body = serde_json::json!({
                "deviceId": format!("soak-device-{device}"),
                "temperature": temperature,
            })
            .to_string();
            let request = http_request(
                "POST",
                "/api/telemetry",
                &self.addrs[d].to_string(),
                &[
                    ("authorization", &token),
                    ("content-type", "application/json"),
                ],
                body.as_bytes(),
            );
            let sent = Instant::now();
            let a = conns[d].exchange(&request);
            let storage_ok = a.as_ref().is_ok_and(|a| {
                a.status == 200
                    && json(a)["decisions"].as_array().is_some_and(|ds| {
                        ds.iter().any(|x| {
                            x["decision"] == "notified"
                                || (x["decision"] == "throttled" && x["cached"] != true)
                        })
                    })
            });
            if a.is_err() {
                std::thread::sleep(Duration::from_millis(10));
            }
            self.count(Kind::Telemetry, d, sent, &a, storage_ok);
        }
    }

    /// A gate client of deployment `d`: take a key, work between two fenced writes, release.
    fn gate(&self, d: usize, client: usize) {
        let addr = self.addrs[d];
        let host = addr.to_string();
        let mut conn = Connection::new(addr);
        let fence_addr: SocketAddr = self.fence.authority().parse().expect("the fence's address");
        let mut fence = Connection::new(fence_addr);
        let token = auth(GATE_TOKEN);
        let holder = format!("soak-{d}-{client}");
        while self.running() {
            let key = random_below(GATE_KEYS);
            let window = GATE_WINDOWS[random_below(GATE_WINDOWS.len())];
            let target = format!("/api/gate/soak%2Fk{key}?window={window}&holder={holder}");
            let request = http_request("POST", &target, &host, &[("authorization", &token)], b"");
            let sent = Instant::now();
            let a = conn.exchange(&request);
            let granted = a.as_ref().ok().filter(|a| a.status == 200).map(json);
            self.count(Kind::GatePost, d, sent, &a, granted.is_some());
            let Some(grant) = granted else {
                // Busy or failed: come back soon (not after Retry-After: contention is the point).
                std::thread::sleep(Duration::from_millis(50 + random_below(100) as u64));
                continue;
            };
            self.stats.lock().expect("stats").gate.granted += 1;
            let (fencing, lease, ends) = (
                grant["fencingToken"].as_u64(),
                grant["leaseId"].as_str().unwrap_or("").to_string(),
                grant["expiresAt"].as_str().unwrap_or("").to_string(),
            );
            let ends_at = humantime::parse_rfc3339(&ends).ok();
            let in_time = ends_at.is_some_and(|e| SystemTime::now() + GATE_MARGIN < e);
            match (fencing, in_time) {
                (Some(fencing), true) => {
                    let mut refused = 0;
                    for phase in ["begin", "end"] {
                        let body = serde_json::json!({
                            "key": format!("soak/k{key}"),
                            "fencingToken": fencing,
                            "phase": phase,
                            "leaseEndsAt": ends,
                        })
                        .to_string();
                        let w = http_request(
                            "POST",
                            "/fence",
                            &self.fence.authority(),
                            &[("content-type", "application/json")],
                            body.as_bytes(),
                        );
                        if !fence.exchange(&w).is_ok_and(|a| a.status == 204) {
                            refused += 1;
                        }
                        if phase == "begin" {
                            std::thread::sleep(GATE_WORK);
                        }
                    }
                    let mut s = self.stats.lock().expect("stats");
                    s.gate.worked += 1;
                    s.gate.fence_refused += refused;
                }
                _ => self.stats.lock().expect("stats").gate.late += 1,
            }
            let request = http_request(
                "DELETE",
                &format!("/api/gate/soak%2Fk{key}"),
                &host,
                &[("authorization", &token), ("lease-id", &lease)],
                b"",
            );
            let sent = Instant::now();
            let a = conn.exchange(&request);
            let released = a.as_ref().is_ok_and(|a| a.status == 204);
            if released {
                self.stats.lock().expect("stats").gate.released += 1;
            }
            self.count(Kind::GateDelete, d, sent, &a, released);
            std::thread::sleep(Duration::from_millis(random_below(50) as u64));
        }
    }

    /// The job's scheduler on deployment `d`: a tick every second, at a random point of it.
    fn ticker(&self, d: usize) {
        let addr = self.addrs[d];
        let mut conn = Connection::new(addr);
        let token = auth(TIMER_TOKEN);
        let request = http_request(
            "POST",
            &format!("/api/jobs/{JOB}/tick"),
            &addr.to_string(),
            &[("authorization", &token)],
            b"",
        );
        while self.running() {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("after 1970");
            let into = Duration::from_nanos(u64::from(now.subsec_nanos()));
            let at = Duration::from_millis(100 + random_below(600) as u64);
            let wait = if into < at {
                at - into
            } else {
                Duration::from_secs(1) - into + at
            };
            std::thread::sleep(wait);
            if !self.running() {
                break;
            }
            let sent = Instant::now();
            let a = conn.exchange(&request);
            let ok = a.as_ref().is_ok_and(|a| (200..300).contains(&a.status));
            self.count(Kind::JobTick, d, sent, &a, ok);
        }
    }

    /// Stops and starts storage `restarts` times, evenly spread over the run.
    fn restarter(&self) {
        let n = self.options.restarts;
        let total = self.end - self.started;
        for k in 1..=n {
            let at = self.started + total.mul_f64(k as f64 / (n + 1) as f64);
            while Instant::now() < at {
                if !self.running() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("soak: restart {k}: stopping storage");
            let stopping = Instant::now();
            self.restarts.lock().expect("restarts").push(Restart {
                stopped: stopping - self.started,
                down: Duration::ZERO,
                start_took: Duration::ZERO,
                back: None,
                first_ok: vec![None; self.apps.len()],
            });
            self.azurite.stop();
            std::thread::sleep(self.options.outage);
            let start_took = self.azurite.start_again();
            let back = Instant::now();
            {
                let mut restarts = self.restarts.lock().expect("restarts");
                let r = restarts.last_mut().expect("pushed above");
                r.down = back - stopping;
                r.start_took = start_took;
                r.back = Some(back);
            }
            eprintln!(
                "soak: restart {k}: storage back after {:.1} s (starting took {:.1} s)",
                (back - stopping).as_secs_f64(),
                start_took.as_secs_f64()
            );
        }
    }

    /// Every minute: progress and memory.
    fn monitor(&self) {
        let mut next = self.started;
        loop {
            self.sample(false);
            next += Duration::from_secs(60);
            while Instant::now() < next {
                if !self.running() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    fn sample(&self, last: bool) {
        let minute = self.started.elapsed().as_secs_f64() / 60.0;
        let (requests, by_status) = {
            let s = self.stats.lock().expect("stats");
            let mut by_status: BTreeMap<u16, u64> = BTreeMap::new();
            for ((_, status), n) in &s.statuses {
                *by_status.entry(*status).or_insert(0) += n;
            }
            (s.requests(), by_status)
        };
        let memory: Vec<report::Memory> = self.apps.iter().map(report::memory).collect();
        let fds: Vec<usize> = self
            .apps
            .iter()
            .map(|a| report::open_fds(&a.spin))
            .collect();
        let faults: usize = self
            .apps
            .iter()
            .flat_map(|a| a.storage.faults_applied())
            .map(|(_, n)| n)
            .sum();
        eprintln!(
            "soak: {minute:.1} min{}: {requests} requests; answers {}; storage faults {faults}; \
             Spin RSS in MiB {}",
            if last { " (end)" } else { "" },
            by_status
                .iter()
                .map(|(s, n)| format!("{} {n}", report::status_name(*s)))
                .collect::<Vec<_>>()
                .join(", "),
            memory
                .iter()
                .enumerate()
                .map(|(d, m)| format!("d{d} {} ({} fds)", report::memory_line(m), fds[d]))
                .collect::<Vec<_>>()
                .join("; ")
        );
        self.samples.lock().expect("samples").push(Sample {
            minute,
            requests,
            memory,
            fds,
        });
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
    use leasegate_tests::uniform;

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
