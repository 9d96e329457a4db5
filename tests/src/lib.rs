//! The integration test harness: a real Azurite, started by the tests on a free loopback port
//! with its data in a temporary folder, and stopped when the test process ends.
//!
//! Azurite is the npm package pinned in `tests/azurite/package.json`; `scripts/dev.sh` installs
//! it (`npm ci`). Set `LEASEGATE_AZURITE_DEBUG=1` to keep Azurite's debug log (it prints the
//! string-to-sign it computed, the fastest way to mend a 403).

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use leasegate::{Account, ContainerName};

pub mod app;
pub mod sink;

/// A running Azurite blob service.
pub struct Azurite {
    child: Mutex<Child>,
    /// Held open: Azurite's wrapper stops Azurite when this pipe closes (our process ends).
    _stdin: Mutex<Option<ChildStdin>>,
    port: u16,
    dir: PathBuf,
}

impl Azurite {
    /// Starts a new Azurite on a free port; panics with a clear message if it cannot.
    pub fn start() -> Azurite {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("azurite");
        let main = root.join("node_modules/azurite/dist/src/blob/main.js");
        assert!(
            main.exists(),
            "Azurite is not installed: run `npm ci --prefix tests/azurite` (scripts/dev.sh does)"
        );
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir()
                .join(format!("leasegate-azurite-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create Azurite's data folder");
            let mut cmd = Command::new("node");
            cmd.arg(root.join("run.js"))
                .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                .arg("--location")
                .arg(&dir)
                .args(["--silent", "--skipApiVersionCheck", "--loose"])
                .env("LEASEGATE_AZURITE_TMP", &dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            if std::env::var_os("LEASEGATE_AZURITE_DEBUG").is_some() {
                cmd.arg("--debug").arg(dir.join("debug.log"));
                eprintln!("azurite debug log: {}", dir.join("debug.log").display());
            }
            let mut child = cmd.spawn().expect("start node (is Node.js installed?)");
            let stdin = child.stdin.take();
            match wait_listening(&mut child, port, Duration::from_secs(60)) {
                Ok(()) => {
                    return Azurite {
                        child: Mutex::new(child),
                        _stdin: Mutex::new(stdin),
                        port,
                        dir,
                    }
                }
                Err(e) => {
                    last_error = e;
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = std::fs::remove_dir_all(&dir);
                }
            }
        }
        panic!("Azurite did not start: {last_error}");
    }

    /// One Azurite shared by every test of this test binary (each test uses its own container).
    pub fn shared() -> &'static Azurite {
        static SHARED: OnceLock<Azurite> = OnceLock::new();
        SHARED.get_or_init(Azurite::start)
    }

    /// The blob port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:{port}/devstoreaccount1`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/devstoreaccount1", self.port)
    }

    /// A connection string for the development account on this Azurite.
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={};AccountKey={};BlobEndpoint={};",
            leasegate::account::DEV_ACCOUNT_NAME,
            leasegate::account::DEV_ACCOUNT_KEY,
            self.endpoint()
        )
    }

    /// The development account on this Azurite.
    pub fn account(&self) -> Account {
        Account::development(&self.endpoint()).expect("valid endpoint")
    }

    /// Stops Azurite now (fault tests).
    pub fn stop(&self) {
        if let Ok(mut child) = self.child.lock() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}

fn wait_listening(child: &mut Child, port: u16, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("azurite exited ({status}): {}", err.trim()));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "azurite did not listen on port {port} within {limit:?}"
    ))
}

/// A fresh container name, unique in this process and across runs.
pub fn unique_container(tag: &str) -> ContainerName {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let rand = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let tag: String = tag
        .chars()
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        .take(30)
        .collect();
    ContainerName::try_new(&format!("t{n}-{tag}-{rand}")).expect("valid container name")
}

/// Polls `check` every 200 ms until it returns `Some`, or panics after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
