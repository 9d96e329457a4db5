//! Each occurrence once across eight deployments (cron, Azure timer, HTTP; clocks that disagree),
//! and on the cron trigger across two instances.

use super::*;

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
