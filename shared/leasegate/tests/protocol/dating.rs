//! Issue 21.1: each request is dated when it is sent, by the transport's clock if it has one.

use std::time::{Duration, SystemTime};

use leasegate::lease::{Acquire, Acquiring};

use crate::script::*;

/// Issue 21.1: every request is dated when it is sent, by the transport's clock, not with the
/// time the call began (storage refuses SharedKey requests dated more than 15 minutes off).
#[test]
fn each_request_is_dated_when_it_is_sent() {
    let started = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
    let step = Duration::from_secs(20 * 60);
    // A free lock blob: HEAD, acquire, claim.
    let t = Scripted::new(vec![head("available", "a", &[]), granted(), written("b")])
        .with_clock(started + Duration::from_secs(5), step);
    let outcome =
        pollster::block_on(locks(&t).acquire(&name(), Acquiring::new(native30(), id(1)), started));
    assert!(matches!(outcome, Ok(Acquire::Acquired(_))), "{outcome:?}");
    let sent = t.sent();
    assert_eq!(sent.len(), 3, "{sent:#?}");
    for (i, s) in sent.iter().enumerate() {
        let at = s.sent_at.expect("the clock runs");
        assert_eq!(at, started + Duration::from_secs(5) + step * i as u32);
        assert_eq!(
            s.date,
            httpdate::fmt_http_date(at),
            "request {i} ({} {}) is dated when it is sent",
            s.method,
            s.uri
        );
    }
}

/// Without a clock in the transport, the caller's `now` dates the requests (as before).
#[test]
fn without_a_clock_the_callers_time_dates_the_requests() {
    let started = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
    let t = Scripted::new(vec![head("available", "a", &[]), granted(), written("b")]);
    pollster::block_on(locks(&t).acquire(&name(), Acquiring::new(native30(), id(1)), started))
        .unwrap();
    for s in t.sent() {
        assert_eq!(s.date, httpdate::fmt_http_date(started));
    }
}
