//! `leasegate status` without a job: the container's view, read from storage by the built CLI.
//! Against a running app (release `.wasm` under the real `spin up` on Azurite) whose leader
//! leads, whose job ran, whose gate is held and whose sweeper completed a pass, the table and
//! `--json` say so, with the app's own figures (term, token, occurrence); an empty container
//! shows empty sections; a container that does not exist is a clear error; a listing of many
//! blobs prints progress lines on stderr only.

use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use leasegate::ops::{CreateContainer, PutBlob};
use leasegate::{BlobClient, BlobName, ContainerName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{call, cli_binary, App, Setup, TIMER_AUTH, TIMER_TOKEN};
use leasegate_tests::jobs::{occurrence_of, tick, JOB};
use leasegate_tests::{container_sas, unique_container, wait_for, Azurite};
use serde_json::Value;

const GATE_AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

/// Runs `leasegate status {args}` with `env` (the connection string of the shared Azurite
/// unless `env` gives one): (success, stdout, stderr).
fn status(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = Command::new(cli_binary());
    command
        .arg("status")
        .args(args)
        .env(
            "LEASEGATE_CONNECTION_STRING",
            Azurite::shared().connection_string(),
        )
        .env_remove("LEASEGATE_BLOB_ENDPOINT")
        .env_remove("LEASEGATE_PROGRESS_MS")
        .env_remove("LEASEGATE_APP_URL")
        .env_remove("LEASEGATE_TIMER_TOKEN");
    for (k, v) in env {
        command.env(k, v);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().expect("run the CLI");
    (
        status.success(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

fn blobs(c: &ContainerName) -> BlobClient<NativeTransport> {
    BlobClient::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        c.clone(),
    )
}

fn create(c: &ContainerName) {
    block_on(blobs(c).execute(
        &CreateContainer {
            container: c.clone(),
        },
        SystemTime::now(),
    ))
    .unwrap();
}

fn put(c: &ContainerName, name: &str, metadata: &[(&str, &str)]) {
    let put = PutBlob::block(c.clone(), BlobName::try_new(name).unwrap(), b"x".to_vec())
        .with_metadata(
            metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    block_on(blobs(c).execute(&put, SystemTime::now())).unwrap();
}

/// The line of `out` that starts (after its indent) with `first`.
fn line_of<'a>(out: &'a str, first: &str) -> &'a str {
    out.lines()
        .find(|l| l.trim_start().starts_with(first))
        .unwrap_or_else(|| panic!("no line starting with {first:?}:\n{out}"))
}

#[test]
fn the_container_view_of_a_running_app() {
    cli_binary(); // built before the app runs, so that nothing held runs out meanwhile
                  // A swept container with one expired blob, for the sweeper's pass.
    let swept = unique_container("ovswept");
    create(&swept);
    put(&swept, "old.txt", &[("timetolive", "2020-01-01T00:00:00Z")]);
    let app = App::start_with(
        "clioverview",
        &[
            ("instance_id", "node-v"),
            ("ttl_containers", swept.as_str()),
            ("leader_lease_seconds", "60"),
            ("job_period_seconds", "5"),
        ],
        Setup::default(),
    );
    let c = app.container.as_str();

    // The leader leads.
    let led = call("POST", &app.url("/api/leader/tick"), &[TIMER_AUTH], b"");
    assert_eq!(led.status, 200, "{}", led.text);
    let leader = call("GET", &app.url("/api/leader"), &[TIMER_AUTH], b"").json;
    assert_eq!(leader["state"], "led", "{leader}");
    let term = leader["term"].as_u64().unwrap();
    // The job runs: a scheduler's tick on time (a job's history begins at its first tick).
    leasegate_tests::jobs::next_period(5, 0);
    let ran = tick(&app, TIMER_AUTH, None);
    assert_eq!(ran.status, 200, "{}", ran.text);
    let occurrence = occurrence_of(&ran);
    // A gate held, another taken and given back.
    let gate = call(
        "POST",
        &app.url("/api/gate/tenant-a/lock?window=600&holder=worker-1"),
        &[GATE_AUTH],
        b"",
    );
    assert_eq!(gate.status, 200, "{}", gate.text);
    let gate_token = gate.json["fencingToken"].as_u64().unwrap();
    let freed = call(
        "POST",
        &app.url("/api/gate/tenant-b?window=30&holder=worker-2"),
        &[GATE_AUTH],
        b"",
    );
    assert_eq!(freed.status, 200, "{}", freed.text);
    let lease_id = freed.json["leaseId"].as_str().unwrap().to_string();
    let gone = call(
        "DELETE",
        &app.url("/api/gate/tenant-b"),
        &[GATE_AUTH, ("lease-id", &lease_id)],
        b"",
    );
    assert!(gone.status < 300, "{} {}", gone.status, gone.text);
    // The sweeper completes a pass (ticked until it says so).
    wait_for("a completed sweep pass", Duration::from_secs(60), || {
        let t = call("POST", &app.url("/api/sweeper/tick"), &[TIMER_AUTH], b"");
        assert_eq!(t.status, 200, "{}", t.text);
        (t.json["passCompleted"] == true).then_some(())
    });

    // --json: the documented shape, with the app's own figures.
    let (ok, out, err) = status(&["--container", c, "--json"], &[]);
    assert!(ok, "{out}{err}");
    assert!(
        err.is_empty(),
        "no progress line for a short listing: {err}"
    );
    let v = json_of(&out);
    assert_eq!(v["format"], 1, "{v}");
    assert_eq!(v["container"], c, "{v}");
    assert!(v["serverTime"].is_string(), "{v}");
    let l = &v["leaders"][0];
    assert_eq!(v["leaders"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(l["group"], "example-group", "{v}");
    assert_eq!(l["state"], "led", "{v}");
    assert_eq!(l["leader"], "node-v", "{v}");
    assert_eq!(l["term"].as_u64(), Some(term), "{v}");
    assert_eq!(l["since"], leader["since"], "{v}");
    let left = l["leftSeconds"].as_u64().unwrap();
    assert!((1..=60).contains(&left), "{v}");

    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{v}");
    let j = &jobs[0];
    assert_eq!(j["job"], JOB, "{v}");
    assert_eq!(j["paused"], false, "{v}");
    assert!(
        j["next"].is_null(),
        "the schedule is not in the container: {v}"
    );
    assert!(j["running"].is_null(), "{v}");
    let run = &j["runs"][0];
    assert_eq!(run["occurrenceUnix"].as_u64(), Some(occurrence), "{v}");
    assert_eq!(run["status"], "succeeded", "{v}");
    assert_eq!(run["instance"], "node-v", "{v}");
    assert_eq!(j["counters"]["ran"], 1, "{v}");
    assert_eq!(j["reservations"]["count"], 1, "{v}");
    assert_eq!(j["reservations"]["open"], 0, "{v}");
    assert_eq!(j["reservations"]["newest"], ran.json["occurrence"], "{v}");

    let gates = &v["gates"][0];
    assert_eq!(gates["prefix"], "gates/", "{v}");
    assert_eq!(gates["blobs"], 2, "{v}");
    assert_eq!(gates["held"], 1, "{v}");
    let longest = &gates["longestHeld"];
    assert_eq!(longest["lock"], "gates/tenant-a/lock", "{v}");
    assert_eq!(longest["holder"], "worker-1", "{v}");
    assert_eq!(longest["fencingToken"].as_u64(), Some(gate_token), "{v}");
    assert!(longest["leftSeconds"].as_u64().unwrap() <= 600, "{v}");
    assert_eq!(v["gates"][1]["prefix"], "alerts/", "{v}");
    assert_eq!(v["gates"][1]["blobs"], 0, "{v}");

    let s = &v["sweeper"];
    assert!(s["passes"].as_u64().unwrap() >= 1, "{v}");
    assert!(s["lastPassCompletedAt"].is_string(), "{v}");
    assert_eq!(s["purged"], 1, "{v}");
    assert_eq!(s["containers"][0]["container"], swept.as_str(), "{v}");
    assert!(s["ticks"].as_array().is_some_and(|t| !t.is_empty()), "{v}");
    assert_eq!(v["unreadable"], Value::Array(vec![]), "{v}");

    // The table says the same.
    let (ok, out, err) = status(&["--container", c], &[]);
    assert!(ok, "{out}{err}");
    assert!(
        out.starts_with(&format!("container {c} (storage time ")),
        "{out}"
    );
    let row = line_of(&out, "example-group");
    for want in ["led", "node-v", &term.to_string()] {
        assert!(row.contains(want), "{want} in {row}");
    }
    assert!(line_of(&out, JOB).trim() == JOB, "{out}");
    let run_row = line_of(&out, ran.json["occurrence"].as_str().unwrap());
    assert!(
        run_row.contains("succeeded") && run_row.contains("node-v"),
        "{run_row}"
    );
    assert!(
        line_of(&out, "next").contains("not stored in the container"),
        "{out}"
    );
    assert!(line_of(&out, "reservations").contains("1, newest"), "{out}");
    assert!(
        line_of(&out, "counters").contains("ran 1, failed 0"),
        "{out}"
    );
    let gates_row = line_of(&out, "gates/ ");
    assert!(
        gates_row.contains("gates/tenant-a/lock by worker-1")
            && gates_row.contains(&format!("token {gate_token}")),
        "{gates_row}"
    );
    assert!(
        gates_row.split_whitespace().take(3).collect::<Vec<_>>() == ["gates/", "2", "1"],
        "{gates_row}"
    );
    assert!(
        line_of(&out, "passes").contains("completed, the last at"),
        "{out}"
    );
    assert!(
        line_of(&out, "counters  purged 1,").contains("purged 1"),
        "{out}"
    );
    assert!(
        line_of(&out, swept.as_str()).contains(swept.as_str()),
        "{out}"
    );

    // Given the app's URL (and its tick token), each job's next occurrences, from the app.
    let base = app.url("");
    let (ok, out, err) = status(
        &["--container", c, "--json", "--app", &base],
        &[("LEASEGATE_TIMER_TOKEN", TIMER_TOKEN)],
    );
    assert!(ok, "{out}{err}");
    let j = &json_of(&out)["jobs"][0];
    assert!(j["nextError"].is_null(), "{j}");
    assert!(j["schedule"].is_string(), "{j}");
    let next = j["next"][0]["utc"]
        .as_str()
        .unwrap_or_else(|| panic!("{j}"));
    let next_secs = humantime::parse_rfc3339(next)
        .unwrap()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // The app's next occurrences start from its clock now: the one the tick ran is among them
    // while it is still ahead (a tick may run an occurrence up to job_early_seconds early).
    assert!(
        next_secs >= occurrence && next_secs + 1 >= leasegate_tests::unix_now(),
        "{j}"
    );
    let (ok, out, err) = status(
        &["--container", c, "--app", &base],
        &[("LEASEGATE_TIMER_TOKEN", TIMER_TOKEN)],
    );
    assert!(ok, "{out}{err}");
    // The same first occurrence, unless it came due between the two calls (the app's list then
    // starts at the one after it).
    assert!(
        line_of(&out, "next").contains(next) || leasegate_tests::unix_now() >= next_secs,
        "{out}"
    );
    assert!(!out.contains(TIMER_TOKEN) && !err.contains(TIMER_TOKEN));
    // A wrong token: the container's view still, the app's refusal where the next runs go.
    let (ok, out, err) = status(
        &["--container", c, "--app", &base],
        &[("LEASEGATE_TIMER_TOKEN", "not-the-token-5e1f")],
    );
    assert!(ok, "{out}{err}");
    assert!(
        line_of(&out, "next").contains("not known: the app answered 401 Unauthorized"),
        "{out}"
    );
    assert!(!out.contains("not-the-token-5e1f"), "{out}");

    // With a SAS instead of the key: the same view, the SAS never printed.
    let sas = container_sas(&app.container);
    let cs = format!(
        "BlobEndpoint={};SharedAccessSignature={sas}",
        Azurite::shared().endpoint()
    );
    let (ok, out, err) = status(
        &["--container", c, "--json"],
        &[("LEASEGATE_CONNECTION_STRING", &cs)],
    );
    assert!(ok, "{out}{err}");
    assert_eq!(json_of(&out)["gates"][0]["held"], 1, "{out}");
    let sig = sas.split('&').find(|p| p.starts_with("sig=")).unwrap();
    assert!(!out.contains(sig) && !err.contains(sig), "{out}{err}");

    // `status JOB` is still the app's view: without the app's URL it says so.
    let (ok, _, err) = status(&[JOB], &[("LEASEGATE_APP_URL", "")]);
    assert!(!ok);
    assert!(err.contains("--app URL or LEASEGATE_APP_URL"), "{err}");
    app.assert_no_trap();
}

#[test]
fn an_empty_container_and_one_that_does_not_exist() {
    let empty = unique_container("ovempty");
    create(&empty);
    let (ok, out, err) = status(&["--container", empty.as_str(), "--json"], &[]);
    assert!(ok, "{out}{err}");
    let v = json_of(&out);
    assert_eq!(v["leaders"], serde_json::json!([]), "{v}");
    assert_eq!(v["jobs"], serde_json::json!([]), "{v}");
    assert_eq!(v["gates"][0]["blobs"], 0, "{v}");
    assert!(v["gates"][0]["longestHeld"].is_null(), "{v}");
    assert!(v["sweeper"].is_null(), "{v}");

    let (ok, out, err) = status(&["--container", empty.as_str()], &[]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("\nleaders\n  none"), "{out}");
    assert!(out.contains("\njobs\n  none"), "{out}");
    assert!(
        line_of(&out, "gates/ ").ends_with("gates/   0      0     -"),
        "{out}"
    );
    assert!(out.contains("\nsweeper\n  no state yet"), "{out}");

    let missing = unique_container("ovmissing");
    for args in [
        vec!["--container", missing.as_str()],
        vec!["--container", missing.as_str(), "--json"],
    ] {
        let (ok, out, err) = status(&args, &[]);
        assert!(!ok, "{out}{err}");
        assert!(out.is_empty(), "{out}");
        assert!(
            err.starts_with(&format!(
                "leasegate: the container {} does not exist on this account",
                missing.as_str()
            )),
            "{err}"
        );
    }
}

#[test]
fn a_long_listing_prints_progress_on_stderr_only() {
    let c = unique_container("ovmany");
    create(&c);
    const GATES: usize = 120;
    let names: Vec<String> = (0..GATES).map(|i| format!("gates/key-{i:03}")).collect();
    std::thread::scope(|s| {
        for chunk in names.chunks(30) {
            let c = &c;
            s.spawn(move || chunk.iter().for_each(|n| put(c, n, &[])));
        }
    });
    let (ok, out, err) = status(
        &["--container", c.as_str(), "--json", "--page-size", "10"],
        &[("LEASEGATE_PROGRESS_MS", "0")],
    );
    assert!(ok, "{out}{err}");
    // stdout is the JSON alone.
    let v = json_of(&out);
    assert_eq!(v["gates"][0]["blobs"], GATES, "{v}");
    assert_eq!(v["gates"][0]["held"], 0, "{v}");
    let lines: Vec<&str> = err.lines().collect();
    let progress = lines
        .iter()
        .filter(|l| l.starts_with("leasegate: listing... "))
        .count();
    // A line a page: 12 pages of gates/, and the (one-page) other prefixes.
    assert!(progress >= GATES / 10, "{err}");
    assert!(
        err.contains(&format!(
            "leasegate: listing... {GATES} blobs so far ({GATES} under gates/)"
        )),
        "{err}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.starts_with(&format!("leasegate: listed {GATES} blobs in "))),
        "{err}"
    );

    // The default interval (a second) prints nothing for a listing this short... unless the
    // machine is slow: then a progress line, still on stderr, never on stdout.
    let (ok, out, err) = status(&["--container", c.as_str(), "--page-size", "10"], &[]);
    assert!(ok, "{out}{err}");
    assert!(!out.contains("leasegate: list"), "{out}");
    assert!(
        err.lines().all(|l| l.starts_with("leasegate: list")),
        "{err}"
    );

    // Bad values are named.
    let (ok, _, err) = status(&["--container", c.as_str(), "--page-size", "0"], &[]);
    assert!(!ok && err.contains("--page-size takes 1 to 5000"), "{err}");
    let (ok, _, err) = status(
        &["--container", c.as_str()],
        &[("LEASEGATE_PROGRESS_MS", "soon")],
    );
    assert!(
        !ok && err.contains("LEASEGATE_PROGRESS_MS takes whole milliseconds"),
        "{err}"
    );
}
