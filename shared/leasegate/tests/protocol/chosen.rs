//! Review (issue 34): an id the caller chose, against a claim another holder (or the blob's
//! create) left on the lock blob.

use std::time::Duration;

use leasegate::lease::{Acquire, Acquiring, Term};
use leasegate::{LeaseDuration, LeaseId};

use crate::script::*;

/// Review (issue 34): a caller with a chosen id takes the lease at the new blob's ETag before
/// its creator (a fresh id with no label, whose create carries its claim), and the chosen id's
/// claim write is lost: the blob is leased by it, with the creator's claim. Acquiring again
/// with its id must settle it (storage grants its own lease), not answer busy until the
/// creator's claim runs out (never, for an infinite lease).
#[test]
fn a_chosen_id_racing_a_claiming_create_settles_its_lease_by_acquiring_again() {
    for term in [Term::Native(LeaseDuration::Infinite), native30()] {
        let (creator, chosen) = (id(31), id(32));
        let ta = Scripted::new(vec![missing(), created("c"), lease_present()]);
        let busy = first_use(&ta, term, creator);
        assert!(matches!(busy, Ok(Acquire::Busy { .. })), "{busy:?}");
        let created_with = ta.sent()[1].claim.clone();
        assert!(!created_with.is_empty(), "{:?}", ta.sent()[1]);
        let t = Scripted::new(vec![
            // The chosen id's first call: the blob as created, free; granted; the claim lost.
            head("available", "c", &created_with),
            granted(),
            lost_answer(),
            // Its retry: the blob leased (by it), the creator's claim on it.
            head("leased", "c", &created_with),
            granted(),
            written("d"),
        ]);
        let l = locks(&t);
        let first =
            pollster::block_on(l.acquire(&name(), Acquiring::new(term, chosen), server_now()));
        assert!(first.is_err(), "{first:?}");
        let again =
            pollster::block_on(l.acquire(&name(), Acquiring::new(term, chosen), server_now()));
        match again {
            Ok(Acquire::Acquired(a)) => {
                assert_eq!(a.lease_id, chosen);
                let sent = t.sent();
                let claim = sent.last().unwrap();
                assert!(claim.is_metadata_write(), "{sent:#?}");
                assert_eq!(claim.holder.as_deref(), Some(chosen.to_string().as_str()));
                assert_eq!(a.fencing_token.map(|t| t.to_string()), claim.token);
            }
            other => panic!("{term:?}: the chosen id holds the lease: {other:?}"),
        }
    }
}

/// A native claim of another's (`term`: the lease's seconds, `-1` infinite), token 7, expiring
/// at `expires`, as the blob's create wrote it (`marked`) or as a holder's own write.
fn claim_of(
    holder: LeaseId,
    term: &str,
    expires: u64,
    marked: bool,
) -> Vec<(&'static str, String)> {
    let mut claim = native_claim(holder, expires);
    claim[1].1 = term.to_string();
    if marked {
        claim.push(("leasegate_unconfirmed", "1".into()));
    }
    claim
}

/// Review (issue 34): a chosen id that finds the blob leased under a claim the create wrote
/// asks storage; refused, it is told what the claim says (the time left, the token), as a
/// caller told busy by the claim alone.
#[test]
fn a_chosen_id_refused_under_a_marked_claim_is_told_the_claims_time_left() {
    let claim = claim_of(id(51), "30", SERVER_SECS + 20, true);
    let t = Scripted::new(vec![head("leased", "c", &claim), lease_present()]);
    let outcome = pollster::block_on(locks(&t).acquire(
        &name(),
        Acquiring::new(native30(), id(52)),
        server_now(),
    ));
    match outcome {
        Ok(Acquire::Busy {
            retry_after,
            holder: Some(holder),
            ..
        }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(20)));
            assert_eq!(holder.token, 7);
        }
        other => panic!("busy, with the claim's time left: {other:?}"),
    }
    assert_eq!(t.sent().len(), 2, "{:#?}", t.sent());
}

/// Review (issue 34; older than it): an infinite holder released, its claim stays; a chosen id
/// took the lease and lost its claim's write. Acquiring again with its id settles it (storage
/// grants its own lease), where the claim in place, which never runs out, made it busy for
/// good.
#[test]
fn a_chosen_id_settles_an_infinite_lease_under_a_released_holders_claim() {
    let claim = claim_of(id(54), "-1", 0, false);
    let me = id(55);
    let t = Scripted::new(vec![head("leased", "c", &claim), granted(), written("d")]);
    let outcome = pollster::block_on(locks(&t).acquire(
        &name(),
        Acquiring::new(Term::Native(LeaseDuration::Infinite), me),
        server_now(),
    ));
    match outcome {
        Ok(Acquire::Acquired(a)) => {
            assert_eq!(a.lease_id, me);
            assert!(a.fencing_token > Some(7), "{a:?}");
        }
        other => panic!("the chosen id holds its lease: {other:?}"),
    }
    assert_eq!(t.sent()[2].holder.as_deref(), Some(me.to_string().as_str()));
}
