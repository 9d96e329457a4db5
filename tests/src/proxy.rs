//! A recording, fault-injecting HTTP/1.1 proxy between the app under `spin up` and one
//! upstream (Azurite, or the webhook sink). The app is pointed at it through its Spin
//! variables (`storage_origin`, `notify_origin`, ...), so every outbound request crosses it,
//! and faults enter where they happen in production: on the network.
//!
//! It counts and records every request (method, path and query with any SAS signature
//! redacted, how it was authorized, its `x-ms-*` headers), and applies the newest matching
//! [`Fault`]: refuse (read the request, then reset the connection: storage never saw it), answer
//! a status, delay, forward and then drop the answer (the "lost answer": storage acted, the
//! caller cannot know), or forward and break the answer's body. Faults can also be drawn at
//! random, each kind on a share of the requests ([`Proxy::set_random_faults`]: a soak's
//! "refuse 2 %, 503 on 2 %, ..."), and a long run can keep counts only
//! ([`Proxy::set_recording`]).
//!
//! Spin pools outbound connections, so a fault reaches connections that are already open too:
//! every fault acts per request, never per connection. Each client connection is served by
//! its own thread over its own upstream connection; every read has a timeout and every loop a
//! bound, and dropping the proxy stops it.
//!
//! [`Proxy::start_tls`] starts the same proxy with a listener that speaks TLS (the server
//! certificate of [`crate::tls::TestCa`], for `localhost` and `127.0.0.1`); the upstream stays
//! plain HTTP. [`Proxy::start_to_tls`] and [`Proxy::start_tls_to_tls`] reach their upstream over
//! TLS instead (trusting only the test CA, server name `localhost`): an Azurite with `--oauth
//! basic` ([`crate::Azurite::start_oauth`]) serves HTTPS only. Every listener kind serves a
//! connection with the same code, over any [`ClientStream`], and every upstream kind is read
//! and written the same way ([`UpstreamStream`]), so every fault works on each.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::ServerName;
use rustls::{ClientConnection, ServerConnection, StreamOwned};

/// What the proxy does to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Read the request, forward nothing, reset the connection: to the caller a refused or
    /// broken connection; the upstream never sees the request.
    Refuse,
    /// Answer this status without forwarding (503 carries `x-ms-error-code: ServerBusy`; every
    /// answer has a `Date`).
    Status(u16),
    /// Answer this status with this `x-ms-error-code` without forwarding (a 403
    /// `AuthorizationPermissionMismatch`: the identity has no role; Azurite has no RBAC).
    Error(u16, &'static str),
    /// Wait this long, then forward.
    Delay(Duration),
    /// Wait this long, then answer this status with this `x-ms-error-code` without forwarding
    /// (a slow `412 ConditionNotMet`: contention on a record, on a slow storage).
    LateError(Duration, u16, &'static str),
    /// Forward, read the whole answer, then reset the connection instead of passing it on: the
    /// upstream acted, the caller cannot know.
    LoseAnswer,
    /// Forward, pass the answer's head and the first half of its body (at least one byte is
    /// held back), then reset the connection.
    BreakBody,
}

/// One request that reached the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Method.
    pub method: String,
    /// Path and query, with any `sig=` value replaced by `REDACTED`.
    pub target: String,
    /// How it was authorized (never the credential): `SharedKey`, `Bearer`, `SAS` (a `sig=` in
    /// the query) or `none`.
    pub auth: &'static str,
    /// Its `x-ms-*` headers and its conditions (`if-match`, `if-none-match`), names
    /// lowercased, in the order sent.
    pub ms_headers: Vec<(String, String)>,
    /// When it arrived.
    pub at: SystemTime,
    /// The fault applied to it, if any.
    pub fault: Option<Fault>,
}

impl Seen {
    /// The path without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The value of an `x-ms-*` header, `if-match` or `if-none-match`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.ms_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `lease acquire` for a lease request, else `METHOD comp` (`HEAD`, `PUT metadata`).
    pub fn describe(&self) -> String {
        if let Some(action) = self.header("x-ms-lease-action") {
            return format!("lease {action}");
        }
        let comp = self
            .target
            .split_once('?')
            .map(|(_, q)| q)
            .unwrap_or("")
            .split('&')
            .find_map(|p| p.strip_prefix("comp="))
            .unwrap_or("");
        format!("{} {comp}", self.method).trim().to_string()
    }
}

/// The fault the newest rule matching `line` applies to it, counting the rule's passes and uses.
/// A rule that lets this request pass (its `skip`) still stands in front of the older ones: the
/// request gets no fault.
fn ruled_fault(rules: &mut Rules, line: &str) -> Option<Fault> {
    let k = rules
        .iter()
        .position(|r| r.part.as_ref().is_none_or(|p| line.contains(p.as_str())))?;
    let rule = &mut rules[k];
    if rule.skip > 0 {
        rule.skip -= 1;
        return None;
    }
    let fault = rule.fault.clone();
    if let Some(left) = rule.times.as_mut() {
        *left -= 1;
        if *left == 0 {
            rules.remove(k);
        }
    }
    Some(fault)
}

/// How long one connection is served at most, and one read or write may wait.
const CONNECTION_LIMIT: Duration = Duration::from_secs(300);
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest head and body the proxy reads.
const MAX_HEAD: usize = 64 << 10;
const MAX_BODY: usize = 64 << 20;
/// Connections served at once at most; more are closed unanswered.
const MAX_CONNECTIONS: usize = 256;

/// The faults set by rule, newest first.
type Rules = Vec<Rule>;

/// A fault set by rule.
struct Rule {
    /// The part of `METHOD target` it matches (`None`: every request).
    part: Option<String>,
    fault: Fault,
    /// Matching requests it lets pass before it applies.
    skip: usize,
    /// How many more matching requests it applies to (`None`: all); then it is gone.
    times: Option<usize>,
}

struct Shared {
    upstream: SocketAddr,
    seen: Mutex<Vec<Seen>>,
    /// Record each request in `seen` (else only count it).
    recording: AtomicBool,
    /// Requests that arrived, recorded or not.
    arrived: AtomicUsize,
    rules: Mutex<Rules>,
    /// Faults drawn at random for a request no rule matches: each with its probability.
    chances: Mutex<Vec<(Fault, f64)>>,
    /// How many times each fault was applied.
    applied: Mutex<Vec<(Fault, usize)>>,
    open: Mutex<usize>,
    /// Requests read and not yet answered (or reset), and the most at once since the last
    /// [`Proxy::reset_peak`].
    flight: Mutex<(usize, usize)>,
    stop: AtomicBool,
    /// The listener speaks TLS with this configuration; `None`: plain HTTP.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// The upstream is reached over TLS with this configuration; `None`: plain HTTP.
    upstream_tls: Option<Arc<rustls::ClientConfig>>,
}

/// One request in flight at the proxy, from when it was read until its answer was passed on
/// (or its connection reset).
struct InFlight<'a>(&'a Shared);

impl<'a> InFlight<'a> {
    fn start(shared: &'a Shared) -> InFlight<'a> {
        let mut f = shared.flight.lock().expect("flight");
        f.0 += 1;
        f.1 = f.1.max(f.0);
        InFlight(shared)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut f) = self.0.flight.lock() {
            f.0 = f.0.saturating_sub(1);
        }
    }
}

/// The proxy. Dropping it stops accepting and ends every connection it serves.
pub struct Proxy {
    port: u16,
    tls: bool,
    upstream_tls: bool,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port in front of `upstream` (`127.0.0.1:port`).
    pub fn start(upstream: &str) -> Proxy {
        Proxy::start_with(upstream, None, None)
    }

    /// Starts a proxy like [`Proxy::start`] whose listener speaks TLS, with the server
    /// certificate of this process's [`crate::tls::TestCa`] (for `localhost` and `127.0.0.1`);
    /// it forwards to `upstream` in plain HTTP. Its origin is `https://localhost:{port}`.
    pub fn start_tls(upstream: &str) -> Proxy {
        let ca = crate::tls::TestCa::shared();
        Proxy::start_with(upstream, Some(ca.server_config()), None)
    }

    /// Starts a proxy whose listener speaks plain HTTP (origin `http://127.0.0.1:{port}`, as
    /// [`Proxy::start`]) and that reaches `upstream` (`127.0.0.1:port`) over TLS, trusting only
    /// this process's [`crate::tls::TestCa`] and checking the name `localhost`: in front of
    /// [`crate::Azurite::start_oauth`] for a native client that speaks plain HTTP.
    pub fn start_to_tls(upstream: &str) -> Proxy {
        let ca = crate::tls::TestCa::shared();
        Proxy::start_with(upstream, None, Some(ca.client_config()))
    }

    /// Starts a proxy whose listener speaks TLS (origin `https://localhost:{port}`, as
    /// [`Proxy::start_tls`]) and that reaches `upstream` over TLS (as [`Proxy::start_to_tls`]):
    /// an app under `spin up` that trusts the test CA talks HTTPS to it, and it to Azurite.
    pub fn start_tls_to_tls(upstream: &str) -> Proxy {
        let ca = crate::tls::TestCa::shared();
        Proxy::start_with(upstream, Some(ca.server_config()), Some(ca.client_config()))
    }

    fn start_with(
        upstream: &str,
        tls: Option<Arc<rustls::ServerConfig>>,
        upstream_tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Proxy {
        let upstream: SocketAddr = upstream.parse().expect("upstream is host:port");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).expect("non-blocking accept");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            upstream,
            seen: Mutex::new(Vec::new()),
            recording: AtomicBool::new(true),
            arrived: AtomicUsize::new(0),
            rules: Mutex::new(Vec::new()),
            chances: Mutex::new(Vec::new()),
            applied: Mutex::new(Vec::new()),
            open: Mutex::new(0),
            flight: Mutex::new((0, 0)),
            stop: AtomicBool::new(false),
            tls,
            upstream_tls,
        });
        let thread = {
            let shared = shared.clone();
            std::thread::spawn(move || accept_loop(&listener, &shared))
        };
        Proxy {
            port,
            tls: shared.tls.is_some(),
            upstream_tls: shared.upstream_tls.is_some(),
            shared,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:{port}` (`https://localhost:{port}` for a TLS listener): what
    /// the app is given as the upstream's origin.
    pub fn origin(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.port)
        } else {
            format!("http://127.0.0.1:{}", self.port)
        }
    }

    /// Whether the listener speaks TLS ([`Proxy::start_tls`], [`Proxy::start_tls_to_tls`]).
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// Whether the upstream is reached over TLS ([`Proxy::start_to_tls`],
    /// [`Proxy::start_tls_to_tls`]).
    pub fn is_upstream_tls(&self) -> bool {
        self.upstream_tls
    }

    /// `127.0.0.1:{port}`.
    pub fn authority(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Applies `fault` to every request from now on (`None`: clears every fault, those set
    /// with [`Proxy::fault_on`] too).
    pub fn set_fault(&self, fault: Option<Fault>) {
        let mut rules = self.shared.rules.lock().expect("rules");
        rules.clear();
        if let Some(fault) = fault {
            rules.push(Rule {
                part: None,
                fault,
                skip: 0,
                times: None,
            });
        }
    }

    /// Applies `fault` to the requests whose `METHOD target` (`PUT /devstoreaccount1/c/b?comp=lease`)
    /// contains `part`. Earlier faults stay; the newest matching one wins.
    pub fn fault_on(&self, part: &str, fault: Fault) {
        self.shared.rules.lock().expect("rules").insert(
            0,
            Rule {
                part: Some(part.to_string()),
                fault,
                skip: 0,
                times: None,
            },
        );
    }

    /// [`Proxy::fault_on`] for the `n`-th matching request from now on only (1: the next):
    /// a lost answer on one write of a protocol, say, whatever the other writes do. The
    /// requests before it pass as they would without the rule.
    pub fn fault_nth(&self, part: &str, fault: Fault, n: usize) {
        self.shared.rules.lock().expect("rules").insert(
            0,
            Rule {
                part: Some(part.to_string()),
                fault,
                skip: n.saturating_sub(1),
                times: Some(1),
            },
        );
    }

    /// [`Proxy::fault_nth`] for the next matching request.
    pub fn fault_once(&self, part: &str, fault: Fault) {
        self.fault_nth(part, fault, 1);
    }

    /// [`Proxy::fault_on`] for the next `times` matching requests (then the rule is gone).
    pub fn fault_times(&self, part: &str, fault: Fault, times: usize) {
        if times == 0 {
            return;
        }
        self.shared.rules.lock().expect("rules").insert(
            0,
            Rule {
                part: Some(part.to_string()),
                fault,
                skip: 0,
                times: Some(times),
            },
        );
    }

    /// Applies faults at random to the requests no [`Proxy::set_fault`] or [`Proxy::fault_on`]
    /// rule matches: each request independently gets the first `fault` of `chances` whose
    /// share of the draw it falls in, so each fault lands on about its `probability` of the
    /// requests (0.02: 2 %), and none on the rest. An empty list turns it off. Panics if a
    /// probability is negative or they add up to more than 1.
    pub fn set_random_faults(&self, chances: &[(Fault, f64)]) {
        assert!(
            chances.iter().all(|(_, p)| *p >= 0.0)
                && chances.iter().map(|(_, p)| p).sum::<f64>() <= 1.0,
            "probabilities between 0 and 1, adding up to at most 1: {chances:?}"
        );
        *self.shared.chances.lock().expect("chances") = chances.to_vec();
    }

    /// Whether to record each request ([`Proxy::seen`], [`Proxy::during`]); on from the start.
    /// Off, only [`Proxy::count`] and [`Proxy::faults_applied`] go on: what a long run needs,
    /// as every record is kept in memory.
    pub fn set_recording(&self, on: bool) {
        self.shared.recording.store(on, Ordering::Relaxed);
    }

    /// How many times each fault was applied so far (in the order first applied).
    pub fn faults_applied(&self) -> Vec<(Fault, usize)> {
        self.shared.applied.lock().expect("applied").clone()
    }

    /// Every request recorded so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().expect("seen").clone()
    }

    /// How many requests have arrived so far (recorded or not).
    pub fn count(&self) -> usize {
        self.shared.arrived.load(Ordering::Relaxed)
    }

    /// The most requests that were in flight at the proxy at once (read, their answer not yet
    /// passed on) since it started or since the last [`Proxy::reset_peak`].
    pub fn peak_in_flight(&self) -> usize {
        self.shared.flight.lock().expect("flight").1
    }

    /// Starts [`Proxy::peak_in_flight`] afresh, from the requests in flight now.
    pub fn reset_peak(&self) {
        let mut f = self.shared.flight.lock().expect("flight");
        f.1 = f.0;
    }

    /// The requests that arrived while `f` ran (use with one decision at a time).
    pub fn during<T>(&self, f: impl FnOnce() -> T) -> (T, Vec<Seen>) {
        let before = self.shared.seen.lock().expect("seen").len();
        let out = f();
        let seen = self.seen();
        (out, seen[before.min(seen.len())..].to_vec())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                {
                    let mut open = shared.open.lock().expect("open");
                    if *open >= MAX_CONNECTIONS {
                        continue;
                    }
                    *open += 1;
                }
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
                    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
                    let _ = stream.set_nodelay(true);
                    match &shared.tls {
                        None => serve(stream, &shared),
                        // The handshake happens on the first read, in this thread.
                        Some(config) => {
                            if let Ok(conn) = ServerConnection::new(config.clone()) {
                                serve(StreamOwned::new(conn, stream), &shared);
                            }
                        }
                    }
                    *shared.open.lock().expect("open") -= 1;
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// One HTTP message read off a connection: its head and body, raw.
struct Message {
    head: Vec<u8>,
    body: Vec<u8>,
    /// The first line (request line or status line).
    start: String,
    headers: Vec<(String, String)>,
}

impl Message {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        out.extend_from_slice(&self.body);
        out
    }
}

/// A client connection the proxy serves: plain TCP, or TLS over TCP.
trait ClientStream: Read + Write {
    /// The TCP connection underneath.
    fn tcp(&self) -> &TcpStream;

    /// Ends the stream for writing, cleanly (a FIN; with TLS, a `close_notify` first).
    fn finish(&mut self) {
        let _ = self.flush();
        let _ = self.tcp().shutdown(Shutdown::Write);
    }
}

impl ClientStream for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl ClientStream for StreamOwned<ServerConnection, TcpStream> {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }

    fn finish(&mut self) {
        self.conn.send_close_notify();
        let _ = self.flush();
        let _ = self.sock.shutdown(Shutdown::Write);
    }
}

/// Writes all of `bytes` and flushes (with TLS, the records reach the socket).
fn send<S: ClientStream>(stream: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes)?;
    stream.flush()
}

fn serve<S: ClientStream>(client: S, shared: &Shared) {
    let started = Instant::now();
    // Reads through the buffer; writes go straight to the stream underneath (`get_mut`).
    let mut reader = BufReader::new(client);
    let mut upstream: Option<BufReader<UpstreamStream>> = None;
    while started.elapsed() < CONNECTION_LIMIT && !shared.stop.load(Ordering::Relaxed) {
        let request = match read_message(&mut reader, None) {
            Some(r) => r,
            None => return,
        };
        let mut parts = request.start.split(' ');
        let method = parts.next().unwrap_or("").to_string();
        let target = parts.next().unwrap_or("").to_string();
        let fault = {
            let line = format!("{method} {target}");
            let ruled = ruled_fault(&mut shared.rules.lock().expect("rules"), &line);
            ruled.or_else(|| {
                let chances = shared.chances.lock().expect("chances");
                if chances.is_empty() {
                    None
                } else {
                    draw(&chances, crate::uniform())
                }
            })
        };
        shared.arrived.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = &fault {
            let mut applied = shared.applied.lock().expect("applied");
            match applied.iter_mut().find(|(g, _)| g == f) {
                Some((_, n)) => *n += 1,
                None => applied.push((f.clone(), 1)),
            }
        }
        if shared.recording.load(Ordering::Relaxed) {
            shared.seen.lock().expect("seen").push(Seen {
                auth: auth_kind(&request, &target),
                target: redact(&target),
                ms_headers: request
                    .headers
                    .iter()
                    .filter(|(k, _)| {
                        let k = k.to_ascii_lowercase();
                        k.starts_with("x-ms-") || k == "if-match" || k == "if-none-match"
                    })
                    .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
                    .collect(),
                method: method.clone(),
                at: SystemTime::now(),
                fault: fault.clone(),
            });
        }
        // In flight until its answer is ready to go back (or the connection is given up): the
        // count drops before the caller can see the answer and send its next request.
        let in_flight = InFlight::start(shared);
        match fault {
            Some(Fault::Refuse) => {
                drop(in_flight);
                return reset(reader.into_inner());
            }
            Some(fault @ (Fault::Status(_) | Fault::Error(..) | Fault::LateError(..))) => {
                let (status, code) = match fault {
                    Fault::LateError(wait, status, code) => {
                        std::thread::sleep(wait);
                        (status, format!("x-ms-error-code: {code}\r\n"))
                    }
                    Fault::Error(status, code) => (status, format!("x-ms-error-code: {code}\r\n")),
                    Fault::Status(503) => (503, "x-ms-error-code: ServerBusy\r\n".to_string()),
                    Fault::Status(status) => (status, String::new()),
                    _ => unreachable!("matched above"),
                };
                let answer = format!(
                    "HTTP/1.1 {status} Fault\r\nDate: {}\r\n{code}Content-Length: 0\r\n\r\n",
                    httpdate::fmt_http_date(SystemTime::now())
                );
                drop(in_flight);
                if send(reader.get_mut(), answer.as_bytes()).is_err() {
                    return;
                }
                if request
                    .header("connection")
                    .is_some_and(|v| v.eq_ignore_ascii_case("close"))
                {
                    reader.get_mut().finish();
                    return;
                }
                continue;
            }
            Some(Fault::Delay(d)) => std::thread::sleep(d),
            _ => {}
        }
        // Forward, over this connection's own upstream connection.
        let answer = forward(shared, &mut upstream, &request, &method);
        drop(in_flight);
        let Some(answer) = answer else {
            return reset(reader.into_inner());
        };
        match fault {
            Some(Fault::LoseAnswer) => return reset(reader.into_inner()),
            Some(Fault::BreakBody) => {
                let _ = reader.get_mut().write_all(&answer.head);
                let keep = answer.body.len().saturating_sub(1) / 2;
                let _ = reader.get_mut().write_all(&answer.body[..keep]);
                let _ = reader.get_mut().flush();
                return reset(reader.into_inner());
            }
            _ => {}
        }
        if send(reader.get_mut(), &answer.bytes()).is_err() {
            return;
        }
        let close = |m: &Message| {
            m.header("connection")
                .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        };
        if close(&request) || close(&answer) {
            reader.get_mut().finish();
            return;
        }
    }
}

/// The proxy's connection to its upstream: plain TCP, or TLS over TCP.
enum UpstreamStream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl UpstreamStream {
    /// Connects to the upstream (over TLS when the proxy was started so, the handshake
    /// happening on the first write).
    fn connect(shared: &Shared) -> Option<UpstreamStream> {
        let s = TcpStream::connect_timeout(&shared.upstream, Duration::from_secs(10)).ok()?;
        let _ = s.set_read_timeout(Some(IO_TIMEOUT));
        let _ = s.set_write_timeout(Some(IO_TIMEOUT));
        let _ = s.set_nodelay(true);
        Some(match &shared.upstream_tls {
            None => UpstreamStream::Plain(s),
            Some(config) => {
                let name = ServerName::try_from("localhost").expect("a server name");
                let conn = ClientConnection::new(config.clone(), name).ok()?;
                UpstreamStream::Tls(Box::new(StreamOwned::new(conn, s)))
            }
        })
    }
}

impl Read for UpstreamStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            UpstreamStream::Plain(s) => s.read(buf),
            UpstreamStream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for UpstreamStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            UpstreamStream::Plain(s) => s.write(buf),
            UpstreamStream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            UpstreamStream::Plain(s) => s.flush(),
            UpstreamStream::Tls(s) => s.flush(),
        }
    }
}

/// Sends `request` upstream (opening the connection if needed) and reads the whole answer.
/// Only a kept connection that the upstream had closed meanwhile is tried once more on a new
/// one; a fresh connection that fails is a failure (the upstream may have acted).
fn forward(
    shared: &Shared,
    upstream: &mut Option<BufReader<UpstreamStream>>,
    request: &Message,
    method: &str,
) -> Option<Message> {
    loop {
        let kept = upstream.is_some();
        if !kept {
            *upstream = Some(BufReader::new(UpstreamStream::connect(shared)?));
        }
        let conn = upstream.as_mut().expect("just opened");
        let sent = conn.get_mut().write_all(&request.bytes());
        if sent.and_then(|()| conn.get_mut().flush()).is_ok() {
            if let Some(answer) = read_message(conn, Some(method)) {
                return Some(answer);
            }
        }
        *upstream = None;
        if !kept {
            return None;
        }
    }
}

/// Resets the connection (RST, not FIN; with TLS, no `close_notify` either): the peer sees a
/// broken connection.
fn reset<S: ClientStream>(stream: S) {
    let _ = socket2::SockRef::from(stream.tcp()).set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// Reads one message: a request (`request_method` `None`) or the answer to a request made
/// with `request_method`. `None` when the connection ended or the message was malformed.
fn read_message<R: BufRead>(reader: &mut R, request_method: Option<&str>) -> Option<Message> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        let n = reader
            .by_ref()
            .take((MAX_HEAD - head.len()) as u64)
            .read_until(b'\n', &mut head)
            .ok()?;
        if n == 0 {
            return None;
        }
        let line = &head[before..];
        if line == b"\r\n" || line == b"\n" {
            if before == 0 {
                // A stray empty line before a message.
                head.clear();
                continue;
            }
            break;
        }
        if head.len() >= MAX_HEAD {
            return None;
        }
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let mut lines = text.lines();
    let start = lines.next()?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut message = Message {
        head,
        body: Vec::new(),
        start,
        headers,
    };
    let status: Option<u16> =
        request_method.and_then(|_| message.start.split(' ').nth(1).and_then(|s| s.parse().ok()));
    let no_body = match (request_method, status) {
        (Some(m), Some(s)) => {
            m.eq_ignore_ascii_case("HEAD") || s == 204 || s == 304 || (100..200).contains(&s)
        }
        _ => false,
    };
    if no_body {
        return Some(message);
    }
    let chunked = message
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        // Kept raw (sizes, extensions, trailers) and passed on as it came.
        loop {
            let mut size_line = Vec::new();
            reader
                .by_ref()
                .take(4096)
                .read_until(b'\n', &mut size_line)
                .ok()?;
            if size_line.is_empty() {
                return None;
            }
            message.body.extend_from_slice(&size_line);
            let size_text = String::from_utf8_lossy(&size_line);
            let size =
                usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16).ok()?;
            if message.body.len() + size > MAX_BODY {
                return None;
            }
            if size == 0 {
                // Trailers up to the empty line.
                loop {
                    let mut t = Vec::new();
                    reader.by_ref().take(4096).read_until(b'\n', &mut t).ok()?;
                    if t.is_empty() {
                        return None;
                    }
                    message.body.extend_from_slice(&t);
                    if t == b"\r\n" || t == b"\n" {
                        return Some(message);
                    }
                }
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            message.body.extend_from_slice(&chunk);
        }
    }
    match message.header("content-length") {
        Some(n) => {
            let n: usize = n.parse().ok()?;
            if n > MAX_BODY {
                return None;
            }
            message.body = vec![0; n];
            reader.read_exact(&mut message.body).ok()?;
        }
        None if status.is_some() => {
            // An answer without a length runs to the end of the connection.
            reader
                .by_ref()
                .take(MAX_BODY as u64)
                .read_to_end(&mut message.body)
                .ok()?;
        }
        None => {}
    }
    Some(message)
}

/// The fault of `chances` whose share of [0, 1) holds `u` (the first takes `[0, p1)`, the next
/// `[p1, p1 + p2)`, ...), or none past them.
fn draw(chances: &[(Fault, f64)], u: f64) -> Option<Fault> {
    let mut upto = 0.0;
    for (fault, p) in chances {
        upto += p;
        if u < upto {
            return Some(fault.clone());
        }
    }
    None
}

fn auth_kind(request: &Message, target: &str) -> &'static str {
    match request.header("authorization") {
        Some(v) if v.starts_with("SharedKey ") => "SharedKey",
        Some(v) if v.starts_with("Bearer ") => "Bearer",
        Some(_) => "other",
        None if target.contains("sig=") => "SAS",
        None => "none",
    }
}

fn redact(target: &str) -> String {
    let Some((path, query)) = target.split_once('?') else {
        return target.to_string();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|p| {
            if p.starts_with("sig=") {
                "sig=REDACTED".to_string()
            } else {
                p.to_string()
            }
        })
        .collect();
    format!("{path}?{}", query.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draw_falls_in_one_faults_share_or_in_none() {
        let chances = [(Fault::Refuse, 0.1), (Fault::Status(503), 0.2)];
        assert_eq!(draw(&chances, 0.0), Some(Fault::Refuse));
        assert_eq!(draw(&chances, 0.099), Some(Fault::Refuse));
        assert_eq!(draw(&chances, 0.1), Some(Fault::Status(503)));
        assert_eq!(draw(&chances, 0.299), Some(Fault::Status(503)));
        assert_eq!(draw(&chances, 0.31), None);
        assert_eq!(draw(&chances, 0.999), None);
        assert_eq!(draw(&[], 0.0), None);
        let u: Vec<f64> = (0..1000).map(|_| crate::uniform()).collect();
        assert!(u.iter().all(|u| (0.0..1.0).contains(u)));
        let low = u.iter().filter(|u| **u < 0.5).count();
        assert!((400..600).contains(&low), "{low} of 1000 below 0.5");
    }

    /// One request on a new connection: the status, or `None` if the connection broke.
    fn get(proxy: &Proxy) -> Option<u16> {
        let mut s = TcpStream::connect(proxy.authority()).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(b"GET /x HTTP/1.1\r\nhost: sink\r\nconnection: close\r\n\r\n")
            .ok()?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).ok()?;
        String::from_utf8_lossy(&answer)
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
    }

    #[test]
    fn random_faults_land_on_about_their_share_and_are_counted() {
        let sink = crate::sink::Sink::start();
        let proxy = Proxy::start(&sink.authority());
        proxy.set_recording(false);
        proxy.set_random_faults(&[(Fault::Status(503), 0.2), (Fault::Refuse, 0.1)]);
        let n = 1000;
        let (mut passed, mut busy, mut broken) = (0, 0, 0);
        for _ in 0..n {
            match get(&proxy) {
                Some(204) => passed += 1,
                Some(503) => busy += 1,
                None => broken += 1,
                Some(other) => panic!("answered {other}"),
            }
        }
        // Expected 200 and 100; five standard deviations either side (13 and 9.5).
        assert!((137..=263).contains(&busy), "503 on {busy} of {n}");
        assert!((52..=148).contains(&broken), "refused {broken} of {n}");
        assert_eq!(passed + busy + broken, n);
        assert_eq!(proxy.count(), n);
        assert!(proxy.seen().is_empty(), "recording was off");
        let applied = proxy.faults_applied();
        let of = |f: Fault| applied.iter().find(|(g, _)| *g == f).map_or(0, |(_, n)| *n);
        assert_eq!((of(Fault::Status(503)), of(Fault::Refuse)), (busy, broken));
        assert_eq!(
            sink.received().len(),
            passed,
            "only the unfaulted reached the sink"
        );
        // Rules still win over chances, and an empty list turns them off.
        proxy.set_fault(Some(Fault::Status(500)));
        assert_eq!(get(&proxy), Some(500));
        proxy.set_fault(None);
        proxy.set_random_faults(&[]);
        proxy.set_recording(true);
        assert!((0..20).all(|_| get(&proxy) == Some(204)));
        assert_eq!(proxy.seen().len(), 20);
    }
}
