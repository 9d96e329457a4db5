//! The integration test harness: a real Azurite, started by the tests on a free loopback port
//! with its data in a temporary folder, and stopped when the test process ends.
//!
//! [`Azurite::start_oauth`] starts one that also checks bearer tokens (`--oauth basic`, which
//! needs HTTPS): it serves HTTPS with the server certificate of [`tls::TestCa`]; the tokens come
//! from [`entra::TokenServer`] (or [`entra::mint`]).
//!
//! [`Azurite::start_with_clock_offset`] starts one whose clock is ahead of or behind real time
//! (`faketime`, as `spin up` under [`app::Setup::clock_offset_ms`]): its `Date` header, and so
//! every decision a component takes by the server's clock, is at that shifted time.
//! [`Azurite::at_clock_offset`] shares one per offset across a test process, and
//! [`app::Setup::azurite_same_clock`] points an app's storage at it; [`offset_to`] gives the
//! offset that puts a clock at a chosen instant (just before a DST change, say).
//!
//! Azurite is the npm package pinned in `tests/azurite/package.json`; `scripts/dev.sh` installs
//! it (`npm ci`). Set `LEASEGATE_AZURITE_DEBUG=1` to keep Azurite's debug log (it prints the
//! string-to-sign it computed, the fastest way to mend a 403).

use std::collections::HashMap;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use leasegate::{Account, ContainerName};

pub mod app;
pub mod blobs;
pub mod entra;
pub mod jobs;
pub mod keepalive;
pub mod load;
pub mod process;
pub mod proxy;
pub mod sink;
pub mod spin;
pub mod stub;
pub mod tls;

/// Which of Azurite's services one runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// `azurite-blob`.
    Blob,
    /// `azurite-table`.
    Table,
}

impl Service {
    fn name(self) -> &'static str {
        match self {
            Service::Blob => "blob",
            Service::Table => "table",
        }
    }
}

/// A running Azurite blob service (or, [`Azurite::shared_table`], its table service).
#[derive(Debug)]
pub struct Azurite {
    service: Service,
    /// The wrapper `run.js` (under `faketime` for a clock offset); `None` until started.
    child: Mutex<Option<Child>>,
    /// Held open: Azurite's wrapper stops Azurite when this pipe closes (our process ends, or
    /// [`Azurite::stop`]).
    stdin: Mutex<Option<ChildStdin>>,
    port: u16,
    dir: PathBuf,
    oauth: bool,
    clock_offset_ms: i64,
    /// Its data folder outlives the process (kept across [`Azurite::start_again`]); removed
    /// when dropped.
    restartable: bool,
    /// It serves [`SECOND_ACCOUNT`] beside the development account
    /// ([`Azurite::shared_two_accounts`]).
    two_accounts: bool,
}

/// The second storage account of [`Azurite::shared_two_accounts`]: its name and key (base64).
/// Its blob endpoint is path style, beside the development account's, at the same origin:
/// `http://127.0.0.1:{port}/leasegatesecond`.
pub const SECOND_ACCOUNT: (&str, &str) = (
    "leasegatesecond",
    "bGVhc2VnYXRlIHNlY29uZCBhY2NvdW50IGtleSBmb3IgdGVzdHMgb25seQ==",
);

impl Azurite {
    /// Starts a new Azurite on a free port; panics with a clear message if it cannot.
    pub fn start() -> Azurite {
        Azurite::start_with(false, 0)
    }

    /// Starts a new Azurite like [`Azurite::start`] that checks bearer tokens (`--oauth basic`)
    /// and so serves HTTPS (`--cert`, `--key`: the server certificate of
    /// [`tls::TestCa::shared`], for `localhost` and `127.0.0.1`). SharedKey and SAS requests
    /// keep working on it; a bearer token is checked for its issuer, audience and lifetime,
    /// not its signature.
    pub fn start_oauth() -> Azurite {
        Azurite::start_with(true, 0)
    }

    /// Starts a new Azurite like [`Azurite::start`] (its own port and data folder, not the
    /// shared one) whose clock is `offset_ms` ahead of real time (negative: behind): it runs
    /// under `faketime -f "+S.mmms"` (or `"-S.mmms"`), so its `Date` header, Last-Modified
    /// times and lease expiries are at the shifted time. 0 starts it without `faketime`.
    ///
    /// Stopped when dropped, or when the test process ends, like every other one. To share one
    /// between apps, see [`Azurite::at_clock_offset`]; for the offset of an instant, see
    /// [`offset_to`].
    pub fn start_with_clock_offset(offset_ms: i64) -> Azurite {
        Azurite::start_with(false, offset_ms)
    }

    /// One Azurite per clock offset ([`Azurite::start_with_clock_offset`]), started on first
    /// use and shared by every later caller with the same `offset_ms` in this test process
    /// (each test uses its own container): what [`app::Setup::azurite_same_clock`] uses, so
    /// several deployments of one app with the same offset share its storage. 0 is
    /// [`Azurite::shared`].
    ///
    /// Instances are keyed by the exact offset: compute it once ([`offset_to`]) and pass the
    /// same value to every app and call that should meet on one Azurite. Like the shared one,
    /// it stops when the test process ends.
    pub fn at_clock_offset(offset_ms: i64) -> &'static Azurite {
        if offset_ms == 0 {
            return Azurite::shared();
        }
        static BY_OFFSET: Mutex<Option<HashMap<i64, &'static Azurite>>> = Mutex::new(None);
        // Held while one starts: a second caller with the same offset waits for it instead of
        // starting another.
        let mut started = BY_OFFSET.lock().unwrap_or_else(|e| e.into_inner());
        started
            .get_or_insert_with(HashMap::new)
            .entry(offset_ms)
            .or_insert_with(|| Box::leak(Box::new(Azurite::start_with_clock_offset(offset_ms))))
    }

    /// Starts a new Azurite like [`Azurite::start`] that can be stopped ([`Azurite::stop`])
    /// and started again on the same port with the same data ([`Azurite::start_again`]): a
    /// storage outage that loses nothing storage had acknowledged, as a restart of an Azure
    /// storage node does. Its data folder is removed when it is dropped (not when this process
    /// is killed: it is in the system's temp folder, `leasegate-azurite-*`).
    pub fn start_restartable() -> Azurite {
        Azurite::start_new(false, 0, true, false)
    }

    /// One Azurite serving two accounts at one origin, the development account and
    /// [`SECOND_ACCOUNT`] (`AZURITE_ACCOUNTS`), started on first use and shared by every caller
    /// in this test process (each test uses its own container): two accounts behind one origin,
    /// told apart by their endpoints' paths only.
    pub fn shared_two_accounts() -> &'static Azurite {
        static SHARED: OnceLock<Azurite> = OnceLock::new();
        SHARED.get_or_init(|| Azurite::start_new(false, 0, false, true))
    }

    fn start_with(oauth: bool, clock_offset_ms: i64) -> Azurite {
        Azurite::start_new(oauth, clock_offset_ms, false, false)
    }

    fn start_new(
        oauth: bool,
        clock_offset_ms: i64,
        restartable: bool,
        two_accounts: bool,
    ) -> Azurite {
        Azurite::start_service(
            Service::Blob,
            oauth,
            clock_offset_ms,
            restartable,
            two_accounts,
        )
    }

    /// Starts a new Azurite table service (`azurite-table`, from the same pinned package) on a
    /// free port, like [`Azurite::start`]: its own data folder, `--disableTelemetry`.
    pub fn start_table() -> Azurite {
        Azurite::start_service(Service::Table, false, 0, false, false)
    }

    /// One Azurite table service shared by every test of this test binary (each test uses its
    /// own table). Its [`Azurite::account`] is the development account with this table
    /// endpoint (from a connection string with `TableEndpoint`).
    pub fn shared_table() -> &'static Azurite {
        static SHARED: OnceLock<Azurite> = OnceLock::new();
        SHARED.get_or_init(Azurite::start_table)
    }

    fn start_service(
        service: Service,
        oauth: bool,
        clock_offset_ms: i64,
        restartable: bool,
        two_accounts: bool,
    ) -> Azurite {
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let azurite = Azurite {
                service,
                child: Mutex::new(None),
                stdin: Mutex::new(None),
                port,
                dir: std::env::temp_dir()
                    .join(format!("leasegate-azurite-{}-{port}", std::process::id())),
                oauth,
                clock_offset_ms,
                restartable,
                two_accounts,
            };
            std::fs::create_dir_all(&azurite.dir).expect("create Azurite's data folder");
            match azurite.spawn() {
                Ok(()) => return azurite,
                // Dropping it removes its folder.
                Err(e) => last_error = e,
            }
        }
        panic!("Azurite did not start: {last_error}");
    }

    /// Starts the Azurite process on `self.port` with `self.dir` and waits until it listens;
    /// on failure it is killed and the error says why.
    fn spawn(&self) -> Result<(), String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("azurite");
        let service = self.service.name();
        let main = root.join(format!("node_modules/azurite/dist/src/{service}/main.js"));
        assert!(
            main.exists(),
            "Azurite is not installed: run `npm ci --prefix tests/azurite` (scripts/dev.sh does)"
        );
        let dir = &self.dir;
        let mut cmd = match faketime_args(self.clock_offset_ms) {
            Some(faketime) => {
                let mut cmd = Command::new(&faketime[0]);
                cmd.args(&faketime[1..]).arg("node");
                cmd
            }
            None => Command::new("node"),
        };
        cmd.arg(root.join("run.js"))
            .env("LEASEGATE_AZURITE_SERVICE", service)
            .arg(format!("--{service}Host"))
            .arg("127.0.0.1")
            .arg(format!("--{service}Port"))
            .arg(self.port.to_string())
            .arg("--location")
            .arg(dir)
            // --disableTelemetry: Azurite otherwise sends usage data to an outside service.
            .args([
                "--silent",
                "--skipApiVersionCheck",
                "--loose",
                "--disableTelemetry",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if !self.restartable {
            // The wrapper removes the folder when Azurite ends, however this process ends.
            cmd.env("LEASEGATE_AZURITE_TMP", dir);
        }
        if self.two_accounts {
            // Naming accounts replaces the development account: it is named too.
            let (name, key) = SECOND_ACCOUNT;
            cmd.env(
                "AZURITE_ACCOUNTS",
                format!(
                    "{}:{};{name}:{key}",
                    leasegate::DEV_ACCOUNT_NAME,
                    leasegate::DEV_ACCOUNT_KEY
                ),
            );
        }
        if self.oauth {
            let (cert, key) = tls::TestCa::shared().write_server_pems(dir);
            cmd.arg("--cert")
                .arg(cert)
                .arg("--key")
                .arg(key)
                .args(["--oauth", "basic"]);
        }
        if std::env::var_os("LEASEGATE_AZURITE_DEBUG").is_some() {
            cmd.arg("--debug").arg(dir.join("debug.log"));
            eprintln!("azurite debug log: {}", dir.join("debug.log").display());
        }
        let mut child = cmd.spawn().expect("start node (is Node.js installed?)");
        let stdin = child.stdin.take();
        match wait_listening(&mut child, self.port, Duration::from_secs(60)) {
            Ok(()) => {
                *self.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
                *self.stdin.lock().unwrap_or_else(|e| e.into_inner()) = stdin;
                Ok(())
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// Starts a [`Azurite::start_restartable`] one again after [`Azurite::stop`], on the same
    /// port with the same data folder, and waits until it listens. Returns how long that took.
    /// Panics for any other Azurite, or if it does not start.
    pub fn start_again(&self) -> Duration {
        assert!(
            self.restartable,
            "only an Azurite::start_restartable() keeps its data to start again with"
        );
        let started = Instant::now();
        if let Err(e) = self.spawn() {
            panic!("Azurite did not start again on port {}: {e}", self.port);
        }
        started.elapsed()
    }

    /// One Azurite shared by every test of this test binary (each test uses its own container).
    pub fn shared() -> &'static Azurite {
        static SHARED: OnceLock<Azurite> = OnceLock::new();
        SHARED.get_or_init(Azurite::start)
    }

    /// One Azurite with `--oauth basic` ([`Azurite::start_oauth`]) shared by every test of this
    /// test binary (each test uses its own container).
    pub fn shared_oauth() -> &'static Azurite {
        static SHARED: OnceLock<Azurite> = OnceLock::new();
        SHARED.get_or_init(Azurite::start_oauth)
    }

    /// The port it listens on (the blob or the table service's).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its data folder (`--location`).
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    /// `127.0.0.1:{port}`: what [`proxy::Proxy`] is given as its upstream.
    pub fn authority(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// How far its clock is ahead of real time in ms (negative: behind; 0 for a plain one):
    /// [`Azurite::start_with_clock_offset`].
    pub fn clock_offset_ms(&self) -> i64 {
        self.clock_offset_ms
    }

    /// Whether it checks bearer tokens and serves HTTPS ([`Azurite::start_oauth`]).
    pub fn is_oauth(&self) -> bool {
        self.oauth
    }

    /// `http://127.0.0.1:{port}/devstoreaccount1`; `https://localhost:{port}/devstoreaccount1`
    /// for [`Azurite::start_oauth`] (the name its certificate is for; a client must trust
    /// [`tls::TestCa`]).
    pub fn endpoint(&self) -> String {
        if self.oauth {
            format!("https://localhost:{}/devstoreaccount1", self.port)
        } else {
            format!("http://127.0.0.1:{}/devstoreaccount1", self.port)
        }
    }

    /// A connection string for the development account on this Azurite: its `BlobEndpoint`,
    /// or for a table service its `TableEndpoint`.
    pub fn connection_string(&self) -> String {
        let protocol = if self.oauth { "https" } else { "http" };
        let key = match self.service {
            Service::Blob => "BlobEndpoint",
            Service::Table => "TableEndpoint",
        };
        format!(
            "DefaultEndpointsProtocol={protocol};AccountName={};AccountKey={};{key}={};",
            leasegate::DEV_ACCOUNT_NAME,
            leasegate::DEV_ACCOUNT_KEY,
            self.endpoint()
        )
    }

    /// The development account on this Azurite (for [`Azurite::start_oauth`] at its HTTPS
    /// endpoint: a client must trust [`tls::TestCa`]; a plain client goes through
    /// [`proxy::Proxy::start_to_tls`] with an account at the proxy's origin instead).
    pub fn account(&self) -> Account {
        match self.service {
            Service::Blob => Account::development(&self.endpoint()).expect("valid endpoint"),
            // Its blob endpoint is the one derived from the account name: not this Azurite.
            Service::Table => Account::from_connection_string(&self.connection_string())
                .expect("valid connection string"),
        }
    }

    /// Stops Azurite now (fault tests) and waits for it: closes the pipe its wrapper
    /// (`run.js`) watches, which stops Azurite itself and ends; killed after 5 s if it has not.
    /// (Killing the process we started would miss Azurite: it is the wrapper's child.)
    ///
    /// For a [`Azurite::start_restartable`] one it also waits (up to 30 s) until Azurite itself
    /// has ended, having saved its data (it saves on SIGTERM; its autosave runs only every
    /// 5 s), so that [`Azurite::start_again`] finds everything it acknowledged.
    pub fn stop(&self) {
        let azurite: Vec<u32> = if self.restartable {
            self.child
                .lock()
                .ok()
                .and_then(|c| c.as_ref().map(|c| process::descendants(c.id())))
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if let Ok(mut stdin) = self.stdin.lock() {
            stdin.take();
        }
        if let Some(mut child) = self.child.lock().ok().and_then(|mut c| c.take()) {
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut ended = false;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    ended = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if !ended {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while azurite.iter().any(|pid| process::alive(*pid)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port that was free a moment ago.
///
/// Never the same port twice in one test process: instances started at once (each binding its
/// port a moment later) must not be handed one port.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind a loopback port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
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

/// A clock `offset_ms` off real time for a command: `env LD_PRELOAD=<libfaketime>
/// FAKETIME=+S.mmms` (`-S.mmms` behind), a program and its arguments to put before it; `None`
/// for 0 (no shifted clock). Panics with how to install `faketime` if its library is missing.
///
/// The library is preloaded directly rather than through the `faketime` wrapper: the wrapper
/// creates a semaphore and a shared-memory segment named after its own pid and removes them
/// only when it ends normally, so a wrapper stopped by KILL leaves them in `/dev/shm`, and a
/// later wrapper given the same pid refuses to start (`faketime: sem_open: File exists`). A
/// fixed offset needs neither: every process under it (Spin, its cron plugin, Azurite) reads
/// the same `FAKETIME`.
pub fn faketime_args(offset_ms: i64) -> Option<Vec<String>> {
    if offset_ms == 0 {
        return None;
    }
    let sign = if offset_ms < 0 { '-' } else { '+' };
    let abs = offset_ms.unsigned_abs();
    Some(vec![
        "env".into(),
        format!("LD_PRELOAD={}", libfaketime().display()),
        format!("FAKETIME={sign}{}.{:03}s", abs / 1000, abs % 1000),
    ])
}

/// Panics with how to install `faketime` if its library is missing.
pub fn require_faketime() {
    libfaketime();
}

/// The path of `libfaketime.so.1`: `LEASEGATE_LIBFAKETIME` if set, else where Debian and
/// Ubuntu (`/usr/lib/<triplet>/faketime/`) or a source build (`/usr/local/lib/faketime/`)
/// put it. Panics with how to install `faketime` if none is there.
pub fn libfaketime() -> &'static Path {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    let found = FOUND.get_or_init(|| {
        if let Some(path) = std::env::var_os("LEASEGATE_LIBFAKETIME") {
            return Some(PathBuf::from(path));
        }
        let mut dirs = vec![
            PathBuf::from("/usr/lib/faketime"),
            PathBuf::from("/usr/local/lib/faketime"),
        ];
        if let Ok(entries) = std::fs::read_dir("/usr/lib") {
            dirs.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().contains("-linux-"))
                    .map(|e| e.path().join("faketime")),
            );
        }
        dirs.into_iter()
            .map(|dir| dir.join("libfaketime.so.1"))
            .find(|lib| lib.is_file())
    });
    found.as_deref().unwrap_or_else(|| {
        panic!(
            "`faketime` is not installed (no libfaketime.so.1): apt-get install -y faketime \
             (scripts/dev.sh setup does), or set LEASEGATE_LIBFAKETIME to its path"
        )
    })
}

/// The clock offset in ms ([`app::Setup::clock_offset_ms`],
/// [`Azurite::start_with_clock_offset`]) that puts a clock at `target_unix` (seconds since the
/// Unix epoch) now: `target_unix * 1000` minus real now in ms; negative for a past instant.
///
/// A clock under `faketime` keeps this offset, so from then on it runs on from `target_unix`
/// as real time does: compute it right before starting what runs under it (after building the
/// components: [`app::build_components`]), and use that one value for every process that must
/// share the clock (one Azurite per exact offset: [`Azurite::at_clock_offset`]).
///
/// ```
/// // 10 s before the US switch to daylight time: 2026-03-08T07:00:00Z.
/// let target = humantime::parse_rfc3339("2026-03-08T06:59:50Z").unwrap();
/// let secs = target.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
/// let offset_ms = leasegate_tests::offset_to(secs);
/// let shifted_now = leasegate_tests::unix_now() as i64 + offset_ms / 1000;
/// assert!((shifted_now - secs as i64).abs() <= 1);
/// ```
pub fn offset_to(target_unix: u64) -> i64 {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis();
    let target_ms = i128::from(target_unix) * 1000;
    i64::try_from(target_ms - now_ms as i128).expect("an offset that fits in i64 ms")
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs()
}

/// `t` in whole seconds since the epoch (0 before it).
pub fn unix_secs(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Sleeps until the local clock starts its next second (Azurite runs on this machine, so its
/// `Date` does too), and returns that second: an operation started then has the rest of the
/// second before storage's `Date` moves (a claim written within one second names the same
/// expiry as one written earlier in it, and is not written again).
pub fn next_second() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .expect("the clock is after 1970");
    let rest = Duration::from_secs(1) - Duration::from_nanos(u64::from(now.subsec_nanos()));
    std::thread::sleep(rest + Duration::from_millis(1));
    unix_now()
}

/// `secs` since the epoch as RFC 3339 in whole seconds (`2026-11-25T04:00:00Z`).
pub fn rfc3339_secs(secs: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// `secs` and `millis` since the epoch as RFC 3339 with milliseconds
/// (`2026-11-25T04:00:00.250Z`).
pub fn rfc3339_millis(secs: u64, millis: u64) -> String {
    humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis),
    )
    .to_string()
}

/// A number drawn uniformly from [0, 1), from the system's random source (through `uuid`): for
/// faults and load drawn at random.
pub fn uniform() -> f64 {
    let bits = uuid::Uuid::new_v4().as_u64_pair().0 >> 11;
    bits as f64 / (1u64 << 53) as f64
}

/// A whole number drawn uniformly below `n` (0 for `n` = 0).
pub fn random_below(n: usize) -> usize {
    ((uniform() * n as f64) as usize).min(n.saturating_sub(1))
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

/// What [`Faulty`] does to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send it and return the answer.
    Pass,
    /// Send it, then drop the answer and report a timeout: the request reached storage, the
    /// caller cannot know what it did.
    LoseAnswer,
    /// Do not send it; answer this status (503 carries `ServerBusy`).
    Status(u16),
    /// Wait, then send it.
    Delay(Duration),
}

type Rule = Box<dyn Fn(usize, &leasegate::Request) -> Step + Send + Sync>;

/// A transport that applies a rule to each request (numbered from 0): for fault tests of the
/// lease algorithms against a real Azurite.
pub struct Faulty<T> {
    inner: T,
    rule: Rule,
    sent: AtomicU32,
}

impl<T> Faulty<T> {
    /// Wraps `inner`; `rule` decides what happens to request number `n`.
    pub fn new(
        inner: T,
        rule: impl Fn(usize, &leasegate::Request) -> Step + Send + Sync + 'static,
    ) -> Self {
        Faulty {
            inner,
            rule: Box::new(rule),
            sent: AtomicU32::new(0),
        }
    }
}

impl<T: leasegate::Transport> leasegate::Transport for Faulty<T> {
    async fn send(
        &self,
        request: leasegate::Request,
    ) -> Result<leasegate::Response, leasegate::TransportError> {
        let n = self.sent.fetch_add(1, Ordering::SeqCst) as usize;
        match (self.rule)(n, &request) {
            Step::Pass => self.inner.send(request).await,
            Step::LoseAnswer => {
                let _ = self.inner.send(request).await;
                Err(leasegate::TransportError::new(
                    leasegate::TransportErrorKind::Timeout,
                    "answer lost (test fault)",
                ))
            }
            Step::Status(status) => {
                let status = leasegate::StatusCode::from_u16(status).expect("a status");
                let mut r = leasegate::Response::new(status).with_header(
                    "date",
                    httpdate::fmt_http_date(std::time::SystemTime::now()),
                );
                if status == 503 {
                    r = r.with_header("x-ms-error-code", "ServerBusy");
                }
                Ok(r)
            }
            Step::Delay(d) => {
                std::thread::sleep(d);
                self.inner.send(request).await
            }
        }
    }

    fn now(&self) -> Option<std::time::SystemTime> {
        self.inner.now()
    }
}

/// The `x-ms-lease-action` of a request, or its method and `comp` (`HEAD`, `PUT metadata`).
pub fn describe(request: &leasegate::Request) -> String {
    if let Some(action) = request.headers().get("x-ms-lease-action") {
        return format!("lease {action}");
    }
    let comp = request
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|p| p.strip_prefix("comp="))
        .unwrap_or("");
    format!("{} {comp}", request.method()).trim().to_string()
}

/// A service SAS (`racwdl`, valid for an hour) for `container` on the shared Azurite, as the
/// query string an application would be given.
pub fn container_sas(container: &ContainerName) -> String {
    use leasegate::signing::{SasPermissions, SasResource, ServiceSas};
    let key = leasegate::AccountKey::try_new(leasegate::DEV_ACCOUNT_KEY).expect("key");
    ServiceSas {
        resource: SasResource::Container(container.clone()),
        permissions: SasPermissions::all(),
        start: None,
        expiry: std::time::SystemTime::now() + Duration::from_secs(3600),
        protocol: None,
    }
    .token(leasegate::DEV_ACCOUNT_NAME, &key)
    .expect("a SAS")
    .query()
    .to_string()
}
