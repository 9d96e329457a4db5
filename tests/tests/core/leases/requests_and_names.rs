//! Requests per decision, lock names mapped to blobs, a listing read as inspect reads.

use super::*;

#[test]
fn round_trips_per_decision() {
    let c = unique_container("count");
    let base = locks(&c);
    let name = lock("counted");
    let (a, b) = (random_id(), random_id());
    let take = |l: &CountedLocks, id, term| {
        block_on(l.acquire(&name, Acquiring::new(term, id), SystemTime::now())).unwrap()
    };
    let release = |l: &CountedLocks, id| {
        block_on(l.release(&name, id, Start::Read, SystemTime::now()))
            .unwrap()
            .0
    };

    // First use: HEAD (404 ContainerNotFound), create the container, create the lock blob (the
    // first token, no holder), acquire, the claim. No create is sent before the container's:
    // the HEAD said it is missing.
    let (o, n) = counted(&base, |l| take(l, a, native(15)));
    assert!(is_acquired(&o) && n == 5, "{o:?} {n}");
    // The holder extends: HEAD + acquire + its claim's new expiry; the token stays. (No claim
    // write when the claim already names that expiry: an extension within the same second.)
    let (o, n) = counted(&base, |l| take(l, a, native(15)));
    assert!(is_acquired(&o) && (n == 3 || n == 2), "{o:?} {n}");
    // Busy, the throttled hot path: one request, whichever term the caller asks for.
    let (o, n) = counted(&base, |l| take(l, b, native(15)));
    assert!(!is_acquired(&o) && n == 1, "{o:?} {n}");
    let (o, n) = counted(&base, |l| take(l, b, native(30)));
    assert!(!is_acquired(&o) && n == 1, "{o:?} {n}");
    let (o, n) = counted(&base, |l| take(l, b, record(120)));
    assert!(!is_acquired(&o) && n == 1, "{o:?} {n}");
    // Release: HEAD + release.
    let (o, n) = counted(&base, |l| release(l, a));
    assert!(o == Release::Released && n == 2, "{o:?} {n}");
    // A new holder: HEAD + acquire + its claim (the token).
    let (o, n) = counted(&base, |l| take(l, b, native(15)));
    assert!(is_acquired(&o) && n == 3, "{o:?} {n}");
    counted(&base, |l| release(l, b));

    // Records: a new holder and an extension are HEAD + compare-and-swap, token included
    // (an extension to the expiry the record already names, within the same second: the HEAD).
    let (o, n) = counted(&base, |l| take(l, a, record(120)));
    assert!(is_acquired(&o) && n == 2, "{o:?} {n}");
    let (o, n) = counted(&base, |l| take(l, a, record(120)));
    assert!(is_acquired(&o) && (n == 2 || n == 1), "{o:?} {n}");
    // Busy against a live record: one request, either term.
    let (o, n) = counted(&base, |l| take(l, b, record(120)));
    assert!(!is_acquired(&o) && n == 1, "{o:?} {n}");
    let (o, n) = counted(&base, |l| take(l, b, native(30)));
    assert!(!is_acquired(&o) && n == 1, "{o:?} {n}");
    // Record release: HEAD + compare-and-swap.
    let (o, n) = counted(&base, |l| release(l, a));
    assert!(o == Release::Released && n == 2, "{o:?} {n}");
    // A release by someone who does not hold it: the HEAD only.
    let (o, n) = counted(&base, |l| release(l, b));
    assert!(o == Release::NotHeld && n == 1, "{o:?} {n}");
    // A record's first use: HEAD (404) + create naming nobody (the first token only) + the
    // compare-and-swap that takes the record (review finding 3: a create that lands late
    // grants nothing).
    let fresh = lock("counted-record");
    let (o, n) = counted(&base, |l| {
        block_on(l.acquire(&fresh, Acquiring::new(record(120), a), SystemTime::now())).unwrap()
    });
    assert!(is_acquired(&o) && n == 3, "{o:?} {n}");
}

#[test]
fn lock_names_map_to_distinct_safe_blobs() {
    let c = unique_container("names");
    let l = locks(&c);
    let names = [
        "device/sensor 1",
        "device%2Fsensor 1",
        "ünïcode/ключ",
        "a..b",
        "?#&=",
    ];
    for n in names {
        held(acquire(&l, &lock(n), native(15), random_id()));
    }
    let (page, _) = block_on(
        l.client()
            .execute(&ListBlobs::new(c.clone()), SystemTime::now()),
    )
    .unwrap();
    let mut blobs: Vec<_> = page.blobs.iter().map(|b| b.name.clone()).collect();
    blobs.sort();
    assert_eq!(blobs.len(), names.len(), "{blobs:?}");
    assert!(
        blobs
            .iter()
            .all(|b| b.starts_with("locks/") && b.is_ascii()),
        "{blobs:?}"
    );
    for bad in ["../escape", "a/../../b", "", "x\u{7}y"] {
        assert!(LockName::try_new(bad).is_err(), "{bad:?}");
    }
}

/// A List Blobs page with metadata says of each lock blob what a HEAD of it says
/// (`LockInfo::from_properties`, how `leasegate status` reads many locks): held by a native
/// lease, by a record, released, and broken.
#[test]
fn a_listing_reads_locks_as_inspect_does() {
    let c = unique_container("listed");
    let l = locks(&c);
    let ids: Vec<LeaseId> = (0..4).map(|_| random_id()).collect();
    held(
        block_on(l.acquire(
            &lock("native"),
            Acquiring::new(native(30), ids[0]).label("node-a"),
            SystemTime::now(),
        ))
        .unwrap(),
    );
    held(
        block_on(l.acquire(
            &lock("record"),
            Acquiring::new(record(300), ids[1]).label("node-b"),
            SystemTime::now(),
        ))
        .unwrap(),
    );
    held(acquire(&l, &lock("released"), native(15), ids[2]));
    block_on(l.release(&lock("released"), ids[2], Start::Read, SystemTime::now())).unwrap();
    held(acquire(&l, &lock("broken"), record(120), ids[3]));
    block_on(l.break_lock(&lock("broken"), 0, SystemTime::now())).unwrap();

    let list = ListBlobs {
        include_metadata: true,
        ..ListBlobs::new(c.clone())
    };
    let (page, date) = block_on(l.client().execute(&list, SystemTime::now())).unwrap();
    let date = date.expect("a listing carries the server's Date");
    assert_eq!(page.blobs.len(), 4, "{page:?}");
    for item in page.blobs {
        let name = item.name.trim_start_matches("locks/").to_string();
        let listed = LockInfo::from_properties(item.properties, date).unwrap();
        let headed = block_on(l.inspect(&lock(&name), SystemTime::now())).unwrap();
        assert_eq!(listed.status, headed.status, "{name}");
        assert_eq!(listed.fencing_token, headed.fencing_token, "{name}");
        assert_eq!(listed.lease_state, headed.lease_state, "{name}");
        assert_eq!(listed.marks, headed.marks, "{name}");
        assert_eq!(listed.server_date, Some(date), "{name}");
        match (name.as_str(), &listed.status) {
            ("native", LockStatus::Held { label, .. }) => assert_eq!(label, "node-a"),
            ("record", LockStatus::Held { label, .. }) => assert_eq!(label, "node-b"),
            ("released" | "broken", LockStatus::Available) => {}
            (name, status) => panic!("{name}: {status:?}"),
        }
    }
}
