//! ttl-sweeper's errors, and the one place each becomes an answer.

use leasegate::{Response, StatusCode};
use serde_json::json;

use leasegate_spin::web;

/// Why a tick, or a read of the sweep state, came to nothing.
#[derive(Debug)]
pub(crate) enum SweepError {
    /// Storage failed or refused (its own error), or the state's lock cannot be used.
    Storage(leasegate::Error),
    /// The sweep state blob cannot be read (not the JSON this function writes).
    UnreadableState(String),
    /// Storage refused a blob index tag request (Find Blobs by Tags, Set Blob Tags, a listing
    /// with tags) with a 403: the credential lacks the tag permissions.
    TagsForbidden(leasegate::Error),
}

/// What to do when storage refuses the tag requests of `ttl_find = both` or `tags` (a 403).
pub(crate) const TAGS_FIX: &str = "storage refused a blob index tag request (ttl_find = both, \
the default, or tags): \
an identity needs the role Storage Blob Data Owner on the swept containers, or Storage Blob Data \
Contributor plus a role with the data actions \
Microsoft.Storage/storageAccounts/blobServices/containers/blobs/filter/action, \
.../blobs/tags/read and .../blobs/tags/write; a SAS needs the permissions t (tags) and f \
(filter) beside racwdl; or set ttl_find = list (docs/ttl-sweeper.md#permissions); retrying \
does not help";

impl From<leasegate::Error> for SweepError {
    fn from(e: leasegate::Error) -> Self {
        SweepError::Storage(e)
    }
}

impl SweepError {
    /// The tick answer's `error` code: `state_unusable` when an operator must act (the state
    /// blob or its lock cannot be used), else storage's.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            SweepError::Storage(
                leasegate::Error::CorruptLock(_) | leasegate::Error::UnusableLock { .. },
            )
            | SweepError::UnreadableState(_) => "state_unusable",
            SweepError::Storage(e) => web::storage_error_code(e),
            SweepError::TagsForbidden(_) => "storage_forbidden",
        }
    }

    /// The answer's status: storage's (503, or 502 for a refusal retrying does not cure), else
    /// 503.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            SweepError::Storage(e) => web::storage_status(e),
            SweepError::UnreadableState(_) => StatusCode::SERVICE_UNAVAILABLE,
            SweepError::TagsForbidden(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// The answer's message: what happened, then `consequence` (what was not done).
    pub(crate) fn message(&self, consequence: &str) -> String {
        match self {
            SweepError::Storage(e) => web::storage_failed(e, consequence),
            SweepError::UnreadableState(what) => format!("{what}; {consequence}"),
            SweepError::TagsForbidden(e) => format!("{TAGS_FIX}; {consequence}: {e}"),
        }
    }

    /// The whole answer of a request that only read the state (`GET /api/sweeper`).
    pub(crate) fn answer(&self) -> Response {
        match self {
            SweepError::Storage(e) => web::storage_unavailable(e),
            SweepError::TagsForbidden(e) => tags_forbidden(e, "nothing was done"),
            SweepError::UnreadableState(_) => {
                // `lock_unusable` here, `state_unusable` in a tick's answer: as each answered
                // before this function had an error of its own (codes are an interface).
                let body = json!({
                    "error": "lock_unusable",
                    "message": self.message("nothing was done"),
                });
                let mut r = web::json(self.status(), &body);
                r.headers_mut().insert("retry-after", "1");
                r
            }
        }
    }
}

/// The answer to a 403 on a tag request: 502 `storage_forbidden` naming the tag permissions
/// (storage's status and code beside it), never a secret.
pub(crate) fn tags_forbidden(e: &leasegate::Error, consequence: &str) -> Response {
    let (status, code) = match e {
        leasegate::Error::Storage(s) => (Some(s.status.as_u16()), s.code.clone()),
        _ => (None, None),
    };
    web::json(
        StatusCode::BAD_GATEWAY,
        &json!({
            "error": "storage_forbidden",
            "message": format!("{TAGS_FIX}; {consequence}: {e}"),
            "storageStatus": status,
            "storageErrorCode": code,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_becomes_its_answer() {
        let unreadable = SweepError::UnreadableState(
            "the sweep state sweeper/state.json is not a sweep state (delete it to start over)"
                .into(),
        );
        assert_eq!(unreadable.code(), "state_unusable");
        assert_eq!(unreadable.status(), StatusCode::SERVICE_UNAVAILABLE);
        let m = unreadable.message("the sweep state could not be used");
        assert!(m.starts_with("the sweep state sweeper/state.json is not a sweep state"));
        assert!(
            !m.contains("corrupt lock") && !m.contains("lease storage failed"),
            "{m}"
        );
        let r = unreadable.answer();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers().get("retry-after"), Some("1"));
        // A lock blob that cannot be used, and storage's own errors, answer as before.
        let lock = SweepError::from(leasegate::Error::CorruptLock("x".into()));
        assert_eq!(lock.code(), "state_unusable");
        let busy = SweepError::from(leasegate::Error::InvalidArgument("x".into()));
        assert_eq!(busy.code(), "storage_unavailable");
        // A 403 on a tag request: 502 storage_forbidden naming the tag permissions.
        let tags = SweepError::TagsForbidden(leasegate::Error::InvalidArgument("403".into()));
        assert_eq!(tags.code(), "storage_forbidden");
        assert_eq!(tags.status(), StatusCode::BAD_GATEWAY);
        let m = tags.message("the sweep state could not be used");
        for fix in [
            "Storage Blob Data Owner",
            "filter/action",
            "tags/write",
            "t (tags) and f",
            "ttl_find = list",
        ] {
            assert!(m.contains(fix), "{fix}: {m}");
        }
        assert_eq!(tags.answer().status(), StatusCode::BAD_GATEWAY);
    }
}
