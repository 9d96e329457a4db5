//! A lock blob's first holder: a record's first create names nobody; a native lock's names
//! its first holder only when that holder is a fresh, unlabelled id with a lease that ends.

use std::time::Duration;

use leasegate::lease::{Acquire, Acquiring, IdOrigin, Term};
use leasegate::{LeaseDuration, Method};

use crate::script::*;

/// Review finding 3: a record lock's first create names nobody (holder empty, first token), and
/// the record is then taken with the ordinary compare-and-swap; a create that lands late (after
/// its answer was lost) so grants nothing, and there is nothing to clear.
#[test]
fn a_record_locks_first_create_names_nobody() {
    let me = id(14);
    let term = Term::Record(Duration::from_secs(120));
    let t = Scripted::new(vec![missing(), created("c"), written("d")]);
    let outcome =
        pollster::block_on(locks(&t).acquire(&name(), Acquiring::new(term, me), server_now()));
    match outcome {
        Ok(Acquire::Acquired(a)) => {
            assert_eq!(a.lease_id, me);
            assert_eq!(a.fencing_token, Some((SERVER_SECS + 1) << 16));
        }
        other => panic!("acquired: {other:?}"),
    }
    let sent = t.sent();
    assert_eq!(sent.len(), 3, "HEAD, create, compare-and-swap: {sent:#?}");
    let create = &sent[1];
    assert!(
        create.method == Method::PUT && !create.uri.contains("comp="),
        "{create:?}"
    );
    assert!(
        create.holder.as_deref().unwrap_or("").is_empty(),
        "the create names nobody: {create:?}"
    );
    assert_eq!(sent[2].holder.as_deref(), Some(me.to_string().as_str()));
}

/// Issue 34: a native lock's first holder, with an id the call generated and no label, has
/// its claim written by the create (by the read's `Date`): a grant in the same second finds it
/// there, and the first use is 3 requests (HEAD, create, acquire at the create's ETag).
#[test]
fn a_fresh_unlabelled_first_holder_claims_in_its_create() {
    let me = id(21);
    let t = Scripted::new(vec![missing(), created("c"), granted()]);
    let outcome = first_use(&t, native30(), me);
    let first = (SERVER_SECS + 1) << 16;
    match outcome {
        Ok(Acquire::Acquired(a)) => {
            assert_eq!(a.lease_id, me);
            assert_eq!(a.fencing_token, Some(first));
            assert_eq!(a.expires_at, Some(server_now() + Duration::from_secs(30)));
        }
        other => panic!("acquired: {other:?}"),
    }
    let sent = t.sent();
    assert_eq!(sent.len(), 3, "HEAD, create, acquire: {sent:#?}");
    let create = &sent[1];
    assert_eq!(create.holder.as_deref(), Some(me.to_string().as_str()));
    assert_eq!(create.token.as_deref(), Some(first.to_string().as_str()));
    assert_eq!(
        create.expires.as_deref(),
        Some((SERVER_SECS + 30).to_string().as_str())
    );
    assert!(
        create
            .claim
            .contains(&("leasegate_unconfirmed", "1".to_string())),
        "marked as the create's claim: {create:?}"
    );
    assert_eq!(sent[2].lease_action.as_deref(), Some("acquire"));
    assert!(sent[2].uri.contains("comp=lease"), "{:?}", sent[2]);
}

/// The same, granted in a later second than the read: the claim's expiry (from the grant's
/// `Date`) is written under the lease, as for any other first holder.
#[test]
fn a_first_holder_granted_in_a_later_second_writes_its_claim() {
    let me = id(22);
    let t = Scripted::new(vec![
        missing(),
        created("c"),
        granted_later(1),
        written("d"),
    ]);
    let outcome = first_use(&t, native30(), me);
    assert!(matches!(outcome, Ok(Acquire::Acquired(_))), "{outcome:?}");
    let sent = t.sent();
    assert_eq!(sent.len(), 4, "{sent:#?}");
    assert!(sent[3].is_metadata_write(), "{:?}", sent[3]);
    assert_eq!(
        sent[3].expires.as_deref(),
        Some((SERVER_SECS + 31).to_string().as_str())
    );
}

/// A create whose lease another caller took first (at the new blob's ETag): busy, nothing
/// given back (this call was granted nothing), no further request.
#[test]
fn a_creator_whose_lease_was_taken_first_is_busy() {
    let t = Scripted::new(vec![missing(), created("c"), lease_present()]);
    let outcome = first_use(&t, native30(), id(23));
    assert!(matches!(outcome, Ok(Acquire::Busy { .. })), "{outcome:?}");
    assert_eq!(t.sent().len(), 3, "{:#?}", t.sent());
}

/// A label, or an id the caller chose (which other calls may hold too), is never named by a
/// create: another caller can take the lease at the new blob first, and a reader must not see
/// the creator named on it. The claim is written under the lease.
#[test]
fn a_labelled_or_chosen_first_holder_is_named_only_under_its_lease() {
    for (origin, label) in [(IdOrigin::Fresh, "node-a"), (IdOrigin::Known, "")] {
        let me = id(24);
        let t = Scripted::new(vec![missing(), created("c"), granted(), written("d")]);
        let outcome = pollster::block_on(locks(&t).acquire(
            &name(),
            Acquiring::new(native30(), me).origin(origin).label(label),
            server_now(),
        ));
        assert!(matches!(outcome, Ok(Acquire::Acquired(_))), "{outcome:?}");
        let sent = t.sent();
        assert_eq!(sent.len(), 4, "{origin:?} {label:?}: {sent:#?}");
        assert!(
            sent[1].holder.as_deref().unwrap_or("").is_empty()
                && !sent[1]
                    .claim
                    .iter()
                    .any(|(k, _)| *k == "leasegate_unconfirmed"),
            "the create names nobody: {:?}",
            sent[1]
        );
        assert_eq!(sent[3].holder.as_deref(), Some(me.to_string().as_str()));
    }
}

/// Review (issue 34): an infinite lease's claim never moves, so its first holder's create
/// names nobody (a claim the create wrote would stay the create's for the whole lease).
#[test]
fn an_infinite_first_holder_is_named_only_under_its_lease() {
    let me = id(53);
    let t = Scripted::new(vec![missing(), created("c"), granted(), written("d")]);
    let outcome = first_use(&t, Term::Native(LeaseDuration::Infinite), me);
    assert!(matches!(outcome, Ok(Acquire::Acquired(_))), "{outcome:?}");
    let sent = t.sent();
    assert_eq!(sent.len(), 4, "{sent:#?}");
    assert!(sent[1]
        .claim
        .iter()
        .all(|(k, v)| *k != "leasegate_holder" || v.is_empty()));
    assert_eq!(sent[3].holder.as_deref(), Some(me.to_string().as_str()));
}
