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
//! connection with the same code, over any `ClientStream` (`client.rs`), and every upstream kind
//! is read and written the same way (`UpstreamStream`, `upstream.rs`), so every fault works on
//! each.
//!
//! Its parts: the faults set by rule and drawn at random (`rules.rs`), a connection served
//! (`serve.rs`: accepting, choosing a request's fault, applying it), what is recorded of a
//! request (`record.rs`), an HTTP message read off a connection (`message.rs`), the client's
//! connection (`client.rs`) and the upstream's (`upstream.rs`); the proxy, its faults and its
//! records here.

mod client;
mod message;
mod record;
mod rules;
mod serve;
mod upstream;

#[cfg(test)]
mod tests;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rules::{Rule, Rules};

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

/// How long one connection is served at most, and one read or write may wait.
const CONNECTION_LIMIT: Duration = Duration::from_secs(300);
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest head and body the proxy reads.
const MAX_HEAD: usize = 64 << 10;
const MAX_BODY: usize = 64 << 20;
/// Connections served at once at most; more are closed unanswered.
const MAX_CONNECTIONS: usize = 256;

/// What the proxy and the threads serving its connections share.
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
            std::thread::spawn(move || serve::accept_loop(&listener, &shared))
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
