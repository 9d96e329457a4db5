//! What a holder keeps: marks, fast paths from a kept state, a stale read, a step down, released
//! and broken leases.

use super::*;

/// The holder that took a lock in this call marks it and lets it go with one request each
/// (`set_marks_held`, a release from `Start::Acquired`: conditional on the ETag its own last write left), and an
/// acquire that starts from a read already made (`Start::Seen`) sends no HEAD of its own; in
/// both terms. The marks are there after the release, and the lock is free.
#[test]
fn a_holder_marks_and_releases_what_it_took_with_one_request_each() {
    let c = unique_container("held");
    let base = locks(&c);
    let l = &base;
    // The container and a first lock blob, so that counts below are of an existing blob.
    block_on(l.client().execute(
        &leasegate::ops::CreateContainer {
            container: c.clone(),
        },
        SystemTime::now(),
    ))
    .unwrap();
    for (name, term) in [
        (lock("held-native"), native(15)),
        (lock("held-record"), record(120)),
    ] {
        let first = held(acquire(l, &name, term, random_id()));
        assert_eq!(
            block_on(l.release(&name, first.lease_id, Start::Read, SystemTime::now()))
                .unwrap()
                .0,
            Release::Released
        );

        let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
        let id = random_id();
        let (o, n) = counted(&base, |cl| {
            block_on(
                cl.acquire(
                    &name,
                    Acquiring::new(term, id)
                        .origin(leasegate::lease::IdOrigin::Fresh)
                        .label("node-a")
                        .start(Start::Seen(&info)),
                    SystemTime::now(),
                ),
            )
            .unwrap()
        });
        // Native: acquire + claim; record: the compare-and-swap.
        let expected = if matches!(term, Term::Native(_)) {
            2
        } else {
            1
        };
        assert!(is_acquired(&o) && n == expected, "{term:?}: {o:?} {n}");
        let mut h = held(o);
        assert!(h.fencing_token > first.fencing_token, "{term:?}");

        let marks: leasegate::ops::Metadata = [("progress".to_string(), "done".to_string())].into();
        let (wrote, n) = counted(&base, |cl| {
            block_on(cl.set_marks_held(&name, &mut h, &marks, SystemTime::now())).unwrap()
        });
        assert!(wrote && n == 1, "{term:?}: {wrote} {n}");
        assert_eq!(h.marks.get("progress").map(String::as_str), Some("done"));
        let (released, n) = counted(&base, |cl| {
            block_on(cl.release(&name, h.lease_id, Start::Acquired(&h), SystemTime::now()))
                .unwrap()
                .0
        });
        assert!(
            released == Release::Released && n == 1,
            "{term:?}: {released:?} {n}"
        );

        let after = block_on(l.inspect(&name, SystemTime::now())).unwrap();
        assert_eq!(after.status, LockStatus::Available, "{term:?}");
        assert_eq!(
            after.marks.get("progress").map(String::as_str),
            Some("done"),
            "{term:?}"
        );
        assert_eq!(after.fencing_token, h.fencing_token.unwrap(), "{term:?}");
    }
}

/// The held fast paths are exactly as strict as reading first: when the blob changed since the
/// holder's own write (another call of the same holder marked it; the holder lost the lock
/// and another took it), storage refuses the conditional request and the call reads, as
/// `set_marks` and `release` do. Another's lock is never marked or released.
#[test]
fn held_fast_paths_read_first_when_the_blob_moved() {
    let c = unique_container("heldmoved");
    let base = locks(&c);
    let l = &base;
    for (name, term) in [
        (lock("moved-native"), native(15)),
        (lock("moved-record"), record(120)),
    ] {
        // Moved by the holder itself: the marks and the release still land (read first).
        let mut h = held(acquire(l, &name, term, random_id()));
        let other: leasegate::ops::Metadata =
            [("by_other_call".to_string(), "1".to_string())].into();
        assert!(block_on(l.set_marks(&name, h.lease_id, &other, SystemTime::now())).unwrap());
        let marks: leasegate::ops::Metadata = [("progress".to_string(), "done".to_string())].into();
        let (wrote, n) = counted(&base, |cl| {
            block_on(cl.set_marks_held(&name, &mut h, &marks, SystemTime::now())).unwrap()
        });
        // The refused write, then the HEAD and the write.
        assert!(wrote && n == 3, "{term:?}: {wrote} {n}");
        let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
        assert_eq!(
            info.marks.get("by_other_call").map(String::as_str),
            Some("1")
        );
        assert_eq!(info.marks.get("progress").map(String::as_str), Some("done"));
        // Moved by another holder: the lock is broken and taken by `b` before `h` lets go.
        block_on(l.set_marks(&name, h.lease_id, &other, SystemTime::now())).unwrap();
        block_on(l.break_lock(&name, 0, SystemTime::now())).unwrap();
        let b = held(acquire(l, &name, term, random_id()));
        let (wrote, _) = counted(&base, |cl| {
            block_on(cl.set_marks_held(&name, &mut h, &marks, SystemTime::now())).unwrap()
        });
        assert!(!wrote, "{term:?}: marked a lock another holds");
        let (released, _) = counted(&base, |cl| {
            block_on(cl.release(&name, h.lease_id, Start::Acquired(&h), SystemTime::now()))
                .unwrap()
                .0
        });
        assert_eq!(released, Release::NotHeld, "{term:?}");
        let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
        match info.status {
            LockStatus::Held { holder, .. } => assert_eq!(holder, Some(b.lease_id), "{term:?}"),
            other => panic!("{term:?}: {other:?}"),
        }
        assert_eq!(info.fencing_token, b.fencing_token.unwrap());
    }
}

/// An acquire that starts from a stale read (someone took the lock after it) never makes a
/// second holder: the grant conditional on that read is refused, and the caller is busy.
#[test]
fn an_acquire_after_a_stale_read_is_busy() {
    let c = unique_container("stale");
    let l = locks(&c);
    for (name, term) in [
        (lock("stale-native"), native(15)),
        (lock("stale-record"), record(120)),
    ] {
        let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
        let a = held(acquire(&l, &name, term, random_id()));
        let late = block_on(
            l.acquire(
                &name,
                Acquiring::new(term, random_id())
                    .origin(leasegate::lease::IdOrigin::Fresh)
                    .start(Start::Seen(&info)),
                SystemTime::now(),
            ),
        )
        .unwrap();
        assert!(matches!(late, Acquire::Busy { .. }), "{term:?}: {late:?}");
        let now = block_on(l.inspect(&name, SystemTime::now())).unwrap();
        match now.status {
            LockStatus::Held { holder, .. } => assert_eq!(holder, Some(a.lease_id), "{term:?}"),
            other => panic!("{term:?}: {other:?}"),
        }
    }
}

/// A holder's release after its lock blob moved (another call of the same holder marked it):
/// the release conditional on the holder's own last ETag is refused by storage (412, for a
/// lease release too), and the release then reads and lets go as `release` does.
#[test]
fn a_held_release_after_the_blob_moved_reads_first() {
    let c = unique_container("relmoved");
    let base = locks(&c);
    for (name, term) in [
        (lock("rel-native"), native(15)),
        (lock("rel-record"), record(120)),
    ] {
        let h = held(acquire(&base, &name, term, random_id()));
        let other: leasegate::ops::Metadata =
            [("by_other_call".to_string(), "1".to_string())].into();
        assert!(block_on(base.set_marks(&name, h.lease_id, &other, SystemTime::now())).unwrap());
        let (released, n) = counted(&base, |cl| {
            block_on(cl.release(&name, h.lease_id, Start::Acquired(&h), SystemTime::now()))
                .unwrap()
                .0
        });
        // The refused release, then the HEAD and the release.
        assert!(
            released == Release::Released && n == 3,
            "{term:?}: {released:?} {n}"
        );
        let info = block_on(base.inspect(&name, SystemTime::now())).unwrap();
        assert_eq!(info.status, LockStatus::Available, "{term:?}");
        assert_eq!(
            info.marks.get("by_other_call").map(String::as_str),
            Some("1")
        );
    }
}

/// A step-down in both terms: three requests (the HEAD, the bar under the lock, the release at
/// the ETag the bar's write left); the lock is free, and the id that stepped down is barred.
#[test]
fn a_step_down_frees_the_lock_with_three_requests_and_bars_its_id() {
    let c = unique_container("stepdown");
    let base = locks(&c);
    for (name, term) in [
        (lock("step-native"), native(15)),
        (lock("step-record"), record(120)),
    ] {
        let h = held(acquire(&base, &name, term, random_id()));
        let (r, n) = counted(&base, |cl| {
            block_on(cl.step_down(
                &name,
                h.lease_id,
                Duration::from_secs(30),
                SystemTime::now(),
            ))
            .unwrap()
        });
        assert!(r == Release::Released && n == 3, "{term:?}: {r:?} {n}");
        let info = block_on(base.inspect(&name, SystemTime::now())).unwrap();
        assert_eq!(info.status, LockStatus::Available, "{term:?}");
        match acquire(&base, &name, term, h.lease_id) {
            Acquire::Busy {
                stepped_down_until, ..
            } => assert!(stepped_down_until.is_some(), "{term:?}"),
            other => panic!("{term:?}: {other:?}"),
        }
    }
}

/// Review (issue 34), a known limit of the held release: a native lease broken by an operator
/// (`break_lock`, the portal) and untouched since is released by its old id with a 200 (Azure
/// keeps a broken lease's id until the blob is modified or leased again), and a break does not
/// move the ETag, so a release from `Start::Acquired` answers `Released` where the read-first `release` says
/// `NotHeld` (docs/protocol.md says so). Either way the lock ends free and nobody else's lock
/// is touched: once another holder takes it, its claim moves the ETag and the held release is
/// refused (`held_fast_paths_read_first_when_the_blob_moved`).
#[test]
fn a_held_release_of_a_lease_broken_since_answers_released_and_frees_the_lock() {
    let c = unique_container("relbroken");
    let l = locks(&c);
    let name = lock("broken-native");
    // The read-first release, for comparison.
    let a = held(acquire(&l, &name, native(60), random_id()));
    block_on(l.break_lock(&name, 0, SystemTime::now())).unwrap();
    assert_eq!(
        block_on(l.release(&name, a.lease_id, Start::Read, SystemTime::now()))
            .unwrap()
            .0,
        Release::NotHeld
    );
    // The held fast path on the same situation: the documented answer, the lock free.
    let b = held(acquire(&l, &name, native(60), random_id()));
    block_on(l.break_lock(&name, 0, SystemTime::now())).unwrap();
    assert_eq!(
        block_on(l.release(&name, b.lease_id, Start::Acquired(&b), SystemTime::now()))
            .unwrap()
            .0,
        Release::Released
    );
    let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
    assert_eq!(info.status, LockStatus::Available);
    assert_eq!(info.fencing_token, b.fencing_token.unwrap());
}

/// Review (issue 34): the same for a native lease that ran out untouched (Azure keeps an
/// expired lease's id until the blob is modified or leased again, and releases it by that id):
/// a release from a read says `NotHeld`, one from `Start::Acquired` says `Released`.
#[test]
fn a_held_release_of_an_expired_lease_is_not_held() {
    let c = unique_container("relexpired");
    let l = locks(&c);
    let (x, y) = (lock("expired-x"), lock("expired-y"));
    let a = held(acquire(&l, &x, native(15), random_id()));
    let b = held(acquire(&l, &y, native(15), random_id()));
    std::thread::sleep(Duration::from_secs(17));
    assert_eq!(
        block_on(l.release(&x, a.lease_id, Start::Read, SystemTime::now()))
            .unwrap()
            .0,
        Release::NotHeld
    );
    assert_eq!(
        block_on(l.release(&y, b.lease_id, Start::Acquired(&b), SystemTime::now()))
            .unwrap()
            .0,
        Release::NotHeld,
        "a release from Start::Acquired says an expired lease was released by its holder"
    );
}

/// Marks may not write over the claim: a mark named with its prefix `leasegate_` is refused,
/// by `set_marks` and `set_marks_held` alike, before any request, and the claim stays.
#[test]
fn a_mark_with_the_claims_prefix_is_refused_and_nothing_is_written() {
    let c = unique_container("claimmark");
    let base = locks(&c);
    let name = lock("claim-mark");
    let mut h = held(acquire(&base, &name, record(120), random_id()));
    let forged: leasegate::ops::Metadata =
        [("leasegate_token".to_string(), "1".to_string())].into();
    let (plain, n) = counted(&base, |cl| {
        block_on(cl.set_marks(&name, h.lease_id, &forged, SystemTime::now()))
    });
    assert!(
        matches!(plain, Err(leasegate::Error::InvalidArgument(_))) && n == 0,
        "{plain:?} {n}"
    );
    let (fast, n) = counted(&base, |cl| {
        block_on(cl.set_marks_held(&name, &mut h, &forged, SystemTime::now()))
    });
    assert!(
        matches!(fast, Err(leasegate::Error::InvalidArgument(_))) && n == 0,
        "{fast:?} {n}"
    );
    let info = block_on(base.inspect(&name, SystemTime::now())).unwrap();
    assert_eq!(info.fencing_token, h.fencing_token.unwrap());
    // The holder's fast path still works afterwards.
    let marks: leasegate::ops::Metadata = [("progress".to_string(), "done".to_string())].into();
    assert!(block_on(base.set_marks_held(&name, &mut h, &marks, SystemTime::now())).unwrap());
}

/// A new holder starting from what the last holder kept after its claim (`held_state`), once
/// that holder has released: the acquire and the claim, 2 requests, its token the next one. A
/// state that is stale (the lock taken and claimed since) costs the refused acquire, then
/// reads: 2, and the answer a read first gives (busy while that holder holds it). A lease
/// taken since with no write (the same ETag, 409): 1, busy as a read would say (the kept claim
/// is the blob's). A record term reads first (2, as from a read).
#[test]
fn a_new_holder_acquires_from_a_kept_state_without_a_read() {
    use leasegate::lease::IdOrigin;
    let c = unique_container("kept");
    let base = locks(&c);
    let name = lock("job");
    let now = SystemTime::now;
    let from_kept = |l: &CountedLocks, kept: &leasegate::lease::HeldState, term, id| {
        block_on(
            l.acquire(
                &name,
                Acquiring::new(term, id)
                    .origin(IdOrigin::Fresh)
                    .label("x")
                    .start(Start::Kept(kept, now())),
                now(),
            ),
        )
        .unwrap()
    };
    let from_kept_as = |l: &Locks<NativeTransport>, kept: &leasegate::lease::HeldState, id| {
        block_on(
            l.acquire(
                &name,
                Acquiring::new(native(15), id)
                    .label("x")
                    .start(Start::Kept(kept, now())),
                now(),
            ),
        )
        .unwrap()
    };
    let first = held(acquire(&base, &name, native(15), random_id()));
    let kept = first.held_state().expect("an ETag");
    assert_eq!(
        block_on(base.release(&name, first.lease_id, Start::Acquired(&first), now()))
            .unwrap()
            .0,
        Release::Released
    );
    let b = random_id();
    let (second, n) = counted(&base, |l| from_kept(l, &kept, native(15), b));
    let second = held(second);
    assert_eq!(n, 2, "the acquire and the claim");
    assert_eq!(second.lease_id, b);
    assert_eq!(second.fencing_token, first.fencing_token.map(|t| t + 1));
    let info = block_on(base.inspect(&name, now())).unwrap();
    assert_eq!(info.fencing_token, second.fencing_token.unwrap());
    assert!(matches!(info.status, LockStatus::Held { .. }), "{info:?}");

    // Stale: `second` holds it now (and wrote its claim): refused, then read: busy.
    let (busy, n) = counted(&base, |l| from_kept(l, &kept, native(15), random_id()));
    assert!(
        matches!(
            busy,
            Acquire::Busy {
                holder: Some(_),
                ..
            }
        ),
        "{busy:?}"
    );
    assert_eq!(n, 2, "the refused acquire (412), then the HEAD");
    let kept = second.held_state().expect("an ETag");
    // Its own holder's state with its own id: an extension (a read first), its token kept.
    let again = held(from_kept_as(&base, &kept, second.lease_id));
    assert!(again.extended, "{again:?}");
    assert_eq!(again.fencing_token, second.fencing_token);
    let kept = again.held_state().expect("an ETag");
    block_on(base.release(&name, again.lease_id, Start::Acquired(&again), now())).unwrap();

    // Leased since with no write: the ETag kept still matches, storage says 409; the read
    // after it finds a lease with no live claim of its own.
    let raw = random_id();
    block_on(base.client().execute(
        &leasegate::ops::Lease {
            container: c.clone(),
            blob: base.blob_name(&name).unwrap(),
            action: leasegate::ops::LeaseAction::Acquire {
                duration: leasegate::LeaseDuration::Seconds(15),
                proposed: raw,
            },
            condition: leasegate::ops::Condition::None,
        },
        now(),
    ))
    .unwrap();
    let (busy, n) = counted(&base, |l| from_kept(l, &kept, native(15), random_id()));
    let read = block_on(
        base.acquire(
            &name,
            Acquiring::new(native(15), random_id())
                .origin(IdOrigin::Fresh)
                .label("x"),
            now(),
        ),
    )
    .unwrap();
    let holder = |a: &Acquire| match a {
        Acquire::Busy { holder, .. } => holder.as_ref().map(|h| h.token),
        other => panic!("expected busy, got {other:?}"),
    };
    assert_eq!(holder(&busy), holder(&read), "{busy:?} / {read:?}");
    assert_eq!(holder(&busy), second.fencing_token);
    assert_eq!(n, 1, "the refused acquire (409) alone");
    block_on(base.break_lock(&name, 0, now())).unwrap();

    // A record term reads first.
    let (taken, n) = counted(&base, |l| from_kept(l, &kept, record(90), random_id()));
    assert!(is_acquired(&taken), "{taken:?}");
    assert_eq!(n, 2, "HEAD and the record's compare-and-swap");
}

/// Issue 34: a record released by its holder's one conditional write (a release from `Start::Acquired`) is
/// kept as that write left it, and the next holder takes it from there in one request: the
/// record and its claim, `If-Match` the release's ETag, the next token. Taken since by another
/// holder: the refused write, then the read (busy, as a read first says). A record kept live
/// (not released) is read first: its release may have landed unanswered.
#[test]
fn a_new_holder_takes_a_released_record_from_the_kept_state_in_one_write() {
    use leasegate::lease::IdOrigin;
    let c = unique_container("keptrec");
    let base = locks(&c);
    let name = lock("job");
    let now = SystemTime::now;
    let from_kept = |l: &CountedLocks, kept: &leasegate::lease::HeldState, id| {
        block_on(
            l.acquire(
                &name,
                Acquiring::new(record(90), id)
                    .origin(IdOrigin::Fresh)
                    .label("x")
                    .start(Start::Kept(kept, now())),
                now(),
            ),
        )
        .unwrap()
    };
    let first = held(acquire(&base, &name, record(90), random_id()));
    let live = first.held_state().expect("an ETag");
    let (released, left) =
        block_on(base.release(&name, first.lease_id, Start::Acquired(&first), now())).unwrap();
    assert_eq!(released, Release::Released);
    let left = left.expect("the state the release left");
    let kept = leasegate::lease::HeldState::from_json(&left.to_json()).expect("kept as JSON");

    let (second, n) = counted(&base, |l| from_kept(l, &kept, random_id()));
    let second = held(second);
    assert_eq!(n, 1, "the record and its claim, one write");
    assert_eq!(second.fencing_token, first.fencing_token.map(|t| t + 1));
    let info = block_on(base.inspect(&name, now())).unwrap();
    assert_eq!(info.fencing_token, second.fencing_token.unwrap());
    assert!(matches!(info.status, LockStatus::Held { .. }), "{info:?}");

    // Stale: `second` holds it now: refused (412), then read: busy.
    let (busy, n) = counted(&base, |l| from_kept(l, &kept, random_id()));
    assert!(
        matches!(
            busy,
            Acquire::Busy {
                holder: Some(_),
                ..
            }
        ),
        "{busy:?}"
    );
    assert_eq!(n, 2, "the refused write (412), then the HEAD");

    // Kept live (the first holder's state before its release): read first, then taken once
    // `second` has released.
    block_on(base.release(&name, second.lease_id, Start::Acquired(&second), now())).unwrap();
    let (third, n) = counted(&base, |l| from_kept(l, &live, random_id()));
    let third = held(third);
    assert_eq!(n, 2, "HEAD and the record's compare-and-swap");
    assert!(third.fencing_token > second.fencing_token, "{third:?}");
}
