//! Request authorization: SharedKey signatures and service SAS tokens.
//!
//! SharedKey follows [Authorize with Shared Key](https://learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key)
//! (Blob service, version 2009-09-19 and later); the service SAS follows
//! [Create a service SAS](https://learn.microsoft.com/rest/api/storageservices/create-service-sas)
//! for `sv` 2020-12-06 and later. Each stage is a pure function so the test vectors can check it
//! on its own: [`canonicalized_headers`], [`canonicalized_resource`], [`string_to_sign`],
//! [`sign`].

use std::collections::BTreeMap;
use std::time::SystemTime;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use percent_encoding::{percent_decode_str, utf8_percent_encode};
use sha2::Sha256;

use crate::account::{Account, AccountKey, Credential};
use crate::message::{valid_header_value, Request};
use crate::names::{BlobName, ContainerName};
use crate::token::{AccessToken, TokenSource};
use crate::Error;

/// The REST API version every request names (`x-ms-version`).
pub const API_VERSION: &str = "2021-12-02";

/// The standard headers of the string to sign, in order, after the verb.
const SIGNED_STANDARD_HEADERS: [&str; 11] = [
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
];

/// Stamps `x-ms-date` (from `now`, a parameter: the core reads no clock) and `x-ms-version`,
/// then authorizes the request with the account's credential: a SharedKey `Authorization`
/// header, the SAS appended to the URL, or a fixed bearer token ([`bearer`]). A bearer
/// credential whose tokens are fetched needs the token: [`authorize_with`].
pub fn authorize(request: &mut Request, account: &Account, now: SystemTime) -> Result<(), Error> {
    authorize_with(request, account, now, None)
}

/// [`authorize`], with the bearer token to use for a [`Credential::Bearer`] account (the
/// transport's, see [`crate::Transport::access_token`]); `None`: the source's fixed token.
pub fn authorize_with(
    request: &mut Request,
    account: &Account,
    now: SystemTime,
    token: Option<&AccessToken>,
) -> Result<(), Error> {
    let headers = request.headers_mut();
    headers.insert("x-ms-date", httpdate::fmt_http_date(now));
    headers.insert("x-ms-version", API_VERSION);
    match account.credential() {
        Credential::SharedKey(key) => sign(request, account.name(), key),
        Credential::Sas(token) => {
            let sep = if request.query().is_some() { '&' } else { '?' };
            let uri = format!("{}{sep}{}", request.uri(), token.query());
            // The token was checked to hold no whitespace or control characters, and the
            // message must not echo the URL, which now holds the SAS.
            if !uri.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Error::InvalidArgument(
                    "SAS token does not fit in a URL".into(),
                ));
            }
            request.set_uri(uri);
            Ok(())
        }
        Credential::Bearer(source) => match (token, source) {
            (Some(token), _) | (None, TokenSource::Fixed(token)) => bearer(request, token),
            (None, source) => Err(Error::InvalidArgument(format!(
                "the tokens of {} are fetched: authorize with the token in hand \
                 (signing::authorize_with)",
                source.describe()
            ))),
        },
    }
}

/// Adds `Authorization: Bearer {token}`; a copy (`x-ms-copy-source`, always a blob of the same
/// account here) also gets `x-ms-copy-source-authorization: Bearer {token}`: with Entra ID,
/// storage authorizes reading the copy's source with that header (version 2020-10-02 and
/// later), not with the destination's authorization.
pub fn bearer(request: &mut Request, token: &AccessToken) -> Result<(), Error> {
    let value = format!("Bearer {}", token.secret());
    if !valid_header_value(&value) {
        return Err(Error::InvalidArgument("invalid access token".into()));
    }
    let headers = request.headers_mut();
    if headers.contains("x-ms-copy-source") {
        headers.insert("x-ms-copy-source-authorization", value.clone());
    }
    headers.insert("authorization", value);
    Ok(())
}

/// Adds `Authorization: SharedKey {account}:{signature}` for the request as it stands.
pub fn sign(request: &mut Request, account_name: &str, key: &AccountKey) -> Result<(), Error> {
    let signature = signature(key, &string_to_sign(request, account_name));
    let value = format!("SharedKey {account_name}:{signature}");
    if !valid_header_value(&value) {
        return Err(Error::InvalidArgument("invalid header value".into()));
    }
    request.headers_mut().insert("authorization", value);
    Ok(())
}

/// `base64(HMAC-SHA256(key, utf8(string_to_sign)))`.
pub fn signature(key: &AccountKey, string_to_sign: &str) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(key.bytes()).expect("HMAC accepts keys of any length");
    mac.update(string_to_sign.as_bytes());
    BASE64.encode(mac.finalize().into_bytes())
}

/// The SharedKey string to sign for the Blob service:
/// `VERB\n` + eleven standard headers, one a line + [`canonicalized_headers`] +
/// [`canonicalized_resource`].
///
/// Quirks handled here: `Content-Length` is empty when zero (version 2015-02-21 and later);
/// `Date` is empty when `x-ms-date` is sent.
pub fn string_to_sign(request: &Request, account_name: &str) -> String {
    let headers = request.headers();
    let mut out = String::with_capacity(256);
    out.push_str(request.method().as_str());
    out.push('\n');
    for name in SIGNED_STANDARD_HEADERS {
        let value = headers.get(name).unwrap_or("");
        let value = match name {
            "content-length" if value == "0" => "",
            "date" if headers.contains("x-ms-date") => "",
            _ => value,
        };
        out.push_str(value);
        out.push('\n');
    }
    out.push_str(&canonicalized_headers(request));
    out.push_str(&canonicalized_resource(request, account_name));
    out
}

/// Every `x-ms-*` header as `name:value\n`, names lowercased and sorted, each value **as it is
/// sent**: trimmed at its ends only (HTTP drops spaces and tabs there on the wire).
///
/// Quirk: the [spec](https://learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key#constructing-the-canonicalized-headers-string)
/// says to replace linear whitespace in a value with one space, but storage, Azurite and the
/// Azure SDKs sign the value as sent: folding `v  w` to `v w` makes storage refuse the
/// request (403 `AuthorizationFailure`).
pub fn canonicalized_headers(request: &Request) -> String {
    let mut pairs: Vec<(String, String)> = request
        .headers()
        .iter()
        .filter(|(name, _)| name.starts_with("x-ms-"))
        .map(|(name, value)| {
            let trimmed = value.trim_matches(|c| c == ' ' || c == '\t');
            (name.to_string(), trimmed.to_string())
        })
        .collect();
    pairs.sort();
    let mut out = String::new();
    for (name, value) in pairs {
        out.push_str(&name);
        out.push(':');
        out.push_str(&value);
        out.push('\n');
    }
    out
}

/// `/{account}{path as sent}` then, for each query parameter sorted by lowercased name,
/// `\nname:value` with the values URL-decoded, sorted and comma-joined.
///
/// On a path-style endpoint (Azurite) the path already starts with the account, so the account
/// appears twice: `/devstoreaccount1/devstoreaccount1/c/b`.
pub fn canonicalized_resource(request: &Request, account_name: &str) -> String {
    let mut out = format!("/{account_name}{}", request.path());
    // Names (lowercased) to their values, sorted by name.
    let mut params: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pair in request.query().unwrap_or("").split('&') {
        if pair.is_empty() {
            continue;
        }
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        // The core writes UTF-8 only; anything else is signed as sent.
        let decode = |s: &str| {
            percent_decode_str(s)
                .decode_utf8()
                .map_or(s.to_string(), Into::into)
        };
        let name = decode(name).to_ascii_lowercase();
        let value = decode(value);
        params.entry(name).or_default().push(value);
    }
    for (name, mut values) in params {
        values.sort();
        out.push('\n');
        out.push_str(&name);
        out.push(':');
        out.push_str(&values.join(","));
    }
    out
}

/// Permissions of a service SAS, written in the canonical order `racwdl`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SasPermissions {
    /// `r`: read content, properties, metadata.
    pub read: bool,
    /// `a`: add (append blocks).
    pub add: bool,
    /// `c`: create new blobs.
    pub create: bool,
    /// `w`: write content, properties, metadata; lease operations.
    pub write: bool,
    /// `d`: delete.
    pub delete: bool,
    /// `l`: list blobs (container SAS only).
    pub list: bool,
}

impl SasPermissions {
    /// Everything leasegate needs on its container: `racwdl`.
    pub fn all() -> Self {
        SasPermissions {
            read: true,
            add: true,
            create: true,
            write: true,
            delete: true,
            list: true,
        }
    }

    /// The `sp` value.
    pub fn as_sp(&self) -> String {
        [
            (self.read, 'r'),
            (self.add, 'a'),
            (self.create, 'c'),
            (self.write, 'w'),
            (self.delete, 'd'),
            (self.list, 'l'),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, c)| *c)
        .collect()
    }
}

/// What a service SAS grants access to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SasResource {
    /// A whole container (`sr=c`).
    Container(ContainerName),
    /// One blob (`sr=b`).
    Blob(ContainerName, BlobName),
}

/// A service SAS to generate from an account key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSas {
    /// What it grants access to.
    pub resource: SasResource,
    /// What it allows.
    pub permissions: SasPermissions,
    /// `st`: valid from (optional).
    pub start: Option<SystemTime>,
    /// `se`: valid until.
    pub expiry: SystemTime,
    /// `spr`: `https` or `https,http` (optional).
    pub protocol: Option<String>,
}

impl ServiceSas {
    /// The string to sign for `sv` 2020-12-06 and later: sixteen fields joined by `\n`, with
    /// `canonicalizedResource = /blob/{account}/{container}[/{blob}]` (the account once, on
    /// Azurite too).
    pub fn string_to_sign(&self, account_name: &str) -> String {
        let (resource, _) = self.resource_and_sr(account_name);
        let fields = [
            self.permissions.as_sp(),
            self.start.map(iso8601).unwrap_or_default(),
            iso8601(self.expiry),
            resource,
            String::new(), // si: signed identifier
            String::new(), // sip: signed IP
            self.protocol.clone().unwrap_or_default(),
            API_VERSION.to_string(),
            self.resource_and_sr(account_name).1.to_string(),
            String::new(), // snapshot time
            String::new(), // ses: encryption scope
            String::new(), // rscc
            String::new(), // rscd
            String::new(), // rsce
            String::new(), // rscl
            String::new(), // rsct
        ];
        fields.join("\n")
    }

    /// Signs the SAS with the account key and returns it as a token.
    pub fn token(
        &self,
        account_name: &str,
        key: &AccountKey,
    ) -> Result<crate::account::SasToken, Error> {
        let sig = signature(key, &self.string_to_sign(account_name));
        let (_, sr) = self.resource_and_sr(account_name);
        let mut query = format!("sv={API_VERSION}&sr={sr}&sp={}", self.permissions.as_sp());
        if let Some(st) = self.start {
            query.push_str(&format!("&st={}", enc(&iso8601(st))));
        }
        query.push_str(&format!("&se={}", enc(&iso8601(self.expiry))));
        if let Some(p) = &self.protocol {
            query.push_str(&format!("&spr={}", enc(p)));
        }
        query.push_str(&format!("&sig={}", enc(&sig)));
        crate::account::SasToken::try_new(&query)
    }

    fn resource_and_sr(&self, account_name: &str) -> (String, &'static str) {
        match &self.resource {
            SasResource::Container(c) => (format!("/blob/{account_name}/{c}"), "c"),
            SasResource::Blob(c, b) => (format!("/blob/{account_name}/{c}/{b}"), "b"),
        }
    }
}

/// `2026-11-21T14:00:00Z`.
fn iso8601(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn enc(s: &str) -> String {
    utf8_percent_encode(s, crate::names::UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str) -> Request {
        Request::new(crate::message::Method::GET, uri)
            .with_header("x-ms-version", "2021-12-02")
            .with_header("X-MS-Meta-Foo", "  a   b  ")
            .with_header("x-ms-date", "Sat, 21 Nov 2026 14:00:00 GMT")
    }

    #[test]
    fn headers_are_lowercased_sorted_and_trimmed_at_their_ends_only() {
        assert_eq!(
            canonicalized_headers(&req("http://h/c")),
            "x-ms-date:Sat, 21 Nov 2026 14:00:00 GMT\nx-ms-meta-foo:a   b\nx-ms-version:2021-12-02\n"
        );
        let tab = req("http://h/c").with_header("x-ms-meta-t", "\tx\ty ");
        assert!(canonicalized_headers(&tab).contains("x-ms-meta-t:x\ty\n"));
    }

    #[test]
    fn resource_decodes_sorts_and_joins_query_values() {
        let r = req("http://h/acct/c?restype=container&comp=list&Include=metadata&include=snapshots&prefix=a%2Fb&marker=");
        assert_eq!(
            canonicalized_resource(&r, "acct"),
            "/acct/acct/c\ncomp:list\ninclude:metadata,snapshots\nmarker:\nprefix:a/b\nrestype:container"
        );
    }

    #[test]
    fn zero_content_length_and_date_are_empty() {
        let mut r = req("http://h/c");
        r.headers_mut().insert("content-length", "0");
        r.headers_mut().insert("date", "ignored");
        let s = string_to_sign(&r, "a");
        // The verb, then eleven empty standard headers.
        assert!(
            s.starts_with(&format!("GET\n{}x-ms-date", "\n".repeat(11))),
            "{s:?}"
        );
    }

    #[test]
    fn sas_permissions_are_canonical() {
        assert_eq!(SasPermissions::all().as_sp(), "racwdl");
        let rw = SasPermissions {
            write: true,
            read: true,
            ..Default::default()
        };
        assert_eq!(rw.as_sp(), "rw");
    }
}
