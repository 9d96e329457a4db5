//! Settings from Spin variables. Error messages name the variable, never its value.

use std::time::Duration;

use leasegate::lease::Locks;
use leasegate::{
    Account, AccountKey, BlobEndpoint, ContainerName, Credential, SasToken, Transport,
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

/// A numeric variable in `range`, or `default` when unset.
pub fn number(
    vars: &dyn Variables,
    name: &str,
    default: f64,
    range: std::ops::RangeInclusive<f64>,
) -> Result<f64, ConfigError> {
    let Some(text) = var(vars, name) else {
        return Ok(default);
    };
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && range.contains(&v) => Ok(v),
        _ => Err(ConfigError(format!(
            "variable {name} must be a number from {} to {}",
            range.start(),
            range.end()
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
    /// How long one storage request may take.
    pub timeout: Duration,
}

impl Storage {
    /// The locks below `prefix` in this storage, reached through `transport`.
    pub fn locks<'t, T: Transport>(&self, transport: &'t T, prefix: &str) -> Locks<&'t T> {
        Locks::new(transport, self.account.clone(), self.container.clone()).with_prefix(prefix)
    }
}

/// Reads the storage settings:
/// `storage_connection_string` wins when set; otherwise `storage_account` with `storage_key`
/// (or `storage_sas`) at `storage_origin`, path style (`{origin}/{account}`, as Azurite serves)
/// unless the origin's host starts with `{account}.` (Azure's host style).
pub fn storage(vars: &dyn Variables) -> Result<Storage, ConfigError> {
    let account = match var(vars, "storage_connection_string") {
        Some(cs) => Account::from_connection_string(&cs)
            .map_err(|e| ConfigError(format!("variable storage_connection_string: {e}")))?,
        None => {
            let name = var(vars, "storage_account")
                .ok_or_else(|| ConfigError("variable storage_account is not set".into()))?;
            let origin = var(vars, "storage_origin")
                .ok_or_else(|| ConfigError("variable storage_origin is not set".into()))?;
            let origin = origin.trim_end_matches('/');
            let host_style = origin
                .split_once("://")
                .is_some_and(|(_, host)| host.starts_with(&format!("{name}.")));
            let url = if host_style {
                origin.to_string()
            } else {
                format!("{origin}/{name}")
            };
            let endpoint = BlobEndpoint::try_new(&url)
                .map_err(|e| ConfigError(format!("variable storage_origin: {e}")))?;
            let credential = match (var(vars, "storage_key"), var(vars, "storage_sas")) {
                (Some(key), _) => Credential::SharedKey(
                    AccountKey::try_new(&key)
                        .map_err(|_| ConfigError("variable storage_key is not base64".into()))?,
                ),
                (None, Some(sas)) => {
                    Credential::Sas(SasToken::try_new(&sas).map_err(|_| {
                        ConfigError("variable storage_sas is not a SAS token".into())
                    })?)
                }
                (None, None) => {
                    return Err(ConfigError(
                        "set storage_key or storage_sas (or storage_connection_string)".into(),
                    ))
                }
            };
            Account::new(&name, endpoint, credential)
        }
    };
    let container_name = var(vars, "container").unwrap_or_else(|| "leasegate".into());
    let container = ContainerName::try_new(&container_name)
        .map_err(|e| ConfigError(format!("variable container: {e}")))?;
    let timeout_ms = number(vars, "storage_timeout_ms", 5000.0, 100.0..=60_000.0)?;
    Ok(Storage {
        account,
        container,
        timeout: Duration::from_millis(timeout_ms as u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn azurite_defaults_are_path_style() {
        let s = storage(&vars(&[
            ("storage_account", "devstoreaccount1"),
            ("storage_key", leasegate::account::DEV_ACCOUNT_KEY),
            ("storage_origin", "http://127.0.0.1:10000"),
        ]))
        .unwrap();
        assert_eq!(s.account.endpoint().origin(), "http://127.0.0.1:10000");
        assert!(s.account.endpoint().is_path_style());
        assert_eq!(s.container.as_str(), "leasegate");
    }

    #[test]
    fn azure_origin_is_host_style_and_sas_works() {
        let s = storage(&vars(&[
            ("storage_account", "myacct"),
            ("storage_sas", "sv=2021-12-02&sig=abc"),
            ("storage_origin", "https://myacct.blob.core.windows.net/"),
            ("container", "locks"),
        ]))
        .unwrap();
        assert!(!s.account.endpoint().is_path_style());
        assert!(matches!(s.account.credential(), Credential::Sas(_)));
    }

    #[test]
    fn errors_name_variables_not_values() {
        let secret = "bm90LWEtcmVhbC1rZXk-but-secret!!";
        let cases = [
            vars(&[
                ("storage_account", "a1b"),
                ("storage_origin", "http://h"),
                ("storage_key", secret),
            ]),
            vars(&[(
                "storage_connection_string",
                &format!("AccountName=x;AccountKey={secret}"),
            )]),
            vars(&[("storage_account", "a1b"), ("storage_origin", "http://h")]),
            vars(&[
                ("storage_account", "a1b"),
                ("storage_origin", "http://h"),
                ("storage_key", "a2V5"),
                ("container", "Bad_Name"),
            ]),
            vars(&[
                ("storage_account", "a1b"),
                ("storage_origin", "http://h"),
                ("storage_key", "a2V5"),
                ("storage_timeout_ms", "-3"),
            ]),
        ];
        for v in cases {
            let err = storage(&v).unwrap_err().to_string();
            assert!(err.starts_with("configuration: "), "{err}");
            assert!(!err.contains(secret), "{err}");
        }
    }
}
