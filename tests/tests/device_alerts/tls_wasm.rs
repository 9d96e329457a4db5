//! Storage over HTTPS: the app under the real `spin up` reaches Azurite through the proxy's TLS
//! mode (`Setup::storage_tls`: the test CA's server certificate for `localhost`, trusted through
//! the runtime config's `[[client_tls]]`), with the clock right and an hour behind.

use leasegate_tests::app::{call, post_telemetry, Answer, App, Setup};
use leasegate_tests::proxy::Proxy;
use leasegate_tests::Azurite;
use serde_json::json;

const AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

fn take_gate(app: &App, key: &str) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/gate/{key}?window=30")),
        &[AUTH],
        b"",
    )
}

fn tls_app(tag: &str, clock_offset_ms: i64) -> App {
    App::start_with(
        tag,
        &[],
        Setup {
            storage_tls: true,
            clock_offset_ms,
            ..Setup::default()
        },
    )
}

/// A gate and a notified reading, every storage request over TLS through the proxy.
fn gate_and_reading_over_tls(app: &App) {
    assert!(app.storage.is_tls());
    let origin = app.storage.origin();
    assert!(origin.starts_with("https://localhost:"), "{origin}");
    assert_eq!(app.variables["storage_origin"], origin);

    let (a, seen) = app.counted(|| take_gate(app, "k"));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["acquired"], true, "{}", a.text);
    assert!(
        seen.iter()
            .any(|s| s.describe() == "lease acquire" && s.auth == "SharedKey"),
        "the acquire went through the TLS proxy: {seen:#?}"
    );

    let (r, seen) =
        app.counted(|| post_telemetry(app, &json!({ "deviceId": "dev-tls", "temperature": 41.0 })));
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["decisions"][0]["decision"], "notified", "{}", r.text);
    assert!(
        !seen.is_empty(),
        "the reading's gate went through the TLS proxy"
    );
    assert_eq!(app.sink.for_device("dev-tls").len(), 1);
    app.assert_no_trap();
}

#[test]
fn gate_and_telemetry_reach_storage_over_tls() {
    let app = tls_app("tls", 0);
    gate_and_reading_over_tls(&app);
}

#[test]
fn backdated_certificate_holds_an_hour_behind() {
    // faketime an hour behind the real clock: the certificates start a day ago.
    let app = tls_app("tls-behind", -3_600_000);
    gate_and_reading_over_tls(&app);
}

#[test]
fn without_client_tls_the_test_ca_is_not_trusted() {
    // The same TLS proxy as storage, but no `[[client_tls]]` entry: Spin does not trust the
    // test CA, the handshake fails, and no request reaches the proxy.
    let tls = Proxy::start_tls(&format!("127.0.0.1:{}", Azurite::shared().port()));
    let app = App::start(
        "tls-untrusted",
        &[("storage_origin", tls.origin().as_str())],
    );
    let (a, seen) = tls.during(|| take_gate(&app, "k"));
    assert_eq!(a.status, 503, "{}", a.text);
    assert!(seen.is_empty(), "{seen:#?}");
    app.assert_no_trap();
}

#[test]
fn client_tls_is_merged_into_an_existing_runtime_config() {
    let base = "[key_value_store.default]\ntype = \"spin\"\npath = \"kv.db\"\n\n[[client_tls]]\ncomponent_ids = [\"other\"]\nhosts = [\"example.test\"]\n";
    let text = leasegate_tests::tls::client_tls_runtime_config(
        Some(base),
        &["gate".to_string()],
        std::path::Path::new("/tmp/ca.pem"),
    );
    let doc: toml::Table = text.parse().expect("TOML");
    assert_eq!(
        doc["key_value_store"]["default"]["type"].as_str(),
        Some("spin")
    );
    let entries = doc["client_tls"].as_array().expect("client_tls");
    assert_eq!(entries.len(), 2, "{text}");
    assert_eq!(entries[0]["hosts"][0].as_str(), Some("example.test"));
    assert_eq!(entries[1]["component_ids"][0].as_str(), Some("gate"));
    assert_eq!(entries[1]["hosts"][0].as_str(), Some("localhost"));
    assert_eq!(entries[1]["ca_roots_file"].as_str(), Some("/tmp/ca.pem"));
    assert!(leasegate_tests::tls::TestCa::shared()
        .ca_pem()
        .starts_with("-----BEGIN CERTIFICATE-----"));
}
