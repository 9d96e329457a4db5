//! What a component's size costs: for each folder of components (`--components DIR`, the
//! release build by default), the time to compile each one, the time the host takes to start
//! serving all six (it compiles them all first, as `spin up` does), each component's first
//! answer after that (its first instance), and its steady per-answer time on a keep-alive
//! connection. The answers are 401s (no token sent), so no storage request is in the figures:
//! only what the component's size can change (compiling, instantiating, running it).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leasegate_host::{Host, HostConfig};
use leasegate_tests::app::root;
use leasegate_tests::keepalive::KeepAlive;

/// The six components, as built, with a route of theirs that answers 401 without a token.
const COMPONENTS: [(&str, &str, &str); 6] = [
    ("device_alerts", "POST", "/api/telemetry"),
    ("gate", "GET", "/api/gate/bench"),
    ("scheduled_job", "GET", "/api/jobs/bench"),
    ("leader", "GET", "/api/leader"),
    ("init_once", "GET", "/api/init/bench"),
    ("ttl_sweeper", "GET", "/api/sweeper"),
];

/// Answers timed per component for the steady figure.
const ANSWERS: usize = 300;

/// One component's figures.
pub struct Figures {
    pub name: &'static str,
    pub bytes: u64,
    pub compile: Duration,
    pub first: Duration,
    pub steady: Duration,
}

/// One folder's figures.
pub struct Folder {
    pub dir: PathBuf,
    pub start: Duration,
    pub components: Vec<Figures>,
}

/// A fresh copy of `dir`'s components (a new path, so nothing compiled before is reused) and a
/// copy of `spin.toml` serving them.
fn fresh_copy(dir: &Path) -> Result<PathBuf, String> {
    let copy = root()
        .join("target")
        .join(format!("coldstart-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&copy).map_err(|e| format!("{}: {e}", copy.display()))?;
    for (name, _, _) in COMPONENTS {
        let from = dir.join(format!("{name}.wasm"));
        std::fs::copy(&from, copy.join(format!("{name}.wasm")))
            .map_err(|e| format!("{}: {e}", from.display()))?;
    }
    let manifest = std::fs::read_to_string(root().join("spin.toml"))
        .map_err(|e| format!("spin.toml: {e}"))?
        .replace(
            "source = \"target/wasm32-wasip2/release/",
            &format!("source = \"{}/", copy.display()),
        );
    std::fs::write(copy.join("spin.toml"), manifest).map_err(|e| format!("{e}"))?;
    Ok(copy)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn answer(client: &mut KeepAlive, method: &str, path: &str) -> Result<Duration, String> {
    let reply = client
        .send(method, path, &[], b"")
        .map_err(|e| format!("{method} {path}: {e}"))?;
    if reply.status != 401 {
        return Err(format!("{method} {path} answered {}", reply.status));
    }
    Ok(reply.took)
}

/// Measures one folder.
pub fn measure(dir: &Path) -> Result<Folder, String> {
    // Compile times, each on its own fresh copy (the host keeps what it compiled by path).
    let mut compile = Vec::new();
    for (name, _, _) in COMPONENTS {
        let mut times = Vec::new();
        for _ in 0..3 {
            let copy = fresh_copy(dir)?;
            let started = Instant::now();
            leasegate_host::inspect(&copy.join(format!("{name}.wasm")))
                .map_err(|e| format!("{name}: {e:#}"))?;
            times.push(started.elapsed());
            let _ = std::fs::remove_dir_all(&copy);
        }
        compile.push(median(times));
    }
    let copy = fresh_copy(dir)?;
    let mut config = HostConfig::new(copy.join("spin.toml"));
    for token in ["telemetry_token", "gate_token", "timer_token"] {
        config
            .variables
            .insert(token.into(), "bench-coldstart".into());
    }
    let started = Instant::now();
    let host = Host::start(config).map_err(|e| format!("{}: {e:#}", dir.display()))?;
    let start = started.elapsed();
    let addr = host.addr().to_string();
    let mut components = Vec::new();
    for ((name, method, path), compile) in COMPONENTS.into_iter().zip(compile) {
        let mut client = KeepAlive::connect(&addr).map_err(|e| format!("{addr}: {e}"))?;
        let first = answer(&mut client, method, path)?;
        let mut steady = Vec::with_capacity(ANSWERS);
        for _ in 0..ANSWERS {
            steady.push(answer(&mut client, method, path)?);
        }
        let bytes = std::fs::metadata(copy.join(format!("{name}.wasm")))
            .map(|m| m.len())
            .unwrap_or_default();
        components.push(Figures {
            name,
            bytes,
            compile,
            first,
            steady: median(steady),
        });
    }
    drop(host);
    let _ = std::fs::remove_dir_all(&copy);
    Ok(Folder {
        dir: dir.to_path_buf(),
        start,
        components,
    })
}

/// Prints the folders' figures, one table.
pub fn print(folders: &[Folder]) {
    println!(
        "\ncomponent size and cost (401 answers, no storage request; compile: median of 3; \
         steady: median of {ANSWERS} on one keep-alive connection)\n"
    );
    println!(
        "| components | component | bytes | compile ms | first answer ms | steady answer ms |"
    );
    println!("|---|---|---|---|---|---|");
    for folder in folders {
        let dir = folder
            .dir
            .strip_prefix(root())
            .unwrap_or(&folder.dir)
            .display()
            .to_string();
        for f in &folder.components {
            println!(
                "| {dir} | {} | {} | {:.1} | {:.2} | {:.3} |",
                f.name,
                f.bytes,
                f.compile.as_secs_f64() * 1e3,
                f.first.as_secs_f64() * 1e3,
                f.steady.as_secs_f64() * 1e3,
            );
        }
        println!(
            "| {dir} | host start, all six compiled | {} | {:.1} | | |",
            folder.components.iter().map(|f| f.bytes).sum::<u64>(),
            folder.start.as_secs_f64() * 1e3,
        );
    }
}
