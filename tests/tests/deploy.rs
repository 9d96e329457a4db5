//! The deployment files stay true to the app: the cron manifest defines its components and
//! variables exactly as spin.toml does, and every Azure Functions `function.json` reaches a
//! route of the manifest the Functions host runs (checked by `assemble.py`, which must also
//! catch a broken one).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use leasegate_tests::app::root;

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
