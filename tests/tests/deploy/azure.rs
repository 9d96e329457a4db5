//! The Azure Functions folder: every function.json reaches a route, a Spin binary the host cannot
//! run refused, the package zipped as Core Tools does starts.

use super::*;

fn assemble(args: &[&str]) -> (bool, String) {
    let out = Command::new("python3")
        .arg(root().join("deploy/azure-functions/assemble.py"))
        .args(args)
        .output()
        .expect("run python3");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn every_function_json_reaches_a_route() {
    let (ok, out) = assemble(&["--check-only"]);
    assert!(ok, "{out}");
    // A broken copy: a route nothing serves, a timer without its route, a bad schedule.
    let cases: BTreeMap<&str, (&str, &str)> = BTreeMap::from([
        ("gate", ("\"gate/{*key}\"", "\"gates/{*key}\"")),
        ("scheduled-job", ("\"0 */1 * * * *\"", "\"*/5 * * * *\"")),
    ]);
    for (function, (from, to)) in cases {
        let dir =
            std::env::temp_dir().join(format!("leasegate-af-{}-{function}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        copy_dir(&root().join("deploy/azure-functions"), &dir);
        let fj = dir.join(function).join("function.json");
        let text = std::fs::read_to_string(&fj).unwrap();
        assert!(text.contains(from), "{function}");
        std::fs::write(&fj, text.replace(from, to)).unwrap();
        let (ok, out) = assemble(&["--check-only", "--functions", dir.to_str().unwrap()]);
        assert!(!ok, "{function}: {out}");
        assert!(out.contains(&format!("{function}/function.json")), "{out}");
        // A timer function whose folder has no route in the manifest.
        if function == "scheduled-job" {
            std::fs::rename(dir.join(function), dir.join("nightly")).unwrap();
            let (ok, out) = assemble(&["--check-only", "--functions", dir.to_str().unwrap()]);
            assert!(
                !ok && out.contains("needs the Spin route /nightly"),
                "{out}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// ---------------------------------------------------------------------------------------------
// Azure Functions: the assembled folder, zipped as Core Tools zips it, starts.

/// Starts the assembled app's launcher as the Functions host does: in `site`, with only the
/// port, the instance and `settings` in its environment; waits for an answer on the port.
fn launch(dir: &Path, site: &Path, tmp: &Path, settings: &[(&str, String)]) -> (Group, String) {
    let port = leasegate_tests::free_port();
    let mut command = Command::new(site.join("launch.sh"));
    command
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("TMPDIR", tmp)
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", port.to_string())
        .env(
            "WEBSITE_INSTANCE_ID",
            "8f1c2d3e4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d",
        )
        .env("SPIN_VARIABLE_INSTANCE_ID", "westeurope");
    for (name, value) in settings {
        command.env(name, value);
    }
    let out = dir.join(format!("launch-{port}.out"));
    let err = dir.join(format!("launch-{port}.err"));
    let child = command
        .current_dir(dir)
        .process_group(0)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("start launch.sh");
    let mut started = Group(child);
    let output = || {
        std::fs::read_to_string(&out).unwrap_or_default()
            + &std::fs::read_to_string(&err).unwrap_or_default()
    };
    // The Functions host waits for the handler to answer on its port (~30-60 s at most).
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = started.0.try_wait() {
            panic!("the launcher exited ({status}):\n{}", output());
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            let root = leasegate_tests::app::call("GET", &format!("{base}/"), &[], b"");
            assert_eq!(root.status, 404, "GET /: {}", root.text);
            return (started, base);
        }
        assert!(
            Instant::now() < deadline,
            "no answer on the port within 60 s:\n{}",
            output()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The Functions host's timer invocation of the leader.
fn leader_timer(base: &str) -> leasegate_tests::app::Answer {
    leasegate_tests::app::call(
        "POST",
        &format!("{base}/leader"),
        &[("content-type", "application/json")],
        br#"{"Data":{"timer":{"IsPastDue":false}},"Metadata":{"sys":{"UtcNow":"2026-11-22T06:00:00Z"}}}"#,
    )
}

/// Zips `folder` into `zip` as Azure Functions Core Tools does for `func azure functionapp
/// publish --custom` (src/Cli/func/Helpers/ZipHelper.cs, `CreateZip`): one entry per file, no
/// directory entries, made by Unix, external attributes `0o100777 << 16` for host.json's
/// `defaultExecutablePath` and `0o100666 << 16` for every other file.
const CORE_TOOLS_ZIP: &str = r#"
import json, sys, zipfile
from pathlib import Path
folder, target = Path(sys.argv[1]), sys.argv[2]
exe = json.loads((folder / "host.json").read_text())["customHandler"]["description"]["defaultExecutablePath"]
with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = f.relative_to(folder).as_posix()
        info = zipfile.ZipInfo(name)
        info.create_system = 3
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = (0o100777 if name == exe else 0o100666) << 16
        z.writestr(info, f.read_bytes())
"#;

/// Unzips as the platform does, applying each entry's Unix mode from its external attributes.
const UNZIP_WITH_MODES: &str = r#"
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        os.chmod(path, (info.external_attr >> 16) & 0o777)
"#;

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

/// Fake ELF headers (64 bytes, and program headers where given) for assemble.py's check.
fn elf_header(class: u8, machine: u16) -> Vec<u8> {
    let mut h = vec![0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = class;
    h[5] = 1; // little-endian
    h[6] = 1;
    h[16] = 2; // ET_EXEC
    h[18..20].copy_from_slice(&machine.to_le_bytes());
    h
}

#[test]
fn assemble_refuses_a_spin_binary_the_functions_host_cannot_run() {
    let dir = leasegate_tests::spin::scratch_dir("af-elf");
    let cases: [(&str, Vec<u8>, &str); 4] = [
        (
            "aarch64",
            elf_header(2, 183),
            "built for aarch64 (arm64), not x86_64",
        ),
        ("riscv", elf_header(2, 243), "built for RISC-V, not x86_64"),
        ("elf32", elf_header(1, 3), "not a 64-bit little-endian ELF"),
        (
            "script",
            b"#!/bin/sh\nexec spin \"$@\"\n".to_vec(),
            "not a Linux (ELF) binary",
        ),
    ];
    for (name, bytes, expected) in cases {
        let file = dir.join(name);
        std::fs::write(&file, bytes).unwrap();
        let out = dir.join(format!("out-{name}"));
        let (ok, text) = assemble(&[
            "--spin",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(!ok, "{name}: accepted: {text}");
        assert!(text.contains(expected), "{name}: {text}");
        assert!(!out.exists(), "{name}: assembled anyway");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_azure_package_zipped_as_core_tools_does_starts() {
    use leasegate_tests::app::{build_components, call, GATE_TOKEN, LEASE_ID_SECRET};
    leasegate_tests::spin::require_spin(false);
    build_components();
    let spin = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v spin"])
            .output()
            .expect("find spin")
            .stdout,
    )
    .unwrap();
    let spin = spin.trim();
    let dir = leasegate_tests::spin::scratch_dir("af-zip");
    let dist = dir.join("dist");
    let (ok, text) = assemble(&["--spin", spin, "--out", dist.to_str().unwrap()]);
    assert!(ok, "{text}");
    assert!(dist.join("spin").is_file() && dist.join("launch.sh").is_file());

    let zip = dir.join("app.zip");
    python(CORE_TOOLS_ZIP, &[&dist, &zip]);
    let site = dir.join("wwwroot");
    python(UNZIP_WITH_MODES, &[&zip, &site]);
    // What Azure unpacks: only the launcher is executable; spin is not.
    assert_eq!(mode(&site.join("launch.sh")), 0o777);
    assert_eq!(mode(&site.join("spin")), 0o666, "spin arrived executable");
    assert_eq!(mode(&site.join("host.json")), 0o666);

    let azurite = leasegate_tests::Azurite::shared();
    let container = leasegate_tests::unique_container("afzip");
    let sink = leasegate_tests::sink::Sink::start();
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    // App settings as SPIN_VARIABLE_*, a managed identity's endpoint (not used: the storage key
    // signs).
    let settings = [
        ("SPIN_VARIABLE_GATE_TOKEN", GATE_TOKEN.to_string()),
        ("SPIN_VARIABLE_LEASE_ID_SECRET", LEASE_ID_SECRET.to_string()),
        (
            "SPIN_VARIABLE_STORAGE_ORIGIN",
            format!("http://127.0.0.1:{}", azurite.port()),
        ),
        ("SPIN_VARIABLE_CONTAINER", container.as_str().to_string()),
        ("SPIN_VARIABLE_LEADER_ORIGIN", sink.origin()),
        (
            "IDENTITY_ENDPOINT",
            "http://127.0.0.1:41234/msi/token".to_string(),
        ),
        ("IDENTITY_HEADER", "not-a-real-header".to_string()),
    ];
    let (started, base) = launch(&dir, &site, &tmp, &settings);
    // spin ran from the writable copy the launcher made executable.
    assert_eq!(mode(&tmp.join("leasegate-spin/bin/spin")), 0o755);

    // An HTTP route: the gate refuses a call without its bearer token.
    let gate = call("POST", &format!("{base}/api/gate/k"), &[], b"");
    assert_eq!(gate.status, 401, "{}", gate.text);
    // A timer invocation on the Functions host's channel; the instance is this instance's own
    // identity: the deployment's name and the start of WEBSITE_INSTANCE_ID.
    let timer = leader_timer(&base);
    assert_eq!(timer.status, 200, "{}", timer.text);
    assert_eq!(
        timer.json["ReturnValue"]["role"], "leader",
        "{}",
        timer.text
    );
    assert_eq!(
        timer.json["ReturnValue"]["instance"], "westeurope.8f1c2d3e4a5b",
        "{}",
        timer.text
    );
    drop(started);

    // The same package with storage_auth = managed_identity on a storage account that checks
    // tokens (Azurite --oauth basic, HTTPS behind a plain-HTTP proxy): the launcher hands the
    // platform's IDENTITY_ENDPOINT, IDENTITY_HEADER and the endpoint's origin to the app.
    let tokens = leasegate_tests::entra::TokenServer::start();
    let oauth = leasegate_tests::proxy::Proxy::start_to_tls(
        &leasegate_tests::Azurite::shared_oauth().authority(),
    );
    let container = leasegate_tests::unique_container("afmi");
    let settings = [
        ("SPIN_VARIABLE_GATE_TOKEN", GATE_TOKEN.to_string()),
        ("SPIN_VARIABLE_LEASE_ID_SECRET", LEASE_ID_SECRET.to_string()),
        ("SPIN_VARIABLE_STORAGE_ORIGIN", oauth.origin()),
        ("SPIN_VARIABLE_STORAGE_AUTH", "managed_identity".to_string()),
        ("SPIN_VARIABLE_STORAGE_KEY", String::new()),
        ("SPIN_VARIABLE_CONTAINER", container.as_str().to_string()),
        ("SPIN_VARIABLE_LEADER_ORIGIN", sink.origin()),
        ("IDENTITY_ENDPOINT", tokens.identity_endpoint()),
        (
            "IDENTITY_HEADER",
            leasegate_tests::entra::IDENTITY_HEADER.to_string(),
        ),
    ];
    let (started, base) = launch(&dir, &site, &tmp, &settings);
    let (timer, seen) = oauth.during(|| leader_timer(&base));
    assert_eq!(timer.status, 200, "{}", timer.text);
    assert_eq!(
        timer.json["ReturnValue"]["role"], "leader",
        "{}",
        timer.text
    );
    assert!(!seen.is_empty());
    for s in &seen {
        assert_eq!(s.auth, "Bearer", "{}", s.describe());
    }
    assert_eq!(tokens.token_count(), 1, "{:#?}", tokens.requests());
    let again = leader_timer(&base);
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(
        tokens.token_count(),
        1,
        "the token is kept between invocations"
    );
    assert!(
        !timer.text.contains("eyJ")
            && !timer.text.contains(leasegate_tests::entra::IDENTITY_HEADER)
    );
    drop(started);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// SpinKube: the manifests parse, name only what the shim runs, and tick the timers in time.
