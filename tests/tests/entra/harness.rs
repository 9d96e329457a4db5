//! The harness parts for the Entra ID tests, proven to fit black-box before leasegate speaks
//! bearer tokens: an Azurite with `--oauth basic` (HTTPS with the test CA's certificate), the
//! proxy reaching it over TLS, and the token service minting tokens that Azurite accepts.
//! Raw HTTP through the proxy (ureq); SharedKey through leasegate's own transport.

use std::time::{Duration, SystemTime};

use leasegate::lease::{Acquire, Acquiring, Locks, Term};
use leasegate::{Account, ContainerName, LeaseId, LockName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::entra::{
    self, Credential, TokenFault, TokenKind, TokenServer, CLIENT_ID, CLIENT_SECRET,
    IDENTITY_HEADER, STORAGE_AUDIENCE, STORAGE_RESOURCE, STORAGE_SCOPE, TENANT_ID,
};
use leasegate_tests::proxy::{Fault, Proxy};
use leasegate_tests::tls::TestCa;
use leasegate_tests::{unique_container, unix_now, Azurite};

const VERSION: &str = "2021-12-02";

/// An answer: status, `x-ms-error-code` (or the JSON `error`), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    code: Option<String>,
    body: String,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .max_redirects(0)
        .build()
        .into()
}

/// An agent that trusts only the test CA.
fn tls_agent() -> ureq::Agent {
    use ureq::tls::{Certificate, RootCerts, TlsConfig};
    let ca = Certificate::from_pem(TestCa::shared().ca_pem().as_bytes()).expect("the CA's PEM");
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .tls_config(
            TlsConfig::builder()
                .root_certs(RootCerts::new_with_certs(&[ca]))
                .build(),
        )
        .build()
        .into()
}

fn run(agent: &ureq::Agent, request: http::Request<Vec<u8>>) -> Result<Answer, ureq::Error> {
    let response = agent.run(request)?;
    let status = response.status().as_u16();
    let code = response
        .headers()
        .get("x-ms-error-code")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = response.into_body().read_to_string().unwrap_or_default();
    let code = code.or_else(|| {
        serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
    });
    Ok(Answer { status, code, body })
}

/// A blob-service request to `{base}/devstoreaccount1/{path}`, dated now, with `token` as its
/// bearer token (none: no Authorization).
fn storage(
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &[(&str, &str)],
) -> http::Request<Vec<u8>> {
    let mut b = http::Request::builder()
        .method(method)
        .uri(format!("{base}/devstoreaccount1/{path}"))
        .header("x-ms-version", VERSION)
        .header("x-ms-date", httpdate::fmt_http_date(SystemTime::now()))
        .header("content-length", "0");
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    for (k, v) in extra {
        b = b.header(*k, *v);
    }
    b.body(Vec::new()).expect("a request")
}

fn create_container(base: &str, c: &ContainerName, token: Option<&str>) -> Answer {
    let path = format!("{}?restype=container", c.as_str());
    run(&agent(), storage(base, "PUT", &path, token, &[])).expect("an answer")
}

fn put_blob(base: &str, c: &ContainerName, token: Option<&str>) -> Answer {
    let path = format!("{}/lock", c.as_str());
    let extra = [("x-ms-blob-type", "BlockBlob")];
    run(&agent(), storage(base, "PUT", &path, token, &extra)).expect("an answer")
}

fn try_acquire(base: &str, c: &ContainerName, token: Option<&str>) -> Result<Answer, ureq::Error> {
    let path = format!("{}/lock?comp=lease", c.as_str());
    let extra = [
        ("x-ms-lease-action", "acquire"),
        ("x-ms-lease-duration", "15"),
    ];
    run(&agent(), storage(base, "PUT", &path, token, &extra))
}

fn acquire(base: &str, c: &ContainerName, token: Option<&str>) -> Answer {
    try_acquire(base, c, token).expect("an answer")
}

/// A proxy with a plain listener in front of the shared `--oauth basic` Azurite.
fn proxy() -> Proxy {
    let azurite = Azurite::shared_oauth();
    assert!(azurite.is_oauth());
    let proxy = Proxy::start_to_tls(&azurite.authority());
    assert!(!proxy.is_tls() && proxy.is_upstream_tls());
    proxy
}

/// A container (and its blob `lock`) made with a valid token through `proxy`.
fn prepared(proxy: &Proxy, tag: &str) -> ContainerName {
    let c = unique_container(tag);
    let token = entra::mint(Duration::from_secs(600));
    let made = create_container(&proxy.origin(), &c, Some(&token));
    assert_eq!(made.status, 201, "create the container: {made:?}");
    let blob = put_blob(&proxy.origin(), &c, Some(&token));
    assert_eq!(blob.status, 201, "create the blob: {blob:?}");
    c
}

#[test]
fn a_minted_token_creates_and_leases_through_the_tls_upstream() {
    let proxy = proxy();
    let c = unique_container("bearer");
    let token = entra::mint(Duration::from_secs(600));
    let base = proxy.origin();

    let made = create_container(&base, &c, Some(&token));
    assert_eq!(made.status, 201, "{made:?}");
    assert_eq!(put_blob(&base, &c, Some(&token)).status, 201);
    let first = acquire(&base, &c, Some(&token));
    assert_eq!(first.status, 201, "{first:?}");
    let again = acquire(&base, &c, Some(&token));
    assert_eq!(again.status, 409, "{again:?}");
    assert_eq!(again.code.as_deref(), Some("LeaseAlreadyPresent"));

    let seen = proxy.seen();
    assert_eq!(seen.len(), 4);
    assert!(seen.iter().all(|s| s.auth == "Bearer"), "{seen:?}");
    assert_eq!(seen[2].describe(), "lease acquire");
    // The proxy records how a request was authorized, never the token.
    let printed = format!("{seen:?}");
    let payload = token.split('.').nth(1).unwrap();
    assert!(
        !printed.contains(payload),
        "the token leaked into the record"
    );
}

#[test]
fn azurite_refuses_no_token_another_audience_and_an_expired_token() {
    let proxy = proxy();
    let c = prepared(&proxy, "refused");
    let base = proxy.origin();

    let none = acquire(&base, &c, None);
    // Azurite 3.35's answer to an anonymous request on a private container (Azure's own differs
    // by operation: 404 `ResourceNotFound` or 401 `NoAuthenticationInformation`).
    assert_eq!(none.status, 403, "no Authorization: {none:?}");
    assert_eq!(none.code.as_deref(), Some("AuthorizationFailure"));

    let now = unix_now();
    let vault = entra::mint_with("https://vault.azure.net", now - 300, now + 600);
    let other = acquire(&base, &c, Some(&vault));
    assert_eq!(other.status, 403, "another audience: {other:?}");
    assert_eq!(other.code.as_deref(), Some("AuthenticationFailed"));

    let expired = entra::mint_with(STORAGE_AUDIENCE, now - 3600, now - 600);
    let late = acquire(&base, &c, Some(&expired));
    assert_eq!(late.status, 403, "an expired token: {late:?}");
    assert_eq!(late.code.as_deref(), Some("AuthenticationFailed"));

    // Not yet valid either.
    let early = entra::mint_with(STORAGE_AUDIENCE, now + 600, now + 1200);
    let soon = acquire(&base, &c, Some(&early));
    assert_eq!(soon.status, 403, "a token not yet valid: {soon:?}");

    // None of them took the lease: a good token still can.
    let good = entra::mint(Duration::from_secs(600));
    assert_eq!(acquire(&base, &c, Some(&good)).status, 201);
    let auth: Vec<_> = proxy.seen().iter().map(|s| s.auth).collect();
    assert_eq!(
        auth,
        ["Bearer", "Bearer", "none", "Bearer", "Bearer", "Bearer", "Bearer"]
    );
}

#[test]
fn shared_key_still_works_on_the_oauth_azurite() {
    let proxy = proxy();
    let c = unique_container("sharedkey");
    let endpoint = format!("{}/devstoreaccount1", proxy.origin());
    let account = Account::development(&endpoint).expect("an account");
    let locks = Locks::new(NativeTransport::default(), account, c.clone());
    let name = LockName::try_new("jobs/nightly").unwrap();
    let term = Term::for_window(Duration::from_secs(15)).unwrap();
    let id = LeaseId::from_random_bytes(*uuid::Uuid::new_v4().as_bytes());
    let outcome = block_on(locks.acquire(&name, Acquiring::new(term, id), SystemTime::now()))
        .expect("acquire");
    assert!(matches!(outcome, Acquire::Acquired(_)), "{outcome:?}");
    let seen = proxy.seen();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|s| s.auth == "SharedKey"), "{seen:?}");

    // A bearer token and SharedKey meet on the same lock blob (its path as the proxy saw the
    // SharedKey acquire): the token sees the lease.
    let token = entra::mint(Duration::from_secs(600));
    let acquired = seen
        .iter()
        .find(|s| s.describe() == "lease acquire")
        .expect("a lease acquire");
    let prefix = "/devstoreaccount1/";
    let blob = format!("{}?comp=lease", &acquired.path()[prefix.len()..]);
    let extra = [
        ("x-ms-lease-action", "acquire"),
        ("x-ms-lease-duration", "15"),
    ];
    let taken = run(
        &agent(),
        storage(&proxy.origin(), "PUT", &blob, Some(&token), &extra),
    )
    .expect("an answer");
    assert_eq!(taken.status, 409, "{taken:?}");
    assert_eq!(taken.code.as_deref(), Some("LeaseAlreadyPresent"));

    // A service SAS signed with the account key still works too.
    let sas = leasegate_tests::container_sas(&c);
    let url = format!("{}{}?{sas}", proxy.origin(), acquired.path());
    let head = http::Request::builder()
        .method("HEAD")
        .uri(url)
        .header("x-ms-version", VERSION)
        .body(Vec::new())
        .unwrap();
    let props = run(&agent(), head).expect("an answer");
    assert_eq!(props.status, 200, "{props:?}");
    assert_eq!(proxy.seen().last().unwrap().auth, "SAS");
}

#[test]
fn faults_still_act_over_the_tls_upstream() {
    let proxy = proxy();
    let c = prepared(&proxy, "faults");
    let base = proxy.origin();
    let token = entra::mint(Duration::from_secs(600));

    proxy.set_fault(Some(Fault::Status(503)));
    let busy = acquire(&base, &c, Some(&token));
    assert_eq!(busy.status, 503);
    assert_eq!(busy.code.as_deref(), Some("ServerBusy"));

    // The answer is lost: storage acted (the lease is taken), the caller saw a broken
    // connection.
    proxy.set_fault(Some(Fault::LoseAnswer));
    assert!(try_acquire(&base, &c, Some(&token)).is_err());
    proxy.set_fault(None);
    let again = acquire(&base, &c, Some(&token));
    assert_eq!(again.status, 409, "{again:?}");
    assert_eq!(again.code.as_deref(), Some("LeaseAlreadyPresent"));
}

#[test]
fn a_tls_listener_with_a_tls_upstream_and_azurite_directly() {
    let azurite = Azurite::shared_oauth();
    let token = entra::mint(Duration::from_secs(600));

    // Straight to Azurite at its endpoint (`https://localhost:{port}`), trusting the test CA.
    let endpoint = azurite.endpoint();
    assert!(endpoint.starts_with("https://localhost:"), "{endpoint}");
    let base = endpoint.trim_end_matches("/devstoreaccount1");
    let c = unique_container("direct");
    let path = format!("{}?restype=container", c.as_str());
    let made = run(&tls_agent(), storage(base, "PUT", &path, Some(&token), &[])).expect("HTTPS");
    assert_eq!(made.status, 201, "{made:?}");

    // Through a proxy that speaks TLS on both sides.
    let proxy = Proxy::start_tls_to_tls(&azurite.authority());
    assert!(proxy.is_tls() && proxy.is_upstream_tls());
    assert!(proxy.origin().starts_with("https://localhost:"));
    let blob = format!("{}/lock", c.as_str());
    let put = run(
        &tls_agent(),
        storage(
            &proxy.origin(),
            "PUT",
            &blob,
            Some(&token),
            &[("x-ms-blob-type", "BlockBlob")],
        ),
    )
    .expect("HTTPS through the proxy");
    assert_eq!(put.status, 201, "{put:?}");
    let seen = proxy.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].auth, "Bearer");
}

fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
        .into_bytes()
}

fn identity(server: &TokenServer, header: Option<&str>, client_id: Option<&str>) -> Answer {
    let mut url = format!(
        "{}?resource={STORAGE_RESOURCE}&api-version=2019-08-01",
        server.identity_endpoint()
    );
    if let Some(id) = client_id {
        url.push_str(&format!("&client_id={id}"));
    }
    let mut b = http::Request::builder().method("GET").uri(url);
    if let Some(h) = header {
        b = b.header("X-IDENTITY-HEADER", h);
    }
    run(&agent(), b.body(Vec::new()).unwrap()).expect("an answer")
}

fn client_credentials(server: &TokenServer, secret: &str) -> Result<Answer, ureq::Error> {
    let body = form(&[
        ("grant_type", "client_credentials"),
        ("client_id", CLIENT_ID),
        ("client_secret", secret),
        ("scope", STORAGE_SCOPE),
    ]);
    let request = http::Request::builder()
        .method("POST")
        .uri(server.token_endpoint())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .unwrap();
    run(&agent(), request)
}

fn json(a: &Answer) -> serde_json::Value {
    serde_json::from_str(&a.body).expect("a JSON body")
}

#[test]
fn the_token_server_serves_managed_identity_and_client_credentials() {
    let server = TokenServer::start();
    assert!(server.origin().starts_with("http://127.0.0.1:"));
    assert_eq!(
        server.token_endpoint(),
        format!("{}/{TENANT_ID}/oauth2/v2.0/token", server.origin())
    );

    // Managed identity: the header it was started with.
    let mi = identity(&server, Some(IDENTITY_HEADER), None);
    assert_eq!(mi.status, 200, "{mi:?}");
    let v = json(&mi);
    assert_eq!(v["token_type"], "Bearer");
    assert_eq!(v["resource"], STORAGE_RESOURCE);
    assert_eq!(v["client_id"], CLIENT_ID);
    let expires_on: u64 = v["expires_on"].as_str().expect("a string").parse().unwrap();
    let mi_token = v["access_token"].as_str().unwrap().to_string();
    let claims = entra::claims(&mi_token).unwrap();
    assert_eq!(claims["exp"].as_u64(), Some(expires_on));
    assert_eq!(claims["aud"], STORAGE_AUDIENCE);
    // A user-assigned identity by client id.
    assert_eq!(
        identity(&server, Some(IDENTITY_HEADER), Some(CLIENT_ID)).status,
        200
    );
    let unknown = identity(&server, Some(IDENTITY_HEADER), Some("someone-else"));
    assert_eq!(unknown.status, 400, "{unknown:?}");
    // Wrong and missing header.
    let wrong = identity(&server, Some("not-the-header"), None);
    assert_eq!(wrong.status, 401, "{wrong:?}");
    let missing = identity(&server, None, None);
    assert_eq!(missing.status, 400, "{missing:?}");

    // Client credentials.
    let cc = client_credentials(&server, CLIENT_SECRET).expect("an answer");
    assert_eq!(cc.status, 200, "{cc:?}");
    let v = json(&cc);
    assert_eq!(v["token_type"], "Bearer");
    assert_eq!(v["expires_in"], 3599);
    let cc_token = v["access_token"].as_str().unwrap().to_string();
    assert_eq!(entra::claims(&cc_token).unwrap()["aud"], STORAGE_AUDIENCE);
    let bad = client_credentials(&server, "not-the-secret").expect("an answer");
    assert_eq!(bad.status, 401);
    assert_eq!(bad.code.as_deref(), Some("invalid_client"));
    assert!(bad.body.contains("AADSTS7000215"), "{}", bad.body);
    assert!(!bad.body.contains("not-the-secret"));

    // Counts and records (never a secret).
    assert_eq!(server.count(), 7);
    assert_eq!(server.count_of(TokenKind::Identity), 5);
    assert_eq!(server.count_of(TokenKind::ClientCredentials), 2);
    assert_eq!(server.token_count(), 3);
    let credentials: Vec<_> = server.requests().iter().map(|r| r.credential).collect();
    use Credential::*;
    assert_eq!(
        credentials,
        [Matched, Matched, Matched, Wrong, Missing, Matched, Wrong]
    );
    let printed = format!("{:?}", server.requests());
    for secret in [
        IDENTITY_HEADER,
        CLIENT_SECRET,
        "not-the-secret",
        "not-the-header",
    ] {
        assert!(!printed.contains(secret), "a secret in the records");
    }
    let r = &server.requests()[5];
    assert_eq!(r.client_id.as_deref(), Some(CLIENT_ID));
    assert_eq!(r.resource.as_deref(), Some(STORAGE_SCOPE));
    assert_eq!(r.method, "POST");

    // Both tokens work on storage.
    let proxy = proxy();
    let c = unique_container("served");
    assert_eq!(
        create_container(&proxy.origin(), &c, Some(&mi_token)).status,
        201
    );
    assert_eq!(put_blob(&proxy.origin(), &c, Some(&cc_token)).status, 201);

    // A rotated identity header: the old one is refused.
    server.set_identity_header("rotated-header");
    assert_eq!(identity(&server, Some(IDENTITY_HEADER), None).status, 401);
    assert_eq!(identity(&server, Some("rotated-header"), None).status, 200);
}

#[test]
fn the_token_server_is_steered_at_run_time() {
    let server = TokenServer::start();

    // A token about to expire.
    server.set_lifetime(Duration::from_secs(90));
    let v = json(&identity(&server, Some(IDENTITY_HEADER), None));
    let claims = entra::claims(v["access_token"].as_str().unwrap()).unwrap();
    let lifetime = claims["exp"].as_u64().unwrap() - claims["nbf"].as_u64().unwrap();
    assert_eq!(lifetime, 90 + 300, "nbf lies five minutes back");
    let cc = json(&client_credentials(&server, CLIENT_SECRET).unwrap());
    assert_eq!(cc["expires_in"], 90);

    // Another audience: storage refuses it.
    server.set_audience("https://vault.azure.net");
    let v = json(&identity(&server, Some(IDENTITY_HEADER), None));
    let vault = v["access_token"].as_str().unwrap().to_string();
    assert_eq!(
        entra::claims(&vault).unwrap()["aud"],
        "https://vault.azure.net"
    );
    let proxy = proxy();
    let c = prepared(&proxy, "audience");
    let refused = acquire(&proxy.origin(), &c, Some(&vault));
    assert_eq!(refused.status, 403, "{refused:?}");
    assert_eq!(refused.code.as_deref(), Some("AuthenticationFailed"));
    server.clear_audience();

    // Faults: a status, a refused connection, a delay.
    server.set_fault(Some(TokenFault::Status(503)));
    let busy = identity(&server, Some(IDENTITY_HEADER), None);
    assert_eq!(busy.status, 503);
    assert_eq!(busy.code.as_deref(), Some("temporarily_unavailable"));
    server.set_fault(Some(TokenFault::Refuse));
    assert!(client_credentials(&server, CLIENT_SECRET).is_err());
    server.set_fault(Some(TokenFault::Delay(Duration::from_millis(50))));
    assert_eq!(identity(&server, Some(IDENTITY_HEADER), None).status, 200);
    server.set_fault(None);

    let faults: Vec<_> = server
        .requests()
        .into_iter()
        .map(|r| (r.status, r.fault))
        .collect();
    let n = faults.len();
    assert_eq!(
        faults[n - 3..],
        [
            (503, Some(TokenFault::Status(503))),
            (0, Some(TokenFault::Refuse)),
            (200, Some(TokenFault::Delay(Duration::from_millis(50)))),
        ]
    );
    assert_eq!(server.token_count(), 4);
    assert_eq!(server.count(), 6);
}
