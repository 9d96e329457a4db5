//! The dead-blob lifecycle policy, the README's shape.

use super::*;

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
