//! The `spin new` templates (`templates/leasegate-http`, `templates/leasegate-timer`): installed
//! into a scratch Spin data directory as a user installs them from a clone, projects made with
//! `spin new -t <id> --accept-defaults --value leasegate-source=<the clone>` (the timer with
//! `gate=leader` and with `gate=occurrence`), built by `spin build` as generated (with a
//! `CARGO_TARGET_DIR` set elsewhere), and served by two `spin up` instances of their own
//! manifests against one Azurite container: each key's work runs once, one instance leads, each
//! occurrence runs once, whichever instance is asked; the timer's cron manifest runs under the
//! real cron plugin.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, SystemTime};

use leasegate_tests::app::{
    bad, call, expect_clear_errors, install_templates, root, spin_templates, template_project,
    Answer, App, Manifest, Setup, Template, TEMPLATE_TOKEN, TIMER_AUTH, TIMER_TOKEN,
};
use leasegate_tests::wait_for;
use serde_json::Value;

const AUTH: (&str, &str) = ("authorization", "Bearer test-template-token-6e1b");

fn work(app: &App, key: &str) -> Answer {
    call("POST", &app.url(&format!("/api/work/{key}")), &[AUTH], b"")
}

fn tick(app: &App) -> Answer {
    call("POST", &app.url("/api/timer/tick"), &[TIMER_AUTH], b"")
}

/// Runs `f` on both apps at the same moment; returns the two answers in the apps' order.
fn at_once<T: Send>(a: &App, b: &App, f: impl Fn(&App) -> T + Sync) -> (T, T) {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let one = s.spawn(|| {
            barrier.wait();
            f(a)
        });
        let two = s.spawn(|| {
            barrier.wait();
            f(b)
        });
        (one.join().unwrap(), two.join().unwrap())
    })
}

/// Two deployments of the project made from `template`, sharing one container and one webhook
/// sink (`a`'s), named `node-a` and `node-b` (`instance_id`).
fn two_deployments(tag: &str, template: Template) -> (App, App) {
    let setup = || Setup {
        manifest: Manifest::Template(template),
        ..Setup::default()
    };
    let a = App::start_with(tag, &[("instance_id", "node-a")], setup());
    let b = App::start_with(
        tag,
        &[
            ("instance_id", "node-b"),
            ("work_origin", &a.webhook.origin()),
        ],
        Setup {
            container: Some(a.container.clone()),
            ..setup()
        },
    );
    (a, b)
}

/// The variables a table of docs/configuration.md's section `heading` (a `## ` heading, up to
/// the next one) names in its first column.
fn documented(heading: &str) -> BTreeSet<String> {
    let docs = std::fs::read_to_string(root().join("docs/configuration.md")).expect("the docs");
    let section = docs
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("no section {heading:?} in docs/configuration.md"));
    let names: BTreeSet<String> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| {
            let cell = l.split('|').nth(1).unwrap_or_default();
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(names.len() >= 5, "{heading}: {names:?}");
    names
}

/// A manifest's text, parsed.
fn manifest(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse().expect("the manifest parses")
}

/// Checks one generated manifest: every variable in `wanted` declared (a secret where the docs
/// say so) and passed to the component; the build command keeps to the project's `target/`.
fn check_manifest(path: &Path, component: &str, wanted: &BTreeSet<String>, secrets: &[&str]) {
    let doc = manifest(path);
    let variables = doc["variables"].as_table().expect("[variables]");
    let c = &doc["component"][component];
    let passed = c["variables"]
        .as_table()
        .expect("the component's variables");
    for name in wanted {
        assert!(
            variables.contains_key(name),
            "{}: {name} not declared",
            path.display()
        );
        assert_eq!(
            passed.get(name).and_then(|v| v.as_str()),
            Some(format!("{{{{ {name} }}}}").as_str()),
            "{}: {name} not passed to the component",
            path.display()
        );
    }
    for name in secrets {
        assert_eq!(
            variables[*name].get("secret").and_then(|s| s.as_bool()),
            Some(true),
            "{}: {name} is not a secret",
            path.display()
        );
    }
    assert_eq!(
        c["build"]["command"].as_str(),
        Some("cargo build --target wasm32-wasip2 --release --target-dir target")
    );
    let source = c["source"].as_str().expect("source");
    assert_eq!(
        source,
        format!(
            "target/wasm32-wasip2/release/{}.wasm",
            component.replace('-', "_")
        )
    );
    assert_eq!(
        c["allowed_outbound_hosts"],
        toml::Value::Array(
            [
                "{{ storage_origin }}",
                "{{ token_origin }}",
                "{{ work_origin }}"
            ]
            .map(|h| h.into())
            .to_vec()
        )
    );
}

/// The secrets every manifest marks `secret = true`.
const STORAGE_SECRETS: [&str; 6] = [
    "storage_connection_string",
    "storage_key",
    "storage_sas",
    "identity_header",
    "entra_client_secret",
    "lease_id_secret",
];

#[test]
fn the_generated_projects_declare_every_documented_setting() {
    let common = documented("Storage (every function)");
    for name in [
        "storage_timeout_ms",
        "storage_sas",
        "storage_auth",
        "entra_client_secret",
    ] {
        assert!(common.contains(name), "{common:?}");
    }
    let timer = documented("Every timer function");
    for template in [Template::Http, Template::Leader, Template::Occurrence] {
        let spin_toml = template_project(template);
        let project = spin_toml.parent().unwrap();
        let mut wanted = common.clone();
        let mut secrets = STORAGE_SECRETS.to_vec();
        if template == Template::Http {
            wanted.extend(["api_token".into(), "api_auth".into()]);
            secrets.push("api_token");
        } else {
            wanted.extend(timer.iter().cloned());
            secrets.extend(["timer_token", "admin_token"]);
        }
        check_manifest(&spin_toml, template.project(), &wanted, &secrets);
        // The dependencies are this repository's crates, as the parameter said.
        let cargo = manifest(&project.join("Cargo.toml"));
        for (name, dir) in [
            ("leasegate", "shared/leasegate"),
            ("leasegate-spin", "shared/leasegate-spin"),
        ] {
            let path = root().join(dir);
            assert_eq!(
                cargo["dependencies"][name]["path"].as_str(),
                path.to_str(),
                "{}",
                project.display()
            );
        }
        if template == Template::Http {
            continue;
        }
        // The cron manifest: the same variables and component, a cron trigger instead of the
        // HTTP route.
        let cron_toml = project.join("spin-cron.toml");
        check_manifest(&cron_toml, template.project(), &wanted, &secrets);
        let (http, cron) = (manifest(&spin_toml), manifest(&cron_toml));
        assert_eq!(http["variables"], cron["variables"]);
        assert_eq!(http["component"], cron["component"]);
        assert_eq!(
            http["trigger"]["http"][0]["route"].as_str(),
            Some("/api/timer/...")
        );
        let trigger = &cron["trigger"]["cron"][0];
        assert_eq!(trigger["component"].as_str(), Some(template.project()));
        let every = match template {
            Template::Leader => "*/10 * * * * *",
            _ => "0 * * * * *",
        };
        assert_eq!(trigger["cron_expression"].as_str(), Some(every));
        let declared = http["variables"].as_table().unwrap();
        assert_eq!(
            declared.contains_key("work_schedule"),
            template == Template::Occurrence
        );
    }
    let manifest = std::fs::read_to_string(template_project(Template::Http)).unwrap();
    assert!(manifest.contains("route = \"/api/work/...\""), "{manifest}");
    assert!(manifest.contains("name = \"gated-work\""), "{manifest}");
    let source = template_project(Template::Http).with_file_name("src/lib.rs");
    let code = std::fs::read_to_string(source).expect("the generated handler");
    assert!(code.contains("Duration::from_secs(3600)"), "{code}");
    assert!(code.contains("\"/api/work/\""), "{code}");
    // Each gate's verb, and only its own.
    for (template, verb, other) in [
        (Template::Leader, "lead(", "once_per_occurrence"),
        (Template::Occurrence, "once_per_occurrence(", "lead("),
    ] {
        let source = template_project(template).with_file_name("src/lib.rs");
        let code = std::fs::read_to_string(source).unwrap();
        assert!(code.contains(verb) && !code.contains(other), "{code}");
        assert!(!code.contains("{%") && !code.contains("{{"), "{code}");
    }
}

#[test]
fn spin_new_asks_where_leasegate_is_and_takes_a_git_url() {
    install_templates();
    let scratch = root().join(format!("target/template-test/new-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let without = [
        "new",
        "-t",
        "leasegate-timer",
        "no-source",
        "--accept-defaults",
    ];
    let refused = spin_templates(&scratch, &without).expect_err("no source, no project");
    assert!(refused.contains("leasegate-source"), "{refused}");
    let url = "https://example.invalid/leasegate.git";
    let value = format!("leasegate-source={url}");
    let args = [
        "new",
        "-t",
        "leasegate-http",
        "from-git",
        "--accept-defaults",
        "--no-vcs",
        "--value",
        &value,
    ];
    spin_templates(&scratch, &args).unwrap_or_else(|e| panic!("{e}"));
    let cargo = manifest(&scratch.join("from-git/Cargo.toml"));
    for name in ["leasegate", "leasegate-spin"] {
        let dep = cargo["dependencies"][name]
            .as_table()
            .expect("a dependency");
        assert_eq!(
            dep.get("git").and_then(|g| g.as_str()),
            Some(url),
            "{dep:?}"
        );
        assert!(!dep.contains_key("path"), "{dep:?}");
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

#[test]
fn a_key_runs_once_across_two_instances_of_the_generated_project() {
    let (a, b) = two_deployments("tmpl", Template::Http);
    let (first, second) = at_once(&a, &b, |app| work(app, "k-1"));
    let (won, lost) = if first.status == 200 {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(won.status, 200, "{}", won.text);
    let token = won.json["fencingToken"].as_u64().expect("a fencing token");
    assert_eq!(lost.status, 429, "{}", lost.text);
    let retry: u64 = lost.headers["retry-after"].parse().expect("Retry-After");
    assert!((1..=3600).contains(&retry), "{retry}");
    let calls = a.sink.received();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0].path, "/work");
    assert_eq!(calls[0].body["key"], "k-1");
    assert_eq!(calls[0].body["fencingToken"], token);
    assert!(b.sink.received().is_empty());
    // Another key runs on its own.
    assert_eq!(work(&b, "k-2").status, 200);
    assert_eq!(a.sink.received().len(), 2);
    let cases = [
        bad("POST", "/api/work/k-3", &[], b"", 401),
        bad("GET", "/api/work/k-3", &[AUTH], b"", 405),
        bad("POST", "/api/work/%ff", &[AUTH], b"", 400),
    ];
    expect_clear_errors(&a, &cases, &[TEMPLATE_TOKEN]);
    assert_eq!(a.sink.received().len(), 2);
    a.assert_no_trap();
    b.assert_no_trap();
}

#[test]
fn the_generated_project_signs_in_with_an_entra_id_token() {
    let app = App::start_with(
        "tmpl-entra",
        &[],
        Setup {
            manifest: Manifest::Template(Template::Http),
            entra: Some(leasegate_tests::app::Entra::ClientSecret),
            ..Setup::default()
        },
    );
    let (first, seen) = app.counted(|| work(&app, "k-1"));
    assert_eq!(first.status, 200, "{}", first.text);
    assert!(!seen.is_empty());
    for s in &seen {
        assert_eq!(s.auth, "Bearer", "{}", s.describe());
    }
    let again = work(&app, "k-1");
    assert_eq!(again.status, 429, "{}", again.text);
    assert_eq!(app.sink.received().len(), 1);
    assert_eq!(app.tokens().token_count(), 1);
    app.assert_no_trap();
}

/// The two answers of a tick, the one with `field` = `value` first.
fn split(first: Answer, second: Answer, field: &str, value: &str) -> (Answer, Answer) {
    if first.json[field] == value {
        (first, second)
    } else {
        (second, first)
    }
}

#[test]
fn one_instance_leads_across_two_deployments_of_the_generated_timer() {
    let (a, b) = two_deployments("tmpl-lead", Template::Leader);
    let (first, second) = at_once(&a, &b, tick);
    let (leader, follower) = split(first, second, "role", "leader");
    assert_eq!(leader.status, 200, "{}", leader.text);
    assert_eq!(leader.json["role"], "leader", "{}", leader.text);
    let name = leader.json["instance"].as_str().expect("the leader's name");
    let term = leader.json["term"].as_u64().expect("a term");
    assert_eq!(follower.status, 200, "{}", follower.text);
    assert_eq!(follower.json["role"], "follower", "{}", follower.text);
    assert_ne!(follower.json["instance"], name);
    // At once, the follower may lose the race before the leader's claim is written.
    if !follower.json["leader"].is_null() {
        assert_eq!(follower.json["leader"], name, "{}", follower.text);
        assert_eq!(follower.json["term"], term, "{}", follower.text);
    }
    let calls = a.sink.received();
    assert_eq!(calls.len(), 1, "only the leader works: {calls:#?}");
    assert_eq!(calls[0].path, "/work");
    assert_eq!(calls[0].body["leader"], name);
    assert_eq!(calls[0].body["term"], term);
    let key = calls[0]
        .idempotency_key
        .as_deref()
        .expect("an idempotency key");
    assert!(key.starts_with(&format!("leader-work/{term}/")), "{key}");
    // The next ticks: the same leader in the same term, the follower still follows.
    let (again_a, again_b) = at_once(&a, &b, tick);
    let (leader2, follower2) = split(again_a, again_b, "role", "leader");
    assert_eq!(leader2.json["instance"], name, "{}", leader2.text);
    assert_eq!(leader2.json["term"], term, "{}", leader2.text);
    assert_eq!(follower2.json["role"], "follower", "{}", follower2.text);
    assert_eq!(follower2.json["leader"], name, "{}", follower2.text);
    assert_eq!(follower2.json["term"], term, "{}", follower2.text);
    let calls = a.sink.received();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    assert_eq!(calls[1].body["leader"], name);
    assert_eq!(calls[1].body["term"], term);
    // The tick token is required; the route is POST .../tick.
    let cases = [
        bad("POST", "/api/timer/tick", &[], b"", 401),
        bad(
            "POST",
            "/api/timer/tick",
            &[("authorization", "Bearer wrong")],
            b"",
            401,
        ),
        bad("GET", "/api/timer/tick", &[TIMER_AUTH], b"", 405),
        bad("POST", "/api/timer/other", &[TIMER_AUTH], b"", 404),
    ];
    expect_clear_errors(&a, &cases, &[TIMER_TOKEN]);
    assert_eq!(a.sink.received().len(), 2);
    a.assert_no_secret(&[&leader, &follower]);
    b.assert_no_secret(&[]);
    // One log line per tick, naming the function.
    let lines: Vec<Value> = a
        .json_lines()
        .into_iter()
        .filter(|l| l["fn"] == "leader-work")
        .collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert_eq!(lines[0]["trigger"], "http");
    b.assert_no_trap();
}

/// Waits until no occurrence of the default schedule (08:00 UTC daily) is within a few seconds
/// of now, so that two ticks at once name the same one.
fn away_from_the_occurrence() {
    wait_for(
        "a time away from 08:00 UTC",
        Duration::from_secs(30),
        || {
            let secs = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            let to_eight = (8 * 3600 + 86_400 - secs % 86_400) % 86_400;
            (!(to_eight <= 15 || to_eight >= 86_400 - 2)).then_some(())
        },
    );
}

#[test]
fn each_occurrence_runs_once_across_two_deployments_of_the_generated_timer() {
    let (a, b) = two_deployments("tmpl-occ", Template::Occurrence);
    away_from_the_occurrence();
    let (first, second) = at_once(&a, &b, tick);
    let (ran, other) = split(first, second, "outcome", "ran");
    assert_eq!(ran.status, 200, "{}", ran.text);
    assert_eq!(ran.json["outcome"], "ran", "{}", ran.text);
    let occurrence = ran.json["occurrence"].as_str().expect("the occurrence");
    assert!(occurrence.ends_with("T08:00:00Z"), "{occurrence}");
    let token = ran.json["fencingToken"].as_u64().expect("a fencing token");
    assert_eq!(other.status, 200, "{}", other.text);
    assert_eq!(other.json["outcome"], "already_run", "{}", other.text);
    assert_eq!(other.json["occurrence"], occurrence, "{}", other.text);
    assert_eq!(
        other.json["reservedBy"], ran.json["instance"],
        "{}",
        other.text
    );
    let calls = a.sink.received();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0].path, "/work");
    assert_eq!(calls[0].body["occurrence"], occurrence);
    assert_eq!(calls[0].body["fencingToken"], token);
    assert!(calls[0].idempotency_key.is_some());
    // Ticked again, anywhere: already run, recorded as succeeded, no second call.
    for app in [&a, &b] {
        let again = tick(app);
        assert_eq!(again.status, 200, "{}", again.text);
        assert_eq!(again.json["outcome"], "already_run", "{}", again.text);
        assert_eq!(again.json["run"], "succeeded", "{}", again.text);
    }
    assert_eq!(a.sink.received().len(), 1);
    let cases = [
        bad("POST", "/api/timer/tick", &[], b"", 401),
        bad("GET", "/api/timer/tick", &[TIMER_AUTH], b"", 405),
    ];
    expect_clear_errors(&b, &cases, &[TIMER_TOKEN]);
    a.assert_no_trap();
}

#[test]
fn a_setting_out_of_range_is_not_configured_in_every_template() {
    // storage_timeout_ms = 5 is below its range (100 to 60000): each template answers 503
    // not_configured naming it, and does no work. The auth switch is declared too: turned off,
    // the call gets as far as the settings.
    for (template, path, auth) in [
        (Template::Http, "/api/work/k-1", "api_auth"),
        (Template::Leader, "/api/timer/tick", "timer_auth"),
        (Template::Occurrence, "/api/timer/tick", "timer_auth"),
    ] {
        let app = App::start_with(
            "tmpl-conf",
            &[
                ("storage_timeout_ms", "5"),
                (auth, "none"),
                ("instance_id", "node-a"),
            ],
            Setup {
                manifest: Manifest::Template(template),
                ..Setup::default()
            },
        );
        let answer = call("POST", &app.url(path), &[], b"");
        assert_eq!(answer.status, 503, "{template:?}: {}", answer.text);
        assert_eq!(answer.json["error"], "not_configured", "{}", answer.text);
        let message = answer.json["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("storage_timeout_ms"),
            "{template:?}: {message}"
        );
        assert!(app.sink.received().is_empty());
        app.assert_no_trap();
    }
    // The leader derives its lease id under lease_id_secret: without it, not_configured.
    let app = App::start_with(
        "tmpl-conf",
        &[("lease_id_secret", ""), ("instance_id", "node-a")],
        Setup {
            manifest: Manifest::Template(Template::Leader),
            ..Setup::default()
        },
    );
    let answer = tick(&app);
    assert_eq!(answer.status, 503, "{}", answer.text);
    assert_eq!(answer.json["error"], "not_configured", "{}", answer.text);
    assert!(answer.text.contains("lease_id_secret"), "{}", answer.text);
    // So does each timer without its instance_id.
    let app = App::start_with(
        "tmpl-conf",
        &[("instance_id", "")],
        Setup {
            manifest: Manifest::Template(Template::Occurrence),
            ..Setup::default()
        },
    );
    let answer = tick(&app);
    assert_eq!(answer.status, 503, "{}", answer.text);
    assert!(answer.text.contains("instance_id"), "{}", answer.text);
}

/// The leader template's ticks from the cron trigger that `app` logged.
fn cron_ticks(app: &App) -> Vec<Value> {
    app.json_lines()
        .into_iter()
        .filter(|l| l["fn"] == "leader-work" && l["trigger"] == "cron")
        .collect()
}

#[test]
fn the_cron_manifest_of_the_generated_timer_elects_one_leader() {
    // Two cron-only deployments of the generated spin-cron.toml (its own schedule: every
    // 10 s), one container; each has its own webhook sink.
    let start = |instance: &str, container| {
        App::start_with(
            "tmpl-cron",
            &[("instance_id", instance)],
            Setup {
                manifest: Manifest::TemplateCron(Template::Leader),
                container,
                ..Setup::default()
            },
        )
    };
    let a = start("cron-a", None);
    let b = start("cron-b", Some(a.container.clone()));
    let apps = [a, b];
    let counts = wait_for(
        "two cron ticks on each deployment and two calls of the work",
        Duration::from_secs(60),
        || {
            let counts: Vec<usize> = apps.iter().map(|a| a.sink.received().len()).collect();
            let ticked = apps.iter().all(|a| cron_ticks(a).len() >= 2);
            (ticked && counts.iter().sum::<usize>() >= 2).then_some(counts)
        },
    );
    let workers: Vec<usize> = (0..2).filter(|&i| counts[i] > 0).collect();
    assert_eq!(
        workers.len(),
        1,
        "calls per deployment {counts:?}: one leads"
    );
    let (leader, follower) = (workers[0], 1 - workers[0]);
    let name = ["cron-a", "cron-b"][leader];
    let calls = apps[leader].sink.received();
    for c in &calls {
        assert_eq!(c.body["leader"], name, "{c:?}");
        assert_eq!(c.body["term"], calls[0].body["term"], "one term: {c:?}");
    }
    for t in cron_ticks(&apps[leader]) {
        assert_eq!(t["role"], "leader", "{t}");
    }
    let followed = cron_ticks(&apps[follower]);
    for t in &followed {
        assert_eq!(t["role"], "follower", "{t}");
        assert!(t["leader"] == name || t["leader"].is_null(), "{t}");
    }
    // Once the leader's claim is written, the follower names it.
    assert_eq!(followed.last().unwrap()["leader"], name, "{followed:#?}");
    for app in &apps {
        app.assert_no_trap();
        app.assert_no_secret(&[]);
    }
}
