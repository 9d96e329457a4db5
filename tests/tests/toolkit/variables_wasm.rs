//! Variables from memory (docs/configuration.md, "Variables from memory"): the file
//! `scripts/variables.py` writes for `spin up --variable @FILE`, and device-alerts served by the
//! real `spin up` with every variable from it, or from a runtime config's static provider,
//! answering as it does with the variables read through Spin's environment provider.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use leasegate_tests::app::{call, post_telemetry, App, Setup, TELEMETRY_AUTH};
use leasegate_tests::spin::{scratch_dir, Spin, SpinConfig};
use serde_json::json;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// Runs `scripts/variables.py` in `dir` with `args` and, of Spin's variables, only `env` in its
/// environment.
fn variables_py_in(dir: &Path, args: &[&OsStr], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new("python3");
    command
        .current_dir(dir)
        .arg(root().join("scripts/variables.py"))
        .arg("-f")
        .arg(root().join("spin.toml"))
        .args(args);
    for (k, _) in std::env::vars_os() {
        if k.as_bytes().starts_with(b"SPIN_VARIABLE_") {
            command.env_remove(k);
        }
    }
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("run python3 scripts/variables.py")
}

fn variables_py(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    variables_py_in(&root(), &args, env)
}

#[test]
fn the_variables_file_holds_every_variable_of_the_manifest() {
    let dir = scratch_dir("variables-file");
    let file = dir.join("variables.toml");
    let tricky = "a \"quoted\" \\ back\tslash\nnew line \u{7f} é 😀";
    let out = variables_py(
        &[
            "-o",
            file.to_str().unwrap(),
            "telemetry_token=from-the-argument",
            &format!("notify_path={tricky}"),
        ],
        &[
            ("SPIN_VARIABLE_TELEMETRY_TOKEN", "from-the-environment"),
            ("SPIN_VARIABLE_TEMPERATURE_THRESHOLD", "41.5"),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Secrets stay in the file: mode 0600, no value in the script's output.
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(out.stdout.is_empty());
    assert!(!stderr.contains("from-the-argument"), "{stderr}");
    assert!(stderr.contains("written to"), "{stderr}");

    let text = std::fs::read_to_string(&file).unwrap();
    let written: toml::Table = text.parse().expect("the file is TOML");
    let manifest: toml::Table = std::fs::read_to_string(root().join("spin.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let declared = manifest["variables"].as_table().unwrap();
    let value = |name: &str| written.get(name).and_then(|v| v.as_str());
    // An argument beats the environment, the environment beats the default.
    assert_eq!(value("telemetry_token"), Some("from-the-argument"));
    assert_eq!(value("temperature_threshold"), Some("41.5"));
    assert_eq!(value("notify_path"), Some(tricky));
    // Every other variable with a default, as its default; nothing else.
    for (name, spec) in declared {
        if ["telemetry_token", "temperature_threshold", "notify_path"].contains(&name.as_str()) {
            continue;
        }
        let default = spec.get("default").and_then(|d| d.as_str());
        assert_eq!(value(name), default, "{name}");
    }
    assert!(written.keys().all(|k| declared.contains_key(k)));

    // A name the manifest does not declare, or no `=`: refused, exit 2, named.
    let out = variables_py(&["-o", "-", "telemetry_tokn=secret-value"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("'telemetry_tokn' is not a variable"),
        "{stderr}"
    );
    assert!(!stderr.contains("secret-value"), "{stderr}");
    let out = variables_py(&["-o", "-", "telemetry_token"], &[]);
    assert_eq!(out.status.code(), Some(2));
    // A secret typed as its own argument (`storage_key= KEY==`) is not repeated either.
    let out = variables_py(&["-o", "-", "storage_key=", "s3cr3t/KEY=="], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("argument 2 is not NAME=VALUE"), "{stderr}");
    assert!(!stderr.contains("s3cr3t"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_variables_file_replaces_what_was_there_and_refuses_what_it_would_change() {
    let dir = scratch_dir("variables-replace");
    // A file (readable by all) and a link already at the paths: each replaced by a new file
    // of mode 0600, the link's target never written.
    let file = dir.join("variables.toml");
    std::fs::write(&file, "old").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = dir.join("linked.toml");
    let target = dir.join("target.toml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for path in [&file, &link] {
        let out = variables_py_in(
            &dir,
            &[
                OsStr::new("-o"),
                path.as_os_str(),
                OsStr::new("timer_token=t"),
            ],
            &[],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta = std::fs::symlink_metadata(path).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains("\"timer_token\" = \"t\""), "{text}");
    }
    assert!(!target.exists());

    // A value that is not UTF-8: refused, the file there kept.
    let before = std::fs::read(&file).unwrap();
    let out = variables_py_in(
        &dir,
        &[
            OsStr::new("-o"),
            file.as_os_str(),
            OsStr::from_bytes(b"storage_key=a\xfeb"),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid UTF-8"));
    assert_eq!(std::fs::read(&file).unwrap(), before);

    // A .env here that sets a variable not otherwise given: the file would replace its value
    // (Spin reads .env only through its environment provider), so it is refused.
    std::fs::write(
        dir.join(".env"),
        "export SPIN_VARIABLE_TIMER_TOKEN=from-dotenv\n",
    )
    .unwrap();
    let out = variables_py_in(&dir, &[OsStr::new("-o"), OsStr::new("-")], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(".env sets SPIN_VARIABLE_TIMER_TOKEN"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("from-dotenv") && out.stdout.is_empty(),
        "{stderr}"
    );
    // Given in the environment, it is taken from there.
    let out = variables_py_in(
        &dir,
        &[OsStr::new("-o"), OsStr::new("-")],
        &[("SPIN_VARIABLE_TIMER_TOKEN", "exported")],
    );
    assert!(out.status.success());
    let written: toml::Table = String::from_utf8(out.stdout).unwrap().parse().unwrap();
    assert_eq!(written["timer_token"].as_str(), Some("exported"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn spin_serves_device_alerts_from_the_variables_file() {
    let dir = scratch_dir("variables-spin");
    let file = dir.join("variables.toml");
    let out = variables_py(
        &[
            "-o",
            file.to_str().unwrap(),
            "telemetry_token=token-from-the-file",
            "temperature_threshold=44",
            "alert_window_seconds=120",
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spin = Spin::start(&SpinConfig {
        manifest: root().join("spin.toml"),
        variables: Vec::new(),
        variable_files: vec![file],
        http: true,
        clock_offset_ms: 0,
        runtime_config: None,
        env: Vec::new(),
        quiet: true,
    });
    let url = format!("http://{}/api/telemetry", spin.addr());
    let post = |token: &str| {
        call(
            "POST",
            &url,
            &[
                ("authorization", &format!("Bearer {token}")),
                ("content-type", "application/json"),
            ],
            json!({"deviceId": "dev-file", "temperature": 43.0})
                .to_string()
                .as_bytes(),
        )
    };
    // The token, the threshold and the window are the file's: 43 is below 44, no storage.
    let answer = post("token-from-the-file");
    assert_eq!(answer.status, 200, "{}", answer.text);
    let body = &answer.json;
    assert_eq!(
        body["decisions"][0]["decision"], "below_threshold",
        "{body}"
    );
    assert_eq!(body["threshold"], 44.0, "{body}");
    assert_eq!(body["windowSeconds"], 120, "{body}");
    assert_eq!(post("another-token").status, 401);
    // Under --quiet the decision's log line goes to the component's log file only.
    let logs = spin.component_lines();
    assert!(
        logs.iter()
            .any(|l| l.contains("\"below_threshold\"") && l.contains("dev-file")),
        "{logs:?}"
    );
    assert!(!spin.stdout().contains("dev-file"), "{}", spin.stdout());
    drop(spin);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn device_alerts_decides_the_same_with_every_variable_from_a_static_provider() {
    let app = App::start_with(
        "in-memory",
        &[
            ("temperature_threshold", "40"),
            ("alert_window_seconds", "60"),
        ],
        Setup {
            variables_in_memory: true,
            spin_quiet: true,
            // The static provider is asked before the environment: its `bearer` (the default)
            // wins over this `none`, so the bearer check below still refuses a wrong token.
            spin_env: vec![("SPIN_VARIABLE_TELEMETRY_AUTH".into(), "none".into())],
            ..Setup::default()
        },
    );
    let below = post_telemetry(&app, &json!({"deviceId": "dev-mem", "temperature": 39.0}));
    assert_eq!(below.status, 200, "{}", below.text);
    assert_eq!(below.json["decisions"][0]["decision"], "below_threshold");
    assert_eq!(below.json["threshold"], 40.0);
    let first = post_telemetry(&app, &json!({"deviceId": "dev-mem", "temperature": 45.0}));
    assert_eq!(
        first.json["decisions"][0]["decision"], "notified",
        "{}",
        first.text
    );
    let second = post_telemetry(&app, &json!({"deviceId": "dev-mem", "temperature": 46.0}));
    assert_eq!(
        second.json["decisions"][0]["decision"], "throttled",
        "{}",
        second.text
    );
    assert_eq!(app.sink.for_device("dev-mem").len(), 1);
    // The bearer check reads the token from the provider too.
    let refused = call(
        "POST",
        &app.url("/api/telemetry"),
        &[
            ("authorization", "Bearer not-the-token"),
            ("content-type", "application/json"),
        ],
        json!({"deviceId": "dev-mem", "temperature": 45.0})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(refused.status, 401, "{}", refused.text);
    // And the right one, as the harness sends it, is taken.
    let (name, value) = TELEMETRY_AUTH;
    let taken = call(
        "POST",
        &app.url("/api/telemetry"),
        &[(name, value), ("content-type", "application/json")],
        json!({"deviceId": "dev-mem-2", "temperature": 10.0})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(taken.status, 200, "{}", taken.text);
}
