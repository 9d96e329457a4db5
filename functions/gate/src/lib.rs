//! The generic gate API: `POST|GET|DELETE /api/gate/{key}`.
//!
//! * `POST ?window=SECONDS&holder=NAME`: take the gate for `window` seconds (1 to 86400,
//!   default 60). Any mix of windows shares one gate. Every call without a `Lease-Id` header is a
//!   new event with a fresh lease id; a call with `Lease-Id: GUID` acquires with that id, so the
//!   holder of that id extends its gate (and keeps its token), and a client that chose its own
//!   id up front can retry after a lost answer. A lease id is returned only to the call that
//!   acquired (or extended) with it: never to another caller, whatever `holder` it names.
//!   `holder` (1 to 128 printable ASCII characters) only names the holder: it is shown by `GET`
//!   and by a refused `POST` as `holder`, and it never selects or reveals a lease id.
//!   200 `{"acquired":true,"key","leaseId","fencingToken","expiresAt","since","extended"}`, or
//!   429 with `Retry-After` and `{"acquired":false,"key","retryAfterSeconds","holder"?}`.
//! * `DELETE` with header `Lease-Id`: give the gate back. 204, and 204 again on retry.
//! * `GET`: 200 `{"key","state":"available"|"held","expiresAt","since","fencingToken","holder"?}`.
//!
//! Every call needs `Authorization: Bearer <gate_token>`, checked before any other setting is
//! read.
//!
//! The gate API keeps no "held until" entries (device-alerts' gate cache): its holders extend,
//! shorten and give back their gates whenever they like, and Spin's key-value store has no
//! compare-and-swap, so a `DELETE` racing its holder's `POST` could leave a "held" entry behind
//! a free gate. Every call asks storage (1 request for a busy gate). With `kv_cache = on` (the
//! default) the deployment keeps, one entry a gate, the gate as its latest holder's last call
//! through it left it ([`leasegate_spin::held`]): the holder's next `POST` extends and its `DELETE` releases
//! without reading first (a native gate 2 requests, a record 1, a release 1), each request
//! conditional on the kept ETag, so a kept state that is stale (the holder called another
//! deployment, a race) costs one refused request and then the read.
#![deny(missing_docs)]
// Helpers return `Err(Response)`: the finished 4xx answer, once per request.
#![allow(clippy::result_large_err)]

use std::time::{Duration, Instant};

use leasegate::lease::{Acquire, Acquiring, IdOrigin, LockInfo, LockStatus, Release, Term};
use leasegate::{Counting, LeaseId, LockName, Transport};
use leasegate::{Request, Response, StatusCode};
use percent_encoding::percent_decode_str;
use serde::Serialize;
use serde_json::json;

use leasegate_spin::cache::{self, Cache};
use leasegate_spin::config::{self, ConfigError, Storage, Variables};
use leasegate_spin::web::{self, rfc3339};
use leasegate_spin::{auth, elapsed_ms, held, log_line, Context};

/// Blob name prefix of the gates.
pub const GATE_PREFIX: &str = "gates/";
/// The route prefix the gate is mounted at.
pub const ROUTE_PREFIX: &str = "/api/gate";
/// The longest window, in seconds (one day).
pub const MAX_WINDOW_SECS: u64 = 86_400;
/// The longest holder name, in bytes.
pub const MAX_HOLDER_BYTES: usize = 128;

/// The gate's settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Storage.
    pub storage: Storage,
    /// `kv_cache`: whether holders' gates are kept in the key-value store ([`held`]).
    pub cache: cache::Mode,
}

impl Settings {
    /// Reads the settings (authentication is read and checked before, by [`handle`]).
    pub fn load(vars: &dyn Variables) -> Result<Settings, ConfigError> {
        Ok(Settings {
            storage: config::storage(vars)?,
            cache: cache::Mode::load(vars)?,
        })
    }
}

/// The gate key of the request path (after the route prefix), percent-decoded and validated.
pub(crate) fn key_of(request: &Request) -> Result<LockName, Response> {
    // The request's own path, never Spin's `spin-path-info` header: Spin passes a client's own
    // `spin-*` headers before the ones it adds, so a client could pick the key (and a proxy
    // that allows callers by path would be bypassed).
    let path = request.path().strip_prefix(ROUTE_PREFIX).unwrap_or("");
    let raw = path.strip_prefix('/').unwrap_or("");
    let bad = |message: String| web::error(StatusCode::BAD_REQUEST, "invalid_key", message);
    if raw.is_empty() {
        return Err(bad("the path must name a key: /api/gate/{key}".into()));
    }
    let key = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| bad("the key is not UTF-8 once percent-decoded".into()))?;
    LockName::try_new(&key).map_err(|e| match e {
        leasegate::Error::InvalidName { reason, .. } => bad(format!("key {reason}")),
        other => bad(other.to_string()),
    })
}

/// The `Lease-Id` header, if sent: `Err` is the 400 for one that is not a GUID.
fn lease_id_header(request: &Request) -> Result<Option<LeaseId>, Response> {
    match request.headers().get("lease-id").map(LeaseId::try_new) {
        None => Ok(None),
        Some(Ok(id)) => Ok(Some(id)),
        Some(Err(_)) => Err(web::error(
            StatusCode::BAD_REQUEST,
            "invalid_lease_id",
            "Lease-Id must be a GUID",
        )),
    }
}

/// The query parameters of a POST.
#[derive(Debug, PartialEq, Eq)]
struct Acquisition {
    window: u64,
    holder: Option<String>,
}

fn parse_query(query: Option<&str>) -> Result<Acquisition, String> {
    let mut window = None;
    let mut holder = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode_str(&value.replace('+', " "))
            .decode_utf8()
            .map_err(|_| format!("query parameter {name} is not UTF-8"))?
            .into_owned();
        match name {
            "window" if window.is_none() => {
                let secs: u64 = value.parse().map_err(|_| {
                    format!("window must be whole seconds from 1 to {MAX_WINDOW_SECS}")
                })?;
                if !(1..=MAX_WINDOW_SECS).contains(&secs) {
                    return Err(format!(
                        "window must be whole seconds from 1 to {MAX_WINDOW_SECS}"
                    ));
                }
                window = Some(secs);
            }
            "holder" if holder.is_none() => {
                // Printable ASCII: the holder's name is shown to other callers (no control,
                // format or separator character can disguise it).
                if value.is_empty()
                    || value.len() > MAX_HOLDER_BYTES
                    || !value.bytes().all(|b| (0x20..0x7f).contains(&b))
                {
                    return Err(format!(
                        "holder must be 1 to {MAX_HOLDER_BYTES} printable ASCII characters"
                    ));
                }
                holder = Some(value);
            }
            "window" | "holder" => return Err(format!("query parameter {name} is given twice")),
            other => {
                let shown: String = other.chars().take(32).collect();
                return Err(format!(
                    "unknown query parameter '{shown}' (use window, holder)"
                ));
            }
        }
    }
    Ok(Acquisition {
        window: window.unwrap_or(60),
        holder,
    })
}

/// The 429 of a busy gate.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Busy<'a> {
    acquired: bool,
    key: &'a str,
    retry_after_seconds: u64,
    /// The holder's name, when it gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    holder: Option<&'a str>,
}

/// The answer of a `GET`. The holder's lease id is not shown: it is what releases the gate.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Inspected<'a> {
    key: &'a str,
    state: &'static str,
    expires_at: Option<String>,
    since: Option<String>,
    fencing_token: u64,
    /// The holder's name, when it gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
}

/// Handles a gate request.
pub async fn handle<T: Transport>(ctx: &Context<'_, T>, request: Request) -> Response {
    let started = Instant::now();
    if let Err(r) = auth::authenticate(ctx.variables, "gate_token", "gate_auth", &request) {
        return r;
    }
    let method = request.method().clone();
    if method != leasegate::Method::POST
        && method != leasegate::Method::GET
        && method != leasegate::Method::DELETE
    {
        return web::method_not_allowed("GET, POST, DELETE");
    }
    let key = match key_of(&request) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let settings = match Settings::load(ctx.variables) {
        Ok(s) => s,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    let transport = (ctx.connect)(settings.storage.timeout);
    let counting = Counting::new(&transport);
    let locks = settings.storage.locks(&counting, GATE_PREFIX);
    // What holders keep of their gates between calls (`kv_cache = off`: nothing).
    let cache: &dyn Cache = match settings.cache {
        cache::Mode::On => ctx.cache,
        cache::Mode::Off => &cache::NoCache,
    };
    let log = |decision: &str| {
        log_line(json!({
            "fn": "gate",
            "key": key.as_str(),
            "decision": decision,
            "storageRoundTrips": counting.sent(),
            "durationMs": elapsed_ms(started),
        }))
    };
    let busy = |secs: u64, holder: Option<&str>| {
        let body = Busy {
            acquired: false,
            key: key.as_str(),
            retry_after_seconds: secs,
            holder,
        };
        let mut r = web::json(StatusCode::TOO_MANY_REQUESTS, &body);
        r.headers_mut().insert("retry-after", secs.to_string());
        r
    };

    if method == leasegate::Method::POST {
        let query = match parse_query(request.query()) {
            Ok(q) => q,
            Err(m) => return web::error(StatusCode::BAD_REQUEST, "invalid_query", m),
        };
        let term = match Term::for_window(Duration::from_secs(query.window)) {
            Ok(t) => t,
            Err(e) => return web::error(StatusCode::BAD_REQUEST, "invalid_query", e),
        };
        // The caller's own id (to extend, or chosen up front), else a fresh one: an id is
        // never derived from a name another caller could give too.
        // A fresh id is given back after a failure that may have granted it; the caller's own
        // id is left as it is (a retry with it may hold the gate by now), and acquiring again
        // with it settles the state.
        let (lease_id, origin) = match lease_id_header(&request) {
            Ok(Some(id)) => (id, IdOrigin::Known),
            Ok(None) => ((ctx.new_lease_id)(), IdOrigin::Fresh),
            Err(r) => return r,
        };
        let label = query.holder.as_deref().unwrap_or("");
        let how = Acquiring::new(term, lease_id).origin(origin).label(label);
        let acquired = held::acquire(cache, &locks, &key, how, ctx.now).await;
        match acquired {
            Ok(Acquire::Acquired(a)) => {
                log(if a.extended { "extended" } else { "acquired" });
                web::json(
                    StatusCode::OK,
                    &json!({
                        "acquired": true,
                        "key": key.as_str(),
                        "leaseId": a.lease_id.to_string(),
                        "fencingToken": a.fencing_token,
                        "expiresAt": a.expires_at.map(rfc3339),
                        "since": rfc3339(a.since),
                        "extended": a.extended,
                    }),
                )
            }
            Ok(Acquire::Busy {
                retry_after,
                holder,
                ..
            }) => {
                log("busy");
                // What storage says of the holder's gate; the caller's window only when it
                // cannot tell (an infinite lease, a holder that took it a moment ago).
                busy(
                    retry_after.map_or(query.window, |d| d.as_secs().max(1)),
                    holder
                        .as_ref()
                        .map(|h| h.label.as_str())
                        .filter(|label| !label.is_empty()),
                )
            }
            Err(e) => {
                log("storage_unavailable");
                web::storage_unavailable(&e)
            }
        }
    } else if method == leasegate::Method::DELETE {
        let lease_id = match lease_id_header(&request) {
            Ok(Some(id)) => id,
            Ok(None) => {
                return web::error(
                    StatusCode::BAD_REQUEST,
                    "missing_lease_id",
                    "send the lease id to release in the Lease-Id header",
                )
            }
            Err(r) => return r,
        };
        let released = held::release(cache, &locks, &key, lease_id, ctx.now).await;
        match released {
            Ok(r) => {
                log(if r == Release::Released {
                    "released"
                } else {
                    "not_held"
                });
                Response::new(StatusCode::NO_CONTENT)
            }
            Err(e) => {
                log("storage_unavailable");
                web::storage_unavailable(&e)
            }
        }
    } else {
        match locks.inspect(&key, ctx.now).await {
            Ok(info) => {
                log("inspected");
                inspected(&key, info)
            }
            Err(e) => {
                log("storage_unavailable");
                web::storage_unavailable(&e)
            }
        }
    }
}

/// `GET /api/gate/{key}`'s answer: the gate's state as storage holds it.
fn inspected(key: &LockName, info: LockInfo) -> Response {
    let (state, expires_at, since, holder) = match info.status {
        LockStatus::Available => ("available", None, None, None),
        LockStatus::Held {
            expires_at,
            since,
            label,
            ..
        } => (
            "held",
            expires_at.map(rfc3339),
            since.map(rfc3339),
            Some(label).filter(|label| !label.is_empty()),
        ),
    };
    let body = Inspected {
        key: key.as_str(),
        state,
        expires_at,
        since,
        fencing_token: info.fencing_token,
        holder,
    };
    web::json(StatusCode::OK, &body)
}

// The Spin entry points.
/// Gate requests carry no meaningful body; anything larger than this is refused (413).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

#[cfg(target_arch = "wasm32")]
#[spin_sdk::http_component]
async fn handle_request(
    request: spin_sdk::http::IncomingRequest,
    out: spin_sdk::http::ResponseOutparam,
) {
    leasegate_spin::spin::serve(request, out, MAX_BODY_BYTES, handle).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str) -> Request {
        Request::new(leasegate::Method::GET, path)
    }

    #[test]
    fn keys_come_from_the_path() {
        assert_eq!(
            key_of(&req("/api/gate/jobs%2Fnightly")).unwrap().as_str(),
            "jobs/nightly"
        );
        assert_eq!(key_of(&req("/api/gate/a/b")).unwrap().as_str(), "a/b");
        for bad in [
            "/api/gate/",
            "/api/gate",
            "/api/gate/..",
            "/api/gate/a/../b",
            "/api/gate/%ff",
            "/api/gate/a%00b",
        ] {
            assert_eq!(key_of(&req(bad)).unwrap_err().status(), 400, "{bad}");
        }
        // A client's own `spin-path-info` never picks the key.
        let mut forged = req("/api/gate/tenant-a");
        forged
            .headers_mut()
            .append("spin-path-info", "/tenant-b".to_string());
        assert_eq!(key_of(&forged).unwrap().as_str(), "tenant-a");
        assert_eq!(key_of(&req("/api/gatex")).unwrap_err().status(), 400);
        let long = format!("/api/gate/{}", "k".repeat(300));
        assert_eq!(key_of(&req(&long)).unwrap_err().status(), 400);
    }

    /// The answers' field names and forms, and `holder` only when the holder gave a name.
    #[test]
    fn answers_name_a_holder_only_when_it_has_a_name() {
        let busy = |holder| {
            serde_json::to_value(Busy {
                acquired: false,
                key: "k",
                retry_after_seconds: 5,
                holder,
            })
            .unwrap()
        };
        assert_eq!(
            busy(None),
            json!({"acquired": false, "key": "k", "retryAfterSeconds": 5})
        );
        assert_eq!(busy(Some("node a"))["holder"], "node a");
        let available = serde_json::to_value(Inspected {
            key: "k",
            state: "available",
            expires_at: None,
            since: None,
            fencing_token: 0,
            holder: None,
        })
        .unwrap();
        assert_eq!(
            available,
            json!({"key": "k", "state": "available", "expiresAt": null, "since": null,
                   "fencingToken": 0})
        );
    }

    #[test]
    fn queries_are_strict() {
        assert_eq!(
            parse_query(None).unwrap(),
            Acquisition {
                window: 60,
                holder: None
            }
        );
        assert_eq!(
            parse_query(Some("window=90&holder=node%20a")).unwrap(),
            Acquisition {
                window: 90,
                holder: Some("node a".into())
            }
        );
        for bad in [
            "window=0",
            "window=86401",
            "window=1.5",
            "window=x",
            "window=5&window=6",
            "holder=",
            "colour=red",
        ] {
            assert!(parse_query(Some(bad)).is_err(), "{bad}");
        }
    }
}
