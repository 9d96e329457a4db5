//! The core (`leasegate`) against a real Azurite: every blob operation, the lease rules,
//! racing acquirers, fencing tokens and fenced writes, a restarted Azurite, the table service.
//! No Spin.
//!
//! One binary: `cargo test -p leasegate-tests --test core`. A module per concern.

mod azurite_restart;
mod blob_ops;
mod fence_ops;
mod leases;
mod lock_rules;
mod table_ops;
