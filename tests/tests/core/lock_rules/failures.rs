//! Failures at every step: a failure after the take, a record landing late, garbage in a blob,
//! failed extensions and give-backs, a slow creator, a far-future server date, lost answers.

use super::*;

/// Which request of an acquisition fails, and how: whatever it is, the lock is not left taken.
#[test]
fn a_failure_after_taking_the_lock_gives_it_back() {
    let c = unique_container("leak");
    let warm = locks(&c);
    let cases: Vec<(u64, &str, Step)> = vec![
        // The acquire reached storage, its answer was lost.
        (30, "lease acquire", Step::LoseAnswer),
        // The step after the native acquire (the fencing token) failed.
        (30, "PUT metadata", Step::Status(503)),
        (30, "PUT metadata", Step::LoseAnswer),
        (30, "PUT properties", Step::Status(503)),
        (30, "PUT properties", Step::LoseAnswer),
        // The record's compare-and-swap reached storage, its answer was lost.
        (300, "PUT metadata", Step::LoseAnswer),
    ];
    for (i, (window, target, fault)) in cases.into_iter().enumerate() {
        let name = lock(&format!("leaky-{i}"));
        // Create the lock blob first, so the fault hits the hot path.
        let id = random_id();
        held(acquire(&warm, &name, window, id));
        release(&warm, &name, id);
        let hit = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = hit.clone();
        let target_owned = target.to_string();
        let fault_owned = fault.clone();
        let l = faulty(&c, move |_, request| {
            if describe(request) == target_owned
                && !seen.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                fault_owned.clone()
            } else {
                Step::Pass
            }
        });
        // An id this call generated (the lock is given back only then).
        let outcome = block_on(l.acquire(
            &name,
            Acquiring::new(term(window), random_id()).origin(IdOrigin::Fresh),
            SystemTime::now(),
        ));
        if !hit.load(std::sync::atomic::Ordering::SeqCst) {
            // This design does not send that request on this path: nothing to test.
            continue;
        }
        assert!(
            outcome.is_err(),
            "case {i} ({window} s, {target} -> {fault:?}): {outcome:?}"
        );
        // Whoever comes next gets the lock at once.
        match acquire(&warm, &name, window, random_id()) {
            Acquire::Acquired(_) => {}
            other => panic!("case {i} ({window} s, {target} -> {fault:?}): left taken: {other:?}"),
        }
    }
}

/// A 1 s record whose compare-and-swap lands when the second is over gives its holder no
/// exclusive time: it must not answer "acquired".
#[test]
fn a_short_record_that_landed_too_late_is_not_acquired() {
    let c = unique_container("late");
    let name = lock("blink");
    let warm = locks(&c);
    let id = random_id();
    held(acquire(&warm, &name, 1, id));
    release(&warm, &name, id);
    let l = faulty(&c, |_, request| {
        if describe(request) == "PUT metadata" {
            Step::Delay(Duration::from_millis(2500))
        } else {
            Step::Pass
        }
    });
    match block_on(l.acquire(
        &name,
        Acquiring::new(term(1), random_id()),
        SystemTime::now(),
    )) {
        Ok(Acquire::Acquired(a)) => panic!("acquired with no time left: {a:?}"),
        Ok(Acquire::Busy { .. }) | Err(_) => {}
    }
}

/// Garbage or out-of-range numbers in a lock blob's metadata: a clear error naming the field,
/// never a panic, never a token that goes back.
#[test]
fn garbage_in_a_lock_blob_is_a_clear_error() {
    let c = unique_container("garbage");
    let l = locks(&c);
    let cases = [
        ("leasegate_token", "18446744073709551615"),
        ("leasegate_token", "99999999999999999999999"),
        ("leasegate_token", "twelve"),
        ("leasegate_token", "-3"),
        ("leasegate_expires", "18446744073709551615"),
        ("leasegate_expires", "soon"),
    ];
    for (i, (field, value)) in cases.into_iter().enumerate() {
        for window in [30, 300] {
            let name = lock(&format!("bad-{i}-{window}"));
            let id = random_id();
            held(acquire(&l, &name, window, id));
            release(&l, &name, id);
            let blob = l.blob_name(&name).unwrap();
            let (props, _) = block_on(l.client().execute(
                &GetProperties {
                    container: c.clone(),
                    blob: blob.clone(),
                },
                SystemTime::now(),
            ))
            .unwrap();
            let mut metadata: Metadata = props.unwrap().metadata;
            metadata.insert(field.into(), value.into());
            metadata.insert("leasegate_holder".into(), random_id().to_string());
            block_on(l.client().execute(
                &SetMetadata {
                    container: c.clone(),
                    blob,
                    metadata,
                    lease_id: None,
                    condition: Condition::None,
                },
                SystemTime::now(),
            ))
            .unwrap();
            let outcome = block_on(l.acquire(
                &name,
                Acquiring::new(term(window), random_id()),
                SystemTime::now(),
            ));
            let err = match outcome {
                Err(e) => e.to_string(),
                Ok(o) => panic!("{field}={value} ({window} s): expected an error, got {o:?}"),
            };
            assert!(err.contains(field), "{field}={value}: {err}");
            let info = block_on(l.inspect(&name, SystemTime::now()));
            assert!(info.is_err(), "{field}={value}: inspect: {info:?}");
        }
    }
}

/// A refused caller learns how long the holder's lock has left, by the server's clock, for
/// native leases too.
#[test]
fn busy_answers_carry_the_holders_time_left() {
    let c = unique_container("retry");
    let l = locks(&c);
    for (holder_window, caller_window) in [(60, 15), (45, 600), (600, 20)] {
        let name = lock(&format!("held-{holder_window}-{caller_window}"));
        held(acquire(&l, &name, holder_window, random_id()));
        match acquire(&l, &name, caller_window, random_id()) {
            Acquire::Busy {
                retry_after: Some(left),
                ..
            } => assert!(
                left <= Duration::from_secs(holder_window)
                    && left + Duration::from_secs(10) >= Duration::from_secs(holder_window),
                "{holder_window}/{caller_window}: {left:?}"
            ),
            other => panic!("{holder_window}/{caller_window}: {other:?}"),
        }
    }
}

/// A failed *extension* must not give back the lock its holder already held (review finding).
///
/// `native::take` (on an acquire error that `may_have_granted`) and `record::acquire` (on a
/// compare-and-swap error that `may_have_granted`) release/clear with the caller's lease id.
/// When the caller was extending, that id already held the lock, so the give-back ends a
/// tenure that an earlier `Acquired` promised until `expires_at`. Here the extension request
/// is answered 503 *without ever reaching storage*, yet the holder's lock is gone and a second
/// caller acquires while the holder's earlier `expires_at` is still ~30 s / ~300 s away:
/// two callers believe they hold the lock at once.
#[test]
fn a_failed_extension_does_not_end_the_tenure_it_extends() {
    let c = unique_container("failext");
    let l = locks(&c);
    let mut broken = Vec::new();
    for (window, target) in [(30, "lease acquire"), (300, "PUT metadata")] {
        let name = lock(&format!("leader-{window}"));
        let a = random_id();
        let first_grant = held(acquire(&l, &name, window, a));
        // The extension: storage is never reached (the fault answers 503 ServerBusy itself).
        // A second longer, so that the record's compare-and-swap is sent even within the
        // second of the first grant (a record that names the expiry already is not written).
        let f = faulty(&c, first(target, Step::Status(503)));
        let ext = block_on(f.acquire(
            &name,
            Acquiring::new(term(window + 1), a),
            SystemTime::now(),
        ));
        assert!(ext.is_err(), "{window} s: {ext:?}");
        // The first grant still has most of its time left...
        let now = SystemTime::now();
        let promised = first_grant.expires_at.unwrap();
        assert!(promised > now + Duration::from_secs(window / 2));
        // ...so nobody else may take the lock now.
        if let Acquire::Acquired(b) = acquire(&l, &name, window, random_id()) {
            broken.push(format!(
                "{window} s: holder A was promised the lock until {:?} (token {}), but after \
                 its failed extension ({target} answered 503, never sent) B acquired it at \
                 {:?} (token {})",
                promised,
                token(&first_grant),
                b.server_date,
                token(&b)
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "the extension's error path gave back a lock its holder held:\n{}",
        broken.join("\n")
    );
}

/// A lock natively leased by `id` *and* carrying a live record of `id` (a term switch whose
/// give-back failed) is freed by `id`'s release, both ways at once (review finding).
///
/// Trigger (fault): a holder switches from a native lease to a record (`record::acquire`,
/// `switching`: the record is written under the lease, then `native::give_back`). The give-back
/// is best effort and its failure is ignored, so the call answers `Acquired` while the blob is
/// still leased. The holder later releases: `native::release` succeeds, `release` returns
/// `Released` at once, and the record keeps the lock for its whole window.
#[test]
fn a_release_after_a_switch_whose_give_back_failed_frees_the_lock() {
    let c = unique_container("switchrel");
    let l = locks(&c);
    let name = lock("switcher");
    let a = random_id();
    held(acquire(&l, &name, 30, a));
    // Switch to a 120 s record; the give-back of the native lease is answered 503 (not sent).
    let f = faulty(&c, first("lease release", Step::Status(503)));
    let switched =
        held(block_on(f.acquire(&name, Acquiring::new(term(120), a), SystemTime::now())).unwrap());
    assert!(switched.extended);
    let released = block_on(l.release(&name, a, Start::Read, SystemTime::now()))
        .unwrap()
        .0;
    assert_eq!(released, Release::Released);
    let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
    match acquire(&l, &name, 120, random_id()) {
        Acquire::Acquired(_) => {}
        other => panic!(
            "A released (answer {released:?}) but the lock is still held: {other:?}; \
             inspect after the release: {info:?}"
        ),
    }
}

/// A fencing token must never go back that goes back for a new holder, outside the documented exceptions
/// (`claim::first_token`: "a blob created twice within one second", "more than 65,536 tokens
/// within one second", "the server's clock steps back").
///
/// `first_token` is computed from the `Date` of the HEAD that found the blob missing, but it is
/// written by a create that may land much later. Between the two, the blob can be created by
/// someone else, issue later-second tokens and be deleted again (an operator's clean-up). The
/// slow creator's token is then below tokens already issued, though the two creations are
/// seconds apart.
#[test]
fn a_slow_creator_never_issues_a_token_below_an_earlier_one() {
    let c = unique_container("slowcreate");
    let l = locks(&c);
    // The container exists already (so the only delayed step is the blob creation).
    held(acquire(&l, &lock("warm"), 5, random_id()));
    let name = lock("recreated");
    let slow = {
        let (c, name) = (c.clone(), name.clone());
        std::thread::spawn(move || {
            // A's create (a PUT with x-ms-blob-type) reaches storage 3 s after its HEAD (kept
            // under Azurite's 5 s keep-alive, so the pooled connection is still good).
            let f = faulty(&c, |_, request| {
                if request.headers().contains("x-ms-blob-type") {
                    Step::Delay(Duration::from_secs(3))
                } else {
                    Step::Pass
                }
            });
            block_on(f.acquire(
                &name,
                Acquiring::new(term(120), random_id()),
                SystemTime::now(),
            ))
            .unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // B creates the blob in the meantime, with a 1 s record. (A 1 s record whose write lands in
    // the next server second is not granted, by rule: on a loaded machine B asks again.)
    let b = (0..5)
        .find_map(|_| match acquire(&l, &name, 1, random_id()) {
            Acquire::Acquired(b) => Some(b),
            _ => None,
        })
        .expect("B takes a 1 s record within five tries");
    std::thread::sleep(Duration::from_millis(1200));
    // C comes after B's record ran out: a token above B's.
    let c_id = random_id();
    let cc = held(acquire(&l, &name, 120, c_id));
    assert!(token(&cc) > token(&b));
    block_on(l.release(&name, c_id, Start::Read, SystemTime::now())).unwrap();
    // An operator cleans the free lock blob up.
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
    // A's create lands now (seconds after B's), on the missing blob.
    let a = held(slow.join().unwrap());
    assert!(
        token(&a) > token(&cc),
        "A got token {} (created at {:?}) after C's {} (taken at {:?}); B's was {} (created at \
         {:?})",
        token(&a),
        a.server_date,
        token(&cc),
        cc.server_date,
        token(&b),
        b.server_date
    );
}

/// FINDING (retry-after): `Snapshot::busy` says a native claim's `expires - now` while the claim
/// has not run out. The claim is written once per tenure and not moved by an extension, so
/// after an extension this is *shorter* than what the holder has left, not "an upper bound"
/// (docs of `Acquire::Busy::retry_after`). A caller that waits the advertised time is refused.
#[test]
fn retry_after_of_an_extended_native_lease_is_not_too_short() {
    let c = unique_container("retryext");
    let l = locks(&c);
    let name = lock("extended");
    let a = random_id();
    held(acquire(&l, &name, 15, a));
    std::thread::sleep(Duration::from_secs(9));
    let ext = held(acquire(&l, &name, 15, a));
    assert!(ext.extended);
    let left = ext.expires_at.unwrap();
    match acquire(&l, &name, 15, random_id()) {
        Acquire::Busy {
            retry_after: Some(r),
            ..
        } => {
            let now = SystemTime::now();
            let really_left = left.duration_since(now).unwrap_or_default();
            assert!(
                r + Duration::from_secs(1) >= really_left,
                "retry_after {r:?}, but the holder's extended lease has {really_left:?} left"
            );
        }
        other => panic!("expected busy with a retry_after: {other:?}"),
    }
}

/// A transport that makes storage's answers to lease acquires carry a `Date` at the end of
/// year 9999 (a hostile or broken server, or a man in the middle on `http`).
struct FarFuture(NativeTransport);

impl Transport for FarFuture {
    async fn send(
        &self,
        request: leasegate::Request,
    ) -> Result<leasegate::Response, TransportError> {
        let acquire = request
            .headers()
            .get("x-ms-lease-action")
            .is_some_and(|v| v == "acquire");
        let mut response = self.0.send(request).await?;
        if acquire {
            response
                .headers_mut()
                .insert("date", "Fri, 31 Dec 9999 23:59:59 GMT");
        }
        Ok(response)
    }
}

/// The happy-path switch native -> record -> release frees the lock.
#[test]
fn a_switch_then_a_release_frees_the_lock() {
    let c = unique_container("switchctl");
    let l = locks(&c);
    let name = lock("control");
    let a = random_id();
    held(acquire(&l, &name, 30, a));
    held(acquire(&l, &name, 120, a));
    assert_eq!(
        block_on(l.release(&name, a, Start::Read, SystemTime::now()))
            .unwrap()
            .0,
        Release::Released
    );
    assert!(matches!(
        block_on(l.inspect(&name, SystemTime::now()))
            .unwrap()
            .status,
        LockStatus::Available
    ));
    held(acquire(&l, &name, 120, random_id()));
}

/// A storage `Date` at the end of year 9999 (a broken or hostile server) is a clear error for
/// the acquire that got it, gives back what it may have taken, and leaves the lock usable: no
/// expiry out of range, no panic where it is formatted (review finding).
#[test]
fn a_far_future_server_date_is_refused_without_poisoning_the_lock() {
    let c = unique_container("fardate");
    let l = locks(&c);
    let name = lock("dated");
    let prev = random_id();
    held(acquire(&l, &name, 30, prev));
    release(&l, &name, prev);
    let hostile = Locks::new(
        FarFuture(NativeTransport::default()),
        Azurite::shared().account(),
        c.clone(),
    );
    let got = block_on(hostile.acquire(
        &name,
        Acquiring::new(term(30), random_id()).origin(IdOrigin::Fresh),
        SystemTime::now(),
    ));
    let err = got.expect_err("a Date in year 9999 is refused").to_string();
    assert!(err.contains("out of range"), "{err}");
    held(acquire(&l, &name, 30, random_id()));
}

/// The answer of a term switch (native to record) is lost: the caller keeps the lock it held
/// (the error ends nothing it was granted), acquiring again with its id settles it, and its
/// release frees it (review finding, under the rule of `Locks::acquire`).
#[test]
fn a_lost_answer_on_a_term_switch_is_settled_by_the_holder() {
    let c = unique_container("lostswitch");
    let l = locks(&c);
    let name = lock("lost-switch");
    let a = random_id();
    held(acquire(&l, &name, 15, a));
    let f = faulty(&c, first("PUT metadata", Step::LoseAnswer));
    let outcome = block_on(f.acquire(&name, Acquiring::new(term(120), a), SystemTime::now()));
    assert!(outcome.is_err(), "{outcome:?}");
    // Whoever else asks is refused: the lock is still the caller's.
    assert!(matches!(
        acquire(&l, &name, 120, random_id()),
        Acquire::Busy { .. }
    ));
    // The caller asks again: it has the 120 s record, with its token.
    let again = held(acquire(&l, &name, 120, a));
    assert!(again.extended);
    assert_eq!(release_of(&l, &name, a), Release::Released);
    held(acquire(&l, &name, 120, random_id()));
}

/// A holder that stops between its grant and its claim (a killed invocation) gets its lock back
/// when it asks again with its id, once the claim it left in place (the previous holder's) has
/// run out: within one term (review finding).
#[test]
fn a_holder_that_stopped_before_its_claim_gets_its_lock_back() {
    let c = unique_container("crashclaim");
    let l = locks(&c);
    let name = lock("crashed");
    let prev = random_id();
    held(acquire(&l, &name, 15, prev));
    release(&l, &name, prev);
    let a = random_id();
    let crashing = faulty(&c, |_, request| {
        if describe(request) == "PUT metadata" {
            panic!("invocation killed between grant and claim (test)");
        }
        Step::Pass
    });
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        block_on(crashing.acquire(&name, Acquiring::new(term(15), a), SystemTime::now()))
    }));
    assert!(crashed.is_err());
    // Another caller is refused (storage says the lease is held)...
    assert!(matches!(
        acquire(&l, &name, 15, random_id()),
        Acquire::Busy { .. }
    ));
    // ...and A, asking again, gets it back within the term.
    let back = wait_for(
        "A to get its lock back",
        Duration::from_secs(20),
        || match acquire(&l, &name, 15, a) {
            Acquire::Acquired(got) => Some(got),
            Acquire::Busy { .. } => None,
        },
    );
    assert!(token(&back) > 0);
}
