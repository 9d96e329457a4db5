//! The sweep state blob (`sweeper/state.json`): its schema, its reading and writing (by
//! compare-and-swap, see `claim`), and its containers reconciled with the settings.
//!
//! The state blob is JSON with camelCase keys, written pretty; absent options, an empty
//! `unusable` and `off: false` are left out. It stays readable both ways during a rolling
//! upgrade: unknown fields are ignored (a newer writer's), missing counters and lists read as
//! 0 and empty, and no field is renamed.

use std::time::SystemTime;

use leasegate::ops::{Condition, GetBlob, PutBlob, WriteOutcome};
use leasegate::Transport;
use leasegate::{BlobClient, BlobName};
use serde::{Deserialize, Serialize};

use leasegate_spin::storage::execute_creating_container;

use crate::answer::Report;
use crate::error::SweepError;
use crate::settings::{Kind, Settings};
use crate::STATE_BLOB;

/// The most unusable names the state remembers (each reported once).
pub(crate) const MAX_UNUSABLE: usize = 100;

/// Where a pass is in a swept container, stored as `init` (the pass has not reached it),
/// `current` (pages left) or `last` (its last page was claimed this pass). A value this version
/// does not know (an older version's `off`, a newer version's) is kept as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScanStatus {
    /// The pass has not reached it.
    Init,
    /// Pages are left.
    Current,
    /// Its last page was claimed this pass.
    Last,
    /// Another value, kept as written.
    Other(String),
}

impl ScanStatus {
    /// The value as stored.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            ScanStatus::Init => "init",
            ScanStatus::Current => "current",
            ScanStatus::Last => "last",
            ScanStatus::Other(other) => other,
        }
    }

    /// The status a stored value stands for.
    pub(crate) fn parse(value: &str) -> ScanStatus {
        match value {
            "init" => ScanStatus::Init,
            "current" => ScanStatus::Current,
            "last" => ScanStatus::Last,
            other => ScanStatus::Other(other.to_string()),
        }
    }
}

impl Serialize for ScanStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ScanStatus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| ScanStatus::parse(&s))
    }
}

/// One swept container (and prefix) in the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ContainerEntry {
    /// The container.
    pub(crate) container: String,
    /// The prefix swept (empty: all).
    #[serde(default)]
    pub(crate) prefix: String,
    /// What it sweeps.
    pub(crate) kind: Kind,
    /// Where the pass is in it.
    pub(crate) status: ScanStatus,
    /// Where the next page starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) marker: Option<String>,
    /// No longer configured: skipped, its progress kept.
    #[serde(default, skip_serializing_if = "is_false")]
    pub(crate) off: bool,
    /// How the marker was had (`tags`: Find Blobs by Tags, `list`: List Blobs; missing: a
    /// listing, or a lock prefix): a marker of the other kind is not used. Under
    /// `ttl_find = both` it is where the pass is in the container: its listing (`list`), then
    /// its finds (`tags`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) find: Option<String>,
    /// When the container's last listing completed (server clock): under `ttl_find = both`
    /// the next one is due `ttl_list_interval_seconds` after.
    #[serde(default, rename = "listedAt", skip_serializing_if = "Option::is_none")]
    pub(crate) listed_at: Option<String>,
    /// Blobs one find found that no claim has taken yet (a find asks for up to 5000, a claim
    /// takes `ttl_page_size`): the next claims take them before the next find.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pending: Option<Pending>,
}

/// Found blobs not yet claimed: when the find answered (server clock), and each blob's name
/// and the expiry tag it was found with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Pending {
    /// The find's answer `Date` (found blobs written since are left for the next pass).
    pub(crate) at: String,
    /// `[name, tag value]`, in the order found.
    pub(crate) blobs: Vec<(String, String)>,
}

/// The sweep state blob.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct State {
    /// The swept containers, in order.
    pub(crate) containers: Vec<ContainerEntry>,
    /// Passes completed.
    #[serde(default)]
    pub(crate) passes: u64,
    /// When the last pass completed (server clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_pass_completed_at: Option<String>,
    /// Blobs deleted (moved ones included) since the state began.
    #[serde(default)]
    pub(crate) purged: u64,
    /// Of those, moved to a dead-blob container.
    #[serde(default)]
    pub(crate) moved: u64,
    /// Lock blobs removed.
    #[serde(default)]
    pub(crate) locks_removed: u64,
    /// Pages claimed.
    #[serde(default)]
    pub(crate) pages: u64,
    /// The ticks of the last minutes (see [`TickEntry`]).
    #[serde(default)]
    pub(crate) ticks: Vec<TickEntry>,
    /// Marked blobs whose names cannot be swept: reported once, forgotten when a pass no
    /// longer lists them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) unusable: Vec<Unusable>,
}

/// A marked blob whose name cannot be swept, as the state remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Unusable {
    /// Its container.
    pub(crate) container: String,
    /// Its name.
    pub(crate) name: String,
    /// The pass that last listed it.
    #[serde(default)]
    pub(crate) pass: u64,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Counters kept in the state (a tick's entry holds them as its own fields; missing ones are
/// 0).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Counters {
    /// Blobs deleted (moved ones included).
    pub(crate) purged: u64,
    /// Of those, moved to a dead-blob container.
    pub(crate) moved: u64,
    /// Lock blobs removed.
    pub(crate) locks_removed: u64,
}

impl Counters {
    pub(crate) fn of(report: &Report) -> Counters {
        Counters {
            purged: report.deleted,
            moved: report.moved,
            locks_removed: report.locks_removed,
        }
    }

    pub(crate) fn is_zero(&self) -> bool {
        *self == Counters::default()
    }

    pub(crate) fn plus(self, o: Counters) -> Counters {
        Counters {
            purged: self.purged.saturating_add(o.purged),
            moved: self.moved.saturating_add(o.moved),
            locks_removed: self.locks_removed.saturating_add(o.locks_removed),
        }
    }

    pub(crate) fn minus(self, o: Counters) -> Counters {
        Counters {
            purged: self.purged.saturating_sub(o.purged),
            moved: self.moved.saturating_sub(o.moved),
            locks_removed: self.locks_removed.saturating_sub(o.locks_removed),
        }
    }
}

/// A tick as the state knows it: while it is `active` it may still be processing a page it
/// claimed, and the pass does not end; `credited` is what it has added to the state's counters
/// so far. A tick leaves it inactive when it is done; entries of other ticks are dropped once
/// older than [`Settings::tick_bound`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TickEntry {
    /// The tick's random id.
    pub(crate) id: String,
    /// Its instance.
    pub(crate) instance: String,
    /// When it last wrote the state (server clock).
    pub(crate) since: String,
    /// Whether it may still be processing a page.
    pub(crate) active: bool,
    /// What it has added to the counters (`purged`, `moved`, `locksRemoved`).
    #[serde(flatten)]
    pub(crate) credited: Counters,
}

/// The sweep state as one read found it.
pub(crate) struct StateRead {
    /// Its content (empty when the blob is missing).
    pub(crate) state: State,
    /// Its ETag (`None`: the blob is missing).
    pub(crate) etag: Option<leasegate::ETag>,
    /// The storage server's clock when it answered (its `Date`), when it sent one.
    pub(crate) date: Option<SystemTime>,
}

/// Reads the state (content, ETag and the answer's `Date`); a missing state is empty.
pub(crate) async fn read_state<S: Transport>(
    blobs: &BlobClient<S>,
    settings: &Settings,
    now: SystemTime,
) -> Result<StateRead, SweepError> {
    let (blob, date) = blobs
        .execute(
            &GetBlob {
                container: settings.storage.container.clone(),
                blob: settings.state_blob()?,
            },
            now,
        )
        .await?;
    match blob {
        None => Ok(StateRead {
            state: State::default(),
            etag: None,
            date,
        }),
        Some(b) => {
            let state: State = serde_json::from_slice(&b.body).map_err(|e| {
                SweepError::UnreadableState(format!(
                    "the sweep state {STATE_BLOB} is not a sweep state ({e}; delete it to start over)"
                ))
            })?;
            Ok(StateRead {
                state,
                etag: b.properties.etag,
                date,
            })
        }
    }
}

/// What [`write_state`] wrote: the new ETag and the answer's `Date`; or why storage refused it
/// (another caller wrote first: `ConditionFailed`, `AlreadyExists`; or someone leased the blob).
pub(crate) type StateWrite =
    Result<(Option<leasegate::ETag>, Option<SystemTime>), leasegate::ops::Refusal>;

/// Writes the state by compare-and-swap (see [`put_json_if`]).
pub(crate) async fn write_state<S: Transport>(
    blobs: &BlobClient<S>,
    settings: &Settings,
    state: &State,
    etag: Option<leasegate::ETag>,
    now: SystemTime,
) -> Result<StateWrite, leasegate::Error> {
    put_json_at(blobs, settings.state_blob()?, state, etag, now).await
}

/// Writes `value` as pretty JSON to `blob` in the app's container by compare-and-swap: at
/// `etag`, or only if the blob does not exist yet (`None`); the container is created if
/// missing. `false` when another caller wrote it first. The sweep state and the migration's
/// progress are kept this way.
pub(crate) async fn put_json_if<S: Transport>(
    blobs: &BlobClient<S>,
    blob: BlobName,
    value: &impl serde::Serialize,
    etag: Option<leasegate::ETag>,
    now: SystemTime,
) -> Result<bool, leasegate::Error> {
    Ok(put_json_at(blobs, blob, value, etag, now).await?.is_ok())
}

/// [`put_json_if`], returning the new ETag and the answer's `Date` when it wrote, else why
/// storage refused.
async fn put_json_at<S: Transport>(
    blobs: &BlobClient<S>,
    blob: BlobName,
    value: &impl serde::Serialize,
    etag: Option<leasegate::ETag>,
    now: SystemTime,
) -> Result<StateWrite, leasegate::Error> {
    // Both are plain structs (string keys, integers): serializing cannot fail.
    let body = serde_json::to_vec_pretty(value).expect("the record serializes");
    let put = PutBlob::block(blobs.container().clone(), blob, body)
        .with_content_type("application/json")
        .with_condition(etag.map_or(Condition::IfNotExists, Condition::IfMatch));
    Ok(
        match execute_creating_container(blobs, blobs.container(), &put, now).await? {
            (WriteOutcome::Written(w), date) => Ok((w.etag, w.server_date.or(date))),
            (WriteOutcome::Refused(refusal), _) => Err(refusal),
        },
    )
}

/// The configured targets, with the state's progress where it has some. A target no longer
/// configured is kept `off` with its progress; configured again, it goes on from there.
pub(crate) fn reconcile(state: &mut State, settings: &Settings) {
    for e in &mut state.containers {
        if e.status == ScanStatus::Other("off".into()) {
            // (A state written before `off` became a flag.)
            e.status = ScanStatus::Init;
            e.off = true;
        }
        e.off = !settings
            .targets
            .iter()
            .any(|(k, c, p)| e.kind == *k && e.container == c.as_str() && e.prefix == *p);
    }
    for (kind, container, prefix) in &settings.targets {
        let known = state
            .containers
            .iter()
            .any(|e| e.kind == *kind && e.container == container.as_str() && e.prefix == *prefix);
        if !known {
            state.containers.push(ContainerEntry {
                container: container.to_string(),
                prefix: prefix.clone(),
                kind: *kind,
                status: ScanStatus::Init,
                marker: None,
                off: false,
                find: None,
                listed_at: None,
                pending: None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::resting;
    use crate::settings::tests::settings;

    #[test]
    fn a_container_dropped_from_the_configuration_keeps_its_progress() {
        let both = settings(&[("ttl_containers", "xxx,yyy/logs/")]).unwrap();
        let only_x = settings(&[("ttl_containers", "xxx")]).unwrap();
        let mut state = State::default();
        reconcile(&mut state, &both);
        assert_eq!(state.containers.len(), 2);
        state.containers[1].status = ScanStatus::Current;
        state.containers[1].marker = Some("m-7".into());
        // A deployment still on the old configuration: y is off, its progress kept.
        reconcile(&mut state, &only_x);
        let y = &state.containers[1];
        assert!(y.off && y.status == ScanStatus::Current && y.marker.as_deref() == Some("m-7"));
        assert!(!resting(&state, &only_x, SystemTime::UNIX_EPOCH));
        // Configured again: it goes on from its marker.
        reconcile(&mut state, &both);
        let y = &state.containers[1];
        assert!(!y.off && y.status == ScanStatus::Current && y.marker.as_deref() == Some("m-7"));
        assert_eq!(y.prefix, "logs/");
        // A state written when `off` was a status.
        state.containers[1].status = ScanStatus::Other("off".into());
        reconcile(&mut state, &both);
        assert!(!state.containers[1].off && state.containers[1].status == ScanStatus::Init);
    }

    #[test]
    fn counters_settle_what_a_lost_answer_wrote() {
        let c = |p, m| Counters {
            purged: p,
            moved: m,
            locks_removed: 0,
        };
        // Credited 3, pending 2; the state shows 5 credited: the lost write landed.
        let landed = c(5, 1).minus(c(3, 1));
        assert_eq!(c(2, 0).minus(landed), Counters::default());
        assert_eq!(c(u64::MAX, 0).plus(c(1, 0)).purged, u64::MAX);
        assert!(Counters::default().is_zero());
    }

    /// A sweep state as the hand-written JSON writer wrote it (pretty, camelCase, options and
    /// `off: false` left out), with a field from a newer writer and an entry of a tick without
    /// counters: it reads, and written back it is the same text but the unknown field.
    #[test]
    fn an_old_state_reads_and_writes_back_the_same() {
        let old = r#"{
  "containers": [
    {
      "container": "logs",
      "prefix": "",
      "kind": "ttl",
      "status": "current",
      "marker": "m-7"
    },
    {
      "container": "leasegate",
      "prefix": "gates/",
      "kind": "locks",
      "status": "init",
      "off": true
    }
  ],
  "passes": 3,
  "lastPassCompletedAt": "2026-11-21T14:00:00Z",
  "purged": 12,
  "moved": 2,
  "locksRemoved": 5,
  "pages": 40,
  "ticks": [
    {
      "id": "t-1",
      "instance": "node-a",
      "since": "2026-11-21T14:00:01Z",
      "active": true,
      "purged": 4,
      "moved": 1,
      "locksRemoved": 0
    }
  ],
  "unusable": [
    {
      "container": "logs",
      "name": "a/../b",
      "pass": 3
    }
  ]
}"#;
        let state: State = serde_json::from_str(old).unwrap();
        assert_eq!(state.containers.len(), 2);
        assert_eq!(state.containers[0].marker.as_deref(), Some("m-7"));
        assert!(state.containers[1].off && state.containers[1].kind == Kind::Locks);
        assert_eq!(
            (state.passes, state.purged, state.locks_removed),
            (3, 12, 5)
        );
        assert_eq!(
            state.ticks[0].credited,
            Counters {
                purged: 4,
                moved: 1,
                locks_removed: 0
            }
        );
        assert_eq!(state.unusable[0].name, "a/../b");
        assert_eq!(serde_json::to_string_pretty(&state).unwrap(), old);

        // A newer writer's field is ignored; missing counters and lists read as 0 and empty.
        let sparse = r#"{"containers": [{"container": "logs", "kind": "ttl", "status": "init",
            "since": "a newer field"}], "ticks": [{"id": "t", "instance": "i",
            "since": "2026-11-21T14:00:01Z", "active": false}], "shards": 4}"#;
        let state: State = serde_json::from_str(sparse).unwrap();
        assert_eq!(state.containers[0].prefix, "");
        assert_eq!(state.ticks[0].credited, Counters::default());
        assert_eq!((state.passes, state.unusable.len()), (0, 0));
        let written = serde_json::to_string(&state).unwrap();
        assert!(!written.contains("lastPassCompletedAt") && !written.contains("unusable"));

        // Not a state: refused, never a panic.
        for bad in [r#"{}"#, r#"{"containers": [{"kind": "ttl"}]}"#, "[]", "{"] {
            assert!(serde_json::from_str::<State>(bad).is_err(), "{bad}");
        }
    }
}
