//! Answers leave in one write under the real `spin up`: Spin sets no `TCP_NODELAY` and streams
//! answers, so an answer whose end leaves in a second write waits for the client's delayed ACK
//! (~40 ms per answer on a keep-alive connection). An answer with a `Content-Length` (and no
//! chunking) leaves whole; every answer of every component below must carry one, and must
//! arrive in one read. The latency series (median, p90, max) are printed: a stall shows as a
//! p90 near 40 ms.

use leasegate_tests::app::{App, ADMIN_AUTH, GATE_TOKEN, TELEMETRY_AUTH, TIMER_AUTH};
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
    // Alerts once, then is throttled from the key-value cache (no storage request).
    let hot = br#"{"deviceId":"hot","temperature":99}"#;
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
        (
            "telemetry throttled (cached)",
            "POST",
            "/api/telemetry",
            vec![TELEMETRY_AUTH, json],
            hot,
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
            "ttl 403 (tick token)",
            "PUT",
            "/api/ttl/oneshot-swept/b",
            vec![TIMER_AUTH, json],
            b"[]",
            403,
        ),
        (
            "ttl 400",
            "PUT",
            "/api/ttl/oneshot-swept/b",
            vec![ADMIN_AUTH, json],
            b"[]",
            400,
        ),
    ];
    let mut client = KeepAlive::connect(&app.spin.addr().to_string()).unwrap();
    for (what, method, path, headers, body, status) in &cases {
        let mut took = Vec::new();
        let mut split = 0;
        for _ in 0..20 {
            let reply = client.send(method, path, headers, body).unwrap();
            assert_eq!(reply.status, *status, "{what}: {}", reply.head);
            let head = reply.head.to_ascii_lowercase();
            assert!(
                head.contains("\r\ncontent-length: ") && !head.contains("chunked"),
                "{what}: an answer without a Content-Length is streamed in pieces: {}",
                reply.head
            );
            if reply.reads > 1 {
                split += 1;
            }
            took.push(reply.took);
        }
        took.sort();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        println!(
            "{what:<28} keep-alive: median {:>7.2} ms, p90 {:>7.2} ms, max {:>7.2} ms, {split} of 20 in more than one read",
            ms(took[took.len() / 2]),
            ms(took[took.len() * 9 / 10]),
            ms(took[took.len() - 1])
        );
        assert_eq!(split, 0, "{what}: answers arrived in pieces");
    }
}
