//! The soak's command line: its options (the soak by default, `--plain` without
//! faults) and the storage faults it asks the proxies for.

use std::time::Duration;

use leasegate_tests::proxy::Fault;

pub(crate) const USAGE: &str = "usage: leasegate-soak --minutes N [--plain] [--deployments 2] \
                     [--concurrency 16 | C:MIN,...,C] [--devices 2000] \
                     [--faults refuse=2,503=2,slow=2,lost=1 | none] [--restarts 2] \
                     [--outage SECONDS] [--window SECONDS] [--gates 2] [--no-jobs] [--cold] \
                     [--var k=v]... [--spin-env K=V]...";

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub(crate) minutes: f64,
    pub(crate) plain: bool,
    pub(crate) deployments: usize,
    /// Telemetry threads per phase: (threads, minutes); the last phase runs to the end.
    pub(crate) concurrency: Vec<(usize, f64)>,
    pub(crate) devices: usize,
    /// Storage faults and their probability.
    pub(crate) faults: Vec<(Fault, f64)>,
    /// How the faults were asked for (for the report).
    pub(crate) faults_spec: String,
    pub(crate) restarts: usize,
    pub(crate) outage: Duration,
    pub(crate) window: u64,
    pub(crate) gates: usize,
    pub(crate) jobs: bool,
    pub(crate) cold: bool,
    pub(crate) vars: Vec<(String, String)>,
    pub(crate) spin_env: Vec<(String, String)>,
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
pub(crate) fn parse_faults(spec: &str) -> Result<Vec<(Fault, f64)>, String> {
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

pub(crate) fn options() -> Result<Options, String> {
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
    pub(crate) fn threads_at(&self, elapsed: Duration) -> usize {
        let mut upto = 0.0;
        for (c, minutes) in &self.concurrency {
            upto += minutes;
            if *minutes == 0.0 || elapsed.as_secs_f64() < upto * 60.0 {
                return *c;
            }
        }
        self.concurrency.last().map_or(16, |(c, _)| *c)
    }

    pub(crate) fn max_threads(&self) -> usize {
        self.concurrency.iter().map(|(c, _)| *c).max().unwrap_or(16)
    }
}
