//! The host pools outbound connections per destination, as Spin does by default: a
//! component's storage requests in successive invocations reuse one keep-alive connection, and
//! a connection the server closes (saying `Connection: close`) is replaced, not reused.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasegate_tests::app::{call, App, GATE_TOKEN};

/// A keep-alive storage double: every request is a `404 BlobNotFound` (a gate nobody holds);
/// every `close_after`-th answer on a connection says `Connection: close` and ends it.
struct Server {
    origin: String,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start(close_after: usize) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, r, s) = (connections.clone(), requests.clone(), stop.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                c.fetch_add(1, Ordering::Relaxed);
                let r = r.clone();
                std::thread::spawn(move || {
                    stream.set_nonblocking(false).ok();
                    stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    for n in 1..=close_after {
                        // The head; storage requests that reach here have no body (HEAD).
                        let mut line = String::new();
                        let mut first = true;
                        loop {
                            line.clear();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" && !first {
                                break;
                            }
                            first = false;
                        }
                        r.fetch_add(1, Ordering::Relaxed);
                        let close = if n == close_after {
                            "Connection: close\r\n"
                        } else {
                            ""
                        };
                        let date = httpdate::fmt_http_date(std::time::SystemTime::now());
                        let answer = format!(
                            "HTTP/1.1 404 The specified blob does not exist.\r\n\
                             x-ms-error-code: BlobNotFound\r\nDate: {date}\r\n\
                             Content-Length: 0\r\n{close}\r\n"
                        );
                        if writer.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Server {
            origin,
            connections,
            requests,
            stop,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn read_gate(app: &App) -> u16 {
    let auth = format!("Bearer {GATE_TOKEN}");
    let a = call(
        "GET",
        &app.url("/api/gate/pooled"),
        &[("authorization", &auth)],
        b"",
    );
    assert_eq!(a.json["state"], "available", "{}", a.text);
    a.status
}

#[test]
fn storage_requests_of_successive_invocations_share_one_connection() {
    let server = Server::start(usize::MAX);
    let app = App::start("pooled", &[("storage_origin", &server.origin)]);
    for _ in 0..10 {
        assert_eq!(read_gate(&app), 200);
    }
    assert_eq!(server.requests.load(Ordering::Relaxed), 10);
    assert_eq!(server.connections.load(Ordering::Relaxed), 1);
}

#[test]
fn a_connection_the_server_closes_is_not_reused() {
    let server = Server::start(3);
    let app = App::start("pooledclose", &[("storage_origin", &server.origin)]);
    for _ in 0..9 {
        assert_eq!(read_gate(&app), 200);
    }
    assert_eq!(server.requests.load(Ordering::Relaxed), 9);
    assert_eq!(server.connections.load(Ordering::Relaxed), 3);
}
