//! ttl-sweeper against blobs and containers as storage keeps them, as the release `.wasm` under
//! the real `spin up`, against Azurite through the fault proxy (the test writes and reads blobs
//! with raw requests under a container SAS, byte for byte): a container that refuses listing is
//! skipped and reported; marking keeps other metadata exactly; expired blobs with snapshots are
//! deleted with them; dead-blob moves only into allowed containers, metadata kept exactly;
//! every name storage accepts is swept.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use leasegate_tests::app::{call, Answer, App, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::proxy::Fault;
use leasegate_tests::{container_sas, unique_container, Azurite};
use serde_json::{json, Value};

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// A raw request to the shared Azurite under a container SAS (nothing of ours signs or checks
/// it, so metadata goes out byte for byte). Returns the status and the headers.
fn raw(
    method: &str,
    container: &str,
    path: &str,
    query: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, String) {
    let c = leasegate::ContainerName::try_new(container).unwrap();
    let sas = container_sas(&c);
    let sep = if query.is_empty() { "" } else { "&" };
    let url = format!(
        "{}/{container}{path}?{query}{sep}{sas}",
        Azurite::shared().endpoint()
    );
    let mut request = http::Request::builder()
        .method(method)
        .uri(url)
        .header("x-ms-version", "2021-12-02");
    for (k, v) in headers {
        request = request.header(*k, http::HeaderValue::from_bytes(v.as_bytes()).unwrap());
    }
    let response = agent()
        .run(request.body(body.to_vec()).unwrap())
        .expect("Azurite answers");
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let text = response.into_body().read_to_string().unwrap_or_default();
    (status, headers, text)
}

fn create_container(c: &str) {
    let storage = leasegate::lease::Locks::new(
        leasegate_cli::NativeTransport::default(),
        Azurite::shared().account(),
        leasegate::ContainerName::try_new("unused").unwrap(),
    );
    let create = leasegate::ops::CreateContainer {
        container: leasegate::ContainerName::try_new(c).unwrap(),
    };
    leasegate_cli::block_on(storage.client().execute(&create, SystemTime::now())).unwrap();
}

/// Puts a block blob (`path` is `/name`, percent-encoded as it goes on the wire).
fn put(c: &str, path: &str, body: &[u8], metadata: &[(&str, &str)]) {
    let mut headers = vec![("x-ms-blob-type", "BlockBlob")];
    let names: Vec<String> = metadata
        .iter()
        .map(|(k, _)| format!("x-ms-meta-{k}"))
        .collect();
    for ((_, v), n) in metadata.iter().zip(&names) {
        headers.push((n.as_str(), *v));
    }
    let (status, _, text) = raw("PUT", c, path, "", &headers, body);
    assert_eq!(status, 201, "put {c}{path}: {text}");
}

/// The blob's metadata as storage keeps it (List Blobs: names with their case, values exact),
/// or `None` when the blob is gone.
fn metadata(c: &str, name: &str) -> Option<BTreeMap<String, String>> {
    list(c).remove(name)
}

/// Every blob of a container (snapshots included as `name@snapshot`): name -> metadata, as the
/// listing's XML gives them.
fn list(c: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let (status, _, text) = raw(
        "GET",
        c,
        "",
        "restype=container&comp=list&include=metadata,snapshots",
        &[],
        b"",
    );
    if status == 404 {
        return BTreeMap::new();
    }
    assert_eq!(status, 200, "{text}");
    let mut out = BTreeMap::new();
    for blob in text.split("<Blob>").skip(1) {
        let tag = |t: &str, s: &str| -> Option<String> {
            let start = s.find(&format!("<{t}>"))? + t.len() + 2;
            let end = s[start..].find(&format!("</{t}>"))? + start;
            Some(s[start..end].to_string())
        };
        let mut name = unescape(&tag("Name", blob).unwrap());
        if let Some(snapshot) = tag("Snapshot", blob) {
            name = format!("{name}@{snapshot}");
        }
        let mut meta = BTreeMap::new();
        if let Some(m) = tag("Metadata", blob) {
            for item in m.split('<').skip(1) {
                if let Some((k, v)) = item.split_once('>') {
                    if !k.starts_with('/') && !k.ends_with('/') {
                        meta.insert(k.to_string(), unescape(v));
                    }
                }
            }
        }
        out.insert(name, meta);
    }
    out
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#x9;", "\t")
        .replace("&#9;", "\t")
        .replace("&amp;", "&")
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn past() -> String {
    rfc3339(SystemTime::now() - Duration::from_secs(3600))
}

fn sweeper(tag: &str, containers: &str, extra: &[(&str, &str)]) -> App {
    let mut vars = vec![("instance_id", tag), ("ttl_containers", containers)];
    vars.extend_from_slice(extra);
    App::start_with(tag, &vars, Setup::default())
}

fn tick(app: &App) -> Answer {
    call("POST", &app.url("/api/sweeper/tick"), &[TIMER_AUTH], b"")
}

/// Ticks until a tick completes a pass (each answering 200); returns every answer.
fn pass(app: &App) -> Vec<Answer> {
    let mut answers = Vec::new();
    for _ in 0..20 {
        let a = tick(app);
        assert_eq!(a.status, 200, "{}", a.text);
        let done = a.json["passCompleted"] == true;
        answers.push(a);
        if done {
            return answers;
        }
    }
    panic!(
        "the pass did not complete: {:#?}",
        answers.last().map(|a| &a.json)
    );
}

/// The sum of one field (or `skipped.<reason>`) over answers.
fn total(answers: &[Answer], field: &str) -> u64 {
    answers
        .iter()
        .map(|a| match field.strip_prefix("skipped.") {
            Some(reason) => a.json["skipped"][reason].as_u64().unwrap_or(0),
            None => a.json[field].as_u64().unwrap_or(0),
        })
        .sum()
}

/// Marks a blob: `PUT /api/ttl/...`, an operator's route (the admin token).
fn mark(app: &App, container: &str, path: &str, body: &Value) -> Answer {
    call(
        "PUT",
        &app.url(&format!("/api/ttl/{container}{path}")),
        &[ADMIN_AUTH, ("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// Correctness #4: a swept container whose listing fails with a 403 (a SAS without list rights
/// there) is skipped and reported, and the others are swept; every pass completes.
#[test]
fn a_container_that_refuses_listing_is_skipped_and_the_others_swept() {
    let (a, b) = (unique_container("ttlforbid"), unique_container("ttlok"));
    let (a, b) = (a.as_str(), b.as_str());
    for c in [a, b] {
        create_container(c);
        put(c, "/old", b"x", &[("TimeToLive", &past())]);
    }
    let app = sweeper(
        "skip403",
        &format!("{a},{b}"),
        &[("ttl_pass_interval_seconds", "0")],
    );
    app.storage
        .fault_on(&format!("GET /devstoreaccount1/{a}?"), Fault::Status(403));
    for round in 0..2 {
        let answers = pass(&app);
        let skipped: Vec<&Value> = answers
            .iter()
            .filter_map(|x| x.json["containersSkipped"].as_array())
            .flatten()
            .collect();
        assert_eq!(skipped.len(), 1, "pass {round}: {skipped:?}");
        assert_eq!(skipped[0]["container"], a);
        assert_eq!(skipped[0]["storageStatus"], 403, "{:?}", skipped[0]);
        assert_eq!(total(&answers, "deleted"), u64::from(round == 0));
    }
    assert!(
        metadata(a, "old").is_some(),
        "the refused container is left as it was"
    );
    assert!(
        metadata(b, "old").is_none(),
        "the other container was swept"
    );
    let logged = app
        .json_lines()
        .into_iter()
        .any(|l| l["containersSkipped"][0]["container"] == a);
    assert!(logged, "the tick's log line names the skipped container");
}

/// Correctness #6: marking keeps the blob's other metadata values exactly as storage holds
/// them (a tab, inner spaces); a value that cannot be written back is a 4xx naming it.
#[test]
fn marking_keeps_other_metadata_exactly() {
    let c = unique_container("ttlmeta");
    let c = c.as_str();
    create_container(c);
    put(
        c,
        "/doc",
        b"x",
        &[("MyKey", "a\tb"), ("Owner", "team one"), ("z", "1")],
    );
    let app = sweeper("meta", c, &[]);
    let a = mark(&app, c, "/doc", &json!({"ttlSeconds": 3600}));
    assert_eq!(a.status, 200, "{}", a.text);
    let m = metadata(c, "doc").unwrap();
    let value = |name: &str| {
        m.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    assert_eq!(value("MyKey").as_deref(), Some("a\tb"), "{m:?}");
    assert_eq!(value("Owner").as_deref(), Some("team one"), "{m:?}");
    assert_eq!(value("z").as_deref(), Some("1"), "{m:?}");
    assert!(value("TimeToLive").is_some(), "{m:?}");
    // A value that cannot go back into a header as storage gave it (bytes beyond ASCII): a
    // 4xx naming the metadata, the blob untouched.
    put(c, "/latin", b"x", &[("Legacy", "caf\u{e9}"), ("ok", "1")]);
    let before = metadata(c, "latin").unwrap();
    let a = mark(&app, c, "/latin", &json!({"ttlSeconds": 3600}));
    assert!((400..500).contains(&a.status), "{} {}", a.status, a.text);
    assert!(a.text.to_lowercase().contains("legacy"), "{}", a.text);
    assert_eq!(metadata(c, "latin").unwrap(), before);
    app.assert_no_trap();
}

/// Correctness #12: an expired blob with snapshots is deleted with its snapshots.
#[test]
fn expired_blobs_with_snapshots_are_deleted_with_them() {
    let c = unique_container("ttlsnap");
    let c = c.as_str();
    create_container(c);
    put(c, "/snapped", b"v1", &[("TimeToLive", &past())]);
    let (status, _, text) = raw("PUT", c, "/snapped", "comp=snapshot", &[], b"");
    assert_eq!(status, 201, "{text}");
    assert_eq!(list(c).len(), 2, "the blob and its snapshot");
    let app = sweeper("snap", c, &[]);
    let answers = pass(&app);
    assert_eq!(total(&answers, "deleted"), 1, "{:?}", answers[0].json);
    assert_eq!(total(&answers, "errors"), 0, "{:?}", answers[0].json);
    assert!(list(c).is_empty(), "{:?}", list(c));
}

/// Security #2: with no `ttl_dead_containers`, a blob asking to be moved is neither moved nor
/// deleted (skipped and counted), and the marking API refuses the container naming the setting.
#[test]
fn dead_blob_moves_need_an_allow_list() {
    let (c, dead) = (unique_container("ttlnolist"), unique_container("ttldeadx"));
    let (c, dead) = (c.as_str(), dead.as_str());
    create_container(c);
    put(
        c,
        "/wants-move",
        b"x",
        &[("TimeToLive", &past()), ("DeadBlobContainer", dead)],
    );
    put(c, "/plain", b"x", &[("TimeToLive", &past())]);
    let app = sweeper("nolist", c, &[]);
    let answers = pass(&app);
    assert_eq!(total(&answers, "deleted"), 1, "{:?}", answers[0].json);
    assert_eq!(total(&answers, "moved"), 0);
    let reason = "DeadBlobContainer is not allowed (ttl_dead_containers)";
    assert_eq!(
        total(&answers, &format!("skipped.{reason}")),
        1,
        "{:?}",
        answers[0].json
    );
    assert!(metadata(c, "wants-move").is_some());
    assert!(list(dead).is_empty());
    put(c, "/to-mark", b"x", &[]);
    let a = mark(
        &app,
        c,
        "/to-mark",
        &json!({"ttlSeconds": 60, "deadBlobContainer": dead}),
    );
    assert_eq!(a.status, 400, "{}", a.text);
    assert!(a.text.contains("ttl_dead_containers"), "{}", a.text);
    let a = mark(&app, c, "/to-mark", &json!({"ttlSeconds": 60}));
    assert_eq!(a.status, 200, "{}", a.text);
}

/// Security #2 and correctness #6: an allowed dead-blob container gets the blob with its
/// metadata exactly (name case and values: the copy sends none); a blob carrying this app's
/// claim fields is not moved; a container not on the list is refused; `*` allows any
/// container but the app's own and the swept ones.
#[test]
fn allowed_dead_blob_moves_keep_metadata_and_never_carry_claims() {
    let (c, dead, other) = (
        unique_container("ttlmove"),
        unique_container("ttldeady"),
        unique_container("ttlother"),
    );
    let (c, dead, other) = (c.as_str(), dead.as_str(), other.as_str());
    create_container(c);
    let to = format!("{dead}/moved/");
    put(
        c,
        "/keep",
        b"content",
        &[
            ("TimeToLive", &past()),
            ("DeadBlobContainer", &to),
            ("MyKey", "a\tb"),
            ("Owner", "team one"),
        ],
    );
    put(
        c,
        "/claimed",
        b"x",
        &[
            ("TimeToLive", &past()),
            ("DeadBlobContainer", dead),
            ("leasegate_term", "record"),
            ("leasegate_expires", "253402300799"),
        ],
    );
    put(
        c,
        "/elsewhere",
        b"x",
        &[("TimeToLive", &past()), ("DeadBlobContainer", other)],
    );
    let before = metadata(c, "keep").unwrap();
    let app = sweeper("allow", c, &[("ttl_dead_containers", dead)]);
    let answers = pass(&app);
    assert_eq!(total(&answers, "moved"), 1, "{:?}", answers[0].json);
    assert_eq!(total(&answers, "deleted"), 1, "{:?}", answers[0].json);
    assert_eq!(
        total(
            &answers,
            "skipped.the blob carries leasegate claim metadata (never moved)"
        ),
        1,
        "{:?}",
        answers[0].json
    );
    assert_eq!(
        total(
            &answers,
            "skipped.DeadBlobContainer is not allowed (ttl_dead_containers)"
        ),
        1,
        "{:?}",
        answers[0].json
    );
    let moved = list(dead);
    assert_eq!(
        moved.keys().collect::<Vec<_>>(),
        ["moved/keep"],
        "{moved:?}"
    );
    assert_eq!(
        moved["moved/keep"], before,
        "the copy keeps the metadata exactly"
    );
    assert!(metadata(c, "keep").is_none());
    assert!(metadata(c, "claimed").is_some() && metadata(c, "elsewhere").is_some());
    assert!(list(other).is_empty());
    // The marking API: the allowed container (with a prefix) yes, another no.
    put(c, "/to-mark", b"x", &[]);
    let ok = mark(
        &app,
        c,
        "/to-mark",
        &json!({"ttlSeconds": 60, "deadBlobContainer": to}),
    );
    assert_eq!(ok.status, 200, "{}", ok.text);
    let no = mark(
        &app,
        c,
        "/to-mark",
        &json!({"ttlSeconds": 60, "deadBlobContainer": other}),
    );
    assert_eq!(no.status, 400, "{}", no.text);
    assert!(no.text.contains("ttl_dead_containers"), "{}", no.text);
    // `*`: any container but the app's own and the swept ones.
    drop(app);
    let star = sweeper("star", c, &[("ttl_dead_containers", "*")]);
    let own = star.container.as_str().to_string();
    let marked = |d: &str| {
        mark(
            &star,
            c,
            "/to-mark",
            &json!({"ttlSeconds": 60, "deadBlobContainer": d}),
        )
    };
    assert_eq!(marked(other).status, 200);
    assert_eq!(marked(&own).status, 400);
    assert_eq!(marked(&format!("{c}/dead/")).status, 400);
    let answers = pass(&star);
    assert_eq!(total(&answers, "moved"), 1, "{:?}", answers[0].json);
    assert_eq!(list(other).len(), 1);
}

/// Security #10: names storage accepts (`a//b`, `dir/`, `a\b`) are swept; a name with a `.`
/// or `..` segment is reported once as unusable (escaped), not on every pass.
#[test]
fn every_name_storage_accepts_is_swept() {
    let c = unique_container("ttlnames");
    let c = c.as_str();
    create_container(c);
    for path in ["/a//b", "/dir/", "/a%5Cb", "/x/%2E%2E/y"] {
        put(c, path, b"x", &[("TimeToLive", &past())]);
    }
    let names: Vec<String> = list(c).into_keys().collect();
    assert_eq!(names.len(), 4, "{names:?}");
    let app = sweeper("names", c, &[("ttl_pass_interval_seconds", "0")]);
    let first = pass(&app);
    assert_eq!(total(&first, "deleted"), 3, "{:?}", first[0].json);
    let left: Vec<String> = list(c).into_keys().collect();
    assert_eq!(left, ["x/../y"]);
    let reported: Vec<&Value> = first
        .iter()
        .filter_map(|a| a.json["unusableNames"].as_array())
        .flatten()
        .collect();
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!(reported[0]["name"], "x/../y");
    assert_eq!(reported[0]["container"], c);
    // The next pass does not report it again, nor count it as skipped.
    let second = pass(&app);
    assert!(
        second
            .iter()
            .all(|a| a.json["unusableNames"].as_array().is_none_or(Vec::is_empty)),
        "{:?}",
        second.last().map(|a| &a.json)
    );
    assert!(second
        .iter()
        .all(|a| a.json["skipped"].as_object().is_none_or(|m| m.is_empty())));
    // The marking API takes such names too.
    put(c, "/m//n/", b"x", &[]);
    let a = mark(&app, c, "/m%2F%2Fn%2F", &json!({"ttlSeconds": 60}));
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["blob"], "m//n/");
}
