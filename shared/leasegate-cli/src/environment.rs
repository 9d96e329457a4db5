//! The storage account, from the environment; and what to tell the operator when storage
//! refuses its credential.
//!
//! One of two ways, never both:
//! * `LEASEGATE_CONNECTION_STRING`: an account key or a SAS (default, when nothing is set:
//!   `UseDevelopmentStorage=true`, a local Azurite);
//! * `LEASEGATE_BLOB_ENDPOINT` with a Microsoft Entra ID token: `LEASEGATE_ACCESS_TOKEN` (used
//!   as it is), or `LEASEGATE_TENANT_ID` + `LEASEGATE_CLIENT_ID` + `LEASEGATE_CLIENT_SECRET` (a
//!   service principal's client credentials at `LEASEGATE_AUTHORITY`, default
//!   `https://login.microsoftonline.com`), again not both.
//!
//! A token variable without `LEASEGATE_BLOB_ENDPOINT` is an error, not ignored. An empty
//! variable counts as unset. Errors name variables, never their values.

use leasegate::token::{ClientSecret, TokenSource, PUBLIC_AUTHORITY};
use leasegate::{AccessToken, Account, BlobEndpoint, Credential, Error};

pub const CONNECTION_STRING: &str = "LEASEGATE_CONNECTION_STRING";
pub const BLOB_ENDPOINT: &str = "LEASEGATE_BLOB_ENDPOINT";
pub const ACCESS_TOKEN: &str = "LEASEGATE_ACCESS_TOKEN";
pub const TENANT_ID: &str = "LEASEGATE_TENANT_ID";
pub const CLIENT_ID: &str = "LEASEGATE_CLIENT_ID";
pub const CLIENT_SECRET: &str = "LEASEGATE_CLIENT_SECRET";
pub const AUTHORITY: &str = "LEASEGATE_AUTHORITY";

/// The client secret flow's variables: the three it needs, then the optional authority.
const CLIENT_FLOW: [&str; 4] = [TENANT_ID, CLIENT_ID, CLIENT_SECRET, AUTHORITY];

/// A variable of the process environment: `None` when unset or empty.
pub fn process_var(name: &str) -> Result<Option<String>, String> {
    match std::env::var(name) {
        Ok(value) if value.trim().is_empty() => Ok(None),
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name} is not valid UTF-8")),
    }
}

/// The account the variables (read through `var`, see [`process_var`]) describe.
pub fn account(var: impl Fn(&str) -> Result<Option<String>, String>) -> Result<Account, String> {
    let connection_string = var(CONNECTION_STRING)?;
    let endpoint = var(BLOB_ENDPOINT)?;
    let token = var(ACCESS_TOKEN)?;
    let mut client = Vec::new();
    for name in CLIENT_FLOW {
        client.push((name, var(name)?));
    }
    let client_set = client
        .iter()
        .find(|(_, v)| v.is_some())
        .map(|(name, _)| *name);

    let Some(endpoint) = endpoint else {
        if let Some(name) = token.as_ref().map(|_| ACCESS_TOKEN).or(client_set) {
            return Err(format!(
                "{name} is set but {BLOB_ENDPOINT} is not: a token needs the blob endpoint \
                 (https://ACCOUNT.blob.core.windows.net){}",
                if connection_string.is_some() {
                    format!("; with {CONNECTION_STRING}, unset {name}")
                } else {
                    String::new()
                }
            ));
        }
        let cs = connection_string.unwrap_or_else(|| "UseDevelopmentStorage=true".into());
        let account = Account::from_connection_string(&cs)
            .map_err(|e| format!("{CONNECTION_STRING}: {e}"))?;
        // A SAS rides on every request as it is (a key only signs): never in clear elsewhere.
        if matches!(account.credential(), Credential::Sas(_)) && !safe(&account.endpoint().origin())
        {
            return Err(format!(
                "{CONNECTION_STRING}: a SAS is sent only over https (or over http to this \
                 machine): use an https BlobEndpoint"
            ));
        }
        return Ok(account);
    };
    if connection_string.is_some() {
        return Err(format!(
            "set {CONNECTION_STRING} (a key or SAS) or {BLOB_ENDPOINT} (an Entra ID token), \
             not both"
        ));
    }
    let endpoint_url = endpoint.trim();
    let parsed =
        BlobEndpoint::try_new(endpoint_url).map_err(|e| format!("{BLOB_ENDPOINT}: {e}"))?;
    if !safe(&parsed.origin()) {
        return Err(format!(
            "{BLOB_ENDPOINT}: a token is sent only over https (or over http to this machine)"
        ));
    }
    let source = match (token, client_set) {
        (Some(_), Some(name)) => {
            return Err(format!(
                "set {ACCESS_TOKEN} or the client secret variables ({TENANT_ID}, {CLIENT_ID}, \
                 {CLIENT_SECRET}), not both ({name} is set)"
            ))
        }
        (Some(token), None) => {
            // As `az account get-access-token` prints it, or pasted with its scheme.
            let token = token.trim();
            let token = token
                .get(..7)
                .filter(|scheme| scheme.eq_ignore_ascii_case("bearer "))
                .map_or(token, |_| &token[7..]);
            TokenSource::Fixed(
                AccessToken::try_new(token).map_err(|e| format!("{ACCESS_TOKEN}: {e}"))?,
            )
        }
        (None, Some(_)) => {
            let missing: Vec<&str> = client[..3]
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(name, _)| *name)
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "the client secret flow needs {TENANT_ID}, {CLIENT_ID} and {CLIENT_SECRET}: \
                     {} not set",
                    missing.join(", ")
                ));
            }
            let value = |i: usize| client[i].1.as_deref().unwrap_or_default();
            let authority = client[3].1.as_deref().unwrap_or(PUBLIC_AUTHORITY);
            if !safe(authority.trim()) {
                return Err(format!(
                    "{AUTHORITY}: a client secret is sent only over https (or over http to \
                     this machine)"
                ));
            }
            TokenSource::ClientSecret(
                ClientSecret::new(authority, value(0), value(1), value(2))
                    .map_err(|e| format!("the client secret variables: {e}"))?,
            )
        }
        (None, None) => {
            return Err(format!(
                "{BLOB_ENDPOINT} needs a token: set {ACCESS_TOKEN}, or {TENANT_ID}, {CLIENT_ID} \
                 and {CLIENT_SECRET}"
            ))
        }
    };
    Ok(Account::new(
        &account_name(endpoint_url, parsed.is_path_style()),
        parsed,
        Credential::Bearer(source),
    ))
}

/// The account's name for [`Account::new`] (a bearer credential signs nothing with it): the
/// path's first segment for a path-style endpoint (`https://localhost:10000/devstoreaccount1`),
/// else the host's first label (`https://acct.blob.core.windows.net`).
fn account_name(url: &str, path_style: bool) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let name = if path_style {
        path.trim_start_matches('/').split('/').next()
    } else {
        host.split(['.', ':']).next()
    };
    name.unwrap_or_default().to_string()
}

/// True when a secret may be sent to `url`: over https, or to this machine.
fn safe(url: &str) -> bool {
    let Some((scheme, rest)) = url.split_once("://") else {
        return false;
    };
    if scheme.eq_ignore_ascii_case("https") {
        return true;
    }
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host = if authority.starts_with('[') {
        let (host, rest) = authority.split_at(authority.find(']').map_or(0, |i| i + 1));
        // `[::1]` alone or with a port; `[::1]evil` is no loopback.
        if rest.is_empty() || rest.starts_with(':') {
            host
        } else {
            ""
        }
    } else {
        authority.split(':').next().unwrap_or_default()
    };
    // No user info: `http://localhost:1@elsewhere` goes elsewhere.
    !authority.contains('@') && matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

/// A core error as the operator should read it: when storage refuses the credential, what to
/// fix is said after storage's answer.
pub fn explain(account: &Account) -> impl Fn(Error) -> String + '_ {
    move |e| {
        let bearer = matches!(account.credential(), Credential::Bearer(_));
        let hint = match &e {
            Error::Storage(s) => match s.code.as_deref() {
                Some("KeyBasedAuthenticationNotPermitted") => Some(format!(
                    "Shared Key is turned off on this account: set {BLOB_ENDPOINT} with \
                     {ACCESS_TOKEN} or the client secret variables instead"
                )),
                Some("AuthorizationPermissionMismatch") if bearer => Some(
                    "the identity needs the Storage Blob Data Contributor role on the container"
                        .into(),
                ),
                Some("AuthorizationFailure") if bearer => Some(
                    "the identity needs the Storage Blob Data Contributor role on the \
                     container, or the account's network rules refuse this machine"
                        .into(),
                ),
                _ if bearer && s.token_refused() => Some(
                    "storage refused the token: use one for https://storage.azure.com/ from the \
                     account's tenant, not expired"
                        .into(),
                ),
                _ => None,
            },
            Error::Token(t) if !t.retryable => Some(format!(
                "check {TENANT_ID}, {CLIENT_ID}, {CLIENT_SECRET} and {AUTHORITY}"
            )),
            _ => None,
        };
        match hint {
            Some(hint) => format!("{e}; {hint}"),
            None => e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasegate::{StatusCode, StorageError};

    const SECRET: &str = "sup3r-s3cret";
    const TOKEN: &str = "eyJ0eXAiOiJKV1QifQ.eyJhdWQiOiJ4In0.c2ln";

    fn from(vars: &[(&str, &str)]) -> Result<Account, String> {
        account(|name| {
            Ok(vars
                .iter()
                .find(|(n, v)| *n == name && !v.is_empty())
                .map(|(_, v)| v.to_string()))
        })
    }

    fn source(account: &Account) -> &TokenSource {
        match account.credential() {
            Credential::Bearer(source) => source,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_connection_string_or_the_development_account() {
        let a = from(&[]).unwrap();
        assert_eq!(a.name(), "devstoreaccount1");
        assert!(matches!(a.credential(), Credential::SharedKey(_)));
        let a = from(&[(
            CONNECTION_STRING,
            "BlobEndpoint=https://acct.blob.core.windows.net;SharedAccessSignature=sv=1&sig=abc",
        )])
        .unwrap();
        assert!(matches!(a.credential(), Credential::Sas(_)));
        // A SAS rides on every request: in clear only to this machine.
        let e = from(&[(
            CONNECTION_STRING,
            "BlobEndpoint=http://acct.blob.core.windows.net;SharedAccessSignature=sv=1&sig=s3cr3t",
        )])
        .unwrap_err();
        assert!(e.contains("a SAS is sent only over https"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
        let a = from(&[(
            CONNECTION_STRING,
            "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;SharedAccessSignature=sv=1&sig=abc",
        )])
        .unwrap();
        assert!(matches!(a.credential(), Credential::Sas(_)));
        // A key signs; it does not travel.
        let a = from(&[(
            CONNECTION_STRING,
            "DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=a2V5",
        )])
        .unwrap();
        assert!(matches!(a.credential(), Credential::SharedKey(_)));
    }

    #[test]
    fn a_token_from_the_environment() {
        let a = from(&[
            (BLOB_ENDPOINT, "https://acct.blob.core.windows.net/"),
            (ACCESS_TOKEN, &format!("{TOKEN}\n")),
        ])
        .unwrap();
        assert_eq!(a.name(), "acct");
        assert_eq!(
            source(&a),
            &TokenSource::Fixed(AccessToken::try_new(TOKEN).unwrap())
        );
        // Pasted with its scheme.
        let a = from(&[
            (BLOB_ENDPOINT, "https://localhost:10500/devstoreaccount1"),
            (ACCESS_TOKEN, &format!("Bearer {TOKEN}")),
        ])
        .unwrap();
        assert_eq!(a.name(), "devstoreaccount1");
        assert_eq!(
            source(&a),
            &TokenSource::Fixed(AccessToken::try_new(TOKEN).unwrap())
        );
    }

    #[test]
    fn a_client_secret_from_the_environment() {
        let vars = [
            (BLOB_ENDPOINT, "http://127.0.0.1:10000/devstoreaccount1"),
            (TENANT_ID, "contoso.onmicrosoft.com"),
            (CLIENT_ID, "00000000-0000-0000-0000-0000000000aa"),
            (CLIENT_SECRET, SECRET),
        ];
        let a = from(&vars).unwrap();
        assert_eq!(
            source(&a),
            &TokenSource::ClientSecret(
                ClientSecret::new(PUBLIC_AUTHORITY, vars[1].1, vars[2].1, SECRET).unwrap()
            )
        );
        assert!(!format!("{a:?}").contains(SECRET));
        let mut with_authority = vars.to_vec();
        with_authority.push((AUTHORITY, "http://127.0.0.1:4000"));
        let a = from(&with_authority).unwrap();
        assert!(source(&a).identity().contains("http://127.0.0.1:4000"));
    }

    #[test]
    fn conflicts_and_gaps_are_named_without_values() {
        let endpoint = (BLOB_ENDPOINT, "https://acct.blob.core.windows.net");
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[(CONNECTION_STRING, "UseDevelopmentStorage=true"), endpoint],
                "or LEASEGATE_BLOB_ENDPOINT (an Entra ID token), not both",
            ),
            (&[endpoint], "LEASEGATE_BLOB_ENDPOINT needs a token"),
            (
                &[endpoint, (ACCESS_TOKEN, TOKEN), (CLIENT_SECRET, SECRET)],
                "not both (LEASEGATE_CLIENT_SECRET is set)",
            ),
            (
                &[endpoint, (CLIENT_SECRET, SECRET)],
                "LEASEGATE_TENANT_ID, LEASEGATE_CLIENT_ID not set",
            ),
            (
                &[
                    endpoint,
                    (TENANT_ID, "t"),
                    (CLIENT_ID, "c"),
                    (AUTHORITY, "x"),
                ],
                "LEASEGATE_CLIENT_SECRET not set",
            ),
            (
                &[(ACCESS_TOKEN, TOKEN)],
                "LEASEGATE_ACCESS_TOKEN is set but LEASEGATE_BLOB_ENDPOINT is not",
            ),
            (
                &[
                    (CONNECTION_STRING, "UseDevelopmentStorage=true"),
                    (CLIENT_SECRET, SECRET),
                ],
                "with LEASEGATE_CONNECTION_STRING, unset LEASEGATE_CLIENT_SECRET",
            ),
            (
                &[endpoint, (ACCESS_TOKEN, "two words sup3r-s3cret")],
                "LEASEGATE_ACCESS_TOKEN: invalid argument",
            ),
            (
                &[
                    (BLOB_ENDPOINT, "http://acct.example"),
                    (ACCESS_TOKEN, TOKEN),
                ],
                "a token is sent only over https",
            ),
            (
                &[
                    endpoint,
                    (TENANT_ID, "t"),
                    (CLIENT_ID, "c"),
                    (CLIENT_SECRET, SECRET),
                    (AUTHORITY, "http://login.example"),
                ],
                "LEASEGATE_AUTHORITY: a client secret is sent only over https",
            ),
            (
                &[
                    endpoint,
                    (TENANT_ID, "t"),
                    (CLIENT_ID, "c"),
                    (CLIENT_SECRET, SECRET),
                    (AUTHORITY, "http://localhost:1@login.example"),
                ],
                "LEASEGATE_AUTHORITY: a client secret is sent only over https",
            ),
            (
                &[
                    (BLOB_ENDPOINT, "https://acct.example/?sig=sup3r-s3cret"),
                    (ACCESS_TOKEN, TOKEN),
                ],
                "LEASEGATE_BLOB_ENDPOINT: invalid endpoint",
            ),
            (
                &[
                    endpoint,
                    (TENANT_ID, "t/x"),
                    (CLIENT_ID, "c"),
                    (CLIENT_SECRET, SECRET),
                ],
                "the client secret variables: invalid argument: the tenant",
            ),
        ];
        for (vars, want) in cases {
            let e = from(vars).unwrap_err();
            assert!(e.contains(want), "want {want:?}: {e}");
            assert!(!e.contains(SECRET) && !e.contains(TOKEN), "{e}");
        }
    }

    #[test]
    fn refusals_of_a_token_name_the_fix() {
        let bearer = from(&[
            (BLOB_ENDPOINT, "https://acct.blob.core.windows.net"),
            (ACCESS_TOKEN, TOKEN),
        ])
        .unwrap();
        let key = from(&[]).unwrap();
        let refused = |code: &str| {
            Error::Storage(StorageError {
                status: StatusCode::FORBIDDEN,
                code: Some(code.into()),
                request_id: None,
                class: leasegate::ErrorClass::Auth,
                retry_after: None,
            })
        };
        let said = explain(&bearer)(refused("AuthorizationPermissionMismatch"));
        assert!(said.starts_with("storage answered 403 Forbidden: AuthorizationPermissionMismatch"));
        assert!(
            said.ends_with("Storage Blob Data Contributor role on the container"),
            "{said}"
        );
        let said = explain(&bearer)(refused("AuthenticationFailed"));
        assert!(said.contains("storage refused the token"), "{said}");
        let said = explain(&key)(refused("KeyBasedAuthenticationNotPermitted"));
        assert!(
            said.contains("Shared Key is turned off on this account"),
            "{said}"
        );
        // A key's refusal is not blamed on a token.
        let said = explain(&key)(refused("AuthenticationFailed"));
        assert!(!said.contains("token"), "{said}");
    }
}
