//! The in-memory transport, driven by the core's own requests: what a caller writes lands in
//! the storage model, dated by the test's clock; routed hosts answer; callers joined on one
//! thread take turns when asked to.

use std::time::{Duration, SystemTime};

use leasegate::ops::{PutBlob, WriteOutcome};
use leasegate::{
    Account, BlobClient, BlobName, ContainerName, Method, Request, Transport, TransportErrorKind,
};
use leasegate_test_support::memory::{together, Memory, CONNECTION_STRING};
use leasegate_test_support::wire::WireResponse;

const START: u64 = 1_795_096_800;

fn client(memory: &Memory) -> BlobClient<Memory> {
    BlobClient::new(
        memory.clone(),
        Account::from_connection_string(CONNECTION_STRING).unwrap(),
        ContainerName::try_new("data").unwrap(),
    )
}

fn put(name: &str, body: &str) -> PutBlob {
    PutBlob::block(
        ContainerName::try_new("data").unwrap(),
        BlobName::try_new(name).unwrap(),
        body.as_bytes().to_vec(),
    )
}

#[test]
fn a_write_lands_in_storage_dated_by_the_clock() {
    let memory = Memory::new(START);
    memory.storage_mut().create_container("data");
    memory.advance(Duration::from_millis(2_500));
    let blobs = client(&memory);
    let (outcome, date) =
        pollster::block_on(blobs.execute(&put("a.json", "{}"), SystemTime::UNIX_EPOCH)).unwrap();
    assert!(matches!(outcome, WriteOutcome::Written(_)), "{outcome:?}");
    assert_eq!(
        date,
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(START + 2))
    );
    let storage = memory.storage();
    let blob = storage.blob("data", "a.json").expect("written");
    assert_eq!(
        (blob.body.as_slice(), blob.last_modified),
        (&b"{}"[..], START + 2)
    );
    assert_eq!(memory.storage_requests(), 1);
    // Dated when sent, by the transport's clock, not by the `now` the caller passed.
    let sent = memory.sent();
    assert_eq!(
        sent[0].header("x-ms-date"),
        Some(
            httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(START + 2))
                .as_str()
        )
    );
}

#[test]
fn a_routed_host_answers_and_another_host_refuses_the_connection() {
    let memory = Memory::new(START);
    memory.route("hooks.test", |r| {
        WireResponse::new(if r.path() == "/ok" { 200 } else { 500 })
    });
    let send = |uri: &str| pollster::block_on(memory.send(Request::new(Method::POST, uri)));
    assert_eq!(send("http://hooks.test/ok").unwrap().status().as_u16(), 200);
    assert_eq!(send("http://hooks.test/no").unwrap().status().as_u16(), 500);
    let refused = send("http://elsewhere.test/ok").unwrap_err();
    assert_eq!(refused.kind, TransportErrorKind::Connect);
    assert_eq!((memory.sent().len(), memory.storage_requests()), (3, 0));
}

/// Two callers joined on one thread: each runs to its end unless the transport takes turns,
/// and then their requests alternate.
#[test]
fn joined_callers_take_turns_request_by_request_when_asked() {
    for turns in [false, true] {
        let memory = Memory::new(START);
        memory.storage_mut().create_container("data");
        memory.take_turns(turns);
        let caller = |who: &'static str| {
            let blobs = client(&memory);
            async move {
                for k in 0..2 {
                    blobs
                        .execute(&put(&format!("{who}/{k}"), who), SystemTime::UNIX_EPOCH)
                        .await
                        .unwrap();
                }
            }
        };
        together(caller("a"), caller("b"));
        let order: Vec<String> = memory
            .sent()
            .iter()
            .map(|r| {
                r.path()
                    .trim_start_matches("/devstoreaccount1/data/")
                    .to_string()
            })
            .collect();
        let want = if turns {
            ["a/0", "b/0", "a/1", "b/1"]
        } else {
            ["a/0", "a/1", "b/0", "b/1"]
        };
        assert_eq!(order, want, "turns {turns}");
    }
}
