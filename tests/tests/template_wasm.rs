//! The `spin new` template (`templates/leasegate-http`): installed into a scratch Spin data
//! directory, a project made with `spin new -t leasegate-http --accept-defaults`, built against
//! the workspace's crates and served by two `spin up` instances of its own `spin.toml` against
//! one Azurite container: each key's work runs once, whichever instance is asked.

use std::sync::Barrier;

use leasegate_tests::app::{
    bad, call, expect_clear_errors, template_project, Answer, App, Manifest, Setup, TEMPLATE_TOKEN,
};

const AUTH: (&str, &str) = ("authorization", "Bearer test-template-token-6e1b");

fn work(app: &App, key: &str) -> Answer {
    call("POST", &app.url(&format!("/api/work/{key}")), &[AUTH], b"")
}

#[test]
fn the_generated_project_is_what_the_template_promises() {
    let manifest = std::fs::read_to_string(template_project()).expect("the generated spin.toml");
    // The defaults, the secrets marked secret, Spin's own variable templates left for Spin.
    assert!(manifest.contains("route = \"/api/work/...\""), "{manifest}");
    assert!(manifest.contains("name = \"gated-work\""), "{manifest}");
    for secret in [
        "storage_key",
        "api_token",
        "identity_header",
        "entra_client_secret",
    ] {
        let line = manifest
            .lines()
            .find(|l| l.starts_with(&format!("{secret} = {{")))
            .unwrap_or_else(|| panic!("no {secret} variable:\n{manifest}"));
        assert!(line.contains("secret = true"), "{line}");
    }
    assert!(
        manifest
            .contains(r#"allowed_outbound_hosts = ["{{ storage_origin }}", "{{ token_origin }}", "{{ work_origin }}"]"#),
        "{manifest}"
    );
    let source = template_project().parent().unwrap().join("src/lib.rs");
    let code = std::fs::read_to_string(source).expect("the generated handler");
    assert!(code.contains("Duration::from_secs(3600)"), "{code}");
    assert!(code.contains("\"/api/work/\""), "{code}");
}

#[test]
fn a_key_runs_once_across_two_instances_of_the_generated_project() {
    let setup = || Setup {
        manifest: Manifest::Template,
        ..Setup::default()
    };
    let a = App::start_with("tmpl", &[], setup());
    let b = App::start_with(
        "tmpl",
        &[("work_origin", &a.webhook.origin())],
        Setup {
            container: Some(a.container.clone()),
            ..setup()
        },
    );
    let barrier = Barrier::new(2);
    let (first, second) = std::thread::scope(|s| {
        let one = s.spawn(|| {
            barrier.wait();
            work(&a, "k-1")
        });
        let two = s.spawn(|| {
            barrier.wait();
            work(&b, "k-1")
        });
        (one.join().unwrap(), two.join().unwrap())
    });
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
            manifest: Manifest::Template,
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
