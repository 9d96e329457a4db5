//! A tick: pages claimed and processed until the budget is spent or the pass completes, and
//! what becomes of each listed blob (deleted, moved to its dead-blob container first, or left
//! alone) and of each lock blob.

use std::time::{Instant, SystemTime};

use futures::StreamExt;
use leasegate::ops::{
    public_blob_url, BlobItem, Condition, CopyBlob, CopyOutcome, CopyStatus, DeleteBlob,
    DeleteBlobAndSnapshots, DeleteOutcome, GetProperties, Refusal,
};
use leasegate::BlobClient;
use leasegate::{BlobName, ContainerName, Counting, LeaseId, LeaseState, Transport};
use leasegate_spin::storage::execute_creating_container;

use leasegate_spin::timer;
use leasegate_spin::web::rfc3339;
use leasegate_spin::Context;

use crate::answer::Report;
use crate::claim::{claim, resting, Bookkeeping, Claim, Claimed, Known};
use crate::error::SweepError;
use crate::found::sweep_found;
use crate::index::{set_expiry_tag, Existing};
use crate::settings::{parse_location, Kind, Settings, COPY_POLL, COPY_WAIT};
use crate::state::{read_state, reconcile, Counters};
use crate::{DEAD_BLOB_CONTAINER, TIME_TO_LIVE};

/// Why a tick with nothing to do stopped.
const RESTING: &str = "resting until ttl_pass_interval_seconds has passed";

/// One tick: claim and process pages until the budget is spent or the pass completes. The
/// report stands even when the tick ends on a storage failure.
///
/// It begins with one read of the state: when that read shows the last pass
/// complete and the next not due **by the storage server's clock** (the read's `Date`; an
/// answer without one is not judged), the tick answers from it (one request, nothing written:
/// it does not appear among the state's recent ticks). Otherwise its first claim uses that read
/// (see `claim`), and each later claim starts from the state as the tick's last claim wrote it
/// (while no other tick was active).
pub(crate) async fn sweep<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    started: Instant,
) -> (Report, Option<SweepError>, u32) {
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let blobs = settings.storage.blobs(&counting);
    let mut tick = Bookkeeping {
        id: (ctx.new_lease_id)().to_string(),
        credited: Counters::default(),
        pending: Counters::default(),
        maybe_active: false,
        containers_skipped: Vec::new(),
        unusable_names: Vec::new(),
        unusable_overflow: 0,
    };
    let mut report = Report::default();
    let mut failure = None;
    let mut read = None;
    let mut known = None;
    if started.elapsed() < settings.budget {
        match read_state(&blobs, settings, ctx.now).await {
            Ok(mut r) => {
                reconcile(&mut r.state, settings);
                if r.date.is_some_and(|date| resting(&r.state, settings, date)) {
                    report.stopped = RESTING.into();
                    return (report, None, counting.sent());
                }
                read = Some(r);
            }
            Err(e) => return (report, Some(e), counting.sent()),
        }
    }
    loop {
        if started.elapsed() >= settings.budget {
            report.stopped = "budget".into();
            break;
        }
        // The tick's first read, then the state as its own last claim wrote it.
        let from = read.take().or_else(|| known.take().map(Known::now));
        let claimed = match claim(ctx, &blobs, settings, &mut tick, Some(started), from).await {
            Ok((Claim::Page(p), next)) => {
                known = next;
                p
            }
            Ok((Claim::PassComplete, _)) => {
                report.pass_completed = true;
                report.stopped = "pass complete".into();
                break;
            }
            Ok((Claim::Finishing, _)) => {
                report.stopped =
                    "no pages left: the pass ends when the other workers finish theirs".into();
                break;
            }
            Ok((Claim::Resting, _)) => {
                report.stopped = RESTING.into();
                break;
            }
            // (`Done` answers only the last write.)
            Ok((Claim::Busy | Claim::Done, _)) => {
                report.stopped = "state busy".into();
                break;
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let page_report = process(ctx, &blobs, settings, &claimed, started).await;
        tick.pending = tick.pending.plus(Counters::of(&page_report));
        report = merge(report, &page_report);
        report.pages += 1;
    }
    // The last write: the counters not yet written, and this tick no longer active.
    if tick.maybe_active || !tick.pending.is_zero() {
        let from = known.take().map(Known::now);
        match claim(ctx, &blobs, settings, &mut tick, None, from).await {
            Ok((Claim::Done, _)) => {}
            Ok(_) => report
                .stopped
                .push_str("; the state could not be updated (busy)"),
            Err(e) => {
                report
                    .stopped
                    .push_str("; the state could not be updated (storage)");
                failure.get_or_insert(e);
            }
        }
    }
    report.containers_skipped = std::mem::take(&mut tick.containers_skipped);
    report.unusable_names = std::mem::take(&mut tick.unusable_names);
    report.unusable_names_not_remembered = tick.unusable_overflow;
    (report, failure, counting.sent())
}

fn merge(mut into: Report, page: &Report) -> Report {
    into.scanned += page.scanned;
    into.unmarked += page.unmarked;
    into.not_expired += page.not_expired;
    into.tagged += page.tagged;
    into.deleted += page.deleted;
    into.moved += page.moved;
    into.locks_removed += page.locks_removed;
    into.errors += page.errors;
    for (k, v) in &page.skipped {
        into.skip_n(k, *v);
    }
    into
}

/// Processes a claimed page concurrently (at most `max_in_flight` blobs at a time).
async fn process<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<S>,
    settings: &Settings,
    claimed: &Claimed,
    started: Instant,
) -> Report {
    if let Some(found) = &claimed.found {
        return each_in_time(settings, started, found.blobs.iter(), |item| {
            sweep_found(ctx, blobs, settings, claimed, item)
        })
        .await;
    }
    each_in_time(
        settings,
        started,
        claimed.page.blobs.iter(),
        |item| async move {
            match claimed.kind {
                Kind::Ttl => sweep_listed(ctx, blobs, settings, claimed, item).await,
                Kind::Locks => sweep_lock(ctx, blobs, settings, claimed, item).await,
            }
        },
    )
    .await
}

/// A listed blob of a swept container: deleted (or moved) when its `TimeToLive` has passed;
/// under `ttl_find = both`, a marked blob it keeps gets its expiry tag when it lacks it (or
/// the tag says another time), so that later passes find it by the tag. As the migration does:
/// Set Blob Tags takes no `If-Match`, so a blob re-marked meanwhile may end with the older
/// time in its tag; a find then reads its metadata under a lease before acting, never
/// deleting early, and sets the tag to the metadata's time.
async fn sweep_listed<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<S>,
    settings: &Settings,
    claimed: &Claimed,
    item: &BlobItem,
) -> BlobOutcome {
    let outcome = sweep_blob_if(ctx, blobs, settings, claimed, item, None).await;
    let props = &item.properties;
    let expires = props
        .metadata
        .get(TIME_TO_LIVE)
        .and_then(|t| timer::parse_time(t));
    let (true, BlobOutcome::NotExpired, Some(expires), Ok(name)) = (
        claimed.tag_kept,
        &outcome,
        expires,
        BlobName::try_new(&item.name),
    ) else {
        return outcome;
    };
    // A leased blob's tags need its holder's lease: the next listing tags it.
    if props
        .lease_state
        .is_some_and(|s| matches!(s, LeaseState::Leased | LeaseState::Breaking))
    {
        return outcome;
    }
    // Listed with its tags: all of them are known.
    let known = props.tags.clone().unwrap_or_default();
    let value = rfc3339(expires);
    match set_expiry_tag(
        blobs,
        &claimed.container,
        &name,
        Existing::Known(known),
        Some(&value),
        None,
        ctx.now,
    )
    .await
    {
        Ok(true) => BlobOutcome::Tagged,
        Ok(false) => outcome,
        Err(_) => BlobOutcome::Error,
    }
}

/// Runs `sweep` on each of `items`, at most `max_in_flight` at a time, and counts the outcomes.
/// Late in the tick no blob is begun: it stays within `tick_bound`.
async fn each_in_time<I, F, Fut>(
    settings: &Settings,
    started: Instant,
    items: I,
    sweep: F,
) -> Report
where
    I: Iterator,
    F: Fn(I::Item) -> Fut,
    Fut: std::future::Future<Output = BlobOutcome>,
{
    let sweep = &sweep;
    let outcomes: Vec<BlobOutcome> = futures::stream::iter(items)
        .map(|item| async move {
            if started.elapsed() >= settings.work_deadline() {
                return BlobOutcome::Skipped("the tick's time ran out (the next pass takes it)");
            }
            sweep(item).await
        })
        .buffer_unordered(settings.storage.max_in_flight)
        .collect()
        .await;
    tally(outcomes)
}

/// Counts the outcomes of a page.
fn tally(outcomes: Vec<BlobOutcome>) -> Report {
    let mut report = Report::default();
    for o in outcomes {
        report.scanned += 1;
        match o {
            BlobOutcome::Unmarked => report.unmarked += 1,
            BlobOutcome::NotExpired => report.not_expired += 1,
            BlobOutcome::Tagged => {
                report.not_expired += 1;
                report.tagged += 1;
            }
            BlobOutcome::Deleted => report.deleted += 1,
            BlobOutcome::Moved => {
                report.deleted += 1;
                report.moved += 1;
            }
            BlobOutcome::LockRemoved => report.locks_removed += 1,
            BlobOutcome::Skipped(reason) => report.skip(reason),
            // Reported once, by the claim that first listed it.
            BlobOutcome::Unusable => {}
            BlobOutcome::Error => report.errors += 1,
        }
    }
    report
}

/// What became of one listed blob.
pub(crate) enum BlobOutcome {
    Unmarked,
    NotExpired,
    /// Not expired; its expiry tag was written (it had none, or another time).
    Tagged,
    Deleted,
    Moved,
    LockRemoved,
    Skipped(&'static str),
    /// A name that cannot be swept (see `remember_unusable` in `claim`).
    Unusable,
    Error,
}

/// What becomes of a marked blob: `item` as listed, or as read under the sweeper's own lease
/// `held` after it was found by its tag. Only its `TimeToLive` metadata marks it.
pub(crate) async fn sweep_blob_if<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<S>,
    settings: &Settings,
    claimed: &Claimed,
    item: &BlobItem,
    held: Option<LeaseId>,
) -> BlobOutcome {
    let props = &item.properties;
    match props.metadata.get(TIME_TO_LIVE) {
        None => return BlobOutcome::Unmarked,
        Some(ttl) => {
            let Some(expires) = timer::parse_time(ttl) else {
                return BlobOutcome::Skipped("TimeToLive is not a time");
            };
            if expires > claimed.server_now {
                return BlobOutcome::NotExpired;
            }
        }
    }
    let dead = match props.metadata.get(DEAD_BLOB_CONTAINER) {
        None => None,
        Some(d) if d.trim().is_empty() => None,
        Some(d) => match parse_location(d) {
            Ok(loc) => Some(loc),
            Err(_) => return BlobOutcome::Skipped("DeadBlobContainer is not container[/prefix/]"),
        },
    };
    if held.is_none()
        && props
            .lease_state
            .is_some_and(|s| matches!(s, LeaseState::Leased | LeaseState::Breaking))
    {
        return BlobOutcome::Skipped("leased");
    }
    let Ok(source) = BlobName::try_new(&item.name) else {
        return BlobOutcome::Unusable;
    };
    let Some(etag) = props.etag.clone() else {
        return BlobOutcome::Skipped("listed without an ETag");
    };
    let container = &claimed.container;
    if let Some((dead_container, prefix)) = &dead {
        // The owner asked for a move: a move that is not allowed leaves the blob where it is.
        if let Some(reason) = settings.dead_refusal(dead_container, prefix) {
            return BlobOutcome::Skipped(reason);
        }
        // The copy keeps the source's metadata: never carry a claim of this app's elsewhere.
        if props.metadata.keys().any(|k| k.starts_with("leasegate_")) {
            return BlobOutcome::Skipped("the blob carries leasegate claim metadata (never moved)");
        }
        let to = DeadBlobs {
            container: dead_container,
            prefix,
        };
        if let Err(reason) = move_blob(ctx, blobs, settings, claimed, item, &etag, to).await {
            return reason;
        }
    }
    // With its snapshots (a plain delete of a blob with snapshots is refused, every pass).
    let delete = DeleteBlobAndSnapshots(DeleteBlob {
        container: container.clone(),
        blob: source,
        lease_id: held,
        condition: Condition::IfMatch(etag),
    });
    match blobs.execute(&delete, ctx.now).await {
        Ok((DeleteOutcome::Deleted, _)) => {
            if dead.is_some() {
                BlobOutcome::Moved
            } else {
                BlobOutcome::Deleted
            }
        }
        Ok((DeleteOutcome::NotFound, _)) => BlobOutcome::Skipped("already gone"),
        Ok((DeleteOutcome::Refused(Refusal::LeaseHeld), _)) => BlobOutcome::Skipped("leased"),
        Ok((DeleteOutcome::Refused(_), _)) => BlobOutcome::Skipped("changed since listing"),
        Err(_) => BlobOutcome::Error,
    }
}

/// Whether `copy` holds the very content of `listed`: both carry a `Content-MD5` (storage
/// computes it for a Put Blob, and a copy keeps its source's) and they and the lengths agree.
/// A copy made in the same second as the listed version was written cannot be told from a
/// copy of an earlier version by its time; by its content it can.
fn same_content(
    copy: &leasegate::ops::BlobProperties,
    listed: &leasegate::ops::BlobProperties,
) -> bool {
    copy.content_md5.is_some()
        && copy.content_md5 == listed.content_md5
        && copy.content_length.is_some()
        && copy.content_length == listed.content_length
}

/// Whether a successful copy of this source, written at `copied` (seconds), holds the version
/// listed as written at `listed`: one written in a later second does; one written in the same
/// second does only with the very content (`same_content`). An earlier copy never does, even
/// with the same content: the source's metadata may have changed since (same MD5).
fn holds_listed_version(copied: Option<u64>, listed: Option<u64>, same_content: bool) -> bool {
    match (copied, listed) {
        (Some(copied), Some(listed)) => copied > listed || (copied == listed && same_content),
        _ => false,
    }
}

/// Where a moved blob goes: the dead-blob container and the prefix of its names there.
#[derive(Clone, Copy)]
struct DeadBlobs<'a> {
    container: &'a ContainerName,
    prefix: &'a str,
}

/// Copies the listed version of `item` to its dead-blob container, never over another blob:
/// to `{prefix}{name}`, or, when that name is taken by another blob, `{prefix}{name}.{etag}`.
/// The copy sends no metadata, so storage keeps the source's exactly (names' case and values).
/// A destination that already holds this version (copied from this source, successfully, and
/// either written in a later second than the listed version or, in the same second, holding
/// the listed version's very content, by `Content-MD5` and length: an earlier move that did
/// not get to delete the source) counts as copied; an earlier copy never does. `Err` is the outcome of a blob that must stay where it is.
async fn move_blob<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<S>,
    settings: &Settings,
    claimed: &Claimed,
    item: &BlobItem,
    etag: &leasegate::ETag,
    to: DeadBlobs<'_>,
) -> Result<(), BlobOutcome> {
    let DeadBlobs {
        container: dead_container,
        prefix,
    } = to;
    let source = BlobName::try_new(&item.name)
        .map_err(|_| BlobOutcome::Skipped("the name is not usable"))?;
    let source_uri = public_blob_url(&settings.storage.account, &claimed.container, &source);
    let version = etag.as_str().trim_matches('"').to_string();
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .ok()
    };
    let listed_at = item.properties.last_modified.map(secs);
    for name in [
        format!("{prefix}{}", item.name),
        format!("{prefix}{}.{version}", item.name),
    ] {
        let target = BlobName::try_new(&name)
            .map_err(|_| BlobOutcome::Skipped("the dead blob's name is too long"))?;
        let copy = CopyBlob {
            condition: Condition::IfNotExists,
            source_etag: Some(etag.clone()),
            metadata: None,
            ..CopyBlob::new(
                claimed.container.clone(),
                source.clone(),
                dead_container.clone(),
                target.clone(),
            )
        };
        match copy_creating(blobs, &copy, dead_container, ctx.now).await {
            Ok(CopyOutcome::Started {
                status: CopyStatus::Success,
                ..
            }) => return Ok(()),
            Ok(CopyOutcome::Started {
                status: CopyStatus::Pending,
                copy_id,
                ..
            }) => {
                return if wait_for_copy(ctx, blobs, dead_container, &target, copy_id.as_deref())
                    .await
                {
                    Ok(())
                } else {
                    Err(BlobOutcome::Skipped("the copy did not finish"))
                };
            }
            Ok(CopyOutcome::Refused(Refusal::ConditionFailed)) => {
                return Err(BlobOutcome::Skipped("changed since listing"))
            }
            // The name is taken (or leased): by this very version, or by another blob.
            Ok(CopyOutcome::Refused(_)) => {
                let head = GetProperties {
                    container: dead_container.clone(),
                    blob: target.clone(),
                };
                match blobs.execute(&head, ctx.now).await {
                    Ok((Some(p), _))
                        if p.copy_status.as_deref() == Some("success")
                            && p.copy_source.as_deref().and_then(|s| s.split('?').next())
                                == Some(source_uri.as_str())
                            && holds_listed_version(
                                p.last_modified.and_then(secs),
                                listed_at.flatten(),
                                same_content(&p, &item.properties),
                            ) =>
                    {
                        return Ok(())
                    }
                    Ok(_) => continue,
                    Err(_) => return Err(BlobOutcome::Error),
                }
            }
            Err(_) => return Err(BlobOutcome::Error),
        }
    }
    Err(BlobOutcome::Skipped("the dead blob's name is taken"))
}

/// Copies, creating the dead-blob container if it is missing.
async fn copy_creating<S: Transport>(
    blobs: &BlobClient<S>,
    copy: &CopyBlob,
    dead_container: &ContainerName,
    now: SystemTime,
) -> Result<CopyOutcome, leasegate::Error> {
    execute_creating_container(blobs, dead_container, copy, now)
        .await
        .map(|(outcome, _)| outcome)
}

/// Polls a pending copy's destination until this copy succeeds (`true`), or fails, is
/// replaced, or takes longer than [`COPY_WAIT`].
async fn wait_for_copy<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<S>,
    container: &ContainerName,
    blob: &BlobName,
    copy_id: Option<&str>,
) -> bool {
    let waited = Instant::now();
    while waited.elapsed() < COPY_WAIT {
        (ctx.sleep)(COPY_POLL).await;
        let head = GetProperties {
            container: container.clone(),
            blob: blob.clone(),
        };
        match blobs.execute(&head, ctx.now).await {
            Ok((Some(p), _)) if copy_id.is_none_or(|id| p.copy_id.as_deref() == Some(id)) => {
                match p.copy_status.as_deref() {
                    Some("success") => return true,
                    Some("pending") => continue,
                    _ => return false,
                }
            }
            _ => return false,
        }
    }
    false
}

/// A lock blob free for longer than the retention (not leased, no live claim, no marks, not
/// written since) is deleted with `If-Match` on its listed ETag.
async fn sweep_lock<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<S>,
    settings: &Settings,
    claimed: &Claimed,
    item: &BlobItem,
) -> BlobOutcome {
    let Some(retention) = settings.lock_retention else {
        return BlobOutcome::NotExpired;
    };
    let props = &item.properties;
    if props.blob_type.as_deref() != Some("PageBlob") || props.content_length.unwrap_or(0) != 0 {
        return BlobOutcome::Skipped("not a lock blob");
    }
    if props
        .lease_state
        .is_some_and(|s| matches!(s, LeaseState::Leased | LeaseState::Breaking))
    {
        return BlobOutcome::NotExpired;
    }
    if props.metadata.keys().any(|k| !k.starts_with("leasegate_")) {
        return BlobOutcome::Skipped("a lock with marks");
    }
    let secs = leasegate::time::unix_secs;
    let cutoff = secs(claimed.server_now).saturating_sub(retention.as_secs());
    // A record counts until it expires; a native claim only while its lease is held (it is not).
    let record = props
        .metadata
        .get("leasegate_term")
        .is_none_or(|t| t == "record");
    let expires: u64 = props
        .metadata
        .get("leasegate_expires")
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    let written = props.last_modified.map(secs).unwrap_or(u64::MAX);
    if (record && expires > cutoff) || written > cutoff {
        return BlobOutcome::NotExpired;
    }
    let (Ok(blob), Some(etag)) = (BlobName::try_new(&item.name), props.etag.clone()) else {
        return BlobOutcome::Skipped("the name is not usable");
    };
    let delete = DeleteBlob {
        container: claimed.container.clone(),
        blob,
        lease_id: None,
        condition: Condition::IfMatch(etag),
    };
    match blobs.execute(&delete, ctx.now).await {
        Ok((DeleteOutcome::Deleted, _)) => BlobOutcome::LockRemoved,
        Ok((DeleteOutcome::NotFound, _)) => BlobOutcome::Skipped("already gone"),
        // Taken or written since it was listed: in use again.
        Ok((DeleteOutcome::Refused(_), _)) => BlobOutcome::NotExpired,
        Err(_) => BlobOutcome::Error,
    }
}

#[cfg(test)]
mod tests {

    /// A dead-blob copy written before the listed version is an older version (its metadata
    /// may differ with the same content): never counted as copied; a later one is; one of the
    /// same second is when its content is the listed one.
    #[test]
    fn only_a_copy_from_the_listed_second_on_counts_as_copied() {
        use super::holds_listed_version as holds;
        assert!(!holds(Some(99), Some(100), true), "an older copy, same MD5");
        assert!(!holds(Some(99), Some(100), false));
        assert!(holds(Some(101), Some(100), false));
        assert!(holds(Some(100), Some(100), true));
        assert!(!holds(Some(100), Some(100), false));
        assert!(!holds(None, Some(100), true), "a copy of unknown age");
        assert!(!holds(Some(100), None, true));
    }
}
