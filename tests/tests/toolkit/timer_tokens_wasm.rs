//! The timer functions' two tokens, as release `.wasm` served by the real `spin up`: the tick
//! token (what a scheduler needs) ticks and reads; marking blobs, resetting an initialization,
//! a leader's step-down and a manual run of a past occurrence need the admin token; with no
//! admin token (or one equal to the tick token) those routes refuse to serve.

use std::time::SystemTime;

use leasegate::lease::Locks;
use leasegate::ops::{Condition, CreateContainer, PutBlob};
use leasegate::{BlobName, ContainerName};
use leasegate_cli::{block_on, NativeTransport};
use leasegate_tests::app::{
    call, expect_clear_errors, App, BadCase, ADMIN_AUTH, ADMIN_TOKEN, TIMER_AUTH, TIMER_TOKEN,
};
use leasegate_tests::jobs::runs;
use leasegate_tests::{rfc3339_secs as rfc3339, unix_now};
use leasegate_tests::{unique_container, Azurite};
use serde_json::json;

const JOB: &str = "example-job";

fn create_blob(container: &ContainerName, name: &str) {
    let locks = Locks::new(
        NativeTransport::default(),
        Azurite::shared().account(),
        container.clone(),
    );
    let _ = block_on(locks.client().execute(
        &CreateContainer {
            container: container.clone(),
        },
        SystemTime::now(),
    ));
    block_on(
        locks.client().execute(
            &PutBlob::block(
                container.clone(),
                BlobName::try_new(name).unwrap(),
                b"data".to_vec(),
            )
            .with_condition(Condition::IfNotExists),
            SystemTime::now(),
        ),
    )
    .unwrap();
}

/// The destructive routes of the four timer functions, as `(method, path, body)`.
fn destructive(data: &ContainerName, past: u64) -> Vec<(&'static str, String, Vec<u8>)> {
    vec![
        (
            "PUT",
            format!("/api/ttl/{}/old.txt", data.as_str()),
            json!({"ttlSeconds": 3600}).to_string().into_bytes(),
        ),
        ("DELETE", "/api/init/example-init".into(), Vec::new()),
        ("DELETE", "/api/leader".into(), Vec::new()),
        (
            "POST",
            format!("/api/jobs/{JOB}/tick"),
            json!({"at": rfc3339(past)}).to_string().into_bytes(),
        ),
    ]
}

/// The tick token (what a scheduler needs) ticks and reads; marking blobs, resetting an
/// initialization, a leader's step-down and a manual run of a past occurrence need the admin
/// token (403 with the tick token); with no admin token those routes refuse to serve (503
/// `not_configured` naming `admin_token`).
#[test]
fn the_tick_token_ticks_and_the_admin_token_does_the_rest() {
    let data = unique_container("ttldata");
    create_blob(&data, "old.txt");
    let vars = [
        ("instance_id", "node-adm"),
        ("ttl_containers", data.as_str()),
        ("admin_token", ADMIN_TOKEN),
    ];
    // (The harness sets ADMIN_TOKEN by default too; named here for the reader.)
    let app = App::start("admin", &vars);
    let now = unix_now();
    let past = (now - 1200) / 60 * 60;
    let json_ct = ("content-type", "application/json");
    // The tick token: 403 on each destructive route, with a JSON error, no secret anywhere.
    let cases: Vec<BadCase> = destructive(&data, past)
        .into_iter()
        .map(|(method, path, body)| BadCase {
            method,
            path,
            headers: vec![TIMER_AUTH, json_ct],
            body,
            status: 403,
        })
        .collect();
    expect_clear_errors(&app, &cases, &[TIMER_TOKEN, ADMIN_TOKEN]);
    assert!(runs(&[&app]).is_empty(), "a past occurrence ran");
    // What a scheduler needs still works with it: a tick of the occurrence due now.
    let current = unix_now();
    for (method, path, body) in [
        (
            "POST",
            format!("/api/jobs/{JOB}/tick"),
            json!({"at": rfc3339(current)}).to_string().into_bytes(),
        ),
        ("POST", format!("/api/jobs/{JOB}/tick"), Vec::new()),
        ("GET", format!("/api/jobs/{JOB}"), Vec::new()),
        ("POST", "/api/leader/tick".into(), Vec::new()),
        ("GET", "/api/leader".into(), Vec::new()),
        ("POST", "/api/init/example-init".into(), Vec::new()),
        ("GET", "/api/init/example-init".into(), Vec::new()),
        ("POST", "/api/sweeper/tick".into(), Vec::new()),
        ("GET", "/api/sweeper".into(), Vec::new()),
    ] {
        let a = call(method, &app.url(&path), &[TIMER_AUTH, json_ct], &body);
        assert!(
            a.status < 300,
            "{method} {path} with the tick token: {} {}",
            a.status,
            a.text
        );
    }
    // The admin token: each destructive route is served.
    for (method, path, body) in destructive(&data, past) {
        let a = call(method, &app.url(&path), &[ADMIN_AUTH, json_ct], &body);
        assert_eq!(
            a.status, 200,
            "{method} {path} with the admin token: {}",
            a.text
        );
    }
    assert_eq!(runs(&[&app]).get(&past), Some(&1), "the manual run");
    // A wrong token is still a 401, on every route.
    let wrong = ("authorization", "Bearer not-a-token");
    for (method, path, body) in destructive(&data, past) {
        let a = call(method, &app.url(&path), &[wrong, json_ct], &body);
        assert_eq!(a.status, 401, "{method} {path}: {}", a.text);
    }

    // No admin token: the destructive routes refuse to serve, whoever asks.
    let bare = App::start("noadmin", &[vars[0], vars[1], ("admin_token", "")]);
    for (method, path, body) in destructive(&data, past) {
        let a = call(method, &bare.url(&path), &[TIMER_AUTH, json_ct], &body);
        assert_eq!(a.status, 503, "{method} {path}: {}", a.text);
        assert_eq!(a.json["error"], "not_configured", "{}", a.text);
        assert!(
            a.json["message"]
                .as_str()
                .unwrap_or("")
                .contains("admin_token"),
            "{}",
            a.text
        );
    }
    // An admin token equal to the tick token is no admin token.
    let same = App::start(
        "sameadmin",
        &[vars[0], vars[1], ("admin_token", TIMER_TOKEN)],
    );
    let (method, path, body) = destructive(&data, past).swap_remove(2);
    let a = call(method, &same.url(&path), &[TIMER_AUTH], &body);
    assert_eq!(a.status, 503, "{method} {path}: {}", a.text);
}
