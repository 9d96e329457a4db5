//! The rules of `docs/protocol.md` that need storage to answer on cue, each against scripted
//! storage answers: each request dated when it is sent; a lost or 5xx answer gives back only
//! what the call may have granted, and never a lease the caller held or an id it chose; a lock
//! blob's first create names nobody; a holder in the last second of its native lease keeps its
//! token; a claim write never lowers a token; a copy answer without a status is pending. The
//! transport answers from a script, records what it was sent, and (where a test needs one) has
//! a clock of its own.
//!
//! One module per rule: `dating`, `lost`, `tokens`, `first_holder`, `chosen`, `kept`, `copy`;
//! the scripted storage they share in `script`.

mod chosen;
mod copy;
mod dating;
mod first_holder;
mod kept;
mod lost;
mod script;
mod tokens;
