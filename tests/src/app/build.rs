//! What the tests run, built once per test process with cargo into the workspace's own
//! `target/`: the components, the examples, the CLI.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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

/// A `.wasm` component's path.
pub fn wasm(name: &str) -> PathBuf {
    root().join(format!("target/wasm32-wasip2/release/{name}.wasm"))
}
