//! scheduled-job's errors, and the one place each becomes an answer.

use leasegate::{Response, StatusCode};
use serde_json::json;

use leasegate_spin::web;

/// Why a tick, or a read of the reservation log, came to nothing.
#[derive(Debug)]
pub enum JobError {
    /// Storage failed or refused (its own error: the status and code storage answered, a token
    /// that could not be had, a name storage would refuse).
    Storage(leasegate::Error),
    /// A record (the reservation, the log) kept changing under other writers: gave up after a
    /// few tries.
    Contended(String),
    /// The reservation log cannot be read (not the JSON this job writes).
    UnreadableLog(String),
    /// Storage was so slow before the job's call that the run could outlive the job's lease:
    /// the job was not called.
    Slow(String),
}

impl From<leasegate::Error> for JobError {
    fn from(e: leasegate::Error) -> Self {
        JobError::Storage(e)
    }
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Storage(e) => write!(f, "{e}"),
            JobError::Contended(what) | JobError::UnreadableLog(what) | JobError::Slow(what) => {
                f.write_str(what)
            }
        }
    }
}

impl std::error::Error for JobError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JobError::Storage(e) => Some(e),
            _ => None,
        }
    }
}

impl JobError {
    /// The answer's `error` code: storage's (`storage_unavailable`, `storage_forbidden`,
    /// `token_unavailable`, ...), `storage_unavailable` for contention, `lock_unusable` for an
    /// unreadable log (an operator acts).
    pub fn code(&self) -> &'static str {
        match self {
            JobError::Storage(e) => web::storage_error_code(e),
            JobError::Contended(_) | JobError::Slow(_) => "storage_unavailable",
            JobError::UnreadableLog(_) => "lock_unusable",
        }
    }

    /// The answer's status: storage's (503, or 502 for a refusal retrying does not cure), else
    /// 503.
    pub fn status(&self) -> StatusCode {
        match self {
            JobError::Storage(e) => web::storage_status(e),
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The answer's message: what happened, then `consequence` (what was not done).
    pub fn message(&self, consequence: &str) -> String {
        match self {
            JobError::Storage(e) => web::storage_failed(e, consequence),
            JobError::Contended(what) | JobError::Slow(what) => {
                format!("{what}; {consequence}; retry")
            }
            JobError::UnreadableLog(what) => format!(
                "{what}; {consequence}: an operator can delete the log blob (the reservations, \
                 not the log, record what ran)"
            ),
        }
    }

    /// The whole answer of a request that read storage and did nothing else (`GET`).
    pub fn answer(&self) -> Response {
        match self {
            JobError::Storage(e) => web::storage_unavailable(e),
            other => {
                let body = json!({
                    "error": other.code(),
                    "message": other.message("nothing was done"),
                });
                let mut r = web::json(other.status(), &body);
                r.headers_mut().insert("retry-after", "1");
                r
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_becomes_its_answer() {
        let contended = JobError::Contended("the reservation log of job j kept changing".into());
        assert_eq!(
            (contended.code(), contended.status()),
            ("storage_unavailable", StatusCode::SERVICE_UNAVAILABLE)
        );
        let m = contended.message("the job did not run");
        assert_eq!(
            m,
            "the reservation log of job j kept changing; the job did not run; retry"
        );
        let unreadable = JobError::UnreadableLog("the reservation log of job j is not JSON".into());
        assert_eq!(unreadable.code(), "lock_unusable");
        let r = unreadable.answer();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers().get("retry-after"), Some("1"));
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["error"], "lock_unusable");
        assert!(body["message"]
            .as_str()
            .unwrap()
            .contains("an operator can delete the log blob"));
        // Storage's own errors answer as every function answers them.
        let storage = JobError::from(leasegate::Error::InvalidArgument("x".into()));
        assert_eq!(storage.code(), "storage_unavailable");
        for e in [&contended, &unreadable] {
            assert!(!e.message("x").contains("invalid argument"), "{e}");
        }
    }
}
