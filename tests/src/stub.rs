//! A misbehaving HTTP server for tests of how the components read outbound responses: it
//! accepts any request on a free loopback port and answers it the broken way chosen at start
//! (a body that breaks off, a body far over any sane size, a body that trickles).
//!
//! The answer to a `HEAD` has no body by the rules of HTTP, so for `HEAD` requests the stub
//! either breaks the answer's head the same way ([`Heads::Misbehave`]), or answers them
//! cleanly that the blob does not exist ([`Heads::Missing`]: a 404 `BlobNotFound` with a
//! `Date`), so that a client which reads a blob's properties first goes on to a request whose
//! answer has a body.
//!
//! It serves one request per connection, and every head it completes says `Connection: close`,
//! so a client that pools connections (the host does, as Spin does) never sends a second
//! request on one.
//!
//! Every loop is bounded (by bytes, by iterations and by socket timeouts) and stops as soon as
//! the client goes away or the stub is dropped; no answer is ever held in memory whole.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How the stub answers every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// `200` with `Content-Length: 1000`, 10 bytes of body, then the connection is reset (RST:
    /// the stub closes with a byte of the request left unread). A `HEAD` request, whose answer
    /// has no body, gets half a status block and then the reset.
    ResetMidBody,
    /// Like [`Behaviour::ResetMidBody`], but the connection is closed cleanly (FIN).
    CloseMidBody,
    /// `200`, chunked, streaming zeros up to [`HUGE`] bytes (no length declared, so the
    /// client only finds out by reading), until the client goes away. A `HEAD` request gets an
    /// endless header block instead.
    HugeBody,
    /// `200` with `Content-Length:` [`HUGE`], streaming zeros until the client goes away. A
    /// `HEAD` request gets an endless header block.
    HugeDeclaredBody,
    /// `200` with `Content-Length: 1000`, then one byte of body per second. A `HEAD` request
    /// gets its status block one byte per second.
    Trickle,
}

/// How the stub answers `HEAD` requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heads {
    /// Like every other request, in the way of its [`Behaviour`] (see there).
    Misbehave,
    /// Cleanly, at once: `404`, `x-ms-error-code: BlobNotFound`, with a `Date`.
    Missing,
}

/// How much the huge answers stream at most (64 MiB).
pub const HUGE: usize = 64 << 20;

/// The body bytes [`Behaviour::ResetMidBody`] and [`Behaviour::CloseMidBody`] send before
/// breaking off.
pub const SENT_BEFORE_BREAKING: usize = 10;

/// Connections served at once at most; more are closed unanswered.
const MAX_CONNECTIONS: usize = 64;
/// The longest any one connection is served.
const CONNECTION_LIMIT: Duration = Duration::from_secs(120);
/// Socket read and write timeouts.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request (head and body) the stub reads.
const MAX_REQUEST: usize = 1 << 20;

/// One request the stub answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Method.
    pub method: String,
    /// Path without the query (which may hold a SAS).
    pub path: String,
}

/// The stub server. Dropping it stops accepting and makes every open connection give up.
pub struct Stub {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    open: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Stub {
    /// Starts a stub on a free loopback port (`127.0.0.1:0`), answering every request,
    /// `HEAD` requests included, in the way of `behaviour`.
    pub fn start(behaviour: Behaviour) -> Stub {
        Stub::start_with(behaviour, Heads::Misbehave)
    }

    /// Starts a stub on a free loopback port (`127.0.0.1:0`), answering `HEAD` requests as
    /// `heads` says and the others in the way of `behaviour`.
    pub fn start_with(behaviour: Behaviour, heads: Heads) -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the stub");
        listener.set_nonblocking(true).expect("non-blocking accept");
        let port = listener.local_addr().expect("stub address").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (seen, stop, open) = (seen.clone(), stop.clone(), open.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                                open.fetch_sub(1, Ordering::SeqCst);
                                continue;
                            }
                            let (seen, stop, open) = (seen.clone(), stop.clone(), open.clone());
                            std::thread::spawn(move || {
                                serve(stream, behaviour, heads, &seen, &stop);
                                open.fetch_sub(1, Ordering::SeqCst);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        Stub {
            port,
            seen,
            open,
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

    /// Connections being served now.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// The requests answered so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a connection's request looked like.
struct Head {
    method: String,
    path: String,
    /// Bytes of the whole request (head and body).
    total: usize,
}

fn serve(
    mut stream: TcpStream,
    behaviour: Behaviour,
    heads: Heads,
    seen: &Mutex<Vec<Seen>>,
    stop: &AtomicBool,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let started = Instant::now();
    let Some(head) = peek_request(&stream, stop) else {
        return;
    };
    // Consume the request, all but its last byte when a reset is wanted: closing a socket
    // with unread data makes the kernel reset the connection instead of closing it.
    let head_only = head.method.eq_ignore_ascii_case("HEAD");
    let clean = head_only && heads == Heads::Missing;
    let keep_unread = usize::from(behaviour == Behaviour::ResetMidBody && !clean);
    if discard(&mut stream, head.total - keep_unread).is_err() {
        return;
    }
    if let Ok(mut s) = seen.lock() {
        s.push(Seen {
            method: head.method.clone(),
            path: head.path.split('?').next().unwrap_or("").to_string(),
        });
    }
    let alive = || !stop.load(Ordering::Relaxed) && started.elapsed() < CONNECTION_LIMIT;
    if clean {
        let _ = write!(
            stream,
            "HTTP/1.1 404 The specified blob does not exist.\r\n\
             x-ms-error-code: BlobNotFound\r\nDate: {}\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n",
            http_date(SystemTime::now())
        );
        let _ = stream.flush();
        return;
    }
    match behaviour {
        Behaviour::ResetMidBody | Behaviour::CloseMidBody => {
            let written = if head_only {
                stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Le")
            } else {
                stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                          Content-Length: 1000\r\nConnection: close\r\n\r\n",
                    )
                    .and_then(|()| stream.write_all(&[b'x'; SENT_BEFORE_BREAKING]))
            };
            if written.and_then(|()| stream.flush()).is_err() {
                return;
            }
            // Let the client read what was sent before the connection breaks (a reset can
            // make the peer's kernel drop data it has not read yet).
            std::thread::sleep(Duration::from_millis(300));
            if behaviour == Behaviour::CloseMidBody {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
            drop(stream);
        }
        Behaviour::HugeBody | Behaviour::HugeDeclaredBody if head_only => {
            // No body can follow a HEAD: send headers until the client gives up instead.
            let line = format!("x-pad: {}\r\n", "p".repeat(1000));
            let mut sent = 0;
            let mut ok = stream.write_all(b"HTTP/1.1 200 OK\r\n").is_ok();
            while ok && alive() && sent < HUGE {
                ok = stream.write_all(line.as_bytes()).is_ok();
                sent += line.len();
            }
        }
        Behaviour::HugeBody => {
            let zeros = [0u8; 64 << 10];
            let mut sent = 0;
            let mut ok = stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
                )
                .is_ok();
            while ok && alive() && sent < HUGE {
                ok = write!(stream, "{:x}\r\n", zeros.len()).is_ok()
                    && stream.write_all(&zeros).is_ok()
                    && stream.write_all(b"\r\n").is_ok();
                sent += zeros.len();
            }
            if ok {
                let _ = stream.write_all(b"0\r\n\r\n");
            }
        }
        Behaviour::HugeDeclaredBody => {
            let zeros = [0u8; 64 << 10];
            let mut sent = 0;
            let mut ok = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {HUGE}\r\nConnection: close\r\n\r\n"
            )
            .is_ok();
            while ok && alive() && sent < HUGE {
                ok = stream.write_all(&zeros).is_ok();
                sent += zeros.len();
            }
        }
        Behaviour::Trickle => {
            let slow: &[u8] = if head_only {
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            } else {
                &[b'x'; 1000]
            };
            let mut ok = head_only
                || stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n",
                    )
                    .and_then(|()| stream.flush())
                    .is_ok();
            for byte in slow {
                if !ok || !alive() {
                    break;
                }
                ok = stream
                    .write_all(std::slice::from_ref(byte))
                    .and_then(|()| stream.flush())
                    .is_ok();
                sleep_unless_stopped(Duration::from_secs(1), stop);
            }
        }
    }
}

/// Waits until a whole request is in the socket's receive queue and describes it, without
/// consuming anything.
fn peek_request(stream: &TcpStream, stop: &AtomicBool) -> Option<Head> {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut buf = vec![0u8; 64 << 10];
    let mut last = 0;
    loop {
        let n = stream.peek(&mut buf).ok()?;
        if n == 0 || stop.load(Ordering::Relaxed) || Instant::now() > deadline {
            return None;
        }
        if let Some(end) = find(&buf[..n], b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&buf[..end]);
            let mut lines = text.split("\r\n");
            let mut first = lines.next()?.split_whitespace();
            let method = first.next()?.to_string();
            let path = first.next().unwrap_or("/").to_string();
            let length: usize = lines
                .filter_map(|l| l.split_once(':'))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse().ok())
                .unwrap_or(0);
            let total = end + 4 + length.min(MAX_REQUEST);
            // A body larger than the peek buffer is read (and discarded) as it comes.
            if n >= total || n == buf.len() {
                return Some(Head {
                    method,
                    path,
                    total,
                });
            }
        } else if n == buf.len() {
            return None;
        }
        if n == last {
            std::thread::sleep(Duration::from_millis(5));
        }
        last = n;
    }
}

/// Reads and drops `n` bytes.
fn discard(stream: &mut TcpStream, n: usize) -> std::io::Result<()> {
    let mut left = n;
    let mut buf = [0u8; 16 << 10];
    while left > 0 {
        let want = left.min(buf.len());
        stream.read_exact(&mut buf[..want])?;
        left -= want;
    }
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `Tue, 21 Nov 2026 14:00:00 GMT` (RFC 9110's IMF-fixdate).
fn http_date(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = secs / 86_400;
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {day:02} {} {year} {h:02}:{m:02}:{s:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize]
    )
}

fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let until = Instant::now() + d;
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(stub: &Stub, method: &str) -> TcpStream {
        let mut s = TcpStream::connect(stub.authority()).expect("connect to the stub");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "{method} /c/b?comp=lease HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        )
        .unwrap();
        s
    }

    fn read_until_error(s: &mut TcpStream, limit: usize) -> (Vec<u8>, std::io::Result<()>) {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return (got, Ok(())),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return (got, Err(e)),
            }
            if got.len() >= limit {
                return (got, Ok(()));
            }
        }
    }

    #[test]
    fn reset_mid_body_resets_after_ten_bytes() {
        let stub = Stub::start(Behaviour::ResetMidBody);
        let mut s = request(&stub, "PUT");
        let (got, end) = read_until_error(&mut s, 1 << 20);
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("Content-Length: 1000\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\nxxxxxxxxxx"), "{text}");
        let e = end.expect_err("a reset, not a clean end");
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
        assert_eq!(
            stub.seen(),
            vec![Seen {
                method: "PUT".into(),
                path: "/c/b".into()
            }]
        );
    }

    #[test]
    fn close_mid_body_closes_after_ten_bytes() {
        let stub = Stub::start(Behaviour::CloseMidBody);
        let mut s = request(&stub, "POST");
        let (got, end) = read_until_error(&mut s, 1 << 20);
        assert!(end.is_ok(), "{end:?}");
        assert!(String::from_utf8_lossy(&got).ends_with("\r\n\r\nxxxxxxxxxx"));
    }

    #[test]
    fn heads_can_be_answered_missing() {
        let stub = Stub::start_with(Behaviour::ResetMidBody, Heads::Missing);
        let mut s = request(&stub, "HEAD");
        let (got, end) = read_until_error(&mut s, 1 << 20);
        assert!(end.is_ok(), "{end:?}");
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 404 "), "{text}");
        assert!(
            text.contains("\r\nx-ms-error-code: BlobNotFound\r\n"),
            "{text}"
        );
        let date = text
            .lines()
            .find_map(|l| l.strip_prefix("Date: "))
            .expect("a Date");
        assert!(date.ends_with(" GMT") && date.len() == 29, "{date}");
    }

    #[test]
    fn http_dates() {
        assert_eq!(
            http_date(SystemTime::UNIX_EPOCH),
            "Thu, 01 Jan 1970 00:00:00 GMT"
        );
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_269_600);
        assert_eq!(http_date(t), "Sat, 21 Nov 2026 14:00:00 GMT");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_868_799);
        assert_eq!(http_date(leap), "Tue, 29 Feb 2000 23:59:59 GMT");
    }

    #[test]
    fn huge_bodies_stop_when_the_client_goes_away() {
        for behaviour in [Behaviour::HugeBody, Behaviour::HugeDeclaredBody] {
            let stub = Stub::start(behaviour);
            let mut s = request(&stub, "GET");
            let (got, _) = read_until_error(&mut s, 1 << 20);
            assert!(got.len() >= 1 << 20, "{behaviour:?}");
            assert_eq!(stub.open_connections(), 1);
            drop(s);
            let deadline = Instant::now() + Duration::from_secs(5);
            while stub.open_connections() > 0 {
                assert!(Instant::now() < deadline, "{behaviour:?}: still writing");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
