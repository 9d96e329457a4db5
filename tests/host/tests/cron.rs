//! The host's cron trigger (Spin's `trigger-cron` plugin), against the test components
//! `tests/components/cron-probe` (exports `handle-cron-event` and `wasi:http/incoming-handler`)
//! and `tests/components/cron-only-probe` (exports `handle-cron-event` only), built for
//! wasm32-wasip2 once per test process, with a local HTTP server as the probe's `probe_url`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasegate_host::{CronRecord, Host, HostConfig};

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/host sits two levels below the workspace root")
        .to_path_buf()
}

/// Builds the test components for wasm32-wasip2 in release, once per test process.
fn build_components() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let status = Command::new(env!("CARGO"))
            .current_dir(root())
            .args([
                "build",
                "--release",
                "--locked",
                "--target",
                "wasm32-wasip2",
                "-p",
                "cron-probe",
                "-p",
                "cron-only-probe",
            ])
            .status()
            .expect("run cargo to build the test components");
        assert!(status.success(), "building the test components failed");
    });
}

fn probe_manifest() -> PathBuf {
    root().join("tests/components/cron-probe/spin.toml")
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// A tiny HTTP server on 127.0.0.1: answers every request 200 `ok` and keeps its request lines.
struct ProbeServer {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProbeServer {
    fn start() -> ProbeServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the probe server");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("address").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                // Bounded: stops when the server is dropped (and at most after 10 minutes).
                let deadline = Instant::now() + Duration::from_secs(600);
                while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let requests = requests.clone();
                            std::thread::spawn(move || answer(stream, &requests));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        ProbeServer {
            port,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn authority(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("requests").clone()
    }
}

impl Drop for ProbeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request head (the probe's GETs have no body) and answers 200 `ok`.
fn answer(mut stream: TcpStream, requests: &Mutex<Vec<String>>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next().unwrap_or_default().to_string();
    requests.lock().expect("requests").push(line);
    let _ =
        stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
}

/// A GET to the host: status and body.
fn get(url_authority: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(url_authority).expect("connect to the host");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: {url_authority}\r\nconnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read the answer");
    let answer = String::from_utf8_lossy(&answer).to_string();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    (status, if chunked { dechunk(body) } else { body.into() })
}

/// A chunked body's content.
fn dechunk(mut body: &str) -> String {
    let mut content = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
        if size == 0 {
            break;
        }
        content.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    content
}

/// The probe app against `server`.
fn probe_config(server: &ProbeServer) -> HostConfig {
    build_components();
    let mut config = HostConfig::new(probe_manifest());
    config.variables = HashMap::from([
        ("probe_url".into(), format!("{}/probe", server.origin())),
        ("probe_origin".into(), server.origin()),
    ]);
    config.echo = std::env::var_os("LEASEGATE_HOST_ECHO").is_some();
    config
}

/// `name=<digits>` in the record's output.
fn field(record: &CronRecord, name: &str) -> Option<i64> {
    record.record.output.iter().find_map(|line| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
    })
}

#[test]
fn fire_cron_even_is_ok_and_odd_is_the_guests_error() {
    let server = ProbeServer::start();
    let host = Host::start(probe_config(&server)).expect("start the host");

    let even = host
        .fire_cron("cron-probe", 1_800_000_000)
        .expect("fire an event");
    assert_eq!(even.result, Ok(()), "{:?}", even.record.output);
    assert_eq!(even.timestamp(), 1_800_000_000);
    assert_eq!(even.record.method, "CRON");
    assert_eq!(even.record.path, "1800000000");
    assert_eq!(even.record.component, "cron-probe");
    assert_eq!(even.record.status, 200);
    assert_eq!(even.record.outbound.len(), 1, "{:?}", even.record.outbound);
    let out = &even.record.outbound[0];
    assert_eq!(
        (
            out.method.as_str(),
            out.authority.as_str(),
            out.path.as_str()
        ),
        ("GET", server.authority().as_str(), "/probe")
    );
    assert_eq!(even.record.outbound_to(&server.authority()), 1);
    assert_eq!(field(&even, "timestamp"), Some(1_800_000_000));
    assert!(
        even.record
            .output
            .iter()
            .any(|l| l == "cron-probe probe answered 200"),
        "{:?}",
        even.record.output
    );
    assert_eq!(server.requests(), vec!["GET /probe HTTP/1.1".to_string()]);

    let odd = host
        .fire_cron("cron-probe", 1_800_000_001)
        .expect("fire an event");
    assert_eq!(odd.result, Err("odd".to_string()));
    assert_eq!(odd.record.status, 500);
    assert_eq!(odd.record.outbound.len(), 1);
    assert_eq!(field(&odd, "timestamp"), Some(1_800_000_001));
    assert_eq!(server.requests().len(), 2);

    // Recorded like requests, in the cron list too.
    let ids: Vec<u64> = host.cron_records().iter().map(|c| c.record.id).collect();
    assert_eq!(ids, vec![even.record.id, odd.record.id]);
    assert!(host
        .records()
        .iter()
        .any(|r| r.id == odd.record.id && r.method == "CRON" && r.path == "1800000001"));
    assert!(host.wait_idle(Duration::from_secs(5)));

    // A trap is the host's error, in the result and the output.
    let trapped = host
        .fire_cron("cron-probe", u64::MAX)
        .expect("fire an event");
    let Err(failure) = &trapped.result else {
        panic!("{trapped:?}")
    };
    assert!(failure.starts_with("guest trapped: "), "{failure}");
    assert_eq!(trapped.record.status, 500);
    assert!(trapped.record.output.contains(failure), "{trapped:?}");
    assert!(trapped.record.outbound.is_empty());

    // Only components of a [[trigger.cron]] fire.
    let err = host.fire_cron("nobody", 2).unwrap_err();
    assert!(format!("{err:#}").contains("nobody"), "{err:#}");
}

#[test]
fn fire_cron_from_many_threads_on_many_hosts() {
    let server = ProbeServer::start();
    let hosts: Vec<Host> = (0..4)
        .map(|_| Host::start(probe_config(&server)).expect("start a host"))
        .collect();
    std::thread::scope(|scope| {
        for (h, host) in hosts.iter().enumerate() {
            for t in 0..3u64 {
                scope.spawn(move || {
                    for i in 0..3u64 {
                        let timestamp = 1_900_000_000 + (h as u64) * 100 + t * 10 + i;
                        let fired = host.fire_cron("cron-probe", timestamp).expect("fire");
                        let expected = if timestamp.is_multiple_of(2) {
                            Ok(())
                        } else {
                            Err("odd".to_string())
                        };
                        assert_eq!(fired.result, expected, "{:?}", fired.record.output);
                        assert_eq!(fired.timestamp(), timestamp);
                        assert_eq!(field(&fired, "timestamp"), Some(timestamp as i64));
                        assert_eq!(fired.record.outbound.len(), 1);
                    }
                });
            }
        }
    });
    for host in &hosts {
        assert_eq!(host.cron_records().len(), 9);
    }
    assert_eq!(server.requests().len(), 4 * 9);
}

#[test]
fn the_guests_wall_clock_carries_the_hosts_offset() {
    let server = ProbeServer::start();
    for offset_ms in [90_000i64, -90_000, 0] {
        let mut config = probe_config(&server);
        config.clock_offset_ms = offset_ms;
        let host = Host::start(config).expect("start the host");
        let before = now_ms();
        let fired = host.fire_cron("cron-probe", 2).expect("fire");
        let after = now_ms();
        assert_eq!(fired.result, Ok(()));
        let wall = field(&fired, "wall_ms").expect("the probe prints wall_ms");
        assert!(
            wall >= before + offset_ms - 2_000 && wall <= after + offset_ms + 2_000,
            "offset {offset_ms}: guest clock {wall}, test clock {before}..{after}"
        );
    }
}

/// Waits (up to `limit`) until `host` has recorded `count` cron events.
fn wait_for_events(host: &Host, count: usize, limit: Duration) -> Vec<CronRecord> {
    let deadline = Instant::now() + limit;
    loop {
        let records = host.cron_records();
        if records.len() >= count || Instant::now() >= deadline {
            return records;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn cron_fires_on_schedule_while_serving_and_http_still_works() {
    let server = ProbeServer::start();
    let mut config = probe_config(&server);
    config.cron = true;
    let host = Host::start(config).expect("start the host");
    let mut ahead = probe_config(&server);
    ahead.cron = true;
    ahead.clock_offset_ms = 90_000;
    let ahead = Host::start(ahead).expect("start the host ahead");

    // The same component serves HTTP.
    let (status, body) = get(&host.addr().to_string(), "/anything");
    assert_eq!((status, body.as_str()), (200, "probe"));

    for (host, offset_ms) in [(&host, 0i64), (&ahead, 90_000)] {
        let events = wait_for_events(host, 3, Duration::from_secs(20));
        assert!(events.len() >= 3, "only {} events", events.len());
        let stamps: Vec<u64> = events.iter().map(CronRecord::timestamp).collect();
        // Every second ("* * * * * *"): whole, increasing seconds, each in its own event.
        assert!(stamps.windows(2).all(|w| w[0] < w[1]), "{stamps:?}");
        for event in &events {
            let timestamp = event.timestamp();
            assert_eq!(event.record.method, "CRON");
            assert_eq!(field(event, "timestamp"), Some(timestamp as i64));
            let expected = if timestamp.is_multiple_of(2) {
                Ok(())
            } else {
                Err("odd".to_string())
            };
            assert_eq!(event.result, expected, "{:?}", event.record.output);
            // Fired at its scheduled second by the host's clock (which the guest sees), not
            // before it, and not long after.
            let wall = field(event, "wall_ms").expect("wall_ms");
            let scheduled = timestamp as i64 * 1000;
            assert!(
                wall >= scheduled && wall < scheduled + 5_000,
                "event {timestamp} ran at guest time {wall}"
            );
            let real = now_ms();
            assert!(
                (scheduled - offset_ms - real).abs() < 30_000,
                "event {timestamp}: the host's clock is {offset_ms} ms off real time {real}"
            );
        }
    }

    // Stopping the hosts stops their schedules.
    drop(host);
    drop(ahead);
    let seen = server.requests().len();
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(
        server.requests().len(),
        seen,
        "events after the hosts stopped"
    );
}

#[test]
fn a_cron_only_component_in_a_manifest_without_http_triggers() {
    build_components();
    let mut config = HostConfig::new(root().join("tests/components/cron-only-probe/spin.toml"));
    config.variables = HashMap::from([("greeting".into(), "bonjour".into())]);
    let host = Host::start(config).expect("start the host");
    assert_eq!(host.cron_triggers().len(), 1);
    assert_eq!(host.cron_triggers()[0].expression, "*/2 * * * * *");
    let fired = host.fire_cron("cron-only-probe", 7).expect("fire an event");
    assert_eq!(fired.result, Ok(()));
    assert_eq!(
        fired.record.output,
        vec!["cron-only-probe timestamp=7 greeting=bonjour".to_string()]
    );
    // No routes: every request is 404.
    let (status, _) = get(&host.addr().to_string(), "/");
    assert_eq!(status, 404);
}

/// A manifest in a fresh folder, with `body` after the header (components' sources absolute).
fn manifest(name: &str, body: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "leasegate-host-cron-{}-{name}-{}",
        std::process::id(),
        now_ms()
    ));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let path = dir.join("spin.toml");
    let probe = root().join("target/wasm32-wasip2/release/cron_probe.wasm");
    let only = root().join("target/wasm32-wasip2/release/cron_only_probe.wasm");
    let text = format!(
        "spin_manifest_version = 2\n\
         [application]\nname = \"t\"\n\
         [component.probe]\nsource = {probe:?}\n\
         [component.only]\nsource = {only:?}\n\
         [component.only.variables]\ngreeting = \"hi\"\n\
         {body}"
    );
    std::fs::write(&path, text).expect("write the manifest");
    path
}

fn start_error(path: PathBuf) -> String {
    match Host::start(HostConfig::new(&path)) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn bad_cron_triggers_fail_at_load_naming_the_entry() {
    build_components();
    let bad = start_error(manifest(
        "bad-expression",
        "[[trigger.cron]]\ncomponent = \"only\"\ncron_expression = \"0 * * * * *\"\n\
         [[trigger.cron]]\ncomponent = \"only\"\ncron_expression = \"*/2 * * *\"\n",
    ));
    assert!(
        bad.contains("[[trigger.cron]] #2") && bad.contains("\"*/2 * * *\""),
        "{bad}"
    );
    let bad = start_error(manifest(
        "bad-field",
        "[[trigger.cron]]\ncomponent = \"only\"\ncron_expression = \"0 0 25 * * *\"\n",
    ));
    assert!(bad.contains("\"0 0 25 * * *\""), "{bad}");
    let unknown = start_error(manifest(
        "unknown-component",
        "[[trigger.cron]]\ncomponent = \"ghost\"\ncron_expression = \"* * * * * *\"\n",
    ));
    assert!(unknown.contains("unknown component ghost"), "{unknown}");
    // Each trigger checks the export it calls.
    let not_http = start_error(manifest(
        "not-http",
        "[[trigger.http]]\nroute = \"/...\"\ncomponent = \"only\"\n",
    ));
    assert!(
        not_http.contains("component only is not a wasi:http component"),
        "{not_http}"
    );
    // A seventh field (the year) is accepted.
    let host = Host::start(HostConfig::new(manifest(
        "year",
        "[[trigger.cron]]\ncomponent = \"only\"\ncron_expression = \"0 0 0 1 1 * 2099\"\n",
    )))
    .expect("a seven-field expression loads");
    assert_eq!(host.fire_cron("only", 4).expect("fire").result, Ok(()));
}

/// Responses leave as in Spin: the probe answers through spin-sdk's `#[http_component]`, which
/// sets the response before it writes the body, so the host sends the head alone and the body
/// after it (two TCP segments; on a keep-alive connection the second waits for the client's
/// delayed ACK). The host records that the body was not finished at `set`; the latency and how
/// many answers arrived in two reads are printed.
#[test]
fn a_response_set_before_its_body_leaves_head_first() {
    let server = ProbeServer::start();
    let host = Host::start(probe_config(&server)).expect("start the host");
    let authority = host.url().trim_start_matches("http://").to_string();
    let mut stream = TcpStream::connect(&authority).expect("connect to the host");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let (mut took, mut split) = (Vec::new(), 0);
    for _ in 0..20 {
        let started = Instant::now();
        write!(stream, "GET /x HTTP/1.1\r\nhost: {authority}\r\n\r\n").expect("send");
        let (mut answer, mut reads) = (Vec::new(), 0);
        while !answer.ends_with(b"0\r\n\r\n") {
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).expect("read");
            assert!(n > 0, "the host closed the connection");
            answer.extend_from_slice(&buf[..n]);
            reads += 1;
        }
        took.push(started.elapsed());
        split += usize::from(reads > 1);
        let text = String::from_utf8_lossy(&answer).to_string();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        let id: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("leasegate-host-request-id: "))
            .and_then(|v| v.trim().parse().ok())
            .expect("the host's request id");
        let record = host
            .record(id, Duration::from_secs(30))
            .expect("the record");
        assert_eq!(record.complete_at_set, Some(false));
    }
    took.sort();
    println!(
        "head first: median {:.2} ms on a keep-alive connection; {split} of 20 answers arrived in two reads",
        took[10].as_secs_f64() * 1e3
    );
}
