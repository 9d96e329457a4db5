//! Fencing tokens: a holder in the last second of its native lease keeps its token, and a
//! claim write never lowers one.

use leasegate::lease::{Acquire, Acquiring};

use crate::script::*;

/// Issue 21.8: a holder re-acquiring in the last second of its native lease (its claim's
/// expiry is rounded down to whole seconds while storage still holds the lease) keeps its
/// token.
#[test]
fn a_holder_in_the_last_second_of_its_lease_keeps_its_token() {
    let me = id(5);
    let t = Scripted::new(vec![
        head("leased", "a", &native_claim(me, SERVER_SECS)),
        granted(),
        written("b"),
    ]);
    let outcome = pollster::block_on(locks(&t).acquire(
        &name(),
        Acquiring::new(native30(), me),
        server_now(),
    ));
    match outcome {
        Ok(Acquire::Acquired(held)) => {
            assert_eq!(held.fencing_token, Some(7), "the token is kept");
            assert!(held.extended, "an extension");
        }
        other => panic!("acquired: {other:?}"),
    }
}

/// Review finding 5: the native claim's compare-and-swap never writes a token below the one
/// the blob holds. The holder extends (token 7); its claim write is refused (412); the re-read
/// shows the blob leased (by its id) but claimed by another holder with token 8.
#[test]
fn a_claim_write_never_puts_a_lower_token_over_a_higher_one() {
    let me = id(12);
    let mut other = native_claim(id(13), SERVER_SECS + 25);
    for (k, v) in other.iter_mut() {
        if *k == "leasegate_token" {
            *v = "8".into();
        }
    }
    let t = Scripted::new(vec![
        head("leased", "a", &native_claim(me, SERVER_SECS + 20)),
        granted(),
        precondition_failed(),
        head("leased", "b", &other),
        written("c"),
    ]);
    let outcome = pollster::block_on(locks(&t).acquire(
        &name(),
        Acquiring::new(native30(), me),
        server_now(),
    ));
    let sent = t.sent();
    let writes: Vec<&Sent> = sent.iter().filter(|s| s.is_metadata_write()).collect();
    assert_eq!(writes.len(), 1, "only the refused write: {sent:#?}");
    assert_eq!(writes[0].token.as_deref(), Some("7"), "{sent:#?}");
    assert!(
        !matches!(outcome, Ok(Acquire::Acquired(_))),
        "not acquired over a higher token: {outcome:?}"
    );
}
