//! The `leasegate` CLI reaches the locks the functions take, by the names users see: a gate
//! taken through the gate API under the real Spin is shown and broken by the CLI, and the
//! command a `lock_unusable` answer advises works.

use std::process::{Command, Output};
use std::time::SystemTime;

use leasegate::lease::Locks;
use leasegate::ops::{Condition, Metadata, SetMetadata};
use leasegate::LockName;
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{call, cli_binary as cli, App, TIMER_AUTH};
use leasegate_tests::Azurite;

const AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

fn run(args: &[&str]) -> (bool, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(cli())
        .args(args)
        .env(
            "LEASEGATE_CONNECTION_STRING",
            Azurite::shared().connection_string(),
        )
        .output()
        .expect("run the CLI");
    (
        status.success(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// The words of a command quoted the way `web::shell_word` quotes (plain or in '...').
fn shell_words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in command.chars() {
        match c {
            '\'' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

#[test]
fn a_gate_taken_under_spin_is_shown_and_broken_by_the_cli() {
    cli(); // built before the gate is taken, so its window cannot run out meanwhile
    let app = App::start("clilocks", &[]);
    let c = app.container.as_str();
    let a = call(
        "POST",
        &app.url("/api/gate/tenant-a/lock?window=600&holder=worker-1"),
        &[AUTH],
        b"",
    );
    assert_eq!(a.status, 200, "{}", a.text);
    let lock = format!("gates/{}", a.json["key"].as_str().unwrap());
    let (ok, out, err) = run(&["show", &lock, "--container", c]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("held by worker-1"), "{out}");
    assert!(
        out.contains(&format!("fencing token {}", a.json["fencingToken"])),
        "{out}"
    );
    let (ok, out, err) = run(&["break", &lock, "--container", c]);
    assert!(ok, "{out}{err}");
    let state = call("GET", &app.url("/api/gate/tenant-a/lock"), &[AUTH], b"");
    assert_eq!(state.json["state"], "available", "{}", state.text);
    // The leader's lock, by the name its answers use.
    let t = call("POST", &app.url("/api/leader/tick"), &[TIMER_AUTH], b"");
    assert_eq!(t.json["role"], "leader", "{}", t.text);
    let (ok, out, err) = run(&[
        "show",
        &format!("leader/{}", t.json["group"].as_str().unwrap()),
        "--container",
        c,
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("held by test-instance"), "{out}");
}

#[test]
fn the_lock_unusable_advice_works() {
    cli();
    let app = App::start("cliadvice", &[]);
    let gate = |method: &str| call(method, &app.url("/api/gate/bad%20key"), &[AUTH], b"");
    assert_eq!(gate("POST").status, 200);
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        app.container.clone(),
    )
    .with_prefix("gates/");
    let lock = LockName::try_new("bad key").unwrap();
    let mut m = Metadata::new();
    m.insert("leasegate_since".into(), "yesterday".into());
    block_on(locks.break_lock(&lock, 0, SystemTime::now())).unwrap();
    block_on(locks.client().execute(
        &SetMetadata {
            container: app.container.clone(),
            blob: locks.blob_name(&lock).unwrap(),
            metadata: m,
            lease_id: None,
            condition: Condition::None,
        },
        SystemTime::now(),
    ))
    .unwrap();
    let a = gate("POST");
    assert_eq!(a.json["error"], "lock_unusable", "{}", a.text);
    let message = a.json["message"].as_str().unwrap();
    let command = message
        .split('`')
        .nth(1)
        .unwrap_or_else(|| panic!("no command in {message}"));
    let words = shell_words(command);
    assert_eq!(words[0], "leasegate", "{command}");
    let args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
    let (ok, out, err) = run(&args);
    assert!(ok, "{command}: {out}{err}");
    // The gate works again, and its token did not go back.
    let again = gate("POST");
    assert_eq!(again.status, 200, "{}", again.text);
    let (ok, out, _) = run(&[
        "show",
        "gates/bad key",
        "--container",
        app.container.as_str(),
    ]);
    assert!(ok && out.contains("held"), "{out}");
}
