//! Every Blob operation of the core, against a real Azurite: each request is built and signed by
//! `leasegate::ops`, sent by the native transport, and its outcome read back from storage.

use std::time::{Duration, SystemTime};

use leasegate::ops::{
    build, BlobKind, Condition, ContainerCreated, CopyBlob, CopyOutcome, CopyStatus,
    CreateContainer, DeleteBlob, DeleteOutcome, GetBlob, GetProperties, IncrementSequenceNumber,
    Lease, LeaseAction, LeaseOutcome, ListBlobs, Metadata, Operation, PutBlob, Refusal,
    SetMetadata, WriteOutcome,
};
use leasegate::signing::{SasPermissions, SasResource, ServiceSas};
use leasegate::{
    Account, AccountKey, BlobEndpoint, BlobName, ContainerName, Credential, ErrorClass,
    LeaseDuration, LeaseId, LeaseState,
};
use leasegate_cli::NativeTransport;
use leasegate_tests::{unique_container, Azurite};

fn exec<O: Operation>(account: &Account, op: &O) -> Result<O::Output, leasegate::Error> {
    let request = build(op, account, SystemTime::now())?;
    let response = NativeTransport::default().send_blocking(request)?;
    op.parse(&response)
}

fn blob(name: &str) -> BlobName {
    BlobName::try_new(name).unwrap()
}

fn id() -> LeaseId {
    LeaseId::from_random_bytes(*uuid::Uuid::new_v4().as_bytes())
}

fn new_container(account: &Account, tag: &str) -> ContainerName {
    let c = unique_container(tag);
    let created = exec(
        account,
        &CreateContainer {
            container: c.clone(),
        },
    )
    .unwrap();
    assert_eq!(created, ContainerCreated::Created);
    c
}

fn written(outcome: WriteOutcome) -> leasegate::ops::Written {
    match outcome {
        WriteOutcome::Written(w) => w,
        other => panic!("expected a write, got {other:?}"),
    }
}

/// Takes an infinite lease on `b` with `holder`'s id, checking storage granted that id.
fn take_infinite_lease(account: &Account, c: &ContainerName, b: &BlobName, holder: LeaseId) {
    let outcome = exec(
        account,
        &Lease::new(
            c.clone(),
            b.clone(),
            LeaseAction::Acquire {
                duration: LeaseDuration::Infinite,
                proposed: holder,
            },
        ),
    )
    .unwrap();
    assert!(matches!(outcome, LeaseOutcome::Held { lease_id, .. } if lease_id == holder));
}

fn props(account: &Account, c: &ContainerName, b: &BlobName) -> leasegate::ops::BlobProperties {
    exec(
        account,
        &GetProperties {
            container: c.clone(),
            blob: b.clone(),
        },
    )
    .unwrap()
    .expect("blob exists")
}

#[test]
fn create_container_twice_is_not_an_error() {
    let account = Azurite::shared().account();
    let c = new_container(&account, "twice");
    assert_eq!(
        exec(&account, &CreateContainer { container: c }).unwrap(),
        ContainerCreated::AlreadyExists
    );
}

#[test]
fn put_if_absent_then_compare_and_swap() {
    let account = Azurite::shared().account();
    let c = new_container(&account, "put");
    let b = blob("dir/hello world.txt");
    let put = PutBlob::block(c.clone(), b.clone(), b"one".to_vec())
        .with_content_type("text/plain")
        .with_condition(Condition::IfNotExists);
    let first = written(exec(&account, &put).unwrap());
    let etag1 = first.etag.expect("an etag");
    assert!(first.server_date.is_some());
    assert_eq!(
        exec(&account, &put).unwrap(),
        WriteOutcome::Refused(Refusal::AlreadyExists)
    );

    // Compare-and-swap: the right ETag writes, a stale one is refused and changes nothing.
    let swap = PutBlob::block(c.clone(), b.clone(), b"two".to_vec())
        .with_condition(Condition::IfMatch(etag1.clone()));
    let etag2 = written(exec(&account, &swap).unwrap()).etag.unwrap();
    assert_ne!(etag1, etag2);
    let stale = PutBlob::block(c.clone(), b.clone(), b"three".to_vec())
        .with_condition(Condition::IfMatch(etag1));
    assert_eq!(
        exec(&account, &stale).unwrap(),
        WriteOutcome::Refused(Refusal::ConditionFailed)
    );

    let got = exec(
        &account,
        &GetBlob {
            container: c.clone(),
            blob: b.clone(),
        },
    )
    .unwrap()
    .unwrap();
    assert_eq!(got.body, b"two");
    assert_eq!(got.properties.etag, Some(etag2));
    assert_eq!(got.properties.blob_type.as_deref(), Some("BlockBlob"));
}

#[test]
fn get_of_missing_blob_or_container_is_none() {
    let account = Azurite::shared().account();
    let c = new_container(&account, "missing");
    let b = blob("nope");
    assert!(exec(
        &account,
        &GetBlob {
            container: c.clone(),
            blob: b.clone()
        }
    )
    .unwrap()
    .is_none());
    assert!(exec(
        &account,
        &GetProperties {
            container: c,
            blob: b.clone()
        }
    )
    .unwrap()
    .is_none());
    let gone = unique_container("never-made");
    assert!(exec(
        &account,
        &GetBlob {
            container: gone,
            blob: b
        }
    )
    .unwrap()
    .is_none());
}

#[test]
fn put_into_missing_container_is_classified() {
    let account = Azurite::shared().account();
    let put = PutBlob::block(unique_container("nocontainer"), blob("b"), b"x".to_vec());
    let err = exec(&account, &put).unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::ContainerMissing), "{err}");
}

#[test]
fn metadata_under_lease_and_etag() {
    let account = Azurite::shared().account();
    let c = new_container(&account, "meta");
    let b = blob("m");
    exec(&account, &PutBlob::block(c.clone(), b.clone(), Vec::new())).unwrap();
    let holder = id();
    take_infinite_lease(&account, &c, &b, holder);

    let mut metadata = Metadata::new();
    metadata.insert("owner".into(), "node-a".into());
    let set = |lease_id, condition| SetMetadata {
        container: c.clone(),
        blob: b.clone(),
        metadata: metadata.clone(),
        lease_id,
        condition,
    };
    // Leased: no id is refused as held, another id as lost; the holder's id writes.
    assert_eq!(
        exec(&account, &set(None, Condition::None)).unwrap(),
        WriteOutcome::Refused(Refusal::LeaseHeld)
    );
    assert_eq!(
        exec(&account, &set(Some(id()), Condition::None)).unwrap(),
        WriteOutcome::Refused(Refusal::LeaseLost)
    );
    let etag = props(&account, &c, &b).etag.unwrap();
    let w = written(
        exec(
            &account,
            &set(Some(holder), Condition::IfMatch(etag.clone())),
        )
        .unwrap(),
    );
    assert_eq!(
        exec(&account, &set(Some(holder), Condition::IfMatch(etag))).unwrap(),
        WriteOutcome::Refused(Refusal::ConditionFailed)
    );
    let p = props(&account, &c, &b);
    assert_eq!(p.metadata.get("owner").map(String::as_str), Some("node-a"));
    assert_eq!(p.etag, w.etag);
    assert_eq!(p.lease_state, Some(LeaseState::Leased));
}

#[test]
fn lease_actions_through_their_states() {
    let account = Azurite::shared().account();
    let c = new_container(&account, "lease");
    let b = blob("l");
    exec(&account, &PutBlob::block(c.clone(), b.clone(), Vec::new())).unwrap();
    let lease = |action| Lease::new(c.clone(), b.clone(), action);
    let (a, other, changed) = (id(), id(), id());
    let fifteen = LeaseDuration::try_from_secs(15).unwrap();

    let acquire = |who| LeaseAction::Acquire {
        duration: fifteen,
        proposed: who,
    };
    assert!(matches!(
        exec(&account, &lease(acquire(a))).unwrap(),
        LeaseOutcome::Held { .. }
    ));
    // Acquire by the holder again: extends. By another: held by other.
    assert!(matches!(
        exec(&account, &lease(acquire(a))).unwrap(),
        LeaseOutcome::Held { .. }
    ));
    assert_eq!(
        exec(&account, &lease(acquire(other))).unwrap(),
        LeaseOutcome::HeldByOther
    );
    assert!(matches!(
        exec(&account, &lease(LeaseAction::Renew(a))).unwrap(),
        LeaseOutcome::Held { lease_id, .. } if lease_id == a
    ));
    assert_eq!(
        exec(&account, &lease(LeaseAction::Renew(other))).unwrap(),
        LeaseOutcome::NotHeld
    );
    assert!(matches!(
        exec(&account, &lease(LeaseAction::Change { current: a, proposed: changed })).unwrap(),
        LeaseOutcome::Held { lease_id, .. } if lease_id == changed
    ));
    // The old id is not the lease any more.
    assert_eq!(
        exec(&account, &lease(LeaseAction::Release(a))).unwrap(),
        LeaseOutcome::NotHeld
    );
    assert_eq!(
        exec(&account, &lease(LeaseAction::Release(changed))).unwrap(),
        LeaseOutcome::Released
    );
    assert_eq!(
        props(&account, &c, &b).lease_state,
        Some(LeaseState::Available)
    );
    // Break on a blob with no lease: not held. Break of a held lease with a period: breaking.
    assert_eq!(
        exec(&account, &lease(LeaseAction::Break { period: Some(0) })).unwrap(),
        LeaseOutcome::NotHeld
    );
    exec(&account, &lease(acquire(a))).unwrap();
    assert_eq!(
        exec(&account, &lease(LeaseAction::Break { period: Some(10) })).unwrap(),
        LeaseOutcome::Broken {
            remaining: Duration::from_secs(10)
        }
    );
    assert_eq!(
        props(&account, &c, &b).lease_state,
        Some(LeaseState::Breaking)
    );
    // Breaking: nobody can acquire, not even the holder.
    assert_eq!(
        exec(&account, &lease(acquire(other))).unwrap(),
        LeaseOutcome::HeldByOther
    );
    assert_eq!(
        exec(&account, &lease(LeaseAction::Break { period: Some(0) })).unwrap(),
        LeaseOutcome::Broken {
            remaining: Duration::ZERO
        }
    );
    assert_eq!(
        props(&account, &c, &b).lease_state,
        Some(LeaseState::Broken)
    );
    assert!(matches!(
        exec(&account, &lease(acquire(other))).unwrap(),
        LeaseOutcome::Held { .. }
    ));
}

#[test]
fn lease_duration_is_validated_before_sending() {
    assert!(LeaseDuration::try_from_secs(10).is_err());
    assert!(LeaseDuration::try_from_secs(90).is_err());
    let account = Azurite::shared().account();
    let op = Lease::new(
        unique_container("x"),
        blob("b"),
        LeaseAction::Break { period: Some(61) },
    );
    assert!(build(&op, &account, SystemTime::now()).is_err());
}

#[test]
fn page_blob_sequence_number_increments_under_lease() {
    let account = Azurite::shared().account();
    let c = new_container(&account, "seq");
    let b = blob("p");
    let page = PutBlob {
        kind: BlobKind::Page(0),
        ..PutBlob::block(c.clone(), b.clone(), Vec::new())
    };
    written(exec(&account, &page).unwrap());
    let holder = id();
    take_infinite_lease(&account, &c, &b, holder);
    let inc = |lease_id| IncrementSequenceNumber {
        container: c.clone(),
        blob: b.clone(),
        lease_id,
    };
    assert_eq!(
        written(exec(&account, &inc(Some(holder))).unwrap()).sequence_number,
        Some(1)
    );
    assert_eq!(
        written(exec(&account, &inc(Some(holder))).unwrap()).sequence_number,
        Some(2)
    );
    assert_eq!(
        exec(&account, &inc(None)).unwrap(),
        WriteOutcome::Refused(Refusal::LeaseHeld)
    );
    assert_eq!(
        exec(&account, &inc(Some(id()))).unwrap(),
        WriteOutcome::Refused(Refusal::LeaseLost)
    );
    assert_eq!(props(&account, &c, &b).sequence_number, Some(2));
}

#[test]
fn list_pages_with_prefix_metadata_and_marker() {
    let account = Azurite::shared().account();
    let c = new_container(&account, "list");
    for i in 0..5 {
        let mut m = Metadata::new();
        m.insert("TimeToLive".into(), format!("2026-11-21T14:0{i}:00Z"));
        let put =
            PutBlob::block(c.clone(), blob(&format!("ttl/{i}")), vec![b'x'; i]).with_metadata(m);
        written(exec(&account, &put).unwrap());
    }
    written(
        exec(
            &account,
            &PutBlob::block(c.clone(), blob("other/x"), Vec::new()),
        )
        .unwrap(),
    );

    let mut names = Vec::new();
    let mut marker = None;
    let mut pages = 0;
    loop {
        let op = ListBlobs {
            prefix: Some("ttl/".into()),
            marker: marker.clone(),
            max_results: Some(2),
            include_metadata: true,
            ..ListBlobs::new(c.clone())
        };
        let page = exec(&account, &op).unwrap();
        pages += 1;
        for item in &page.blobs {
            let i: usize = item.name["ttl/".len()..].parse().unwrap();
            assert_eq!(item.properties.content_length, Some(i as u64));
            assert!(item.properties.etag.is_some());
            assert_eq!(
                item.properties
                    .metadata
                    .get("timetolive")
                    .map(String::as_str),
                Some(format!("2026-11-21T14:0{i}:00Z").as_str())
            );
            names.push(item.name.clone());
        }
        marker = page.next_marker;
        if marker.is_none() {
            break;
        }
        assert!(pages < 10, "listing does not end");
    }
    assert_eq!(names, ["ttl/0", "ttl/1", "ttl/2", "ttl/3", "ttl/4"]);
    assert_eq!(pages, 3);
    let all = exec(&account, &ListBlobs::new(c.clone())).unwrap();
    assert_eq!(all.blobs.len(), 6);
    assert!(all.blobs.iter().all(|b| b.properties.metadata.is_empty()));
}

#[test]
fn copy_then_delete_with_conditions() {
    let account = Azurite::shared().account();
    let c = new_container(&account, "copy");
    let dead = new_container(&account, "dead");
    let src = blob("ttl/expired one");
    written(
        exec(
            &account,
            &PutBlob::block(c.clone(), src.clone(), b"payload".to_vec()),
        )
        .unwrap(),
    );
    let copy = CopyBlob {
        condition: Condition::IfNotExists,
        ..CopyBlob::new(c.clone(), src.clone(), dead.clone(), src.clone())
    };
    match exec(&account, &copy).unwrap() {
        CopyOutcome::Started { status, .. } => assert_eq!(status, CopyStatus::Success),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        exec(&account, &copy).unwrap(),
        CopyOutcome::Refused(Refusal::AlreadyExists)
    );
    let copied = exec(
        &account,
        &GetBlob {
            container: dead.clone(),
            blob: src.clone(),
        },
    )
    .unwrap()
    .unwrap();
    assert_eq!(copied.body, b"payload");

    // A copy only of the version listed (x-ms-source-if-match), with the metadata given.
    let stale = CopyBlob {
        source_etag: Some(leasegate::ETag::new("0x1")),
        ..CopyBlob::new(c.clone(), src.clone(), dead.clone(), blob("elsewhere"))
    };
    assert_eq!(
        exec(&account, &stale).unwrap(),
        CopyOutcome::Refused(Refusal::ConditionFailed)
    );
    // A stale source onto an existing destination that must not exist: refused either way
    // (Azurite checks the destination first; a peer answering `SourceConditionNotMet` first is
    // read as the source's refusal).
    let both = CopyBlob {
        source_etag: Some(leasegate::ETag::new("0x1")),
        condition: Condition::IfNotExists,
        ..CopyBlob::new(c.clone(), src.clone(), dead.clone(), src.clone())
    };
    assert!(matches!(
        exec(&account, &both).unwrap(),
        CopyOutcome::Refused(Refusal::AlreadyExists | Refusal::ConditionFailed)
    ));
    let listed = props(&account, &c, &src).etag.unwrap();
    let with_metadata = CopyBlob {
        source_etag: Some(listed),
        metadata: Some([("sourceuri".to_string(), "http://x/y".to_string())].into()),
        ..CopyBlob::new(c.clone(), src.clone(), dead.clone(), blob("elsewhere"))
    };
    assert!(matches!(
        exec(&account, &with_metadata).unwrap(),
        CopyOutcome::Started { .. }
    ));
    let moved = props(&account, &dead, &blob("elsewhere"));
    assert_eq!(
        moved.metadata.get("sourceuri").unwrap().as_str(),
        "http://x/y"
    );
    assert_eq!(moved.copy_status.as_deref(), Some("success"));

    // Delete only the version we listed; a leased blob needs its lease id.
    let etag = props(&account, &c, &src).etag.unwrap();
    let holder = id();
    take_infinite_lease(&account, &c, &src, holder);
    let delete = |lease_id, condition| DeleteBlob {
        container: c.clone(),
        blob: src.clone(),
        lease_id,
        condition,
    };
    assert_eq!(
        exec(&account, &delete(None, Condition::None)).unwrap(),
        DeleteOutcome::Refused(Refusal::LeaseHeld)
    );
    assert_eq!(
        exec(
            &account,
            &delete(
                Some(holder),
                Condition::IfMatch(leasegate::ETag::new("0x1"))
            )
        )
        .unwrap(),
        DeleteOutcome::Refused(Refusal::ConditionFailed)
    );
    assert_eq!(
        exec(&account, &delete(Some(holder), Condition::IfMatch(etag))).unwrap(),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        exec(&account, &delete(None, Condition::None)).unwrap(),
        DeleteOutcome::NotFound
    );
    assert!(exec(
        &account,
        &GetBlob {
            container: c,
            blob: src
        }
    )
    .unwrap()
    .is_none());
}

#[test]
fn wrong_key_is_an_auth_error_without_the_key() {
    let az = Azurite::shared();
    let wrong = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk=";
    let account = Account::new(
        "devstoreaccount1",
        BlobEndpoint::try_new(&az.endpoint()).unwrap(),
        Credential::SharedKey(AccountKey::try_new(wrong).unwrap()),
    );
    let err = exec(
        &account,
        &CreateContainer {
            container: unique_container("auth"),
        },
    )
    .unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::Auth), "{err}");
    let text = format!("{err} {err:?}");
    assert!(text.contains("403"), "{text}");
    assert!(
        !text.contains(wrong) && !text.contains(leasegate::DEV_ACCOUNT_KEY),
        "{text}"
    );
}

#[test]
fn generated_service_sas_is_accepted_and_limited() {
    let az = Azurite::shared();
    let dev = az.account();
    let c = new_container(&dev, "sas");
    let Credential::SharedKey(key) = dev.credential() else {
        unreachable!()
    };
    let now = SystemTime::now();
    let sas = |permissions| {
        let token = ServiceSas {
            resource: SasResource::Container(c.clone()),
            permissions,
            start: Some(now - Duration::from_secs(300)),
            expiry: now + Duration::from_secs(3600),
            protocol: None,
        }
        .token("devstoreaccount1", key)
        .unwrap();
        Account::new(
            "devstoreaccount1",
            BlobEndpoint::try_new(&az.endpoint()).unwrap(),
            Credential::Sas(token),
        )
    };
    let full = sas(SasPermissions::all());
    let b = blob("via-sas");
    written(exec(&full, &PutBlob::block(c.clone(), b.clone(), b"s".to_vec())).unwrap());
    take_infinite_lease(&full, &c, &b, id());
    assert_eq!(
        exec(&full, &ListBlobs::new(c.clone())).unwrap().blobs.len(),
        1
    );

    let read_only = sas(SasPermissions {
        read: true,
        ..Default::default()
    });
    assert!(exec(
        &read_only,
        &GetBlob {
            container: c.clone(),
            blob: b.clone()
        }
    )
    .unwrap()
    .is_some());
    let err = exec(
        &read_only,
        &PutBlob::block(c.clone(), blob("nope"), Vec::new()),
    )
    .unwrap_err();
    assert_eq!(err.class(), Some(ErrorClass::Auth), "{err}");
    assert!(!format!("{err} {err:?}").contains("sig="));
}
