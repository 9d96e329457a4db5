//! The claim protocol as the world runs it: its callers, storage at the start, which requests
//! may fail and when the clock may move, the planted mistakes' rewrites, the notes filled in from
//! storage, and the properties checked.

use stateright::Property;

use super::caller::{run_caller, unix};
use super::properties::{
    nothing_left_by_failures, one_holder, prober_granted, tokens_rise, told_is_recorded,
};
use super::{LeaseProtocol, Mistake, Note, CONTAINER, LOCK_BLOB, START};
use crate::storage::Storage;
use crate::wire::WireRequest;
use crate::world::{Io, Protocol, Run, State, World};

/// Who storage says holds the lock right now: the native lease's id, or an unexpired record's
/// holder.
pub fn holders(storage: &Storage) -> Vec<String> {
    let Some(blob) = storage.blob(CONTAINER, LOCK_BLOB) else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    if let Some(id) = blob.leased_by(storage.clock) {
        ids.push(id.to_string());
    }
    let record = blob.metadata.get("leasegate_term").map(String::as_str) == Some("record");
    let expires: u64 = blob
        .metadata
        .get("leasegate_expires")
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    if let Some(holder) = blob.metadata.get("leasegate_holder") {
        if record && !holder.is_empty() && expires > storage.clock && !ids.contains(holder) {
            ids.push(holder.clone());
        }
    }
    ids
}

fn recorded_token(storage: &Storage, id: &str) -> Option<u64> {
    let blob = storage.blob(CONTAINER, LOCK_BLOB)?;
    (blob.metadata.get("leasegate_holder").map(String::as_str) == Some(id))
        .then(|| blob.metadata.get("leasegate_token")?.parse().ok())
        .flatten()
}

/// The mistake's rewrite of a claim write: a `PUT ?comp=metadata` of the lock blob that names a
/// holder.
fn is_claim_write(request: &WireRequest) -> bool {
    request.method == "PUT"
        && request.path().ends_with(LOCK_BLOB)
        && request.query("comp").as_deref() == Some("metadata")
        && request
            .header("x-ms-meta-leasegate_holder")
            .is_some_and(|h| !h.is_empty())
}

impl Protocol for LeaseProtocol {
    type Note = Note;

    fn callers(&self) -> usize {
        self.callers.len()
    }

    fn run(&self, i: usize, io: Io<Note>) -> Run {
        Box::pin(run_caller(i, self.callers[i].clone(), io))
    }

    fn storage(&self) -> Storage {
        let mut storage = Storage::new(START);
        if self.container {
            storage.create_container(CONTAINER);
        }
        storage
    }

    fn budgets(&self) -> (u8, u8, u8) {
        (self.faults, self.advances, 0)
    }

    fn advances(&self) -> &[u64] {
        &self.steps
    }

    fn may_act(&self, i: usize, state: &State<Note>) -> bool {
        !self.callers[i].prober || self.others_done(state)
    }

    /// Fair delivery for the prober: the network fails only the other callers' requests...
    fn may_fail(&self, i: usize, request: &WireRequest) -> bool {
        !self.callers[i].prober && request.host() != crate::world::CLOCK_HOST
    }

    /// ... and the clock moves only by its own waits once it runs.
    fn may_advance(&self, state: &State<Note>) -> bool {
        !self.others_done(state)
    }

    fn mutate(&self, request: &mut WireRequest) {
        match self.mistake {
            Some(Mistake::ClaimWithoutIfMatch) if is_claim_write(request) => {
                request.remove_header("if-match");
            }
            Some(Mistake::TokenFromCallerClock) if is_claim_write(request) => {
                let caller_secs = request
                    .header("x-ms-date")
                    .and_then(|d| httpdate::parse_http_date(d).ok())
                    .map(unix)
                    .unwrap_or(0);
                request.set_header("x-ms-meta-leasegate_token", (caller_secs << 16).to_string());
            }
            _ => {}
        }
    }

    fn on_note(
        &self,
        i: usize,
        note: Note,
        storage: &Storage,
        in_flight: &[(usize, WireRequest)],
    ) -> Note {
        match note {
            Note::Granted {
                id,
                token,
                from,
                until,
                extended,
                ..
            } => Note::Granted {
                recorded: recorded_token(storage, &id),
                id,
                token,
                from,
                until,
                extended,
            },
            Note::Failed {
                id, fresh, faults, ..
            } => Note::Failed {
                held: holders(storage).contains(&id),
                in_flight: in_flight.iter().any(|(j, _)| *j == i),
                id,
                fresh,
                faults,
            },
            other => other,
        }
    }

    fn properties() -> Vec<Property<World<Self>>> {
        vec![
            Property::always("one holder at a time", |_, s| one_holder(s)),
            Property::always(
                "fencing tokens rise across holders, stay on extension",
                |_, s| tokens_rise(s),
            ),
            Property::always("a holder's token is the one its claim records", |_, s| {
                told_is_recorded(s)
            }),
            Property::always(
                "a failed call leaves no lock held by an id it generated",
                |_, s| nothing_left_by_failures(s),
            ),
            Property::eventually("a free lock is granted (the prober gets it)", |m, s| {
                prober_granted(m, s)
            }),
        ]
    }
}
