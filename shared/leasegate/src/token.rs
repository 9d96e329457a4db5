//! Microsoft Entra ID access tokens for Blob storage (`Authorization: Bearer`), for accounts
//! whose Shared Key access is turned off.
//!
//! Sans-IO like the rest of the crate: a [`TokenSource`] says where tokens come from and builds
//! the token request ([`TokenSource::request`]) and reads its answer ([`TokenSource::parse`]);
//! whoever sends requests (a [`Transport`]) fetches, keeps and refreshes tokens
//! ([`Transport::access_token`]). The token is an input of each storage request, like the clock.
//!
//! Two sources fetch tokens:
//! * [`ManagedIdentity`]: the identity endpoint of Azure Functions and App Service
//!   (`IDENTITY_ENDPOINT`, `IDENTITY_HEADER`, api-version 2019-08-01);
//! * [`ClientSecret`]: a service principal's client secret (OAuth 2.0 client credentials at
//!   `{authority}/{tenant}/oauth2/v2.0/token`), anywhere.
//!
//! Tokens, client secrets and identity headers are secrets: their `Debug` output is redacted,
//! they have no `Display`, and no error message of this crate holds them.

use std::time::{Duration, SystemTime};

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

use crate::error::{status_name, Error};
use crate::message::{Method, Request, Response};
use crate::Transport;

/// Where a token could not be had (kept with the crate's other errors).
pub use crate::error::TokenError;

/// The resource a managed identity token is asked for (Azure Storage).
pub const STORAGE_RESOURCE: &str = "https://storage.azure.com/";
/// The scope a client-credentials token is asked for (Azure Storage).
pub const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";
/// The identity endpoint's API version (Azure Functions, App Service).
pub const IDENTITY_API_VERSION: &str = "2019-08-01";
/// Microsoft Entra ID's public-cloud authority (the token endpoint's origin).
pub const PUBLIC_AUTHORITY: &str = "https://login.microsoftonline.com";

/// A bearer access token. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessToken(String);

impl AccessToken {
    /// Takes a token (a JWT as Entra ID issues them): 1 to 16,384 visible ASCII characters.
    pub fn try_new(token: &str) -> Result<Self, Error> {
        let token = token.trim();
        if token.is_empty() || token.len() > 16_384 || !token.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(Error::InvalidArgument(
                "an access token is 1 to 16384 visible ASCII characters".into(),
            ));
        }
        Ok(AccessToken(token.to_string()))
    }

    /// The token, for an `Authorization` header. Handle with care: it is a secret.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessToken(<redacted>)")
    }
}

/// A secret value of a token source (an identity header, a client secret). `Debug` never
/// shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Hidden(String);

impl Hidden {
    /// Takes a secret: not empty, visible ASCII (it travels in a header or a form body).
    pub fn try_new(what: &str, value: &str) -> Result<Self, Error> {
        let value = value.trim();
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Error::InvalidArgument(format!(
                "{what} must be visible ASCII characters, not empty"
            )));
        }
        Ok(Hidden(value.to_string()))
    }

    fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Hidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The managed identity of an Azure Functions or App Service app: the platform's identity
/// endpoint, reached with its rotating header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedIdentity {
    endpoint: String,
    header: Hidden,
    client_id: Option<String>,
}

impl ManagedIdentity {
    /// The identity endpoint (`IDENTITY_ENDPOINT`), its header (`IDENTITY_HEADER`), and the
    /// client id of a user-assigned identity (`None`: the system-assigned one).
    pub fn new(endpoint: &str, header: &str, client_id: Option<&str>) -> Result<Self, Error> {
        let endpoint = endpoint.trim();
        check_url(endpoint, "the identity endpoint")?;
        let client_id = client_id.map(str::trim).filter(|c| !c.is_empty());
        if let Some(id) = client_id {
            check_id(id, "the identity's client id")?;
        }
        Ok(ManagedIdentity {
            endpoint: endpoint.to_string(),
            header: Hidden::try_new("the identity header", header)?,
            client_id: client_id.map(str::to_string),
        })
    }
}

/// A service principal's client secret: the OAuth 2.0 client credentials flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSecret {
    authority: String,
    tenant: String,
    client_id: String,
    secret: Hidden,
}

impl ClientSecret {
    /// The authority (`https://login.microsoftonline.com` in the public cloud, see
    /// [`PUBLIC_AUTHORITY`]; `scheme://host[:port]`), the tenant (its id or domain), the
    /// application's client id and its secret.
    pub fn new(
        authority: &str,
        tenant: &str,
        client_id: &str,
        secret: &str,
    ) -> Result<Self, Error> {
        let authority = authority.trim().trim_end_matches('/');
        check_url(authority, "the authority")?;
        if authority
            .split_once("://")
            .is_some_and(|(_, rest)| rest.contains(['/', '?', '#']))
        {
            return Err(Error::InvalidArgument(
                "the authority is an origin (scheme://host[:port]), without a path".into(),
            ));
        }
        let tenant = tenant.trim();
        check_id(tenant, "the tenant")?;
        let client_id = client_id.trim();
        check_id(client_id, "the client id")?;
        Ok(ClientSecret {
            authority: authority.to_string(),
            tenant: tenant.to_string(),
            client_id: client_id.to_string(),
            secret: Hidden::try_new("the client secret", secret)?,
        })
    }
}

/// An absolute `http` or `https` URL of visible ASCII with a host.
fn check_url(url: &str, what: &str) -> Result<(), Error> {
    let host = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .map(|rest| &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())]);
    if host.is_none_or(str::is_empty) || !url.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::InvalidArgument(format!(
            "{what} is not an absolute http or https URL"
        )));
    }
    Ok(())
}

/// A tenant or client id: a GUID or a domain name (letters, digits, `-`, `.`), 1 to 253 bytes.
fn check_id(id: &str, what: &str) -> Result<(), Error> {
    let ok = !id.is_empty()
        && id.len() <= 253
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what} is a GUID or a domain name (letters, digits, '-', '.')"
        )))
    }
}

/// Where the bearer tokens of a [`Credential::Bearer`](crate::Credential::Bearer) account
/// come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// One token, used as it is (one from `az account get-access-token --resource
    /// https://storage.azure.com/`, say): never refreshed.
    Fixed(AccessToken),
    /// The app's managed identity.
    ManagedIdentity(ManagedIdentity),
    /// A service principal's client secret.
    ClientSecret(ClientSecret),
}

/// A token and when it stops being valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// The token.
    pub value: AccessToken,
    /// When storage stops accepting it (the token endpoint's word, by the caller's clock).
    pub expires_at: SystemTime,
}

/// How long a token lives when its answer does not say (Entra ID's tokens last about an hour;
/// assuming less only means asking earlier).
const ASSUMED_LIFETIME: Duration = Duration::from_secs(600);
/// The longest a token is kept, whatever its answer says (Entra ID's tokens live one to 24
/// hours).
const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);

impl TokenSource {
    /// A short description for logs and error messages (never a secret): `managed identity`,
    /// `client secret of {client id}`, `fixed token`.
    pub fn describe(&self) -> String {
        match self {
            TokenSource::Fixed(_) => "a fixed token".into(),
            TokenSource::ManagedIdentity(m) => match &m.client_id {
                Some(id) => format!("the managed identity {id}"),
                None => "the managed identity".into(),
            },
            TokenSource::ClientSecret(c) => format!("the client secret of {}", c.client_id),
        }
    }

    /// What tells this source's tokens apart from another's, for a cache key (no secret:
    /// the endpoint or authority, the tenant and the client id; for a managed identity a
    /// digest of the identity header too, since every App Service app has the same endpoint).
    pub fn identity(&self) -> String {
        match self {
            TokenSource::Fixed(_) => "fixed".into(),
            TokenSource::ManagedIdentity(m) => {
                let digest = <sha2::Sha256 as sha2::Digest>::digest(m.header.secret().as_bytes());
                let header: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
                format!(
                    "managed-identity\n{}\n{}\n{header}",
                    m.endpoint,
                    m.client_id.as_deref().unwrap_or("")
                )
            }
            TokenSource::ClientSecret(c) => {
                format!(
                    "client-secret\n{}\n{}\n{}",
                    c.authority, c.tenant, c.client_id
                )
            }
        }
    }

    /// The token request: `None` for a fixed token. The request holds a secret (the identity
    /// header, the client secret): do not log it.
    pub fn request(&self) -> Option<Request> {
        match self {
            TokenSource::Fixed(_) => None,
            TokenSource::ManagedIdentity(m) => {
                let sep = if m.endpoint.contains('?') { '&' } else { '?' };
                let mut uri = format!(
                    "{}{sep}resource={}&api-version={IDENTITY_API_VERSION}",
                    m.endpoint,
                    form(STORAGE_RESOURCE)
                );
                if let Some(id) = &m.client_id {
                    uri.push_str(&format!("&client_id={}", form(id)));
                }
                Some(
                    Request::new(Method::GET, uri)
                        .with_header("x-identity-header", m.header.secret())
                        .with_header("accept", "application/json"),
                )
            }
            TokenSource::ClientSecret(c) => {
                let body = format!(
                    "grant_type=client_credentials&client_id={}&client_secret={}&scope={}",
                    form(&c.client_id),
                    form(c.secret.secret()),
                    form(STORAGE_SCOPE)
                );
                Some(
                    Request::new(
                        Method::POST,
                        format!("{}/{}/oauth2/v2.0/token", c.authority, c.tenant),
                    )
                    .with_header("content-type", "application/x-www-form-urlencoded")
                    .with_header("accept", "application/json")
                    .with_header("content-length", body.len().to_string())
                    .with_body(body.into_bytes()),
                )
            }
        }
    }

    /// Reads the token endpoint's answer, `now` being when the request was sent (by the
    /// caller's clock; `expires_in` counts from it). A refusal is [`Error::Token`], retryable
    /// for 408, 429 and 5xx; its message names the endpoint's error code, never a secret.
    pub fn parse(&self, response: &Response, now: SystemTime) -> Result<Token, Error> {
        let status = response.status();
        let body: serde_json::Value =
            serde_json::from_slice(response.body()).unwrap_or(serde_json::Value::Null);
        if !status.is_success() {
            let retryable =
                status.as_u16() == 408 || status.as_u16() == 429 || status.is_server_error();
            let mut message = format!("{} answered {}", self.endpoint_name(), status_name(status));
            if let Some(code) = body.get("error").and_then(short_word) {
                message.push_str(&format!(": {code}"));
            }
            if let Some(aadsts) = body
                .get("error_description")
                .and_then(serde_json::Value::as_str)
                .and_then(|d| {
                    d.split(|c: char| !c.is_ascii_alphanumeric())
                        .find(|w| w.starts_with("AADSTS"))
                })
            {
                message.push_str(&format!(" ({aadsts})"));
            }
            return Err(Error::Token(TokenError { message, retryable }));
        }
        let unreadable = |what: &str| {
            Error::Token(TokenError {
                message: format!(
                    "{} answered {}: {what}",
                    self.endpoint_name(),
                    status_name(status)
                ),
                retryable: true,
            })
        };
        let value = body
            .get("access_token")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| unreadable("no access_token"))?;
        let value =
            AccessToken::try_new(value).map_err(|_| unreadable("an unusable access_token"))?;
        let seconds = |field: &str| {
            let v = body.get(field)?;
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse::<u64>().ok()))
        };
        // At most MAX_LIFETIME ahead: an absurd answer neither overflows the clock nor keeps
        // a token for ever.
        let latest = now + MAX_LIFETIME;
        let expires_at = match (seconds("expires_on"), seconds("expires_in")) {
            (Some(on), _) => SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(on)),
            (None, Some(secs)) => now.checked_add(Duration::from_secs(secs)),
            (None, None) => Some(now + ASSUMED_LIFETIME),
        }
        .map_or(latest, |at| at.min(latest));
        Ok(Token { value, expires_at })
    }

    fn endpoint_name(&self) -> &'static str {
        match self {
            TokenSource::ClientSecret(_) => "the token endpoint",
            _ => "the identity endpoint",
        }
    }
}

/// An endpoint's error code (`invalid_client`): a short word of letters, digits, `_` and `-`.
fn short_word(value: &serde_json::Value) -> Option<&str> {
    value.as_str().filter(|s| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// `value` percent-encoded for a query or a form body.
fn form(value: &str) -> String {
    utf8_percent_encode(value, NON_ALPHANUMERIC).to_string()
}

/// Fetches a token from `source` through `transport`, `now` being the time of the request:
/// a fixed token as it is. Keeps nothing: see [`Transport::access_token`] for a transport that
/// keeps tokens.
pub async fn fetch<T: Transport + ?Sized>(
    transport: &T,
    source: &TokenSource,
    now: SystemTime,
) -> Result<Token, Error> {
    if let TokenSource::Fixed(token) = source {
        // A fixed token's expiry is unknown: storage says when it refuses it.
        return Ok(Token {
            value: token.clone(),
            expires_at: SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(u32::MAX)),
        });
    }
    let Some(request) = source.request() else {
        return Err(Error::InvalidArgument(
            "this token source makes no request".into(),
        ));
    };
    let response = transport.send(request).await.map_err(|e| {
        Error::Token(TokenError {
            message: format!("{} could not be reached: {e}", source.endpoint_name()),
            retryable: true,
        })
    })?;
    source.parse(&response, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::StatusCode;

    fn client_secret() -> TokenSource {
        TokenSource::ClientSecret(
            ClientSecret::new(
                "https://login.microsoftonline.com/",
                "contoso.onmicrosoft.com",
                "00000000-0000-0000-0000-0000000000aa",
                "s3cr3t&value=x",
            )
            .unwrap(),
        )
    }

    #[test]
    fn managed_identity_request() {
        let source = TokenSource::ManagedIdentity(
            ManagedIdentity::new(
                "http://127.0.0.1:41741/MSI/token/",
                "hdr-secret",
                Some("abc-1"),
            )
            .unwrap(),
        );
        let r = source.request().unwrap();
        assert_eq!(r.method().as_str(), "GET");
        assert_eq!(
            r.uri(),
            "http://127.0.0.1:41741/MSI/token/?resource=https%3A%2F%2Fstorage%2Eazure%2Ecom%2F&api-version=2019-08-01&client_id=abc%2D1"
        );
        assert_eq!(r.headers().get("x-identity-header"), Some("hdr-secret"));
        let dbg = format!("{source:?}");
        assert!(!dbg.contains("hdr-secret"), "{dbg}");
        assert_eq!(source.describe(), "the managed identity abc-1");
        assert!(!source.identity().contains("hdr-secret"));
    }

    #[test]
    fn client_secret_request() {
        let source = client_secret();
        let r = source.request().unwrap();
        assert_eq!(r.method().as_str(), "POST");
        assert_eq!(
            r.uri(),
            "https://login.microsoftonline.com/contoso.onmicrosoft.com/oauth2/v2.0/token"
        );
        assert_eq!(
            std::str::from_utf8(r.body()).unwrap(),
            "grant_type=client_credentials&client_id=00000000%2D0000%2D0000%2D0000%2D0000000000aa\
             &client_secret=s3cr3t%26value%3Dx&scope=https%3A%2F%2Fstorage%2Eazure%2Ecom%2F%2Edefault"
        );
        assert_eq!(
            r.headers().get("content-type"),
            Some("application/x-www-form-urlencoded")
        );
        let dbg = format!("{source:?}");
        assert!(!dbg.contains("s3cr3t"), "{dbg}");
        assert!(!source.identity().contains("s3cr3t"));
    }

    #[test]
    fn bad_sources_are_refused_without_echoing_secrets() {
        for (authority, tenant, client) in [
            ("login.microsoftonline.com", "t", "c"),
            ("https://login.microsoftonline.com/path", "t", "c"),
            ("https://login.microsoftonline.com", "t/x", "c"),
            ("https://login.microsoftonline.com", "t", ""),
        ] {
            let e = ClientSecret::new(authority, tenant, client, "topsecret").unwrap_err();
            assert!(!e.to_string().contains("topsecret"), "{e}");
        }
        let e = ClientSecret::new(PUBLIC_AUTHORITY, "t", "c", "bad secret").unwrap_err();
        assert!(!e.to_string().contains("bad secret"), "{e}");
        assert!(ManagedIdentity::new("ftp://x", "h", None).is_err());
        assert!(ManagedIdentity::new("http://x/t", "", None).is_err());
        assert!(AccessToken::try_new("").is_err());
        assert!(AccessToken::try_new("a b").is_err());
        assert_eq!(
            format!("{:?}", AccessToken::try_new("eyJ.x.y").unwrap()),
            "AccessToken(<redacted>)"
        );
    }

    #[test]
    fn answers_are_read() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let source = client_secret();
        let ok = Response::new(StatusCode::OK).with_body(
            br#"{"token_type":"Bearer","expires_in":3599,"access_token":"eyJ.a.b"}"#.to_vec(),
        );
        let token = source.parse(&ok, now).unwrap();
        assert_eq!(token.value.secret(), "eyJ.a.b");
        assert_eq!(token.expires_at, now + Duration::from_secs(3599));

        // The identity endpoint: expires_on, Unix seconds as a string.
        let ok = Response::new(StatusCode::OK).with_body(
            br#"{"access_token":"eyJ.c.d","expires_on":"1000900","resource":"https://storage.azure.com/","token_type":"Bearer"}"#.to_vec(),
        );
        let token = source.parse(&ok, now).unwrap();
        assert_eq!(
            token.expires_at,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_900)
        );

        let refused = Response::new(StatusCode::UNAUTHORIZED).with_body(
            br#"{"error":"invalid_client","error_description":"AADSTS7000215: Invalid client secret provided. s3cr3t"}"#.to_vec(),
        );
        match source.parse(&refused, now) {
            Err(Error::Token(e)) => {
                assert_eq!(
                    e.message,
                    "the token endpoint answered 401 Unauthorized: invalid_client (AADSTS7000215)"
                );
                assert!(!e.retryable);
            }
            other => panic!("{other:?}"),
        }
        let busy = Response::new(StatusCode::SERVICE_UNAVAILABLE).with_body(b"<html>".to_vec());
        match source.parse(&busy, now) {
            Err(Error::Token(e)) => assert!(e.retryable, "{e}"),
            other => panic!("{other:?}"),
        }
        let empty = Response::new(StatusCode::OK).with_body(b"{}".to_vec());
        assert!(matches!(source.parse(&empty, now), Err(Error::Token(_))));
    }

    #[test]
    fn an_expiry_out_of_range_is_no_panic_and_no_token_kept_for_ever() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let source = client_secret();
        for body in [
            r#"{"access_token":"eyJ.a.b","expires_on":18446744073709551615}"#,
            r#"{"access_token":"eyJ.a.b","expires_in":"18446744073709551615"}"#,
            r#"{"access_token":"eyJ.a.b","expires_on":"99999999999"}"#,
        ] {
            let answer = Response::new(StatusCode::OK).with_body(body.as_bytes().to_vec());
            let token = source.parse(&answer, now).unwrap();
            assert!(
                token.expires_at <= now + MAX_LIFETIME,
                "{body}: kept past the longest lifetime"
            );
        }
    }
}
