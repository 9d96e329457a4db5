//! What the project's tests share to run its logic without Azurite: a small in-memory Blob service
//! ([`storage`], blob index tags in [`tags`]) and Table service ([`table`]) answering requests as
//! plain values ([`wire`]), and a synchronous [`Transport`](leasegate::Transport) over them
//! ([`memory::Memory`]) whose clock the test sets and advances, with a function's deployment on it
//! ([`instance::Instance`]: its variables and its `Context`). The model checker (`tests/model`)
//! explores every interleaving of callers against this storage; the functions' native tests
//! (`functions/*/tests/native.rs`) run a function's real steps on the transport and read back what
//! storage holds, in milliseconds. It models what the protocols depend on, by Azure's documented
//! rules (blobs with metadata, ETags, conditions, native leases by the storage clock, index tags
//! and their conditions, List Blobs, Find Blobs by Tags in a container, tables and the entity group
//! transaction); it does not model signatures or credentials, snapshots, copies, table queries,
//! Azurite's own quirks or the network's faults (the model checker injects those; the Spin tier
//! meets the real Azurite). In full: `docs/protocol.md`, "The model checker".

#![deny(missing_docs)]

pub mod instance;
pub mod memory;
pub mod storage;
pub mod table;
pub mod tags;
pub mod wire;
