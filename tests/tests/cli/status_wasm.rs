//! `leasegate status JOB` against the scheduled-job app, as release `.wasm` served by the real
//! `spin up` on Azurite: after one tick the table names the occurrence and its `succeeded` run,
//! `--json` gives the app's answer, a wrong token fails with the app's message, and an http URL
//! to another machine is refused before any request. Only what every version of
//! `GET /api/jobs/{job}` answers (`job`, `reservations`) is asserted; the unit tests of the CLI
//! cover the full answer.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use leasegate_tests::app::{cli_binary, App, TIMER_AUTH, TIMER_TOKEN};
use leasegate_tests::jobs::{occurrence_of, tick, JOB};
use serde_json::Value;

/// Runs the CLI with `token` in `LEASEGATE_TIMER_TOKEN` (and no app URL from the environment):
/// (success, stdout, stderr).
fn status(token: &str, args: &[&str]) -> (bool, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(cli_binary())
        .arg("status")
        .args(args)
        .env("LEASEGATE_TIMER_TOKEN", token)
        .env_remove("LEASEGATE_APP_URL")
        .output()
        .expect("run the CLI");
    (
        status.success(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn status_of_a_ticked_job() {
    let app = App::start(
        "clistatus",
        &[("instance_id", "node-s"), ("job_period_seconds", "5")],
    );
    // A scheduler's tick on time (a job's history begins at its first tick: a first tick
    // later than the tick tolerance runs nothing).
    leasegate_tests::jobs::next_period(5, 0);
    let ticked = tick(&app, TIMER_AUTH, None);
    assert_eq!(ticked.status, 200, "{}", ticked.text);
    let occurrence = occurrence_of(&ticked);
    let occurrence_text = ticked.json["occurrence"].as_str().unwrap().to_string();
    let base = app.url("");

    // The table: the occurrence, run here, succeeded.
    let (ok, out, err) = status(TIMER_TOKEN, &[JOB, "--app", &base]);
    assert!(ok, "{out}{err}");
    assert!(out.contains(&format!("job       {JOB}\n")), "{out}");
    assert!(out.contains("last runs (newest first):"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with(&occurrence_text))
        .unwrap_or_else(|| panic!("no row for {occurrence_text}:\n{out}"));
    assert!(row.contains("succeeded"), "{row}");
    assert!(row.contains("node-s"), "{row}");
    if out.contains("counters") {
        // A version that counts: the run is counted.
        assert!(out.contains("counters  ran 1,"), "{out}");
    }
    assert!(!out.contains(TIMER_TOKEN) && !err.contains(TIMER_TOKEN));

    // --json: the answer, parsed back.
    let (ok, out, err) = status(TIMER_TOKEN, &[JOB, "--app", &base, "--json"]);
    assert!(ok, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["job"], JOB, "{out}");
    let entry = v["reservations"]
        .as_array()
        .and_then(|e| {
            e.iter()
                .find(|e| e["occurrenceUnix"].as_u64() == Some(occurrence))
        })
        .unwrap_or_else(|| panic!("no reservation of {occurrence}: {out}"));
    assert_eq!(entry["status"], "succeeded", "{out}");

    // A wrong token: the app's refusal, exit non-zero, the token never shown.
    let wrong = "not-the-timer-token-9e2c";
    let (ok, out, err) = status(wrong, &[JOB, "--app", &base]);
    assert!(!ok, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("the app answered 401 Unauthorized: unauthorized: send Authorization"),
        "{err}"
    );
    assert!(!err.contains(wrong), "{err}");

    // An unknown job: the app's message.
    let (ok, _, err) = status(TIMER_TOKEN, &["another-job", "--app", &base]);
    assert!(!ok);
    assert!(err.contains("unknown_job"), "{err}");

    // http to another machine: refused at once, before any request, the token never shown.
    let started = Instant::now();
    let (ok, out, err) = status(TIMER_TOKEN, &[JOB, "--app", "http://example.invalid"]);
    assert!(!ok, "{out}{err}");
    assert!(
        err.contains("the token is sent only over https, or over http to this machine"),
        "{err}"
    );
    assert!(
        !out.contains(TIMER_TOKEN) && !err.contains(TIMER_TOKEN),
        "{out}{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once"
    );

    app.assert_no_trap();
}
