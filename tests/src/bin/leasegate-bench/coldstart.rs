//! What a component's size costs under the real Spin: for each folder of components
//! (`--components DIR`, the release build by default), the time `spin up` takes to serve all
//! six from a cold start (`--disable-cache`: every component compiled) and from a warm one
//! (Spin's compilation cache, its default), each component's first answer after that (its
//! first instance), and its steady per-answer time on a keep-alive connection. The answers are
//! 401s (no token sent), so no storage request is in the figures: only what the component's
//! size can change (compiling, instantiating, running it).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    pub first: Duration,
    pub steady: Duration,
}

/// One folder's figures.
pub struct Folder {
    pub dir: PathBuf,
    /// `spin up` to its first accepted connection, compiling every component.
    pub cold: Duration,
    /// The same from Spin's compilation cache.
    pub cached: Duration,
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

/// `spin up` of the copy's manifest on a free port; the child and its address once it accepts
/// connections, and how long that took.
fn spin_up(copy: &Path, cache: bool) -> Result<(Child, String, Duration), String> {
    let addr = format!("127.0.0.1:{}", leasegate_tests::free_port());
    let mut cmd = Command::new("spin");
    cmd.arg("up")
        .arg("--from")
        .arg(copy.join("spin.toml"))
        .args(["--listen", &addr])
        .arg("--state-dir")
        .arg(copy.join("state"))
        .arg("--log-dir")
        .arg(copy.join("logs"))
        .envs(super::spin_env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: `spin up` starts `spin trigger http` as a child, which must
        // go with it.
        .process_group(0);
    if !cache {
        cmd.arg("--disable-cache");
    }
    for token in ["telemetry_token", "gate_token", "timer_token"] {
        cmd.args(["--variable", &format!("{token}=bench-coldstart")]);
    }
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("spin up: {e} ({})", leasegate_tests::spin::INSTALL_HINT))?;
    while started.elapsed() < Duration::from_secs(180) {
        if std::net::TcpStream::connect(&addr).is_ok() {
            return Ok((child, addr, started.elapsed()));
        }
        if let Ok(Some(status)) = child.try_wait() {
            stop(child);
            return Err(format!("spin up exited: {status}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    stop(child);
    Err("spin up did not serve within 180 s".into())
}

/// Stops `spin up` and the trigger process it started (its whole process group).
fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.wait();
}

/// Measures one folder.
pub fn measure(dir: &Path) -> Result<Folder, String> {
    let copy = fresh_copy(dir)?;
    let (child, _, cold) = spin_up(&copy, false)?;
    stop(child);
    // The first cached start fills the cache; the second is what a restart costs.
    let (child, _, _) = spin_up(&copy, true)?;
    stop(child);
    let (child, addr, cached) = spin_up(&copy, true)?;
    let mut components = Vec::new();
    for (name, method, path) in COMPONENTS {
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
            first,
            steady: median(steady),
        });
    }
    stop(child);
    let _ = std::fs::remove_dir_all(&copy);
    Ok(Folder {
        dir: dir.to_path_buf(),
        cold,
        cached,
        components,
    })
}

/// Prints the folders' figures, one table.
pub fn print(folders: &[Folder]) {
    println!(
        "\ncomponent size and cost under spin up (401 answers, no storage request; steady: median \
         of {ANSWERS} on one keep-alive connection)\n"
    );
    println!("| components | component | bytes | first answer ms | steady answer ms |");
    println!("|---|---|---|---|---|");
    for folder in folders {
        let dir = folder
            .dir
            .strip_prefix(root())
            .unwrap_or(&folder.dir)
            .display()
            .to_string();
        for f in &folder.components {
            println!(
                "| {dir} | {} | {} | {:.2} | {:.3} |",
                f.name,
                f.bytes,
                f.first.as_secs_f64() * 1e3,
                f.steady.as_secs_f64() * 1e3,
            );
        }
        println!(
            "| {dir} | spin up, all six: cold (--disable-cache) {:.0} ms, cached {:.0} ms | {} | | |",
            folder.cold.as_secs_f64() * 1e3,
            folder.cached.as_secs_f64() * 1e3,
            folder.components.iter().map(|f| f.bytes).sum::<u64>(),
        );
    }
}
