//! Settings from Spin variables. Error messages name the variable, never its value.

use std::time::Duration;

use leasegate::lease::Locks;
use leasegate::token::{self, ClientSecret, ManagedIdentity, TokenSource};
use leasegate::{
    Account, AccountKey, BlobClient, BlobEndpoint, ContainerName, Credential, HolderKey, SasToken,
    Transport,
};

/// Where settings come from: Spin's component variables, or a map in tests.
pub trait Variables {
    /// The value of `name`, `None` when it is not defined.
    fn get(&self, name: &str) -> Option<String>;
}

impl Variables for std::collections::HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        std::collections::HashMap::get(self, name).cloned()
    }
}

/// A setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "configuration: {}", self.0)
    }
}

/// A variable's value, trimmed; empty counts as unset.
pub fn var(vars: &dyn Variables, name: &str) -> Option<String> {
    vars.get(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// A required URL variable: an absolute `http` or `https` URL with a host, of visible ASCII
/// (what [`crate::web::json_post`] sends to).
pub fn url(vars: &dyn Variables, name: &str) -> Result<String, ConfigError> {
    let url = var(vars, name).ok_or_else(|| ConfigError(format!("variable {name} is not set")))?;
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    let host = rest.map(|r| &r[..r.find(['/', '?', '#']).unwrap_or(r.len())]);
    if host.is_none_or(str::is_empty) || !url.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError(format!(
            "variable {name} is not an absolute URL"
        )));
    }
    Ok(url)
}

/// A numeric variable in `range` (whole bounds), or `default` when unset. A value that is not
/// a finite number in the range is refused with a message naming the variable.
pub fn number(
    vars: &dyn Variables,
    name: &str,
    default: f64,
    range: std::ops::RangeInclusive<i64>,
) -> Result<f64, ConfigError> {
    let Some(text) = var(vars, name) else {
        return Ok(default);
    };
    let (low, high) = (*range.start(), *range.end());
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && low as f64 <= v && v <= high as f64 => Ok(v),
        _ => Err(ConfigError(format!(
            "variable {name} must be a number from {low} to {high}"
        ))),
    }
}

/// Where the lease blobs live and how to reach them.
#[derive(Debug, Clone)]
pub struct Storage {
    /// The account and its credential.
    pub account: Account,
    /// The container of the lock blobs.
    pub container: ContainerName,
    /// How long one outbound request (storage or webhook) may take: `storage_timeout_ms`.
    pub timeout: Duration,
    /// How many outbound requests one invocation keeps in flight at most: `max_in_flight`.
    pub max_in_flight: usize,
    /// The key of holder-derived lease ids: `lease_id_secret` (`None`: not set). Never derived
    /// from the storage credential (it may change, or with Entra ID not exist).
    pub holder_key: Option<HolderKey>,
}

impl Storage {
    /// The locks below `prefix` in this storage, reached through `transport`.
    pub fn locks<'t, T: Transport>(&self, transport: &'t T, prefix: &str) -> Locks<&'t T> {
        Locks::from_client(self.blobs(transport)).with_prefix(prefix)
    }

    /// The blobs of the container, for plain blob work (a record, a log), reached through
    /// `transport`.
    pub fn blobs<'t, T: Transport>(&self, transport: &'t T) -> BlobClient<&'t T> {
        BlobClient::new(transport, self.account.clone(), self.container.clone())
    }

    /// The key of holder-derived lease ids, required by a function that derives them.
    pub fn lease_id_key(&self) -> Result<&HolderKey, ConfigError> {
        self.holder_key.as_ref().ok_or_else(|| {
            ConfigError(
                "variable lease_id_secret is not set: this function derives its lease id from \
                 instance_id under it; set it to a long random secret shared by every \
                 deployment of the app"
                    .into(),
            )
        })
    }
}

/// Reads the storage settings.
///
/// The credential follows `storage_auth`:
/// * unset: `storage_connection_string` wins when set; otherwise `storage_account` with
///   `storage_sas` (when set) or `storage_key`;
/// * `key` / `sas`: `storage_account` with `storage_key` / `storage_sas`;
/// * `managed_identity`: Microsoft Entra ID tokens of the app's managed identity, from
///   `identity_endpoint` with `identity_header` (and `identity_client_id` for a user-assigned
///   identity), an endpoint at `token_origin`;
/// * `client_secret`: tokens of a service principal (`entra_tenant_id`, `entra_client_id`,
///   `entra_client_secret`) from the authority `token_origin` (default
///   `https://login.microsoftonline.com`).
///
/// The account is at `storage_origin`, path style (`{origin}/{account}`, as Azurite serves)
/// unless the origin's host starts with `{account}.` (Azure's host style).
///
/// `storage_origin` (and `token_origin`) are also what Spin lets the component reach
/// (`allowed_outbound_hosts`), so an endpoint elsewhere is refused here, with a message that
/// says what to set, rather than by Spin at the first request.
pub fn storage(vars: &dyn Variables) -> Result<Storage, ConfigError> {
    let origin = storage_origin(vars)?;
    let auth = var(vars, "storage_auth");
    let account = match auth.as_deref() {
        None => match var(vars, "storage_connection_string") {
            Some(cs) => connection_string_account(&cs, &origin)?,
            None => {
                // A SAS, when set, is used: storage_key has a default (Azurite's public key),
                // so "set storage_sas" must be enough to switch to a SAS.
                let credential = match (var(vars, "storage_sas"), var(vars, "storage_key")) {
                    (Some(sas), _) => sas_credential(&sas)?,
                    (None, Some(key)) => key_credential(&key)?,
                    (None, None) => {
                        return Err(ConfigError(
                            "set storage_key or storage_sas (or storage_connection_string)".into(),
                        ))
                    }
                };
                named_account(vars, &origin, credential)?
            }
        },
        Some("key") => {
            let key = var(vars, "storage_key").ok_or_else(|| {
                ConfigError("variable storage_key is not set (storage_auth = key)".into())
            })?;
            named_account(vars, &origin, key_credential(&key)?)?
        }
        Some("sas") => {
            let sas = var(vars, "storage_sas").ok_or_else(|| {
                ConfigError("variable storage_sas is not set (storage_auth = sas)".into())
            })?;
            named_account(vars, &origin, sas_credential(&sas)?)?
        }
        Some(kind @ ("managed_identity" | "client_secret")) => {
            if var(vars, "storage_connection_string").is_some() {
                return Err(ConfigError(format!(
                    "storage_auth = {kind} signs in with Microsoft Entra ID: leave \
                     storage_connection_string empty and set storage_account"
                )));
            }
            let source = token_source(vars, kind)?;
            token_cache(vars)?;
            named_account(vars, &origin, Credential::Bearer(source))?
        }
        Some(_) => {
            return Err(ConfigError(
                "variable storage_auth must be key, sas, managed_identity or client_secret".into(),
            ))
        }
    };
    check_secret_in_transit(&account)?;
    let container_name = var(vars, "container").unwrap_or_else(|| "leasegate".into());
    let container = ContainerName::try_new(&container_name)
        .map_err(|e| ConfigError(format!("variable container: {e}")))?;
    let timeout_ms = number(vars, "storage_timeout_ms", 5000.0, 100..=60_000)?;
    let max_in_flight = number(vars, "max_in_flight", 16.0, 1..=256)?;
    if max_in_flight.fract() != 0.0 {
        return Err(ConfigError(
            "variable max_in_flight must be a whole number".into(),
        ));
    }
    let holder_key = match var(vars, "lease_id_secret") {
        Some(secret) => Some(
            HolderKey::try_new(secret.as_bytes())
                .map_err(|_| ConfigError("variable lease_id_secret is empty".into()))?,
        ),
        None => None,
    };
    Ok(Storage {
        account,
        container,
        timeout: Duration::from_millis(timeout_ms as u64),
        max_in_flight: max_in_flight as usize,
        holder_key,
    })
}

/// `storage_origin`, without a trailing slash.
fn storage_origin(vars: &dyn Variables) -> Result<String, ConfigError> {
    let origin = var(vars, "storage_origin")
        .ok_or_else(|| ConfigError("variable storage_origin is not set".into()))?;
    Ok(origin.trim_end_matches('/').to_string())
}

/// The blob endpoint [`storage`] reaches, read from the few variables that name it
/// (`storage_origin`, `storage_auth`, `storage_connection_string`, `storage_account`) and
/// derived the same way, with no credential kept: what the key-value entries are named by
/// ([`crate::cache::Scope::load`]) for a request that reads no other storage setting.
pub fn endpoint(vars: &dyn Variables) -> Result<BlobEndpoint, ConfigError> {
    let origin = storage_origin(vars)?;
    match (
        var(vars, "storage_auth"),
        var(vars, "storage_connection_string"),
    ) {
        (None, Some(cs)) => Ok(connection_string_account(&cs, &origin)?.endpoint().clone()),
        _ => named_endpoint(&account_name(vars)?, &origin),
    }
}

/// The account of `storage_connection_string`, whose blob endpoint must be `origin`.
fn connection_string_account(cs: &str, origin: &str) -> Result<Account, ConfigError> {
    let account = Account::from_connection_string(cs)
        .map_err(|e| ConfigError(format!("variable storage_connection_string: {e}")))?;
    let endpoint = account.endpoint().origin();
    if !endpoint.eq_ignore_ascii_case(origin) {
        // storage_origin as scheme://host[:port] only: whatever else was pasted into it (a SAS
        // URL's query) is not repeated.
        let origin = url_origin(origin);
        let origin = origin.split(['?', '#']).next().unwrap_or_default();
        return Err(ConfigError(format!(
            "the blob endpoint of storage_connection_string is at {endpoint}, but \
             storage_origin is {origin}: set storage_origin={endpoint} (Spin lets the \
             component reach storage_origin only)"
        )));
    }
    Ok(account)
}

/// Refuses a credential that would travel in clear: a bearer token (`storage_auth =
/// managed_identity` / `client_secret`) and a SAS (`storage_sas`, or a connection string's
/// `SharedAccessSignature`) ride on every storage request as they are, so they go only over
/// https or over http to this machine (Azurite). A shared key never leaves the app (each request
/// carries an HMAC of itself), so it may go to any origin.
fn check_secret_in_transit(account: &Account) -> Result<(), ConfigError> {
    let what = match account.credential() {
        Credential::Bearer(_) => {
            "a bearer token (storage_auth = managed_identity or client_secret)"
        }
        Credential::Sas(_) => {
            "a SAS (storage_sas, or the SharedAccessSignature of storage_connection_string)"
        }
        _ => return Ok(()),
    };
    let origin = account.endpoint().origin();
    if secure(&origin) {
        return Ok(());
    }
    Err(ConfigError(format!(
        "variable storage_origin: {what} is sent to storage only over https (or over http to \
         this machine): storage_origin is {origin}; set it to the account's https origin"
    )))
}

/// `storage_account` at `origin` (path or host style) with `credential`.
fn named_account(
    vars: &dyn Variables,
    origin: &str,
    credential: Credential,
) -> Result<Account, ConfigError> {
    let name = account_name(vars)?;
    Ok(Account::new(
        &name,
        named_endpoint(&name, origin)?,
        credential,
    ))
}

/// `storage_account`, required.
fn account_name(vars: &dyn Variables) -> Result<String, ConfigError> {
    var(vars, "storage_account")
        .ok_or_else(|| ConfigError("variable storage_account is not set".into()))
}

/// The endpoint of the account `name` at `origin`: host style when the origin's host starts
/// with `{name}.` (Azure), path style (`{origin}/{name}`, as Azurite serves) otherwise.
fn named_endpoint(name: &str, origin: &str) -> Result<BlobEndpoint, ConfigError> {
    let host = origin
        .find(':')
        .and_then(|i| origin[i..].strip_prefix("://"));
    let host_style = host.is_some_and(|host| host.starts_with(&format!("{name}.")));
    let url = if host_style {
        origin.to_string()
    } else {
        format!("{origin}/{name}")
    };
    BlobEndpoint::try_new(&url).map_err(|e| ConfigError(format!("variable storage_origin: {e}")))
}

fn sas_credential(sas: &str) -> Result<Credential, ConfigError> {
    SasToken::try_new(sas)
        .map(Credential::Sas)
        .map_err(|_| ConfigError("variable storage_sas is not a SAS token".into()))
}

fn key_credential(key: &str) -> Result<Credential, ConfigError> {
    AccountKey::try_new(key)
        .map(Credential::SharedKey)
        .map_err(|_| ConfigError("variable storage_key is not base64".into()))
}

/// A required variable of `storage_auth = {kind}`.
fn required(vars: &dyn Variables, name: &str, kind: &str) -> Result<String, ConfigError> {
    var(vars, name).ok_or_else(|| {
        ConfigError(format!(
            "variable {name} is not set (storage_auth = {kind})"
        ))
    })
}

/// The Entra ID token source of `storage_auth = kind` (`managed_identity`, `client_secret`).
/// Its endpoint must be at `token_origin`, the origin Spin lets the component reach for
/// tokens. Messages name variables, never values of secret ones.
fn token_source(vars: &dyn Variables, kind: &str) -> Result<TokenSource, ConfigError> {
    let token_origin = var(vars, "token_origin")
        .unwrap_or_else(|| token::PUBLIC_AUTHORITY.to_string())
        .trim_end_matches('/')
        .to_string();
    if kind == "managed_identity" {
        let endpoint = required(vars, "identity_endpoint", kind)?;
        let header = required(vars, "identity_header", kind)?;
        let client_id = var(vars, "identity_client_id");
        let identity = ManagedIdentity::new(&endpoint, &header, client_id.as_deref())
            .map_err(|e| ConfigError(format!("managed identity: {}", plain(&e))))?;
        let at = url_origin(&endpoint);
        if !secure(&at) {
            return Err(ConfigError(
                "variable identity_endpoint: the identity header is sent only over https (or \
                 over http to this machine, as on Azure Functions)"
                    .into(),
            ));
        }
        if !at.eq_ignore_ascii_case(&token_origin) {
            return Err(ConfigError(format!(
                "identity_endpoint is at {at}, but token_origin is {token_origin}: set \
                 token_origin={at} (Spin lets the component reach token_origin only; the Azure \
                 Functions launcher sets both)"
            )));
        }
        return Ok(TokenSource::ManagedIdentity(identity));
    }
    if !secure(&token_origin) {
        return Err(ConfigError(
            "variable token_origin: a client secret is sent only over https (or over http to \
             this machine)"
                .into(),
        ));
    }
    let tenant = required(vars, "entra_tenant_id", kind)?;
    let client_id = required(vars, "entra_client_id", kind)?;
    let secret = required(vars, "entra_client_secret", kind)?;
    ClientSecret::new(&token_origin, &tenant, &client_id, &secret)
        .map(TokenSource::ClientSecret)
        .map_err(|e| {
            ConfigError(format!(
                "client secret (token_origin, entra_tenant_id, entra_client_id): {}",
                plain(&e)
            ))
        })
}

/// A core error's words without its "invalid argument: " prefix.
fn plain(e: &leasegate::Error) -> String {
    let text = e.to_string();
    text.strip_prefix("invalid argument: ")
        .unwrap_or(&text)
        .to_string()
}

/// `scheme://host[:port]` of an absolute URL.
fn url_origin(url: &str) -> String {
    match url.find("://") {
        Some(i) => {
            let rest = &url[i + 3..];
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            url[..i + 3 + end].to_string()
        }
        None => url.to_string(),
    }
}

/// Whether a secret may be sent to `origin` (`scheme://host[:port]`): over https, or to this
/// machine.
fn secure(origin: &str) -> bool {
    if origin.to_ascii_lowercase().starts_with("https://") {
        return true;
    }
    let authority = origin.split_once("://").map_or("", |(_, a)| a);
    let host = match authority.strip_prefix("[::1]") {
        // `[::1]` alone or with a port; `[::1]evil` is no loopback.
        Some(rest) if rest.is_empty() || rest.starts_with(':') => "[::1]",
        Some(_) => "",
        None => authority.split(':').next().unwrap_or_default(),
    };
    !authority.contains('@') && matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

/// Whether bearer tokens are kept in the app's key-value store between invocations:
/// `storage_token_cache` (`on` by default, `off`).
pub fn token_cache(vars: &dyn Variables) -> Result<bool, ConfigError> {
    match var(vars, "storage_token_cache").as_deref() {
        None | Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(_) => Err(ConfigError(
            "variable storage_token_cache must be on or off".into(),
        )),
    }
}

/// The longest job, term or init name, in bytes.
pub const MAX_NAME: usize = 63;

/// A job, term or init name (`noun`: what the message calls it).
pub fn check_name(name: &str, noun: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a {noun} is 1 to {MAX_NAME} lowercase letters, digits, '-', '_' or '.', \
             starting with a letter or digit"
        ))
    }
}

mod table;
pub use table::table_account;

#[cfg(test)]
mod tests;
