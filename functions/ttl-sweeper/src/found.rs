//! Blobs found by their expiry tag (`ttl_find = tags`, and the finds of `both`): each is
//! leased on the tag it was found with, read under the lease, and deleted (moved first if
//! asked) only if it is what was found and its `TimeToLive` metadata has passed; a blob whose
//! metadata says otherwise is kept and its tag made to say what the metadata says.

use std::time::SystemTime;

use leasegate::ops::{
    tag_equals, BlobItem, FoundBlob, GetProperties, IfTags, Lease, LeaseAction, LeaseOutcome,
};
use leasegate::BlobClient;
use leasegate::{BlobName, LeaseDuration, LeaseId, Transport};

use leasegate_spin::timer;
use leasegate_spin::web::rfc3339;
use leasegate_spin::Context;

use crate::claim::Claimed;
use crate::index::{set_expiry_tag, Existing};
use crate::settings::Settings;
use crate::sweep::{sweep_blob_if, BlobOutcome};
use crate::{EXPIRES_TAG, TIME_TO_LIVE};

/// How long the sweeper leases a found blob while it checks and deletes it (storage's
/// shortest lease).
const FOUND_LEASE_SECS: i64 = 15;

/// Sweeps a blob found by its expiry tag (`ttl_find = tags`, and the finds of `both`) **only if
/// it is what was found and its `TimeToLive` has passed**: a 15 s lease under `x-ms-if-tags`
/// (the tag as found), a HEAD under the lease, then the delete (the move first, if asked) with
/// the lease id and `If-Match`, or the lease released. The rules and why not one conditional
/// delete: docs/ttl-sweeper.md, "Finding expired blobs" ("Only what was found").
pub(crate) async fn sweep_found<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<S>,
    settings: &Settings,
    claimed: &Claimed,
    found: &FoundBlob,
) -> BlobOutcome {
    let Some(tag) = found.tags.get(EXPIRES_TAG) else {
        return BlobOutcome::Skipped("found without its expiry tag");
    };
    let Some(tag_time) = timer::parse_time(tag) else {
        return BlobOutcome::Skipped("the expiry tag is not a time");
    };
    if tag_time > claimed.server_now {
        return BlobOutcome::NotExpired;
    }
    let Ok(name) = BlobName::try_new(&found.name) else {
        return BlobOutcome::Unusable;
    };
    let Ok(if_tags) = tag_equals(EXPIRES_TAG, tag) else {
        return BlobOutcome::Skipped("the expiry tag is not a time");
    };
    let (Ok(duration), lease_id) = (
        LeaseDuration::try_from_secs(FOUND_LEASE_SECS),
        (ctx.new_lease_id)(),
    ) else {
        return BlobOutcome::Error;
    };
    let acquire = IfTags {
        op: Lease::new(
            claimed.container.clone(),
            name.clone(),
            LeaseAction::Acquire {
                duration,
                proposed: lease_id,
            },
        ),
        condition: if_tags,
    };
    match blobs.execute(&acquire, ctx.now).await {
        Ok((LeaseOutcome::Held { .. }, _)) => {}
        Ok((LeaseOutcome::HeldByOther, _)) => return BlobOutcome::Skipped("leased"),
        Ok(_) => return BlobOutcome::Error,
        Err(e) if e.class() == Some(leasegate::ErrorClass::PreconditionFailed) => {
            return BlobOutcome::Skipped("re-marked since found")
        }
        Err(e) if e.class() == Some(leasegate::ErrorClass::BlobMissing) => {
            return BlobOutcome::Skipped("already gone")
        }
        Err(_) => return BlobOutcome::Error,
    }
    let outcome = sweep_leased(ctx, blobs, settings, claimed, found, &name, lease_id).await;
    if !matches!(outcome, BlobOutcome::Deleted | BlobOutcome::Moved) {
        let release = Lease::new(
            claimed.container.clone(),
            name,
            LeaseAction::Release(lease_id),
        );
        let _ = blobs.execute(&release, ctx.now).await;
    }
    outcome
}

/// A found blob under the sweeper's lease `lease_id`: read, checked, deleted (or moved).
async fn sweep_leased<T, S: Transport>(
    ctx: &Context<'_, T>,
    blobs: &BlobClient<S>,
    settings: &Settings,
    claimed: &Claimed,
    found: &FoundBlob,
    name: &BlobName,
    lease_id: LeaseId,
) -> BlobOutcome {
    let head = GetProperties {
        container: claimed.container.clone(),
        blob: name.clone(),
    };
    let props = match blobs.execute(&head, ctx.now).await {
        Ok((Some(p), _)) => p,
        Ok((None, _)) => return BlobOutcome::Skipped("already gone"),
        Err(_) => return BlobOutcome::Error,
    };
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(u64::MAX)
    };
    // Written in the second of the find answer or later: perhaps after it was found.
    if props
        .last_modified
        .is_none_or(|m| secs(m) >= secs(claimed.server_now))
    {
        return BlobOutcome::Skipped("changed since found");
    }
    // The metadata is the mark, the tag an index: a blob without a due `TimeToLive` is kept,
    // and its tag made to say what the metadata says (cleared without one), under the lease.
    let tag = match props
        .metadata
        .get(TIME_TO_LIVE)
        .map(|t| timer::parse_time(t))
    {
        None => None,
        Some(Some(expires)) if expires > claimed.server_now => Some(rfc3339(expires)),
        // Due (or not a time: reported as such, the tag left as it is).
        Some(_) => {
            let item = BlobItem {
                name: found.name.clone(),
                properties: props,
            };
            return sweep_blob_if(ctx, blobs, settings, claimed, &item, Some(lease_id)).await;
        }
    };
    // Its only tag is the one it was found by: no need to read them.
    let known = (props.tag_count == Some(1)).then(|| found.tags.clone());
    let written = set_expiry_tag(
        blobs,
        &claimed.container,
        name,
        Existing::of(known, props.tag_count),
        tag.as_deref(),
        Some(lease_id),
        ctx.now,
    )
    .await;
    match (written, tag) {
        (Err(_), _) => BlobOutcome::Error,
        (Ok(_), None) => BlobOutcome::Skipped(TAG_CLEARED),
        (Ok(true), Some(_)) => BlobOutcome::Tagged,
        (Ok(false), Some(_)) => BlobOutcome::NotExpired,
    }
}

/// Why a found blob without `TimeToLive` was left (its stale expiry tag cleared).
const TAG_CLEARED: &str = "no TimeToLive (kept, its expiry tag cleared)";
