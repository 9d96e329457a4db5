//! The real Spin CLI as the tests' runtime: `spin up` of a manifest on a free loopback port,
//! each instance with its own state and log folders (instances from one manifest would share
//! `.spin/sqlite_key_value.db` otherwise), optionally under `faketime` (a clock ahead of or
//! behind real time; the cron plugin, a child of `spin`, inherits it).
//!
//! Spin runs inside a small `bash` watchdog that is its process group's leader and reads this
//! process's pipe: when the test process ends, however it ends, the pipe closes and the
//! watchdog stops Spin and everything Spin started (the cron plugin). Dropping a [`Spin`]
//! does the same at once.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The Spin version the tests are written for (`spin --version` starts with it).
pub const SPIN_VERSION: &str = "4.";
/// The cron trigger plugin version verified here.
pub const CRON_PLUGIN_VERSION: &str = "0.5.0";

/// How to install Spin when it is missing.
pub const INSTALL_HINT: &str = "the Spin CLI is needed to run the components: run `scripts/dev.sh setup` (it installs Spin and the trigger-cron plugin from ../shared/tools when that folder is there), or install Spin 4.x (https://spinframework.dev) and `spin plugins install trigger-cron --version 0.5.0`";

/// Checks once that `spin` (and, when `cron` is set, the trigger-cron plugin) is installed;
/// panics with [`INSTALL_HINT`] otherwise.
pub fn require_spin(cron: bool) {
    static SPIN: Mutex<Option<Result<(), String>>> = Mutex::new(None);
    let mut checked = SPIN.lock().unwrap_or_else(|e| e.into_inner());
    let result = checked.get_or_insert_with(|| {
        let version = Command::new("spin")
            .arg("--version")
            .output()
            .map_err(|e| format!("`spin --version` failed ({e}): {INSTALL_HINT}"))?;
        let text = String::from_utf8_lossy(&version.stdout).to_string();
        if !version.status.success() || !text.starts_with(&format!("spin {SPIN_VERSION}")) {
            return Err(format!(
                "`spin --version` says {text:?}, wanted Spin {SPIN_VERSION}x: {INSTALL_HINT}"
            ));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    if cron {
        let plugins = Command::new("spin")
            .args(["plugins", "list", "--installed"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        assert!(
            plugins.lines().any(|l| l.starts_with("trigger-cron")),
            "the trigger-cron plugin is not installed: {INSTALL_HINT}"
        );
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct SpinConfig {
    /// The manifest (`spin up --from`).
    pub manifest: PathBuf,
    /// Application variables (`--variable k=v`).
    pub variables: Vec<(String, String)>,
    /// Files of application variables (`--variable @FILE`), given before [`Self::variables`].
    pub variable_files: Vec<PathBuf>,
    /// Serve HTTP (a manifest with HTTP triggers); `false` for a cron-only manifest.
    pub http: bool,
    /// The clock is this far ahead of real time (negative: behind), through `faketime`.
    pub clock_offset_ms: i64,
    /// A runtime config file's text (`--runtime-config-file`).
    pub runtime_config: Option<String>,
    /// Environment variables for Spin (its runtime's knobs, e.g. `SPIN_WASMTIME_POOLING=0`).
    pub env: Vec<(String, String)>,
    /// `spin up --quiet`: the components' output goes to their log files only, not also to
    /// Spin's own output (which tests read; the bench sets this).
    pub quiet: bool,
}

/// A running `spin up`.
pub struct Spin {
    child: Mutex<Child>,
    /// The watchdog stops Spin when this closes.
    stdin: Mutex<Option<ChildStdin>>,
    addr: Option<SocketAddr>,
    dir: PathBuf,
}

impl Spin {
    /// Starts `spin up` and waits until it serves (or, without HTTP, until it runs); panics
    /// with Spin's own output if it cannot start.
    pub fn start(config: &SpinConfig) -> Spin {
        require_spin(!config.http);
        if config.clock_offset_ms != 0 {
            crate::require_faketime();
        }
        let mut last = String::new();
        for attempt in 0..4 {
            let dir = scratch_dir("spin");
            let addr = config
                .http
                .then(|| SocketAddr::from(([127, 0, 0, 1], crate::free_port())));
            let mut args: Vec<String> = vec![
                "up".into(),
                "--from".into(),
                config.manifest.display().to_string(),
                "--state-dir".into(),
                dir.join("state").display().to_string(),
                "--log-dir".into(),
                dir.join("logs").display().to_string(),
            ];
            if let Some(addr) = addr {
                args.extend(["--listen".into(), addr.to_string()]);
            }
            if config.quiet {
                args.push("--quiet".into());
            }
            if let Some(rc) = &config.runtime_config {
                let path = dir.join("runtime-config.toml");
                std::fs::write(&path, rc).expect("write the runtime config");
                args.extend(["--runtime-config-file".into(), path.display().to_string()]);
            }
            for file in &config.variable_files {
                args.extend(["--variable".into(), format!("@{}", file.display())]);
            }
            for (k, v) in &config.variables {
                args.extend(["--variable".into(), format!("{k}={v}")]);
            }
            let mut program: Vec<String> =
                crate::faketime_args(config.clock_offset_ms).unwrap_or_default();
            program.push("spin".into());
            let out = std::fs::File::create(dir.join("spin.out")).expect("spin.out");
            let err = std::fs::File::create(dir.join("spin.err")).expect("spin.err");
            // The watchdog: Spin in the background, and when our pipe closes (or Spin ends),
            // TERM to the whole process group, then KILL whatever is left. The pipe is read
            // through fd 3: a background job of a non-interactive shell gets /dev/null as its
            // stdin, so a plain `cat` would see EOF at once and stop Spin 5 s after its start.
            let script = r#"trap '' TERM
exec 3<&0
"$@" </dev/null 3<&- &
pid=$!
{ cat <&3 >/dev/null; kill -TERM "$pid" 2>/dev/null; sleep 5; kill -KILL 0; } &
wait "$pid"
kill -TERM 0 2>/dev/null
sleep 1
kill -KILL 0"#;
            let mut child = Command::new("bash")
                .arg("-c")
                .arg(script)
                .arg("leasegate-spin-watchdog")
                .args(&program)
                .args(&args)
                .process_group(0)
                .envs(config.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::piped())
                .stdout(out)
                .stderr(err)
                .spawn()
                .expect("start bash");
            let stdin = child.stdin.take();
            let spin = Spin {
                child: Mutex::new(child),
                stdin: Mutex::new(stdin),
                addr,
                dir,
            };
            match spin.wait_ready(Duration::from_secs(120)) {
                Ok(()) => return spin,
                Err(e) => {
                    last = e;
                    // A port taken between choosing it and Spin binding it: try another.
                    if !last.contains("in use") || attempt == 3 {
                        break;
                    }
                }
            }
        }
        panic!("spin up did not start: {last}");
    }

    fn wait_ready(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let exited = self
                .child
                .lock()
                .map(|mut c| c.try_wait().ok().flatten().is_some())
                .unwrap_or(true);
            if exited {
                return Err(format!(
                    "it exited.\nstdout:\n{}\nstderr:\n{}",
                    self.stdout(),
                    self.stderr()
                ));
            }
            let ready = match self.addr {
                // Ready when this Spin says it serves its address (a connect alone could reach
                // another instance that took the port first) and the port answers.
                Some(addr) => {
                    self.stdout().contains(&format!("Serving http://{addr}"))
                        && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
                }
                // A cron-only app: running once Spin has set up its log folder.
                None => self.dir.join("logs").exists(),
            };
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not ready within {limit:?}.\nstdout:\n{}\nstderr:\n{}",
                    self.stdout(),
                    self.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The `spin` process and every process it started, while it runs: `spin up` starts
    /// `spin trigger http` (which runs the components) and, for a cron manifest, the cron
    /// plugin.
    pub fn pids(&self) -> Vec<u32> {
        let Some(watchdog) = self.child.lock().ok().map(|c| c.id()) else {
            return Vec::new();
        };
        let Some(spin) = crate::process::descendants(watchdog)
            .into_iter()
            .find(|pid| crate::process::name(*pid) == "spin")
        else {
            return Vec::new();
        };
        let mut pids = vec![spin];
        pids.extend(crate::process::descendants(spin));
        pids
    }

    /// Resident memory (`VmRSS`) of [`Spin::pids`] together, in KiB; 0 when it does not run.
    pub fn rss_kib(&self) -> u64 {
        self.pids().into_iter().map(crate::process::rss_kib).sum()
    }

    /// `127.0.0.1:{port}`; panics for a cron-only app.
    pub fn addr(&self) -> SocketAddr {
        self.addr.expect("this app serves no HTTP")
    }

    /// `http://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Whether `spin up` is still running.
    pub fn running(&self) -> bool {
        self.child
            .lock()
            .map(|mut c| c.try_wait().ok().flatten().is_none())
            .unwrap_or(false)
    }

    /// Spin's own stdout (its routes, its messages).
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.join("spin.out")).unwrap_or_default()
    }

    /// Spin's own stderr (errors, traps: "panicked at", "wasm trap").
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("spin.err")).unwrap_or_default()
    }

    /// Every line the components wrote to stdout and stderr so far (the files of
    /// `--log-dir`), in file order.
    pub fn component_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.join("logs")) {
            let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            for f in files {
                let text = std::fs::read_to_string(&f).unwrap_or_default();
                lines.extend(text.lines().map(str::to_string));
            }
        }
        lines
    }

    /// The components' lines, then Spin's own output (where traps and the cron plugin's
    /// errors show; Spin also repeats the components' output there, so a line may appear
    /// twice): what to search for a secret or a trap.
    pub fn log_lines(&self) -> Vec<String> {
        let mut lines = self.component_lines();
        lines.extend(self.stdout().lines().map(str::to_string));
        lines.extend(self.stderr().lines().map(str::to_string));
        lines
    }

    /// The components' JSON log lines (those that parse), in file order, each once.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.component_lines()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v.is_object())
            .collect()
    }

    /// This instance's own folder (state, logs, Spin's output).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Freezes Spin and everything it started (SIGSTOP to its process group): a deployment that
    /// stalls mid-invocation (a paused VM, a stopped container) while its lease runs out.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a [`Spin::pause`]d instance go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills Spin and everything it started (SIGKILL to its process group), mid-invocation if
    /// one is going: a deployment that vanishes (its node lost, its pod evicted).
    pub fn kill(&self) {
        self.signal("-KILL");
        if let Ok(mut child) = self.child.lock() {
            let _ = child.wait();
        }
    }

    fn signal(&self, signal: &str) {
        if let Ok(child) = self.child.lock() {
            let status = Command::new("kill")
                .args([signal, "--", &format!("-{}", child.id())])
                .status();
            assert!(
                status.is_ok_and(|s| s.success()),
                "kill {signal} to spin's process group"
            );
        }
    }

    /// Stops Spin (and the cron plugin) now and waits for it.
    pub fn stop(&self) {
        if let Ok(mut stdin) = self.stdin.lock() {
            if let Some(mut s) = stdin.take() {
                let _ = s.flush();
            }
        }
        if let Ok(mut child) = self.child.lock() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
        }
    }
}

impl Drop for Spin {
    fn drop(&mut self) {
        self.stop();
        if std::env::var_os("LEASEGATE_KEEP_SPIN_DIRS").is_none() && !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A new folder under the system's temp folder, unique to this process and call.
pub fn scratch_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("leasegate-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch folder");
    dir
}

/// The runtime config `base` (`spin up --runtime-config-file`; none: an empty one) with one more
/// variables provider, a `static` one holding every application variable of `manifest`: its
/// value in `given`, else its default (a variable with neither is left out, for Spin to report). Spin asks its providers in turn at
/// each variable read (`--variable` first, then the runtime config's, then its environment
/// provider); the environment provider hands its thread over at every read it gets, answered or
/// not (about 30 µs a read, docs/benchmarks.md), where a static one answers from a map. The
/// bench serves the app this way, as docs/configuration.md advises for deployments.
pub fn variables_in_memory(
    base: Option<&str>,
    manifest: &Path,
    given: &[(String, String)],
) -> String {
    let text = std::fs::read_to_string(manifest).expect("read the manifest");
    let doc: toml::Table = text.parse().expect("the manifest parses");
    let mut values = toml::Table::new();
    if let Some(declared) = doc.get("variables").and_then(|v| v.as_table()) {
        for (name, spec) in declared {
            if let Some(default) = spec.get("default").and_then(|d| d.as_str()) {
                values.insert(name.clone(), toml::Value::String(default.to_string()));
            }
        }
    }
    for (name, value) in given {
        values.insert(name.clone(), toml::Value::String(value.clone()));
    }
    let mut provider = toml::Table::new();
    provider.insert("type".into(), toml::Value::String("static".into()));
    provider.insert("values".into(), toml::Value::Table(values));
    let mut config: toml::Table = match base {
        Some(text) => text.parse().expect("the runtime config parses as TOML"),
        None => toml::Table::new(),
    };
    config
        .entry("variables_provider")
        .or_insert_with(|| toml::Value::Array(Vec::new()))
        .as_array_mut()
        .expect("variables_provider is an array of tables")
        .push(toml::Value::Table(provider));
    toml::to_string(&config).expect("a runtime config serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_in_memory_holds_the_defaults_and_what_was_given() {
        let dir = scratch_dir("manifest-vars");
        let manifest = dir.join("spin.toml");
        std::fs::write(
            &manifest,
            "spin_manifest_version = 2\n[variables]\na = { default = \"1\" }\n\
             b = { default = \"x \\\"quoted\\\"\", secret = true }\nc = { required = true }\n\
             d = { required = true }\n",
        )
        .unwrap();
        let given = [("b".into(), "given".into()), ("c".into(), "3".into())];
        // Added to a runtime config that has a provider (written inline) and more.
        let base = "variables_provider = [{ type = \"env\", prefix = \"X\" }]\n\
                    [key_value_store.default]\ntype = \"spin\"\n";
        let text = variables_in_memory(Some(base), &manifest, &given);
        let doc: toml::Table = text.parse().unwrap();
        assert_eq!(
            doc["key_value_store"]["default"]["type"].as_str(),
            Some("spin")
        );
        let providers = doc["variables_provider"].as_array().unwrap();
        assert_eq!(providers.len(), 2);
        assert_eq!(providers[0]["type"].as_str(), Some("env"));
        assert_eq!(providers[1]["type"].as_str(), Some("static"));
        let values = providers[1]["values"].as_table().unwrap();
        let got: Vec<(&str, &str)> = values
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
            .collect();
        assert_eq!(got, [("a", "1"), ("b", "given"), ("c", "3")]);
        let _ = std::fs::remove_dir_all(dir);
    }
}
