//! A webhook sink: a loopback HTTP server that records the notifications posted to it and
//! answers with a status the test chooses.
//!
//! It is also a resource protected by fencing tokens ([`Fence`]): a `POST /fence` with
//! `{"key", "fencingToken", "phase": "begin"|"end", "leaseEndsAt"}` is checked per key (the
//! highest token seen, the holder working now) and answered 204, or 409 for a stale token; those
//! writes are counted in [`Sink::fence_report`], not recorded.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

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
    /// When the sink had read the request (this machine's clock).
    pub received_at: std::time::SystemTime,
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
    fence: Arc<Mutex<Fence>>,
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
        let fence = Arc::new(Mutex::new(Fence::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (received, behaviour, fence, stop) = (
                received.clone(),
                behaviour.clone(),
                fence.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (received, behaviour, fence) =
                                (received.clone(), behaviour.clone(), fence.clone());
                            std::thread::spawn(move || {
                                serve(stream, &received, &behaviour, &fence)
                            });
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
            fence,
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

    /// What the fencing check of `POST /fence` saw so far.
    pub fn fence_report(&self) -> FenceReport {
        self.fence.lock().map(|f| f.report).unwrap_or_default()
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

fn serve(
    stream: TcpStream,
    received: &Mutex<Vec<Received>>,
    behaviour: &Mutex<Behaviour>,
    fence: &Mutex<Fence>,
) {
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
    if path == "/fence" {
        let accepted = fence
            .lock()
            .map(|mut f| f.write_json(&body, SystemTime::now()))
            .unwrap_or(false);
        let code = if accepted { 204 } else { 409 };
        let mut stream = stream;
        let _ = write!(
            stream,
            "HTTP/1.1 {code} Fence\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        let _ = stream.flush();
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
            received_at: std::time::SystemTime::now(),
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

/// A write's place in a holder's work on a fenced key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The holder starts working (right after it acquired).
    Begin,
    /// The holder is done (right before it releases).
    End,
}

/// What [`Fence`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FenceReport {
    /// Writes accepted.
    pub writes: u64,
    /// Holders seen: tokens higher than every earlier one of their key.
    pub holders: u64,
    /// Writes refused: their token was lower than one already seen for the key (a stale
    /// holder, whose successor has written).
    pub stale: u64,
    /// A new holder began while the previous one was still working **within its lease**: two
    /// holders at once. Never expected.
    pub overlaps: u64,
    /// A new holder began while the previous one was still working **past its lease's end**: a
    /// holder that overran its lease (its later writes are then refused as stale).
    pub overruns: u64,
    /// Bodies that were not a fence write (no key, token or phase).
    pub malformed: u64,
}

#[derive(Debug, Default)]
struct Fenced {
    highest: u64,
    /// The holder working now: its token and when its lease ends.
    working: Option<(u64, SystemTime)>,
}

/// A resource protected by fencing tokens, as `docs/protocol.md` asks of one:
/// per key it keeps the highest token seen and refuses any write with a lower one. It also
/// tells whether two holders ever worked at once: a holder begins, works and ends within its
/// lease, so a new holder beginning while the previous one has begun and not ended, before that
/// one's lease end, is an overlap.
#[derive(Debug, Default)]
pub struct Fence {
    keys: HashMap<String, Fenced>,
    report: FenceReport,
}

impl Fence {
    /// A write of `phase` by the holder of `token` on `key`, whose lease ends at `lease_ends`,
    /// arriving at `now`: `true` if accepted, `false` if refused (a stale token).
    pub fn write(
        &mut self,
        key: &str,
        token: u64,
        phase: Phase,
        lease_ends: SystemTime,
        now: SystemTime,
    ) -> bool {
        let fenced = self.keys.entry(key.to_string()).or_default();
        if token < fenced.highest {
            self.report.stale += 1;
            return false;
        }
        if token > fenced.highest {
            self.report.holders += 1;
            if let Some((_, ends)) = fenced.working {
                if now < ends {
                    self.report.overlaps += 1;
                } else {
                    self.report.overruns += 1;
                }
            }
            fenced.highest = token;
        }
        fenced.working = match phase {
            Phase::Begin => Some((token, lease_ends)),
            Phase::End => None,
        };
        self.report.writes += 1;
        true
    }

    /// [`Fence::write`] of a JSON body `{"key", "fencingToken", "phase", "leaseEndsAt"}`
    /// (`leaseEndsAt` RFC 3339); a body that is not one is counted malformed and refused.
    pub fn write_json(&mut self, body: &[u8], now: SystemTime) -> bool {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let phase = match v["phase"].as_str() {
            Some("begin") => Some(Phase::Begin),
            Some("end") => Some(Phase::End),
            _ => None,
        };
        let ends = v["leaseEndsAt"]
            .as_str()
            .and_then(|t| humantime::parse_rfc3339(t).ok());
        match (v["key"].as_str(), v["fencingToken"].as_u64(), phase, ends) {
            (Some(key), Some(token), Some(phase), Some(ends)) => {
                self.write(key, token, phase, ends, now)
            }
            _ => {
                self.report.malformed += 1;
                false
            }
        }
    }

    /// What it saw so far.
    pub fn report(&self) -> FenceReport {
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_refuses_stale_tokens_and_tells_overlaps_from_overruns() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut f = Fence::default();
        // Holder 10 works from 0 to 1, its lease ending at 5; holder 20 follows at 2.
        assert!(f.write("k", 10, Phase::Begin, at(5), at(0)));
        assert!(f.write("k", 10, Phase::End, at(5), at(1)));
        assert!(f.write("k", 20, Phase::Begin, at(7), at(2)));
        // Holder 10 writes late: refused.
        assert!(!f.write("k", 10, Phase::End, at(5), at(3)));
        // Holder 30 begins while 20 works within its lease: two at once.
        assert!(f.write("k", 30, Phase::Begin, at(9), at(4)));
        assert!(f.write("k", 30, Phase::End, at(9), at(5)));
        // Holder 40 begins while nobody works; holder 50 after 40's lease ended: an overrun.
        assert!(f.write("k", 40, Phase::Begin, at(10), at(6)));
        assert!(f.write("k", 50, Phase::Begin, at(20), at(11)));
        // Another key is apart; a repeated begin of the same holder is fine.
        assert!(f.write("j", 1, Phase::Begin, at(20), at(11)));
        assert!(f.write("j", 1, Phase::Begin, at(20), at(12)));
        assert_eq!(
            f.report(),
            FenceReport {
                writes: 9,
                holders: 6,
                stale: 1,
                overlaps: 1,
                overruns: 1,
                malformed: 0
            }
        );
    }

    #[test]
    fn the_sink_answers_fence_writes_and_counts_them() {
        let sink = Sink::start();
        let post = |body: &str| {
            let mut s = TcpStream::connect(sink.authority()).unwrap();
            write!(
                s,
                "POST /fence HTTP/1.1\r\nhost: sink\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            let mut answer = String::new();
            s.read_to_string(&mut answer).unwrap();
            answer.split(' ').nth(1).unwrap().parse::<u16>().unwrap()
        };
        let ends = humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(60));
        let write = |token: u64, phase: &str| {
            serde_json::json!({"key": "k", "fencingToken": token, "phase": phase,
                               "leaseEndsAt": ends.to_string()})
            .to_string()
        };
        assert_eq!(post(&write(7, "begin")), 204);
        assert_eq!(post(&write(7, "end")), 204);
        assert_eq!(post(&write(9, "begin")), 204);
        assert_eq!(post(&write(7, "end")), 409);
        assert_eq!(post("{}"), 409);
        let r = sink.fence_report();
        assert_eq!(
            (r.writes, r.holders, r.stale, r.overlaps, r.malformed),
            (3, 2, 1, 0, 1)
        );
        assert!(sink.received().is_empty(), "fence writes are not recorded");
    }
}
