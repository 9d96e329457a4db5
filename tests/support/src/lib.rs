//! The storage model the project's tests share: a small in-memory Blob service ([`storage`],
//! with blob index tags in [`tags`]) and Table service ([`table`]), answering requests as plain
//! values ([`wire`]). The model checker (`tests/model`) explores every interleaving of callers
//! against it. What it models and what not: `docs/protocol.md`, "The model checker".

#![deny(missing_docs)]

pub mod storage;
pub mod table;
pub mod tags;
pub mod wire;
