//! "Am I the leader for this term?": one leader per group among every deployment of an app.
//!
//! Each instance asks on every tick ([`lead`]), more often than the lease runs out: the leader
//! extends its lease and keeps its term (its fencing token); another instance takes over, with
//! a larger term, only once the leader stopped asking and its lease ran out. The instance's
//! lease id is derived from its name under a secret every deployment shares
//! ([`leasegate::LeaseId::for_holder`], purpose `leader`, as the leader function derives it), so
//! an instance with no memory between invocations is recognised as the leader it was.
//!
//! Each call writes one JSON log line ([`crate::Decision`]: `leader` or `follower`, the term,
//! the storage requests, the time taken).
//!
//! # Example
//! ```
//! use leasegate::lease::Locks;
//! use leasegate::{HolderKey, LeaseDuration, LockName, Transport};
//! use leasegate_spin::leader::{lead, Leadership};
//! use leasegate_spin::Context;
//!
//! async fn tick<T, S: Transport>(ctx: &Context<'_, T>, locks: &Locks<S>, key: &HolderKey) {
//!     let group = LockName::try_new("reports").unwrap();
//!     let lease = LeaseDuration::Seconds(30);
//!     match lead(ctx, locks, &group, "eu-west-1", key, lease).await {
//!         Ok(Leadership::Leader { term, .. }) => { /* act, handing `term` to what it writes */ }
//!         Ok(Leadership::Follower { .. }) => { /* another instance leads */ }
//!         Err(_) => { /* storage failed: do not act as leader */ }
//!     }
//! }
//! ```

use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::{Acquire, Acquiring, Locks, Term};
use leasegate::{Error, HolderKey, LeaseDuration, LeaseId, LockName, Transport};

use crate::{held, log_verb, web, Context};

/// The answer to "am I the leader?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    /// This instance leads until `expires_at` (unless it asks again before then).
    #[non_exhaustive]
    Leader {
        /// The term: the fencing token, kept while this instance stays leader, larger for every
        /// new leader. Hand it to what the leader writes.
        term: u64,
        /// When this term began (the storage server's clock).
        since: SystemTime,
        /// When the lease runs out unless extended (`None` for an infinite lease).
        expires_at: Option<SystemTime>,
        /// This call began the term (it was not the leader before).
        took_over: bool,
        /// The storage server's `Date` of this grant (one per tick: an idempotency key for
        /// what the leader does on it).
        granted_at: SystemTime,
    },
    /// Another instance leads (or this one stepped down and may not lead yet).
    #[non_exhaustive]
    Follower {
        /// The leader's name, where its claim says.
        leader: Option<String>,
        /// The leader's term, where its claim says.
        term: Option<u64>,
        /// How long the leader's lease has left, where storage can tell.
        retry_after: Option<Duration>,
        /// When the leader's term began, where its claim says.
        since: Option<SystemTime>,
        /// When the leader's lease runs out unless extended, where its claim says.
        expires_at: Option<SystemTime>,
        /// This instance stepped down ([`leasegate::lease::Locks::step_down`]) and may not lead
        /// before this time (the storage server's clock), even with nobody leading.
        stepped_down_until: Option<SystemTime>,
    },
}

/// Asks whether `instance` leads `group` among every caller of `locks`, taking or extending the
/// group's native lease of `lease` (15 to 60 s) with `instance`'s derived lease id. Every
/// instance needs its own name: two that share one share the lease id, and both would lead.
/// Round trips: 1 for a follower; for the leader 2 (the renew and the claim's new expiry) from
/// what it kept of its last call in `ctx.cache` ([`crate::held`]), else 3 (a read first).
/// `Err` is a storage failure: the instance does not know, so it must not act as leader.
pub async fn lead<C, L: Transport>(
    ctx: &Context<'_, C>,
    locks: &Locks<L>,
    group: &LockName,
    instance: &str,
    key: &HolderKey,
    lease: LeaseDuration,
) -> Result<Leadership, Error> {
    // A crashed leader must be replaced, and two instances must never share an id.
    if matches!(lease, LeaseDuration::Infinite) {
        return Err(Error::InvalidArgument(
            "a leader's lease must be 15 to 60 s, not infinite (a crashed leader would never be \
             replaced)"
                .into(),
        ));
    }
    if instance.trim().is_empty() {
        return Err(Error::InvalidArgument(
            "the instance name is empty: every instance needs its own, unique name".into(),
        ));
    }
    let started = Instant::now();
    let counted = locks.counting();
    let id = LeaseId::for_holder(key, "leader", instance, group);
    let term = Term::Native(lease);
    // The leader extends from what it kept of its last tick (a renew and the claim's new
    // expiry), where there is something kept; the key-value store is only a hint (`held`).
    let how = Acquiring::new(term, id).label(instance);
    let outcome = held::acquire(ctx.cache, &counted, group, how, ctx.now).await;
    let (decision, term) = match &outcome {
        Ok(Acquire::Acquired(held)) => ("leader", held.fencing_token),
        Ok(Acquire::Busy { holder, .. }) => ("follower", holder.as_ref().map(|h| h.token)),
        Err(Error::InvalidArgument(_) | Error::InvalidName { .. }) => ("invalid_argument", None),
        Err(e) => (web::storage_error_code(e), None),
    };
    log_verb(
        ctx.log_decisions,
        "lead",
        group.as_str(),
        Some(instance),
        (decision, term),
        counted.transport().sent(),
        started,
    );
    Ok(match outcome? {
        Acquire::Acquired(held) => Leadership::Leader {
            term: held.fencing_token.unwrap_or(0),
            since: held.since,
            expires_at: held.expires_at,
            took_over: !held.extended,
            granted_at: held.server_date,
        },
        Acquire::Busy {
            retry_after,
            holder,
            stepped_down_until,
        } => Leadership::Follower {
            leader: holder.as_ref().map(|h| h.label.clone()),
            term: holder.as_ref().map(|h| h.token),
            retry_after,
            since: holder.as_ref().and_then(|h| h.since),
            expires_at: holder.as_ref().and_then(|h| h.expires_at),
            stepped_down_until,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::once::tests::{me, other, reply, written, Scripted, SERVER_SECS};
    use leasegate::{Account, ContainerName, Response};
    use std::collections::HashMap;

    const SECRET: &[u8] = b"a secret every deployment shares";

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn head(lease_state: &str, claim: &[(&str, String)]) -> Response {
        let mut r = reply(200)
            .with_header("etag", "\"e1\"")
            .with_header("x-ms-lease-state", lease_state)
            .with_header("x-ms-blob-type", "PageBlob")
            .with_header("content-length", "0");
        for (k, v) in claim {
            r = r.with_header(&format!("x-ms-meta-leasegate_{k}"), v.as_str());
        }
        r
    }

    fn ask(script: Vec<Response>) -> (Result<Leadership, Error>, usize) {
        ask_as("node-a", LeaseDuration::Seconds(30), script)
    }

    fn ask_as(
        instance: &str,
        lease: LeaseDuration,
        script: Vec<Response>,
    ) -> (Result<Leadership, Error>, usize) {
        let transport = Scripted::new(script);
        let locks = Locks::new(
            &transport,
            Account::from_connection_string("UseDevelopmentStorage=true").unwrap(),
            ContainerName::try_new("leasegate").unwrap(),
        )
        .with_prefix("leaders/");
        let variables = HashMap::new();
        let ctx = Context {
            connect: &|_| (),
            variables: &variables,
            now: at(SERVER_SECS),
            new_lease_id: &me,
            sleep: &|_| Box::pin(async {}),
            cache: &crate::cache::NoCache,
            log_decisions: false,
        };
        let key = HolderKey::try_new(SECRET).unwrap();
        let outcome = pollster::block_on(lead(
            &ctx,
            &locks,
            &LockName::try_new("reports").unwrap(),
            instance,
            &key,
            lease,
        ));
        let sent = transport.sent.borrow().len();
        (outcome, sent)
    }

    #[test]
    fn a_free_group_makes_this_instance_leader_for_a_new_term() {
        // HEAD, acquire (storage grants the proposed id: the instance's derived one), the claim.
        let key = HolderKey::try_new(SECRET).unwrap();
        let group = LockName::try_new("reports").unwrap();
        let id = LeaseId::for_holder(&key, "leader", "node-a", &group);
        let script = vec![
            head("available", &[]),
            reply(201)
                .with_header("etag", "\"e2\"")
                .with_header("x-ms-lease-id", id.to_string()),
            written(),
        ];
        let (outcome, sent) = ask(script);
        let Ok(Leadership::Leader {
            term,
            since,
            expires_at,
            took_over,
            ..
        }) = outcome
        else {
            panic!("{outcome:?}")
        };
        assert!(term > 0 && took_over);
        assert_eq!(since, at(SERVER_SECS));
        assert_eq!(expires_at, Some(at(SERVER_SECS + 30)));
        assert_eq!(sent, 3);
    }

    #[test]
    fn another_leader_makes_this_instance_a_follower() {
        let claim = [
            ("holder", other().to_string()),
            ("term", "30".into()),
            ("since", (SERVER_SECS - 100).to_string()),
            ("expires", (SERVER_SECS + 20).to_string()),
            ("token", "77".into()),
            ("label", "node-b".into()),
        ];
        let (outcome, sent) = ask(vec![head("leased", &claim)]);
        assert_eq!(
            outcome.unwrap(),
            Leadership::Follower {
                leader: Some("node-b".into()),
                term: Some(77),
                retry_after: Some(Duration::from_secs(20)),
                since: Some(at(SERVER_SECS - 100)),
                expires_at: Some(at(SERVER_SECS + 20)),
                stepped_down_until: None,
            }
        );
        assert_eq!(sent, 1);
    }

    #[test]
    fn an_unnamed_instance_or_an_infinite_lease_is_refused_before_storage() {
        for (instance, lease) in [
            ("", LeaseDuration::Seconds(30)),
            ("  ", LeaseDuration::Seconds(30)),
            ("node-a", LeaseDuration::Infinite),
        ] {
            let (outcome, sent) = ask_as(instance, lease, vec![]);
            assert!(
                matches!(outcome, Err(Error::InvalidArgument(_))),
                "{instance:?}: {outcome:?}"
            );
            assert_eq!(sent, 0);
        }
    }
}
