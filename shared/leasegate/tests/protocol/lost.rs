//! A lost or 5xx answer gives back only what the call may have granted: never a lease the
//! caller held before the call, nor a lease or record of an id the caller chose.

use std::time::Duration;

use leasegate::lease::{Acquire, Acquiring, IdOrigin, Term};
use leasegate::Error;

use crate::script::*;

/// Issue 21.3, with review finding 3: a record lock's first create whose answer is lost (it
/// may have landed) names nobody, so the key is free right after the error: nothing to clear.
#[test]
fn a_lost_first_create_of_a_record_leaves_nothing_to_clear() {
    for origin in [IdOrigin::Fresh, IdOrigin::Known] {
        let t = Scripted::new(vec![missing(), lost_answer()]);
        let term = Term::Record(Duration::from_secs(120));
        let outcome = pollster::block_on(locks(&t).acquire(
            &name(),
            Acquiring::new(term, id(3)).origin(origin),
            server_now(),
        ));
        assert!(
            matches!(outcome, Err(Error::Transport(_))),
            "the error is reported: {outcome:?}"
        );
        let sent = t.sent();
        assert_eq!(sent.len(), 2, "{origin:?}: {sent:#?}");
        assert!(
            sent[1].holder.as_deref().unwrap_or("").is_empty(),
            "the create names nobody: {sent:#?}"
        );
    }
}

/// A create answered 503 (which may have landed) names nobody either: the error, nothing else.
#[test]
fn a_first_create_answered_503_names_nobody() {
    let t = Scripted::new(vec![missing(), busy_503()]);
    let term = Term::Record(Duration::from_secs(120));
    let outcome = first_use(&t, term, id(4));
    assert!(matches!(outcome, Err(Error::Storage(_))), "{outcome:?}");
    assert_eq!(t.sent().len(), 2, "{:#?}", t.sent());
}

/// A call that generated its id gives back a record whose compare-and-swap answer was lost
/// (it landed): the key is free right after the error.
#[test]
fn a_fresh_id_clears_a_record_whose_answer_was_lost() {
    let me = id(9);
    let t = Scripted::new(vec![
        head("available", "a", &[]),
        lost_answer(),
        head("available", "c", &record_of(me, SERVER_SECS + 120)),
        written("d"),
    ]);
    let term = Term::Record(Duration::from_secs(120));
    let outcome = first_use(&t, term, me);
    assert!(matches!(outcome, Err(Error::Transport(_))), "{outcome:?}");
    let sent = t.sent();
    assert!(sent.iter().any(released_record), "{sent:#?}");
}

/// Issue 21.8: a transient failure of that re-acquire does not release the lease the holder
/// held before the call.
#[test]
fn a_failed_reacquire_never_releases_the_holders_lease() {
    let me = id(6);
    for expires in [SERVER_SECS, SERVER_SECS + 20] {
        let t = Scripted::new(vec![
            head("leased", "a", &native_claim(me, expires)),
            busy_503(),
        ]);
        let outcome = pollster::block_on(locks(&t).acquire(
            &name(),
            Acquiring::new(native30(), me),
            server_now(),
        ));
        assert!(matches!(outcome, Err(Error::Storage(_))), "{outcome:?}");
        let sent = t.sent();
        assert!(
            !sent
                .iter()
                .any(|s| s.lease_action.as_deref() == Some("release")),
            "expires {expires}: the holder's own lease is not released: {sent:#?}"
        );
    }
}

/// A leased lock blob without a live claim may be leased by the caller itself (a holder that
/// stopped between its grant and its claim): a failed acquire does not release it either.
#[test]
fn a_failed_acquire_of_a_leased_blob_without_claim_releases_nothing() {
    let t = Scripted::new(vec![head("leased", "a", &[]), busy_503()]);
    let outcome = pollster::block_on(locks(&t).acquire(
        &name(),
        Acquiring::new(native30(), id(7)),
        server_now(),
    ));
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(
        !t.sent()
            .iter()
            .any(|s| s.lease_action.as_deref() == Some("release")),
        "{:#?}",
        t.sent()
    );
}

/// A new holder whose acquire may have been granted (503) still gives it back, when this call
/// generated its id.
#[test]
fn a_new_holder_still_gives_back_what_a_503_may_have_granted() {
    let t = Scripted::new(vec![
        head("available", "a", &[]),
        busy_503(),
        reply(answer(200)),
    ]);
    let outcome = first_use(&t, native30(), id(8));
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(
        t.sent()
            .iter()
            .any(|s| s.lease_action.as_deref() == Some("release")),
        "{:#?}",
        t.sent()
    );
}

/// Review finding 1 (native): a call whose acquire answer was lost must not release a lease
/// id that the caller chose (a client's retry with the same `Lease-Id` may hold the lock under
/// it by now: two calls, one id). Call 2, the retry, found the blob leased with no claim,
/// acquired and wrote its claim; call 1 then sees its own acquire's answer lost.
#[test]
fn a_lost_answer_never_releases_a_lease_id_the_caller_chose() {
    let me = id(10);
    let retry = Scripted::new(vec![head("leased", "a", &[]), granted(), written("b")]);
    let got = pollster::block_on(locks(&retry).acquire(
        &name(),
        Acquiring::new(native30(), me),
        server_now(),
    ));
    assert!(matches!(got, Ok(Acquire::Acquired(_))), "{got:?}");
    let first = Scripted::new(vec![
        head("available", "a", &[]),
        lost_answer(),
        reply(answer(200)),
    ]);
    let outcome = pollster::block_on(locks(&first).acquire(
        &name(),
        Acquiring::new(native30(), me),
        server_now(),
    ));
    assert!(outcome.is_err(), "{outcome:?}");
    let sent = first.sent();
    assert!(
        !sent.iter().any(lease_released),
        "the retry's lease is released under it: {sent:#?}"
    );
}

/// Review finding 1 (record): a call whose record write's answer was lost must not clear the
/// record of a lease id the caller chose: a concurrent call with that id found the record its
/// own and answered "acquired".
#[test]
fn a_lost_answer_never_clears_a_record_of_a_lease_id_the_caller_chose() {
    let me = id(11);
    let term = Term::Record(Duration::from_secs(120));
    let retry = Scripted::new(vec![head(
        "available",
        "c",
        &record_of(me, SERVER_SECS + 120),
    )]);
    let got =
        pollster::block_on(locks(&retry).acquire(&name(), Acquiring::new(term, me), server_now()));
    assert!(matches!(got, Ok(Acquire::Acquired(_))), "{got:?}");
    // The first call's first create, and its compare-and-swap on a free blob: each answer lost.
    for before in [vec![missing()], vec![head("available", "a", &[])]] {
        let mut script = before;
        script.extend([
            lost_answer(),
            head("available", "c", &record_of(me, SERVER_SECS + 120)),
            written("d"),
        ]);
        let first = Scripted::new(script);
        let outcome = pollster::block_on(locks(&first).acquire(
            &name(),
            Acquiring::new(term, me),
            server_now(),
        ));
        assert!(outcome.is_err(), "{outcome:?}");
        let sent = first.sent();
        assert!(
            !sent.iter().any(released_record),
            "the retry's record is cleared under it: {sent:#?}"
        );
    }
}

/// Review (issue 34): a step-down whose release landed but whose answer was lost. Before, the
/// release's failure was the step-down's error (the leader answers 503: try again); now the
/// fast release's failure is swallowed and the read after it finds the lease gone, so the
/// step-down answers `NotHeld`: the leader says "this instance does not lead" although it led
/// and has just stepped down.
#[test]
fn a_step_down_whose_release_answer_was_lost_is_not_told_not_held() {
    let me = id(9);
    let t = Scripted::new(vec![
        head("leased", "a", &native_claim(me, SERVER_SECS + 20)),
        written("b"),
        lost_answer(),
        head("available", "b", &native_claim(me, SERVER_SECS + 20)),
    ]);
    let r = pollster::block_on(locks(&t).step_down(
        &name(),
        me,
        std::time::Duration::from_secs(30),
        server_now(),
    ));
    assert!(
        !matches!(r, Ok(leasegate::lease::Release::NotHeld)),
        "a holder that just stepped down is told it did not hold the lock: {r:?}"
    );
}
