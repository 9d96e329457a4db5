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

fn manifest(name: &str) -> toml::Table {
    let text = std::fs::read_to_string(root().join(name)).expect("read the manifest");
    toml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn the_cron_manifest_matches_spin_toml() {
    let http = manifest("spin.toml");
    let cron = manifest("spin-cron.toml");
    assert_eq!(cron["variables"], http["variables"], "[variables] differ");
    let cron_components = cron["component"].as_table().unwrap();
    assert!(!cron_components.is_empty());
    for (id, c) in cron_components {
        assert_eq!(Some(c), http["component"].get(id), "component {id} differs");
    }
    let triggers = cron["trigger"]["cron"].as_array().unwrap();
    for t in triggers {
        let component = t["component"].as_str().unwrap();
        assert!(cron_components.contains_key(component), "{component}");
        assert_eq!(
            t["cron_expression"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .count(),
            6
        );
    }
    // spin.toml itself names no cron trigger: it runs on a Spin without the plugin.
    assert!(http["trigger"].get("cron").is_none());
    // The tracked manifest is what the script writes (to stdout here: nothing is rewritten).
    let out = Command::new("python3")
        .arg(root().join("scripts/cron_manifest.py"))
        .args(["-o", "-"])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tracked = std::fs::read_to_string(root().join("spin-cron.toml")).unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout) == tracked,
        "spin-cron.toml is not what `scripts/cron_manifest.py -o -` writes: run \
         `python3 scripts/cron_manifest.py -o spin-cron.toml`"
    );
}

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

/// Every YAML document of `deploy/spinkube/{name}`, as JSON (parsed by PyYAML).
fn yaml_docs(name: &str) -> Vec<serde_json::Value> {
    let path = root().join("deploy/spinkube").join(name);
    let text = python(
        "import json, sys, yaml\n\
         print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]))",
        &[&path],
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}: {text}"))
}

fn of_kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// A SpinApp variable's literal value, else spin.toml's default.
fn variable(app: &serde_json::Value, http: &toml::Table, name: &str) -> String {
    app["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .and_then(|v| v["value"].as_str().map(str::to_string))
        .unwrap_or_else(|| {
            http["variables"][name]["default"]
                .as_str()
                .unwrap_or_else(|| panic!("spin.toml has no default for {name}"))
                .to_string()
        })
}

/// `(period, offset)` in seconds of the cron expressions spin-cron.toml uses: a second field
/// `N` or `*/N`, a minute field `*` or `*/M`, the rest `*`.
fn cron_period(expression: &str) -> (u64, u64) {
    let f: Vec<&str> = expression.split_whitespace().collect();
    assert!(f[2..].iter().all(|x| *x == "*"), "{expression}");
    let minutes = match f[1] {
        "*" => 1,
        m => m.strip_prefix("*/").expect(expression).parse().unwrap(),
    };
    match f[0].strip_prefix("*/") {
        Some(n) if f[1] == "*" => (n.parse().unwrap(), 0),
        None => (60 * minutes, f[0].parse().unwrap()),
        _ => panic!("{expression}"),
    }
}

/// The ticker's `LEASEGATE_TICKS` lines as `(period, offset, path)`.
fn ticks(text: &str) -> Vec<(u64, u64, String)> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (when, path) = l.trim().split_once(' ').expect("PERIOD[+OFFSET] PATH");
            let (p, o) = when.split_once('+').unwrap_or((when, "0"));
            (
                p.parse().unwrap(),
                o.parse().unwrap(),
                path.trim().to_string(),
            )
        })
        .collect()
}

/// Spin's route matching: exact, or a trailing wildcard `/base/...`.
fn route_matches(route: &str, path: &str) -> bool {
    match route.strip_suffix("/...") {
        Some(base) => path == base || path.starts_with(&format!("{base}/")),
        None => path == route,
    }
}

#[test]
fn spinkube_manifests_name_only_what_the_shim_runs_and_tick_in_time() {
    let http = manifest("spin.toml");
    // What SpinKube runs is spin.toml (the image pushed): HTTP triggers only, which the shim
    // runs; the cron manifest is pushed nowhere.
    let triggers = http["trigger"].as_table().unwrap();
    assert_eq!(triggers.keys().collect::<Vec<_>>(), ["http"]);
    let folder = root().join("deploy/spinkube");
    for entry in std::fs::read_dir(&folder).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines().filter(|l| l.contains("registry push")) {
            assert!(!line.contains("spin-cron"), "{}: {line}", path.display());
        }
        assert!(!text.contains("trigger.cron"), "{}", path.display());
    }

    let kustomization = yaml_docs("kustomization.yaml");
    let resources: Vec<&str> = kustomization[0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let mut docs = Vec::new();
    for r in &resources {
        docs.extend(yaml_docs(r));
    }
    for d in &docs {
        assert!(d["apiVersion"].is_string() && d["kind"].is_string(), "{d}");
        assert!(d["metadata"]["name"].is_string(), "{d}");
    }

    // The executor the SpinApp names, on the RuntimeClass defined, with the CA certificates
    // HTTPS to storage needs.
    let apps = of_kind(&docs, "SpinApp");
    assert_eq!(apps.len(), 1, "one SpinApp: the timer functions are in it");
    let app = apps[0];
    let app_name = app["metadata"]["name"].as_str().unwrap();
    let executor = of_kind(&docs, "SpinAppExecutor")
        .into_iter()
        .find(|e| e["metadata"]["name"] == app["spec"]["executor"])
        .expect("the SpinApp's executor is defined");
    let config = &executor["spec"]["deploymentConfig"];
    assert_eq!(config["installDefaultCACerts"], true);
    assert!(of_kind(&docs, "RuntimeClass")
        .iter()
        .any(|r| r["metadata"]["name"] == config["runtimeClassName"]));

    // Variables: only spin.toml's, and every pod its own instance_id.
    let declared = http["variables"].as_table().unwrap();
    for v in app["spec"]["variables"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        assert!(
            declared.contains_key(name),
            "{name} is not a variable of spin.toml"
        );
    }
    let instance = app["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "instance_id")
        .expect("instance_id is set");
    assert_eq!(
        instance["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name",
        "replicas would share one identity"
    );

    // The ticker reaches every ready pod: a headless Service selecting the operator's labels.
    let service = of_kind(&docs, "Service")
        .into_iter()
        .find(|s| s["spec"]["clusterIP"] == "None")
        .expect("a headless Service");
    let selector = &service["spec"]["selector"];
    assert_eq!(selector["core.spinkube.dev/app-name"], app_name);
    assert_eq!(
        selector[format!("core.spinkube.dev/app.{app_name}.status")],
        "ready"
    );
    let ticker = of_kind(&docs, "Deployment")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "leasegate-ticker")
        .expect("the ticker");
    let pod = &ticker["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let env = |name: &str| {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("ticker env {name}"))
            .clone()
    };
    let targets = env("LEASEGATE_TICK_TARGETS")["value"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        targets,
        format!("{}:80", service["metadata"]["name"].as_str().unwrap())
    );
    let token = env("LEASEGATE_TIMER_TOKEN");
    let app_token = app["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "timer_token")
        .expect("timer_token");
    assert_eq!(
        token["valueFrom"]["secretKeyRef"],
        app_token["valueFrom"]["secretKeyRef"]
    );
    // The ticker's script is the ConfigMap kustomization.yaml makes from ticker.py.
    let generated = &kustomization[0]["configMapGenerator"][0];
    assert_eq!(
        pod["volumes"][0]["configMap"]["name"], generated["name"],
        "the ticker mounts the generated ConfigMap"
    );
    assert_eq!(generated["files"][0], "ticker.py");

    // The schedules: spin-cron.toml's, on routes spin.toml serves, for the job and the
    // initialization the app runs, and the leader ticked at least twice per lease.
    let schedule = ticks(env("LEASEGATE_TICKS")["value"].as_str().unwrap());
    let routes: Vec<(String, String)> = triggers["http"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["route"].as_str().unwrap().to_string(),
                t["component"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let cron = manifest("spin-cron.toml");
    let cron_triggers = cron["trigger"]["cron"].as_array().unwrap();
    assert_eq!(schedule.len(), cron_triggers.len());
    let job = variable(app, &http, "job_name");
    let init = variable(app, &http, "init_name");
    for (period, offset, path) in &schedule {
        let (_, component) = routes
            .iter()
            .find(|(r, _)| route_matches(r, path))
            .unwrap_or_else(|| panic!("{path} reaches no route of spin.toml"));
        let expected = match component.as_str() {
            "scheduled-job" => format!("/api/jobs/{job}/tick"),
            "leader" => "/api/leader/tick".to_string(),
            "init-once" => format!("/api/init/{init}"),
            "ttl-sweeper" => "/api/sweeper/tick".to_string(),
            other => panic!("{path}: {other} is not a timer function"),
        };
        assert_eq!(path, &expected);
        let cron_expression = cron_triggers
            .iter()
            .find(|t| t["component"].as_str() == Some(component))
            .unwrap_or_else(|| panic!("{component} has no cron trigger"))["cron_expression"]
            .as_str()
            .unwrap();
        assert_eq!(
            (*period, *offset),
            cron_period(cron_expression),
            "{path} vs spin-cron.toml's {cron_expression}"
        );
        if component == "leader" {
            let lease: u64 = variable(app, &http, "leader_lease_seconds")
                .parse()
                .unwrap();
            assert!(
                2 * period <= lease,
                "the leader is ticked every {period} s: fewer than two ticks per {lease} s lease"
            );
        }
        if component == "scheduled-job" {
            // The default job: every job_period_seconds (empty: 60) since no job_schedule is
            // set; one tick per occurrence.
            assert_eq!(variable(app, &http, "job_schedule"), "");
            let job_period: u64 = variable(app, &http, "job_period_seconds")
                .parse()
                .unwrap_or(60);
            assert_eq!(*period, job_period, "one tick per occurrence");
        }
    }

    // The shared gate cache: a patch of this SpinApp naming the store device-alerts uses.
    let patch = yaml_docs("shared-kv.yaml");
    assert_eq!(patch[0]["metadata"]["name"], app_name);
    let store = &patch[0]["spec"]["runtimeConfig"]["keyValueStores"][0];
    let used = http["component"]["device-alerts"]["key_value_stores"]
        .as_array()
        .unwrap();
    assert!(used.iter().any(|s| s.as_str() == store["name"].as_str()));

    // kubectl renders the kustomization (when kubectl is installed; it needs no cluster).
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok()
    {
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(&folder)
            .output()
            .expect("kubectl kustomize");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered = String::from_utf8_lossy(&out.stdout);
        assert!(rendered.contains("kind: ConfigMap") && rendered.contains("def main()"));
    } else {
        eprintln!("kubectl is not installed: the kustomization was checked by parsing only");
    }
}

/// The shipped ticker against two `spin up` instances of spin.toml standing for two pods (one
/// storage container, each its own instance_id): both are ticked, one leads, and each job
/// occurrence runs once.
#[test]
fn the_ticker_ticks_every_pod_and_each_occurrence_runs_once() {
    use leasegate_tests::app::{App, Setup, TIMER_TOKEN};
    let shared = leasegate_tests::unique_container("ticker");
    let start = |id: &str| {
        App::start_with(
            "ticker",
            &[
                ("instance_id", id),
                ("leader_lease_seconds", "15"),
                ("job_period_seconds", "3"),
            ],
            Setup {
                container: Some(shared.clone()),
                ..Setup::default()
            },
        )
    };
    let apps = [start("pod-a"), start("pod-b")];
    let addrs: Vec<_> = apps.iter().map(|a| a.spin.addr()).collect();
    let ticker = Ticker::start(
        &addrs,
        TIMER_TOKEN,
        "1 /api/leader/tick\n3 /api/jobs/example-job/tick\n",
    );
    std::thread::sleep(Duration::from_secs(10));
    let lines = ticker.stop();

    let ticked: Vec<&serde_json::Value> = lines.iter().filter(|l| l["event"] == "tick").collect();
    // Each pod got the leader's tick every second (10 s of ticking, a margin for slow starts).
    for app in &apps {
        let port = app.spin.addr().port();
        let mine = ticked
            .iter()
            .filter(|l| l["path"] == "/api/leader/tick" && l["port"] == port)
            .count();
        assert!(mine >= 8, "{port}: {mine} leader ticks: {lines:#?}");
    }
    assert!(
        ticked.iter().all(|l| l["status"] == 200),
        "a tick failed: {ticked:#?}"
    );
    // Both pods were ticked, under their own identities, and exactly one of them led.
    let roles: BTreeMap<String, std::collections::BTreeSet<String>> = ticked
        .iter()
        .filter(|l| l["path"] == "/api/leader/tick")
        .fold(BTreeMap::new(), |mut m, l| {
            let a: serde_json::Value = serde_json::from_str(l["answer"].as_str().unwrap()).unwrap();
            m.entry(a["instance"].as_str().unwrap().to_string())
                .or_default()
                .insert(a["role"].as_str().unwrap().to_string());
            m
        });
    assert_eq!(
        roles.keys().collect::<Vec<_>>(),
        ["pod-a", "pod-b"],
        "{roles:?}"
    );
    let leaders: Vec<_> = roles.iter().filter(|(_, r)| r.contains("leader")).collect();
    assert_eq!(leaders.len(), 1, "{roles:?}");
    assert!(
        roles.values().all(|r| r.len() == 1),
        "leadership moved: {roles:?}"
    );
    // Every job occurrence ticked on both pods ran once.
    let runs: Vec<u64> = apps
        .iter()
        .flat_map(|a| a.sink.received())
        .filter(|r| r.path == "/job")
        .map(|r| r.body["occurrenceUnix"].as_u64().unwrap())
        .collect();
    let distinct: std::collections::BTreeSet<u64> = runs.iter().copied().collect();
    assert!(distinct.len() >= 2, "{runs:?}");
    assert_eq!(
        runs.len(),
        distinct.len(),
        "an occurrence ran twice: {runs:?}"
    );
    for app in &apps {
        app.assert_no_trap();
    }
}

// ---------------------------------------------------------------------------------------------
// The cron plugin: one version, pinned wherever it is installed, and the one installed here.

#[test]
fn every_cron_plugin_instruction_pins_the_verified_version() {
    use leasegate_tests::spin::CRON_PLUGIN_VERSION;
    let dev = std::fs::read_to_string(root().join("scripts/dev.sh")).unwrap();
    assert!(dev.contains(&format!("CRON_PLUGIN_VERSION={CRON_PLUGIN_VERSION}\n")));
    let mut files = vec![
        root().join("README.md"),
        root().join("spin-cron.toml"),
        root().join("scripts/cron_manifest.py"),
        root().join("scripts/dev.sh"),
    ];
    for dir in ["docs", "deploy/spinkube", "deploy/azure-functions"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    let mut found = 0;
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text
            .lines()
            .filter(|l| l.contains("plugins install trigger-cron"))
        {
            found += 1;
            let pinned = line.contains(&format!("--version {CRON_PLUGIN_VERSION}"))
                || line.contains("--version $CRON_PLUGIN_VERSION");
            assert!(pinned, "{}: not pinned: {line}", path.display());
        }
        // The plugin's repository moved; the old canary URL is gone.
        assert!(
            !text.contains("spinframework/spin-trigger-cron"),
            "{}",
            path.display()
        );
    }
    assert!(found >= 3, "{found} install instructions");
    let docs = std::fs::read_to_string(root().join("docs/deployment.md")).unwrap();
    assert!(docs.contains(&format!(
        "`trigger-cron` **{CRON_PLUGIN_VERSION}** is verified"
    )));
    assert!(docs.contains("0.6.x") && docs.contains("spin:cron@3.0.0"));

    // The plugin the tests run under is that version.
    if let Ok(out) = Command::new("spin")
        .args(["plugins", "list", "--installed"])
        .output()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        let installed = text
            .lines()
            .find(|l| l.starts_with("trigger-cron "))
            .unwrap_or_else(|| panic!("trigger-cron is not installed: {text}"));
        assert!(
            installed.starts_with(&format!("trigger-cron {CRON_PLUGIN_VERSION} ")),
            "{installed}"
        );
    }
}

/// `deploy/azure-storage/dead-blobs-lifecycle.json` (the backstop for dead-blob containers) is
/// a lifecycle management policy as `az storage account management-policy create --policy`
/// takes it: enabled `Lifecycle` rules, each scoped to a container (`prefixMatch` entries
/// `container/`) and block or append blobs (the types a delete action takes), deleting base
/// blobs some whole days after their last modification (a move writes the dead copy, so the
/// days count from the move); docs/ttl-sweeper.md gives the command with this file.
#[test]
fn the_dead_blob_lifecycle_policy_has_the_shape_azure_takes() {
    let path = "deploy/azure-storage/dead-blobs-lifecycle.json";
    let text = std::fs::read_to_string(root().join(path)).expect("read the policy");
    let policy: serde_json::Value = serde_json::from_str(&text).expect("the policy is JSON");
    let rules = policy["rules"].as_array().expect("rules");
    assert!(!rules.is_empty());
    for rule in rules {
        assert_eq!(rule["enabled"], true, "{rule}");
        assert_eq!(rule["type"], "Lifecycle", "{rule}");
        let name = rule["name"].as_str().expect("a name");
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "{name}"
        );
        let filters = &rule["definition"]["filters"];
        for t in filters["blobTypes"].as_array().expect("blobTypes") {
            assert!(
                ["blockBlob", "appendBlob"].contains(&t.as_str().unwrap()),
                "{t}"
            );
        }
        let prefixes = filters["prefixMatch"].as_array().expect("prefixMatch");
        assert!(!prefixes.is_empty());
        for p in prefixes {
            let (container, _) = p.as_str().unwrap().split_once('/').expect("container/");
            leasegate::ContainerName::try_new(container).expect("a container name");
        }
        let actions = &rule["definition"]["actions"];
        let days = actions["baseBlob"]["delete"]["daysAfterModificationGreaterThan"]
            .as_u64()
            .expect("whole days");
        assert!(days >= 1, "{days}");
        for k in actions.as_object().unwrap().keys() {
            assert!(["baseBlob", "snapshot"].contains(&k.as_str()), "{k}");
        }
    }
    let docs = std::fs::read_to_string(root().join("docs/ttl-sweeper.md")).unwrap();
    assert!(
        docs.contains("az storage account management-policy create --account-name")
            && docs.contains(&format!("--policy @{path}")),
        "docs/ttl-sweeper.md gives the command"
    );
}

/// The README is short (under 12,000 bytes: the reference lives in docs/) and opens with the
/// two commands, the first of which installs and serves the app.
#[test]
fn the_readme_is_short_and_opens_with_the_two_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.len() < 12_000, "README.md is {} bytes", readme.len());
    let first_section = readme.split("\n## ").nth(1).unwrap_or_default();
    assert!(first_section.starts_with("Two commands"), "{first_section}");
    let commands: Vec<&str> = first_section
        .lines()
        .filter(|l| l.starts_with("scripts/dev.sh"))
        .collect();
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert!(commands[0].starts_with("scripts/dev.sh setup && scripts/dev.sh run"));
    assert!(commands[1].starts_with("scripts/dev.sh test"));
}
