//! A native transport for [`leasegate`]: blocking HTTP/1.1 through `ureq`, for tests and tools.
//!
//! [`NativeTransport::send`] blocks the calling thread; drive the lease algorithms with
//! `pollster::block_on` (re-exported as [`block_on`]) and run concurrent callers on threads.
//!
//! For an account whose credential is a bearer token
//! ([`Credential::Bearer`](leasegate::Credential::Bearer)), the transport keeps each source's
//! token in memory and asks the source again only [`REFRESH_AHEAD`] before the token expires,
//! or when storage refused it: one token request per hour, not one per storage request.
#![deny(missing_docs)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use leasegate::token::{self, Token};
use leasegate::{
    AccessToken, Error, Request, Response, TokenSource, Transport, TransportError,
    TransportErrorKind,
};

pub use pollster::block_on;

/// How long before its expiry a kept token is replaced by a new one, so that no request goes
/// out with a token that expires on the way.
pub const REFRESH_AHEAD: Duration = Duration::from_secs(5 * 60);

/// Blocking HTTP transport. Statuses are answers, not errors; only a failure to exchange is an
/// error, and its message never holds the URL (which may carry a SAS).
///
/// Clones share the connection pool and the kept tokens. `Debug` shows no token.
#[derive(Clone)]
pub struct NativeTransport {
    agent: ureq::Agent,
    /// Kept bearer tokens by [`TokenSource::identity`] (no secret in the key).
    tokens: Arc<Mutex<HashMap<String, Token>>>,
}

impl std::fmt::Debug for NativeTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeTransport")
            .field("agent", &self.agent)
            .field("kept_tokens", &self.kept().len())
            .finish()
    }
}

impl NativeTransport {
    /// A transport with this timeout for each exchange.
    pub fn new(timeout: Duration) -> Self {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .max_redirects(0)
            .build();
        NativeTransport {
            agent: config.into(),
            tokens: Arc::default(),
        }
    }

    /// The kept tokens. A thread that panicked while holding them left a whole map (every
    /// change is one insert or remove), so a poisoned lock is used as it is.
    fn kept(&self) -> std::sync::MutexGuard<'_, HashMap<String, Token>> {
        self.tokens.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends and waits: the blocking form of [`Transport::send`].
    pub fn send_blocking(&self, request: Request) -> Result<Response, TransportError> {
        let mut outgoing = http::Request::builder()
            .method(request.method().clone())
            .uri(request.uri());
        for (name, value) in request.headers().iter() {
            outgoing = outgoing.header(name, value);
        }
        let outgoing = outgoing.body(request.into_body()).map_err(|_| {
            TransportError::new(TransportErrorKind::Other, "the request is not valid HTTP")
        })?;
        let response = self.agent.run(outgoing).map_err(classify)?;
        let (parts, mut body) = response.into_parts();
        let mut answer = Response::new(parts.status);
        for (name, value) in &parts.headers {
            let value = String::from_utf8_lossy(value.as_bytes());
            answer.headers_mut().append(name.as_str(), value);
        }
        Ok(answer.with_body(body.read_to_vec().map_err(classify)?))
    }
}

impl Default for NativeTransport {
    fn default() -> Self {
        NativeTransport::new(Duration::from_secs(30))
    }
}

impl Transport for NativeTransport {
    async fn send(&self, request: Request) -> Result<Response, TransportError> {
        self.send_blocking(request)
    }

    /// The wall clock: every request is dated when it is sent.
    fn now(&self) -> Option<SystemTime> {
        Some(SystemTime::now())
    }

    /// The kept token of `source` while it has more than [`REFRESH_AHEAD`] to live; else (or
    /// with `refresh`: storage refused the last one) a new one from the source, then kept.
    /// Two threads that find no usable token both fetch one: harmless, the later is kept.
    async fn access_token(
        &self,
        source: &TokenSource,
        refresh: bool,
    ) -> Result<AccessToken, Error> {
        let key = source.identity();
        if refresh {
            self.kept().remove(&key);
        } else if let Some(token) = self.kept().get(&key) {
            if usable(token, SystemTime::now()) {
                return Ok(token.value.clone());
            }
        }
        // The lock is not held while the token request is out.
        let token = token::fetch(self, source, SystemTime::now()).await?;
        let value = token.value.clone();
        self.kept().insert(key, token);
        Ok(value)
    }
}

/// True while `token` has more than [`REFRESH_AHEAD`] to live at `now`.
fn usable(token: &Token, now: SystemTime) -> bool {
    now.checked_add(REFRESH_AHEAD)
        .is_some_and(|soon| soon < token.expires_at)
}

fn classify(e: ureq::Error) -> TransportError {
    use ureq::Error as E;
    match e {
        E::Timeout(_) => TransportError::new(TransportErrorKind::Timeout, "no answer in time"),
        E::ConnectionFailed | E::HostNotFound => {
            TransportError::new(TransportErrorKind::Connect, "could not connect to storage")
        }
        E::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            TransportError::new(TransportErrorKind::Connect, "connection refused by storage")
        }
        // The error's own text can quote the URL; keep only its kind.
        E::Io(io) => TransportError::new(
            TransportErrorKind::Other,
            format!("io error: {:?}", io.kind()),
        ),
        _ => TransportError::new(TransportErrorKind::Other, "http exchange failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A plain-HTTP token endpoint on 127.0.0.1: answers request `n` (from 0) with
    /// `answer(n)` (status, JSON body) and counts the requests. Stops when dropped.
    struct TokenServer {
        port: u16,
        asked: Arc<AtomicUsize>,
        stop: Arc<AtomicBool>,
    }

    impl TokenServer {
        fn start(answer: fn(usize) -> (u16, String)) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            let asked = Arc::new(AtomicUsize::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let (count, stopped) = (asked.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    let n = count.fetch_add(1, Ordering::SeqCst);
                    let (status, body) = answer(n);
                    let _ = serve(stream.unwrap(), status, &body);
                }
            });
            TokenServer { port, asked, stop }
        }

        fn asked(&self) -> usize {
            self.asked.load(Ordering::SeqCst)
        }

        fn source(&self) -> TokenSource {
            TokenSource::ClientSecret(
                token::ClientSecret::new(
                    &format!("http://127.0.0.1:{}", self.port),
                    "tenant",
                    "client",
                    "the-client-secret",
                )
                .unwrap(),
            )
        }
    }

    impl Drop for TokenServer {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            // Wakes the accept loop so that it sees the flag.
            let _ = TcpStream::connect(("127.0.0.1", self.port));
        }
    }

    /// Reads one request (headers, then a Content-Length body) and answers it.
    fn serve(stream: TcpStream, status: u16, body: &str) -> std::io::Result<()> {
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut reader = BufReader::new(stream);
        let mut length = 0;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        reader.read_exact(&mut vec![0; length])?;
        write!(
            reader.get_mut(),
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    fn token_answer(n: usize, expires_in: u64) -> (u16, String) {
        let body = format!(
            r#"{{"token_type":"Bearer","expires_in":{expires_in},"access_token":"tok-{n}"}}"#
        );
        (200, body)
    }

    fn get(t: &NativeTransport, source: &TokenSource, refresh: bool) -> String {
        block_on(t.access_token(source, refresh))
            .unwrap()
            .secret()
            .to_string()
    }

    #[test]
    fn a_token_is_kept_until_shortly_before_it_expires() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let token = |secs| Token {
            value: AccessToken::try_new("t").unwrap(),
            expires_at: now + Duration::from_secs(secs),
        };
        assert!(usable(&token(3600), now));
        assert!(usable(&token(301), now));
        assert!(!usable(&token(300), now), "refreshed 5 minutes ahead");
        assert!(!usable(&token(0), now));
        assert!(!usable(&token(0), now + Duration::from_secs(10)), "expired");
    }

    #[test]
    fn one_token_request_for_many_storage_requests_and_a_new_one_on_refresh() {
        let server = TokenServer::start(|n| token_answer(n, 3600));
        let t = NativeTransport::default();
        let source = server.source();
        assert_eq!(get(&t, &source, false), "tok-0");
        assert_eq!(get(&t, &source, false), "tok-0");
        // A clone shares the kept tokens.
        assert_eq!(get(&t.clone(), &source, false), "tok-0");
        assert_eq!(server.asked(), 1);
        // Storage refused it: a new one, kept from then on.
        assert_eq!(get(&t, &source, true), "tok-1");
        assert_eq!(get(&t, &source, false), "tok-1");
        assert_eq!(server.asked(), 2);

        let shown = format!("{t:?}");
        assert!(shown.contains("kept_tokens: 1"), "{shown}");
        assert!(!shown.contains("tok-"), "{shown}");
        assert!(!shown.contains("the-client-secret"), "{shown}");
    }

    #[test]
    fn a_token_about_to_expire_is_replaced() {
        // Four minutes to live: inside the five-minute margin, so every use asks anew.
        let server = TokenServer::start(|n| token_answer(n, 240));
        let t = NativeTransport::default();
        let source = server.source();
        assert_eq!(get(&t, &source, false), "tok-0");
        assert_eq!(get(&t, &source, false), "tok-1");
        assert_eq!(server.asked(), 2);
    }

    #[test]
    fn a_refusal_is_not_kept_and_holds_no_secret() {
        let server = TokenServer::start(|n| match n {
            0 => (
                401,
                r#"{"error":"invalid_client","error_description":"AADSTS7000215: bad"}"#.into(),
            ),
            n => token_answer(n, 3600),
        });
        let t = NativeTransport::default();
        let source = server.source();
        let e = block_on(t.access_token(&source, false)).unwrap_err();
        let message = e.to_string();
        assert!(message.contains("invalid_client"), "{message}");
        assert!(!message.contains("the-client-secret"), "{message}");
        assert_eq!(get(&t, &source, false), "tok-1");
        assert_eq!(server.asked(), 2);
    }

    #[test]
    fn a_fixed_token_is_used_as_it_is() {
        let t = NativeTransport::default();
        let source = TokenSource::Fixed(AccessToken::try_new("eyJ.fixed.token").unwrap());
        assert_eq!(get(&t, &source, false), "eyJ.fixed.token");
        assert_eq!(get(&t, &source, true), "eyJ.fixed.token");
    }
}
