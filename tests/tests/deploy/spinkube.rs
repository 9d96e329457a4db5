//! The SpinKube manifests, the ticker, the cron plugin's pinned version.

use super::*;

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
