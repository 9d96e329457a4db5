//! Mixed windows never share a lock; fencing tokens rise across terms, extensions and a deleted
//! lock blob.

use super::*;

/// Native leases are 15..=60 s; every other window is a lease record. Whatever the first
/// holder took, a caller with the other kind of window is refused while it holds.
#[test]
fn mixed_windows_never_share_a_lock() {
    let c = unique_container("mixed");
    let l = locks(&c);
    for (i, (first, second)) in [(600, 30), (30, 600), (5, 15), (60, 2), (90, 45)]
        .into_iter()
        .enumerate()
    {
        let name = lock(&format!("job-{i}"));
        let a = held(acquire(&l, &name, first, random_id()));
        match acquire(&l, &name, second, random_id()) {
            Acquire::Busy { .. } => {}
            Acquire::Acquired(b) => panic!(
                "window {first} s held by one caller, and a {second} s caller acquired it too \
                 (tokens {:?} and {:?})",
                a.fencing_token, b.fencing_token
            ),
        }
    }
}

/// 64 callers race for one fresh lock (no container, no blob yet), half with a native window
/// and half with a record window: exactly one wins.
#[test]
fn mixed_windows_first_use_has_one_winner() {
    for round in 0..3 {
        let c = unique_container("mixedrace");
        let name = lock("contended");
        let start = Arc::new(Barrier::new(64));
        let handles: Vec<_> = (0..64)
            .map(|i| {
                let (c, name, start) = (c.clone(), name.clone(), start.clone());
                std::thread::spawn(move || {
                    let l = locks(&c);
                    let window = if i % 2 == 0 { 30 } else { 600 };
                    start.wait();
                    (window, acquire(&l, &name, window, random_id()))
                })
            })
            .collect();
        let outcomes: Vec<(u64, Acquire)> =
            handles.into_iter().map(|h| h.join().unwrap()).collect();
        let winners: Vec<_> = outcomes
            .iter()
            .filter(|(_, o)| matches!(o, Acquire::Acquired(_)))
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
    }
}

#[test]
fn tokens_increase_across_native_record_native() {
    let c = unique_container("kinds");
    let l = locks(&c);
    let name = lock("switching");
    let mut last = 0;
    for (i, window) in [15, 120, 30, 2, 60, 600, 45].into_iter().enumerate() {
        let id = random_id();
        let a = held(acquire(&l, &name, window, id));
        assert!(
            token(&a) > last,
            "acquisition {i} ({window} s) got token {} after {last}",
            token(&a)
        );
        last = token(&a);
        release(&l, &name, id);
    }
}

#[test]
fn extending_keeps_the_token_and_a_new_holder_gets_a_larger_one() {
    let c = unique_container("extend");
    let l = locks(&c);
    for window in [20, 300] {
        let name = lock(&format!("leader-{window}"));
        let (a, b) = (random_id(), random_id());
        let first = held(acquire(&l, &name, window, a));
        let again = held(acquire(&l, &name, window, a));
        assert_eq!(
            token(&again),
            token(&first),
            "{window} s: an extension keeps its token"
        );
        assert!(matches!(
            acquire(&l, &name, window, b),
            Acquire::Busy { .. }
        ));
        release(&l, &name, a);
        let next = held(acquire(&l, &name, window, b));
        assert!(token(&next) > token(&again), "{window} s");
        // The same id taking the lock again after a release is a new acquisition.
        release(&l, &name, b);
        let retaken = held(acquire(&l, &name, window, b));
        assert!(token(&retaken) > token(&next), "{window} s");
    }
}

/// Tokens stay increasing when the lock blob is deleted and created again, even at once (an
/// operator's clean-up right after a holder let go). The one documented exception, a blob
/// created twice within one second, is avoided by letting the first creation's second pass.
#[test]
fn tokens_do_not_restart_when_the_lock_blob_is_deleted() {
    let c = unique_container("deleted");
    let l = locks(&c);
    for window in [30, 120] {
        let name = lock(&format!("cleaned-up-{window}"));
        let id = random_id();
        let created = held(acquire(&l, &name, window, id));
        release(&l, &name, id);
        wait_for(
            "the creation's second to pass",
            Duration::from_secs(5),
            || (SystemTime::now() >= created.server_date + Duration::from_secs(1)).then_some(()),
        );
        let id = random_id();
        let before = held(acquire(&l, &name, window, id));
        release(&l, &name, id);
        let (gone, _) = block_on(l.client().execute(
            &DeleteBlob {
                container: c.clone(),
                blob: l.blob_name(&name).unwrap(),
                lease_id: None,
                condition: Condition::None,
            },
            SystemTime::now(),
        ))
        .unwrap();
        assert_eq!(gone, DeleteOutcome::Deleted);
        let after = held(acquire(&l, &name, window, random_id()));
        assert!(
            token(&after) > token(&before),
            "{window} s: token {} after the blob was re-created, {} before",
            token(&after),
            token(&before)
        );
    }
}
