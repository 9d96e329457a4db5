//! ttl-sweeper with its **defaults** (no `ttl_find`: the manifest's), as the release `.wasm`
//! under the real `spin up`, against Azurite through the fault proxy, on containers shaped as
//! users' containers are: live blobs named `reports/2026/01/...`, expired ones sorting after
//! them, marks written by the applications themselves (Put Blob with metadata, Set Blob
//! Metadata), not through the marking API.
//!
//! - a blob marked by its `TimeToLive` metadata alone is swept (the seed's contract), the
//!   listing that found it gives the marked blobs it keeps their expiry tag, and later passes
//!   find them by that tag; a mark written after a listing waits for the next one
//!   (`ttl_list_interval_seconds`);
//! - expired blobs sorting after more than a page of live tagged ones are found by tag on
//!   Azurite (whose Find Blobs by Tags searches only the first `maxresults` names), claimed in
//!   pages of `ttl_page_size`;
//! - the metadata is the mark, the tag an index: a found blob without a due `TimeToLive` is
//!   kept and its stale tag cleared (or set to the metadata's later time);
//!   `DELETE /api/ttl/{container}/{blob}` removes the mark and the tag, keeping the rest.
//!
//! The pace is the only setting changed (`ttl_pass_interval_seconds = 0`: a pass may follow
//! the last at once), and `ttl_dead_containers` where a blob asks to be moved.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use leasegate::ops::{
    GetBlobTags, GetProperties, Lease, LeaseAction, Metadata, SetBlobTags, SetMetadata, Tags,
};
use leasegate::{BlobName, ContainerName, LeaseDuration, LeaseId};
use leasegate_cli::block_on;
use leasegate_tests::app::{call, Answer, App, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::blobs::{client, create_container, put, rfc3339};
use leasegate_tests::proxy::{Fault, Seen};
use leasegate_tests::unique_container;
use serde_json::json;

/// The expiry tag (`ttl_sweeper::EXPIRES_TAG`).
const TAG: &str = "leasegate_expires_at";

fn name(n: &str) -> BlobName {
    BlobName::try_new(n).unwrap()
}

/// A deployment with the defaults: `ttl_find` and `ttl_list_interval_seconds` unset (the
/// manifest's), the app's container `app_container` if given.
fn defaults(
    tag: &str,
    swept: &ContainerName,
    extra: &[(&str, &str)],
    app_container: Option<ContainerName>,
) -> App {
    let mut vars = vec![
        ("instance_id", tag),
        ("ttl_containers", swept.as_str()),
        ("ttl_pass_interval_seconds", "0"),
    ];
    vars.extend_from_slice(extra);
    App::start_with(
        tag,
        &vars,
        Setup {
            unset: vec!["ttl_find"],
            container: app_container,
            ..Setup::default()
        },
    )
}

fn tick(app: &App) -> Answer {
    call("POST", &app.url("/api/sweeper/tick"), &[TIMER_AUTH], b"")
}

/// Ticks until a tick completes a pass; the sums of the ticks' counters (`skipped:` + reason
/// for the skipped ones).
fn pass(app: &App) -> BTreeMap<String, u64> {
    let started = Instant::now();
    let mut totals = BTreeMap::new();
    loop {
        assert!(started.elapsed() < Duration::from_secs(120), "no pass");
        let a = tick(app);
        assert_eq!(a.status, 200, "{}", a.text);
        for k in [
            "pages",
            "scanned",
            "deleted",
            "moved",
            "notExpired",
            "unmarked",
            "tagged",
            "errors",
        ] {
            *totals.entry(k.to_string()).or_default() += a.json[k].as_u64().unwrap_or(0);
        }
        if let Some(skipped) = a.json["skipped"].as_object() {
            for (k, v) in skipped {
                *totals.entry(format!("skipped:{k}")).or_default() += v.as_u64().unwrap();
            }
        }
        if a.json["passCompleted"] == json!(true) {
            return totals;
        }
    }
}

fn exists(c: &ContainerName, n: &str) -> bool {
    properties(c, n).is_some()
}

fn properties(c: &ContainerName, n: &str) -> Option<leasegate::ops::BlobProperties> {
    block_on(client().execute(
        &GetProperties {
            container: c.clone(),
            blob: name(n),
        },
        SystemTime::now(),
    ))
    .unwrap()
    .0
}

fn tags(c: &ContainerName, n: &str) -> Tags {
    block_on(client().execute(
        &GetBlobTags {
            container: c.clone(),
            blob: name(n),
        },
        SystemTime::now(),
    ))
    .unwrap()
    .0
    .expect("the blob")
}

/// An application's own Set Blob Tags.
fn set_tags(c: &ContainerName, n: &str, tags: &[(&str, &str)]) {
    let tags: Tags = tags
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    block_on(client().execute(
        &SetBlobTags {
            container: c.clone(),
            blob: name(n),
            tags,
            lease_id: None,
        },
        SystemTime::now(),
    ))
    .unwrap();
}

/// An application's own Set Blob Metadata (it replaces all the blob's metadata).
fn set_metadata(c: &ContainerName, n: &str, metadata: &[(&str, String)]) {
    let metadata: Metadata = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    block_on(client().execute(
        &SetMetadata {
            container: c.clone(),
            blob: name(n),
            metadata,
            lease_id: None,
            condition: leasegate::ops::Condition::None,
        },
        SystemTime::now(),
    ))
    .unwrap();
}

/// The requests among `seen` whose `METHOD target` contains `part`.
fn on(seen: &[Seen], part: &str) -> usize {
    seen.iter()
        .filter(|s| format!("{} {}", s.method, s.target).contains(part))
        .count()
}

/// Sleeps until `t` and one second more (a found blob written in the second of its find is
/// left for the next pass).
fn sleep_past(t: SystemTime) {
    let wait = t
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        .saturating_add(Duration::from_millis(1100));
    std::thread::sleep(wait);
}

/// Item 1's case: a container whose blobs the applications marked by metadata alone (Put Blob
/// with metadata, Set Blob Metadata), the expired ones sorting after the live ones. With the
/// defaults every expired blob is swept in the first pass (the moved ones into their
/// dead-blob container), nothing else is touched, and the listing gives the marked blobs it
/// keeps their expiry tag: the next pass finds the ones that came due by that tag, without a
/// listing. A mark written after the listing waits for the next listing (an hour by default:
/// here a second deployment lists after 1 s).
#[test]
fn blobs_marked_by_their_metadata_alone_are_swept_with_the_defaults() {
    let c = unique_container("ttlmeta");
    let dead = unique_container("ttlmetadead");
    create_container(&c);
    let app = defaults(
        "ttl-meta",
        &c,
        &[("ttl_dead_containers", dead.as_str())],
        None,
    );
    let past = rfc3339(SystemTime::now() - Duration::from_secs(3600));
    let tomorrow = rfc3339(SystemTime::now() + Duration::from_secs(86_400));
    for i in 0..120 {
        let n = format!("reports/2026/01/r{i:03}.csv");
        put(&c, &n, b"day,total", &[("TimeToLive", tomorrow.clone())]);
    }
    for i in 0..20 {
        let n = format!("reports/2026/02/kept{i:02}.csv");
        put(&c, &n, b"day,total", &[("owner", "team-a".into())]);
    }
    for i in 0..30 {
        let n = format!("tmp/exports/e{i:03}.csv");
        put(&c, &n, b"export", &[("TimeToLive", past.clone())]);
    }
    for i in 0..10 {
        let n = format!("tmp/uploads/u{i:02}.bin");
        put(&c, &n, b"upload", &[]);
        set_metadata(
            &c,
            &n,
            &[("TimeToLive", past.clone()), ("owner", "team-b".into())],
        );
    }
    for i in 0..10 {
        let n = format!("tmp/moved/m{i:02}.log");
        let meta = [
            ("TimeToLive", past.clone()),
            ("DeadBlobContainer", dead.as_str().to_string()),
        ];
        put(&c, &n, format!("log {i}").as_bytes(), &meta);
    }
    let soon_at = SystemTime::now() + Duration::from_secs(5);
    let soon = rfc3339(soon_at);
    for i in 0..5 {
        let n = format!("tmp/soon/s{i}.csv");
        put(&c, &n, b"soon", &[("TimeToLive", soon.clone())]);
    }

    let first = pass(&app);
    assert_eq!(first["deleted"], 50, "{first:?}");
    assert_eq!(first["moved"], 10, "{first:?}");
    assert_eq!(first["errors"], 0, "{first:?}");
    assert_eq!(first["tagged"], 125, "the marked blobs kept: {first:?}");
    for i in 0..30 {
        assert!(!exists(&c, &format!("tmp/exports/e{i:03}.csv")), "e{i}");
    }
    for i in 0..10 {
        assert!(!exists(&c, &format!("tmp/uploads/u{i:02}.bin")), "u{i}");
        assert!(!exists(&c, &format!("tmp/moved/m{i:02}.log")), "m{i}");
        assert!(
            exists(&dead, &format!("tmp/moved/m{i:02}.log")),
            "dead m{i}"
        );
    }
    for i in 0..120 {
        let n = format!("reports/2026/01/r{i:03}.csv");
        assert!(exists(&c, &n), "{n}");
        assert_eq!(tags(&c, &n).get(TAG), Some(&tomorrow), "{n}");
    }
    for i in 0..20 {
        let n = format!("reports/2026/02/kept{i:02}.csv");
        assert!(exists(&c, &n) && tags(&c, &n).is_empty(), "{n}");
    }
    assert_eq!(tags(&c, "tmp/soon/s0.csv").get(TAG), Some(&soon));

    // Due now, found by the tag the listing wrote: no listing this pass.
    sleep_past(soon_at);
    let (second, seen) = app.counted(|| pass(&app));
    assert_eq!(second["deleted"], 5, "{second:?}");
    for i in 0..5 {
        assert!(!exists(&c, &format!("tmp/soon/s{i}.csv")), "s{i}");
    }
    assert_eq!(on(&seen, &format!("/{c}?restype=container&comp=list")), 0);
    assert!(on(&seen, &format!("/{c}?restype=container&comp=blobs")) >= 1);

    // Marked after the listing: the next listing, due an hour after this one, sweeps it.
    put(
        &c,
        "tmp/late/l.csv",
        b"late",
        &[("TimeToLive", past.clone())],
    );
    let third = pass(&app);
    assert_eq!(third["deleted"], 0, "{third:?}");
    assert!(exists(&c, "tmp/late/l.csv"));
    let soon_lister = defaults(
        "ttl-meta-b",
        &c,
        &[
            ("ttl_dead_containers", dead.as_str()),
            ("ttl_list_interval_seconds", "1"),
        ],
        Some(app.container.clone()),
    );
    std::thread::sleep(Duration::from_millis(1100));
    let fourth = pass(&soon_lister);
    assert_eq!(fourth["deleted"], 1, "{fourth:?}");
    assert!(!exists(&c, "tmp/late/l.csv"));
    assert!(exists(&c, "reports/2026/01/r119.csv"));
}

/// Item 2's case: on Azurite, Find Blobs by Tags searches only the first `maxresults` names
/// after the marker. 150 live blobs tagged by their application (metadata and tag, as marking
/// writes them) sort before 130 expired ones: with the defaults (pages of 100) a pass without
/// a listing finds and deletes every expired one, from one find that asks for 5000, claimed
/// in pages of 100.
#[test]
fn expired_blobs_sorting_after_many_live_tagged_ones_are_found_on_azurite() {
    let c = unique_container("ttlsorted");
    create_container(&c);
    let app = defaults("ttl-sorted", &c, &[], None);
    let past = rfc3339(SystemTime::now() - Duration::from_secs(3600));
    let tomorrow = rfc3339(SystemTime::now() + Duration::from_secs(86_400));
    for i in 0..150 {
        let n = format!("reports/2026/01/r{i:03}.csv");
        put(&c, &n, b"day,total", &[("TimeToLive", tomorrow.clone())]);
        set_tags(&c, &n, &[(TAG, tomorrow.as_str())]);
    }
    // The first pass lists (none has been), nothing due.
    let first = pass(&app);
    assert_eq!(first["deleted"], 0, "{first:?}");
    for i in 0..130 {
        let n = format!("tmp/exports/e{i:03}.csv");
        put(&c, &n, b"export", &[("TimeToLive", past.clone())]);
        set_tags(&c, &n, &[(TAG, past.as_str())]);
    }
    std::thread::sleep(Duration::from_millis(1100));
    let (second, seen) = app.counted(|| pass(&app));
    assert_eq!(second["deleted"], 130, "{second:?}");
    assert!(second["pages"] >= 2, "claimed in pages of 100: {second:?}");
    for i in 0..130 {
        assert!(!exists(&c, &format!("tmp/exports/e{i:03}.csv")), "e{i}");
    }
    assert!(exists(&c, "reports/2026/01/r149.csv"));
    let finds: Vec<&Seen> = seen
        .iter()
        .filter(|s| {
            s.target
                .contains(&format!("/{c}?restype=container&comp=blobs"))
        })
        .collect();
    assert!(!finds.is_empty());
    for f in &finds {
        assert!(f.target.contains("maxresults=5000"), "{}", f.target);
    }
    assert_eq!(on(&seen, &format!("/{c}?restype=container&comp=list")), 0);
}

/// Item 3's case: the metadata is the mark, the tag an index. A blob marked through the API
/// (metadata and tag) whose owner then rewrote its metadata without `TimeToLive` (Set Blob
/// Metadata keeps the tags) is kept after the old expiry, and its stale tag cleared under the
/// sweeper's lease (its other tags kept); so is a blob an application tagged without any
/// `TimeToLive`; a blob whose metadata now says a later time keeps that time in its tag. The
/// next pass finds none of them again.
#[test]
fn a_found_blob_without_a_due_time_to_live_is_kept_and_its_tag_cleared() {
    let c = unique_container("ttlunmarked");
    create_container(&c);
    let app = defaults("ttl-unmarked", &c, &[], None);
    // The first pass lists the empty container: the next passes only find.
    pass(&app);
    let expiry_at = SystemTime::now() + Duration::from_secs(2);
    let expiry = rfc3339(expiry_at);
    let later = rfc3339(SystemTime::now() + Duration::from_secs(86_400));
    let past = rfc3339(SystemTime::now() - Duration::from_secs(3600));
    for n in ["reports/2026/01/keep.csv", "reports/2026/01/extended.csv"] {
        put(&c, n, b"day,total", &[("owner", "team-a".into())]);
        set_tags(&c, n, &[("project", "apollo")]);
        let a = call(
            "PUT",
            &app.url(&format!("/api/ttl/{c}/{n}")),
            &[ADMIN_AUTH, ("content-type", "application/json")],
            json!({"expiresAt": expiry}).to_string().as_bytes(),
        );
        assert_eq!(a.status, 200, "{}", a.text);
        assert_eq!(a.json["tagged"], json!(true), "{}", a.text);
    }
    // The owner keeps one (its metadata rewritten without TimeToLive) and keeps the other
    // longer (a later TimeToLive); Set Blob Metadata leaves the tags as they were.
    set_metadata(
        &c,
        "reports/2026/01/keep.csv",
        &[("owner", "team-a".into()), ("reviewed", "yes".into())],
    );
    set_metadata(
        &c,
        "reports/2026/01/extended.csv",
        &[("owner", "team-a".into()), ("TimeToLive", later.clone())],
    );
    // An application's own expiry tag, no TimeToLive.
    put(&c, "reports/2026/01/tag-only.csv", b"day,total", &[]);
    set_tags(&c, "reports/2026/01/tag-only.csv", &[(TAG, past.as_str())]);
    sleep_past(expiry_at);

    let (totals, seen) = app.counted(|| pass(&app));
    assert_eq!(totals["deleted"], 0, "{totals:?}");
    for n in ["keep", "extended", "tag-only"] {
        assert!(
            exists(&c, &format!("reports/2026/01/{n}.csv")),
            "{n}: {totals:?}"
        );
    }
    let keep = tags(&c, "reports/2026/01/keep.csv");
    assert_eq!(keep.get(TAG), None, "the stale tag is cleared: {keep:?}");
    assert_eq!(keep.get("project").map(String::as_str), Some("apollo"));
    assert!(tags(&c, "reports/2026/01/tag-only.csv").is_empty());
    let extended = tags(&c, "reports/2026/01/extended.csv");
    assert_eq!(extended.get(TAG), Some(&later), "{extended:?}");
    assert_eq!(extended.get("project").map(String::as_str), Some("apollo"));
    let keep = properties(&c, "reports/2026/01/keep.csv").unwrap();
    assert_eq!(
        keep.metadata.get("reviewed").map(String::as_str),
        Some("yes")
    );
    // The tags were written under the sweeper's lease.
    for s in seen
        .iter()
        .filter(|s| s.target.contains("comp=tags") && s.method == "PUT")
    {
        assert!(s.header("x-ms-lease-id").is_some(), "{}", s.describe());
    }
    assert_eq!(
        totals["skipped:no TimeToLive (kept, its expiry tag cleared)"],
        2
    );

    let (again, seen) = app.counted(|| pass(&app));
    assert_eq!(again["deleted"], 0, "{again:?}");
    assert_eq!(on(&seen, "comp=lease"), 0, "none is found again: {again:?}");
}

fn unmark(app: &App, c: &ContainerName, n: &str, auth: (&str, &str)) -> Answer {
    call(
        "DELETE",
        &app.url(&format!("/api/ttl/{c}/{n}")),
        &[auth],
        b"",
    )
}

/// `DELETE /api/ttl/{container}/{blob}` (admin token) removes `TimeToLive` and
/// `DeadBlobContainer` (by compare-and-swap on the ETag, the other metadata kept) and the
/// expiry tag (the other tags kept): the blob is kept by the next pass. Again: 200, nothing
/// removed. A missing blob 404 `blob_not_found`, a container not swept 403 `not_swept`, a
/// leased blob 409 `leased`, a blob that keeps changing 409 `changed`, the tick token refused.
#[test]
fn unmarking_removes_the_mark_and_the_tag_and_keeps_the_rest() {
    let c = unique_container("ttlunmark");
    let dead = unique_container("ttlunmarkdead");
    create_container(&c);
    let app = defaults(
        "ttl-unmark",
        &c,
        &[("ttl_dead_containers", dead.as_str())],
        None,
    );
    let past = rfc3339(SystemTime::now() - Duration::from_secs(3600));
    let n = "reports/2026/01/a.csv";
    put(&c, n, b"day,total", &[("owner", "team-a".into())]);
    set_tags(&c, n, &[("project", "apollo")]);
    let marked = call(
        "PUT",
        &app.url(&format!("/api/ttl/{c}/{n}")),
        &[ADMIN_AUTH, ("content-type", "application/json")],
        json!({"expiresAt": past, "deadBlobContainer": dead.as_str()})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(marked.status, 200, "{}", marked.text);

    let refused = unmark(&app, &c, n, TIMER_AUTH);
    assert!(
        refused.status == 401 || refused.status == 403,
        "{}",
        refused.text
    );
    let a = unmark(&app, &c, n, ADMIN_AUTH);
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(
        a.json,
        json!({"container": c.as_str(), "blob": n, "expiresAt": null,
               "deadBlobContainer": null, "tagged": false,
               "removed": ["TimeToLive", "DeadBlobContainer", TAG]}),
        "{}",
        a.text
    );
    let props = properties(&c, n).unwrap();
    let names: Vec<&str> = props.metadata.keys().map(String::as_str).collect();
    assert_eq!(names, ["owner"], "{:?}", props.metadata);
    let t = tags(&c, n);
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t.get("project").map(String::as_str), Some("apollo"));
    std::thread::sleep(Duration::from_millis(1100));
    let totals = pass(&app);
    assert_eq!(totals["deleted"], 0, "{totals:?}");
    assert!(exists(&c, n) && !exists(&dead, n));

    let again = unmark(&app, &c, n, ADMIN_AUTH);
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["removed"], json!([]), "{}", again.text);

    let missing = unmark(&app, &c, "reports/2026/01/none.csv", ADMIN_AUTH);
    assert_eq!(missing.status, 404, "{}", missing.text);
    assert_eq!(missing.json["error"], "blob_not_found");
    let other = unique_container("ttlunmarkother");
    let not_swept = unmark(&app, &other, n, ADMIN_AUTH);
    assert_eq!(not_swept.status, 403, "{}", not_swept.text);
    assert_eq!(not_swept.json["error"], "not_swept");

    // Leased by its owner: the metadata cannot be written without the lease.
    set_metadata(
        &c,
        n,
        &[("owner", "team-a".into()), ("TimeToLive", past.clone())],
    );
    let lease = LeaseId::from_random_bytes([48; 16]);
    block_on(client().execute(
        &Lease::new(
            c.clone(),
            name(n),
            LeaseAction::Acquire {
                duration: LeaseDuration::try_from_secs(15).unwrap(),
                proposed: lease,
            },
        ),
        SystemTime::now(),
    ))
    .unwrap();
    let leased = unmark(&app, &c, n, ADMIN_AUTH);
    assert_eq!(leased.status, 409, "{}", leased.text);
    assert_eq!(leased.json["error"], "leased", "{}", leased.text);
    block_on(client().execute(
        &Lease::new(c.clone(), name(n), LeaseAction::Release(lease)),
        SystemTime::now(),
    ))
    .unwrap();

    // Every compare-and-swap refused (another writer each time): 409 changed, nothing lost.
    app.storage
        .fault_on("comp=metadata", Fault::Error(412, "ConditionNotMet"));
    let changed = unmark(&app, &c, n, ADMIN_AUTH);
    app.storage.set_fault(None);
    assert_eq!(changed.status, 409, "{}", changed.text);
    assert_eq!(changed.json["error"], "changed", "{}", changed.text);
    let props = properties(&c, n).unwrap();
    assert_eq!(props.metadata.get("timetolive"), Some(&past));
    app.assert_no_trap();
}

/// Storage requests per pass with the defaults (docs/protocol.md, "Requests per operation"),
/// over an empty swept container, the lock-blob pages off (they add 2 each, as under `list`):
/// **6** when the listing is due (the state's read; the listing's page and the claim's
/// compare-and-swap; the find and its claim; the pass done), **4** between listings (the read,
/// the find and its claim, the pass done), as `ttl_find = tags`; 1 while the next pass is not
/// due.
#[test]
fn a_default_pass_costs_its_listing_only_once_per_interval() {
    let c = unique_container("ttlcost");
    create_container(&c);
    let app = defaults(
        "ttl-cost",
        &c,
        &[("ttl_lock_retention_seconds", "off")],
        None,
    );
    create_container(&app.container);
    let kinds = |seen: &[Seen]| -> Vec<String> {
        seen.iter()
            .map(|s| {
                let query = s.target.split_once('?').map(|(_, q)| q).unwrap_or("");
                let comp = query
                    .split('&')
                    .find(|p| p.starts_with("comp="))
                    .unwrap_or("");
                format!("{} {comp}", s.method)
            })
            .collect()
    };
    let (first, seen) = app.counted(|| tick(&app));
    assert_eq!(first.json["passCompleted"], true, "{}", first.text);
    assert_eq!(
        kinds(&seen),
        [
            "GET ",
            "GET comp=list",
            "PUT ",
            "GET comp=blobs",
            "PUT ",
            "PUT "
        ],
        "{}",
        first.text
    );
    assert_eq!(first.json["storageRoundTrips"], 6, "{}", first.text);
    let (second, seen) = app.counted(|| tick(&app));
    assert_eq!(second.json["passCompleted"], true, "{}", second.text);
    assert_eq!(
        kinds(&seen),
        ["GET ", "GET comp=blobs", "PUT ", "PUT "],
        "{}",
        second.text
    );
    assert_eq!(second.json["storageRoundTrips"], 4, "{}", second.text);
}

/// Review of issue 48: a mark landing while an unmark is between its two writes (its metadata
/// written, its tag write held at the proxy) keeps its tag: the unmark removes the tag only if
/// it is still the one it read (`x-ms-if-tags`). Before, the unmark's tag write took the new
/// mark's tag away, and `ttl_find = tags` never found the blob.
#[test]
fn a_mark_racing_an_unmark_keeps_its_tag() {
    let c = unique_container("ttlremark");
    create_container(&c);
    let app = defaults("ttl-remark", &c, &[], None);
    let n = "reports/2026/02/b.csv";
    put(&c, n, b"day,total", &[]);
    let mark = |secs: u64| {
        call(
            "PUT",
            &app.url(&format!("/api/ttl/{c}/{n}")),
            &[ADMIN_AUTH, ("content-type", "application/json")],
            json!({"ttlSeconds": secs}).to_string().as_bytes(),
        )
    };
    assert_eq!(mark(3600).status, 200);
    // The unmark's tag write (the first tags write from now on) waits 2 s at the proxy,
    // within the storage timeout.
    let write = format!("PUT /devstoreaccount1/{c}/{n}?comp=tags");
    app.storage.fault_once(
        &write,
        leasegate_tests::proxy::Fault::Delay(Duration::from_secs(2)),
    );
    let writes = || {
        app.storage
            .seen()
            .iter()
            .filter(|s| format!("{} {}", s.method, s.target).contains(&write))
            .count()
    };
    let before = writes();
    let remarked = std::thread::scope(|s| {
        let unmarking = s.spawn(|| unmark(&app, &c, n, ADMIN_AUTH));
        leasegate_tests::wait_for(
            "the unmark's held tag write",
            Duration::from_secs(10),
            || (writes() > before).then_some(()),
        );
        let remarked = mark(7200);
        let unmarked = unmarking.join().unwrap();
        assert_eq!(unmarked.status, 200, "{}", unmarked.text);
        remarked
    });
    assert_eq!(remarked.status, 200, "{}", remarked.text);
    let props = properties(&c, n).unwrap();
    let ttl = props
        .metadata
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("TimeToLive"));
    assert!(ttl.is_some(), "the mark's metadata: {:?}", props.metadata);
    let t = tags(&c, n);
    assert_eq!(
        t.get(TAG).map(String::as_str),
        ttl.map(|(_, v)| v.as_str()),
        "the mark's tag is kept: {t:?}"
    );
}
