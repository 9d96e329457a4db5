//! The Spin app under test: its release `.wasm` components (built once per test process),
//! served by the real `spin up` from the project's own `spin.toml` (or the cron manifest under
//! the real cron plugin), against the shared Azurite through a fault-injecting proxy, with a
//! webhook sink for notifications.
//!
//! An app whose clock is shifted ([`Setup::clock_offset_ms`]) can have storage on the same
//! shifted clock ([`Setup::azurite_same_clock`]): the server's `Date` then says the same time
//! as the components' own clock, as it would in a real deployment at that instant.
//!
//! ```no_run
//! use leasegate_tests::app::{App, Setup};
//! let target = humantime::parse_rfc3339("2026-03-08T06:59:50Z").unwrap();
//! let secs = target.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
//! leasegate_tests::app::build_components(); // before the clock starts running on
//! let offset_ms = leasegate_tests::offset_to(secs);
//! let setup = Setup { clock_offset_ms: offset_ms, azurite_same_clock: true, ..Setup::default() };
//! let app = App::start_with("dst", &[], setup);
//! assert_eq!(app.azurite().clock_offset_ms(), offset_ms);
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use leasegate::ContainerName;

use crate::entra::TokenServer;
use crate::proxy::{Proxy, Seen};
use crate::sink::Sink;
use crate::spin::{Spin, SpinConfig};
use crate::{unique_container, Azurite};

/// The `leasegate` CLI binary, built once per test process.
pub fn cli_binary() -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        cargo_build(
            &["--locked", "-p", "leasegate-cli", "--bin", "leasegate"],
            "the CLI",
        )
    });
    root().join("target/debug/leasegate")
}

/// Runs `cargo build {args}` in the workspace; panics naming `what` if it fails.
///
/// Always into the workspace's own `target/` (a `CARGO_TARGET_DIR` the tests were built with is
/// not passed on): the manifests name their components there (`source = "target/..."`), and
/// [`wasm`] and [`cli_binary`] look there.
fn cargo_build(args: &[&str], what: &str) {
    let status = Command::new(env!("CARGO"))
        .current_dir(root())
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .arg("build")
        .args(args)
        .status()
        .expect("run cargo");
    assert!(status.success(), "building {what} failed");
}

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
        cargo_build(
            &[
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
            ],
            "the wasm32-wasip2 components",
        )
    });
}

/// Builds the examples `examples/ship-once`, `examples/daily-digest` and `examples/ledger` for wasm32-wasip2 in
/// release, once per test process.
pub fn build_example() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        cargo_build(
            &[
                "--release",
                "--locked",
                "--target",
                "wasm32-wasip2",
                "-p",
                "ship-once",
                "-p",
                "daily-digest",
                "-p",
                "ledger",
            ],
            "the examples ship-once, daily-digest and ledger",
        )
    });
}

/// The bearer token a project made from the `leasegate-http` template expects.
pub const TEMPLATE_TOKEN: &str = "test-template-token-6e1b";

/// A project made from one of the repository's `spin new` templates (`templates/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Template {
    /// `leasegate-http` with its defaults: `POST /api/work/{key}`, once per key per hour.
    Http,
    /// `leasegate-timer` with `gate=leader`: `POST /api/timer/tick`, the work on the leader only.
    Leader,
    /// `leasegate-timer` with `gate=occurrence`: `POST /api/timer/tick`, the work once per
    /// occurrence of `work_schedule`.
    Occurrence,
}

impl Template {
    /// The project's name (its folder, its component).
    pub fn project(self) -> &'static str {
        match self {
            Template::Http => "gated-work",
            Template::Leader => "leader-work",
            Template::Occurrence => "occurrence-work",
        }
    }

    /// The template's id.
    pub fn id(self) -> &'static str {
        match self {
            Template::Http => "leasegate-http",
            Template::Leader | Template::Occurrence => "leasegate-timer",
        }
    }

    /// The `--value` parameters beyond `leasegate-source` (the rest are the defaults).
    pub fn values(self) -> &'static [&'static str] {
        match self {
            Template::Http => &[],
            Template::Leader => &["gate=leader"],
            Template::Occurrence => &["gate=occurrence"],
        }
    }
}

/// Where the templates' projects are made: `target/template-test`.
fn template_work() -> PathBuf {
    root().join("target/template-test")
}

/// Runs `spin {args}` in `dir` with Spin's data (its installed templates) in
/// `target/template-test/spin-data`, not the user's; returns what it printed, or its output as
/// `Err` when it failed.
pub fn spin_templates(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("spin")
        .args(args)
        .current_dir(dir)
        .env("XDG_DATA_HOME", template_work().join("spin-data"))
        .output()
        .expect("run spin (see scripts/dev.sh setup)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// Installs the repository's templates into the scratch Spin data directory, once per test
/// process, as a user does from a clone: `spin templates install --dir <the clone>`.
pub fn install_templates() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let work = template_work();
        let _ = std::fs::remove_dir_all(work.join("spin-data"));
        std::fs::create_dir_all(&work).expect("make target/template-test");
        // `--dir` names the folder that holds `templates/`: the repository's root.
        let repository = root().display().to_string();
        spin_templates(&work, &["templates", "install", "--dir", &repository])
            .unwrap_or_else(|e| panic!("spin templates install failed:\n{e}"));
        let listed = spin_templates(&work, &["templates", "list"]).expect("spin templates list");
        for id in ["leasegate-http", "leasegate-timer"] {
            assert!(listed.contains(id), "{id} not installed:\n{listed}");
        }
    });
}

/// A project made from one of the repository's `spin new` templates with the real Spin CLI and
/// built as a user builds it, once per test process. Returns its `spin.toml`.
///
/// The templates are installed into a scratch Spin data directory ([`install_templates`]; the
/// user's own Spin templates are not touched) and `spin new -t <id> --accept-defaults --value
/// leasegate-source=<this repository>` writes the project, whose `leasegate` /
/// `leasegate-spin` dependencies are then this repository's crates. `spin build` builds it with
/// `CARGO_TARGET_DIR` pointing elsewhere (as in a shell that shares one target directory): its
/// build command still puts the component where its manifest's `source` names it.
///
/// Two things are added to the generated files, neither a change to them: the workspace's
/// `Cargo.lock` (the same dependency versions as the tests, and no registry lookup), and the
/// project's `target/` of an earlier run, or else a copy of another project's (compiled
/// dependencies only: cargo rebuilds what changed).
pub fn template_project(template: Template) -> PathBuf {
    static MADE: [OnceLock<PathBuf>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    // One build at a time: they share the machine's cores and each other's compiled crates.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let slot = match template {
        Template::Http => 0,
        Template::Leader => 1,
        Template::Occurrence => 2,
    };
    MADE[slot]
        .get_or_init(|| {
            let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
            install_templates();
            let work = template_work();
            let project = work.join(template.project());
            let kept = work.join(format!("{}.target", template.project()));
            if project.join("target").exists() {
                let _ = std::fs::remove_dir_all(&kept);
                std::fs::rename(project.join("target"), &kept).expect("keep the target dir");
            }
            let _ = std::fs::remove_dir_all(&project);
            let source = format!("leasegate-source={}", root().display());
            let mut args = vec![
                "new",
                "-t",
                template.id(),
                template.project(),
                "--accept-defaults",
                "--no-vcs",
                "--value",
                &source,
            ];
            for value in template.values() {
                args.extend(["--value", value]);
            }
            spin_templates(&work, &args)
                .unwrap_or_else(|e| panic!("spin new {args:?} failed:\n{e}"));
            if kept.exists() {
                std::fs::rename(&kept, project.join("target")).expect("restore the target dir");
            } else if let Some(sibling) = [Template::Http, Template::Leader, Template::Occurrence]
                .iter()
                .map(|t| work.join(t.project()).join("target"))
                .find(|t| t.join("wasm32-wasip2").exists())
            {
                let status = Command::new("cp")
                    .arg("-a")
                    .arg(&sibling)
                    .arg(project.join("target"))
                    .status()
                    .expect("run cp");
                assert!(status.success(), "copying {} failed", sibling.display());
            }
            std::fs::copy(root().join("Cargo.lock"), project.join("Cargo.lock"))
                .expect("copy the lock file");
            // A target directory shared by the shell: the build command must not follow it.
            let elsewhere = work.join("shared-target");
            let out = Command::new("spin")
                .args(["build", "--from"])
                .arg(project.join("spin.toml"))
                .current_dir(&project)
                .env("CARGO_TARGET_DIR", &elsewhere)
                .env_remove("CARGO_BUILD_TARGET_DIR")
                .output()
                .expect("run spin build");
            assert!(
                out.status.success(),
                "spin build of the generated {} failed:\n{}{}",
                template.project(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let component = project.join(format!(
                "target/wasm32-wasip2/release/{}.wasm",
                template.project().replace('-', "_")
            ));
            assert!(component.exists(), "no {}", component.display());
            assert!(
                !elsewhere.exists(),
                "the build followed CARGO_TARGET_DIR into {}",
                elsewhere.display()
            );
            project.join("spin.toml")
        })
        .clone()
}

/// A `.wasm` component's path.
pub fn wasm(name: &str) -> PathBuf {
    root().join(format!("target/wasm32-wasip2/release/{name}.wasm"))
}

/// The bearer token the test app's gate expects.
pub const GATE_TOKEN: &str = "test-gate-token-7f3a";
/// The bearer token the test app's telemetry endpoint expects.
pub const TELEMETRY_TOKEN: &str = "test-telemetry-token-91c2";
/// The bearer token the example ship-once expects.
pub const SHIP_TOKEN: &str = "test-ship-token-2a6f";
/// The bearer token the example daily-digest expects.
pub const DIGEST_TOKEN: &str = "test-digest-token-8c5d";

/// The example ledger's bearer token in tests (`ledger_token`).
pub const LEDGER_TOKEN: &str = "test-ledger-token-4e7a";
/// The test app's `lease_id_secret`.
pub const LEASE_ID_SECRET: &str = "test-lease-id-secret-5d0e";
/// The bearer token of the test app's timer routes (`/api/jobs/...`).
pub const TIMER_TOKEN: &str = "test-timer-token-3b8d";
/// `Authorization: Bearer <TIMER_TOKEN>`.
pub const TIMER_AUTH: (&str, &str) = ("authorization", "Bearer test-timer-token-3b8d");
/// The admin token of the timer routes' destructive forms (`PUT /api/ttl/...`,
/// `DELETE /api/init/...`, `DELETE /api/leader`, ticks for past occurrences).
pub const ADMIN_TOKEN: &str = "test-admin-token-c41e";
/// `Authorization: Bearer <ADMIN_TOKEN>`.
pub const ADMIN_AUTH: (&str, &str) = ("authorization", "Bearer test-admin-token-c41e");

/// Which manifest a test app is served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Manifest {
    /// `spin.toml`: the HTTP app.
    #[default]
    Http,
    /// `spin-cron.toml`: the timer functions on Spin's cron trigger (the real plugin), with
    /// the schedules of [`Setup::cron`] when it names any.
    Cron,
    /// The Azure Functions deployment's manifest: `spin.toml` plus
    /// `deploy/azure-functions/timer-routes.toml`, as `assemble.py` makes it.
    Azure,
    /// `examples/ship-once/spin.toml`: the example of a user's own function. It gets only
    /// the variables its manifest declares, `shipping_origin` pointing at the webhook proxy
    /// and `ship_token` = [`SHIP_TOKEN`].
    ShipOnce,
    /// `examples/daily-digest/spin.toml`: the example of a verb per occurrence of a schedule.
    /// It gets only the variables its manifest declares (`instance_id` = `test-instance`),
    /// `digest_origin` pointing at the webhook proxy and `digest_token` = [`DIGEST_TOKEN`].
    DailyDigest,
    /// `examples/ledger/spin.toml`: the example of fenced writes. It gets only the variables its
    /// manifest declares, `table_origin` pointing at the shared Azurite table emulator and
    /// `ledger_token` = [`LEDGER_TOKEN`].
    Ledger,
    /// A project made from a `spin new` template: [`template_project`], its `spin.toml`. It
    /// gets only the variables its manifest declares: `work_origin` pointing at the webhook
    /// proxy, `api_token` = [`TEMPLATE_TOKEN`], the timer's `timer_token` = [`TIMER_TOKEN`] and
    /// `lease_id_secret` = [`LEASE_ID_SECRET`].
    Template(Template),
    /// The `spin-cron.toml` of a project made from the `leasegate-timer` template: its
    /// component on Spin's cron trigger (the real plugin), on the manifest's own schedule.
    TemplateCron(Template),
}

impl Manifest {
    /// The manifest file.
    pub fn path(self) -> PathBuf {
        match self {
            Manifest::Http => root().join("spin.toml"),
            Manifest::Cron => root().join("spin-cron.toml"),
            Manifest::ShipOnce => root().join("examples/ship-once/spin.toml"),
            Manifest::DailyDigest => root().join("examples/daily-digest/spin.toml"),
            Manifest::Ledger => root().join("examples/ledger/spin.toml"),
            Manifest::Template(t) => template_project(t),
            Manifest::TemplateCron(t) => template_project(t).with_file_name("spin-cron.toml"),
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

/// `spin-cron.toml` with only the triggers of `schedules` (component, six-field expression with
/// seconds), written into `dir`: the shipped schedules run every minute or five, too slow for a
/// test, and a manifest cannot template them.
pub fn cron_manifest(dir: &Path, schedules: &[(&str, &str)]) -> PathBuf {
    let text = std::fs::read_to_string(root().join("spin-cron.toml")).expect("read spin-cron.toml");
    let mut doc: toml::Table = text.parse().expect("spin-cron.toml parses");
    let triggers: Vec<toml::Value> = schedules
        .iter()
        .map(|(component, expr)| {
            let mut t = toml::Table::new();
            t.insert("component".into(), (*component).into());
            t.insert("cron_expression".into(), (*expr).into());
            toml::Value::Table(t)
        })
        .collect();
    let trigger = doc
        .get_mut("trigger")
        .and_then(|t| t.as_table_mut())
        .expect("spin-cron.toml has triggers");
    trigger.insert("cron".into(), toml::Value::Array(triggers));
    // Component sources are relative to the manifest: make them absolute.
    if let Some(components) = doc.get_mut("component").and_then(|c| c.as_table_mut()) {
        for (_, c) in components.iter_mut() {
            if let Some(source) = c.get_mut("source") {
                if let Some(s) = source.as_str() {
                    *source = root().join(s).display().to_string().into();
                }
            }
        }
    }
    let path = dir.join("spin-cron.toml");
    std::fs::write(&path, toml::to_string(&doc).expect("manifest")).expect("write the manifest");
    path
}

/// How to start a test app beyond its variables.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// The manifest.
    pub manifest: Manifest,
    /// The clock of `spin up` (and so of the components) is this far ahead of real time
    /// (negative: behind), through `faketime`.
    pub clock_offset_ms: i64,
    /// Storage runs on the app's clock too: the app's storage proxy leads to the Azurite whose
    /// clock is [`Setup::clock_offset_ms`] off real time ([`Azurite::at_clock_offset`], started
    /// on first use and shared by every app with the same offset in this test process, so
    /// several deployments sharing a [`Setup::container`] meet on it), and [`App::azurite`] /
    /// [`App::inspect_account`] read it back there. With an offset of 0 it is the shared
    /// Azurite. Not with [`Setup::entra`] (which has its own Azurite).
    pub azurite_same_clock: bool,
    /// Share this container (several deployments of one app) instead of a fresh one.
    pub container: Option<ContainerName>,
    /// For [`Manifest::Cron`]: run only these triggers, on these schedules (component,
    /// six-field cron expression); empty: the manifest's own.
    pub cron: Vec<(&'static str, &'static str)>,
    /// A runtime config file's text for `spin up --runtime-config-file`.
    pub runtime_config: Option<String>,
    /// Reach storage over HTTPS: the storage proxy's listener speaks TLS
    /// ([`Proxy::start_tls`]), `storage_origin` is `https://localhost:{port}`, and the runtime
    /// config (merged into [`Setup::runtime_config`]) gains a `[[client_tls]]` entry trusting the
    /// test CA for `localhost` from every storage component the manifest has
    /// ([`STORAGE_COMPONENTS`]).
    pub storage_tls: bool,
    /// Storage is this Azurite (e.g. one the test restarts: [`Azurite::start_restartable`])
    /// instead of the shared one. Not with [`Setup::azurite_same_clock`] or [`Setup::entra`].
    pub azurite: Option<&'static Azurite>,
    /// Environment variables for `spin up` (its runtime's knobs, e.g.
    /// `SPIN_WASMTIME_POOLING=0`).
    pub spin_env: Vec<(String, String)>,
    /// Give Spin every application variable from memory: the runtime config (merged into
    /// [`Setup::runtime_config`]) gains a `static` variables provider holding the app's
    /// variables and the manifest's defaults ([`crate::spin::variables_in_memory`]), so no read
    /// reaches Spin's environment provider. The bench serves the app this way.
    pub variables_in_memory: bool,
    /// `spin up --quiet` ([`SpinConfig::quiet`]): the components' output goes to their log
    /// files only. Tests that read the components' output from Spin's leave it off.
    pub spin_quiet: bool,
    /// Sign in to storage with Microsoft Entra ID: storage is the Azurite that checks bearer
    /// tokens (`--oauth basic`, HTTPS: [`Azurite::shared_oauth`]) behind a TLS proxy (as
    /// [`Setup::storage_tls`]), tokens come from the app's own [`TokenServer`] (`token_origin`)
    /// and the storage key variable is emptied.
    pub entra: Option<Entra>,
    /// Variables of the test defaults to leave unset, so that the manifest's default applies
    /// (e.g. `ttl_find`, which the harness sets to `list` for the TTL tests written before
    /// index tags); the overrides still apply.
    pub unset: Vec<&'static str>,
}

/// How a test app gets its Entra ID tokens ([`Setup::entra`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entra {
    /// `storage_auth = managed_identity`: the token server's identity endpoint and header.
    ManagedIdentity,
    /// `storage_auth = client_secret`: the token server as the authority.
    ClientSecret,
}

/// The components that reach storage (those of them a manifest has get its `[[client_tls]]`
/// entry under [`Setup::storage_tls`]): the six functions and the example's.
pub const STORAGE_COMPONENTS: [&str; 7] = [
    "device-alerts",
    "gate",
    "scheduled-job",
    "leader",
    "init-once",
    "ttl-sweeper",
    "ship-once",
];

/// The ids of the components `manifest` declares (`[component.<id>]`).
pub fn manifest_components(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).expect("read the manifest");
    let doc: toml::Table = text.parse().expect("the manifest parses");
    doc.get("component")
        .and_then(|c| c.as_table())
        .map(|c| c.keys().cloned().collect())
        .unwrap_or_default()
}

/// The application variables `manifest` declares (`[variables]`).
pub fn manifest_variables(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).expect("read the manifest");
    let doc: toml::Table = text.parse().expect("the manifest parses");
    doc.get("variables")
        .and_then(|c| c.as_table())
        .map(|c| c.keys().cloned().collect())
        .unwrap_or_default()
}

/// The app under the real `spin up`, with a recording, fault-injecting proxy in front of
/// storage and another in front of the webhook sink.
pub struct App {
    /// The `spin up` serving the components.
    pub spin: Spin,
    /// Where notifications, job runs, heartbeats and initializations go.
    pub sink: Sink,
    /// This app's own container (so tests do not see each other's gates).
    pub container: ContainerName,
    /// The proxy between the app and Azurite: storage requests are counted and faulted here.
    pub storage: Proxy,
    /// The proxy between the app and the sink (`notify_origin`, `job_origin`, ...).
    pub webhook: Proxy,
    /// The app's variables.
    pub variables: HashMap<String, String>,
    /// The token server of an app under [`Setup::entra`].
    pub tokens: Option<TokenServer>,
    /// The Azurite behind [`App::storage`]: [`Azurite::shared`], [`Azurite::shared_oauth`]
    /// under [`Setup::entra`], [`Azurite::at_clock_offset`] under
    /// [`Setup::azurite_same_clock`], or [`Setup::azurite`].
    azurite: &'static Azurite,
    /// Under [`Setup::entra`]: a plain-HTTP proxy to the same Azurite (HTTPS behind it), for
    /// the test's own SharedKey reads of blob state ([`App::inspect_account`]).
    pub inspect: Option<Proxy>,
    /// Under [`Manifest::Ledger`]: the proxy between Spin and the shared Azurite table
    /// emulator (`table_origin`), for faults on table requests.
    pub tables: Option<Proxy>,
    /// Folders of generated files (a manifest, the test CA's PEM), removed with the app.
    scratch: Vec<PathBuf>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.spin.stop();
        for dir in &self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl App {
    /// Starts the app with the test defaults, then `overrides` (application variables).
    pub fn start(tag: &str, overrides: &[(&str, &str)]) -> App {
        App::start_with(tag, overrides, Setup::default())
    }

    /// Starts the app from `setup`'s manifest, clock and container.
    pub fn start_with(tag: &str, overrides: &[(&str, &str)], setup: Setup) -> App {
        match setup.manifest {
            Manifest::ShipOnce | Manifest::DailyDigest | Manifest::Ledger => build_example(),
            Manifest::Template(t) | Manifest::TemplateCron(t) => {
                template_project(t);
            }
            _ => build_components(),
        }
        let storage_tls = setup.storage_tls || setup.entra.is_some();
        assert!(
            !(setup.azurite_same_clock && setup.entra.is_some()),
            "Setup::azurite_same_clock does not go with Setup::entra (its Azurite checks tokens)"
        );
        assert!(
            setup.azurite.is_none() || !(setup.azurite_same_clock || setup.entra.is_some()),
            "Setup::azurite does not go with Setup::azurite_same_clock or Setup::entra"
        );
        let azurite = if let Some(azurite) = setup.azurite {
            azurite
        } else if setup.entra.is_some() {
            Azurite::shared_oauth()
        } else if setup.azurite_same_clock {
            Azurite::at_clock_offset(setup.clock_offset_ms)
        } else {
            Azurite::shared()
        };
        let (storage, inspect) = if setup.entra.is_some() {
            let azurite = azurite.authority();
            (
                Proxy::start_tls_to_tls(&azurite),
                Some(Proxy::start_to_tls(&azurite)),
            )
        } else if storage_tls {
            (Proxy::start_tls(&azurite.authority()), None)
        } else {
            (Proxy::start(&azurite.authority()), None)
        };
        let tokens = setup.entra.map(|_| TokenServer::start());
        let sink = Sink::start();
        let webhook = Proxy::start(&sink.authority());
        let container = setup.container.unwrap_or_else(|| unique_container(tag));
        let mut variables: HashMap<String, String> = HashMap::from([
            ("storage_origin".into(), storage.origin()),
            ("container".into(), container.as_str().to_string()),
            ("notify_origin".into(), webhook.origin()),
            ("gate_token".into(), GATE_TOKEN.into()),
            ("telemetry_token".into(), TELEMETRY_TOKEN.into()),
            ("lease_id_secret".into(), LEASE_ID_SECRET.into()),
            ("timer_token".into(), TIMER_TOKEN.into()),
            ("admin_token".into(), ADMIN_TOKEN.into()),
            ("instance_id".into(), "test-instance".into()),
            ("job_origin".into(), webhook.origin()),
            ("leader_origin".into(), webhook.origin()),
            ("init_origin".into(), webhook.origin()),
            ("storage_timeout_ms".into(), "3000".into()),
            // The TTL tests written before index tags mark blobs with metadata only, as an
            // older version did: they sweep by listing. The tag tests (ttl_sweeper/tags_wasm.rs) set
            // `tags`, the default of the manifests.
            ("ttl_find".into(), "list".into()),
        ]);
        if setup.manifest == Manifest::ShipOnce {
            let declared = manifest_variables(&setup.manifest.path());
            variables.retain(|k, _| declared.contains(k));
            variables.insert("shipping_origin".into(), webhook.origin());
            variables.insert("ship_token".into(), SHIP_TOKEN.into());
        }
        if setup.manifest == Manifest::DailyDigest {
            let declared = manifest_variables(&setup.manifest.path());
            variables.retain(|k, _| declared.contains(k));
            variables.insert("digest_origin".into(), webhook.origin());
            variables.insert("digest_token".into(), DIGEST_TOKEN.into());
        }
        let mut tables = None;
        if setup.manifest == Manifest::Ledger {
            let declared = manifest_variables(&setup.manifest.path());
            variables.retain(|k, _| declared.contains(k));
            let proxy = Proxy::start(&Azurite::shared_table().authority());
            variables.insert("table_origin".into(), proxy.origin());
            tables = Some(proxy);
            variables.insert("ledger_token".into(), LEDGER_TOKEN.into());
        }
        if let Manifest::Template(_) | Manifest::TemplateCron(_) = setup.manifest {
            // The timer template's tick token and lease id secret are the test app's
            // (TIMER_TOKEN, LEASE_ID_SECRET).
            variables.insert("work_origin".into(), webhook.origin());
            variables.insert("api_token".into(), TEMPLATE_TOKEN.into());
            let declared = manifest_variables(&setup.manifest.path());
            variables.retain(|k, _| declared.contains(k));
        }
        if let (Some(entra), Some(tokens)) = (setup.entra, &tokens) {
            let origin = tokens.origin();
            let mut entra_vars = vec![("storage_key", String::new()), ("token_origin", origin)];
            match entra {
                Entra::ManagedIdentity => entra_vars.extend([
                    ("storage_auth", "managed_identity".to_string()),
                    ("identity_endpoint", tokens.identity_endpoint()),
                    ("identity_header", crate::entra::IDENTITY_HEADER.to_string()),
                ]),
                Entra::ClientSecret => entra_vars.extend([
                    ("storage_auth", "client_secret".to_string()),
                    ("entra_tenant_id", crate::entra::TENANT_ID.to_string()),
                    ("entra_client_id", crate::entra::CLIENT_ID.to_string()),
                    (
                        "entra_client_secret",
                        crate::entra::CLIENT_SECRET.to_string(),
                    ),
                ]),
            }
            for (k, v) in entra_vars {
                variables.insert(k.into(), v);
            }
        }
        for k in &setup.unset {
            variables.remove(*k);
        }
        for (k, v) in overrides {
            variables.insert(k.to_string(), v.to_string());
        }
        let http = !matches!(setup.manifest, Manifest::Cron | Manifest::TemplateCron(_));
        let manifest = if setup.manifest == Manifest::Cron && !setup.cron.is_empty() {
            // Written beside the instance's state and logs, and removed with them.
            let dir = crate::spin::scratch_dir("manifest");
            let path = cron_manifest(&dir, &setup.cron);
            (path, Some(dir))
        } else {
            (setup.manifest.path(), None)
        };
        let mut scratch: Vec<PathBuf> = manifest.1.into_iter().collect();
        let runtime_config = if storage_tls {
            let dir = crate::spin::scratch_dir("tls");
            let ca_file = crate::tls::TestCa::shared().write_ca_pem(&dir);
            scratch.push(dir);
            let all = manifest_components(&manifest.0);
            let mut components: Vec<String> = all
                .iter()
                .filter(|c| STORAGE_COMPONENTS.contains(&c.as_str()))
                .cloned()
                .collect();
            if components.is_empty() {
                // A user's own app (the example, a project from the template).
                components = all;
            }
            Some(crate::tls::client_tls_runtime_config(
                setup.runtime_config.as_deref(),
                &components,
                &ca_file,
            ))
        } else {
            setup.runtime_config
        };
        let mut sorted: Vec<(String, String)> = variables.clone().into_iter().collect();
        sorted.sort();
        let runtime_config = if setup.variables_in_memory {
            Some(crate::spin::variables_in_memory(
                runtime_config.as_deref(),
                &manifest.0,
                &sorted,
            ))
        } else {
            runtime_config
        };
        let spin = Spin::start(&SpinConfig {
            manifest: manifest.0,
            variables: sorted,
            variable_files: Vec::new(),
            http,
            clock_offset_ms: setup.clock_offset_ms,
            runtime_config,
            env: setup.spin_env,
            quiet: setup.spin_quiet,
        });
        App {
            spin,
            sink,
            container,
            storage,
            webhook,
            variables,
            tokens,
            azurite,
            inspect,
            tables,
            scratch,
        }
    }

    /// The Azurite behind this app's storage proxy (see [`Setup::azurite_same_clock`]).
    pub fn azurite(&self) -> &'static Azurite {
        self.azurite
    }

    /// The token server of an app under [`Setup::entra`].
    pub fn tokens(&self) -> &TokenServer {
        self.tokens
            .as_ref()
            .expect("the app signs in with Entra ID (Setup::entra)")
    }

    /// The account the test reads blob state with: the development account (SharedKey) on the
    /// app's Azurite, through [`App::inspect`] for an app under [`Setup::entra`].
    pub fn inspect_account(&self) -> leasegate::Account {
        match &self.inspect {
            Some(proxy) => leasegate::Account::development(&format!(
                "{}/{}",
                proxy.origin(),
                leasegate::account::DEV_ACCOUNT_NAME
            ))
            .expect("the proxy's endpoint"),
            None => self.azurite.account(),
        }
    }

    /// `http://127.0.0.1:{port}{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.spin.url())
    }

    /// Runs `f` (one decision at a time) and returns what it gave and the storage requests
    /// made meanwhile.
    pub fn counted<T>(&self, f: impl FnOnce() -> T) -> (T, Vec<Seen>) {
        self.storage.during(f)
    }

    /// The storage requests made while `f` ran.
    pub fn storage_requests<T>(&self, f: impl FnOnce() -> T) -> (T, usize) {
        let (out, seen) = self.storage.during(f);
        (out, seen.len())
    }

    /// Lines the components logged (and Spin's own output).
    pub fn log_lines(&self) -> Vec<String> {
        self.spin.log_lines()
    }

    /// The components' JSON log lines.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.spin.json_lines()
    }

    /// Starts an app that signs in to storage with Entra ID ([`Setup::entra`]), with the test
    /// defaults, then `overrides`.
    pub fn start_entra(tag: &str, entra: Entra, overrides: &[(&str, &str)]) -> App {
        App::start_with(
            tag,
            overrides,
            Setup {
                entra: Some(entra),
                ..Setup::default()
            },
        )
    }

    /// Panics if a secret shows in `answers` or in the app's log: the identity header, the
    /// client secret, a token (every JWT starts `eyJ`), the app's own tokens and keys.
    pub fn assert_no_secret(&self, answers: &[&Answer]) {
        let mut texts: Vec<String> = answers.iter().map(|a| a.text.clone()).collect();
        texts.extend(self.log_lines());
        for text in &texts {
            for secret in [
                crate::entra::IDENTITY_HEADER,
                crate::entra::CLIENT_SECRET,
                "eyJ",
                GATE_TOKEN,
                TELEMETRY_TOKEN,
                TIMER_TOKEN,
                ADMIN_TOKEN,
                SHIP_TOKEN,
                TEMPLATE_TOKEN,
                LEASE_ID_SECRET,
                leasegate::account::DEV_ACCOUNT_KEY,
            ] {
                assert!(!text.contains(secret), "a secret shows: {text}");
            }
        }
    }

    /// Panics if a component trapped or panicked (Spin's stderr and the log files say so).
    pub fn assert_no_trap(&self) {
        let traps: Vec<String> = self
            .log_lines()
            .into_iter()
            .filter(|l| {
                l.contains("panicked")
                    || l.contains("wasm trap")
                    || l.contains("error while executing")
            })
            .collect();
        assert!(traps.is_empty(), "a component trapped: {traps:#?}");
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
/// `ReturnValue.error`) holding none of `secrets`; afterwards no component trapped and no log
/// line holds a secret.
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
    app.assert_no_trap();
    for line in app.log_lines() {
        for s in secrets {
            assert!(!line.contains(s), "a log line holds a secret: {line}");
        }
    }
}
