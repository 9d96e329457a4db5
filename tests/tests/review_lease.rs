//! Adversarial review of the lease core (`shared/leasegate/src/lease/`), against a real Azurite.
//!
//! Every test here states what the module docs promise and checks it; a failing test is a
//! finding (see the comment on each test for the interleaving and the code it points at).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use leasegate::lease::{Acquire, Acquired, LockStatus, Locks, Release, Term};
use leasegate::ops::{Condition, DeleteBlob, DeleteOutcome};
use leasegate::{ContainerName, LeaseDuration, LeaseId, LockName, Transport, TransportError};
use leasegate_native::{block_on, NativeTransport};
use leasegate_tests::{describe, unique_container, Azurite, Faulty, Step};

fn locks(container: &ContainerName) -> Locks<NativeTransport> {
    Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        container.clone(),
    )
}

fn faulty(
    container: &ContainerName,
    rule: impl Fn(usize, &http::Request<Vec<u8>>) -> Step + Send + Sync + 'static,
) -> Locks<Faulty<NativeTransport>> {
    Locks::new(
        Faulty::new(NativeTransport::default(), rule),
        Azurite::shared().account(),
        container.clone(),
    )
}

/// Faults the first request that `describe`s as `target` (and only that one).
fn first(target: &'static str, step: Step) -> impl Fn(usize, &http::Request<Vec<u8>>) -> Step {
    let hit = AtomicBool::new(false);
    move |_, request| {
        if describe(request) == target && !hit.swap(true, Ordering::SeqCst) {
            step.clone()
        } else {
            Step::Pass
        }
    }
}

fn lock(name: &str) -> LockName {
    LockName::try_new(name).unwrap()
}

fn random_id() -> LeaseId {
    LeaseId::from_random_bytes(*uuid::Uuid::new_v4().as_bytes())
}

fn term(secs: u64) -> Term {
    Term::for_window(Duration::from_secs(secs)).unwrap()
}

fn acquire<T: Transport>(l: &Locks<T>, name: &LockName, t: Term, id: LeaseId) -> Acquire {
    block_on(l.acquire(name, t, id, SystemTime::now())).unwrap()
}

fn held(outcome: Acquire) -> Acquired {
    match outcome {
        Acquire::Acquired(a) => a,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

fn token(a: &Acquired) -> u64 {
    a.fencing_token.expect("a fencing token")
}

/// FINDING: a failed *extension* gives back the lock its holder already held.
///
/// `native::take` (on an acquire error that `may_have_granted`) and `record::acquire` (on a
/// compare-and-swap error that `may_have_granted`) release/clear with the caller's lease id.
/// When the caller was extending, that id already held the lock, so the give-back ends a
/// tenure that an earlier `Acquired` promised until `expires_at`. Here the extension request
/// is answered 503 *without ever reaching storage*, yet the holder's lock is gone and a second
/// caller acquires while the holder's earlier `expires_at` is still ~30 s / ~300 s away:
/// two callers believe they hold the lock at once.
#[test]
fn review_a_failed_extension_does_not_end_the_tenure_it_extends() {
    let c = unique_container("rvext");
    let l = locks(&c);
    let mut broken = Vec::new();
    for (window, target) in [(30, "lease acquire"), (300, "PUT metadata")] {
        let name = lock(&format!("leader-{window}"));
        let a = random_id();
        let first_grant = held(acquire(&l, &name, term(window), a));
        // The extension: storage is never reached (the fault answers 503 ServerBusy itself).
        let f = faulty(&c, first(target, Step::Status(503)));
        let ext = block_on(f.acquire(&name, term(window), a, SystemTime::now()));
        assert!(ext.is_err(), "{window} s: {ext:?}");
        // The first grant still has most of its time left...
        let now = SystemTime::now();
        let promised = first_grant.expires_at.unwrap();
        assert!(promised > now + Duration::from_secs(window / 2));
        // ...so nobody else may take the lock now.
        if let Acquire::Acquired(b) = acquire(&l, &name, term(window), random_id()) {
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

/// FINDING: `Locks::release` answers `Released` after a successful native release and never
/// looks at the record, so a lock that is natively leased by `id` *and* carries a live record
/// of `id` stays held by that record after "release".
///
/// Trigger (fault): a holder switches from a native lease to a record (`record::acquire`,
/// `switching`: the record is written under the lease, then `native::give_back`). The give-back
/// is best effort and its failure is ignored, so the call answers `Acquired` while the blob is
/// still leased. The holder later releases: `native::release` succeeds, `release` returns
/// `Released` at once, and the record keeps the lock for its whole window.
#[test]
fn review_release_after_a_switch_whose_give_back_failed_frees_the_lock() {
    let c = unique_container("rvswitch");
    let l = locks(&c);
    let name = lock("switcher");
    let a = random_id();
    held(acquire(&l, &name, term(30), a));
    // Switch to a 120 s record; the give-back of the native lease is answered 503 (not sent).
    let f = faulty(&c, first("lease release", Step::Status(503)));
    let switched = held(block_on(f.acquire(&name, term(120), a, SystemTime::now())).unwrap());
    assert!(switched.extended);
    let released = block_on(l.release(&name, a, SystemTime::now())).unwrap();
    assert_eq!(released, Release::Released);
    let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
    match acquire(&l, &name, term(120), random_id()) {
        Acquire::Acquired(_) => {}
        other => panic!(
            "A released (answer {released:?}) but the lock is still held: {other:?}; \
             inspect after the release: {info:?}"
        ),
    }
}

/// FINDING (same root as above, no fault at all): `acquire_unfenced` with a native term over
/// the caller's own live record takes the lease without writing a claim (`claim` is `None`
/// when `!fenced`), leaving "leased + live record of the same id". `release` then answers
/// `Released` after the native release alone; the record keeps the lock.
#[test]
fn review_release_after_unfenced_native_over_own_record_frees_the_lock() {
    let c = unique_container("rvunf");
    let l = locks(&c);
    let name = lock("unfenced-over-record");
    let a = random_id();
    held(acquire(&l, &name, term(300), a));
    let native = held(block_on(l.acquire_unfenced(&name, term(30), a, SystemTime::now())).unwrap());
    assert!(native.extended);
    let released = block_on(l.release(&name, a, SystemTime::now())).unwrap();
    assert_eq!(released, Release::Released);
    match acquire(&l, &name, term(300), random_id()) {
        Acquire::Acquired(_) => {}
        other => panic!("A released (answer {released:?}) but the lock is still held: {other:?}"),
    }
}

/// FINDING: an error returned while storage holds a *record* for the caller (category: left
/// taken after a failure).
///
/// A holder of a 15 s native lease switches to a 120 s record; the compare-and-swap lands but
/// its answer is lost. `record::acquire` calls `clear(Some(id))`, which returns `NotHeld` at
/// once because the blob is leased (`live_record` requires `!leased`), and the native lease is
/// not released either. The caller gets an error; once the 15 s lease runs out, the 120 s record
/// it was told it did not get keeps everyone out for ~105 s more.
#[test]
fn review_a_lost_answer_on_a_switch_leaves_nothing_behind() {
    let c = unique_container("rvlost");
    let l = locks(&c);
    let name = lock("lost-switch");
    let a = random_id();
    held(acquire(&l, &name, term(15), a));
    let f = faulty(&c, first("PUT metadata", Step::LoseAnswer));
    let outcome = block_on(f.acquire(&name, term(120), a, SystemTime::now()));
    assert!(outcome.is_err(), "{outcome:?}");
    // Wait for the 15 s native lease (which A held before the call) to run out.
    std::thread::sleep(Duration::from_secs(17));
    let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
    match acquire(&l, &name, term(120), random_id()) {
        Acquire::Acquired(_) => {}
        other => panic!(
            "the switch failed with an error, A's native lease ran out, yet the lock is held: \
             {other:?}; inspect: {info:?}"
        ),
    }
}

/// FINDING (liveness; infinite leases): a holder that stops between the native grant and its
/// claim write (a trapped or killed invocation) leaves a lease that its own id cannot take
/// again: `busy_for` trusts the claim (`native_claim()` is the previous holder's or `None`),
/// so acquiring with the id that *does* hold the lease answers `Busy`. With an infinite lease
/// the lock stays taken until someone who knows to `release` that id does.
#[test]
fn review_a_holder_that_stopped_before_its_claim_can_take_its_lock_again() {
    let c = unique_container("rvcrash");
    let l = locks(&c);
    let name = lock("infinite");
    // Create the lock blob and leave it free (a previous holder came and went).
    let prev = random_id();
    held(acquire(
        &l,
        &name,
        Term::Native(LeaseDuration::Infinite),
        prev,
    ));
    block_on(l.release(&name, prev, SystemTime::now())).unwrap();
    let a = random_id();
    // The invocation stops (panics) when it is about to write its claim, after the grant.
    let crashing = faulty(&c, |_, request| {
        if describe(request) == "PUT metadata" {
            panic!("invocation killed between grant and claim (test)");
        }
        Step::Pass
    });
    let crashed = catch_unwind(AssertUnwindSafe(|| {
        block_on(crashing.acquire(
            &name,
            Term::Native(LeaseDuration::Infinite),
            a,
            SystemTime::now(),
        ))
    }));
    assert!(crashed.is_err());
    // A's next invocation: it holds the lease (storage says so), it asks again with its id.
    let again = acquire(&l, &name, Term::Native(LeaseDuration::Infinite), a);
    let info = block_on(l.inspect(&name, SystemTime::now())).unwrap();
    assert!(
        matches!(again, Acquire::Acquired(_)),
        "A holds the infinite lease but acquiring with A's id answers {again:?} (inspect: \
         {info:?}); nobody but an operator can free it"
    );
}

/// FINDING: a fencing token that goes back for a new holder, outside the documented exceptions
/// (`claim::first_token`: "a blob created twice within one second", "more than 65,536 tokens
/// within one second", "the server's clock steps back").
///
/// `first_token` is computed from the `Date` of the HEAD that found the blob missing, but it is
/// written by a create that may land much later. Between the two, the blob can be created by
/// someone else, issue later-second tokens and be deleted again (an operator's clean-up). The
/// slow creator's token is then below tokens already issued, though the two creations are
/// seconds apart.
#[test]
fn review_a_slow_creator_never_issues_a_token_below_an_earlier_one() {
    let c = unique_container("rvslow");
    let l = locks(&c);
    // The container exists already (so the only delayed step is the blob creation).
    held(acquire(&l, &lock("warm"), term(5), random_id()));
    let name = lock("recreated");
    let slow = {
        let (c, name) = (c.clone(), name.clone());
        std::thread::spawn(move || {
            // A's create (a PUT with x-ms-blob-type) reaches storage 3 s after its HEAD (kept
            // under Azurite's 5 s keep-alive, so the pooled connection is still good).
            let f = faulty(&c, |_, request| {
                if request.headers().contains_key("x-ms-blob-type") {
                    Step::Delay(Duration::from_secs(3))
                } else {
                    Step::Pass
                }
            });
            block_on(f.acquire(&name, term(120), random_id(), SystemTime::now())).unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // B creates the blob in the meantime, with a 1 s record.
    let b = held(acquire(&l, &name, term(1), random_id()));
    std::thread::sleep(Duration::from_millis(1200));
    // C comes after B's record ran out: a token above B's.
    let c_id = random_id();
    let cc = held(acquire(&l, &name, term(120), c_id));
    assert!(token(&cc) > token(&b));
    block_on(l.release(&name, c_id, SystemTime::now())).unwrap();
    // An operator cleans the free lock blob up.
    let (gone, _) = block_on(l.execute(
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
fn review_retry_after_of_an_extended_native_lease_is_not_too_short() {
    let c = unique_container("rvretry");
    let l = locks(&c);
    let name = lock("extended");
    let a = random_id();
    held(acquire(&l, &name, term(15), a));
    std::thread::sleep(Duration::from_secs(9));
    let ext = held(acquire(&l, &name, term(15), a));
    assert!(ext.extended);
    let left = ext.expires_at.unwrap();
    match acquire(&l, &name, term(15), random_id()) {
        Acquire::Busy {
            retry_after: Some(r),
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
        request: http::Request<Vec<u8>>,
    ) -> Result<http::Response<Vec<u8>>, TransportError> {
        let acquire = request
            .headers()
            .get("x-ms-lease-action")
            .is_some_and(|v| v == "acquire");
        let mut response = self.0.send(request).await?;
        if acquire {
            response.headers_mut().insert(
                "date",
                http::HeaderValue::from_static("Fri, 31 Dec 9999 23:59:59 GMT"),
            );
        }
        Ok(response)
    }
}

/// FINDING (panic from a storage answer): a lease acquire answered with `Date` 9999-12-31
/// 23:59:59 gives `Acquired::expires_at` in year 10000 (`granted + d`, unchecked). Both HTTP
/// handlers format it with `web::rfc3339` (`humantime::format_rfc3339_seconds(..).to_string()`)
/// which panics for years past 9999: a trap of the component. The claim written with it
/// (`expires = 253402300799 + 30`, above `MAX_SECS`) also makes the lock unusable
/// (`CorruptLock`) for everyone afterwards.
#[test]
fn review_a_far_future_server_date_neither_panics_nor_poisons_the_lock() {
    let c = unique_container("rvdate");
    let l = locks(&c);
    let name = lock("dated");
    let prev = random_id();
    held(acquire(&l, &name, term(30), prev));
    block_on(l.release(&name, prev, SystemTime::now())).unwrap();
    let hostile = Locks::new(
        FarFuture(NativeTransport::default()),
        Azurite::shared().account(),
        c.clone(),
    );
    let a = random_id();
    let got = block_on(hostile.acquire(&name, term(30), a, SystemTime::now()));
    let held_until = match &got {
        Ok(Acquire::Acquired(h)) => h.expires_at.unwrap(),
        other => panic!("expected the hostile-dated acquire to succeed: {other:?}"),
    };
    // What gate.rs / telemetry.rs do with it (web::rfc3339).
    let formatted = catch_unwind(|| humantime::format_rfc3339_seconds(held_until).to_string());
    block_on(l.release(&name, a, SystemTime::now())).unwrap();
    let after = block_on(l.acquire(&name, term(30), random_id(), SystemTime::now()));
    assert!(
        formatted.is_ok() && after.is_ok(),
        "expires_at {held_until:?} (from one storage Date) panics when the handlers format it: \
         {}; and after that holder released, the next acquire answers {after:?}",
        formatted.is_err()
    );
}

/// Sanity (expected to pass): the happy-path switch native -> record -> release frees the lock.
#[test]
fn review_control_switch_then_release_frees_the_lock() {
    let c = unique_container("rvctl");
    let l = locks(&c);
    let name = lock("control");
    let a = random_id();
    held(acquire(&l, &name, term(30), a));
    held(acquire(&l, &name, term(120), a));
    assert_eq!(
        block_on(l.release(&name, a, SystemTime::now())).unwrap(),
        Release::Released
    );
    assert!(matches!(
        block_on(l.inspect(&name, SystemTime::now()))
            .unwrap()
            .status,
        LockStatus::Available
    ));
    held(acquire(&l, &name, term(120), random_id()));
}
