//! The properties of the claim protocol, read from what the callers noted: one holder at a time,
//! rising tokens, the told token recorded, nothing left held by a failed call, the prober
//! granted.

use super::{LeaseProtocol, Note};
use crate::world::{State, World};

/// A grant as the caller was told it, and when it ended: at its expiry by storage's clock, or
/// when its holder began to release it (the note's place in the log).
struct Tenure {
    id: String,
    /// The token the caller was told.
    token: u64,
    /// The token its claim records when the caller is told (`None`: the claim names another).
    recorded: Option<u64>,
    /// Where the grant is in the log.
    told: usize,
    /// Where its holder began to release it (`usize::MAX`: it did not).
    releasing: usize,
    /// The grant's `Date`.
    from: u64,
    /// Its expiry (`u64::MAX`: infinite).
    until: u64,
    extended: bool,
}

fn tenures(state: &State<Note>) -> Vec<Tenure> {
    let mut out = Vec::new();
    for (k, (i, note)) in state.log.iter().enumerate() {
        let Note::Granted {
            id,
            token,
            from,
            until,
            extended,
            recorded,
        } = note
        else {
            continue;
        };
        let releasing = state.log[k + 1..]
            .iter()
            .position(|(j, n)| j == i && matches!(n, Note::Releasing { id: r, .. } if r == id))
            .map_or(usize::MAX, |p| k + 1 + p);
        out.push(Tenure {
            id: id.clone(),
            token: *token,
            recorded: *recorded,
            told: k,
            releasing,
            from: *from,
            until: until.unwrap_or(u64::MAX),
            extended: *extended,
        });
    }
    out
}

/// When a caller is told it holds the lock, nobody else who was told so before is still a
/// holder: it has begun to release, or its grant ran out by the new grant's `Date`.
pub(super) fn one_holder(state: &State<Note>) -> bool {
    let t = tenures(state);
    t.iter().all(|b| {
        t.iter()
            .all(|a| a.told >= b.told || a.id == b.id || a.releasing < b.told || a.until <= b.from)
    })
}

pub(super) fn tokens_rise(state: &State<Note>) -> bool {
    let mut t = tenures(state);
    // In the order of the grants by storage's clock (holders never overlap: see one_holder).
    t.sort_by_key(|x| x.from);
    let recorded = |x: &Tenure| x.recorded.unwrap_or(x.token);
    t.iter().enumerate().all(|(k, b)| {
        let earlier = &t[..k];
        let extends = earlier.iter().rev().find(|a| a.id == b.id);
        if b.extended && extends.is_some_and(|a| a.token != b.token) {
            // An extension keeps the token of the tenure it extends.
            return false;
        }
        earlier.iter().all(|a| {
            if a.id == b.id && b.extended {
                recorded(b) >= recorded(a)
            } else {
                recorded(b) > recorded(a)
            }
        })
    })
}

/// The claim names the holder it was just told to, with its token.
pub(super) fn told_is_recorded(state: &State<Note>) -> bool {
    tenures(state).iter().all(|t| t.recorded == Some(t.token))
}

pub(super) fn nothing_left_by_failures(state: &State<Note>) -> bool {
    state.log.iter().all(|(_, note)| match note {
        Note::Failed {
            fresh: true,
            faults,
            held,
            in_flight,
            ..
        } => !*held || *faults > 1 || *in_flight,
        _ => true,
    })
}

pub(super) fn prober_granted(model: &World<LeaseProtocol>, state: &State<Note>) -> bool {
    state
        .log
        .iter()
        .any(|(i, note)| model.protocol.callers[*i].prober && matches!(note, Note::Granted { .. }))
}
