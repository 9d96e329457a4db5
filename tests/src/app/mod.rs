//! The Spin app under test: its release `.wasm` components (built once per test process),
//! served by the real `spin up` from the project's own `spin.toml` (or the cron manifest under
//! the real cron plugin), against the shared Azurite through a fault-injecting proxy, with a
//! webhook sink for notifications.
//!
//! An app whose clock is shifted ([`Setup::clock_offset_ms`]) can have storage on the same
//! shifted clock ([`Setup::azurite_same_clock`]): the server's `Date` then says the same time
//! as the components' own clock, as it would in a real deployment at that instant.
//!
//! Its parts, all re-exported here: what is built (`build.rs`), the manifests (`manifest.rs`)
//! and the templates' projects (`template.rs`), the test tokens (`tokens.rs`), an app's
//! variables (`variables.rs`) and storage (`storage.rs`), and the calls to it (`call.rs`).
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

mod build;
mod call;
mod manifest;
mod storage;
mod template;
mod tokens;
mod variables;

use std::collections::HashMap;
use std::path::PathBuf;

use leasegate::ContainerName;

use crate::entra::TokenServer;
use crate::proxy::{Proxy, Seen};
use crate::sink::Sink;
use crate::spin::{Spin, SpinConfig};
use crate::{unique_container, Azurite};

pub use build::{build_components, build_example, cli_binary, root, wasm};
pub use call::{bad, call, expect_clear_errors, post_telemetry, Answer, BadCase};
pub use manifest::{
    cron_manifest, manifest_components, manifest_variables, Manifest, STORAGE_COMPONENTS,
};
pub use template::{install_templates, spin_templates, template_project, Template, TEMPLATE_TOKEN};
pub use tokens::{
    ADMIN_AUTH, ADMIN_TOKEN, DIGEST_TOKEN, GATE_TOKEN, LEASE_ID_SECRET, LEDGER_TOKEN, SHIP_TOKEN,
    TELEMETRY_AUTH, TELEMETRY_TOKEN, TIMER_AUTH, TIMER_TOKEN,
};

use manifest::served_manifest;

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
        let azurite = storage::azurite_of(&setup);
        let (storage, inspect) = storage::proxies(&setup, azurite);
        let tokens = setup.entra.map(|_| TokenServer::start());
        let sink = Sink::start();
        let webhook = Proxy::start(&sink.authority());
        let container = setup.container.unwrap_or_else(|| unique_container(tag));
        let mut variables = variables::test_defaults(&storage, &container, &webhook);
        let tables = variables::manifests_own(setup.manifest, &mut variables, &webhook);
        if let (Some(entra), Some(tokens)) = (setup.entra, &tokens) {
            variables::entra(entra, tokens, &mut variables);
        }
        for k in &setup.unset {
            variables.remove(*k);
        }
        for (k, v) in overrides {
            variables.insert(k.to_string(), v.to_string());
        }
        let http = !matches!(setup.manifest, Manifest::Cron | Manifest::TemplateCron(_));
        let (manifest, written) = served_manifest(setup.manifest, &setup.cron);
        let mut scratch: Vec<PathBuf> = written.into_iter().collect();
        let runtime_config = if storage_tls {
            Some(storage::client_tls(
                setup.runtime_config.as_deref(),
                &manifest,
                &mut scratch,
            ))
        } else {
            setup.runtime_config
        };
        let mut sorted: Vec<(String, String)> = variables.clone().into_iter().collect();
        sorted.sort();
        let runtime_config = if setup.variables_in_memory {
            Some(crate::spin::variables_in_memory(
                runtime_config.as_deref(),
                &manifest,
                &sorted,
            ))
        } else {
            runtime_config
        };
        let spin = Spin::start(&SpinConfig {
            manifest,
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
                leasegate::DEV_ACCOUNT_NAME
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
                leasegate::DEV_ACCOUNT_KEY,
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
