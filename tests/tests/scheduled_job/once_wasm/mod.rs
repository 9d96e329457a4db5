//! scheduled-job, as `.wasm` served by the real `spin up`, against Azurite: every occurrence
//! runs exactly once across redundant deployments that tick through Spin's cron trigger (the
//! real plugin), through Azure Functions timer invocations and through HTTP ticks, with clocks
//! that disagree; the reservation log; clean-up; storage faults; overlap; failed jobs; bad
//! input.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use leasegate::lease::Locks;
use leasegate::ops::{Condition, GetBlob, ListBlobs, PutBlob};
use leasegate::BlobName;
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{
    bad, call, expect_clear_errors, Answer, App, Manifest, Setup, ADMIN_AUTH, GATE_TOKEN,
    TIMER_AUTH, TIMER_TOKEN,
};
use leasegate_tests::jobs::{azure_timer_payload, decisions};
use leasegate_tests::proxy::Fault;
use leasegate_tests::sink::Behaviour;
use leasegate_tests::{rfc3339_millis, unix_now};
use leasegate_tests::{wait_for, Azurite};
use serde_json::{json, Value};

const JOB: &str = "example-job";

/// A second-level schedule for the cron plugin, and the period that matches it.
const EVERY_2S: (&str, &str) = ("scheduled-job", "*/2 * * * * *");

/// An Azure Functions timer invocation body for a trigger time (a job every minute).
fn azure_payload(secs: u64, millis: u64, past_due: bool) -> Vec<u8> {
    azure_timer_payload(secs - 60, secs, secs * 1000 + millis, past_due)
}

/// What one deployment's tick came to: the decision and who reserved it.
#[derive(Debug, Clone)]
struct Tick {
    decision: String,
    reserved_by: Option<String>,
}

/// An HTTP tick (`POST /api/jobs/{job}/tick`) for a trigger time the test chose: a manual run
/// (the admin token), since the tick token names only the occurrence due now.
fn tick_http(app: &App, secs: u64, millis: u64) -> Answer {
    tick_http_as(app, secs, millis, ADMIN_AUTH)
}

/// An HTTP tick with the `auth` header (the admin token's for an occurrence more than
/// `job_early_seconds` before the current one: a manual run of a past occurrence).
fn tick_http_as(app: &App, secs: u64, millis: u64, auth: (&'static str, &'static str)) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/jobs/{JOB}/tick")),
        &[auth, ("content-type", "application/json")],
        json!({"at": rfc3339_millis(secs, millis)})
            .to_string()
            .as_bytes(),
    )
}

fn tick_azure(app: &App, secs: u64, millis: u64) -> Answer {
    call(
        "POST",
        &app.url("/scheduled-job"),
        &[("content-type", "application/json")],
        &azure_payload(secs, millis, false),
    )
}

fn job_posts(apps: &[App]) -> Vec<Value> {
    apps.iter()
        .flat_map(|a| a.sink.received())
        .filter(|r| r.path == "/job")
        .map(|r| r.body)
        .collect()
}

fn locks(container: &leasegate::ContainerName) -> Locks<NativeTransport> {
    Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        container.clone(),
    )
}

/// Creates a reservation blob directly, as an earlier run long ago would have.
fn old_reservation(container: &leasegate::ContainerName, occurrence: u64) {
    let locks = locks(container);
    let blob = BlobName::try_new(&format!("jobs/{JOB}/occurrences/{occurrence:012}")).unwrap();
    block_on(locks.client().execute(
        &leasegate::ops::CreateContainer {
            container: container.clone(),
        },
        SystemTime::now(),
    ))
    .unwrap();
    block_on(
        locks.client().execute(
            &PutBlob::block(container.clone(), blob, b"{}".to_vec())
                .with_condition(Condition::IfNotExists),
            SystemTime::now(),
        ),
    )
    .unwrap();
}

fn reservations(container: &leasegate::ContainerName) -> Vec<u64> {
    let list = ListBlobs {
        prefix: Some(format!("jobs/{JOB}/occurrences/")),
        ..ListBlobs::new(container.clone())
    };
    let (page, _) = block_on(locks(container).client().execute(&list, SystemTime::now())).unwrap();
    page.blobs
        .iter()
        .map(|b| b.name.rsplit('/').next().unwrap().parse().unwrap())
        .collect()
}

/// The reservation log blob (`jobs/{job}/log.json`), read from storage directly (a cron-only
/// app serves no HTTP).
fn stored_log(container: &leasegate::ContainerName) -> Value {
    let get = GetBlob {
        container: container.clone(),
        blob: BlobName::try_new(&format!("jobs/{JOB}/log.json")).unwrap(),
    };
    let (blob, _) = block_on(locks(container).client().execute(&get, SystemTime::now())).unwrap();
    let blob = blob.expect("the reservation log exists");
    serde_json::from_slice(&blob.body).expect("the log is JSON")
}

/// 8 deployments (distinct instance ids, clocks up to ±1.5 s apart), half ticked by an HTTP
/// scheduler and half as Azure Functions timers, tick the same 30 occurrences concurrently
/// with up to 2 s of jitter: each occurrence runs exactly once (counted at the job's webhook),
/// the reservation log holds the last 10 with the right reservers, and old reservations are
/// gone. (Spin's cron trigger fires only at its schedule's times, not at chosen ones: the
/// deployments on the real cron plugin are in
/// `the_cron_trigger_runs_each_occurrence_once_across_two_instances`.)
#[test]
fn each_occurrence_runs_once_across_eight_deployments() {
    let offsets_ms: [i64; 8] = [-1500, -1100, -700, -300, 300, 700, 1100, 1500];
    // The occurrences are up to half an hour ahead: the tolerance is raised for that.
    let early = ("job_early_seconds", "7200");
    // One `spin up` at a time: eight starting at once on two cores only take longer.
    let first = App::start_with(
        "jobs8",
        &[("instance_id", "node-0"), early],
        Setup {
            manifest: Manifest::Azure,
            clock_offset_ms: offsets_ms[0],
            ..Setup::default()
        },
    );
    let container = first.container.clone();
    let mut apps = vec![first];
    for (d, offset) in offsets_ms.iter().enumerate().skip(1) {
        let id = format!("node-{d}");
        apps.push(App::start_with(
            "jobs8",
            &[("instance_id", id.as_str()), early],
            Setup {
                manifest: Manifest::Azure,
                clock_offset_ms: *offset,
                container: Some(container.clone()),
                ..Setup::default()
            },
        ));
    }
    // Reservations of occurrences three hours ago: older than the retention (1 h by default).
    let now = unix_now();
    let ancient: Vec<u64> = (0..20)
        .map(|j| (now - 3 * 3600) / 60 * 60 + 60 * j)
        .collect();
    for o in &ancient {
        old_reservation(&container, *o);
    }
    let base = (now / 60 + 2) * 60;
    let occurrences: Vec<u64> = (0..30).map(|k| base + 60 * k).collect();
    let mut runners: BTreeMap<u64, String> = BTreeMap::new();
    let started = Instant::now();
    for (k, occ) in occurrences.iter().enumerate() {
        let ticks: Vec<(usize, Tick)> = std::thread::scope(|s| {
            let handles: Vec<_> = apps
                .iter()
                .enumerate()
                .map(|(d, app)| {
                    let occ = *occ;
                    s.spawn(move || {
                        // Each deployment's trigger fires by its own clock, with jitter.
                        let jitter_ms = ((d as i64 * 7 + k as i64 * 13) % 41 - 20) * 100;
                        let at_ms = occ as i64 * 1000 + offsets_ms[d] + jitter_ms;
                        let (secs, millis) =
                            (at_ms.div_euclid(1000) as u64, at_ms.rem_euclid(1000) as u64);
                        let tick = if d % 2 == 0 {
                            let a = tick_http(app, secs, millis);
                            assert_eq!(a.status, 200, "node-{d} occurrence {k}: {}", a.text);
                            // Naming a future occurrence takes the admin token: a
                            // manual run, logged so.
                            assert_eq!(a.json["trigger"], "manual");
                            Tick {
                                decision: a.json["decision"].as_str().unwrap_or("").to_string(),
                                reserved_by: a.json["reservedBy"].as_str().map(str::to_string),
                            }
                        } else {
                            let a = tick_azure(app, secs, millis);
                            assert_eq!(a.status, 200, "node-{d} occurrence {k}: {}", a.text);
                            assert!(a.json["Logs"].as_array().is_some_and(|l| !l.is_empty()));
                            let v = &a.json["ReturnValue"];
                            assert_eq!(v["trigger"], "azure");
                            Tick {
                                decision: v["decision"].as_str().unwrap_or("").to_string(),
                                reserved_by: v["reservedBy"].as_str().map(str::to_string),
                            }
                        };
                        (d, tick)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ran: Vec<usize> = ticks
            .iter()
            .filter(|(_, t)| t.decision == "ran")
            .map(|(d, _)| *d)
            .collect();
        assert_eq!(ran.len(), 1, "occurrence {k}: {ticks:?}");
        let runner = format!("node-{}", ran[0]);
        for (d, t) in &ticks {
            if *d != ran[0] {
                assert_eq!(t.decision, "skipped", "occurrence {k}, node-{d}: {t:?}");
                // The manual ticks (the HTTP ones here) read the reservation and name its
                // reserver; the Azure timers' find it reserved by the refused create alone.
                let named = (d % 2 == 0).then_some(runner.as_str());
                assert_eq!(t.reserved_by.as_deref(), named, "occurrence {k}, node-{d}");
            }
        }
        runners.insert(*occ, runner);
    }
    println!(
        "8 deployments x 30 occurrences: {:?} in all, {:?} per occurrence",
        started.elapsed(),
        started.elapsed() / 30
    );
    // Each occurrence reached the job exactly once, from its runner, with a token and a key.
    let posts = job_posts(&apps);
    assert_eq!(posts.len(), 30, "{posts:?}");
    let mut seen = BTreeSet::new();
    let mut last_token = 0;
    let mut by_occurrence: Vec<&Value> = posts.iter().collect();
    by_occurrence.sort_by_key(|p| p["occurrenceUnix"].as_u64());
    for p in by_occurrence {
        let occ = p["occurrenceUnix"].as_u64().unwrap();
        assert!(seen.insert(occ), "occurrence {occ} ran twice");
        assert_eq!(p["instance"], runners[&occ].as_str());
        assert_eq!(p["job"], JOB);
        let token = p["fencingToken"].as_u64().unwrap();
        assert_eq!(token, occ * 65536, "the token is the occurrence x 2^16");
        assert!(
            token > last_token,
            "tokens increase: {token} after {last_token}"
        );
        last_token = token;
        assert_eq!(p["idempotencyKey"].as_str().unwrap().len(), 32);
    }
    assert_eq!(seen, occurrences.iter().copied().collect());
    // The reservation log: the last 10, newest first, with their reservers.
    let log = call(
        "GET",
        &apps[1].url(&format!("/api/jobs/{JOB}")),
        &[TIMER_AUTH],
        b"",
    );
    assert_eq!(log.status, 200, "{}", log.text);
    let entries = log.json["reservations"].as_array().unwrap();
    assert_eq!(entries.len(), 10);
    for (i, e) in entries.iter().enumerate() {
        let occ = occurrences[29 - i];
        assert_eq!(e["occurrenceUnix"], occ, "entry {i}");
        assert_eq!(e["instance"], runners[&occ].as_str(), "entry {i}");
        assert_eq!(e["status"], "succeeded", "entry {i}");
        assert!(e["reservedAt"].as_str().unwrap().ends_with('Z'));
        assert!(e["finishedAt"].as_str().unwrap().ends_with('Z'));
    }
    // Old reservations are gone; the recent ones stay (within the retention).
    let left = reservations(&container);
    assert!(
        ancient.iter().all(|o| !left.contains(o)),
        "old reservations left: {left:?}"
    );
    assert_eq!(left.len(), 30, "{left:?}");
    // A late tick for an occurrence older than the retention is refused, whoever asks: the
    // tick token may not name it (403), the admin token (a manual run) gets 409.
    let late = tick_http_as(&apps[0], ancient[3] + 1, 0, TIMER_AUTH);
    assert_eq!(late.status, 403, "{}", late.text);
    assert_eq!(late.json["error"], "forbidden", "{}", late.text);
    let late = tick_http_as(&apps[0], ancient[3] + 1, 0, ADMIN_AUTH);
    assert_eq!(late.status, 409, "{}", late.text);
    assert_eq!(late.json["decision"], "too_old", "{}", late.text);
    let late = tick_http_as(&apps[1], ancient[5], 0, ADMIN_AUTH);
    assert_eq!(late.status, 409, "{}", late.text);
    assert_eq!(late.json["error"], "occurrence_too_old");
    let late = tick_azure(&apps[3], ancient[7], 0);
    assert_eq!(late.status, 409, "{}", late.text);
    assert_eq!(late.json["ReturnValue"]["decision"], "too_old");
    assert_eq!(job_posts(&apps).len(), 30);
    for app in &apps {
        app.assert_no_trap();
    }
}

/// The decisions of a tick that neither runs the job nor skips it naming the runner.
const RUNS_NOTHING: [&str; 4] = [
    "in_progress",
    "not_due",
    "overlapped",
    "storage_unavailable",
];

/// Two deployments on Spin's cron trigger (the real plugin, a job every 2 s), with distinct
/// instance ids, one container, and clocks 0.7 s apart (so their triggers fire 0.7 s apart),
/// run for 12 s or more: every occurrence that ran ran exactly once across both (counted at
/// each one's job webhook), at least 4 ran, both ticked most of them (one ran it, the other
/// skipped it), and the reservation log agrees.
#[test]
fn the_cron_trigger_runs_each_occurrence_once_across_two_instances() {
    let start = |id: &str, offset_ms: i64, container: Option<leasegate::ContainerName>| {
        App::start_with(
            "jobscron",
            &[("instance_id", id), ("job_period_seconds", "2")],
            Setup {
                manifest: Manifest::Cron,
                cron: vec![EVERY_2S],
                clock_offset_ms: offset_ms,
                container,
                ..Setup::default()
            },
        )
    };
    let a = start("cron-a", 0, None);
    let b = start("cron-b", 700, Some(a.container.clone()));
    let both_up = Instant::now();
    let apps = [a, b];
    let ran = |apps: &[App]| -> BTreeSet<u64> {
        job_posts(apps)
            .iter()
            .filter_map(|p| p["occurrenceUnix"].as_u64())
            .collect()
    };
    let shared = |apps: &[App]| -> usize {
        let (da, db) = (decisions(&apps[0], "cron"), decisions(&apps[1], "cron"));
        da.keys().filter(|o| db.contains_key(o)).count()
    };
    // Both running for 12 s at least, with at least 4 occurrences run and 4 ticked by both
    // (a loaded machine may start the plugin late: the deadline is generous).
    wait_for(
        "12 s of two cron instances, 4 occurrences run and ticked by both",
        Duration::from_secs(120),
        || {
            (both_up.elapsed() >= Duration::from_secs(12)
                && ran(&apps).len() >= 4
                && shared(&apps) >= 4)
                .then_some(())
        },
    );
    // The occurrences both instances had finished ticking: the strict checks are on these
    // (the instances are stopped at any moment, maybe in the middle of a later run).
    let settled: BTreeSet<u64> = {
        let (da, db) = (decisions(&apps[0], "cron"), decisions(&apps[1], "cron"));
        da.keys().filter(|o| db.contains_key(o)).copied().collect()
    };
    // No component trapped while the instances ran. (Checked before they are stopped: Spin
    // stopped in the middle of a tick cancels the host's tasks, and wasmtime-wasi may log a
    // panic of its own, `child task panicked: JoinError::Cancelled`, that is not a trap.)
    for app in &apps {
        app.assert_no_trap();
    }
    for app in &apps {
        app.spin.stop();
    }
    // Every occurrence run was run once, by one instance, with its key and token.
    let mut runs: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (app, id) in apps.iter().zip(["cron-a", "cron-b"]) {
        for r in app.sink.received().iter().filter(|r| r.path == "/job") {
            let p = &r.body;
            assert_eq!(p["instance"], id, "{p}");
            assert_eq!(p["trigger"], "cron", "{p}");
            assert_eq!(p["job"], JOB, "{p}");
            let occ = p["occurrenceUnix"].as_u64().expect("occurrenceUnix");
            assert_eq!(occ % 2, 0, "an occurrence is a multiple of the period: {p}");
            assert_eq!(p["fencingToken"].as_u64(), Some(occ * 65536), "{p}");
            assert_eq!(p["idempotencyKey"].as_str().map(str::len), Some(32), "{p}");
            runs.entry(occ).or_default().push(id.to_string());
        }
    }
    let twice: Vec<_> = runs.iter().filter(|(_, by)| by.len() != 1).collect();
    assert!(
        twice.is_empty(),
        "occurrences run more than once: {twice:?}"
    );
    assert!(runs.len() >= 4, "{runs:?}");
    // Every tick came to `ran` or `skipped`, or to an answer that runs nothing (the plugin
    // fires a moment early or twice for one occurrence, and a run of the occurrence before
    // may still hold the job's lease; docs/timer-functions.md step 3: `in_progress`, the
    // lease held by this occurrence's run or just taken, its claim not written yet;
    // `not_due`, a tick ahead of its occurrence while an earlier run holds the lease;
    // `overlapped`, recorded `skipped_overlap`; `storage_unavailable`, a storage request
    // failed), and every `ran` has its job POST, from that instance.
    let decisions = [decisions(&apps[0], "cron"), decisions(&apps[1], "cron")];
    for (d, id) in decisions.iter().zip(["cron-a", "cron-b"]) {
        for (occ, ticks) in d {
            // (An instance may tick an occurrence twice: the plugin was seen firing twice
            // for one occurrence at start. The second tick must not run it again.)
            let ran = ticks.iter().filter(|(d, _)| d == "ran").count();
            assert!(ran <= 1, "{id} ran {occ} {ran} times: {ticks:?}");
            for (decision, _) in ticks {
                assert!(
                    ["ran", "skipped"].contains(&decision.as_str())
                        || RUNS_NOTHING.contains(&decision.as_str()),
                    "{id}, occurrence {occ}: {ticks:?}"
                );
                if decision == "ran" {
                    assert_eq!(runs.get(occ), Some(&vec![id.to_string()]), "{id} ran {occ}");
                }
            }
        }
    }
    // Where both instances ticked an occurrence, one ran it and the other skipped it (on time:
    // naming nobody, the refused create its one request; a late tick reads first and names the
    // runner); or its reserver's tick failed closed and nobody ran it.
    for occ in &settled {
        let all: Vec<&(String, Option<String>)> = decisions[0][occ]
            .iter()
            .chain(decisions[1][occ].iter())
            .collect();
        let ran: Vec<_> = all.iter().filter(|(d, _)| d == "ran").collect();
        let failed_closed = all.iter().any(|(d, _)| RUNS_NOTHING.contains(&d.as_str()));
        if ran.is_empty() && failed_closed {
            assert!(!runs.contains_key(occ), "occurrence {occ}: {all:?}");
            continue;
        }
        assert_eq!(ran.len(), 1, "occurrence {occ}: {all:?}");
        let runner = runs.get(occ).map(|by| by[0].clone());
        assert!(
            runner.is_some(),
            "occurrence {occ} ran, no job POST: {all:?}"
        );
        for (d, by) in &all {
            if d == "skipped" && by.is_some() {
                assert_eq!(by, &runner, "occurrence {occ}: {all:?}");
            }
        }
    }
    assert!(settled.len() >= 4, "ticked by both: {settled:?}");
    // The reservation log (the last 10) names the runner of each settled run it holds.
    let log = stored_log(&apps[0].container);
    let entries = log["entries"].as_array().expect("entries");
    let mut in_log = BTreeSet::new();
    for e in entries {
        let occ = e["occurrenceUnix"].as_u64().unwrap();
        in_log.insert(occ);
        assert_eq!(e["trigger"], "cron", "{e}");
        if settled.contains(&occ) {
            assert_eq!(e["instance"], runs[&occ][0].as_str(), "{e}");
            assert_eq!(e["status"], "succeeded", "{e}");
        }
    }
    let oldest_logged = in_log.first().copied().unwrap_or(u64::MAX);
    let missing: Vec<&u64> = settled
        .iter()
        .filter(|o| **o >= oldest_logged && !in_log.contains(o))
        .collect();
    assert!(
        missing.is_empty(),
        "runs not in the log: {missing:?}\n{log}"
    );
    let both = settled.len();
    println!(
        "cron: {} occurrences run once each, {both} ticked by both",
        runs.len()
    );
}

/// Storage refused, 503 or slow: the tick answers an error and the job does not run; the next
/// occurrence runs normally. Also the round trips and time of a tick, winner and others.
#[test]
fn storage_faults_fail_the_tick_and_the_next_occurrence_runs() {
    let app = App::start_with(
        "jobfault",
        &[
            ("instance_id", "node-f"),
            ("storage_timeout_ms", "1000"),
            ("job_early_seconds", "7200"),
        ],
        Setup {
            manifest: Manifest::Azure,
            ..Setup::default()
        },
    );
    let tick = |occ: u64| {
        call(
            "POST",
            &app.url(&format!("/api/jobs/{JOB}/tick")),
            &[ADMIN_AUTH, ("content-type", "application/json")],
            json!({"at": rfc3339_millis(occ, 0)}).to_string().as_bytes(),
        )
    };
    let base = (unix_now() / 60 + 5) * 60;
    for (i, fault) in [
        Fault::Refuse,
        Fault::Status(503),
        Fault::Delay(Duration::from_secs(3)),
    ]
    .into_iter()
    .enumerate()
    {
        let occ = base + 60 * i as u64;
        app.storage.set_fault(Some(fault.clone()));
        let a = tick(occ);
        assert_eq!(a.status, 503, "{fault:?}: {}", a.text);
        assert_eq!(a.json["error"], "storage_unavailable", "{fault:?}");
        assert_eq!(a.headers.get("retry-after").map(String::as_str), Some("1"));
        let azure = tick_azure(&app, occ, 0);
        assert_eq!(azure.status, 503, "{fault:?}: {}", azure.text);
        assert_eq!(azure.json["ReturnValue"]["error"], "storage_unavailable");
        app.storage.set_fault(None);
        assert_eq!(
            job_posts(std::slice::from_ref(&app)).len(),
            i,
            "{fault:?}: the job ran"
        );
        // The next occurrence runs normally.
        let next = tick(occ + 30 * 60);
        assert_eq!(next.status, 200, "{}", next.text);
        assert_eq!(next.json["decision"], "ran", "{}", next.text);
        assert_eq!(job_posts(std::slice::from_ref(&app)).len(), i + 1);
    }
    // Round trips and time: a winner, then another instance's tick for the same occurrence, on
    // a container where every occurrence so far had a winner (the scattered manual runs above
    // leave gaps that a winner reads its way through, a few per tick).
    let deployment = |instance: &str, container: Option<leasegate::ContainerName>| {
        App::start_with(
            "jobtrips",
            &[("instance_id", instance), ("job_early_seconds", "7200")],
            Setup {
                manifest: Manifest::Azure,
                container,
                ..Setup::default()
            },
        )
    };
    let app = deployment("node-f", None);
    let other = deployment("node-g", Some(app.container.clone()));
    let tick = |occ: u64| tick_http(&app, occ, 0);
    let occ = base + 3600;
    // The counted run moves the clean-up watermark (the clock minus the retention, 1 h by
    // default) across no multiple of the clean-up stride (16 periods of 60 s): it lists no
    // reservations.
    leasegate_tests::jobs::clear_of_a_clean_up(3600, 960, 30);
    assert_eq!(tick(occ - 60).json["decision"], "ran");
    let started = Instant::now();
    let (won, won_trips) = app.storage_requests(|| tick(occ));
    let won_time = started.elapsed();
    assert_eq!(won.json["decision"], "ran", "{}", won.text);
    let started = Instant::now();
    let (skipped, skipped_trips) = other.storage_requests(|| tick_http(&other, occ, 0));
    let skipped_time = started.elapsed();
    assert_eq!(skipped.json["decision"], "skipped", "{}", skipped.text);
    assert_eq!(skipped.json["reservedBy"], "node-f");
    assert_eq!(won.json["storageRoundTrips"], won_trips);
    assert_eq!(skipped.json["storageRoundTrips"], skipped_trips);
    // Reserve (1), the log's read (1), the job's lease from the state the log keeps (1: a
    // record and its claim in one write), the outcome `running` on the reservation (1), the
    // log's write (1), the release at the ETag the acquire left (1), the log at the ETag its
    // first write left (1), the outcome after the job (1); no clean-up listing (the watermark
    // crossed no multiple of half the retention).
    assert_eq!(won_trips, 8, "{}", won.text);
    assert_eq!(skipped_trips, 2, "reserve (refused) + read the reserver");
    println!(
        "tick: winner {won_trips} storage requests in {won_time:?}; other {skipped_trips} in {skipped_time:?}"
    );
}

/// A run still going when the next occurrence fires: skipped (and logged) by default; with
/// `job_overlap = allow`, both run.
#[test]
fn overlapping_runs_are_skipped_or_allowed_on_purpose() {
    for (policy, want) in [("skip", "overlapped"), ("allow", "ran")] {
        let app = App::start_with(
            "overlap",
            &[
                ("instance_id", "node-o"),
                ("job_overlap", policy),
                ("job_timeout_seconds", "20"),
                ("job_early_seconds", "7200"),
            ],
            Setup {
                manifest: Manifest::Azure,
                ..Setup::default()
            },
        );
        app.sink
            .behave(Behaviour::Late(Duration::from_secs(3), 204));
        // Two occurrences that are both due (past ones, run by hand): nothing is skipped
        // before it is due.
        let base = (unix_now() / 60 - 5) * 60;
        let tick = |occ: u64| {
            call(
                "POST",
                &app.url(&format!("/api/jobs/{JOB}/tick")),
                &[ADMIN_AUTH, ("content-type", "application/json")],
                json!({"at": rfc3339_millis(occ, 0)}).to_string().as_bytes(),
            )
        };
        let (slow, second) = std::thread::scope(|s| {
            let slow = s.spawn(|| tick(base));
            // Wait until the first run is at the job's webhook.
            leasegate_tests::wait_for(
                "the first run to call the job",
                Duration::from_secs(10),
                || (!app.sink.received().is_empty()).then_some(()),
            );
            let second = tick(base + 60);
            (slow.join().unwrap(), second)
        });
        assert_eq!(slow.json["decision"], "ran", "{policy}: {}", slow.text);
        assert_eq!(second.status, 200, "{policy}: {}", second.text);
        assert_eq!(second.json["decision"], want, "{policy}: {}", second.text);
        let log = call(
            "GET",
            &app.url(&format!("/api/jobs/{JOB}")),
            &[TIMER_AUTH],
            b"",
        );
        let newest = &log.json["reservations"][0];
        assert_eq!(newest["occurrenceUnix"], base + 60);
        let status = if policy == "skip" {
            "skipped_overlap"
        } else {
            "succeeded"
        };
        assert_eq!(newest["status"], status, "{policy}: {}", log.text);
        let runs = app.sink.wait_for(
            if policy == "skip" { 1 } else { 2 },
            Duration::from_secs(10),
        );
        assert_eq!(runs.len(), if policy == "skip" { 1 } else { 2 }, "{policy}");
    }
}

/// A job that fails is reported (502; Err for cron) and logged, not retried; the next
/// occurrence runs normally.
#[test]
fn a_failed_job_is_reported_and_the_next_occurrence_runs() {
    let app = App::start_with(
        "jobfail",
        &[("instance_id", "node-x"), ("job_early_seconds", "7200")],
        Setup {
            manifest: Manifest::Azure,
            ..Setup::default()
        },
    );
    app.sink.answer(500);
    let base = (unix_now() / 60 + 5) * 60;
    let failed = tick_azure(&app, base, 0);
    assert_eq!(failed.status, 502, "{}", failed.text);
    assert_eq!(failed.json["ReturnValue"]["decision"], "failed");
    assert!(failed.json["ReturnValue"]["message"]
        .as_str()
        .unwrap()
        .contains("the job answered 500"));
    // Not retried: the same occurrence again is skipped.
    let again = tick_azure(&app, base, 500);
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["ReturnValue"]["decision"], "skipped");
    app.sink.answer(204);
    let next = tick_azure(&app, base + 60, 0);
    assert_eq!(next.json["ReturnValue"]["decision"], "ran", "{}", next.text);
    let log = call(
        "GET",
        &app.url(&format!("/api/jobs/{JOB}")),
        &[TIMER_AUTH],
        b"",
    );
    let entries = log.json["reservations"].as_array().unwrap();
    assert_eq!(entries[0]["status"], "succeeded");
    assert_eq!(entries[1]["status"], "failed");
    assert_eq!(entries[1]["reason"], "the job answered 500");
    assert_eq!(job_posts(std::slice::from_ref(&app)).len(), 2);
}

/// Bad input to every new route: clear 4xx JSON errors, nothing run, no secret in answers or
/// logs; a deployment without instance_id says so.
#[test]
fn bad_input_to_the_timer_routes_gets_clear_4xx_errors() {
    let app = App::start_with(
        "jobbad",
        &[("instance_id", "node-b")],
        Setup {
            manifest: Manifest::Azure,
            ..Setup::default()
        },
    );
    let json_ct = ("content-type", "application/json");
    let tick = format!("/api/jobs/{JOB}/tick");
    let log = format!("/api/jobs/{JOB}");
    let big = vec![b' '; 70 * 1024];
    let gate_token = ("authorization", GATE_TOKEN);
    let cases = [
        bad("POST", &tick, &[], b"", 401),
        bad("POST", &tick, &[("authorization", "Bearer nope")], b"", 401),
        bad("GET", &log, &[gate_token], b"", 401),
        // `GET /api/jobs` lists the jobs (issue 50); a tick of every job naming a time far
        // from the instance's clock is refused.
        bad(
            "POST",
            "/api/jobs",
            &[TIMER_AUTH, json_ct],
            br#"{"at": "2001-01-01T00:00:00Z"}"#,
            400,
        ),
        bad("GET", "/api/jobs/Bad_Name", &[TIMER_AUTH], b"", 400),
        bad("GET", "/api/jobs/other-job", &[TIMER_AUTH], b"", 404),
        bad("PUT", &log, &[TIMER_AUTH], b"", 405),
        bad("GET", &tick, &[TIMER_AUTH], b"", 405),
        bad("POST", &format!("{log}/nope"), &[TIMER_AUTH], b"", 404),
        bad("POST", &tick, &[TIMER_AUTH, json_ct], b"{", 400),
        bad("POST", &tick, &[TIMER_AUTH, json_ct], b"[1]", 400),
        bad("POST", &tick, &[TIMER_AUTH, json_ct], b"{\"at\":5}", 400),
        bad(
            "POST",
            &tick,
            &[TIMER_AUTH, json_ct],
            b"{\"at\":\"noon\"}",
            400,
        ),
        bad(
            "POST",
            &tick,
            &[TIMER_AUTH, json_ct],
            b"{\"when\":\"now\"}",
            400,
        ),
        bad("POST", &tick, &[TIMER_AUTH, json_ct], &big, 413),
        bad("GET", "/scheduled-job", &[], b"", 405),
        bad("POST", "/scheduled-job", &[json_ct], b"nope", 400),
        bad("POST", "/scheduled-job", &[json_ct], b"[]", 400),
        bad(
            "POST",
            "/scheduled-job",
            &[json_ct],
            br#"{"Data":{"timer":{"IsPastDue":3}}}"#,
            400,
        ),
        bad(
            "POST",
            "/scheduled-job",
            &[json_ct],
            br#"{"Metadata":{"sys":{"UtcNow":"yesterday"}}}"#,
            400,
        ),
        bad("POST", "/scheduled-job", &[json_ct], &big, 413),
    ];
    expect_clear_errors(
        &app,
        &cases,
        &[TIMER_TOKEN, GATE_TOKEN, leasegate::account::DEV_ACCOUNT_KEY],
    );
    assert!(job_posts(std::slice::from_ref(&app)).is_empty());
    // A deployment without an identity says what to set, on every path.
    let nameless = App::start_with(
        "jobnoid",
        &[("instance_id", "")],
        Setup {
            manifest: Manifest::Azure,
            ..Setup::default()
        },
    );
    let a = call("POST", &nameless.url(&tick), &[TIMER_AUTH], b"");
    assert_eq!(a.status, 503, "{}", a.text);
    assert_eq!(a.json["error"], "not_configured");
    assert!(a.json["message"]
        .as_str()
        .unwrap()
        .contains("instance_id is not set"));
    let az = tick_azure(&nameless, unix_now(), 0);
    assert_eq!(az.status, 503, "{}", az.text);
    assert!(az.json["ReturnValue"]["message"]
        .as_str()
        .unwrap()
        .contains("instance_id is not set"));
    // On Spin's cron trigger (the real plugin) the tick fails and says so in its log line.
    let cron = App::start_with(
        "jobnoidcron",
        &[("instance_id", "")],
        Setup {
            manifest: Manifest::Cron,
            cron: vec![EVERY_2S],
            ..Setup::default()
        },
    );
    let line = wait_for(
        "the cron tick to report the missing instance_id",
        Duration::from_secs(60),
        || {
            cron.json_lines()
                .into_iter()
                .find(|l| l["fn"] == "scheduled-job" && l["error"] == "not_configured")
        },
    );
    assert!(
        line["message"]
            .as_str()
            .unwrap()
            .contains("instance_id is not set"),
        "{line}"
    );
    // The plugin got the tick's Err and says so.
    wait_for(
        "the cron plugin to report the failed tick",
        Duration::from_secs(30),
        || {
            cron.log_lines().into_iter().find(|l| {
                l.contains("Component scheduled-job failed") && l.contains("instance_id is not set")
            })
        },
    );
    cron.spin.stop();
    assert!(job_posts(std::slice::from_ref(&cron)).is_empty());
    cron.assert_no_trap();
}
