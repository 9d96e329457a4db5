//! spin-cron.toml matches spin.toml.

use super::*;

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
