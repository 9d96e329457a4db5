//! The load generator of `leasegate-bench` and `leasegate-soak`: one blocking `TcpStream` per
//! connection and thread, HTTP/1.1 with keep-alive, requests written in one write each (with
//! `TCP_NODELAY`), answers read whole (`Content-Length`, chunked, or up to the close). A
//! [`Connection`] sends one request at a time; a [`Cell`] (the bench's) runs a warm-up, then a
//! fixed measured time, and counts every answer that is not the expected one as an error, never
//! dropped silently. Nothing here asserts a figure.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// The largest answer head line and body read.
const MAX_LINE: u64 = 64 * 1024;
const MAX_BODY: usize = 16 << 20;
/// Unexpected answers kept per cell, to show.
const SAMPLES: usize = 3;

/// What an answer must be to count as a decision.
#[derive(Debug, Clone)]
pub struct Expect {
    /// The status.
    pub status: u16,
    /// A string the body must hold (the decision's name).
    pub body_contains: Option<&'static str>,
}

impl Expect {
    fn matches(&self, answer: &Answer) -> bool {
        answer.status == self.status
            && self.body_contains.is_none_or(|s| {
                s.is_empty() || answer.body.windows(s.len()).any(|w| w == s.as_bytes())
            })
    }
}

/// One answer, read whole.
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: u16,
    /// The body (de-chunked).
    pub body: Vec<u8>,
    /// The server closes the connection after this answer.
    close: bool,
}

/// `answer` of a [`Then`] stage: when it is `then`'s expected one, an answer `first` takes as
/// its own (its status, and the string it looks for), so that the pair counts as one decision.
fn judged_as(answer: Answer, then: &Expect, first: &Expect) -> Answer {
    if then.matches(&answer) {
        Answer {
            status: first.status,
            body: first.body_contains.unwrap_or("").as_bytes().to_vec(),
            close: answer.close,
        }
    } else {
        answer
    }
}

/// One keep-alive connection, opened on first use and again after a close or an error.
pub struct Connection {
    addr: SocketAddr,
    stream: Option<BufReader<TcpStream>>,
}

impl Connection {
    /// A connection to `addr` (not opened yet).
    pub fn new(addr: SocketAddr) -> Connection {
        Connection { addr, stream: None }
    }

    /// Writes `request` (a whole HTTP/1.1 request) and reads its answer.
    pub fn exchange(&mut self, request: &[u8]) -> io::Result<Answer> {
        if self.stream.is_none() {
            let stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(Duration::from_secs(30)))?;
            stream.set_write_timeout(Some(Duration::from_secs(30)))?;
            self.stream = Some(BufReader::with_capacity(16 * 1024, stream));
        }
        let stream = self.stream.as_mut().expect("opened above");
        let answer = stream
            .get_mut()
            .write_all(request)
            .and_then(|()| read_answer(stream));
        if answer.as_ref().map_or(true, |a| a.close) {
            self.stream = None;
        }
        answer
    }
}

/// A whole HTTP/1.1 request, in one buffer (so one write).
pub fn http_request(
    method: &str,
    target: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut out = format!("{method} {target} HTTP/1.1\r\nhost: {host}\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if method != "GET" || !body.is_empty() {
        out.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

fn read_line(r: &mut BufReader<TcpStream>) -> io::Result<String> {
    let mut line = Vec::new();
    r.by_ref().take(MAX_LINE).read_until(b'\n', &mut line)?;
    if line.last() != Some(&b'\n') {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the answer broke off",
        ));
    }
    Ok(String::from_utf8_lossy(&line).trim_end().to_string())
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

fn read_answer(r: &mut BufReader<TcpStream>) -> io::Result<Answer> {
    loop {
        let status_line = read_line(r)?;
        let mut parts = status_line.split_whitespace();
        let version = parts.next().unwrap_or("");
        if !version.starts_with("HTTP/1.") {
            return Err(bad("not an HTTP/1.x answer"));
        }
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("no status"))?;
        let mut length = None;
        let mut chunked = false;
        let mut close = version == "HTTP/1.0";
        loop {
            let line = read_line(r)?;
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                return Err(bad("a header line without a colon"));
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => {
                    length = Some(
                        value
                            .parse::<usize>()
                            .map_err(|_| bad("bad content-length"))?,
                    )
                }
                "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
                "connection" => {
                    let v = value.to_ascii_lowercase();
                    close = v.contains("close") || (close && !v.contains("keep-alive"));
                }
                _ => {}
            }
        }
        if (100..200).contains(&status) {
            continue; // an interim answer; the real one follows
        }
        let body = if chunked {
            read_chunked(r)?
        } else if let Some(n) = length {
            if n > MAX_BODY {
                return Err(bad("answer body too large"));
            }
            let mut body = vec![0; n];
            r.read_exact(&mut body)?;
            body
        } else if status == 204 || status == 304 {
            Vec::new()
        } else {
            // Delimited by the close.
            close = true;
            let mut body = Vec::new();
            r.by_ref()
                .take(MAX_BODY as u64 + 1)
                .read_to_end(&mut body)?;
            body
        };
        if body.len() > MAX_BODY {
            return Err(bad("answer body too large"));
        }
        return Ok(Answer {
            status,
            body,
            close,
        });
    }
}

fn read_chunked(r: &mut BufReader<TcpStream>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(r)?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| bad("bad chunk size"))?;
        if size == 0 {
            // Trailers, up to the empty line.
            while !read_line(r)?.is_empty() {}
            return Ok(body);
        }
        if body.len() + size > MAX_BODY {
            return Err(bad("answer body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        if !read_line(r)?.is_empty() {
            return Err(bad("a chunk without its CRLF"));
        }
    }
}

/// One cell: `connections` threads, each with its own connection, sending `request(i)` (i the
/// thread's index) back to back for `warmup` and then `measure`.
pub struct Cell<'a> {
    /// Where to connect.
    pub addr: SocketAddr,
    /// Threads, one connection each.
    pub connections: usize,
    /// Answers in this first stretch are not counted (connections open, caches fill).
    pub warmup: Duration,
    /// The measured stretch.
    pub measure: Duration,
    /// The request of thread `i`, whole (built afresh each time: signed requests carry a date).
    pub request: &'a (dyn Fn(usize) -> Vec<u8> + Sync),
    /// The answer that counts as a decision.
    pub expect: &'a Expect,
    /// A second exchange sent right after each expected answer, on the thread's own connection
    /// to another address; the decision is both, its latency theirs together (the bench's
    /// limit: a Spin answer, then a storage request, back to back).
    pub then: Option<Then<'a>>,
}

/// The second exchange of a [`Cell`] step.
#[derive(Clone, Copy)]
pub struct Then<'a> {
    /// Where to connect.
    pub addr: SocketAddr,
    /// The request of thread `i`, whole.
    pub request: &'a (dyn Fn(usize) -> Vec<u8> + Sync),
    /// Its expected answer.
    pub expect: &'a Expect,
}

/// What one cell measured.
#[derive(Debug, Default)]
pub struct Measured {
    /// Expected answers in the measured stretch.
    pub decisions: u64,
    /// The measured stretch, in seconds.
    pub seconds: f64,
    /// Latencies of the decisions, ascending.
    pub latencies: Vec<Duration>,
    /// Answers that were not the expected one, and failed exchanges.
    pub errors: u64,
    /// A few of them, described.
    pub samples: Vec<String>,
    /// Every exchange, warm-up and failures included (storage requests counted at the proxy
    /// over the same stretch are divided by this).
    pub exchanges: u64,
}

impl Measured {
    /// Decisions per second.
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.decisions as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// The nearest-rank percentile, `per_mille` of 1000 (500: p50, 990: p99).
    pub fn percentile(&self, per_mille: usize) -> Option<Duration> {
        let n = self.latencies.len();
        if n == 0 {
            return None;
        }
        let rank = (per_mille * n).div_ceil(1000).max(1);
        Some(self.latencies[rank - 1])
    }
}

impl Cell<'_> {
    /// Runs the cell and merges what its threads saw.
    pub fn run(&self) -> Measured {
        let barrier = Barrier::new(self.connections);
        let parts: Vec<Measured> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.connections)
                .map(|i| {
                    let barrier = &barrier;
                    s.spawn(move || self.thread(i, barrier))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a load thread panicked"))
                .collect()
        });
        let mut all = Measured {
            seconds: self.measure.as_secs_f64(),
            ..Measured::default()
        };
        for p in parts {
            all.decisions += p.decisions;
            all.latencies.extend(p.latencies);
            all.errors += p.errors;
            all.exchanges += p.exchanges;
            for s in p.samples {
                if all.samples.len() < SAMPLES {
                    all.samples.push(s);
                }
            }
        }
        all.latencies.sort_unstable();
        all
    }

    fn thread(&self, i: usize, barrier: &Barrier) -> Measured {
        let mut conn = Connection::new(self.addr);
        let mut then_conn = self.then.map(|t| (t, Connection::new(t.addr)));
        let mut m = Measured::default();
        barrier.wait();
        let start = Instant::now() + self.warmup;
        let end = start + self.measure;
        loop {
            let began = Instant::now();
            if began >= end {
                break;
            }
            // Building (and signing) the request is part of its latency, as in any client.
            let request = (self.request)(i);
            let mut answer = conn.exchange(&request);
            if let Some((then, then_conn)) = then_conn.as_mut() {
                if answer.as_ref().is_ok_and(|a| self.expect.matches(a)) {
                    // The second answer is the one judged: its expected answer counts for both.
                    answer = then_conn
                        .exchange(&(then.request)(i))
                        .map(|b| judged_as(b, then.expect, self.expect));
                }
            }
            let took = began.elapsed();
            let counted = began >= start;
            m.exchanges += 1;
            match answer {
                Ok(a) if self.expect.matches(&a) => {
                    if counted {
                        m.decisions += 1;
                        m.latencies.push(took);
                    }
                }
                Ok(a) => {
                    if counted {
                        m.errors += 1;
                        if m.samples.len() < SAMPLES {
                            let body = String::from_utf8_lossy(&a.body);
                            let body: String = body.chars().take(200).collect();
                            m.samples.push(format!("status {}: {body}", a.status));
                        }
                    }
                }
                Err(e) => {
                    if counted {
                        m.errors += 1;
                        if m.samples.len() < SAMPLES {
                            m.samples.push(format!("connection: {e}"));
                        }
                    }
                    // Do not spin on a refused connection.
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        m
    }
}
