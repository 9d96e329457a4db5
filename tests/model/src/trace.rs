//! A counterexample, step by step: each request with what decides it (conditions, lease ids,
//! the claim it writes), what came back, the storage clock, and what each caller concluded.

use std::fmt::Write;

use crate::wire::{WireRequest, WireResponse};
use crate::world::{Action, Answer, Protocol, State, Status, World};

/// One request in a line: method, blob, and the headers that decide it.
pub fn request(r: &WireRequest) -> String {
    let path = r.path();
    // Drop the account: /devstoreaccount1/container/blob -> container/blob.
    let path = path.trim_start_matches('/');
    let path = path.split_once('/').map_or(path, |(_, rest)| rest);
    let mut line = format!("{} {}", r.method, path);
    if let Some(comp) = r.query("comp") {
        let _ = write!(line, "?comp={comp}");
    }
    for name in [
        "x-ms-lease-action",
        "x-ms-lease-duration",
        "x-ms-proposed-lease-id",
        "x-ms-lease-id",
        "if-match",
        "if-none-match",
        "x-ms-meta-leasegate_holder",
        "x-ms-meta-leasegate_term",
        "x-ms-meta-leasegate_expires",
        "x-ms-meta-leasegate_token",
        "x-ms-meta-leasegate_run",
        "x-ms-meta-leasegate_attempt",
        "x-leasegate-fencing-token",
        "x-leasegate-attempt",
        "x-ms-if-tags",
        "x-ms-tags",
    ] {
        if let Some(v) = r.header(name) {
            let short = name
                .trim_start_matches("x-ms-meta-leasegate_")
                .trim_start_matches("x-ms-")
                .trim_start_matches("x-leasegate-");
            // Tags travel percent-encoded: shown decoded.
            let v = match name {
                "x-ms-tags" => percent_encoding::percent_decode_str(v)
                    .decode_utf8_lossy()
                    .into_owned(),
                _ => v.to_string(),
            };
            let _ = write!(line, " {short}={}", short_id(&v));
        }
    }
    if r.path().ends_with("/$batch") {
        for op in crate::table::batch_summary(r) {
            let _ = write!(line, " [{op}]");
        }
    }
    line
}

/// Lease ids are long: their first 8 characters tell them apart here.
fn short_id(v: &str) -> String {
    if v.len() == 36 && v.chars().filter(|c| *c == '-').count() == 4 {
        v[..8].to_string()
    } else {
        v.to_string()
    }
}

/// One answer in a line.
pub fn response(r: &WireResponse) -> String {
    let mut line = r.status.to_string();
    for name in ["x-ms-error-code", "x-ms-lease-state", "etag"] {
        if let Some(v) = r.header(name) {
            let _ = write!(line, " {v}");
        }
    }
    if let Some(holder) = r.header("x-ms-meta-leasegate_holder") {
        let _ = write!(line, " holder={}", short_id(holder));
    }
    if let Some(token) = r.header("x-ms-meta-leasegate_token") {
        let _ = write!(line, " token={token}");
    }
    line
}

/// The step `action` from `last` to `next`, in a line (and the notes it made, one a line).
pub fn step<P: Protocol>(world: &World<P>, last: &State<P::Note>, action: &Action) -> String {
    let next = stateright::Model::next_state(world, last, action.clone());
    let clock = last.storage.clock - crate::world::START;
    let mut line = format!("[t+{clock}s] ");
    // A request as it arrived (a planted mistake rewrites it on its way).
    let waiting = |i: usize| match &last.callers[i].status {
        Status::Waiting(r) => {
            let mut r = r.clone();
            if crate::world::is_storage(&r) {
                world.protocol.mutate(&mut r);
            }
            request(&r)
        }
        _ => String::new(),
    };
    let got = |i: usize| {
        next.as_ref()
            .and_then(|n| n.callers[i].answers.last())
            .map_or(String::new(), |a| match a {
                Answer::Response(r) => response(r),
                Answer::Failed(f) => format!("{f:?}"),
            })
    };
    match action {
        Action::Deliver(i) => {
            let _ = write!(line, "caller {i}: {} -> {}", waiting(*i), got(*i));
        }
        Action::Fail(i, fault) => {
            let _ = write!(
                line,
                "caller {i}: {} -> FAULT {fault:?} (caller sees {})",
                waiting(*i),
                got(*i)
            );
        }
        Action::Land(k) => {
            let (i, r) = &last.in_flight[*k];
            let mut r = r.clone();
            if crate::world::is_storage(&r) {
                world.protocol.mutate(&mut r);
            }
            let _ = write!(line, "late request of caller {i} lands: {}", request(&r));
        }
        Action::Advance(secs) => {
            let _ = write!(line, "storage clock +{secs}s");
        }
        Action::Crash(i) => {
            let _ = write!(line, "caller {i} vanishes");
        }
    }
    if let Some(next) = next {
        for (i, note) in next.log.iter().skip(last.log.len()) {
            let _ = write!(line, "\n           caller {i} concludes: {note:?}");
        }
    }
    line
}

/// A whole path, one step a line.
pub fn explain<P: Protocol>(
    world: &World<P>,
    path: &stateright::Path<State<P::Note>, Action>,
) -> String {
    let mut out = String::new();
    for (state, action) in path.clone().into_vec() {
        if let Some(action) = action {
            let _ = writeln!(out, "{}", step(world, &state, &action));
        }
    }
    out
}
