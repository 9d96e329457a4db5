//! The Spin app under test: its release `.wasm` components (built once per test process),
//! served by the wasmtime host from the real `spin.toml`, against the shared Azurite, with a
//! webhook sink for notifications.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use leasegate::ContainerName;
use leasegate_host::{Host, HostConfig};

use crate::sink::Sink;
use crate::{unique_container, Azurite};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace root")
        .to_path_buf()
}

/// Builds the components for wasm32-wasip2 in release, once per test process, so that the
/// tests always run the `.wasm` files of the code under test.
pub fn build_components() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let status = Command::new(env!("CARGO"))
            .current_dir(root())
            .args([
                "build",
                "--release",
                "--locked",
                "--target",
                "wasm32-wasip2",
                "-p",
                "device-alerts",
                "-p",
                "gate",
                "-p",
                "scheduled-job",
                "-p",
                "leader",
                "-p",
                "init-once",
                "-p",
                "ttl-sweeper",
            ])
            .status()
            .expect("run cargo to build the components");
        assert!(
            status.success(),
            "building the wasm32-wasip2 components failed"
        );
    });
}

/// A `.wasm` component's path.
pub fn wasm(name: &str) -> PathBuf {
    root().join(format!("target/wasm32-wasip2/release/{name}.wasm"))
}

/// The bearer token the test app's gate expects.
pub const GATE_TOKEN: &str = "test-gate-token-7f3a";
/// The bearer token the test app's telemetry endpoint expects.
pub const TELEMETRY_TOKEN: &str = "test-telemetry-token-91c2";
/// The test app's `lease_id_secret`.
pub const LEASE_ID_SECRET: &str = "test-lease-id-secret-5d0e";
/// The bearer token of the test app's timer routes (`/api/jobs/...`).
pub const TIMER_TOKEN: &str = "test-timer-token-3b8d";
/// `Authorization: Bearer <TIMER_TOKEN>`.
pub const TIMER_AUTH: (&str, &str) = ("authorization", "Bearer test-timer-token-3b8d");

/// Which manifest a test app is served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manifest {
    /// `spin.toml`: the HTTP app.
    Http,
    /// `spin-cron.toml`: the timer functions on Spin's cron trigger.
    Cron,
    /// The Azure Functions deployment's manifest: `spin.toml` plus
    /// `deploy/azure-functions/timer-routes.toml`, as `assemble.py` makes it.
    Azure,
}

impl Manifest {
    /// The manifest file.
    pub fn path(self) -> PathBuf {
        match self {
            Manifest::Http => root().join("spin.toml"),
            Manifest::Cron => root().join("spin-cron.toml"),
            Manifest::Azure => {
                static WRITTEN: OnceLock<PathBuf> = OnceLock::new();
                WRITTEN
                    .get_or_init(|| {
                        // Written into target/, so the component paths lose their `target/`.
                        let text = std::fs::read_to_string(root().join("spin.toml"))
                            .expect("read spin.toml")
                            + "\n"
                            + &std::fs::read_to_string(
                                root().join("deploy/azure-functions/timer-routes.toml"),
                            )
                            .expect("read timer-routes.toml");
                        let text = text.replace("source = \"target/", "source = \"").replace(
                            "azure_functions = { default = \"off\" }",
                            "azure_functions = { default = \"on\" }",
                        );
                        // One file whatever the test process (the text is always the same),
                        // written beside and renamed into place so that processes running at
                        // once never read half of it.
                        let path = root().join("target/leasegate-azure-spin.toml");
                        let part = root().join(format!(
                            "target/leasegate-azure-spin.toml.{}",
                            std::process::id()
                        ));
                        std::fs::write(&part, text).expect("write the Azure manifest");
                        std::fs::rename(&part, &path).expect("move the Azure manifest in place");
                        path
                    })
                    .clone()
            }
        }
    }
}

/// How to start a test app beyond its variables.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The manifest.
    pub manifest: Manifest,
    /// The guests' wall clock is this far ahead of real time (negative: behind).
    pub clock_offset_ms: i64,
    /// Share this container (several deployments of one app) instead of a fresh one.
    pub container: Option<ContainerName>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            manifest: Manifest::Http,
            clock_offset_ms: 0,
            container: None,
        }
    }
}

/// The app, served on a free loopback port.
pub struct App {
    /// The host serving the components.
    pub host: Host,
    /// Where notifications go.
    pub sink: Sink,
    /// This app's own container (so tests do not see each other's gates).
    pub container: ContainerName,
    /// The storage origin's authority (`127.0.0.1:port`), for counting and faults.
    pub storage: String,
}

impl App {
    /// Starts the app with the test defaults, then `overrides` (application variables).
    pub fn start(tag: &str, overrides: &[(&str, &str)]) -> App {
        App::start_with(tag, overrides, Setup::default())
    }

    /// Starts the app from `setup`'s manifest, clock and container.
    pub fn start_with(tag: &str, overrides: &[(&str, &str)], setup: Setup) -> App {
        build_components();
        let azurite = Azurite::shared();
        let sink = Sink::start();
        let container = setup.container.unwrap_or_else(|| unique_container(tag));
        let mut variables: HashMap<String, String> = HashMap::from([
            (
                "storage_origin".into(),
                format!("http://127.0.0.1:{}", azurite.port()),
            ),
            ("container".into(), container.as_str().to_string()),
            ("notify_origin".into(), sink.origin()),
            ("gate_token".into(), GATE_TOKEN.into()),
            ("telemetry_token".into(), TELEMETRY_TOKEN.into()),
            ("lease_id_secret".into(), LEASE_ID_SECRET.into()),
            ("timer_token".into(), TIMER_TOKEN.into()),
            ("instance_id".into(), "test-instance".into()),
            ("job_origin".into(), sink.origin()),
            ("leader_origin".into(), sink.origin()),
            ("init_origin".into(), sink.origin()),
            ("storage_timeout_ms".into(), "3000".into()),
        ]);
        for (k, v) in overrides {
            variables.insert(k.to_string(), v.to_string());
        }
        let host = Host::start(HostConfig {
            manifest: setup.manifest.path(),
            variables,
            listen: "127.0.0.1:0".parse().expect("address"),
            echo: std::env::var_os("LEASEGATE_HOST_ECHO").is_some(),
            clock_offset_ms: setup.clock_offset_ms,
            cron: false,
        })
        .expect("start the wasm host");
        App {
            host,
            sink,
            container,
            storage: format!("127.0.0.1:{}", azurite.port()),
        }
    }

    /// `http://127.0.0.1:{port}{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.host.url())
    }

    /// The host's record of the request that gave `response`.
    pub fn record_of(&self, response: &Answer) -> leasegate_host::RequestRecord {
        self.host
            .record(response.request_id, Duration::from_secs(30))
            .expect("the host recorded the request")
    }
}

/// Every answer the app gave must have left in one write: its body written and finished before
/// the response was set (see `leasegate_host`'s `response` module). Checked when the app goes
/// away, for every test.
impl Drop for App {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let split: Vec<String> = self
            .host
            .records()
            .iter()
            .filter(|r| r.complete_at_set == Some(false))
            .map(|r| format!("{} {} -> {} ({})", r.method, r.path, r.status, r.component))
            .collect();
        assert!(
            split.is_empty(),
            "responses set before their body was finished (head and body in two TCP segments: a delayed-ACK stall under Spin): {split:?}"
        );
    }
}

/// An HTTP answer, read whole.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status.
    pub status: u16,
    /// Headers (names lowercased).
    pub headers: HashMap<String, String>,
    /// The body parsed as JSON (`Null` if empty or not JSON).
    pub json: serde_json::Value,
    /// The raw body.
    pub text: String,
    /// The host's id of the request (`leasegate-host-request-id`).
    pub request_id: u64,
}

/// Sends one request to the app.
pub fn call(method: &str, url: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut request = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(body.to_vec()).expect("request");
    let response = agent.run(request).expect("the app answers");
    let status = response.status().as_u16();
    let headers: HashMap<String, String> = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let text = response.into_body().read_to_string().unwrap_or_default();
    Answer {
        status,
        request_id: headers
            .get("leasegate-host-request-id")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        json: serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        headers,
        text,
    }
}

/// `Authorization: Bearer <TELEMETRY_TOKEN>`.
pub const TELEMETRY_AUTH: (&str, &str) = ("authorization", "Bearer test-telemetry-token-91c2");

/// `POST /api/telemetry` with a JSON body and the test token.
pub fn post_telemetry(app: &App, body: &serde_json::Value) -> Answer {
    call(
        "POST",
        &app.url("/api/telemetry"),
        &[("content-type", "application/json"), TELEMETRY_AUTH],
        body.to_string().as_bytes(),
    )
}

/// One bad request and the 4xx it must get.
#[derive(Debug, Clone)]
pub struct BadCase {
    /// Method.
    pub method: &'static str,
    /// Path and query.
    pub path: String,
    /// Headers.
    pub headers: Vec<(&'static str, &'static str)>,
    /// Body.
    pub body: Vec<u8>,
    /// The status it must get.
    pub status: u16,
}

/// `method path` with `headers` and `body` must be answered `status`.
pub fn bad(
    method: &'static str,
    path: &str,
    headers: &[(&'static str, &'static str)],
    body: &[u8],
    status: u16,
) -> BadCase {
    BadCase {
        method,
        path: path.to_string(),
        headers: headers.to_vec(),
        body: body.to_vec(),
        status,
    }
}

/// Sends every case: each gets its status and a JSON error (`error`, or an Azure answer's
/// `ReturnValue.error`) holding none of `secrets`; afterwards no request of the app was
/// answered 5xx and no log line holds a secret.
pub fn expect_clear_errors(app: &App, cases: &[BadCase], secrets: &[&str]) {
    for c in cases {
        let a = call(c.method, &app.url(&c.path), &c.headers, &c.body);
        assert_eq!(a.status, c.status, "{} {}: {}", c.method, c.path, a.text);
        let error = a.json["error"]
            .as_str()
            .or_else(|| a.json["ReturnValue"]["error"].as_str())
            .unwrap_or_else(|| panic!("{} {}: no JSON error: {}", c.method, c.path, a.text));
        assert!(!error.is_empty());
        for s in secrets {
            assert!(!a.text.contains(s), "{} {}: {}", c.method, c.path, a.text);
        }
    }
    assert!(app.host.wait_idle(Duration::from_secs(30)));
    for r in app.host.records() {
        assert!(r.status < 500, "{} {} -> {}", r.method, r.path, r.status);
        for line in &r.output {
            for s in secrets {
                assert!(!line.contains(s), "{line}");
            }
        }
    }
}
