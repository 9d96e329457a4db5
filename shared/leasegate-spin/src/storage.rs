//! Storage steps more than one function takes.

use std::time::SystemTime;

use leasegate::lease::Locks;
use leasegate::Transport;

/// Runs `op`, creating the container first if storage says it is missing (first use).
pub async fn execute_creating_container<T: Transport, O: leasegate::ops::Operation>(
    locks: &Locks<T>,
    op: &O,
    now: SystemTime,
) -> Result<(O::Output, Option<SystemTime>), leasegate::Error> {
    match locks.execute(op, now).await {
        Err(e) if e.class() == Some(leasegate::ErrorClass::ContainerMissing) => {
            let create = leasegate::ops::CreateContainer {
                container: locks.container().clone(),
            };
            locks.execute(&create, now).await?;
            locks.execute(op, now).await
        }
        other => other,
    }
}
