//! The operator's tools at the command line. The `leasegate` CLI behaves as a CLI: `-h` and
//! `--help` on every command exit 0, `--version` too, a usage error exits 2 naming the
//! argument; and at the extremes (windows up to `u64::MAX` seconds, lock blobs whose metadata
//! holds huge or garbage numbers) it gives a clear error and a failing exit, never a panic. The
//! Python scripts of `scripts/` answer `--help` and write nothing doing so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::SystemTime;

use leasegate::lease::Locks;
use leasegate::ops::{Condition, Metadata, SetMetadata, WriteOutcome};
use leasegate::LockName;
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{cli_binary as cli, root};
use leasegate_tests::{unique_container, Azurite};

fn run(container: &str, args: &[&str]) -> (bool, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(cli())
        .args(args)
        .args(["--container", container])
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

#[test]
fn extreme_windows_are_clear_errors() {
    let c = unique_container("cliwin");
    let cases = [
        (
            "18446744073709551615",
            "a window is a whole number of seconds from 1 to",
        ),
        ("18446744073709551616", "--window takes whole seconds"),
        (
            "31536001",
            "a window is a whole number of seconds from 1 to",
        ),
        ("0", "a window is a whole number of seconds from 1 to"),
        ("-5", "--window takes whole seconds"),
    ];
    for (window, want) in cases {
        let (ok, _, err) = run(c.as_str(), &["acquire", "job", "--window", window]);
        assert!(!ok, "--window {window}");
        assert!(err.contains(want), "--window {window}: {err}");
        assert!(!err.contains("panicked"), "--window {window}: {err}");
    }
    // The longest window works.
    let (ok, out, err) = run(c.as_str(), &["acquire", "job", "--window", "31536000"]);
    assert!(ok, "{out}{err}");
    assert!(out.starts_with("acquired job"), "{out}");
}

#[test]
fn garbage_in_a_lock_blob_is_a_clear_error_at_the_cli() {
    let c = unique_container("cligarbage");
    let (ok, out, err) = run(c.as_str(), &["acquire", "job", "--window", "30"]);
    assert!(ok, "{out}{err}");
    // The CLI names locks by their path in the container: no prefix.
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        c.clone(),
    )
    .with_prefix("");
    let lock = LockName::try_new("job").unwrap();
    block_on(locks.break_lock(&lock, 0, SystemTime::now())).unwrap();
    let blob = locks.blob_name(&lock).unwrap();
    for (field, value) in [
        ("leasegate_token", "18446744073709551615"),
        ("leasegate_expires", "99999999999999999999999999"),
        ("leasegate_since", "yesterday"),
    ] {
        let mut metadata = Metadata::new();
        metadata.insert(field.into(), value.into());
        let (written, _) = block_on(locks.client().execute(
            &SetMetadata {
                container: c.clone(),
                blob: blob.clone(),
                metadata,
                lease_id: None,
                condition: Condition::None,
            },
            SystemTime::now(),
        ))
        .unwrap_or_else(|e| panic!("{field}: {e}"));
        assert!(matches!(written, WriteOutcome::Written(_)), "{written:?}");
        for args in [
            vec!["acquire", "job", "--window", "600"],
            vec!["acquire", "job", "--window", "18446744073709551615"],
            vec!["show", "job"],
        ] {
            let (ok, out, err) = run(c.as_str(), &args);
            if args.contains(&"18446744073709551615") {
                assert!(!ok && err.contains("a window is"), "{args:?}: {err}");
                continue;
            }
            assert!(!ok, "{field}={value} {args:?}: {out}");
            assert!(err.contains(field), "{field}={value} {args:?}: {err}");
            assert!(!err.contains("panicked"), "{field}={value} {args:?}: {err}");
        }
    }
}

/// Runs the CLI with `args` and no storage reachable: (exit code, stdout, stderr).
fn exit(args: &[&str]) -> (Option<i32>, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(cli())
        .args(args)
        .env(
            "LEASEGATE_CONNECTION_STRING",
            "DefaultEndpointsProtocol=http;AccountName=nobody;AccountKey=a2V5;\
             BlobEndpoint=http://127.0.0.1:9/nobody;",
        )
        .output()
        .expect("run the CLI");
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

const COMMANDS: [&str; 7] = [
    "acquire", "show", "release", "break", "delete", "demo", "status",
];

#[test]
fn help_on_every_command_exits_0_and_so_does_version() {
    for flag in ["--help", "-h"] {
        let (code, out, err) = exit(&[flag]);
        assert_eq!(code, Some(0), "leasegate {flag}: {out}{err}");
        assert!(out.contains("Usage: leasegate"), "{out}");
        for command in COMMANDS {
            assert!(out.contains(command), "{command} in {out}");
            let (code, out, err) = exit(&[command, flag]);
            assert_eq!(code, Some(0), "leasegate {command} {flag}: {out}{err}");
            assert!(
                out.contains(&format!("Usage: leasegate {command}")),
                "{command} {flag}: {out}"
            );
        }
    }
    // The long help tells how locks are named and where the account comes from.
    let (_, out, _) = exit(&["--help"]);
    for want in [
        "gates/KEY",
        "LEASEGATE_CONNECTION_STRING",
        "LEASEGATE_HOLDER_KEY",
    ] {
        assert!(out.contains(want), "{want} in {out}");
    }
    let (_, out, _) = exit(&["status", "--help"]);
    assert!(out.contains("LEASEGATE_TIMER_TOKEN"), "{out}");
    let (code, out, _) = exit(&["--version"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        out.trim(),
        format!("leasegate {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_usage_error_exits_2_naming_the_argument() {
    let cases: [(&[&str], &str); 9] = [
        (&[], "Usage: leasegate"),
        (&["frobnicate"], "frobnicate"),
        (&["acquire"], "<LOCK>"),
        (&["acquire", "job", "--windo", "30"], "--windo"),
        (
            &["acquire", "job", "--window", "soon"],
            "--window takes whole seconds",
        ),
        (
            &["acquire", "job", "--holder", "a", "--lease-id", "b"],
            "--lease-id",
        ),
        (&["release", "job"], "--lease-id"),
        (&["status", "job", "--page-size", "10"], "--page-size"),
        (&["show", "job", "--json"], "--json"),
    ];
    for (args, want) in cases {
        let (code, out, err) = exit(args);
        assert_eq!(code, Some(2), "{args:?}: {out}{err}");
        assert!(err.contains(want), "{args:?}: want {want:?} in {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
    // Not a usage error: storage cannot be reached (exit 1, after the arguments were read).
    let (code, _, err) = exit(&["show", "job"]);
    assert_eq!(code, Some(1), "{err}");
}

/// Every file below `dir` with its contents.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut all = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all.extend(files(&path));
        } else {
            all.insert(path.clone(), std::fs::read(&path).unwrap());
        }
    }
    all
}

/// Each Python script of `scripts/` answers `-h` and `--help` with its usage (exit 0) and
/// writes nothing: run from a copy of `scripts/` beside a copy of the manifests, from an empty
/// folder, every file there is as it was.
#[test]
fn every_script_answers_help_and_writes_nothing() {
    let dir = leasegate_tests::spin::scratch_dir("scripts-help");
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::create_dir_all(dir.join("cwd")).unwrap();
    for name in ["spin.toml", "spin-cron.toml"] {
        std::fs::copy(root().join(name), dir.join(name)).unwrap();
    }
    let mut scripts = Vec::new();
    for entry in std::fs::read_dir(root().join("scripts")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "py") {
            let copy = dir.join("scripts").join(path.file_name().unwrap());
            std::fs::copy(&path, &copy).unwrap();
            scripts.push(copy);
        }
    }
    assert!(scripts.len() >= 4, "{scripts:?}");
    let before = files(&dir);
    for script in &scripts {
        for flag in ["--help", "-h"] {
            let out = Command::new("python3")
                .arg(script)
                .arg(flag)
                .current_dir(dir.join("cwd"))
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .output()
                .expect("run python3");
            let name = script.file_name().unwrap().to_string_lossy();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{name} {flag}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(stdout.starts_with("usage:"), "{name} {flag}: {stdout}");
            assert!(files(&dir) == before, "{name} {flag} wrote a file");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `scripts/dev.sh --help` (and `-h`) prints its commands and exits 0 doing nothing else; an
/// unknown command exits 2 naming it, with the usage on standard error.
#[test]
fn dev_script_answers_help_and_names_an_unknown_command() {
    for flag in ["--help", "-h"] {
        let out = Command::new("bash")
            .arg(root().join("scripts/dev.sh"))
            .arg(flag)
            .output()
            .expect("run bash");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{flag}: {stdout}");
        assert!(
            stdout.starts_with("usage: scripts/dev.sh"),
            "{flag}: {stdout}"
        );
        for command in ["setup", "run", "test", "check", "bench", "cli"] {
            assert!(
                stdout.contains(&format!("\n  {command} ")),
                "{flag}: {command}: {stdout}"
            );
        }
        assert!(
            out.stderr.is_empty(),
            "{flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = Command::new("bash")
        .arg(root().join("scripts/dev.sh"))
        .arg("frob")
        .output()
        .expect("run bash");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("scripts/dev.sh: unknown command 'frob'"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}
