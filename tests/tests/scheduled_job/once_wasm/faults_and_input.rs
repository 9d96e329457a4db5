//! Storage faults, overlap, a failed job, bad input to the timer routes.

use super::*;

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
        &[TIMER_TOKEN, GATE_TOKEN, leasegate::DEV_ACCOUNT_KEY],
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
