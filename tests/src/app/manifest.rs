//! The manifest a test app is served from, and what the harness reads from (or writes into) a
//! manifest: a cron manifest with the test's schedules, its components, its variables.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::{root, template_project, Template};

/// Which manifest a test app is served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Manifest {
    /// `spin.toml`: the HTTP app.
    #[default]
    Http,
    /// `spin-cron.toml`: the timer functions on Spin's cron trigger (the real plugin), with
    /// the schedules of [`Setup::cron`] when it names any.
    ///
    /// [`Setup::cron`]: super::Setup::cron
    Cron,
    /// The Azure Functions deployment's manifest: `spin.toml` plus
    /// `deploy/azure-functions/timer-routes.toml`, as `assemble.py` makes it.
    Azure,
    /// `examples/ship-once/spin.toml`: the example of a user's own function. It gets only
    /// the variables its manifest declares, `shipping_origin` pointing at the webhook proxy
    /// and `ship_token` = [`SHIP_TOKEN`].
    ///
    /// [`SHIP_TOKEN`]: super::SHIP_TOKEN
    ShipOnce,
    /// `examples/daily-digest/spin.toml`: the example of a verb per occurrence of a schedule.
    /// It gets only the variables its manifest declares (`instance_id` = `test-instance`),
    /// `digest_origin` pointing at the webhook proxy and `digest_token` = [`DIGEST_TOKEN`].
    ///
    /// [`DIGEST_TOKEN`]: super::DIGEST_TOKEN
    DailyDigest,
    /// `examples/ledger/spin.toml`: the example of fenced writes. It gets only the variables its
    /// manifest declares, `table_origin` pointing at the shared Azurite table emulator and
    /// `ledger_token` = [`LEDGER_TOKEN`].
    ///
    /// [`LEDGER_TOKEN`]: super::LEDGER_TOKEN
    Ledger,
    /// A project made from a `spin new` template: [`template_project`], its `spin.toml`. It
    /// gets only the variables its manifest declares: `work_origin` pointing at the webhook
    /// proxy, `api_token` = [`TEMPLATE_TOKEN`], the timer's `timer_token` = [`TIMER_TOKEN`] and
    /// `lease_id_secret` = [`LEASE_ID_SECRET`].
    ///
    /// [`TEMPLATE_TOKEN`]: super::TEMPLATE_TOKEN
    /// [`TIMER_TOKEN`]: super::TIMER_TOKEN
    /// [`LEASE_ID_SECRET`]: super::LEASE_ID_SECRET
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

/// The components that reach storage (those of them a manifest has get its `[[client_tls]]`
/// entry under [`Setup::storage_tls`]): the six functions and the example's.
///
/// [`Setup::storage_tls`]: super::Setup::storage_tls
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

/// The manifest `spin up` serves for `manifest`, and the folder it was written into (removed
/// with the app) when it is a cron manifest with the test's own `schedules` ([`cron_manifest`]).
pub(super) fn served_manifest(
    manifest: Manifest,
    schedules: &[(&str, &str)],
) -> (PathBuf, Option<PathBuf>) {
    if manifest == Manifest::Cron && !schedules.is_empty() {
        // Written beside the instance's state and logs, and removed with them.
        let dir = crate::spin::scratch_dir("manifest");
        let path = cron_manifest(&dir, schedules);
        (path, Some(dir))
    } else {
        (manifest.path(), None)
    }
}
