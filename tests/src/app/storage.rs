//! Where a test app's storage is: the Azurite [`Setup`] chooses, the proxies in front of it,
//! and the runtime config that trusts the test CA when storage is reached over HTTPS.

use std::path::{Path, PathBuf};

use super::{manifest_components, Setup, STORAGE_COMPONENTS};
use crate::proxy::Proxy;
use crate::Azurite;

/// The Azurite behind the app's storage proxy: [`Setup::azurite`], the one that checks tokens
/// under [`Setup::entra`], the one on the app's clock under [`Setup::azurite_same_clock`], or
/// the shared one.
pub(super) fn azurite_of(setup: &Setup) -> &'static Azurite {
    assert!(
        !(setup.azurite_same_clock && setup.entra.is_some()),
        "Setup::azurite_same_clock does not go with Setup::entra (its Azurite checks tokens)"
    );
    assert!(
        setup.azurite.is_none() || !(setup.azurite_same_clock || setup.entra.is_some()),
        "Setup::azurite does not go with Setup::azurite_same_clock or Setup::entra"
    );
    if let Some(azurite) = setup.azurite {
        azurite
    } else if setup.entra.is_some() {
        Azurite::shared_oauth()
    } else if setup.azurite_same_clock {
        Azurite::at_clock_offset(setup.clock_offset_ms)
    } else {
        Azurite::shared()
    }
}

/// The proxy between the app and `azurite` (speaking TLS under [`Setup::storage_tls`]), and
/// under [`Setup::entra`] a plain-HTTP one to the same Azurite for the test's own reads.
pub(super) fn proxies(setup: &Setup, azurite: &Azurite) -> (Proxy, Option<Proxy>) {
    if setup.entra.is_some() {
        let azurite = azurite.authority();
        (
            Proxy::start_tls_to_tls(&azurite),
            Some(Proxy::start_to_tls(&azurite)),
        )
    } else if setup.storage_tls {
        (Proxy::start_tls(&azurite.authority()), None)
    } else {
        (Proxy::start(&azurite.authority()), None)
    }
}

/// `runtime_config` with a `[[client_tls]]` entry trusting the test CA (its PEM written into a
/// scratch folder, added to `scratch`) for every storage component `manifest` has, or for all
/// of its components when it has none of them.
pub(super) fn client_tls(
    runtime_config: Option<&str>,
    manifest: &Path,
    scratch: &mut Vec<PathBuf>,
) -> String {
    let dir = crate::spin::scratch_dir("tls");
    let ca_file = crate::tls::TestCa::shared().write_ca_pem(&dir);
    scratch.push(dir);
    let all = manifest_components(manifest);
    let mut components: Vec<String> = all
        .iter()
        .filter(|c| STORAGE_COMPONENTS.contains(&c.as_str()))
        .cloned()
        .collect();
    if components.is_empty() {
        // A user's own app (the example, a project from the template).
        components = all;
    }
    crate::tls::client_tls_runtime_config(runtime_config, &components, &ca_file)
}
