//! One deployment of a function on the in-memory storage: its variables and what its
//! [`Context`] needs from its surroundings (the transport, fresh lease ids, pauses), so that a
//! native test runs a function's real steps as Spin would, without Spin.

use std::cell::Cell;
use std::collections::HashMap;
use std::time::Duration;

use leasegate::LeaseId;
use leasegate_spin::cache::NoCache;
use leasegate_spin::{Context, Pause};

use crate::memory::{Memory, STORAGE_VARIABLES};

/// A deployment: its variables (the storage ones pointing at the model) and its lease ids, on
/// a [`Memory`] it shares with the other deployments.
pub struct Instance {
    memory: Memory,
    variables: HashMap<String, String>,
    connect: Box<dyn Fn(Duration) -> Memory>,
    new_lease_id: Box<dyn Fn() -> LeaseId>,
    sleep: Box<dyn Fn(Duration) -> Pause>,
}

impl Instance {
    /// A deployment with `instance_id` and `variables`, beside [`STORAGE_VARIABLES`] (a
    /// variable given here wins). Its lease ids are fresh on every call and differ from every
    /// other deployment's (by its `instance_id`); its pauses move the shared clock on
    /// ([`Memory::pause`]).
    pub fn new(memory: &Memory, instance_id: &str, variables: &[(&str, &str)]) -> Self {
        let variables: HashMap<String, String> = STORAGE_VARIABLES
            .iter()
            .chain(&[("instance_id", instance_id)])
            .chain(variables)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        // Fowler–Noll–Vo over the id: two deployments' ids differ in their first bytes.
        let seed = instance_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let calls = Cell::new(0u64);
        let new_lease_id = move || {
            calls.set(calls.get() + 1);
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&seed.to_be_bytes());
            bytes[8..].copy_from_slice(&calls.get().to_be_bytes());
            LeaseId::from_random_bytes(bytes)
        };
        let transport = memory.clone();
        let pauses = memory.clone();
        Instance {
            memory: memory.clone(),
            variables,
            connect: Box::new(move |_timeout| transport.clone()),
            new_lease_id: Box::new(new_lease_id),
            sleep: Box::new(move |by| pauses.pause(by)),
        }
    }

    /// Its variables.
    pub fn variables(&self) -> &HashMap<String, String> {
        &self.variables
    }

    /// An invocation's context, now by the shared clock. No key-value cache (every decision
    /// reads storage); no decision log lines.
    pub fn context(&self) -> Context<'_, Memory> {
        Context {
            connect: &*self.connect,
            variables: &self.variables,
            now: self.memory.now(),
            new_lease_id: &*self.new_lease_id,
            sleep: &*self.sleep,
            cache: &NoCache,
            log_decisions: false,
        }
    }
}
