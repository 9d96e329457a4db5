//! Plain blob work on the shared Azurite, for tests that set a scene before the app acts
//! (containers, marked blobs) and read it back after.

use std::time::SystemTime;

use leasegate::ops::{CreateContainer, Metadata, PutBlob};
use leasegate::{BlobClient, BlobName, ContainerName};
use leasegate_cli::{block_on, NativeTransport};

use crate::Azurite;

/// A client on the shared Azurite's development account; each operation names its container.
pub fn client() -> BlobClient<NativeTransport> {
    BlobClient::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        ContainerName::try_new("unused").unwrap(),
    )
}

/// Creates container `c` (an existing one is fine).
pub fn create_container(c: &ContainerName) {
    block_on(client().execute(
        &CreateContainer {
            container: c.clone(),
        },
        SystemTime::now(),
    ))
    .unwrap();
}

/// Puts a block blob `name` in `c` with `body` and `metadata`.
pub fn put(c: &ContainerName, name: &str, body: &[u8], metadata: &[(&str, String)]) {
    let m: Metadata = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    block_on(
        client().execute(
            &PutBlob::block(c.clone(), BlobName::try_new(name).unwrap(), body.to_vec())
                .with_metadata(m),
            SystemTime::now(),
        ),
    )
    .unwrap();
}

/// `t` as RFC 3339 UTC to the second, as the marking API and the expiry tag write it.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The properties of blob `name` in `app`'s container, read from the storage the app uses,
/// past its fault proxy (`None`: no such blob).
pub fn properties(app: &crate::app::App, name: &str) -> Option<leasegate::ops::BlobProperties> {
    let blobs = BlobClient::new(
        NativeTransport::default(),
        app.inspect_account(),
        app.container.clone(),
    );
    let head = leasegate::ops::GetProperties {
        container: app.container.clone(),
        blob: BlobName::try_new(name).unwrap(),
    };
    block_on(blobs.execute(&head, SystemTime::now())).unwrap().0
}
