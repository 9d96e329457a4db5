//! A test app's application variables: the test defaults (storage and the webhook sink behind
//! their proxies, the test tokens), what an example or a template's project gets instead, and
//! the Entra ID sign-in's.

use std::collections::HashMap;

use leasegate::ContainerName;

use super::{
    manifest_variables, Entra, Manifest, ADMIN_TOKEN, DIGEST_TOKEN, GATE_TOKEN, LEASE_ID_SECRET,
    LEDGER_TOKEN, SHIP_TOKEN, TELEMETRY_TOKEN, TEMPLATE_TOKEN, TIMER_TOKEN,
};
use crate::entra::TokenServer;
use crate::proxy::Proxy;
use crate::Azurite;

/// The test defaults: storage through `storage`, the app's own `container`, every webhook
/// through `webhook`, the test tokens.
pub(super) fn test_defaults(
    storage: &Proxy,
    container: &ContainerName,
    webhook: &Proxy,
) -> HashMap<String, String> {
    HashMap::from([
        ("storage_origin".into(), storage.origin()),
        ("container".into(), container.as_str().to_string()),
        ("notify_origin".into(), webhook.origin()),
        ("gate_token".into(), GATE_TOKEN.into()),
        ("telemetry_token".into(), TELEMETRY_TOKEN.into()),
        ("lease_id_secret".into(), LEASE_ID_SECRET.into()),
        ("timer_token".into(), TIMER_TOKEN.into()),
        ("admin_token".into(), ADMIN_TOKEN.into()),
        ("instance_id".into(), "test-instance".into()),
        ("job_origin".into(), webhook.origin()),
        ("leader_origin".into(), webhook.origin()),
        ("init_origin".into(), webhook.origin()),
        ("storage_timeout_ms".into(), "3000".into()),
        // The TTL tests written before index tags mark blobs with metadata only, as an
        // older version did: they sweep by listing. The tag tests (ttl_sweeper/tags_wasm.rs) set
        // `tags`, the default of the manifests.
        ("ttl_find".into(), "list".into()),
    ])
}

/// An example's or a template project's `manifest` gets only the variables it declares, and
/// its own (its origin through `webhook`, its token); returns the ledger's proxy in front of
/// the shared Azurite table emulator under [`Manifest::Ledger`].
pub(super) fn manifests_own(
    manifest: Manifest,
    variables: &mut HashMap<String, String>,
    webhook: &Proxy,
) -> Option<Proxy> {
    if manifest == Manifest::ShipOnce {
        let declared = manifest_variables(&manifest.path());
        variables.retain(|k, _| declared.contains(k));
        variables.insert("shipping_origin".into(), webhook.origin());
        variables.insert("ship_token".into(), SHIP_TOKEN.into());
    }
    if manifest == Manifest::DailyDigest {
        let declared = manifest_variables(&manifest.path());
        variables.retain(|k, _| declared.contains(k));
        variables.insert("digest_origin".into(), webhook.origin());
        variables.insert("digest_token".into(), DIGEST_TOKEN.into());
    }
    let mut tables = None;
    if manifest == Manifest::Ledger {
        let declared = manifest_variables(&manifest.path());
        variables.retain(|k, _| declared.contains(k));
        let proxy = Proxy::start(&Azurite::shared_table().authority());
        variables.insert("table_origin".into(), proxy.origin());
        tables = Some(proxy);
        variables.insert("ledger_token".into(), LEDGER_TOKEN.into());
    }
    if let Manifest::Template(_) | Manifest::TemplateCron(_) = manifest {
        // The timer template's tick token and lease id secret are the test app's
        // (TIMER_TOKEN, LEASE_ID_SECRET).
        variables.insert("work_origin".into(), webhook.origin());
        variables.insert("api_token".into(), TEMPLATE_TOKEN.into());
        let declared = manifest_variables(&manifest.path());
        variables.retain(|k, _| declared.contains(k));
    }
    tables
}

/// Signing in to storage with Entra ID by `entra`, with the tokens of `tokens`: the storage
/// key emptied.
pub(super) fn entra(entra: Entra, tokens: &TokenServer, variables: &mut HashMap<String, String>) {
    let origin = tokens.origin();
    let mut entra_vars = vec![("storage_key", String::new()), ("token_origin", origin)];
    match entra {
        Entra::ManagedIdentity => entra_vars.extend([
            ("storage_auth", "managed_identity".to_string()),
            ("identity_endpoint", tokens.identity_endpoint()),
            ("identity_header", crate::entra::IDENTITY_HEADER.to_string()),
        ]),
        Entra::ClientSecret => entra_vars.extend([
            ("storage_auth", "client_secret".to_string()),
            ("entra_tenant_id", crate::entra::TENANT_ID.to_string()),
            ("entra_client_id", crate::entra::CLIENT_ID.to_string()),
            (
                "entra_client_secret",
                crate::entra::CLIENT_SECRET.to_string(),
            ),
        ]),
    }
    for (k, v) in entra_vars {
        variables.insert(k.into(), v);
    }
}
