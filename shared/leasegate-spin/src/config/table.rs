//! The Table service's endpoint: `table_origin`, beside the blob service's `storage_origin`.

use leasegate::{Account, Credential, TableEndpoint};

use super::{secure, var, ConfigError, Storage, Variables};

/// `storage`'s account with its Table service at `table_origin` (`scheme://host[:port]`: path
/// style `{origin}/{account}`, as Azurite serves, unless the host starts with `{account}.`,
/// Azure's host style). A connection string's `TableEndpoint` (or the one it derives) must be
/// that origin: Spin lets the component reach `table_origin` only. The same credential signs
/// both services (SharedKey by the Table service's rules).
pub fn table_account(vars: &dyn Variables, storage: &Storage) -> Result<Account, ConfigError> {
    let origin = var(vars, "table_origin")
        .map(|o| o.trim_end_matches('/').to_string())
        .ok_or_else(|| {
            ConfigError(
                "variable table_origin is not set: scheme://host[:port] of the Table service \
                 (http://127.0.0.1:10002 for Azurite, https://ACCOUNT.table.core.windows.net \
                 for Azure)"
                    .into(),
            )
        })?;
    let name = storage.account.name().to_string();
    let endpoint = match storage.account.table_endpoint() {
        // A connection string's endpoint (given, or derived from its account and suffix).
        Some(given) if var(vars, "storage_connection_string").is_some() => {
            if !given.origin().eq_ignore_ascii_case(&origin) {
                return Err(ConfigError(format!(
                    "the table endpoint of storage_connection_string is at {}, but \
                     table_origin is not: set table_origin={} (Spin lets the component reach \
                     table_origin only)",
                    given.origin(),
                    given.origin()
                )));
            }
            given.clone()
        }
        _ => {
            let host = origin
                .find(':')
                .and_then(|i| origin[i..].strip_prefix("://"));
            let url = if host.is_some_and(|h| h.starts_with(&format!("{name}."))) {
                origin.clone()
            } else {
                format!("{origin}/{name}")
            };
            TableEndpoint::try_new(&url)
                .map_err(|e| ConfigError(format!("variable table_origin: {e}")))?
        }
    };
    let in_clear = matches!(
        storage.account.credential(),
        Credential::Bearer(_) | Credential::Sas(_)
    );
    if in_clear && !secure(&endpoint.origin()) {
        return Err(ConfigError(
            "variable table_origin: a SAS or a bearer token is sent only over https (or over \
             http to this machine); set it to the account's https origin"
                .into(),
        ));
    }
    Ok(storage.account.clone().with_table_endpoint(endpoint))
}

#[cfg(test)]
mod tests {
    use super::super::storage;
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const KEY: &str = leasegate::DEV_ACCOUNT_KEY;

    #[test]
    fn the_table_endpoint_follows_table_origin() {
        let v = vars(&[
            ("storage_account", "devstoreaccount1"),
            ("storage_key", KEY),
            ("storage_origin", "http://127.0.0.1:10000"),
            ("table_origin", "http://127.0.0.1:10002/"),
        ]);
        let account = table_account(&v, &storage(&v).unwrap()).unwrap();
        let table = account.table_endpoint().unwrap();
        assert_eq!(table.base_url(), "http://127.0.0.1:10002/devstoreaccount1");
        let v = vars(&[
            ("storage_account", "acme"),
            ("storage_key", KEY),
            ("storage_origin", "https://acme.blob.core.windows.net"),
            ("table_origin", "https://acme.table.core.windows.net"),
        ]);
        let account = table_account(&v, &storage(&v).unwrap()).unwrap();
        assert_eq!(
            account.table_endpoint().unwrap().base_url(),
            "https://acme.table.core.windows.net"
        );
    }

    #[test]
    fn a_missing_or_mismatched_table_origin_is_named() {
        let mut v = vars(&[
            ("storage_account", "devstoreaccount1"),
            ("storage_key", KEY),
            ("storage_origin", "http://127.0.0.1:10000"),
        ]);
        let err = table_account(&v, &storage(&v).unwrap()).unwrap_err().0;
        assert!(err.contains("table_origin is not set"), "{err}");
        v.insert(
            "storage_connection_string".into(),
            "UseDevelopmentStorage=true".into(),
        );
        v.insert("table_origin".into(), "http://127.0.0.1:20002".into());
        let err = table_account(&v, &storage(&v).unwrap()).unwrap_err().0;
        assert!(
            err.contains("set table_origin=http://127.0.0.1:10002"),
            "{err}"
        );
        v.insert("table_origin".into(), "http://127.0.0.1:10002".into());
        assert!(table_account(&v, &storage(&v).unwrap()).is_ok());
        // A SAS goes to a table service elsewhere over https only; the SAS is not named.
        let v = vars(&[
            ("storage_account", "acme"),
            (
                "storage_sas",
                "sv=2021-12-02&ss=bt&srt=sco&sp=rwdlacu&sig=c2VjcmV0",
            ),
            ("storage_origin", "https://acme.blob.core.windows.net"),
            ("table_origin", "http://acme.example.com"),
        ]);
        let err = table_account(&v, &storage(&v).unwrap()).unwrap_err().0;
        assert!(err.contains("https") && !err.contains("c2VjcmV0"), "{err}");
    }
}
