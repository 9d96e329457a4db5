//! "Also" of issue 21: Copy Blob's answer.

use leasegate::ops::{CopyBlob, CopyOutcome, CopyStatus};
use leasegate::{BlobName, ContainerName};

use crate::script::*;

/// "Also" of issue 21: a Copy Blob answer without `x-ms-copy-status` is pending (poll the
/// destination), never taken for success.
#[test]
fn a_copy_answer_without_a_status_is_pending() {
    let t = Scripted::new(vec![reply(
        answer(202)
            .with_header("etag", "\"e\"")
            .with_header("x-ms-copy-id", "c0py"),
    )]);
    let copy = CopyBlob::new(
        ContainerName::try_new("src").unwrap(),
        BlobName::try_new("a").unwrap(),
        ContainerName::try_new("dead").unwrap(),
        BlobName::try_new("a").unwrap(),
    );
    let (outcome, _) = pollster::block_on(locks(&t).client().execute(&copy, server_now())).unwrap();
    match outcome {
        CopyOutcome::Started {
            status, copy_id, ..
        } => {
            assert_eq!(status, CopyStatus::Pending);
            assert_eq!(copy_id.as_deref(), Some("c0py"));
        }
        other => panic!("started: {other:?}"),
    }
}
