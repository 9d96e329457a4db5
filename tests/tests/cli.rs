//! The `leasegate` CLI at the extremes: windows up to `u64::MAX` seconds and lock blobs whose
//! metadata holds huge or garbage numbers give a clear error and a failing exit, never a panic.

use std::process::{Command, Output};
use std::time::SystemTime;

use leasegate::lease::Locks;
use leasegate::ops::{Condition, Metadata, SetMetadata, WriteOutcome};
use leasegate::LockName;
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::cli_binary as cli;
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
