//! A throwaway test CA and a server certificate it signed, for the proxy's TLS modes
//! ([`crate::proxy::Proxy::start_tls`], and a TLS upstream such as Azurite with `--oauth
//! basic`, [`crate::Azurite::start_oauth`]): the app under `spin up` reaches storage over HTTPS when
//! its runtime config trusts the CA (`[[client_tls]]` with `ca_roots_file`, see
//! [`client_tls_runtime_config`]).
//!
//! Spin trusts a private CA only for a certificate that CA signed: a self-signed server
//! certificate that is its own CA fails the handshake. Both certificates are valid from a day
//! ago (so a `faketime` instance behind the real clock still accepts them) for ten years. One
//! CA per test process, made on first use; its PEM is written to a file of its own per app
//! ([`TestCa::write_ca_pem`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The names the server certificate is valid for.
pub const SERVER_NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

/// How far back the certificates' validity starts.
pub const BACKDATED: Duration = Duration::from_secs(24 * 3600);

/// The test CA and the server certificate it signed.
pub struct TestCa {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    server_chain: Vec<CertificateDer<'static>>,
    server_chain_pem: String,
    server_key: PrivatePkcs8KeyDer<'static>,
    server_key_pem: String,
    server_config: OnceLock<Arc<rustls::ServerConfig>>,
    client_config: OnceLock<Arc<rustls::ClientConfig>>,
}

impl TestCa {
    /// This process's test CA (made once).
    pub fn shared() -> &'static TestCa {
        static CA: OnceLock<TestCa> = OnceLock::new();
        CA.get_or_init(TestCa::generate)
    }

    /// A new CA (ECDSA P-256) and a server certificate for [`SERVER_NAMES`] signed by it, both
    /// valid from [`BACKDATED`] ago.
    pub fn generate() -> TestCa {
        let now = SystemTime::now();
        let from = unix_time(now - BACKDATED);
        let until = unix_time(now + Duration::from_secs(10 * 365 * 24 * 3600));

        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.distinguished_name
            .push(DnType::CommonName, "leasegate throwaway test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        ca.not_before = from;
        ca.not_after = until;
        let ca_key = KeyPair::generate().expect("a CA key");
        let ca_cert = ca.self_signed(&ca_key).expect("self-sign the CA");
        let issuer = Issuer::new(ca, ca_key);

        let mut server = CertificateParams::new(
            SERVER_NAMES
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>(),
        )
        .expect("server params");
        server
            .distinguished_name
            .push(DnType::CommonName, SERVER_NAMES[0]);
        server.is_ca = IsCa::ExplicitNoCa;
        server.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        server.use_authority_key_identifier_extension = true;
        server.not_before = from;
        server.not_after = until;
        let server_key = KeyPair::generate().expect("a server key");
        let server_cert = server
            .signed_by(&server_key, &issuer)
            .expect("sign the server certificate");

        TestCa {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().clone(),
            server_chain: vec![server_cert.der().clone(), ca_cert.der().clone()],
            server_chain_pem: format!("{}{}", server_cert.pem(), ca_cert.pem()),
            server_key: PrivatePkcs8KeyDer::from(server_key.serialize_der()),
            server_key_pem: server_key.serialize_pem(),
            server_config: OnceLock::new(),
            client_config: OnceLock::new(),
        }
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Writes the CA certificate's PEM to `dir/test-ca.pem` and returns that path.
    pub fn write_ca_pem(&self, dir: &Path) -> PathBuf {
        let path = dir.join("test-ca.pem");
        std::fs::write(&path, &self.ca_pem).expect("write the test CA's PEM");
        path
    }

    /// The server certificate then the CA certificate, PEM (what a server such as Azurite's
    /// `--cert` reads).
    pub fn server_chain_pem(&self) -> &str {
        &self.server_chain_pem
    }

    /// The server certificate's private key, PKCS #8 PEM (Azurite's `--key`).
    pub fn server_key_pem(&self) -> &str {
        &self.server_key_pem
    }

    /// Writes [`TestCa::server_chain_pem`] to `dir/server-chain.pem` and
    /// [`TestCa::server_key_pem`] to `dir/server-key.pem`; returns both paths (chain, key).
    pub fn write_server_pems(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let chain = dir.join("server-chain.pem");
        let key = dir.join("server-key.pem");
        std::fs::write(&chain, &self.server_chain_pem).expect("write the server chain's PEM");
        std::fs::write(&key, &self.server_key_pem).expect("write the server key's PEM");
        (chain, key)
    }

    /// The client side's TLS configuration: trusts this CA only, TLS 1.2 and 1.3, ring as the
    /// crypto provider, HTTP/1.1 only (the proxy's TLS upstream).
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.client_config
            .get_or_init(|| {
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let mut roots = rustls::RootCertStore::empty();
                roots
                    .add(self.ca_der.clone())
                    .expect("the test CA as a root");
                let mut config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .expect("protocol versions")
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                Arc::new(config)
            })
            .clone()
    }

    /// The server side's TLS configuration: the server certificate (then the CA), TLS 1.2 and
    /// 1.3, ring as the crypto provider, HTTP/1.1 only.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server_config
            .get_or_init(|| {
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let mut config = rustls::ServerConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .expect("protocol versions")
                    .with_no_client_auth()
                    .with_single_cert(
                        self.server_chain.clone(),
                        PrivateKeyDer::Pkcs8(self.server_key.clone_key()),
                    )
                    .expect("the server certificate and key");
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                Arc::new(config)
            })
            .clone()
    }
}

fn unix_time(t: SystemTime) -> time::OffsetDateTime {
    let secs = t.duration_since(UNIX_EPOCH).expect("after 1970").as_secs();
    time::OffsetDateTime::from_unix_timestamp(secs as i64).expect("a representable time")
}

/// Runtime config text (`spin up --runtime-config-file`): `base` (any runtime config the app
/// already has) with one more `[[client_tls]]` entry trusting `ca_file` for `localhost` (a host
/// without a port: Spin refuses one with a port) from `component_ids`.
pub fn client_tls_runtime_config(
    base: Option<&str>,
    component_ids: &[String],
    ca_file: &Path,
) -> String {
    let mut doc: toml::Table = match base {
        Some(text) => text.parse().expect("the runtime config parses as TOML"),
        None => toml::Table::new(),
    };
    let mut entry = toml::Table::new();
    entry.insert(
        "component_ids".into(),
        toml::Value::Array(component_ids.iter().map(|c| c.clone().into()).collect()),
    );
    entry.insert("hosts".into(), toml::Value::Array(vec!["localhost".into()]));
    entry.insert("ca_roots_file".into(), ca_file.display().to_string().into());
    let list = doc
        .entry("client_tls")
        .or_insert_with(|| toml::Value::Array(Vec::new()));
    list.as_array_mut()
        .expect("client_tls is an array of tables")
        .push(toml::Value::Table(entry));
    toml::to_string(&doc).expect("the runtime config")
}
