//! The rules of `docs/protocol.md` seen from outside, as the release `.wasm` components under
//! the real `spin up` with storage behind the fault proxy: a lost first create of a lease
//! record leaves the key free, one holder re-acquiring from many callers at once always gets
//! its gate with one token, a metadata value with inner spaces is signed as sent, and a 403
//! from storage is answered 502 `storage_forbidden`.

use std::time::SystemTime;

use leasegate::lease::Locks;
use leasegate::ops::{CreateContainer, ListBlobs, Metadata, PutBlob};
use leasegate::{Account, BlobName, ContainerName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{call, Answer, App, ADMIN_AUTH};
use leasegate_tests::proxy::Fault;
use leasegate_tests::{container_sas, unique_container, Azurite};
use serde_json::json;

const AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

fn gate(app: &App, method: &str, path_and_query: &str) -> Answer {
    call(
        method,
        &app.url(&format!("/api/gate/{path_and_query}")),
        &[AUTH],
        b"",
    )
}

/// Issue 21.3: a record lock's first create whose answer is lost (it landed, naming a fresh
/// lease id) is cleared before the 503, so the key is free right after it, not held for the
/// whole window.
#[test]
fn a_lost_first_create_of_a_long_window_leaves_the_key_free() {
    let app = App::start("lostcreate", &[]);
    // Another gate first, so that the container exists and the faulted create lands.
    assert_eq!(gate(&app, "POST", "warm-up?window=120").status, 200);
    // The lock blob's PutBlob (and anything else written to it while the fault is on: the
    // clear's answer is lost too, but it lands, as the create did).
    let blob = format!(
        "PUT /devstoreaccount1/{}/gates/report",
        app.container.as_str()
    );
    app.storage.fault_on(&blob, Fault::LoseAnswer);
    let first = gate(&app, "POST", "report?window=120");
    assert_eq!(first.status, 503, "{}", first.text);
    assert_eq!(first.json["error"], "storage_unavailable", "{}", first.text);
    app.storage.set_fault(None);
    let next = gate(&app, "POST", "report?window=120&holder=someone-else");
    assert_eq!(
        next.status, 200,
        "the key is free right after the 503: {}",
        next.text
    );
    app.assert_no_trap();
}

/// Issue 21.13: one holder re-acquiring its gate from 16 callers at once: every call holds the
/// lease (the same `Lease-Id`, the one the first POST returned), so every call answers 200
/// with the same token, for a native lease and for a lease record alike.
#[test]
fn one_holder_reacquiring_from_sixteen_callers_always_gets_its_gate() {
    let app = App::start("manycallers", &[]);
    for window in ["30", "120"] {
        let path = format!("hot-{window}?window={window}&holder=node-a");
        let first = gate(&app, "POST", &path);
        assert_eq!(first.status, 200, "{}", first.text);
        let token = first.json["fencingToken"].as_u64().unwrap();
        let lease_id = first.json["leaseId"].as_str().unwrap().to_string();
        let own = [AUTH, ("lease-id", lease_id.as_str())];
        let url = app.url(&format!("/api/gate/{path}"));
        let answers: Vec<Answer> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|_| {
                    s.spawn(|| {
                        (0..20)
                            .map(|_| call("POST", &url, &own, b""))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(answers.len(), 320);
        for a in &answers {
            assert_eq!(a.status, 200, "window {window}: {}", a.text);
            assert_eq!(a.json["fencingToken"], token, "window {window}: {}", a.text);
            assert_eq!(a.json["leaseId"], lease_id.as_str(), "{}", a.text);
            assert_eq!(a.json["extended"], true, "{}", a.text);
        }
    }
    app.assert_no_trap();
}

/// Storage reached with a container SAS: no SharedKey signature is involved, so the blobs a
/// test sets up are stored exactly as given whatever the signing code does.
fn sas_storage(container: &ContainerName) -> Locks<NativeTransport> {
    let connection = format!(
        "BlobEndpoint={};SharedAccessSignature={}",
        Azurite::shared().endpoint(),
        container_sas(container)
    );
    Locks::new(
        NativeTransport::default(),
        Account::from_connection_string(&connection).unwrap(),
        container.clone(),
    )
}

fn metadata_of(container: &ContainerName, blob: &str) -> Metadata {
    let op = ListBlobs {
        include_metadata: true,
        ..ListBlobs::new(container.clone())
    };
    let (page, _) = block_on(
        sas_storage(container)
            .client()
            .execute(&op, SystemTime::now()),
    )
    .unwrap();
    page.blobs
        .into_iter()
        .find(|b| b.name == blob)
        .unwrap_or_else(|| panic!("{blob} is listed"))
        .properties
        .metadata
}

/// Issue 21.14: a metadata value with runs of spaces inside (`v  w`, as the Azure SDK writes
/// it) is signed as sent, so the marking API can write the blob's metadata back (it answered
/// 503 "storage answered 403 AuthorizationFailure"), and the value is kept exactly.
#[test]
fn a_blob_whose_metadata_holds_two_spaces_in_a_row_can_be_marked() {
    let c = unique_container("twospaces");
    block_on(
        Locks::new(
            NativeTransport::default(),
            Azurite::shared().account(),
            c.clone(),
        )
        .client()
        .execute(
            &CreateContainer {
                container: c.clone(),
            },
            SystemTime::now(),
        ),
    )
    .unwrap();
    let metadata: Metadata = [("k".to_string(), "v  w".to_string())]
        .into_iter()
        .collect();
    block_on(
        sas_storage(&c).client().execute(
            &PutBlob::block(c.clone(), BlobName::try_new("doc").unwrap(), b"x".to_vec())
                .with_metadata(metadata),
            SystemTime::now(),
        ),
    )
    .unwrap();
    assert_eq!(metadata_of(&c, "doc").get("k").unwrap().as_str(), "v  w");
    let app = App::start(
        "twospaces",
        &[("instance_id", "twospaces"), ("ttl_containers", c.as_str())],
    );
    let marked = call(
        "PUT",
        &app.url(&format!("/api/ttl/{}/doc", c.as_str())),
        &[ADMIN_AUTH, ("content-type", "application/json")],
        json!({"ttlSeconds": 3600}).to_string().as_bytes(),
    );
    assert_eq!(marked.status, 200, "{}", marked.text);
    let after = metadata_of(&c, "doc");
    assert_eq!(after.get("k").unwrap().as_str(), "v  w", "kept exactly");
    assert!(after.contains_key("timetolive"), "{after:?}");
    app.assert_no_trap();
}

/// Issue 21.14 (and ISSUE-NOTES "Correctness #14 and Entra ID #1"): a 403 from storage is a
/// credential or signing failure, answered 502 `storage_forbidden` (not retryable: no
/// `Retry-After`), the message naming the fix; never 503 "unavailable".
#[test]
fn a_403_from_storage_is_502_storage_forbidden() {
    let app = App::start("forbidden", &[]);
    app.storage.set_fault(Some(Fault::Status(403)));
    for (method, path) in [
        ("POST", "k?window=30"),
        ("GET", "k"),
        ("POST", "k?window=120"),
    ] {
        let a = gate(&app, method, path);
        assert_eq!(a.status, 502, "{method} {path}: {}", a.text);
        assert_eq!(a.json["error"], "storage_forbidden", "{}", a.text);
        assert!(
            !a.headers.contains_key("retry-after"),
            "not retryable: {:?}",
            a.headers
        );
        let message = a.json["message"].as_str().unwrap_or("");
        assert!(
            message.contains("credential") && message.contains("signature"),
            "the message names the fix: {message}"
        );
        assert!(
            !message.contains("127.0.0.1") && !message.contains("Eby8"),
            "{message}"
        );
    }
    app.assert_no_trap();
}
