//! Storage accounts: connection strings, blob and table endpoints, and credentials.
//!
//! Keys, SAS tokens and bearer tokens are secrets: their `Debug` output is redacted, they have no `Display`,
//! and no error message of this crate ever holds them.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

use crate::Error;

/// Azurite's well-known development account name.
pub const DEV_ACCOUNT_NAME: &str = "devstoreaccount1";
/// Azurite's well-known development account key (public; documented by Microsoft).
pub const DEV_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A storage account key (the decoded bytes). `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AccountKey(Vec<u8>);

impl AccountKey {
    /// Decodes a base64 account key as the portal shows it.
    pub fn try_new(base64_key: &str) -> Result<Self, Error> {
        let bytes = BASE64
            .decode(base64_key.trim())
            .map_err(|_| Error::AccountKey)?;
        if bytes.is_empty() {
            return Err(Error::AccountKey);
        }
        Ok(AccountKey(bytes))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for AccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccountKey(<redacted>)")
    }
}

/// A shared access signature: the query string (without `?`). `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SasToken(String);

impl SasToken {
    /// Takes a SAS token, with or without a leading `?`.
    pub fn try_new(token: &str) -> Result<Self, Error> {
        let token = token.trim().trim_start_matches('?');
        if !token.split('&').any(|p| p.starts_with("sig=")) {
            return Err(Error::ConnectionString(
                "SharedAccessSignature has no sig= parameter".into(),
            ));
        }
        if token
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(Error::ConnectionString(
                "SharedAccessSignature holds whitespace or control characters".into(),
            ));
        }
        Ok(SasToken(token.to_string()))
    }

    /// The query string, to append to a request URL. Handle with care: it is a secret.
    pub fn query(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SasToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SasToken(<redacted>)")
    }
}

/// How requests are authorized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// SharedKey: every request is signed with HMAC-SHA256 of the account key.
    SharedKey(AccountKey),
    /// A shared access signature appended to every request URL.
    Sas(SasToken),
    /// Microsoft Entra ID: `Authorization: Bearer {token}` on every request, the token from
    /// this source. The token is an input of each request, like the clock: the transport
    /// hands it over right before the request is sent ([`crate::Transport::access_token`]),
    /// and a token storage refuses is asked anew once. For accounts whose Shared Key access
    /// is turned off.
    Bearer(crate::token::TokenSource),
}

/// The blob service endpoint: `https://{account}.blob.core.windows.net` (host style) or
/// `http://127.0.0.1:10000/devstoreaccount1` (path style, as Azurite serves it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobEndpoint {
    /// `http` or `https`.
    scheme: String,
    authority: String,
    /// The path prefix without trailing slash: empty for host style, `/devstoreaccount1` for
    /// path style.
    base_path: String,
}

/// Parses a service endpoint URL (`scheme://host[:port][/account]`) into its scheme
/// (lowercased), authority and base path (no trailing slash). A query or fragment is refused.
fn parse_endpoint(url: &str) -> Result<(String, String, String), Error> {
    let url = url.trim();
    let (scheme, rest) = crate::message::split_scheme(url)
        .filter(|(s, _)| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric()))
        .ok_or_else(|| Error::Endpoint("no scheme (http:// or https://)".into()))?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(Error::Endpoint("scheme must be http or https".into()));
    }
    let (authority, path) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    if authority.is_empty() {
        return Err(Error::Endpoint("no host".into()));
    }
    if authority.contains('@') {
        return Err(Error::Endpoint(
            "user info in the URL is not allowed".into(),
        ));
    }
    if path.contains('?') {
        return Err(Error::Endpoint(
            "a query is not allowed in an endpoint (give a SAS separately)".into(),
        ));
    }
    if path.contains('#') {
        return Err(Error::Endpoint(
            "a fragment is not allowed in an endpoint".into(),
        ));
    }
    let host_ok = authority
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~:[]".contains(&b));
    if !host_ok || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::Endpoint("not a URL".into()));
    }
    Ok((
        scheme,
        authority.to_string(),
        path.trim_end_matches('/').to_string(),
    ))
}

impl BlobEndpoint {
    /// Parses an endpoint URL (`scheme://host[:port][/account]`). A query or fragment is refused.
    pub fn try_new(url: &str) -> Result<Self, Error> {
        let (scheme, authority, base_path) = parse_endpoint(url)?;
        Ok(BlobEndpoint {
            scheme,
            authority,
            base_path,
        })
    }

    /// The standard Azure endpoint `{protocol}://{account}.blob.{suffix}`.
    pub fn azure(protocol: &str, account: &str, suffix: &str) -> Result<Self, Error> {
        Self::try_new(&format!("{protocol}://{account}.blob.{suffix}"))
    }

    /// The origin (`scheme://host[:port]`), as Spin's `allowed_outbound_hosts` wants it.
    pub fn origin(&self) -> String {
        format!("{}://{}", self.scheme, self.authority)
    }

    /// The endpoint's URL in full, origin and base path, without a trailing slash:
    /// `https://acct.blob.core.windows.net`, `http://127.0.0.1:10000/devstoreaccount1`. Two
    /// accounts behind one origin (path style) differ here.
    pub fn base_url(&self) -> String {
        self.url("")
    }

    /// True for path-style endpoints (the account is the first path segment).
    pub fn is_path_style(&self) -> bool {
        !self.base_path.is_empty()
    }

    /// The URL of a path below the endpoint; `encoded_path` starts with `/` and is already
    /// percent-encoded.
    pub(crate) fn url(&self, encoded_path: &str) -> String {
        format!(
            "{}://{}{}{}",
            self.scheme, self.authority, self.base_path, encoded_path
        )
    }
}

/// The Table service endpoint: `https://{account}.table.core.windows.net` (host style) or
/// `http://127.0.0.1:10002/devstoreaccount1` (path style, as Azurite's table emulator serves
/// it). Parsed by the same rules as a [`BlobEndpoint`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableEndpoint {
    scheme: String,
    authority: String,
    base_path: String,
}

impl TableEndpoint {
    /// Parses an endpoint URL (`scheme://host[:port][/account]`). A query or fragment is refused.
    pub fn try_new(url: &str) -> Result<Self, Error> {
        let (scheme, authority, base_path) = parse_endpoint(url)?;
        Ok(TableEndpoint {
            scheme,
            authority,
            base_path,
        })
    }

    /// The standard Azure endpoint `{protocol}://{account}.table.{suffix}`.
    pub fn azure(protocol: &str, account: &str, suffix: &str) -> Result<Self, Error> {
        Self::try_new(&format!("{protocol}://{account}.table.{suffix}"))
    }

    /// The origin (`scheme://host[:port]`), as Spin's `allowed_outbound_hosts` wants it.
    pub fn origin(&self) -> String {
        format!("{}://{}", self.scheme, self.authority)
    }

    /// The endpoint's URL in full, origin and base path, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.url("")
    }

    /// True for path-style endpoints (the account is the first path segment).
    pub fn is_path_style(&self) -> bool {
        !self.base_path.is_empty()
    }

    /// The URL of a path below the endpoint; `encoded_path` starts with `/` and is already
    /// percent-encoded.
    pub(crate) fn url(&self, encoded_path: &str) -> String {
        format!(
            "{}://{}{}{}",
            self.scheme, self.authority, self.base_path, encoded_path
        )
    }
}

/// A storage account: its name, blob endpoint, table endpoint (if known) and credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    name: String,
    endpoint: BlobEndpoint,
    table_endpoint: Option<TableEndpoint>,
    credential: Credential,
}

impl Account {
    /// An account from its parts, with no table endpoint ([`Account::with_table_endpoint`]
    /// adds one). SharedKey needs the real account name (it is signed).
    pub fn new(name: &str, endpoint: BlobEndpoint, credential: Credential) -> Self {
        Account {
            name: name.to_string(),
            endpoint,
            table_endpoint: None,
            credential,
        }
    }

    /// The account with this Table service endpoint (the same credential signs both services'
    /// requests, each by its own rules).
    pub fn with_table_endpoint(mut self, endpoint: TableEndpoint) -> Self {
        self.table_endpoint = Some(endpoint);
        self
    }

    /// Azurite's development account at `endpoint` (for example `http://127.0.0.1:10000/devstoreaccount1`).
    pub fn development(endpoint: &str) -> Result<Self, Error> {
        Ok(Account::new(
            DEV_ACCOUNT_NAME,
            BlobEndpoint::try_new(endpoint)?,
            Credential::SharedKey(AccountKey::try_new(DEV_ACCOUNT_KEY)?),
        ))
    }

    /// Parses an Azure Storage connection string.
    ///
    /// Understands `UseDevelopmentStorage=true` (with optional `DevelopmentStorageProxyUri`),
    /// `DefaultEndpointsProtocol`, `AccountName`, `AccountKey`, `EndpointSuffix`,
    /// `BlobEndpoint`, `TableEndpoint` and `SharedAccessSignature`; the queue, file and DFS
    /// endpoints are ignored. Keys are case-insensitive; values may contain `=`. Error messages
    /// name keys, never values.
    ///
    /// The table endpoint is `TableEndpoint` when given; else, for development storage,
    /// Azurite's `http://127.0.0.1:10002/devstoreaccount1`; else, with an `AccountName`, the
    /// standard `{protocol}://{account}.table.{suffix}`; else (a SAS and a blob endpoint only)
    /// there is none.
    pub fn from_connection_string(s: &str) -> Result<Self, Error> {
        let mut protocol = None;
        let mut name = None;
        let mut key = None;
        let mut suffix = None;
        let mut blob_endpoint = None;
        let mut table_endpoint = None;
        let mut sas = None;
        let mut dev = false;
        let mut dev_proxy = None;
        for (index, part) in s
            .split(';')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .enumerate()
        {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                Error::ConnectionString("a setting has no '=' (expected Key=Value;...)".into())
            })?;
            let v = v.trim();
            match k.trim().to_ascii_lowercase().as_str() {
                "defaultendpointsprotocol" => protocol = Some(v.to_ascii_lowercase()),
                "accountname" => name = Some(v.to_string()),
                "accountkey" => key = Some(v.to_string()),
                "endpointsuffix" => suffix = Some(v.to_string()),
                "blobendpoint" => blob_endpoint = Some(v.to_string()),
                "sharedaccesssignature" => sas = Some(v.to_string()),
                "usedevelopmentstorage" => {
                    dev = v.eq_ignore_ascii_case("true");
                    if !dev && !v.eq_ignore_ascii_case("false") {
                        return Err(Error::ConnectionString(
                            "UseDevelopmentStorage must be true or false".into(),
                        ));
                    }
                }
                "developmentstorageproxyuri" => dev_proxy = Some(v.to_string()),
                "tableendpoint" => table_endpoint = Some(v.to_string()),
                "queueendpoint" | "fileendpoint" | "dfsendpoint" => {}
                // The name is not echoed: a value that lost its `Key=` (an account key, a SAS)
                // would be the name.
                _ => {
                    return Err(Error::ConnectionString(format!(
                        "setting #{} is not one of AccountName, AccountKey, \
                         DefaultEndpointsProtocol, EndpointSuffix, BlobEndpoint, \
                         TableEndpoint, SharedAccessSignature, UseDevelopmentStorage",
                        index + 1
                    )))
                }
            }
        }
        if dev {
            let base = dev_proxy.unwrap_or_else(|| "http://127.0.0.1".into());
            let base = base.trim_end_matches('/');
            let endpoint =
                blob_endpoint.unwrap_or_else(|| format!("{base}:10000/{DEV_ACCOUNT_NAME}"));
            let table =
                table_endpoint.unwrap_or_else(|| format!("{base}:10002/{DEV_ACCOUNT_NAME}"));
            return Ok(Account::new(
                DEV_ACCOUNT_NAME,
                BlobEndpoint::try_new(&endpoint)?,
                Credential::SharedKey(AccountKey::try_new(DEV_ACCOUNT_KEY)?),
            )
            .with_table_endpoint(TableEndpoint::try_new(&table)?));
        }
        let credential = match (key, sas) {
            (Some(_), Some(_)) => {
                return Err(Error::ConnectionString(
                    "give AccountKey or SharedAccessSignature, not both".into(),
                ))
            }
            (Some(k), None) => Credential::SharedKey(AccountKey::try_new(&k)?),
            (None, Some(s)) => Credential::Sas(SasToken::try_new(&s)?),
            (None, None) => {
                return Err(Error::ConnectionString(
                    "no credential: AccountKey or SharedAccessSignature is required".into(),
                ))
            }
        };
        let endpoint = match (&blob_endpoint, &name) {
            (Some(url), _) => BlobEndpoint::try_new(url)?,
            (None, Some(n)) => BlobEndpoint::azure(
                protocol.as_deref().unwrap_or("https"),
                n,
                suffix.as_deref().unwrap_or("core.windows.net"),
            )?,
            (None, None) => {
                return Err(Error::ConnectionString(
                    "AccountName or BlobEndpoint is required".into(),
                ))
            }
        };
        if let Some(p) = &protocol {
            if p != "http" && p != "https" {
                return Err(Error::ConnectionString(
                    "DefaultEndpointsProtocol must be http or https".into(),
                ));
            }
        }
        let name = match name {
            Some(n) => n,
            // SharedKey signs the account name, so it must be known.
            None if matches!(credential, Credential::SharedKey(_)) => {
                return Err(Error::ConnectionString(
                    "AccountName is required with AccountKey".into(),
                ))
            }
            None => String::new(),
        };
        let valid_name = (3..=24).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !name.is_empty() && !valid_name {
            return Err(Error::ConnectionString(
                "AccountName must be 3 to 24 lowercase letters and digits".into(),
            ));
        }
        let table = match (&table_endpoint, name.is_empty()) {
            (Some(url), _) => Some(TableEndpoint::try_new(url)?),
            (None, false) => Some(TableEndpoint::azure(
                protocol.as_deref().unwrap_or("https"),
                &name,
                suffix.as_deref().unwrap_or("core.windows.net"),
            )?),
            (None, true) => None,
        };
        let account = Account::new(&name, endpoint, credential);
        Ok(match table {
            Some(table) => account.with_table_endpoint(table),
            None => account,
        })
    }

    /// The account name (empty when only a SAS and an endpoint were given).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The blob endpoint.
    pub fn endpoint(&self) -> &BlobEndpoint {
        &self.endpoint
    }

    /// The Table service endpoint, if the account has one.
    pub fn table_endpoint(&self) -> Option<&TableEndpoint> {
        self.table_endpoint.as_ref()
    }

    /// The credential.
    pub fn credential(&self) -> &Credential {
        &self.credential
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn development_storage() {
        let a = Account::from_connection_string("UseDevelopmentStorage=true").unwrap();
        assert_eq!(a.name(), "devstoreaccount1");
        assert_eq!(a.endpoint().origin(), "http://127.0.0.1:10000");
        assert!(a.endpoint().is_path_style());
        assert_eq!(
            a.endpoint().url("/c/b"),
            "http://127.0.0.1:10000/devstoreaccount1/c/b"
        );
        let table = a.table_endpoint().expect("development storage has tables");
        assert_eq!(table.base_url(), "http://127.0.0.1:10002/devstoreaccount1");
        assert!(table.is_path_style());
        let proxied = Account::from_connection_string(
            "UseDevelopmentStorage=true;DevelopmentStorageProxyUri=http://10.0.0.5",
        )
        .unwrap();
        assert_eq!(
            proxied.table_endpoint().unwrap().base_url(),
            "http://10.0.0.5:10002/devstoreaccount1"
        );
    }

    #[test]
    fn table_endpoints_from_connection_strings() {
        let cs = format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={DEV_ACCOUNT_KEY};\
             BlobEndpoint=http://127.0.0.1:41234/devstoreaccount1;TableEndpoint=http://127.0.0.1:41236/devstoreaccount1/"
        );
        let a = Account::from_connection_string(&cs).unwrap();
        let t = a.table_endpoint().unwrap();
        assert_eq!(t.origin(), "http://127.0.0.1:41236");
        assert_eq!(
            t.url("/Tables"),
            "http://127.0.0.1:41236/devstoreaccount1/Tables"
        );
        // Derived from the account name and suffix when not given.
        let a = Account::from_connection_string(
            "AccountName=myacct;AccountKey=a2V5;EndpointSuffix=core.chinacloudapi.cn",
        )
        .unwrap();
        assert_eq!(
            a.table_endpoint().unwrap().base_url(),
            "https://myacct.table.core.chinacloudapi.cn"
        );
        assert!(!a.table_endpoint().unwrap().is_path_style());
        // A SAS and a blob endpoint only: no table endpoint to guess.
        let a = Account::from_connection_string(
            "BlobEndpoint=https://myacct.blob.core.windows.net;SharedAccessSignature=sv=1&sig=x",
        )
        .unwrap();
        assert_eq!(a.table_endpoint(), None);
        let err = Account::from_connection_string(
            "AccountName=myacct;AccountKey=a2V5;TableEndpoint=ftp://x",
        )
        .unwrap_err();
        assert!(err.to_string().contains("http or https"), "{err}");
        // Not derived by Account::new: only what the caller gives.
        assert_eq!(
            Account::development("http://127.0.0.1:10000/devstoreaccount1")
                .unwrap()
                .table_endpoint(),
            None
        );
    }

    #[test]
    fn endpoints_are_parsed_and_bad_ones_refused() {
        let e = BlobEndpoint::try_new(" HTTPS://acct.blob.core.windows.net/ ").unwrap();
        assert_eq!(e.origin(), "https://acct.blob.core.windows.net");
        assert!(!e.is_path_style());
        let e = BlobEndpoint::try_new("http://[::1]:10000/devstoreaccount1/").unwrap();
        assert_eq!(e.url("/c"), "http://[::1]:10000/devstoreaccount1/c");
        for (url, why) in [
            ("127.0.0.1:10000/devstoreaccount1", "no scheme"),
            ("ftp://host", "scheme must be http or https"),
            ("http://", "no host"),
            ("http:///path", "no host"),
            ("http://user:pw@host", "user info"),
            ("http://host/a?sv=1&sig=x", "a query is not allowed"),
            ("http://host/a#frag", "a fragment is not allowed"),
            ("http://ho st/a", "not a URL"),
            ("http://host/a b", "not a URL"),
            ("http://host/\u{e9}", "not a URL"),
        ] {
            match BlobEndpoint::try_new(url) {
                Err(Error::Endpoint(m)) => assert!(m.contains(why), "{url}: {m}"),
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn azurite_explicit_endpoint() {
        let cs = format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={DEV_ACCOUNT_KEY};BlobEndpoint=http://127.0.0.1:41234/devstoreaccount1;"
        );
        let a = Account::from_connection_string(&cs).unwrap();
        assert_eq!(a.endpoint().origin(), "http://127.0.0.1:41234");
        assert!(matches!(a.credential(), Credential::SharedKey(_)));
    }

    #[test]
    fn azure_host_style_with_suffix() {
        let cs = "DefaultEndpointsProtocol=https;AccountName=myacct;AccountKey=a2V5;EndpointSuffix=core.chinacloudapi.cn";
        let a = Account::from_connection_string(cs).unwrap();
        assert_eq!(
            a.endpoint().origin(),
            "https://myacct.blob.core.chinacloudapi.cn"
        );
        assert!(!a.endpoint().is_path_style());
        assert_eq!(
            a.endpoint().url("/c"),
            "https://myacct.blob.core.chinacloudapi.cn/c"
        );
    }

    #[test]
    fn sas_connection_string() {
        let cs = "BlobEndpoint=https://myacct.blob.core.windows.net/;SharedAccessSignature=sv=2021-12-02&sr=c&sp=rwdl&sig=abc%3D";
        let a = Account::from_connection_string(cs).unwrap();
        match a.credential() {
            Credential::Sas(t) => assert_eq!(t.query(), "sv=2021-12-02&sr=c&sp=rwdl&sig=abc%3D"),
            other => panic!("expected SAS, got {other:?}"),
        }
        assert_eq!(
            a.endpoint().url("/c/b"),
            "https://myacct.blob.core.windows.net/c/b"
        );
    }

    #[test]
    fn errors_name_keys_not_values() {
        let cases = [
            ("AccountName=myacct", "no credential"),
            ("AccountName=myacct;AccountKey=!!notbase64!!", "not base64"),
            ("AccountKey=a2V5", "AccountName or BlobEndpoint"),
            (
                "AccountName=myacct;AccountKey=a2V5;Bogus=supersecretvalue",
                "setting #3 is not one of",
            ),
            // A key that lost its `AccountKey=`: its text is the setting's name.
            (
                "AccountName=myacct;supersecretvalue+KEY/part=",
                "setting #2 is not one of",
            ),
            ("justgarbage", "no '='"),
            ("AccountName=MyAcct;AccountKey=a2V5", "lowercase"),
            (
                "BlobEndpoint=ftp://x;AccountName=a1b;AccountKey=a2V5",
                "http or https",
            ),
        ];
        for (cs, want) in cases {
            let err = Account::from_connection_string(cs).unwrap_err().to_string();
            assert!(err.contains(want), "{cs}: {err}");
            assert!(
                !err.to_ascii_lowercase().contains("supersecretvalue") && !err.contains("a2V5"),
                "{err}"
            );
        }
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let cs = "AccountName=myacct;AccountKey=c2VjcmV0a2V5";
        let a = Account::from_connection_string(cs).unwrap();
        let dbg = format!("{a:?}");
        assert!(dbg.contains("AccountKey(<redacted>)"), "{dbg}");
        assert!(
            !dbg.contains("c2VjcmV0a2V5") && !dbg.contains("115, 101, 99"),
            "{dbg}"
        );
        for bad in ["", "?", "sv=1", "sv=1&xsig=abc", "sv=1&sig=a b"] {
            assert!(SasToken::try_new(bad).is_err(), "{bad}");
        }
        assert!(SasToken::try_new("sig=abc&sv=1").is_ok());
        let sas = SasToken::try_new("?sv=1&sig=topsecret").unwrap();
        assert_eq!(format!("{sas:?}"), "SasToken(<redacted>)");
    }
}
