//! init-once edge cases, as the release `.wasm` served by the real `spin up`, against Azurite:
//! what a caller is told when storage fails after the initialization ran.

use std::time::Duration;

use leasegate_tests::app::{call, Answer, App, TIMER_AUTH};
use leasegate_tests::proxy::Fault;
use leasegate_tests::sink::Behaviour;
use leasegate_tests::wait_for;
use serde_json::Value;

fn post(app: &App, name: &str) -> Answer {
    call(
        "POST",
        &app.url(&format!("/api/init/{name}")),
        &[TIMER_AUTH],
        b"",
    )
}

fn runs(app: &App) -> Vec<Value> {
    app.sink
        .received()
        .into_iter()
        .filter(|r| r.path == "/init")
        .map(|r| r.body)
        .collect()
}

/// The initialization ran (the action answered 2xx) and its `done` mark was written, but the
/// mark's answer was lost. The caller must not be told that nothing was run: the action did
/// run, with a fencing token the answer should name (operators and Azure's invocation log
/// read this message to decide whether a side effect happened).
#[test]
fn a_run_whose_mark_answer_is_lost_is_not_reported_as_not_run() {
    let app = App::start("initlost", &[("instance_id", "node-m")]);
    app.sink
        .behave(Behaviour::Late(Duration::from_millis(1500), 204));
    let answer = std::thread::scope(|s| {
        let h = s.spawn(|| post(&app, "seed"));
        wait_for(
            "the initialization to be called",
            Duration::from_secs(10),
            || (!runs(&app).is_empty()).then_some(()),
        );
        // The mark (a Set Metadata) lands, its answer is lost.
        app.storage.fault_on("comp=metadata", Fault::LoseAnswer);
        h.join().unwrap()
    });
    app.storage.set_fault(None);
    let runs = runs(&app);
    assert_eq!(runs.len(), 1);
    let state = call("GET", &app.url("/api/init/seed"), &[TIMER_AUTH], b"");
    assert_eq!(state.json["state"], "done", "{}", state.text);
    assert!(
        !answer.text.contains("nothing was run"),
        "{} {}",
        answer.status,
        answer.text
    );
    assert_eq!(
        answer.json["fencingToken"], runs[0]["fencingToken"],
        "{}",
        answer.text
    );
}
