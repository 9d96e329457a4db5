//! The examples `scripts/dev.sh run` prints work as printed: the text it prints is
//! `scripts/run-examples.txt` with its `{{placeholders}}` filled by dev.sh's `print_examples`
//! (the app's address, the tokens it made up, Azurite's endpoint, a SAS from dev.sh's `dev_sas`,
//! the swept container). This test runs those same functions for a test app started with the
//! variables `run` gives it, on the test's free ports (not 3000 and 10000, so a developer's
//! running app is never touched), runs each `curl` command in bash exactly as printed, and
//! expects each to answer 2xx.

use std::process::Command;

use leasegate_tests::app::{
    root, App, Setup, ADMIN_TOKEN, GATE_TOKEN, TELEMETRY_TOKEN, TIMER_TOKEN,
};
use leasegate_tests::blobs::create_container;
use leasegate_tests::{unique_container, Azurite};

/// The definition of the shell function `name` in `scripts/dev.sh` (from `name() {` to the
/// first line that is only `}`).
fn dev_sh_function(name: &str) -> String {
    let text = std::fs::read_to_string(root().join("scripts/dev.sh")).expect("read dev.sh");
    let start = text
        .find(&format!("\n{name}() {{\n"))
        .unwrap_or_else(|| panic!("dev.sh defines {name}"));
    let end = text[start..].find("\n}\n").expect("the function's end") + start;
    text[start..end + 3].to_string()
}

/// Runs `script` in bash, in the repository, with dev.sh's functions `print_examples` and
/// `dev_sas` defined; what it printed.
fn with_dev_sh(script: &str) -> String {
    let out = Command::new("bash")
        .current_dir(root())
        .arg("-c")
        .arg(format!(
            "set -euo pipefail\n{}{}{script}",
            dev_sh_function("print_examples"),
            dev_sh_function("dev_sas")
        ))
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The commands of the printed text: each line that starts with `curl` (after the indent), with
/// the lines it continues onto (a line ending in `\`).
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if !line.trim_start().starts_with("curl ") {
            continue;
        }
        let mut command = line.to_string();
        while command.ends_with('\\') {
            command.push('\n');
            command.push_str(lines.next().expect("a continued line"));
        }
        out.push(command);
    }
    out
}

/// Runs `command` in bash as printed, `curl` also writing the answer's status on a last line;
/// the status and what it printed.
fn run(command: &str) -> (u16, String) {
    let script =
        format!("curl() {{ command curl -w '\\n%{{http_code}}\\n' \"$@\"; }}\nset -e\n{command}\n");
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("run bash");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{command}\nfailed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = text
        .trim_end()
        .lines()
        .last()
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("{command}\nno status: {text}"));
    (status, text)
}

/// Every example `scripts/dev.sh run` prints answers 2xx as printed, in order, on a fresh app:
/// the telemetry posts, the gate's take, look and give-back (with the lease id the example
/// chose), the timer functions' ticks and reads, a blob written the way an application writes
/// it, then marked and unmarked through the API.
#[test]
fn the_examples_dev_sh_run_prints_work_as_printed() {
    let swept = unique_container("scratch");
    // As `run` does before it prints them.
    create_container(&swept);
    let app = App::start_with(
        "dev-examples",
        &[
            ("instance_id", "dev-local"),
            ("ttl_containers", swept.as_str()),
            ("ttl_lock_retention_seconds", "86400"),
        ],
        Setup {
            unset: vec!["ttl_find"],
            ..Setup::default()
        },
    );
    // What `run` prints, by dev.sh's own functions, with this app's address and Azurite.
    let sas = with_dev_sh("dev_sas");
    let args = [
        ("app", app.spin.url()),
        ("telemetry_token", TELEMETRY_TOKEN.to_string()),
        ("gate_token", GATE_TOKEN.to_string()),
        ("timer_token", TIMER_TOKEN.to_string()),
        ("admin_token", ADMIN_TOKEN.to_string()),
        ("storage", Azurite::shared().endpoint()),
        ("sas", sas.trim().to_string()),
        ("container", swept.as_str().to_string()),
        ("blob", "some/blob".to_string()),
    ]
    .map(|(k, v)| format!("'{k}={v}'"))
    .join(" ");
    let text = with_dev_sh(&format!("print_examples {args}"));
    assert!(!text.contains("{{"), "{text}");
    let commands = commands(&text);
    assert!(commands.len() >= 10, "{text}");
    let failed: Vec<String> = commands
        .iter()
        .filter_map(|command| {
            let (status, out) = run(command);
            (!(200..300).contains(&status)).then(|| format!("{command}\nanswered {status}: {out}"))
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    app.assert_no_trap();
}
