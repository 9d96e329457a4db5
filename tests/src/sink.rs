//! A webhook sink: a loopback HTTP server that records the notifications posted to it and
//! answers with a status the test chooses.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request the sink received.
#[derive(Debug, Clone)]
pub struct Received {
    /// Request path.
    pub path: String,
    /// The body, parsed as JSON (`Null` if it was not JSON).
    pub body: serde_json::Value,
    /// The `Idempotency-Key` header.
    pub idempotency_key: Option<String>,
    /// The status the sink answered (0 when it answered nothing).
    pub answered: u16,
}

/// How the sink answers a request it has read (and recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Answer this status at once.
    Answer(u16),
    /// Wait, then answer this status (a webhook that acts, then answers late).
    Late(Duration, u16),
    /// Reset the connection without answering (a webhook that acts, then breaks off).
    Reset,
}

/// The sink. Dropping it stops the server.
pub struct Sink {
    port: u16,
    received: Arc<Mutex<Vec<Received>>>,
    behaviour: Arc<Mutex<Behaviour>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sink {
    /// Starts a sink on a free loopback port, answering 204.
    pub fn start() -> Sink {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the sink");
        listener.set_nonblocking(true).expect("non-blocking accept");
        let port = listener.local_addr().expect("sink address").port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let behaviour = Arc::new(Mutex::new(Behaviour::Answer(204)));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (received, behaviour, stop) = (received.clone(), behaviour.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (received, behaviour) = (received.clone(), behaviour.clone());
                            std::thread::spawn(move || serve(stream, &received, &behaviour));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        Sink {
            port,
            received,
            behaviour,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:{port}`.
    pub fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:{port}`.
    pub fn authority(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Makes the sink answer `status` from now on.
    pub fn answer(&self, status: u16) {
        self.behave(Behaviour::Answer(status));
    }

    /// Makes the sink behave so from now on.
    pub fn behave(&self, behaviour: Behaviour) {
        if let Ok(mut b) = self.behaviour.lock() {
            *b = behaviour;
        }
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Requests the sink accepted (answered 2xx): the notifications delivered.
    pub fn delivered(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| (200..300).contains(&r.answered))
            .collect()
    }

    /// Notifications delivered for `device_id`.
    pub fn for_device(&self, device_id: &str) -> Vec<Received> {
        self.delivered()
            .into_iter()
            .filter(|r| r.body["deviceId"] == device_id)
            .collect()
    }

    /// Waits until at least `n` requests arrived (or `limit` passes) and returns them all.
    pub fn wait_for(&self, n: usize, limit: Duration) -> Vec<Received> {
        let deadline = Instant::now() + limit;
        loop {
            let got = self.received();
            if got.len() >= n || Instant::now() >= deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(stream: TcpStream, received: &Mutex<Vec<Received>>, behaviour: &Mutex<Behaviour>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut length = 0usize;
    let mut idempotency_key = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.trim().eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
            if name.trim().eq_ignore_ascii_case("idempotency-key") {
                idempotency_key = Some(value.trim().to_string());
            }
        }
    }
    let mut body = vec![0; length.min(1 << 20)];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let behaviour = behaviour
        .lock()
        .map(|b| *b)
        .unwrap_or(Behaviour::Answer(204));
    let code = match behaviour {
        Behaviour::Answer(code) | Behaviour::Late(_, code) => code,
        Behaviour::Reset => 0,
    };
    if let Ok(mut r) = received.lock() {
        r.push(Received {
            path,
            body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
            idempotency_key,
            answered: code,
        });
    }
    let mut stream = stream;
    match behaviour {
        Behaviour::Reset => {
            // The request was read; the connection closes with no answer at all.
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return;
        }
        Behaviour::Late(delay, _) => std::thread::sleep(delay),
        Behaviour::Answer(_) => {}
    }
    let _ = write!(
        stream,
        "HTTP/1.1 {code} Sink\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    let _ = stream.flush();
}
