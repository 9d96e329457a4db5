//! scheduled-job, as release `.wasm` served by the real `spin up`: a job's history begins at its
//! first tick. A job deployed hours after its daily occurrence does not run that occurrence on
//! its first tick, nor records it missed (issue 47, item 4); a backfill over the time before
//! the job existed runs nothing and says so, unless the operator asks `beforeHistory` (item 5).

use leasegate_tests::app::{App, ADMIN_AUTH, TIMER_AUTH};
use leasegate_tests::jobs::{calls_of, occurrence_of, post, status, tick};
use leasegate_tests::{rfc3339_secs as rfc3339, unix_now};
use serde_json::json;

/// A daily schedule (UTC) whose occurrence was `hours_ago` hours before now, at a whole
/// minute: `M H * * *`, and that occurrence.
fn daily_schedule(hours_ago: u64) -> (String, u64) {
    let occurrence = (unix_now() - hours_ago * 3600) / 60 * 60;
    let (hour, minute) = (occurrence % 86_400 / 3600, occurrence % 3600 / 60);
    (format!("{minute} {hour} * * *"), occurrence)
}

#[test]
fn a_new_job_does_not_run_the_occurrence_due_hours_before_its_first_tick() {
    let (schedule, due) = daily_schedule(13);
    let app = App::start(
        "history",
        &[("instance_id", "node-h"), ("job_schedule", &schedule)],
    );
    // The first tick names that morning's occurrence, 13 hours late.
    let first = tick(&app, TIMER_AUTH, None);
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(occurrence_of(&first), due, "{}", first.text);
    assert_eq!(first.json["decision"], "skipped", "{}", first.text);
    let reason = first.json["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("before the job's history began"),
        "{}",
        first.text
    );
    assert!(calls_of(&[&app], due).is_empty(), "the job ran");
    // Nothing is recorded of it: no entry, nothing counted missed; the history is shown.
    let s = status(&app);
    assert_eq!(s["reservations"], json!([]), "{s}");
    assert_eq!(s["counters"]["missed"], 0, "{s}");
    assert!(s["historyFrom"].is_string(), "{s}");
    // Ticked again, on another deployment too: still nothing.
    let again = tick(&app, TIMER_AUTH, None);
    assert_eq!(again.json["decision"], "skipped", "{}", again.text);
    assert!(calls_of(&[&app], due).is_empty());

    // A backfill of the day before the first tick runs nothing and says what it clamped.
    let range = json!({"from": rfc3339(due - 60), "to": rfc3339(unix_now() - 1)}).to_string();
    let clamped = post(&app, "backfill", ADMIN_AUTH, &range);
    assert_eq!(clamped.status, 200, "{}", clamped.text);
    assert_eq!(clamped.json["ran"], json!([]), "{}", clamped.text);
    assert_eq!(
        clamped.json["clamped"]["requestedFrom"],
        rfc3339(due - 60),
        "{}",
        clamped.text
    );
    assert_eq!(
        clamped.json["clamped"]["historyFrom"], s["historyFrom"],
        "{}",
        clamped.text
    );
    assert_eq!(clamped.json["from"], s["historyFrom"], "{}", clamped.text);
    assert!(calls_of(&[&app], due).is_empty());
    // An operator who means it: `beforeHistory` runs it, once.
    let mut meant: serde_json::Value = serde_json::from_str(&range).unwrap();
    meant["beforeHistory"] = json!(true);
    let ran = post(&app, "backfill", ADMIN_AUTH, &meant.to_string());
    assert_eq!(ran.status, 200, "{}", ran.text);
    assert_eq!(
        ran.json["ran"].as_array().map(Vec::len),
        Some(1),
        "{}",
        ran.text
    );
    assert!(ran.json.get("clamped").is_none(), "{}", ran.text);
    let calls = calls_of(&[&app], due);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].body["trigger"], "backfill");
    app.assert_no_trap();
}

/// A backfill before any tick (the job just deployed): its history has not begun, so nothing
/// is backfilled, and the answer says why.
#[test]
fn a_backfill_before_the_first_tick_runs_nothing() {
    let (schedule, due) = daily_schedule(2);
    let app = App::start(
        "nohistory",
        &[("instance_id", "node-n"), ("job_schedule", &schedule)],
    );
    let range = json!({"from": rfc3339(due - 60), "to": rfc3339(unix_now() - 1)}).to_string();
    let a = post(&app, "backfill", ADMIN_AUTH, &range);
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["ran"], json!([]), "{}", a.text);
    assert_eq!(a.json["clamped"]["historyFrom"], json!(null), "{}", a.text);
    assert!(
        a.json["clamped"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no tick has begun")),
        "{}",
        a.text
    );
    assert!(calls_of(&[&app], due).is_empty());
}
