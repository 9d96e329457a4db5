//! The claim: what a lock blob's metadata says about its holder, and the fencing rule.
//!
//! Every holder writes its claim into the lock blob's metadata (a native holder right after its
//! lease is granted, under that lease, or, the first holder of a lock with an id it generated
//! and no label, in the create before it; a record holder *as* its compare-and-swap):
//!
//! | metadata | meaning |
//! |---|---|
//! | `leasegate_holder` | the holder's lease id (empty once a record is released) |
//! | `leasegate_term` | `record`, or the native lease's seconds (`15`..`60`, `-1` for infinite) |
//! | `leasegate_since` | when this holder's tenure began, server Unix seconds |
//! | `leasegate_expires` | when the claim runs out, server Unix seconds (`0`: never, infinite lease) |
//! | `leasegate_token` | the holder's fencing token |
//! | `leasegate_label` | the holder's name for people (an instance id), optional |
//! | `leasegate_unconfirmed` | `1` on a claim the lock blob's create wrote, before the grant (see [`META_UNCONFIRMED`]) |
//!
//! A native claim counts only while the blob's lease is held (the lease, not the claim, is what
//! storage enforces); a record claim counts while its expiry is after the server's `Date`.
//! Other metadata on the lock blob is kept as it is.
//!
//! The values are read strictly: a number that is not a number, or is out of range, is an
//! [`Error::CorruptLock`] naming the field, never a token that silently goes back to 0.

use std::time::{Duration, SystemTime};

use crate::ops::Metadata;
use crate::types::{unix_secs, LeaseDuration, LeaseId};
use crate::Error;

pub(crate) const META_HOLDER: &str = "leasegate_holder";
pub(crate) const META_TERM: &str = "leasegate_term";
pub(crate) const META_SINCE: &str = "leasegate_since";
pub(crate) const META_EXPIRES: &str = "leasegate_expires";
pub(crate) const META_TOKEN: &str = "leasegate_token";
pub(crate) const META_LABEL: &str = "leasegate_label";

pub(crate) const META_STEPPED_DOWN: &str = "leasegate_stepped_down";

/// Set (`1`) on a claim the lock blob's create wrote, before its holder's grant (a native lock's
/// first holder with an id it generated and no label): another caller may have taken the lease
/// at the new blob first, so the claim may name one that does not hold it. Any claim written
/// since removes it.
pub(crate) const META_UNCONFIRMED: &str = "leasegate_unconfirmed";

/// Marks the claim in `metadata` as written by the lock blob's create ([`META_UNCONFIRMED`]).
pub(crate) fn mark_unconfirmed(metadata: &mut Metadata) {
    metadata.insert(META_UNCONFIRMED.to_string(), "1".to_string());
}

/// Whether the claim in `metadata` is one the lock blob's create wrote ([`META_UNCONFIRMED`]).
pub(crate) fn is_unconfirmed(metadata: &Metadata) -> bool {
    metadata
        .get(META_UNCONFIRMED)
        .is_some_and(|v| !v.trim().is_empty())
}

/// The ids barred after stepping down and until when (Unix seconds): `ID UNTIL` entries
/// separated by `,`. Missing or empty: none.
pub(crate) fn read_stepped_down(metadata: &Metadata) -> Result<Vec<(LeaseId, u64)>, Error> {
    let Some(value) = metadata.get(META_STEPPED_DOWN).map(|v| v.trim()) else {
        return Ok(Vec::new());
    };
    let mut bars = Vec::new();
    for entry in value.split(',').filter(|e| !e.trim().is_empty()) {
        let bar = entry.trim().split_once(' ').and_then(|(id, until)| {
            let id = LeaseId::try_new(id).ok()?;
            let until: u64 = until.trim().parse().ok().filter(|&u| u <= MAX_SECS)?;
            Some((id, until))
        });
        match bar {
            Some(bar) => bars.push(bar),
            None => {
                return Err(corrupt(
                    META_STEPPED_DOWN,
                    value,
                    "is not a list of 'lease-id unix-seconds' entries",
                ))
            }
        }
    }
    Ok(bars)
}

/// Writes `bars` (see [`read_stepped_down`]) into `metadata`.
pub(crate) fn write_stepped_down(bars: &[(LeaseId, u64)], metadata: &mut Metadata) {
    let value: Vec<String> = bars
        .iter()
        .map(|(id, until)| format!("{id} {until}"))
        .collect();
    metadata.insert(META_STEPPED_DOWN.to_string(), value.join(","));
}

/// The longest holder label, in bytes.
pub const MAX_LABEL_BYTES: usize = 128;

/// A lock blob's own marks: its metadata other than the claim.
pub(crate) fn marks_of(metadata: &Metadata) -> Metadata {
    metadata
        .iter()
        .filter(|(k, _)| !is_claim_field(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Whether a metadata name is one of the claim's (leasegate's own): marks must not use them.
pub(crate) fn is_claim_field(name: &str) -> bool {
    name.to_ascii_lowercase().starts_with("leasegate_")
}

/// The largest fencing token: 2^53 - 1, so that every token is exact in JSON and JavaScript.
pub const MAX_TOKEN: u64 = (1 << 53) - 1;

/// The latest time a claim may name: 9999-12-31T23:59:59Z, in Unix seconds.
pub(crate) const MAX_SECS: u64 = 253_402_300_799;

/// Tokens of successive seconds of the server's clock are this far apart (2^16): see
/// [`next_token`].
const TOKENS_PER_SECOND: u64 = 1 << 16;

/// How a claim holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A native blob lease of this duration.
    Native(LeaseDuration),
    /// A lease record.
    Record,
}

/// A lock blob's claim (all zero and no holder on a lock never claimed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claim {
    pub holder: Option<LeaseId>,
    pub kind: Kind,
    pub since: u64,
    pub expires: u64,
    pub token: u64,
    pub label: String,
}

impl Claim {
    /// Reads the claim of `metadata`. Missing fields read as empty (a lock blob written by an
    /// older leasegate has no term: its claim, if any, is a record); malformed ones are errors.
    pub fn read(metadata: &Metadata) -> Result<Claim, Error> {
        let field = |name: &str| {
            metadata
                .get(name)
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
        };
        let holder = match field(META_HOLDER) {
            None => None,
            Some(h) => {
                Some(LeaseId::try_new(h).map_err(|_| corrupt(META_HOLDER, h, "is not a GUID"))?)
            }
        };
        let kind = match field(META_TERM) {
            None | Some("record") => Kind::Record,
            Some(t) => {
                let secs: i64 = t
                    .parse()
                    .map_err(|_| corrupt(META_TERM, t, "is neither record nor a lease duration"))?;
                Kind::Native(LeaseDuration::try_from_secs(secs).map_err(|_| {
                    corrupt(META_TERM, t, "is not a lease duration (15 to 60, or -1)")
                })?)
            }
        };
        let number = |name: &str, max: u64| -> Result<u64, Error> {
            match field(name) {
                None => Ok(0),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if n <= max => Ok(n),
                    _ => Err(corrupt(
                        name,
                        v,
                        &format!("is not a whole number from 0 to {max}"),
                    )),
                },
            }
        };
        let label = field(META_LABEL).unwrap_or("").to_string();
        if label.len() > MAX_LABEL_BYTES {
            return Err(corrupt(
                META_LABEL,
                &label,
                &format!("is longer than {MAX_LABEL_BYTES} bytes"),
            ));
        }
        Ok(Claim {
            holder,
            kind,
            since: number(META_SINCE, MAX_SECS)?,
            expires: number(META_EXPIRES, MAX_SECS)?,
            token: number(META_TOKEN, MAX_TOKEN)?,
            label,
        })
    }

    /// Writes this claim into `metadata`, leaving its other entries alone.
    pub fn write(&self, metadata: &mut Metadata) {
        let term = match self.kind {
            Kind::Record => "record".to_string(),
            Kind::Native(d) => d.header_value(),
        };
        let holder = self.holder.map(|h| h.to_string()).unwrap_or_default();
        for (name, value) in [
            (META_HOLDER, holder),
            (META_TERM, term),
            (META_SINCE, self.since.to_string()),
            (META_EXPIRES, self.expires.to_string()),
            (META_TOKEN, self.token.to_string()),
            (META_LABEL, self.label.clone()),
        ] {
            metadata.insert(name.to_string(), value);
        }
        metadata.remove(META_UNCONFIRMED);
    }

    /// The same claim with no holder: a released record (the token stays, for the next holder
    /// to go above).
    pub fn released(&self) -> Claim {
        Claim {
            holder: None,
            expires: 0,
            label: String::new(),
            ..self.clone()
        }
    }

    /// The time this claim runs out, if it names one.
    pub fn expires_at(&self) -> Option<SystemTime> {
        (self.expires > 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_secs(self.expires))
    }

    /// The time this claim's tenure began, if it names one.
    pub fn since_at(&self) -> Option<SystemTime> {
        (self.since > 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_secs(self.since))
    }
}

/// **The fencing rule**, the one place tokens are made (with [`first_token`]). A new holder's
/// token is one more than the highest the lock has issued, and never less than the storage
/// server's clock in seconds times 2^16. Extending one's own lock keeps one's token; nothing
/// else issues one.
pub(crate) fn next_token(highest: u64, server_date: SystemTime) -> Result<u64, Error> {
    let floor = unix_secs(server_date).saturating_mul(TOKENS_PER_SECOND);
    let next = highest.saturating_add(1).max(floor);
    if next > MAX_TOKEN {
        return Err(Error::CorruptLock(format!(
            "the next fencing token would pass {MAX_TOKEN} (the lock's highest is {highest})"
        )));
    }
    Ok(next)
}

/// The token of a lock blob's first holder, when the blob was found missing at `server_date`:
/// the clock term of the *next* second. This is what keeps tokens increasing when the lock blob
/// is deleted and created again (an operator's clean-up, a deleted container): the old blob
/// issued its last token no later than the second the new one was found missing, so below
/// this. A token can repeat only if one lock's blob is created twice within one second of the
/// server's clock (created, deleted and created again), if a lock issued more than 65,536
/// tokens within one second, or if the server's clock steps back.
pub(crate) fn first_token(server_date: SystemTime) -> Result<u64, Error> {
    next_token(0, server_date + Duration::from_secs(1))
}

fn corrupt(field: &str, value: &str, problem: &str) -> Error {
    let shown: String = value.chars().take(32).collect();
    Error::CorruptLock(format!("metadata {field}='{shown}' {problem}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> Metadata {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn claims_round_trip_and_keep_other_metadata() {
        let claim = Claim {
            holder: Some(LeaseId::from_random_bytes([3; 16])),
            kind: Kind::Native(LeaseDuration::Seconds(30)),
            since: 1_795_000_000,
            expires: 1_795_000_030,
            token: 117_637_120_000_001,
            label: "node-a".into(),
        };
        let mut m = meta(&[("progress", "done")]);
        claim.write(&mut m);
        assert_eq!(m.get("progress").unwrap().as_str(), "done");
        assert_eq!(m.get(META_TERM).unwrap().as_str(), "30");
        assert_eq!(Claim::read(&m).unwrap(), claim);
        assert_eq!(m.get(META_LABEL).unwrap().as_str(), "node-a");
        let released = claim.released();
        released.write(&mut m);
        assert_eq!(m.get(META_HOLDER).unwrap().as_str(), "");
        assert_eq!(Claim::read(&m).unwrap().token, claim.token);
    }

    #[test]
    fn older_records_and_empty_blobs_read() {
        let empty = Claim::read(&Metadata::new()).unwrap();
        assert_eq!(
            (empty.holder, empty.kind, empty.token),
            (None, Kind::Record, 0)
        );
        let old = Claim::read(&meta(&[
            (META_HOLDER, "2f2c4b1e-8d2a-4c55-9a10-6f3e1d0c9b7a"),
            (META_EXPIRES, "1795000090"),
            (META_TOKEN, "7"),
        ]))
        .unwrap();
        assert_eq!((old.kind, old.token, old.since), (Kind::Record, 7, 0));
    }

    #[test]
    fn garbage_is_an_error_naming_the_field() {
        for (field, value) in [
            (META_TOKEN, "18446744073709551615"),
            (META_TOKEN, "9007199254740992"),
            (META_TOKEN, "-1"),
            (META_TOKEN, "1e3"),
            (META_EXPIRES, "99999999999999999999"),
            (META_EXPIRES, "soon"),
            (META_SINCE, "253402300800"),
            (META_HOLDER, "node-a"),
            (META_TERM, "90"),
            (META_TERM, "forever"),
        ] {
            let err = Claim::read(&meta(&[(field, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{field}={value}: {err}");
        }
    }

    #[test]
    fn tokens_go_up_by_one_and_never_below_the_clock() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let floor = 1_795_000_000 * TOKENS_PER_SECOND;
        assert_eq!(next_token(0, t).unwrap(), floor);
        assert_eq!(next_token(floor, t).unwrap(), floor + 1);
        assert_eq!(next_token(floor + 5, t).unwrap(), floor + 6);
        // A later second starts above anything a busy earlier second issued.
        let later = t + Duration::from_secs(1);
        assert_eq!(
            next_token(floor + 5, later).unwrap(),
            floor + TOKENS_PER_SECOND
        );
        assert!(next_token(MAX_TOKEN, t).is_err());
        // A re-created lock blob starts above everything its predecessor issued up to then.
        assert_eq!(first_token(t).unwrap(), floor + TOKENS_PER_SECOND);
        // Room until the year 6000 at least (95,617,584,000 s is the year 5000).
        let y5000 = SystemTime::UNIX_EPOCH + Duration::from_secs(95_617_584_000);
        assert!(next_token(0, y5000).is_ok());
    }
}
