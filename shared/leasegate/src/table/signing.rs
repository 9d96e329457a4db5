//! Authorization of Table service requests: the Table service's own SharedKey string to sign,
//! a SAS appended as it is, or a bearer token.
//!
//! [Authorize with Shared Key](https://learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key#shared-key-format-for-the-table-service),
//! section "Table service (Shared Key authorization)": the string to sign is
//! `VERB\nContent-MD5\nContent-Type\nDate\nCanonicalizedResource`. Unlike the Blob service's
//! ([`crate::signing::string_to_sign`]) it signs no `x-ms-*` header, no `Content-Length`, no
//! conditional header, and of the query only `comp`. Each stage is a pure function so the
//! test vectors (`tests/table-vectors/`) can check it on its own: [`canonicalized_resource`],
//! [`string_to_sign`], [`sign`].

use std::time::SystemTime;

use percent_encoding::percent_decode_str;

use crate::account::{Account, AccountKey, Credential};
use crate::message::{valid_header_value, Request};
use crate::signing::{bearer, signature};
use crate::token::{AccessToken, TokenSource};
use crate::Error;

/// The REST API version every Table request names (`x-ms-version`): the version the Azure
/// SDKs for tables send, the first to take Entra ID tokens for tables, and one every Azurite
/// since 3.x knows.
pub const TABLE_API_VERSION: &str = "2019-02-02";

/// Stamps `x-ms-date` (from `now`, a parameter: the core reads no clock) and `x-ms-version`,
/// then authorizes the request with the account's credential: a Table SharedKey
/// `Authorization` header, the SAS appended to the URL, or a fixed bearer token. A bearer
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
    headers.insert("x-ms-version", TABLE_API_VERSION);
    match account.credential() {
        Credential::SharedKey(key) => sign(request, account.name(), key),
        Credential::Sas(sas) => {
            let sep = if request.query().is_some() { '&' } else { '?' };
            let uri = format!("{}{sep}{}", request.uri(), sas.query());
            // The token holds no whitespace or control characters (checked when it was
            // made), and the message must not echo the URL, which now holds the SAS.
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
                 (table::signing::authorize_with)",
                source.describe()
            ))),
        },
    }
}

/// Adds `Authorization: SharedKey {account}:{signature}` for the request as it stands, signed
/// by the Table service's rules ([`string_to_sign`]).
pub fn sign(request: &mut Request, account_name: &str, key: &AccountKey) -> Result<(), Error> {
    let signature = signature(key, &string_to_sign(request, account_name));
    let value = format!("SharedKey {account_name}:{signature}");
    if !valid_header_value(&value) {
        return Err(Error::InvalidArgument("invalid header value".into()));
    }
    request.headers_mut().insert("authorization", value);
    Ok(())
}

/// The Table service's SharedKey string to sign:
/// `VERB\nContent-MD5\nContent-Type\nDate\n` + [`canonicalized_resource`].
///
/// `Date` is the `x-ms-date` header's value when the request has one (as the spec says, and
/// this crate always sends it), else the `Date` header's. Quirk: Azurite's table emulator
/// takes `Date` first when a request carries both; the two agree on every request this crate
/// builds, which carry `x-ms-date` only.
pub fn string_to_sign(request: &Request, account_name: &str) -> String {
    let headers = request.headers();
    let date = headers
        .get("x-ms-date")
        .or_else(|| headers.get("date"))
        .unwrap_or("");
    let mut out = String::with_capacity(128);
    for line in [
        request.method().as_str(),
        headers.get("content-md5").unwrap_or(""),
        headers.get("content-type").unwrap_or(""),
        date,
    ] {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&canonicalized_resource(request, account_name));
    out
}

/// `/{account}{path as sent}`, then `?comp={value}` when the query has a `comp` parameter
/// (its name in any case, its value URL-decoded); no other query parameter (`$filter`,
/// `NextPartitionKey`, a SAS) is signed.
///
/// On a path-style endpoint (Azurite) the path already starts with the account, so the
/// account appears twice, as for blobs: `/devstoreaccount1/devstoreaccount1/Tables`.
pub fn canonicalized_resource(request: &Request, account_name: &str) -> String {
    let mut out = format!("/{account_name}{}", request.path());
    let comp = request.query().unwrap_or("").split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        name.eq_ignore_ascii_case("comp").then_some(value)
    });
    if let Some(value) = comp {
        let value = percent_decode_str(value)
            .decode_utf8()
            .map_or(value.to_string(), Into::into);
        out.push_str("?comp=");
        out.push_str(&value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Method;

    #[test]
    fn only_comp_of_the_query_is_signed() {
        let r = Request::new(
            Method::GET,
            "http://127.0.0.1:10002/devstoreaccount1/t()?$filter=a%20eq%201&NextPartitionKey=x&sig=s",
        );
        assert_eq!(
            canonicalized_resource(&r, "devstoreaccount1"),
            "/devstoreaccount1/devstoreaccount1/t()"
        );
        let r = Request::new(
            Method::GET,
            "https://acct.table.core.windows.net/t?timeout=5&COMP=acl",
        );
        assert_eq!(canonicalized_resource(&r, "acct"), "/acct/t?comp=acl");
        let r = Request::new(Method::GET, "https://acct.table.core.windows.net");
        assert_eq!(canonicalized_resource(&r, "acct"), "/acct/");
    }

    #[test]
    fn x_ms_date_is_the_date_and_no_x_ms_header_is_signed() {
        let r = Request::new(Method::PUT, "https://acct.table.core.windows.net/t")
            .with_header("content-type", "application/json")
            .with_header("content-length", "12")
            .with_header("if-match", "*")
            .with_header("date", "Fri, 20 Nov 2026 14:00:00 GMT")
            .with_header("x-ms-date", "Sat, 21 Nov 2026 14:00:00 GMT")
            .with_header("x-ms-version", TABLE_API_VERSION);
        assert_eq!(
            string_to_sign(&r, "acct"),
            "PUT\n\napplication/json\nSat, 21 Nov 2026 14:00:00 GMT\n/acct/t"
        );
        let r = Request::new(Method::GET, "https://acct.table.core.windows.net/t")
            .with_header("date", "Fri, 20 Nov 2026 14:00:00 GMT");
        assert_eq!(
            string_to_sign(&r, "acct"),
            "GET\n\n\nFri, 20 Nov 2026 14:00:00 GMT\n/acct/t"
        );
    }
}
