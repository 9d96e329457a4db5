//! scheduled-job, as release `.wasm` served by the real `spin up`: an operator's controls
//! (admin token): `POST /api/jobs/{job}/pause` (with a note) and `/resume`, `/run` (one run
//! now, its own occurrence, trigger `manual`). While paused, ticks answer 200 `paused` and the
//! occurrence is recorded `skipped_paused`, on every deployment, and is not run later.

use std::time::Duration;

use leasegate_tests::app::{App, Setup, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::jobs::{
    calls_of, early_in_a_period, log_entry, occurrence_of, post, status, tick,
};
use leasegate_tests::{unique_container, unix_now, wait_for};

/// Two deployments of a per-5-second job. Paused (with a note) on node-a: node-b's tick
/// answers 200 `paused`, the occurrence is `skipped_paused` in the log and the counters, and
/// the job is not called; a manual run still runs (trigger `manual`). Resumed: the next
/// occurrence runs; the paused one is never run.
#[test]
fn pause_resume_and_run_now() {
    let container = unique_container("control");
    let start = |instance: &str| {
        App::start_with(
            "control",
            &[
                ("instance_id", instance),
                ("job_period_seconds", "5"),
                ("job_timeout_seconds", "5"),
            ],
            Setup {
                container: Some(container.clone()),
                ..Setup::default()
            },
        )
    };
    let (a, b) = (start("node-a"), start("node-b"));
    // Only the admin token pauses; a bad body is a clear 400 and changes nothing.
    let refused = post(&a, "pause", TIMER_AUTH, "");
    assert_eq!(refused.status, 403, "{}", refused.text);
    for body in [r#"{"why": "x"}"#, "[1]", r#"{"note": 5}"#, "not json"] {
        let (bad, sent) = a.storage_requests(|| post(&a, "pause", ADMIN_AUTH, body));
        assert_eq!(sent, 0, "{body}: storage was asked");
        assert_eq!(bad.status, 400, "{body}: {}", bad.text);
        assert_eq!(bad.json["error"], "invalid_pause", "{body}: {}", bad.text);
    }
    let long = format!(r#"{{"note": "{}"}}"#, "n".repeat(501));
    assert_eq!(post(&a, "pause", ADMIN_AUTH, &long).status, 400);
    assert_eq!(status(&a)["paused"], false);

    let paused = post(&a, "pause", ADMIN_AUTH, r#"{"note": "database migration"}"#);
    assert_eq!(paused.status, 200, "{}", paused.text);
    assert_eq!(paused.json["paused"], true, "{}", paused.text);
    assert_eq!(paused.json["note"], "database migration", "{}", paused.text);
    let t = tick(&b, TIMER_AUTH, None);
    assert_eq!(t.status, 200, "{}", t.text);
    assert_eq!(t.json["decision"], "paused", "{}", t.text);
    let skipped = occurrence_of(&t);
    assert!(
        t.json["entry"]["reason"]
            .as_str()
            .unwrap()
            .contains("database migration"),
        "{}",
        t.text
    );
    // node-a's tick of the same occurrence: settled.
    let other = tick(&a, TIMER_AUTH, Some(skipped));
    assert_eq!(other.json["decision"], "skipped", "{}", other.text);
    assert!(calls_of(&[&a, &b], skipped).is_empty());
    let s = status(&b);
    assert_eq!(s["paused"], true, "{s}");
    assert_eq!(s["pauseNote"], "database migration", "{s}");
    assert_eq!(s["counters"]["skippedPaused"], 1, "{s}");
    assert_eq!(log_entry(&b, skipped)["status"], "skipped_paused");

    // A run now, while paused: an operator's, it runs (its own occurrence, trigger manual).
    let now = post(&b, "run", ADMIN_AUTH, "");
    assert_eq!(now.status, 200, "{}", now.text);
    assert_eq!(now.json["decision"], "ran", "{}", now.text);
    assert_eq!(now.json["entry"]["trigger"], "manual", "{}", now.text);
    let manual = occurrence_of(&now);
    assert!(manual.abs_diff(unix_now()) <= 2, "{}", now.text);
    assert_eq!(calls_of(&[&a, &b], manual).len(), 1);
    assert_eq!(post(&b, "run", TIMER_AUTH, "").status, 403);
    assert_eq!(post(&b, "run", ADMIN_AUTH, r#"{"at": 1}"#).status, 400);

    let resumed = post(&b, "resume", ADMIN_AUTH, "");
    assert_eq!(resumed.status, 200, "{}", resumed.text);
    assert_eq!(resumed.json["paused"], false, "{}", resumed.text);
    wait_for("the next occurrence", Duration::from_secs(15), || {
        (unix_now() >= skipped + 5).then_some(())
    });
    let next = tick(&a, TIMER_AUTH, None);
    assert_eq!(next.json["decision"], "ran", "{}", next.text);
    assert!(occurrence_of(&next) > skipped);
    // The paused occurrence never runs, even named by an admin.
    let late = tick(&a, ADMIN_AUTH, Some(skipped));
    assert_eq!(late.json["decision"], "skipped", "{}", late.text);
    assert!(calls_of(&[&a, &b], skipped).is_empty());
    assert_eq!(status(&a)["paused"], false);
}

/// `job_overlap = buffer_one`: a run takes 12 s; the occurrence 5 s later is kept `pending`
/// (answer `buffered`), the one 10 s later is skipped (`skipped_overlap`: one buffered at
/// most); when the long run ends, its tick runs the buffered one, `pastDue`. Each ran once.
#[test]
fn buffer_one_keeps_one_occurrence_for_when_the_run_ends() {
    let app = App::start(
        "buffer",
        &[
            ("instance_id", "node-buf"),
            ("job_period_seconds", "5"),
            ("job_timeout_seconds", "20"),
            ("job_overlap", "buffer_one"),
        ],
    );
    app.sink.behave(leasegate_tests::sink::Behaviour::Late(
        Duration::from_secs(12),
        204,
    ));
    let o1 = early_in_a_period(5, 800);
    let (first, second, third) = std::thread::scope(|s| {
        let long = s.spawn(|| tick(&app, TIMER_AUTH, None));
        wait_for("o1 + 5", Duration::from_secs(10), || {
            (unix_now() >= o1 + 5).then_some(())
        });
        let second = tick(&app, TIMER_AUTH, None);
        wait_for("o1 + 10", Duration::from_secs(10), || {
            (unix_now() >= o1 + 10).then_some(())
        });
        let third = tick(&app, TIMER_AUTH, None);
        // The buffered run answers at once.
        app.sink
            .behave(leasegate_tests::sink::Behaviour::Answer(204));
        (long.join().unwrap(), second, third)
    });
    assert_eq!(occurrence_of(&first), o1, "{}", first.text);
    assert_eq!(first.json["decision"], "ran", "{}", first.text);
    assert_eq!(occurrence_of(&second), o1 + 5, "{}", second.text);
    assert_eq!(second.json["decision"], "buffered", "{}", second.text);
    assert_eq!(second.json["entry"]["status"], "pending", "{}", second.text);
    assert_eq!(occurrence_of(&third), o1 + 10, "{}", third.text);
    assert_eq!(third.json["decision"], "overlapped", "{}", third.text);
    assert_eq!(
        third.json["entry"]["status"], "skipped_overlap",
        "{}",
        third.text
    );
    // The long run's tick ran the buffered one after it.
    let ran: Vec<u64> = first.json["catchUp"]["ran"]
        .as_array()
        .unwrap_or_else(|| panic!("no catch-up: {}", first.text))
        .iter()
        .map(|e| e["occurrenceUnix"].as_u64().unwrap())
        .collect();
    assert_eq!(ran, [o1 + 5], "{}", first.text);
    let buffered = calls_of(&[&app], o1 + 5);
    assert_eq!(buffered.len(), 1);
    assert_eq!(buffered[0].body["pastDue"], true);
    assert_eq!(calls_of(&[&app], o1).len(), 1);
    assert!(calls_of(&[&app], o1 + 10).is_empty());
    assert_eq!(log_entry(&app, o1 + 5)["status"], "succeeded");
    let s = status(&app);
    assert_eq!(s["overlap"], "buffer_one", "{s}");
    assert_eq!(s["counters"]["skippedOverlap"], 1, "{s}");
    assert_eq!(s["counters"]["ran"], 2, "{s}");
}

/// A backfill runs the occurrences in its range that never ran (missed while no deployment
/// ticked, skipped while paused), oldest first, each once, `pastDue`, trigger `backfill`; a
/// second backfill of the range runs nothing. Bad ranges and bodies are a clear 400 with
/// nothing run.
#[test]
fn backfill_runs_what_never_ran_once() {
    let app = App::start(
        "backfill",
        &[("instance_id", "node-bf"), ("job_period_seconds", "5")],
    );
    let o1 = early_in_a_period(5, 800);
    let first = tick(&app, TIMER_AUTH, None);
    assert_eq!(first.json["decision"], "ran", "{}", first.text);
    // Nobody ticks o1 + 5 and o1 + 10; o1 + 15 ticks while paused.
    wait_for("o1 + 15", Duration::from_secs(30), || {
        (unix_now() >= o1 + 15).then_some(())
    });
    assert_eq!(post(&app, "pause", ADMIN_AUTH, "").status, 200);
    let paused = tick(&app, TIMER_AUTH, None);
    assert_eq!(paused.json["decision"], "paused", "{}", paused.text);
    let p = occurrence_of(&paused);
    assert_eq!(post(&app, "resume", ADMIN_AUTH, "").status, 200);
    wait_for("the next occurrence", Duration::from_secs(10), || {
        (unix_now() >= p + 5).then_some(())
    });
    early_in_a_period(5, 800);
    let next = tick(&app, TIMER_AUTH, None);
    assert_eq!(next.json["decision"], "ran", "{}", next.text);
    let last = occurrence_of(&next);
    let missed: Vec<u64> = (o1 + 5..last).step_by(5).filter(|o| *o != p).collect();
    assert_eq!(
        next.json["catchUp"]["missed"],
        missed.len(),
        "{}",
        next.text
    );

    let range = |from: u64, to: u64| {
        format!(
            r#"{{"from": "{}", "to": "{}"}}"#,
            leasegate_tests::rfc3339_secs(from),
            leasegate_tests::rfc3339_secs(to)
        )
    };
    for (body, words) in [
        (
            r#"{"from": "2026-01-01T00:00:00Z"}"#.to_string(),
            "to is required",
        ),
        (range(last, o1), "from must be at or before to"),
        (range(o1, unix_now() + 600), "to is ahead of now"),
        (
            range(unix_now() - 86_400 * 30, o1),
            "older than the retention",
        ),
        (r#"{"from": 1, "to": 2}"#.to_string(), "the body must be"),
        ("[]".to_string(), "the body must be"),
    ] {
        let (a, sent) = app.storage_requests(|| post(&app, "backfill", ADMIN_AUTH, &body));
        assert_eq!(sent, 0, "{body}: storage was asked");
        assert_eq!(a.status, 400, "{body}: {}", a.text);
        assert_eq!(a.json["error"], "invalid_backfill", "{body}: {}", a.text);
        assert!(
            a.json["message"].as_str().unwrap().contains(words),
            "{body}: {}",
            a.text
        );
    }
    assert_eq!(
        post(&app, "backfill", TIMER_AUTH, &range(o1, last)).status,
        403
    );

    let b = post(&app, "backfill", ADMIN_AUTH, &range(o1, last));
    assert_eq!(b.status, 200, "{}", b.text);
    let ran: Vec<u64> = b.json["ran"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["occurrenceUnix"].as_u64().unwrap())
        .collect();
    let mut expected = missed.clone();
    expected.push(p);
    expected.sort();
    assert_eq!(ran, expected, "{}", b.text);
    assert_eq!(b.json["more"], false, "{}", b.text);
    assert_eq!(b.json["alreadySettled"], 2, "{}", b.text);
    for o in &expected {
        let calls = calls_of(&[&app], *o);
        assert_eq!(calls.len(), 1, "{o}");
        assert_eq!(calls[0].body["trigger"], "backfill");
        assert_eq!(calls[0].body["pastDue"], true);
    }
    let again = post(&app, "backfill", ADMIN_AUTH, &range(o1, last));
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(
        again.json["ran"].as_array().unwrap().len(),
        0,
        "{}",
        again.text
    );
    for o in (o1..=last).step_by(5) {
        assert_eq!(calls_of(&[&app], o).len(), 1, "{o} ran once");
    }
}

/// Review: a retry is not an occurrence of its own. While the job is paused, an operator's run
/// now does not run a failed occurrence's retry, and a scheduled tick of it waits (the failed
/// attempt stays, not `skipped_paused`); resumed, the retry runs with the next attempt's token;
/// a backfill over it runs nothing more.
#[test]
fn a_retry_waits_for_the_resume_and_a_backfill_does_not_repeat_it() {
    let app = App::start(
        "pauseretry",
        &[
            ("instance_id", "node-pr"),
            ("job_retries", "1"),
            ("job_retry_delay_seconds", "0"),
        ],
    );
    wait_for("the start of a minute", Duration::from_secs(70), || {
        (unix_now() % 60 < 15).then_some(())
    });
    app.sink
        .behave(leasegate_tests::sink::Behaviour::Answer(500));
    let failed = tick(&app, TIMER_AUTH, None);
    assert_eq!(failed.json["decision"], "failed", "{}", failed.text);
    assert!(
        failed.json["message"]
            .as_str()
            .unwrap()
            .contains("attempt 1 of 2"),
        "{}",
        failed.text
    );
    let x = occurrence_of(&failed);
    app.sink
        .behave(leasegate_tests::sink::Behaviour::Answer(204));
    assert_eq!(post(&app, "pause", ADMIN_AUTH, "").status, 200);
    // A run now in the occurrence's own second is refused (409): it is not that occurrence.
    let mut now = post(&app, "run", ADMIN_AUTH, "");
    while now.status == 409 {
        assert_eq!(now.json["error"], "occurrence_exists", "{}", now.text);
        assert_eq!(now.headers["retry-after"], "1");
        std::thread::sleep(Duration::from_millis(300));
        now = post(&app, "run", ADMIN_AUTH, "");
    }
    assert_eq!(now.json["decision"], "ran", "{}", now.text);
    assert!(now.json.get("catchUp").is_none(), "{}", now.text);
    let calls = calls_of(&[&app], x);
    assert_eq!(
        calls.len(),
        1,
        "the retry ran while paused: {:?} {}",
        calls.iter().map(|c| c.body.to_string()).collect::<Vec<_>>(),
        now.text
    );
    let waiting = tick(&app, TIMER_AUTH, None);
    assert_eq!(occurrence_of(&waiting), x, "{}", waiting.text);
    assert_eq!(waiting.json["decision"], "skipped", "{}", waiting.text);
    assert!(
        waiting.json["reason"]
            .as_str()
            .unwrap()
            .contains("attempt 2 waits"),
        "{}",
        waiting.text
    );
    assert_eq!(log_entry(&app, x)["status"], "failed");
    assert_eq!(post(&app, "resume", ADMIN_AUTH, "").status, 200);
    let retried = tick(&app, TIMER_AUTH, None);
    assert_eq!(retried.json["decision"], "ran", "{}", retried.text);
    assert_eq!(retried.json["entry"]["attempt"], 2, "{}", retried.text);
    let calls = calls_of(&[&app], x);
    assert_eq!(calls.len(), 2);
    // Its token is above every earlier one of the job: the run now's, issued after x's first
    // attempt (tokens rise in the order runs start).
    let run_now_token = now.json["entry"]["fencingToken"].as_u64().unwrap();
    assert!(run_now_token > x << 16, "{}", now.text);
    assert_eq!(
        calls[1].body["fencingToken"].as_u64(),
        Some(run_now_token + 1),
        "{}",
        retried.text
    );
    let range = format!(
        r#"{{"from": "{0}", "to": "{0}"}}"#,
        leasegate_tests::rfc3339_secs(x)
    );
    let b = post(&app, "backfill", ADMIN_AUTH, &range);
    assert_eq!(b.status, 200, "{}", b.text);
    assert_eq!(b.json["ran"].as_array().unwrap().len(), 0, "{}", b.text);
    assert_eq!(calls_of(&[&app], x).len(), 2);
}

/// Issue 47, item 7: `POST /api/jobs/{job}/rerun` (admin token) runs one more attempt of a
/// failed occurrence whose retries are spent, and a missed one, on purpose: the same
/// idempotency key, a token above every earlier one, trigger `rerun`; then the occurrence
/// succeeded, and a rerun of it is 409. Bad bodies and the tick token are refused, nothing run.
#[test]
fn rerun_runs_a_failed_or_missed_occurrence_again() {
    const PERIOD: u64 = 3;
    let app = App::start(
        "rerun",
        &[("instance_id", "node-r"), ("job_period_seconds", "3")],
    );
    let rerun = |auth, body: &str| post(&app, "rerun", auth, body);
    let named = |o: u64| {
        format!(
            r#"{{"occurrence": "{}"}}"#,
            leasegate_tests::rfc3339_secs(o)
        )
    };
    let o1 = leasegate_tests::jobs::next_period(PERIOD, 0);
    app.sink.answer(500);
    assert_eq!(tick(&app, TIMER_AUTH, None).json["decision"], "failed");
    app.sink.answer(204);
    // A tick now answers that it settled it (failed, no retries): only a rerun runs it.
    let first_call = calls_of(&[&app], o1);
    assert_eq!(first_call.len(), 1);
    // Refused without running anything: the tick token, bad bodies, a time that is not an
    // occurrence, one ahead of now.
    for (auth, body, status) in [
        (TIMER_AUTH, named(o1), 403),
        (ADMIN_AUTH, String::new(), 400),
        (ADMIN_AUTH, r#"{"occurrence": 5}"#.to_string(), 400),
        (
            ADMIN_AUTH,
            r#"{"at": "2026-01-01T00:00:00Z"}"#.to_string(),
            400,
        ),
        (ADMIN_AUTH, named(o1 + 1), 400),
        (ADMIN_AUTH, named(unix_now() + 3600), 400),
    ] {
        let a = rerun(auth, &body);
        assert_eq!(a.status, status, "{body}: {}", a.text);
        assert!(a.json["error"].is_string(), "{body}: {}", a.text);
    }
    let again = rerun(ADMIN_AUTH, &named(o1));
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["decision"], "ran", "{}", again.text);
    assert_eq!(again.json["entry"]["attempt"], 2, "{}", again.text);
    assert_eq!(again.json["entry"]["trigger"], "rerun", "{}", again.text);
    let calls = calls_of(&[&app], o1);
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].idempotency_key, calls[0].idempotency_key);
    assert!(
        calls[1].body["fencingToken"].as_u64() > calls[0].body["fencingToken"].as_u64(),
        "{:?}",
        calls
            .iter()
            .map(|c| &c.body["fencingToken"])
            .collect::<Vec<_>>()
    );
    assert_eq!(calls[1].body["trigger"], "rerun");
    assert_eq!(log_entry(&app, o1)["status"], "succeeded");
    let done = rerun(ADMIN_AUTH, &named(o1));
    assert_eq!(done.status, 409, "{}", done.text);
    assert_eq!(done.json["error"], "occurrence_succeeded", "{}", done.text);
    // A missed one (nobody ticked it; the next winner recorded it): run once, attempt 1.
    leasegate_tests::jobs::next_period(PERIOD, o1 + PERIOD);
    let next = tick(&app, TIMER_AUTH, None);
    assert_eq!(next.json["catchUp"]["missed"], 1, "{}", next.text);
    let o2 = o1 + PERIOD;
    assert_eq!(log_entry(&app, o2)["status"], "missed");
    let missed = rerun(ADMIN_AUTH, &named(o2));
    assert_eq!(missed.json["decision"], "ran", "{}", missed.text);
    assert_eq!(missed.json["entry"]["attempt"], 1, "{}", missed.text);
    assert_eq!(calls_of(&[&app], o2).len(), 1);
    assert_eq!(log_entry(&app, o2)["status"], "succeeded");
    assert_eq!(rerun(ADMIN_AUTH, &named(o2)).status, 409);
    app.assert_no_trap();
}

/// Issue 47, item 10: pausing a paused job says so (it stays paused since the first pause, and
/// the answer names the note it replaced); resuming says whether it was paused.
#[test]
fn pausing_a_paused_job_says_what_it_replaced() {
    let app = App::start("repause", &[("instance_id", "node-p")]);
    let first = post(&app, "pause", ADMIN_AUTH, r#"{"note": "migration"}"#);
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json["alreadyPaused"], false, "{}", first.text);
    let second = post(&app, "pause", ADMIN_AUTH, r#"{"note": "still migrating"}"#);
    assert_eq!(second.json["alreadyPaused"], true, "{}", second.text);
    assert_eq!(second.json["previousNote"], "migration", "{}", second.text);
    assert_eq!(second.json["note"], "still migrating", "{}", second.text);
    assert_eq!(second.json["since"], first.json["since"], "{}", second.text);
    let resumed = post(&app, "resume", ADMIN_AUTH, "");
    assert_eq!(resumed.json["wasPaused"], true, "{}", resumed.text);
    let again = post(&app, "resume", ADMIN_AUTH, "");
    assert_eq!(again.json["wasPaused"], false, "{}", again.text);
}
