//! `POST /api/ledger/{book}/post` with `{"entries": N, "pauseMs": P}`: holds the book's lock
//! (the lock blob `books/{book}`, `ledger_window_seconds`, 15 by default), appends N entities to the table `ledger_table`
//! (PartitionKey the book, each with the holder's `fencingToken`), pausing P ms before each
//! (the work of a slow batch job), then writes the blob `ledger/{book}.json` holding the
//! token. **Every write is fenced**: a holder that was paused past its lease, whose book a
//! newer holder took and wrote, is refused by storage itself, and writes nothing more.
//!
//! Answers: 200 `{"book", "written", "fencingToken"}`; 409 `{"error": "fenced_out",
//! "written": k, "fencingToken": t}` when storage refused a write (`k` entries of this call
//! are known to have landed before it; one more may have, if its answer was lost just before
//! another holder took the book); 409 `blob_not_fenced` when `ledger/{book}.json` exists
//! without this lock's fence (nothing written); 429 with `Retry-After` while another call
//! holds the book; 400 for a bad book or body; 503 with `Retry-After` when storage fails
//! (`written` says how far the call got).
//!
//! Every resource is claimed before the first entry: the blob is written (`"state":
//! "posting"`) and the partition's fence advanced, then the entries, then the blob again
//! (`"posted"`). Each blob and partition keeps its own fence; claiming both first means a
//! newer holder's claims fence an older one out of both.
//!
//! The lease is not checked again between entries, as a slow batch job does not check it:
//! the fence is what stops a holder whose lease ran out (docs/protocol.md, "Fenced writes").

use std::time::Duration;

use leasegate::lease::{Acquire, Acquiring, IdOrigin, Locks, Start, Term};
use leasegate::ops::PutBlob;
use leasegate::table::{
    Batch, BatchOperation, CreateTable, EdmValue, Entity, TableClient, TableName, TableRefusal,
};
use leasegate::{BlobName, ErrorClass, LockName, Method, Request, Response, StatusCode, Transport};
use leasegate_spin::fence::{self, BatchFenced, Fence, Fenced, TableFence, FENCING_TOKEN};
use leasegate_spin::{auth, config, web, Context};
use serde::Deserialize;
use serde_json::json;

/// Post requests carry a small JSON body; anything larger is refused (413).
pub const MAX_BODY_BYTES: usize = 4 * 1024;

/// The most entries one post appends.
pub const MAX_ENTRIES: u32 = 1000;

/// The longest pause before an entry, in milliseconds.
pub const MAX_PAUSE_MS: u64 = 60_000;

/// A post's body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Post {
    entries: u32,
    #[serde(default)]
    pause_ms: u64,
}

/// The settings a post reads.
struct Settings {
    storage: config::Storage,
    tables: leasegate::Account,
    table: TableName,
    window: Duration,
    instance: String,
}

fn settings(vars: &dyn config::Variables) -> Result<Settings, config::ConfigError> {
    let storage = config::storage(vars)?;
    let tables = config::table_account(vars, &storage)?;
    let name = config::var(vars, "ledger_table").unwrap_or_else(|| "ledger".into());
    let table = TableName::try_new(&name)
        .map_err(|e| config::ConfigError(format!("variable ledger_table: {e}")))?;
    let window = config::number(vars, "ledger_window_seconds", 15.0, 15..=3600)?;
    if window.fract() != 0.0 {
        return Err(config::ConfigError(
            "variable ledger_window_seconds must be a whole number".into(),
        ));
    }
    let instance = config::var(vars, "instance_id").unwrap_or_default();
    Ok(Settings {
        storage,
        tables,
        table,
        window: Duration::from_secs(window as u64),
        instance,
    })
}

/// Handles `POST /api/ledger/{book}/post`.
pub async fn handle<T: Transport>(ctx: &Context<'_, T>, request: Request) -> Response {
    if let Err(refused) = auth::authenticate(ctx.variables, "ledger_token", "ledger_auth", &request)
    {
        return refused;
    }
    if *request.method() != Method::POST {
        return web::method_not_allowed("POST");
    }
    let book = match book_in_path(request.path()) {
        Ok(book) => book,
        Err(answer) => return answer,
    };
    let post = match read_post(&request) {
        Ok(post) => post,
        Err(answer) => return answer,
    };
    let settings = match settings(ctx.variables) {
        Ok(s) => s,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    let transport = (ctx.connect)(settings.storage.timeout);
    let locks = settings.storage.locks(&transport, "books/");
    let tables = match TableClient::try_new(&transport, settings.tables.clone()) {
        Ok(t) => t,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    let term = match Term::for_window(settings.window) {
        Ok(term) => term,
        Err(e) => return web::error(StatusCode::SERVICE_UNAVAILABLE, "not_configured", e),
    };
    // A fresh lease id per post: each post is a holder of its own.
    let id = (ctx.new_lease_id)();
    let how = Acquiring::new(term, id)
        .origin(IdOrigin::Fresh)
        .label(&settings.instance);
    let acquired = locks.acquire(&book, how, ctx.now).await;
    let held = match acquired {
        Ok(Acquire::Acquired(held)) => held,
        Ok(Acquire::Busy { retry_after, .. }) => {
            let secs = retry_after.unwrap_or(settings.window).as_secs().max(1);
            let mut answer = web::json(
                StatusCode::TOO_MANY_REQUESTS,
                &json!({
                    "error": "busy",
                    "message": "another post holds the book; ask again after Retry-After seconds",
                    "book": book.as_str(),
                    "retryAfterSeconds": secs,
                }),
            );
            answer.headers_mut().insert("retry-after", secs.to_string());
            return answer;
        }
        Err(e) => return web::storage_unavailable(&e),
    };
    // Every grant carries a token; without one nothing could fence this holder: fail closed.
    let Some(token) = held.fencing_token else {
        let _ = locks
            .release(&book, held.lease_id, Start::Acquired(&held), ctx.now)
            .await;
        return web::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
            "the lock was granted without a fencing token; nothing was written",
        );
    };
    let fence = fence::fence(&locks, &book, token);
    let work = Work {
        ctx,
        tables: &tables,
        locks: &locks,
        table: &settings.table,
        book: &book,
        instance: &settings.instance,
    };
    let answer = work.post(&fence, &post).await;
    // Given back so that the next post need not wait out the window (best effort: the lease
    // runs out by itself). A holder that was fenced out holds nothing any more.
    let _ = (locks.release(&book, held.lease_id, Start::Acquired(&held), ctx.now)).await;
    answer
}

/// One post's writes, all fenced by the holder's token.
struct Work<'a, C, T> {
    ctx: &'a Context<'a, C>,
    tables: &'a TableClient<&'a T>,
    locks: &'a Locks<&'a T>,
    table: &'a TableName,
    book: &'a LockName,
    instance: &'a str,
}

impl<C, T: Transport> Work<'_, C, T> {
    async fn post(&self, fence: &Fence, post: &Post) -> Response {
        let token = fence.token();
        // Every resource is claimed before the first entry (the blob written "posting", the
        // partition's fence advanced): a newer holder's claims then fence this one out of both.
        let mut table_fence = TableFence::new(fence.clone());
        if let Err(answer) = self.write_blob(fence, 0, "posting").await {
            return answer;
        }
        if let Err(answer) = self.claim(&mut table_fence).await {
            return answer;
        }
        let mut written = 0u32;
        let mut retried = false;
        while written < post.entries {
            if post.pause_ms > 0 && !retried {
                (self.ctx.sleep)(Duration::from_millis(post.pause_ms)).await;
            }
            let batch = match self.entry(token, written) {
                Ok(batch) => batch,
                Err(e) => return failed(&e, written, token),
            };
            match fence::table_batch(self.ctx, self.tables, &mut table_fence, &batch).await {
                Ok(Fenced::Written(BatchFenced::Committed(_))) => {
                    written += 1;
                    retried = false;
                }
                Ok(Fenced::FencedOut { .. }) => return fenced_out(written, token),
                // Asked again after a lost answer, and refused by the entry itself: the first
                // try landed (its RowKey is this holder's own).
                Ok(Fenced::Written(BatchFenced::Refused {
                    refusal: TableRefusal::AlreadyExists,
                    ..
                })) if retried => {
                    written += 1;
                    retried = false;
                }
                Ok(Fenced::Written(BatchFenced::Refused { refusal, .. })) => {
                    let e = format!("the table refused entry {written} ({refusal:?})");
                    return answer_error(StatusCode::SERVICE_UNAVAILABLE, &e, written, token);
                }
                // An answer lost (a connection that went stale while the holder was paused, a
                // 5xx): asked once more, which the fence makes safe.
                Err(e) if e.outcome_unknown() && !retried => retried = true,
                Err(e) => return failed(&e, written, token),
            }
        }
        if let Err(answer) = self.write_blob(fence, written, "posted").await {
            return answer;
        }
        web::json(
            StatusCode::OK,
            &json!({ "book": self.book.as_str(), "written": written, FENCING_TOKEN: token }),
        )
    }

    /// The partition's fence advanced to this holder's token, the table created on a first
    /// post; a lost answer is asked once more.
    async fn claim(&self, table_fence: &mut TableFence) -> Result<(), Response> {
        let token = table_fence.fence().token();
        let (mut created, mut retried) = (false, false);
        loop {
            let claimed = fence::claim_partition(
                self.ctx,
                self.tables,
                table_fence,
                self.table,
                self.book.as_str(),
            )
            .await;
            match claimed {
                Ok(Fenced::Written(())) => return Ok(()),
                Ok(Fenced::FencedOut { .. }) => return Err(fenced_out(0, token)),
                Err(e) if e.class() == Some(ErrorClass::TableMissing) && !created => {
                    created = true;
                    let create = CreateTable {
                        table: self.table.clone(),
                    };
                    if let Err(e) = self.tables.execute(&create, self.ctx.now).await {
                        return Err(failed(&e, 0, token));
                    }
                }
                Err(e) if e.outcome_unknown() && !retried => retried = true,
                Err(e) => return Err(failed(&e, 0, token)),
            }
        }
    }

    /// The blob `ledger/{book}.json`, fenced: `{"book", "fencingToken", "entries", "state",
    /// "instance", "writtenAt"}`; a lost answer is asked once more (a put of the same token
    /// writes the same).
    async fn write_blob(&self, fence: &Fence, written: u32, state: &str) -> Result<(), Response> {
        let token = fence.token();
        let blob = BlobName::try_new(&format!("ledger/{}.json", self.book.as_str()))
            .map_err(|e| failed(&e, written, token))?;
        let body = json!({
            "book": self.book.as_str(),
            FENCING_TOKEN: token,
            "entries": written,
            "state": state,
            "instance": self.instance,
            "writtenAt": web::rfc3339(self.ctx.now),
        });
        let put = PutBlob::block(self.locks.container().clone(), blob, web::to_json(&body))
            .with_content_type("application/json");
        let blobs = self.locks.client();
        let mut outcome = fence::write_blob(self.ctx, blobs, fence, put.clone()).await;
        if outcome.as_ref().is_err_and(|e| e.outcome_unknown()) {
            outcome = fence::write_blob(self.ctx, blobs, fence, put).await;
        }
        match outcome {
            Ok(Fenced::Written(_)) => Ok(()),
            Ok(Fenced::FencedOut { .. }) => Err(fenced_out(written, token)),
            // The blob is there unfenced, or fenced by another lock: a state to fix, not to
            // retry (nothing of this post was written before it).
            Err(leasegate::Error::InvalidArgument(m)) => Err(web::json(
                StatusCode::CONFLICT,
                &json!({
                    "error": "blob_not_fenced",
                    "message": m,
                    "written": written,
                    FENCING_TOKEN: token,
                }),
            )),
            Err(e) => Err(failed(&e, written, token)),
        }
    }

    /// Entry `n` of the holder with `token`: its RowKey sorts by token, then by entry.
    fn entry(&self, token: u64, n: u32) -> Result<Batch, leasegate::Error> {
        let row = format!("{}-{n:06}", leasegate::fence::fence_value(token));
        let entity = Entity::new(self.book.as_str(), row)
            .with(
                FENCING_TOKEN,
                EdmValue::Int64(i64::try_from(token).unwrap_or(i64::MAX)),
            )
            .with("entry", EdmValue::Int32(n as i32))
            .with("instance", self.instance);
        Batch::new(self.table.clone(), self.book.as_str())?.with(BatchOperation::Insert(entity))
    }
}

/// 409 `fenced_out`: a newer holder of the book wrote; this call writes nothing more.
fn fenced_out(written: u32, token: u64) -> Response {
    web::json(
        StatusCode::CONFLICT,
        &json!({
            "error": "fenced_out",
            "message": "a newer holder of the book wrote; storage refused this post's write",
            "written": written,
            FENCING_TOKEN: token,
        }),
    )
}

fn failed(e: &leasegate::Error, written: u32, token: u64) -> Response {
    let message = web::storage_failed(e, "the post stopped there");
    answer_error(web::storage_status(e), &message, written, token)
}

fn answer_error(status: StatusCode, message: &str, written: u32, token: u64) -> Response {
    let code = if status == StatusCode::SERVICE_UNAVAILABLE {
        "storage_unavailable"
    } else {
        "storage_failed"
    };
    let mut answer = web::json(
        status,
        &json!({ "error": code, "message": message, "written": written, FENCING_TOKEN: token }),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        answer.headers_mut().insert("retry-after", "1".to_string());
    }
    answer
}

/// The book of `/api/ledger/{book}/post`: 1 to 63 letters, digits, `-` or `_` (a table's
/// PartitionKey, a lock's name and a blob's name all take it as it is). 404 for another
/// route, 400 `invalid_book` for a bad name.
fn book_in_path(path: &str) -> Result<LockName, Response> {
    let Some(book) = path
        .strip_prefix("/api/ledger/")
        .and_then(|rest| rest.strip_suffix("/post"))
    else {
        return Err(web::error(
            StatusCode::NOT_FOUND,
            "not_found",
            "the route is POST /api/ledger/{book}/post",
        ));
    };
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if book.is_empty() || book.len() > 63 || !book.chars().all(ok) {
        return Err(web::error(
            StatusCode::BAD_REQUEST,
            "invalid_book",
            "a book is 1 to 63 letters, digits, '-' or '_'",
        ));
    }
    LockName::try_new(book).map_err(|e| web::error(StatusCode::BAD_REQUEST, "invalid_book", e))
}

/// The body: `{"entries": 1..=1000, "pauseMs": 0..=60000}`; 400 `invalid_body` naming what
/// is wrong, 415 for another content type.
fn read_post(request: &Request) -> Result<Post, Response> {
    web::require_json(request)?;
    let bad = |m: String| web::error(StatusCode::BAD_REQUEST, "invalid_body", m);
    let post: Post = serde_json::from_slice(request.body()).map_err(|e| {
        bad(format!(
            "the body is {{\"entries\": N, \"pauseMs\": P}}: {}",
            e.to_string().split(" at line").next().unwrap_or_default()
        ))
    })?;
    if !(1..=MAX_ENTRIES).contains(&post.entries) {
        return Err(bad(format!("entries must be from 1 to {MAX_ENTRIES}")));
    }
    if post.pause_ms > MAX_PAUSE_MS {
        return Err(bad(format!("pauseMs must be from 0 to {MAX_PAUSE_MS}")));
    }
    Ok(post)
}

// The Spin entry point.
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

    fn post(body: &str) -> Request {
        Request::new(Method::POST, "/api/ledger/acme/post")
            .with_header("content-type", "application/json")
            .with_body(body.as_bytes().to_vec())
    }

    #[test]
    fn books_and_bodies_are_checked_with_clear_errors() {
        assert!(book_in_path("/api/ledger/acme-2026_q4/post").is_ok());
        assert_eq!(
            book_in_path("/api/ledger/a/b/post").unwrap_err().status(),
            400
        );
        assert_eq!(book_in_path("/api/ledger//post").unwrap_err().status(), 400);
        assert_eq!(book_in_path("/api/ledger/acme").unwrap_err().status(), 404);
        let ok = read_post(&post(r#"{"entries": 3, "pauseMs": 10}"#)).unwrap();
        assert_eq!((ok.entries, ok.pause_ms), (3, 10));
        for body in [
            r#"{"entries": 0}"#,
            r#"{"entries": 1001}"#,
            r#"{"entries": 2, "pauseMs": 60001}"#,
            r#"{"entries": 2, "pause": 5}"#,
            r#"{"entries": -1}"#,
            "[]",
            "",
        ] {
            let answer = read_post(&post(body)).unwrap_err();
            assert_eq!(answer.status(), 400, "{body}");
            let text = String::from_utf8_lossy(answer.body()).to_string();
            assert!(text.contains("invalid_body"), "{body}: {text}");
        }
    }
}
