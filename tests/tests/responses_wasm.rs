//! Answers leave in one write: every component writes and finishes its body before it sets the
//! response, so a keep-alive client never waits for its own delayed ACK (the ~40 ms stall Spin
//! shows otherwise). The host records, per request, whether the body was finished at `set`;
//! each answer below, of every component, must have been. The latencies are printed.

use leasegate_tests::app::{App, GATE_TOKEN, TELEMETRY_AUTH, TIMER_AUTH};
use leasegate_tests::keepalive::KeepAlive;

/// What is asked, how, and the status it gets.
type Case<'a> = (
    &'a str,
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    &'a [u8],
    u16,
);

#[test]
fn every_component_answers_in_one_write_on_keep_alive_connections() {
    let app = App::start(
        "oneshot",
        &[
            ("instance_id", "oneshot"),
            ("ttl_containers", "oneshot-swept"),
        ],
    );
    let gate_auth = format!("Bearer {GATE_TOKEN}");
    let json = ("content-type", "application/json");
    let below = br#"{"deviceId":"calm","temperature":1}"#;
    let cases: Vec<Case> = vec![
        (
            "telemetry 401",
            "POST",
            "/api/telemetry",
            vec![],
            b"{}",
            401,
        ),
        (
            "telemetry 400",
            "POST",
            "/api/telemetry",
            vec![TELEMETRY_AUTH, json],
            b"{",
            400,
        ),
        (
            "telemetry below threshold",
            "POST",
            "/api/telemetry",
            vec![TELEMETRY_AUTH, json],
            below,
            200,
        ),
        ("gate 401", "GET", "/api/gate/k", vec![], b"", 401),
        (
            "gate GET",
            "GET",
            "/api/gate/k",
            vec![("authorization", gate_auth.as_str())],
            b"",
            200,
        ),
        ("jobs 401", "GET", "/api/jobs/example-job", vec![], b"", 401),
        (
            "jobs log",
            "GET",
            "/api/jobs/example-job",
            vec![TIMER_AUTH],
            b"",
            200,
        ),
        (
            "leader status",
            "GET",
            "/api/leader",
            vec![TIMER_AUTH],
            b"",
            200,
        ),
        (
            "init status",
            "GET",
            "/api/init/seed",
            vec![TIMER_AUTH],
            b"",
            200,
        ),
        (
            "sweeper state",
            "GET",
            "/api/sweeper",
            vec![TIMER_AUTH],
            b"",
            200,
        ),
        (
            "ttl 400",
            "PUT",
            "/api/ttl/oneshot-swept/b",
            vec![TIMER_AUTH, json],
            b"[]",
            400,
        ),
    ];
    let mut client = KeepAlive::connect(&app.host.url()[7..]).unwrap();
    for (what, method, path, headers, body, status) in &cases {
        let mut took = Vec::new();
        for _ in 0..20 {
            let reply = client.send(method, path, headers, body).unwrap();
            assert_eq!(reply.status, *status, "{what}: {}", reply.head);
            let id: u64 = reply
                .head
                .lines()
                .find_map(|l| l.strip_prefix("leasegate-host-request-id: "))
                .and_then(|v| v.trim().parse().ok())
                .expect("the host's request id");
            let record = app
                .host
                .record(id, std::time::Duration::from_secs(30))
                .unwrap();
            assert_eq!(
                record.complete_at_set,
                Some(true),
                "{what}: the response was set before its body was finished"
            );
            took.push(reply.took);
        }
        took.sort();
        println!(
            "{what:<28} keep-alive: median {:>7.2} ms, max {:>7.2} ms",
            took[took.len() / 2].as_secs_f64() * 1e3,
            took[took.len() - 1].as_secs_f64() * 1e3
        );
    }
}
