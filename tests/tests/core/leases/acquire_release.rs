//! Acquire and release against Azurite: the container and blob created, 32 racing acquirers,
//! extension and expiry, rising tokens, record leases, a safe retried release.

use super::*;

#[test]
fn acquire_creates_missing_container_and_blob() {
    let c = unique_container("fresh");
    let l = locks(&c);
    let name = lock("jobs/nightly");
    let a = held(acquire(&l, &name, native(15), random_id()));
    // The first token of a lock is the server's clock in seconds (of the next second) × 2^16.
    let server_secs = a
        .server_date
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = a.fencing_token.unwrap();
    assert_eq!(token % (1 << 16), 0, "{token}");
    assert!(
        (server_secs - 1..=server_secs + 1).contains(&(token >> 16)),
        "{token}"
    );
    let expires = a.expires_at.unwrap().duration_since(a.server_date).unwrap();
    assert_eq!(expires, Duration::from_secs(15));
    // The lock blob now exists as an empty page blob, leased, with its holder's claim.
    let (props, _) = block_on(l.client().execute(
        &GetProperties {
            container: c.clone(),
            blob: l.blob_name(&name).unwrap(),
        },
        SystemTime::now(),
    ))
    .unwrap();
    let props = props.expect("lock blob exists");
    assert_eq!(props.lease_state, Some(LeaseState::Leased));
    assert_eq!(props.blob_type.as_deref(), Some("PageBlob"));
    assert_eq!(
        props.metadata.get("leasegate_token").unwrap().as_str(),
        token.to_string()
    );
    assert_eq!(
        props.metadata.get("leasegate_holder").unwrap().as_str(),
        a.lease_id.to_string()
    );
    assert_eq!(props.metadata.get("leasegate_term").unwrap().as_str(), "15");
}

#[test]
fn thirty_two_concurrent_acquirers_one_winner() {
    for term in [native(60), record(90)] {
        let c = unique_container("race");
        let name = lock("contended");
        // Create the container and blob first? No: racing creators must not be errors either.
        let start = Arc::new(Barrier::new(32));
        let handles: Vec<_> = (0..32)
            .map(|_| {
                let (c, name, start) = (c.clone(), name.clone(), start.clone());
                std::thread::spawn(move || {
                    let l = locks(&c);
                    let id = random_id();
                    start.wait();
                    (id, acquire(&l, &name, term, id))
                })
            })
            .collect();
        let outcomes: Vec<(LeaseId, Acquire)> =
            handles.into_iter().map(|h| h.join().unwrap()).collect();
        let winners: Vec<_> = outcomes
            .iter()
            .filter_map(|(id, o)| matches!(o, Acquire::Acquired(_)).then_some(*id))
            .collect();
        assert_eq!(winners.len(), 1, "{term:?}: {outcomes:?}");
        // Storage agrees: the winner can extend, a loser cannot take it.
        let l = locks(&c);
        assert!(matches!(
            acquire(&l, &name, term, winners[0]),
            Acquire::Acquired(_)
        ));
        let loser = outcomes.iter().find(|(id, _)| *id != winners[0]).unwrap().0;
        assert!(matches!(
            acquire(&l, &name, term, loser),
            Acquire::Busy { .. }
        ));
    }
}

#[test]
fn reacquire_extends_and_expiry_admits_another_holder() {
    let c = unique_container("extend");
    let l = locks(&c);
    let name = lock("leader");
    let (a, b) = (
        LeaseId::for_holder(&key(), "test", "node-a", &name),
        LeaseId::for_holder(&key(), "test", "node-b", &name),
    );
    let first = held(acquire(&l, &name, native(15), a));
    std::thread::sleep(Duration::from_secs(8));
    // A's next invocation: the same id extends the lease by another 15 s, same token.
    let extended = held(acquire(&l, &name, native(15), a));
    assert!(extended.expires_at > first.expires_at);
    assert!(extended.extended && !first.extended);
    assert_eq!(extended.fencing_token, first.fencing_token);
    assert_eq!(extended.since, first.since);
    // Past the first lease's end (15 s after the first acquire), B is still refused...
    let past_first = first.expires_at.unwrap() + Duration::from_secs(1);
    wait_for("the first lease's end", Duration::from_secs(20), || {
        (SystemTime::now() >= past_first).then_some(())
    });
    assert!(matches!(
        acquire(&l, &name, native(15), b),
        Acquire::Busy { .. }
    ));
    // ...and once the extended lease runs out, B takes over, with a larger token.
    let taken = wait_for(
        "B to acquire after expiry",
        Duration::from_secs(25),
        || match acquire(&l, &name, native(15), b) {
            Acquire::Acquired(got) => Some(got),
            Acquire::Busy { .. } => None,
        },
    );
    assert!(taken.fencing_token > extended.fencing_token);
    assert!(matches!(
        acquire(&l, &name, native(15), a),
        Acquire::Busy { .. }
    ));
}

#[test]
fn fencing_tokens_strictly_increase_across_holders() {
    for term in [native(15), record(120)] {
        let c = unique_container("fence");
        let l = locks(&c);
        let name = lock("fenced");
        let holders = [
            LeaseId::for_holder(&key(), "test", "a", &name),
            LeaseId::for_holder(&key(), "test", "b", &name),
        ];
        let mut last = 0;
        for i in 0..20 {
            let who = holders[i % 2];
            let got = held(acquire(&l, &name, term, who));
            let token = got.fencing_token.unwrap();
            assert!(
                token > last,
                "{term:?}: acquisition {i} got {token} after {last}"
            );
            last = token;
            assert_eq!(
                block_on(l.release(&name, who, Start::Read, SystemTime::now()))
                    .unwrap()
                    .0,
                Release::Released
            );
        }
        let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
        assert_eq!(info.fencing_token, last);
        assert_eq!(info.status, LockStatus::Available);
    }
}

#[test]
fn record_lease_beyond_sixty_seconds() {
    let c = unique_container("record");
    let l = locks(&c);
    let name = lock("long/window");
    let (a, b) = (random_id(), random_id());
    let got = held(acquire(&l, &name, record(90), a));
    let length = got
        .expires_at
        .unwrap()
        .duration_since(got.server_date)
        .unwrap();
    assert_eq!(length, Duration::from_secs(90));
    match acquire(&l, &name, record(90), b) {
        Acquire::Busy {
            retry_after: Some(left),
            ..
        } => {
            assert!(
                left > Duration::from_secs(80) && left <= Duration::from_secs(90),
                "{left:?}"
            )
        }
        other => panic!("second holder must be refused with a retry time: {other:?}"),
    }
    let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
    assert_eq!(
        info.status,
        LockStatus::Held {
            expires_at: got.expires_at,
            holder: Some(a),
            since: Some(got.since),
            label: String::new(),
        }
    );
    // The holder extends and keeps its token.
    let again = held(acquire(&l, &name, record(90), a));
    assert_eq!(again.fencing_token, got.fencing_token);
}

#[test]
fn short_record_admits_next_holder_after_expiry() {
    let c = unique_container("short");
    let l = locks(&c);
    let name = lock("blip");
    let (a, b) = (random_id(), random_id());
    let first = held(acquire(&l, &name, record(2), a));
    assert!(matches!(
        acquire(&l, &name, record(2), b),
        Acquire::Busy {
            retry_after: Some(_),
            ..
        }
    ));
    let second = wait_for(
        "the 2 s record to run out",
        Duration::from_secs(10),
        || match acquire(&l, &name, record(2), b) {
            Acquire::Acquired(got) => Some(got),
            Acquire::Busy { .. } => None,
        },
    );
    assert!(second.fencing_token > first.fencing_token);
    // A's release is now a no-op (it lost the lock), B's is real, and a retry is harmless.
    assert_eq!(
        block_on(l.release(&name, a, Start::Read, SystemTime::now()))
            .unwrap()
            .0,
        Release::NotHeld
    );
    assert_eq!(
        block_on(l.release(&name, b, Start::Read, SystemTime::now()))
            .unwrap()
            .0,
        Release::Released
    );
    assert_eq!(
        block_on(l.release(&name, b, Start::Read, SystemTime::now()))
            .unwrap()
            .0,
        Release::NotHeld
    );
}

#[test]
fn release_is_safe_to_retry_and_break_frees() {
    let c = unique_container("release");
    let l = locks(&c);
    let name = lock("r");
    let a = random_id();
    assert_eq!(
        block_on(l.release(&name, a, Start::Read, SystemTime::now()))
            .unwrap()
            .0,
        Release::NotHeld
    );
    held(acquire(&l, &name, native(60), a));
    assert_eq!(
        block_on(l.release(&name, a, Start::Read, SystemTime::now()))
            .unwrap()
            .0,
        Release::Released
    );
    assert_eq!(
        block_on(l.release(&name, a, Start::Read, SystemTime::now()))
            .unwrap()
            .0,
        Release::NotHeld
    );

    // Break ends another holder's lease (native and record alike).
    for term in [native(60), record(300)] {
        let holder = random_id();
        held(acquire(&l, &name, term, holder));
        assert!(matches!(
            acquire(&l, &name, term, random_id()),
            Acquire::Busy { .. }
        ));
        block_on(l.break_lock(&name, 0, SystemTime::now())).unwrap();
        let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
        assert_eq!(info.status, LockStatus::Available, "{term:?}");
        held(acquire(&l, &name, term, random_id()));
        block_on(l.break_lock(&name, 0, SystemTime::now())).unwrap();
    }
}
