//! The `leasegate` CLI with Microsoft Entra ID tokens, against a real Azurite that checks them
//! (`--oauth basic`, HTTPS). The CLI talks plain HTTP to the recording proxy, the proxy HTTPS to
//! Azurite; tokens come from the environment (`LEASEGATE_ACCESS_TOKEN`) or from the test token
//! server through the client secret variables. Every storage request is `Bearer`; a command
//! costs one token request; a refused secret or token says what to fix and prints no secret.

use std::process::{Command, Output};
use std::time::Duration;

use leasegate_tests::app::cli_binary as cli;
use leasegate_tests::entra::{self, TokenKind, TokenServer};
use leasegate_tests::proxy::Proxy;
use leasegate_tests::{unique_container, unix_now, Azurite};

/// A proxy with a plain-HTTP listener in front of the shared `--oauth basic` Azurite (HTTPS).
fn proxy() -> Proxy {
    Proxy::start_to_tls(&Azurite::shared_oauth().authority())
}

/// The blob endpoint the CLI is given: the proxy's, path style.
fn endpoint(proxy: &Proxy) -> String {
    format!("{}/devstoreaccount1", proxy.origin())
}

/// What one run of the CLI did.
struct Run {
    ok: bool,
    out: String,
    err: String,
}

impl Run {
    /// Panics unless the run succeeded and printed `want`.
    fn expect(self, want: &str) -> String {
        assert!(self.ok, "{}{}", self.out, self.err);
        assert!(self.out.contains(want), "want {want:?}: {}", self.out);
        self.out
    }

    /// Neither output holds `secret`.
    fn assert_hides(&self, secret: &str) {
        assert!(
            !self.out.contains(secret) && !self.err.contains(secret),
            "a secret was printed"
        );
    }
}

/// Runs the CLI with `vars` as its only `LEASEGATE_*` variables.
fn run(vars: &[(&str, &str)], container: &str, args: &[&str]) -> Run {
    let mut command = Command::new(cli());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("LEASEGATE_") {
            command.env_remove(name);
        }
    }
    let Output {
        status,
        stdout,
        stderr,
    } = command
        .envs(vars.iter().copied())
        .args(args)
        .args(["--container", container])
        .output()
        .expect("run the CLI");
    Run {
        ok: status.success(),
        out: String::from_utf8_lossy(&stdout).into_owned(),
        err: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// The lease id an `acquire` printed (`acquired LOCK: lease id ID, ...`).
fn lease_id(out: &str) -> String {
    let rest = out.split("lease id ").nth(1).expect("a lease id");
    rest.split(',').next().expect("a lease id").to_string()
}

/// Every request the proxy saw was authorized with a bearer token; returns how many there were.
fn all_bearer(proxy: &Proxy) -> usize {
    let seen = proxy.seen();
    assert!(!seen.is_empty(), "no storage request reached the proxy");
    for s in &seen {
        assert_eq!(s.auth, "Bearer", "{} {}", s.method, s.target);
    }
    seen.len()
}

/// The client secret variables for `server`'s service principal, with `secret`.
fn client_secret_vars<'a>(
    endpoint: &'a str,
    server: &'a str,
    secret: &'a str,
) -> [(&'static str, &'a str); 5] {
    [
        ("LEASEGATE_BLOB_ENDPOINT", endpoint),
        ("LEASEGATE_TENANT_ID", entra::TENANT_ID),
        ("LEASEGATE_CLIENT_ID", entra::CLIENT_ID),
        ("LEASEGATE_CLIENT_SECRET", secret),
        ("LEASEGATE_AUTHORITY", server),
    ]
}

#[test]
fn a_token_from_the_environment_takes_shows_and_releases_a_lock() {
    let proxy = proxy();
    let endpoint = endpoint(&proxy);
    let token = entra::mint(Duration::from_secs(3600));
    let vars = [
        ("LEASEGATE_BLOB_ENDPOINT", endpoint.as_str()),
        ("LEASEGATE_ACCESS_TOKEN", token.as_str()),
    ];
    let c = unique_container("clitoken");
    let c = c.as_str();

    let acquired = run(
        &vars,
        c,
        &["acquire", "jobs/nightly/lock", "--window", "60"],
    );
    acquired.assert_hides(&token);
    let out = acquired.expect("acquired jobs/nightly/lock: lease id ");
    let id = lease_id(&out);
    let shown = run(&vars, c, &["show", "jobs/nightly/lock"]);
    shown.assert_hides(&token);
    shown.expect("jobs/nightly/lock: held");
    run(
        &vars,
        c,
        &["release", "jobs/nightly/lock", "--lease-id", &id],
    )
    .expect("released");
    run(&vars, c, &["show", "jobs/nightly/lock"]).expect("jobs/nightly/lock: available");
    all_bearer(&proxy);
}

#[test]
fn the_client_secret_flow_asks_one_token_per_command() {
    let proxy = proxy();
    let endpoint = endpoint(&proxy);
    let server = TokenServer::start();
    let origin = server.origin();
    let vars = client_secret_vars(&endpoint, &origin, entra::CLIENT_SECRET);
    let c = unique_container("clisecret");
    let c = c.as_str();

    let acquired = run(&vars, c, &["acquire", "leader/group-a", "--window", "60"]);
    acquired.assert_hides(entra::CLIENT_SECRET);
    let out = acquired.expect("acquired leader/group-a: lease id ");
    let storage_requests = all_bearer(&proxy);
    assert!(
        storage_requests > 1,
        "an acquire of a new lock takes more than one storage request: {storage_requests}"
    );
    // One token for the whole command, however many storage requests it took.
    assert_eq!(server.count_of(TokenKind::ClientCredentials), 1);
    assert_eq!(server.token_count(), 1);

    run(&vars, c, &["show", "leader/group-a"]).expect("leader/group-a: held");
    let released = run(
        &vars,
        c,
        &["release", "leader/group-a", "--lease-id", &lease_id(&out)],
    );
    released.assert_hides(entra::CLIENT_SECRET);
    released.expect("released");
    assert_eq!(server.count_of(TokenKind::ClientCredentials), 3);
    for r in server.requests() {
        assert_eq!(r.credential, entra::Credential::Matched);
        assert_eq!(r.client_id.as_deref(), Some(entra::CLIENT_ID));
        assert_eq!(r.resource.as_deref(), Some(entra::STORAGE_SCOPE));
    }
    all_bearer(&proxy);
}

#[test]
fn a_wrong_client_secret_is_named_and_not_printed() {
    let proxy = proxy();
    let endpoint = endpoint(&proxy);
    let server = TokenServer::start();
    let origin = server.origin();
    let wrong = "wrong-secret-0f1e2d3c4b5a";
    let vars = client_secret_vars(&endpoint, &origin, wrong);
    let c = unique_container("cliwrong");

    let r = run(
        &vars,
        c.as_str(),
        &["acquire", "gates/tenant-a", "--window", "30"],
    );
    assert!(!r.ok, "{}{}", r.out, r.err);
    assert!(r.err.contains("invalid_client"), "{}", r.err);
    assert!(r.err.contains("LEASEGATE_CLIENT_SECRET"), "{}", r.err);
    r.assert_hides(wrong);
    r.assert_hides(entra::CLIENT_SECRET);
    assert_eq!(server.count_of(TokenKind::ClientCredentials), 1);
    // Without a token, nothing was sent to storage.
    assert_eq!(proxy.count(), 0);
}

#[test]
fn a_token_for_another_audience_gets_the_refused_token_message() {
    let proxy = proxy();
    let endpoint = endpoint(&proxy);
    let now = unix_now();
    let token = entra::mint_with("https://vault.azure.net", now - 300, now + 3600);
    let vars = [
        ("LEASEGATE_BLOB_ENDPOINT", endpoint.as_str()),
        ("LEASEGATE_ACCESS_TOKEN", token.as_str()),
    ];
    let c = unique_container("cliaudience");

    let r = run(
        &vars,
        c.as_str(),
        &["acquire", "init/schema", "--window", "30"],
    );
    assert!(!r.ok, "{}{}", r.out, r.err);
    assert!(r.err.contains("storage answered 403"), "{}", r.err);
    assert!(r.err.contains("storage refused the token"), "{}", r.err);
    r.assert_hides(&token);
    all_bearer(&proxy);

    // From the client secret flow: the refused token is dropped and one new one asked for
    // (refused too), then the same message.
    let server = TokenServer::start();
    server.set_audience("https://vault.azure.net");
    let origin = server.origin();
    let vars = client_secret_vars(&endpoint, &origin, entra::CLIENT_SECRET);
    let r = run(&vars, c.as_str(), &["show", "init/schema"]);
    assert!(!r.ok, "{}{}", r.out, r.err);
    assert!(r.err.contains("storage refused the token"), "{}", r.err);
    assert_eq!(server.count_of(TokenKind::ClientCredentials), 2);
    all_bearer(&proxy);
}
