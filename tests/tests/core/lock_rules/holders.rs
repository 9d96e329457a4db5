//! Who holds: refused callers see the holder's label, a creator that lost the lease is never named,
//! marks, claims.

use super::*;

/// A holder's label (its instance id) is in its claim: a refused caller and an inspection see
/// who holds the lock, since when, with which token, never its lease id.
#[test]
fn refused_callers_see_the_holders_label() {
    let c = unique_container("labels");
    let l = locks(&c);
    for window in [30, 300] {
        let name = lock(&format!("leader-{window}"));
        let a = random_id();
        let got = match block_on(l.acquire(
            &name,
            Acquiring::new(term(window), a).label("node-a"),
            SystemTime::now(),
        ))
        .unwrap()
        {
            Acquire::Acquired(got) => got,
            other => panic!("{other:?}"),
        };
        match acquire(&l, &name, window, random_id()) {
            Acquire::Busy {
                holder: Some(h), ..
            } => {
                assert_eq!(h.label, "node-a");
                assert_eq!(h.token, token(&got));
                assert_eq!(h.since, Some(got.since));
                assert_eq!(h.expires_at, got.expires_at);
            }
            other => panic!("{window} s: {other:?}"),
        }
        let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
        match info.status {
            LockStatus::Held { label, .. } => assert_eq!(label, "node-a"),
            other => panic!("{other:?}"),
        }
    }
    let bad = block_on(l.acquire(
        &lock("x"),
        Acquiring::new(term(30), random_id()).label("a\nb"),
        SystemTime::now(),
    ));
    assert!(bad.is_err());
}

/// A creator that loses the lease to another caller is never named as the holder. The first
/// caller creates the lock blob, but another can take the lease at the new blob before it
/// does; until the winner's claim is written, a reader must not see the creator's name on a
/// leased blob (it was shown, with the creator's token, as the leader).
#[test]
fn a_creator_that_lost_the_lease_is_never_named_as_holder() {
    let c = unique_container("creator");
    let l = locks(&c);
    // The container exists already: the creator's first requests are its HEAD and its create.
    held(acquire(&l, &lock("warm"), 30, random_id()));
    let name = lock("first-use");
    // A creates the blob, then its lease acquire reaches storage 2 s late.
    let a = {
        let (c, name) = (c.clone(), name.clone());
        std::thread::spawn(move || {
            let f = faulty(
                &c,
                first("lease acquire", Step::Delay(Duration::from_secs(2))),
            );
            block_on(f.acquire(
                &name,
                Acquiring::new(term(30), random_id()).label("node-a"),
                SystemTime::now(),
            ))
            .unwrap()
        })
    };
    let blob = l.blob_name(&name).unwrap();
    let created = || {
        let props = GetProperties {
            container: c.clone(),
            blob: blob.clone(),
        };
        block_on(l.client().execute(&props, SystemTime::now()))
            .unwrap()
            .0
            .is_some()
    };
    wait_for("A's create", Duration::from_secs(5), || {
        created().then_some(())
    });
    // B takes the lease at A's new blob; its claim reaches storage 2 s late.
    let b = {
        let (c, name) = (c.clone(), name.clone());
        std::thread::spawn(move || {
            let f = faulty(
                &c,
                first("PUT metadata", Step::Delay(Duration::from_secs(2))),
            );
            block_on(f.acquire(
                &name,
                Acquiring::new(term(30), random_id()).label("node-b"),
                SystemTime::now(),
            ))
            .unwrap()
        })
    };
    let leased = || {
        let props = GetProperties {
            container: c.clone(),
            blob: blob.clone(),
        };
        let (p, _) = block_on(l.client().execute(&props, SystemTime::now())).unwrap();
        p.is_some_and(|p| p.lease_state.is_some_and(leasegate::LeaseState::is_held))
    };
    wait_for("B's grant", Duration::from_secs(5), || {
        leased().then_some(())
    });
    // In B's window between its grant and its claim, nobody is named: not A.
    match acquire(&l, &name, 30, random_id()) {
        Acquire::Busy { holder, .. } => assert!(
            holder.as_ref().is_none_or(|h| h.label == "node-b"),
            "{holder:?}"
        ),
        other => panic!("{other:?}"),
    }
    match block_on(l.inspect(&name, SystemTime::now()))
        .unwrap()
        .status
    {
        LockStatus::Held { label, .. } => assert_ne!(label, "node-a"),
        LockStatus::Available => {}
    }
    let b = held(b.join().unwrap());
    assert!(matches!(a.join().unwrap(), Acquire::Busy { .. }));
    // Once B's claim is there, B is named, with B's token.
    match acquire(&l, &name, 30, random_id()) {
        Acquire::Busy {
            holder: Some(h), ..
        } => {
            assert_eq!(h.label, "node-b");
            assert_eq!(h.token, token(&b));
        }
        other => panic!("{other:?}"),
    }
}

/// Marks (metadata beside the claim, such as `progress=done`): only the holder sets them, only
/// while it holds the lock; they survive other holders' claims; an acquisition reports them as
/// they were at its grant.
#[test]
fn only_the_holder_sets_marks_and_they_outlive_it() {
    let c = unique_container("marks");
    let l = locks(&c);
    for window in [30, 300] {
        let name = lock(&format!("init-{window}"));
        let a = random_id();
        let first = held(acquire(&l, &name, window, a));
        assert!(first.marks.is_empty());
        let done: leasegate::ops::Metadata = [("progress".to_string(), "done".to_string())].into();
        // Not the holder: refused.
        assert!(!block_on(l.set_marks(&name, random_id(), &done, SystemTime::now())).unwrap());
        assert!(block_on(l.set_marks(&name, a, &done, SystemTime::now())).unwrap());
        release(&l, &name, a);
        // Released: the former holder can no longer set marks.
        assert!(!block_on(l.set_marks(&name, a, &done, SystemTime::now())).unwrap());
        let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
        assert_eq!(info.marks.get("progress").map(String::as_str), Some("done"));
        // The next holder sees them at its grant, and they stay under its claim.
        let b = random_id();
        let next = held(acquire(&l, &name, window, b));
        assert_eq!(next.marks.get("progress").map(String::as_str), Some("done"));
        let clear: leasegate::ops::Metadata = [("progress".to_string(), String::new())].into();
        assert!(block_on(l.set_marks(&name, b, &clear, SystemTime::now())).unwrap());
        let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
        assert!(info.marks.is_empty(), "{:?}", info.marks);
        assert!(matches!(info.status, LockStatus::Held { .. }));
        let own: leasegate::ops::Metadata =
            [("leasegate_token".to_string(), "1".to_string())].into();
        assert!(block_on(l.set_marks(&name, b, &own, SystemTime::now())).is_err());
    }
}

/// Issue 34: a native lock's first holder with a generated id and no label has its claim
/// written by the lock blob's create, marked as the create's (`leasegate_unconfirmed`: another
/// caller may have raced it to the lease), so a reader is not told the holder while that claim
/// stands; the holder's next claim write (an extension with its id, in a later second) removes
/// the mark, and from then on the holder is named.
#[test]
fn a_claim_written_by_the_create_is_named_once_its_holder_writes_it() {
    let c = unique_container("createclaim");
    let l = locks(&c);
    let name = lock("new");
    let id = random_id();
    let first = held(
        block_on(l.acquire(
            &name,
            Acquiring::new(term(30), id).origin(IdOrigin::Fresh),
            SystemTime::now(),
        ))
        .unwrap(),
    );
    let blob = l.blob_name(&name).unwrap();
    let props = |l: &Locks<NativeTransport>| {
        block_on(l.client().execute(
            &GetProperties {
                container: c.clone(),
                blob: blob.clone(),
            },
            SystemTime::now(),
        ))
        .unwrap()
        .0
        .expect("the lock blob")
    };
    let before = props(&l);
    assert_eq!(
        before.metadata.get("leasegate_holder").map(String::as_str),
        Some(id.to_string().as_str())
    );
    assert_eq!(
        before
            .metadata
            .get("leasegate_unconfirmed")
            .map(String::as_str),
        Some("1")
    );
    let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
    assert!(
        matches!(info.status, LockStatus::Held { holder: None, .. }),
        "{info:?}"
    );
    assert_eq!(info.fencing_token, token(&first));
    // The holder extends with its id in a later second: its claim's expiry moves, written.
    leasegate_tests::next_second();
    let again = held(acquire(&l, &name, 30, id));
    assert!(again.extended);
    assert_eq!(token(&again), token(&first));
    let after = props(&l);
    assert!(
        !after.metadata.contains_key("leasegate_unconfirmed"),
        "{:?}",
        after.metadata
    );
    let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
    assert!(
        matches!(info.status, LockStatus::Held { holder: Some(h), .. } if h == id),
        "{info:?}"
    );
}
