//! The marking API, `PUT /api/ttl/{container}/{blob}`: sets `TimeToLive` (and
//! `DeadBlobContainer`) on a blob of a swept container by compare-and-swap on its ETag,
//! keeping its other metadata, then its expiry tag. The route's path and the swept check are
//! shared with the unmarking (`unmark`).

use std::time::{Duration, SystemTime};

use leasegate::ops::{Condition, GetProperties, Refusal, SetMetadata, WriteOutcome};
use leasegate::{BlobName, ContainerName, Counting, Request, Response, StatusCode, Transport};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::json;

use leasegate_spin::timer;
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{log_line, Context};

use crate::error::tags_forbidden;
use crate::index::{set_expiry_tag, Existing};
use crate::settings::{parse_location, Kind, Settings, DEAD_CONTAINERS_VAR};
use crate::{DEAD_BLOB_CONTAINER, MAX_TTL_SECS, TIME_TO_LIVE, TTL_ROUTE};

/// The body of a marking request: `expiresAt` or `ttlSeconds` (`null` counts as missing), and
/// `deadBlobContainer` (`Some(None)` for an explicit `null`, `None` when missing); no other
/// field (a stray one is the caller's mistake).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Marking {
    #[serde(default, deserialize_with = "expires_at")]
    expires_at: Option<String>,
    #[serde(default, deserialize_with = "ttl_seconds")]
    ttl_seconds: Option<u64>,
    #[serde(default, deserialize_with = "dead_blob_container")]
    dead_blob_container: Option<Option<String>>,
}

/// The longest part of serde's error text that a refused marking repeats (it quotes what it
/// refuses: a stray key as long as the body).
const MAX_ERROR_CHARS: usize = 200;

impl Marking {
    /// Reads a marking from a request body, which must be a JSON object (serde alone would
    /// also take a struct from an array of its fields). A wrong type is named in fixed words;
    /// any other error is cut to [`MAX_ERROR_CHARS`].
    fn from_body(body: &[u8]) -> Result<Marking, String> {
        let shown = |e: serde_json::Error| {
            let mut e = e.to_string();
            if let Some((cut, _)) = e.char_indices().nth(MAX_ERROR_CHARS) {
                e.truncate(cut);
                e.push_str("...");
            }
            e
        };
        let fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(body).map_err(shown)?;
        serde_json::from_value(serde_json::Value::Object(fields)).map_err(shown)
    }
}

/// A field of type `T` (`null` is `None`); any other type is refused with `message` (serde's
/// own would quote the caller's value, however long, and not name the field).
fn field<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    message: &str,
) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d).map_err(|_| D::Error::custom(message))
}

fn expires_at<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    field(d, "expiresAt must be a string")
}

fn ttl_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    field(d, "ttlSeconds must be a whole number from 0 to 2^64 - 1")
}

/// `deadBlobContainer`: there (`null` included: `Some(None)`); `default` gives `None` when it
/// is missing.
fn dead_blob_container<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<String>>, D::Error> {
    field(d, "deadBlobContainer must be a string").map(Some)
}

/// `PUT /api/ttl/{container}/{blob}`: sets `TimeToLive` (and `DeadBlobContainer`) on an
/// existing blob of a swept container, keeping its other metadata (compare-and-swap).
pub(crate) async fn mark<T: Transport>(ctx: &Context<'_, T>, request: &Request) -> Response {
    let (container, blob) = match target(request) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if let Err(r) = web::require_json(request) {
        return r;
    }
    let marking = match Marking::from_body(request.body()) {
        Ok(m) => m,
        Err(e) => return bad("invalid_body", format!("the body is not a marking: {e}")),
    };
    let Checked { expires_at, dead } = match marking.checked() {
        Ok(checked) => checked,
        Err(m) => return bad("invalid_body", m),
    };
    let settings = match Settings::load(ctx.variables) {
        Ok(s) => s,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    if let Some((c, prefix)) = &dead {
        if let Some(m) = dead_refused(&settings, c, prefix) {
            return bad("invalid_body", m);
        }
    }
    if let Err(r) = swept(&settings, &container, &blob) {
        return r;
    }
    let transport = (ctx.connect)(settings.storage.timeout);
    // Counted like the other paths: one instance of the lease code per component.
    let transport = Counting::new(&transport);
    let blobs = settings.storage.blobs(&transport);
    for _ in 0..4 {
        let head = GetProperties {
            container: container.clone(),
            blob: blob.clone(),
        };
        let (props, date) = match blobs.execute(&head, ctx.now).await {
            Ok((Some(p), date)) => (p, date),
            Ok((None, _)) => {
                return web::error(StatusCode::NOT_FOUND, "blob_not_found", "no such blob")
            }
            Err(e) => return web::storage_unavailable(&e),
        };
        let expires = expires_at.unwrap_or_else(|| {
            date.unwrap_or(ctx.now) + Duration::from_secs(marking.ttl_seconds.unwrap_or(0))
        });
        let mut metadata = props.metadata.clone();
        metadata.insert(TIME_TO_LIVE.into(), rfc3339(expires));
        match &marking.dead_blob_container {
            Some(Some(d)) => {
                metadata.insert(DEAD_BLOB_CONTAINER.into(), d.trim().to_string());
            }
            Some(None) => {
                metadata.remove(DEAD_BLOB_CONTAINER);
            }
            None => {}
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
                // The index tag beside the metadata (Set Blob Tags takes no If-Match on Azure,
                // and changes no ETag): the sweeper honours the later of the two.
                let tagged = match set_expiry_tag(
                    &blobs,
                    &container,
                    &blob,
                    Existing::of(props.tags.clone(), props.tag_count),
                    Some(&rfc3339(expires)),
                    None,
                    ctx.now,
                )
                .await
                {
                    Ok(_) => true,
                    // `ttl_find = list` does without the tag (an account without tag
                    // rights); `tags` needs it.
                    Err(_) if !settings.find.uses_tags() => false,
                    Err(e) if web::is_forbidden(&e) => return tags_forbidden(
                        &e,
                        "TimeToLive was written, the expiry tag was not (mark again once fixed)",
                    ),
                    Err(e) => {
                        return web::json(
                            web::storage_status(&e),
                            &json!({
                                "error": web::storage_error_code(&e),
                                "message": web::storage_failed(&e, "TimeToLive was written, the expiry tag was not (mark again)"),
                            }),
                        )
                    }
                };
                log_line(
                    json!({"fn": "ttl-sweeper", "decision": "marked", "container": container.as_str(), "expiresAt": rfc3339(expires), "tagged": tagged}),
                );
                return web::json(
                    StatusCode::OK,
                    &json!({
                        "container": container.as_str(),
                        "blob": blob.as_str(),
                        "expiresAt": rfc3339(expires),
                        "deadBlobContainer": metadata.get(DEAD_BLOB_CONTAINER),
                        "tagged": tagged,
                    }),
                );
            }
            Ok((WriteOutcome::Refused(Refusal::ConditionFailed), _)) => continue,
            Ok((WriteOutcome::Refused(_), _)) => {
                return web::error(
                    StatusCode::CONFLICT,
                    "leased",
                    "the blob is leased: mark it while it is free",
                )
            }
            Err(e) => return unwritable(e, &metadata),
        }
    }
    web::error(
        StatusCode::CONFLICT,
        "changed",
        "the blob kept changing while it was marked; try again",
    )
}

/// A 400 with `code` and `message`.
fn bad(code: &str, message: String) -> Response {
    web::error(StatusCode::BAD_REQUEST, code, message)
}

/// What a marking asks for, checked.
struct Checked {
    /// The expiry it names (`None`: `ttlSeconds` from storage's clock).
    expires_at: Option<SystemTime>,
    /// Its dead-blob container and the prefix there.
    dead: Option<(ContainerName, String)>,
}

impl Marking {
    /// What the body asks for, or what is wrong with it.
    fn checked(&self) -> Result<Checked, String> {
        let expires_at = match (&self.expires_at, self.ttl_seconds) {
            (Some(_), Some(_)) | (None, None) => {
                return Err("give exactly one of expiresAt (RFC 3339) and ttlSeconds".into())
            }
            (Some(t), None) => match timer::parse_time(t) {
                Some(t) => Some(t),
                None => {
                    return Err("expiresAt must be an RFC 3339 time (2026-11-21T14:00:00Z)".into())
                }
            },
            (None, Some(n)) if (1..=MAX_TTL_SECS).contains(&n) => None,
            (None, Some(_)) => return Err(format!("ttlSeconds must be 1 to {MAX_TTL_SECS}")),
        };
        let Some(Some(d)) = &self.dead_blob_container else {
            return Ok(Checked {
                expires_at,
                dead: None,
            });
        };
        // Stored as metadata, whose values are ASCII.
        if !d.chars().all(|c| c.is_ascii_graphic()) {
            return Err(
                "deadBlobContainer must be printable ASCII without spaces (it is stored \
                        as metadata)"
                    .into(),
            );
        }
        match parse_location(d) {
            Ok(location) => Ok(Checked {
                expires_at,
                dead: Some(location),
            }),
            Err(e) => Err(format!(
                "deadBlobContainer must be container, container/ or container/prefix/: {e}"
            )),
        }
    }
}

/// Why blobs may not be moved into `container`/`prefix` (`None`: they may).
fn dead_refused(settings: &Settings, container: &ContainerName, prefix: &str) -> Option<String> {
    let reason = settings.dead_refusal(container, prefix)?;
    Some(if *container == settings.storage.container {
        "deadBlobContainer cannot be the app's own container (it holds the locks and the sweep \
         state)"
            .to_string()
    } else if reason.contains(DEAD_CONTAINERS_VAR) {
        format!(
            "deadBlobContainer {container} is not allowed: blobs are moved only into the \
             containers named by {DEAD_CONTAINERS_VAR}"
        )
    } else {
        format!(
            "deadBlobContainer {container}/{prefix} is swept (ttl_containers): a moved blob would \
             be moved again"
        )
    })
}

/// The answer to a failed metadata write. The other metadata goes back exactly as storage gave
/// it; a value that cannot (not a header value) or that storage now refuses is the blob's
/// problem, not storage's: 422 `metadata_unwritable`, naming the metadata. Else storage's.
pub(crate) fn unwritable(e: leasegate::Error, metadata: &leasegate::ops::Metadata) -> Response {
    match e {
        leasegate::Error::InvalidArgument(m) => web::error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "metadata_unwritable",
            format!(
                "the blob's metadata cannot be written back as it is, nothing was changed: {m}"
            ),
        ),
        leasegate::Error::Storage(e) if e.status == StatusCode::BAD_REQUEST => {
            let names: Vec<&str> = metadata.keys().map(|k| k.as_str()).collect();
            web::error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "metadata_unwritable",
                format!(
                    "storage refused the blob's metadata as it is ({} {}), nothing was changed; names: {}",
                    e.status,
                    e.code.as_deref().unwrap_or("without a code"),
                    names.join(", ")
                ),
            )
        }
        e => web::storage_unavailable(&e),
    }
}

/// The container and blob a marking route names: `/api/ttl/{container}/{blob}`, the blob
/// name percent-decoded (`a//b` is `a%2F%2Fb`); a 400 naming what is wrong otherwise.
pub(crate) fn target(request: &Request) -> Result<(ContainerName, BlobName), Response> {
    let bad = |code: &str, m: String| web::error(StatusCode::BAD_REQUEST, code, m);
    let raw = &request.path()[TTL_ROUTE.len().min(request.path().len())..];
    let decoded = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| {
            bad(
                "invalid_path",
                "the path is not UTF-8 once percent-decoded".into(),
            )
        })?;
    let Some((container, blob)) = decoded.split_once('/') else {
        return Err(bad(
            "invalid_path",
            "the path must name a container and a blob: /api/ttl/{container}/{blob}".into(),
        ));
    };
    let container =
        ContainerName::try_new(container).map_err(|e| bad("invalid_container", e.to_string()))?;
    let blob = BlobName::try_new(blob).map_err(|e| bad("invalid_blob", e.to_string()))?;
    Ok((container, blob))
}

/// Refuses (403 `not_swept`) a blob outside every swept container and prefix.
pub(crate) fn swept(
    settings: &Settings,
    container: &ContainerName,
    blob: &BlobName,
) -> Result<(), Response> {
    let swept = settings.targets.iter().any(|(k, c, p)| {
        *k == Kind::Ttl && c == container && blob.as_str().starts_with(p.as_str())
    });
    if swept {
        Ok(())
    } else {
        Err(web::error(
            StatusCode::FORBIDDEN,
            "not_swept",
            "the blob is not in a swept container and prefix (ttl_containers)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marking bodies: the fields callers send, `null` for `deadBlobContainer` apart from a
    /// missing one; a stray field, a wrong type or a fraction is an error naming the problem.
    #[test]
    fn marking_bodies() {
        let m = Marking::from_body(br#"{"ttlSeconds": 60}"#).unwrap();
        assert_eq!((m.ttl_seconds, m.dead_blob_container), (Some(60), None));
        let m = Marking::from_body(
            br#"{"expiresAt": "2030-01-01T00:00:00Z", "deadBlobContainer": null}"#,
        )
        .unwrap();
        assert_eq!(m.expires_at.as_deref(), Some("2030-01-01T00:00:00Z"));
        assert_eq!(m.dead_blob_container, Some(None));
        let m =
            Marking::from_body(br#"{"ttlSeconds": null, "deadBlobContainer": "dead/a/"}"#).unwrap();
        assert_eq!(m.ttl_seconds, None);
        assert_eq!(m.dead_blob_container, Some(Some("dead/a/".into())));
        for (bad, names) in [
            (r#"{"ttlSeconds": 5, "colour": 1}"#, "colour"),
            (
                r#"{"ttlSeconds": 1e12}"#,
                "ttlSeconds must be a whole number",
            ),
            (r#"{"ttlSeconds": -5}"#, "ttlSeconds must be a whole number"),
            (
                r#"{"ttlSeconds": "5"}"#,
                "ttlSeconds must be a whole number",
            ),
            (
                r#"{"deadBlobContainer": 3}"#,
                "deadBlobContainer must be a string",
            ),
            ("[]", "expected a map"),
            ("[null, 60]", "expected a map"),
            ("{", "EOF"),
            ("{} {}", "trailing characters"),
        ] {
            let e = Marking::from_body(bad.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(names), "{bad}: {e}");
        }
    }

    /// A refused marking names the field in fixed words, and never repeats a long value or
    /// key whole.
    #[test]
    fn marking_errors_name_the_field_and_stay_short() {
        let long = format!(r#"{{"ttlSeconds": "{}"}}"#, "A".repeat(60_000));
        let e = Marking::from_body(long.as_bytes()).unwrap_err().to_string();
        assert!(e.len() < 300, "{} bytes", e.len());
        assert!(e.contains("ttlSeconds must be a whole number"), "{e}");
        for bad in ["-1", "1.5", r#""x""#, "true", "[]"] {
            let body = format!(r#"{{"ttlSeconds": {bad}}}"#);
            let e = Marking::from_body(body.as_bytes()).unwrap_err().to_string();
            assert!(
                e.contains("ttlSeconds must be a whole number"),
                "{bad}: {e}"
            );
        }
        for bad in ["5", "{}", "false"] {
            let body = format!(r#"{{"deadBlobContainer": {bad}}}"#);
            let e = Marking::from_body(body.as_bytes()).unwrap_err().to_string();
            assert!(
                e.contains("deadBlobContainer must be a string"),
                "{bad}: {e}"
            );
        }
        let e = Marking::from_body(br#"{"expiresAt": 5}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("expiresAt must be a string"), "{e}");
        // A long stray key, or long text after the object, is cut.
        let key = format!(r#"{{"{}": 1}}"#, "k".repeat(60_000));
        let e = Marking::from_body(key.as_bytes()).unwrap_err().to_string();
        assert!(
            e.len() < 300 && e.contains("unknown field"),
            "{} bytes",
            e.len()
        );
        let trailing = format!(r#"{{}} "{}""#, "é".repeat(60_000));
        let e = Marking::from_body(trailing.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.len() < 300, "{} bytes", e.len());
    }
}
