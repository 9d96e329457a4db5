//! What the storage model adds for the sweeper, checked through the core's own requests and
//! parsers: a listing's tags (`include=tags`, and each tagged blob's `TagCount`) and Find
//! Blobs by Tags in one container (the blobs whose tags meet the query, with the tags it
//! names, page by page; a malformed query and a missing container refused).

use std::time::SystemTime;

use leasegate::ops::{
    FindBlobsByTags, FoundBlob, FoundBlobs, ListBlobs, PutBlob, Tags, WriteOutcome,
};
use leasegate::{Account, BlobClient, BlobName, ContainerName, ErrorClass};
use leasegate_test_support::memory::{Memory, CONNECTION_STRING};

const START: u64 = 1_795_096_800;

fn tags(pairs: &[(&str, &str)]) -> Tags {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn client(memory: &Memory, container: &str) -> BlobClient<Memory> {
    BlobClient::new(
        memory.clone(),
        Account::from_connection_string(CONNECTION_STRING).unwrap(),
        ContainerName::try_new(container).unwrap(),
    )
}

/// A container `logs` with four blobs: three expiring (two by 14:00), one tagged otherwise.
fn seeded() -> (Memory, BlobClient<Memory>) {
    let memory = Memory::new(START);
    memory.storage_mut().create_container("logs");
    let blobs = client(&memory, "logs");
    for (name, t) in [
        (
            "a.log",
            tags(&[("expires", "2026-11-19T13:00:00Z"), ("team", "x")]),
        ),
        ("b.log", tags(&[("team", "y")])),
        ("c.log", tags(&[("expires", "2026-11-19T14:00:00Z")])),
        ("d.log", tags(&[("expires", "2026-11-19T15:00:00Z")])),
    ] {
        let put = PutBlob {
            tags: t,
            ..PutBlob::block(
                ContainerName::try_new("logs").unwrap(),
                BlobName::try_new(name).unwrap(),
                b"x".to_vec(),
            )
        };
        let (outcome, _) = pollster::block_on(blobs.execute(&put, SystemTime::UNIX_EPOCH)).unwrap();
        assert!(matches!(outcome, WriteOutcome::Written(_)));
    }
    (memory, blobs)
}

fn find(expression: &str, marker: Option<String>, max: Option<u32>) -> FindBlobsByTags {
    FindBlobsByTags {
        container: ContainerName::try_new("logs").unwrap(),
        expression: expression.to_string(),
        marker,
        max_results: max,
    }
}

fn found(name: &str, pairs: &[(&str, &str)]) -> FoundBlob {
    FoundBlob {
        name: name.to_string(),
        tags: tags(pairs),
    }
}

#[test]
fn a_find_answers_the_blobs_whose_tags_meet_it_with_the_tags_it_names() {
    let (_memory, blobs) = seeded();
    let run = |op: &FindBlobsByTags| pollster::block_on(blobs.execute(op, SystemTime::UNIX_EPOCH));
    let (page, _) = run(&find("\"expires\" <= '2026-11-19T14:00:00Z'", None, None)).unwrap();
    assert_eq!(
        page,
        FoundBlobs {
            blobs: vec![
                found("a.log", &[("expires", "2026-11-19T13:00:00Z")]),
                found("c.log", &[("expires", "2026-11-19T14:00:00Z")]),
            ],
            next_marker: None,
        },
        "b.log has no such tag, d.log's is later; a.log's team tag is not named"
    );
    // Page by page: the marker names where the next page starts.
    let query = "\"expires\" >= '2026-11-19T13:00:00Z'";
    let (first, _) = run(&find(query, None, Some(2))).unwrap();
    let names = |p: &FoundBlobs| p.blobs.iter().map(|b| b.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&first), ["a.log", "c.log"]);
    let (second, _) = run(&find(query, first.next_marker.clone(), Some(2))).unwrap();
    assert_eq!(
        (names(&second), second.next_marker),
        (vec!["d.log".to_string()], None)
    );
}

#[test]
fn a_find_refuses_a_malformed_query_and_a_missing_container() {
    let (memory, blobs) = seeded();
    for bad in ["\"expires\" <> 'x'", "expires <= 'x'", ""] {
        let e = pollster::block_on(blobs.execute(&find(bad, None, None), SystemTime::UNIX_EPOCH))
            .unwrap_err();
        assert_eq!(e.class(), Some(ErrorClass::BadRequest), "{bad}: {e}");
    }
    let missing = FindBlobsByTags {
        container: ContainerName::try_new("nothere").unwrap(),
        ..find("\"expires\" <= 'z'", None, None)
    };
    let e =
        pollster::block_on(client(&memory, "nothere").execute(&missing, SystemTime::UNIX_EPOCH))
            .unwrap_err();
    assert_eq!(e.class(), Some(ErrorClass::ContainerMissing), "{e}");
}

#[test]
fn a_listing_carries_each_blobs_tags_when_asked() {
    let (_memory, blobs) = seeded();
    for include_tags in [false, true] {
        let list = ListBlobs {
            include_tags,
            ..ListBlobs::new(ContainerName::try_new("logs").unwrap())
        };
        let (page, _) = pollster::block_on(blobs.execute(&list, SystemTime::UNIX_EPOCH)).unwrap();
        let a = &page.blobs[0].properties;
        assert_eq!(page.blobs[0].name, "a.log");
        assert_eq!(a.tag_count, Some(2), "include_tags {include_tags}");
        let want =
            include_tags.then(|| tags(&[("expires", "2026-11-19T13:00:00Z"), ("team", "x")]));
        assert_eq!(a.tags, want, "include_tags {include_tags}");
    }
}
