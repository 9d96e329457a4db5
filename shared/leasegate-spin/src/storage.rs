//! Storage steps more than one function takes.

use std::time::SystemTime;

use leasegate::ops::{CreateContainer, Operation};
use leasegate::{BlobClient, ContainerName, ErrorClass, Transport};

/// Runs `op`, first creating `container` (the one `op` writes to) when storage says it is
/// missing (first use), then running `op` again.
pub async fn execute_creating_container<T: Transport, O: Operation>(
    blobs: &BlobClient<T>,
    container: &ContainerName,
    op: &O,
    now: SystemTime,
) -> Result<(O::Output, Option<SystemTime>), leasegate::Error> {
    match blobs.execute(op, now).await {
        Err(e) if e.class() == Some(ErrorClass::ContainerMissing) => {
            let create = CreateContainer {
                container: container.clone(),
            };
            blobs.execute(&create, now).await?;
            blobs.execute(op, now).await
        }
        other => other,
    }
}
