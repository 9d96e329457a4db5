//! The unmarking API, `DELETE /api/ttl/{container}/{blob}` (admin token): removes a blob's mark
//! (`TimeToLive` and `DeadBlobContainer` metadata, by compare-and-swap on its ETag, its other
//! metadata kept), then its expiry tag (its other tags kept). The metadata goes first: it is
//! the mark, so once it is gone the sweeper keeps the blob whatever its tag says (a find that
//! reads a blob without `TimeToLive` clears the tag), and a tag left behind by a failure here
//! does no harm. Answers 200 with what was removed (nothing, when the blob was not marked).

use leasegate::ops::{Condition, GetProperties, Refusal, SetMetadata, WriteOutcome};
use leasegate::{Counting, LeaseState, Request, Response, StatusCode, Transport};
use serde_json::json;

use leasegate_spin::web;
use leasegate_spin::{log_line, Context};

use crate::error::tags_forbidden;
use crate::index::clear_expiry_tag_unless_remarked;
use crate::mark::{swept, target, unwritable};
use crate::settings::Settings;
use crate::{DEAD_BLOB_CONTAINER, EXPIRES_TAG, TIME_TO_LIVE};

/// The metadata of a mark, as storage keeps it and as the answer names it.
const MARK: [(&str, &str); 2] = [
    (TIME_TO_LIVE, "TimeToLive"),
    (DEAD_BLOB_CONTAINER, "DeadBlobContainer"),
];

/// `DELETE /api/ttl/{container}/{blob}`.
pub(crate) async fn unmark<T: Transport>(ctx: &Context<'_, T>, request: &Request) -> Response {
    let (container, blob) = match target(request) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if !request.body().iter().all(u8::is_ascii_whitespace) {
        return web::error(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "unmarking takes no body",
        );
    }
    let settings = match Settings::load(ctx.variables) {
        Ok(s) => s,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    if let Err(r) = swept(&settings, &container, &blob) {
        return r;
    }
    let leased = || {
        web::error(
            StatusCode::CONFLICT,
            "leased",
            "the blob is leased: unmark it while it is free",
        )
    };
    let transport = (ctx.connect)(settings.storage.timeout);
    let transport = Counting::new(&transport);
    let blobs = settings.storage.blobs(&transport);
    let mut removed: Vec<&str> = Vec::new();
    let mut unmarked = None;
    for _ in 0..4 {
        let head = GetProperties {
            container: container.clone(),
            blob: blob.clone(),
        };
        let props = match blobs.execute(&head, ctx.now).await {
            Ok((Some(p), _)) => p,
            Ok((None, _)) => {
                return web::error(StatusCode::NOT_FOUND, "blob_not_found", "no such blob")
            }
            Err(e) => return web::storage_unavailable(&e),
        };
        // Neither the metadata nor the tags can be written without the holder's lease.
        if matches!(
            props.lease_state,
            Some(LeaseState::Leased | LeaseState::Breaking)
        ) {
            return leased();
        }
        let mut metadata = props.metadata.clone();
        let names: Vec<&str> = MARK
            .iter()
            .filter(|(key, _)| metadata.remove(*key).is_some())
            .map(|(_, shown)| *shown)
            .collect();
        if names.is_empty() {
            unmarked = Some(props);
            break;
        }
        let Some(etag) = props.etag.clone() else {
            return web::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
                "the blob has no ETag",
            );
        };
        let write = SetMetadata {
            container: container.clone(),
            blob: blob.clone(),
            metadata: metadata.clone(),
            lease_id: None,
            condition: Condition::IfMatch(etag),
        };
        match blobs.execute(&write, ctx.now).await {
            Ok((WriteOutcome::Written(_), _)) => {
                removed = names;
                unmarked = Some(props);
                break;
            }
            Ok((WriteOutcome::Refused(Refusal::ConditionFailed), _)) => continue,
            Ok((WriteOutcome::Refused(_), _)) => return leased(),
            Err(e) => return unwritable(e, &metadata),
        }
    }
    let Some(props) = unmarked else {
        return web::error(
            StatusCode::CONFLICT,
            "changed",
            "the blob kept changing while it was unmarked; try again",
        );
    };
    let consequence = "the mark was removed, the expiry tag was not (harmless: the sweeper keeps \
                       a blob without TimeToLive and clears its tag when it finds it; unmark \
                       again to remove it)";
    // The tag only if it is still the one this unmark read: a mark that raced in after the
    // metadata's write (and wrote its own tag) wins.
    let tagged =
        match clear_expiry_tag_unless_remarked(&blobs, &container, &blob, props.tag_count, ctx.now)
            .await
        {
            Ok(cleared) => {
                if cleared && !remarked_meanwhile(&blobs, &container, &blob, ctx.now).await {
                    removed.push(EXPIRES_TAG);
                }
                Some(false)
            }
            // `ttl_find = list` does without tags (an account without tag rights): not known.
            Err(_) if !settings.find.uses_tags() => None,
            Err(e) if web::is_forbidden(&e) => return tags_forbidden(&e, consequence),
            Err(e) => {
                return web::json(
                    web::storage_status(&e),
                    &json!({
                        "error": web::storage_error_code(&e),
                        "message": web::storage_failed(&e, consequence),
                    }),
                )
            }
        };
    log_line(
        json!({"fn": "ttl-sweeper", "decision": "unmarked", "container": container.as_str(), "removed": removed}),
    );
    web::json(
        StatusCode::OK,
        &json!({
            "container": container.as_str(),
            "blob": blob.as_str(),
            "expiresAt": null,
            "deadBlobContainer": null,
            "tagged": tagged,
            "removed": removed,
        }),
    )
}

/// After this unmark removed the expiry tag: whether a mark landed between its metadata's write
/// and the tag's (its `TimeToLive` is there now). Then its tag is written again from the
/// metadata (one read, and a write if so): Azure refuses the unmark's tag write by its
/// `x-ms-if-tags` condition, but Azurite ignores that condition on Set Blob Tags, and the
/// mark's tag would be gone.
async fn remarked_meanwhile<S: Transport>(
    blobs: &leasegate::BlobClient<S>,
    container: &leasegate::ContainerName,
    blob: &leasegate::BlobName,
    now: std::time::SystemTime,
) -> bool {
    let head = GetProperties {
        container: container.clone(),
        blob: blob.clone(),
    };
    let Ok((Some(props), _)) = blobs.execute(&head, now).await else {
        return false;
    };
    let Some(expires) = props
        .metadata
        .get(TIME_TO_LIVE)
        .and_then(|t| leasegate_spin::timer::parse_time(t))
    else {
        return false;
    };
    let value = web::rfc3339(expires);
    let _ = crate::index::set_expiry_tag(
        blobs,
        container,
        blob,
        crate::index::Existing::Counted(props.tag_count),
        Some(&value),
        None,
        now,
    )
    .await;
    true
}
