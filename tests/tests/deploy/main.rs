//! The deployment files stay true to the app and start where they are meant to run:
//!
//! * the cron manifest defines its components and variables exactly as spin.toml does, and
//!   every instruction that installs its plugin pins the verified version;
//! * every Azure Functions `function.json` reaches a route of the manifest the Functions host
//!   runs (checked by `assemble.py`, which must also catch a broken one), `assemble.py` refuses
//!   a Spin binary the host cannot run, and the assembled folder, zipped as Core Tools zips it,
//!   starts under its launcher with the real Spin;
//! * the SpinKube manifests parse, name only what the shim runs, give each pod its own identity
//!   and tick the timers in time; the shipped ticker, against two `spin up` instances, ticks
//!   both, one leads, and each job occurrence runs once;
//! * the dead-blob lifecycle policy is a management policy of the shape Azure takes, and the
//!   docs give the command that applies it;
//! * the README stays short (under 12 KB) and opens with the two commands.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use leasegate_tests::app::root;
use leasegate_tests::process::{Group, Ticker};

mod azure;
mod docs_and_policies;
mod spin;
mod spinkube;

fn manifest(name: &str) -> toml::Table {
    let text = std::fs::read_to_string(root().join(name)).expect("read the manifest");
    toml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Runs a Python program with arguments; panics with its output when it fails.
fn python(program: &str, args: &[&Path]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(program)
        .args(args)
        .output()
        .expect("run python3");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python failed: {text}");
    text
}
