//! `POST /api/sweeper/migrate` (admin token): one listing pass over `ttl_containers` that
//! gives every blob marked the old way (`TimeToLive` metadata, no expiry tag, or a tag that
//! says another time) its expiry tag, so that `ttl_find = tags` finds it. Resumable: the
//! progress (a marker per container and the counters) is kept in `sweeper/migration.json`
//! and each call goes on from there until its time budget (`ttl_time_budget_ms`) is spent; the
//! answer says how far it is (`done`). Calling again after it is done starts a new pass.

use std::time::{Instant, SystemTime};

use futures::StreamExt;
use leasegate::ops::{BlobItem, GetBlob, ListBlobs};
use leasegate::{BlobClient, BlobName, ContainerName, Counting, Response, StatusCode, Transport};
use serde::{Deserialize, Serialize};
use serde_json::json;

use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{elapsed_ms, timer, Context};

use crate::error::tags_forbidden;
use crate::index::{set_expiry_tag, Existing};
use crate::settings::{Kind, Settings};
use crate::state::put_json_if;
use crate::{EXPIRES_TAG, MIGRATION_BLOB, TIME_TO_LIVE};

/// One swept container (and prefix) in the migration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Progress {
    container: String,
    #[serde(default)]
    prefix: String,
    /// Where the next page starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    marker: Option<String>,
    /// Every page listed.
    #[serde(default)]
    done: bool,
}

/// The migration blob (`sweeper/migration.json`), also the answer's body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Migration {
    /// Every container is done.
    done: bool,
    containers: Vec<Progress>,
    /// Pages listed.
    pages: u64,
    /// Blobs listed.
    scanned: u64,
    /// Blobs given their expiry tag.
    tagged: u64,
    /// Marked blobs whose tag already said their time.
    already_tagged: u64,
    /// Blobs without `TimeToLive`.
    unmarked: u64,
    /// Blobs left as they were: `TimeToLive` not a time, or a name that cannot be used.
    skipped: u64,
    /// Tag writes that failed (the blob is left untagged; a new pass retries it).
    errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completed_at: Option<String>,
}

/// What became of one listed blob.
enum Outcome {
    Tagged,
    Already,
    Unmarked,
    Skipped,
    Error,
    Forbidden(leasegate::Error),
}

/// `POST /api/sweeper/migrate`.
pub(crate) async fn migrate<T: Transport>(
    ctx: &Context<'_, T>,
    settings: &Settings,
    started: Instant,
) -> Response {
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let blobs = settings.storage.blobs(&counting);
    let mut fresh = true;
    let answer = |m: &Migration, trips: u32| {
        let mut v = serde_json::to_value(m).expect("the migration serializes");
        v["storageRoundTrips"] = json!(trips);
        v["durationMs"] = json!(elapsed_ms(started));
        web::json(StatusCode::OK, &v)
    };
    loop {
        let (mut m, etag, server_now) = match read(&blobs, settings, ctx.now).await {
            Ok(r) => r,
            Err(e) => return web::storage_unavailable(&e),
        };
        if m.done && fresh {
            // Done before this call: a new pass.
            m = Migration::default();
        }
        fresh = false;
        reconcile(&mut m, settings);
        m.started_at.get_or_insert_with(|| rfc3339(server_now));
        let Some(index) = m.containers.iter().position(|p| !p.done) else {
            m.done = true;
            m.completed_at = Some(rfc3339(server_now));
            return match write(&blobs, &m, etag, ctx.now).await {
                Ok(_) => answer(&m, counting.sent()),
                Err(e) => web::storage_unavailable(&e),
            };
        };
        if started.elapsed() >= settings.budget {
            return answer(&m, counting.sent());
        }
        let p = m.containers[index].clone();
        let container = match ContainerName::try_new(&p.container) {
            Ok(c) => c,
            Err(e) => return web::storage_unavailable(&e),
        };
        let list = ListBlobs {
            prefix: (!p.prefix.is_empty()).then(|| p.prefix.clone()),
            marker: p.marker.clone(),
            max_results: Some(settings.page_size),
            include_metadata: true,
            include_tags: true,
            ..ListBlobs::new(container.clone())
        };
        let page = match blobs.execute(&list, ctx.now).await {
            Ok((page, _)) => page,
            Err(e) if e.class() == Some(leasegate::ErrorClass::ContainerMissing) => {
                Default::default()
            }
            Err(e) if web::is_forbidden(&e) => {
                return tags_forbidden(&e, "no blob was tagged by this call")
            }
            Err(e) => return web::storage_unavailable(&e),
        };
        let outcomes: Vec<Outcome> = futures::stream::iter(page.blobs.iter())
            .map(|item| tag_blob(&blobs, &container, item, ctx.now))
            .buffer_unordered(settings.storage.max_in_flight)
            .collect()
            .await;
        m.pages += 1;
        for o in outcomes {
            m.scanned += 1;
            match o {
                Outcome::Tagged => m.tagged += 1,
                Outcome::Already => m.already_tagged += 1,
                Outcome::Unmarked => m.unmarked += 1,
                Outcome::Skipped => m.skipped += 1,
                Outcome::Error => m.errors += 1,
                Outcome::Forbidden(e) => {
                    return tags_forbidden(&e, "the blobs before it on this page were tagged")
                }
            }
        }
        let e = &mut m.containers[index];
        e.marker = page.next_marker;
        e.done = e.marker.is_none();
        match write(&blobs, &m, etag, ctx.now).await {
            Ok(_) => {}
            Err(e) => return web::storage_unavailable(&e),
        }
        // (A write that lost to another caller's leaves this page to be listed again: tagging
        // is idempotent; the next read goes on from whichever progress was kept.)
    }
}

/// Tags one listed blob if it is marked and its tag does not say the same time.
async fn tag_blob<S: Transport>(
    blobs: &BlobClient<S>,
    container: &ContainerName,
    item: &BlobItem,
    now: SystemTime,
) -> Outcome {
    let props = &item.properties;
    let Some(ttl) = props.metadata.get(TIME_TO_LIVE) else {
        return Outcome::Unmarked;
    };
    let (Some(expires), Ok(name)) = (timer::parse_time(ttl), BlobName::try_new(&item.name)) else {
        return Outcome::Skipped;
    };
    let value = rfc3339(expires);
    if props
        .tags
        .as_ref()
        .and_then(|t| t.get(EXPIRES_TAG))
        .is_some_and(|v| *v == value)
    {
        return Outcome::Already;
    }
    // Listed with its tags: all of them are known.
    let known = props.tags.clone().unwrap_or_default();
    match set_expiry_tag(
        blobs,
        container,
        &name,
        Existing::Known(known),
        Some(&value),
        None,
        now,
    )
    .await
    {
        Ok(_) => Outcome::Tagged,
        Err(e) if web::is_forbidden(&e) => Outcome::Forbidden(e),
        Err(_) => Outcome::Error,
    }
}

/// The configured containers, in order, with the migration's progress where it has some.
fn reconcile(m: &mut Migration, settings: &Settings) {
    for (kind, container, prefix) in &settings.targets {
        if *kind != Kind::Ttl {
            continue;
        }
        let known = m
            .containers
            .iter()
            .any(|p| p.container == container.as_str() && p.prefix == *prefix);
        if !known {
            m.containers.push(Progress {
                container: container.to_string(),
                prefix: prefix.clone(),
                marker: None,
                done: false,
            });
        }
    }
    m.done = m.containers.iter().all(|p| p.done) && m.completed_at.is_some();
}

async fn read<S: Transport>(
    blobs: &BlobClient<S>,
    settings: &Settings,
    now: SystemTime,
) -> Result<(Migration, Option<leasegate::ETag>, SystemTime), leasegate::Error> {
    let get = GetBlob {
        container: settings.storage.container.clone(),
        blob: BlobName::try_new(MIGRATION_BLOB)?,
    };
    let (blob, date) = blobs.execute(&get, now).await?;
    let date = date.unwrap_or(now);
    Ok(match blob {
        None => (Migration::default(), None, date),
        // Not a migration (someone wrote it): start over.
        Some(b) => (
            serde_json::from_slice(&b.body).unwrap_or_default(),
            b.properties.etag,
            date,
        ),
    })
}

/// Writes the progress by compare-and-swap; `false` when another caller wrote it first.
async fn write<S: Transport>(
    blobs: &BlobClient<S>,
    m: &Migration,
    etag: Option<leasegate::ETag>,
    now: SystemTime,
) -> Result<bool, leasegate::Error> {
    put_json_if(blobs, BlobName::try_new(MIGRATION_BLOB)?, m, etag, now).await
}
