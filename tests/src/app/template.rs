//! Projects made from the repository's `spin new` templates with the real Spin CLI, and built
//! as a user builds them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::root;

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
