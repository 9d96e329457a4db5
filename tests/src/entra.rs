//! A stand-in for Microsoft Entra ID in tests: a token service on a loopback port that mints
//! access tokens an Azurite with `--oauth basic` ([`crate::Azurite::start_oauth`]) accepts.
//!
//! It serves the two shapes a deployment meets (REFERENCE.md section 8):
//! - **managed identity** (App Service / Azure Functions, api-version 2019-08-01):
//!   `GET {IDENTITY_PATH}?resource=https://storage.azure.com/&api-version=2019-08-01[&client_id=..]`
//!   with the header `X-IDENTITY-HEADER: {secret}`; answers `access_token`, `expires_on` (Unix
//!   seconds, a string), `resource`, `token_type`, `client_id`.
//! - **client credentials** (a service principal): `POST /{tenant}/oauth2/v2.0/token` with the
//!   form `grant_type=client_credentials&client_id=..&client_secret=..&scope=...`; answers
//!   `token_type`, `expires_in`, `access_token`.
//!
//! The tokens are unsigned JWTs (`alg: none`, an empty signature part): Azurite's basic check
//! reads the issuer (`https://sts.windows.net/{tenant}/`), the audience and the lifetime
//! (`nbf`, `iat`, `exp`), never the signature. A token's audience is the resource (or the
//! scope without `/.default`) it was asked for, unless [`TokenServer::set_audience`] says
//! otherwise.
//!
//! The server records each request (never a secret or a token), counts them, and can be
//! steered at run time: the tokens' lifetime, a fault (a status, a refused connection, a
//! delay), the audience. One request per connection (every answer says `Connection: close`);
//! every read has a timeout, every loop a bound, and dropping the server stops it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// The tenant the server plays (a made-up id).
pub const TENANT_ID: &str = "7e57e57e-0000-4000-8000-00000000a1a1";
/// The application (client) id of the service principal, and of the user-assigned identity.
pub const CLIENT_ID: &str = "c11e0000-0000-4000-8000-0000000c1d01";
/// The service principal's client secret the server expects (a test value, not a secret).
pub const CLIENT_SECRET: &str = "test-client-secret-not-real";
/// The `X-IDENTITY-HEADER` value the server expects at first (a test value, not a secret); see
/// [`TokenServer::set_identity_header`].
pub const IDENTITY_HEADER: &str = "test-identity-header-not-real";
/// The path of the managed-identity endpoint (`IDENTITY_ENDPOINT` is the origin plus this).
pub const IDENTITY_PATH: &str = "/msi/token";
/// The managed-identity API version the server serves.
pub const IDENTITY_API_VERSION: &str = "2019-08-01";
/// The audience of a storage token.
pub const STORAGE_AUDIENCE: &str = "https://storage.azure.com";
/// The resource a managed identity asks for, for storage.
pub const STORAGE_RESOURCE: &str = "https://storage.azure.com/";
/// The scope a service principal asks for, for storage.
pub const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";
/// The object id of the identity the tokens are for.
pub const OBJECT_ID: &str = "0b1ec700-0000-4000-8000-0000000001d0";
/// The default lifetime of a minted token (what Entra ID's `expires_in` usually says).
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(3599);

/// How far before now a minted token's `nbf` and `iat` lie.
const SKEW: u64 = 5 * 60;

/// A storage token (audience [`STORAGE_AUDIENCE`]) valid from five minutes ago for
/// `lifetime` from now.
pub fn mint(lifetime: Duration) -> String {
    let now = crate::unix_now();
    mint_with(STORAGE_AUDIENCE, now - SKEW, now + lifetime.as_secs())
}

/// A token for `audience`, with `nbf` and `iat` = `not_before` and `exp` = `expires` (Unix
/// seconds): an expired one when `expires` is past, one for another service with another
/// audience (`https://vault.azure.net`).
pub fn mint_with(audience: &str, not_before: u64, expires: u64) -> String {
    let header = serde_json::json!({ "alg": "none", "typ": "JWT" });
    let claims = serde_json::json!({
        "aud": audience,
        "iss": format!("https://sts.windows.net/{TENANT_ID}/"),
        "iat": not_before,
        "nbf": not_before,
        "exp": expires,
        "appid": CLIENT_ID,
        "appidacr": "1",
        "idtyp": "app",
        "oid": OBJECT_ID,
        "sub": OBJECT_ID,
        "tid": TENANT_ID,
        "uti": uuid::Uuid::new_v4().simple().to_string(),
        "ver": "1.0",
    });
    let part = |v: &serde_json::Value| URL_SAFE_NO_PAD.encode(v.to_string());
    // `alg: none`: the signature part is empty (the trailing dot stays).
    format!("{}.{}.", part(&header), part(&claims))
}

/// The claims of a token minted here (`None` if it is not a JWT).
pub fn claims(token: &str) -> Option<serde_json::Value> {
    let payload = token.split('.').nth(1)?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
}

/// What the server does to a request instead of answering it as usual.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenFault {
    /// Answer this status with a JSON error (`temporarily_unavailable` for a 5xx).
    Status(u16),
    /// Read the request, then reset the connection: no answer at all.
    Refuse,
    /// Wait this long, then answer as usual.
    Delay(Duration),
}

/// Which endpoint a request was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// `GET` [`IDENTITY_PATH`]: managed identity.
    Identity,
    /// `POST /{tenant}/oauth2/v2.0/token`: client credentials.
    ClientCredentials,
    /// Anything else (answered 404).
    Other,
}

/// Whether a request carried the credential its endpoint expects (never the value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// The identity header or client secret the server expects.
    Matched,
    /// Another one.
    Wrong,
    /// None at all.
    Missing,
}

/// One request that reached the token server (no secret, no token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest {
    /// Which endpoint it was for.
    pub kind: TokenKind,
    /// Method.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The `client_id` it named (query or form), if any.
    pub client_id: Option<String>,
    /// The `resource` (managed identity) or `scope` (client credentials) it asked for.
    pub resource: Option<String>,
    /// Whether it carried the expected identity header or client secret.
    pub credential: Credential,
    /// The status it was answered (0: none, the connection was reset).
    pub status: u16,
    /// The fault applied to it, if any.
    pub fault: Option<TokenFault>,
    /// When it arrived.
    pub at: SystemTime,
}

/// The largest request head and body read.
const MAX_HEAD: usize = 16 << 10;
const MAX_BODY: usize = 64 << 10;
/// How long one read or write may wait.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once at most; more are closed unanswered.
const MAX_CONNECTIONS: usize = 64;

struct Settings {
    lifetime: Duration,
    fault: Option<TokenFault>,
    audience: Option<String>,
    identity_header: String,
}

struct State {
    settings: Mutex<Settings>,
    requests: Mutex<Vec<TokenRequest>>,
    tokens: Mutex<usize>,
    open: Mutex<usize>,
    stop: AtomicBool,
}

/// The token service. Dropping it stops accepting; a connection being served ends within a
/// read timeout (a delay fault is cut short).
pub struct TokenServer {
    port: u16,
    state: Arc<State>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TokenServer {
    /// Starts a token server on a free loopback port: tokens for [`DEFAULT_LIFETIME`], no
    /// fault, the audience the request asked for, expecting [`IDENTITY_HEADER`] and
    /// [`CLIENT_SECRET`].
    pub fn start() -> TokenServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the token server");
        listener.set_nonblocking(true).expect("non-blocking accept");
        let port = listener.local_addr().expect("token server address").port();
        let state = Arc::new(State {
            settings: Mutex::new(Settings {
                lifetime: DEFAULT_LIFETIME,
                fault: None,
                audience: None,
                identity_header: IDENTITY_HEADER.to_string(),
            }),
            requests: Mutex::new(Vec::new()),
            tokens: Mutex::new(0),
            open: Mutex::new(0),
            stop: AtomicBool::new(false),
        });
        let thread = {
            let state = state.clone();
            std::thread::spawn(move || accept_loop(&listener, &state))
        };
        TokenServer {
            port,
            state,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:{port}`: the authority host a service principal's token endpoint is
    /// under (`{origin}/{tenant}/oauth2/v2.0/token`).
    pub fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `{origin}{IDENTITY_PATH}`: what the platform puts in `IDENTITY_ENDPOINT`.
    pub fn identity_endpoint(&self) -> String {
        format!("{}{IDENTITY_PATH}", self.origin())
    }

    /// `{origin}/{TENANT_ID}/oauth2/v2.0/token`.
    pub fn token_endpoint(&self) -> String {
        format!("{}/{TENANT_ID}/oauth2/v2.0/token", self.origin())
    }

    /// Tokens minted from now on live this long (`expires_on` / `expires_in` say so): 90 s
    /// makes one that is about to expire.
    pub fn set_lifetime(&self, lifetime: Duration) {
        self.settings().lifetime = lifetime;
    }

    /// Applies `fault` to every request from now on (`None`: answer as usual).
    pub fn set_fault(&self, fault: Option<TokenFault>) {
        self.settings().fault = fault;
    }

    /// Tokens minted from now on carry this audience whatever was asked
    /// (`https://vault.azure.net`: a token storage refuses with 403 `AuthenticationFailed`).
    pub fn set_audience(&self, audience: &str) {
        self.settings().audience = Some(audience.to_string());
    }

    /// Tokens minted from now on carry the audience their request asked for (the default).
    pub fn clear_audience(&self) {
        self.settings().audience = None;
    }

    /// The `X-IDENTITY-HEADER` value expected from now on (the platform rotates it).
    pub fn set_identity_header(&self, value: &str) {
        self.settings().identity_header = value.to_string();
    }

    /// How many requests have arrived so far (every kind, answered or not).
    pub fn count(&self) -> usize {
        self.requests().len()
    }

    /// How many requests of this kind have arrived so far.
    pub fn count_of(&self, kind: TokenKind) -> usize {
        self.requests().iter().filter(|r| r.kind == kind).count()
    }

    /// How many tokens were handed out (answers 200).
    pub fn token_count(&self) -> usize {
        *self.state.tokens.lock().expect("tokens")
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<TokenRequest> {
        self.state.requests.lock().expect("requests").clone()
    }

    fn settings(&self) -> std::sync::MutexGuard<'_, Settings> {
        self.state.settings.lock().expect("settings")
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, state: &Arc<State>) {
    while !state.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                {
                    let mut open = state.open.lock().expect("open");
                    if *open >= MAX_CONNECTIONS {
                        continue;
                    }
                    *open += 1;
                }
                let state = state.clone();
                std::thread::spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
                    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
                    serve(stream, &state);
                    *state.open.lock().expect("open") -= 1;
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Panics unless every request in `seen` (at least one) carried a bearer token; a failure
/// lists the requests by method, path and auth kind, never a header's value.
pub fn assert_all_bearer(seen: &[crate::proxy::Seen]) {
    assert!(!seen.is_empty(), "no storage request was seen");
    let other: Vec<String> = seen
        .iter()
        .filter(|s| s.auth != "Bearer")
        .map(|s| format!("{} {} [{}]", s.describe(), s.path(), s.auth))
        .collect();
    assert!(
        other.is_empty(),
        "requests without a bearer token: {other:#?}"
    );
}

/// A request as read: method, path, query and form parameters (decoded), headers.
struct Incoming {
    method: String,
    path: String,
    params: Vec<(String, String)>,
    headers: Vec<(String, String)>,
}

impl Incoming {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn serve(stream: TcpStream, state: &State) {
    let mut reader = BufReader::new(stream);
    let Some(request) = read_request(&mut reader) else {
        return;
    };
    let (fault, lifetime, audience, identity_header) = {
        let s = state.settings.lock().expect("settings");
        (
            s.fault.clone(),
            s.lifetime,
            s.audience.clone(),
            s.identity_header.clone(),
        )
    };
    let (kind, credential) = classify(&request, &identity_header);
    let mut record = TokenRequest {
        kind,
        method: request.method.clone(),
        path: request.path.clone(),
        client_id: request.param("client_id").map(str::to_string),
        resource: request
            .param("resource")
            .or(request.param("scope"))
            .map(str::to_string),
        credential,
        status: 0,
        fault: fault.clone(),
        at: SystemTime::now(),
    };
    let answer = match &fault {
        Some(TokenFault::Refuse) => None,
        Some(TokenFault::Status(status)) => Some((*status, fault_body(*status))),
        Some(TokenFault::Delay(d)) => {
            let until = Instant::now() + *d;
            while Instant::now() < until && !state.stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
            }
            Some(answer(&request, kind, credential, lifetime, audience))
        }
        None => Some(answer(&request, kind, credential, lifetime, audience)),
    };
    let Some((status, body)) = answer else {
        state.requests.lock().expect("requests").push(record);
        // A reset, not a clean close: the caller sees a broken connection.
        let _ = socket2::SockRef::from(reader.get_ref()).set_linger(Some(Duration::ZERO));
        return;
    };
    record.status = status;
    state.requests.lock().expect("requests").push(record);
    if status == 200 {
        *state.tokens.lock().expect("tokens") += 1;
    }
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json; charset=utf-8\r\n\
         Content-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        reason(status),
        body.len()
    );
    let stream = reader.get_mut();
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body.as_bytes());
    let _ = stream.flush();
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

fn classify(request: &Incoming, identity_header: &str) -> (TokenKind, Credential) {
    let credential = |given: Option<&str>, expected: &str| match given {
        None => Credential::Missing,
        Some(v) if v == expected => Credential::Matched,
        Some(_) => Credential::Wrong,
    };
    if request.path == IDENTITY_PATH {
        (
            TokenKind::Identity,
            credential(request.header("x-identity-header"), identity_header),
        )
    } else if request.path.ends_with("/oauth2/v2.0/token") {
        (
            TokenKind::ClientCredentials,
            credential(request.param("client_secret"), CLIENT_SECRET),
        )
    } else {
        (TokenKind::Other, Credential::Missing)
    }
}

/// The status and JSON body for a request answered as usual.
fn answer(
    request: &Incoming,
    kind: TokenKind,
    credential: Credential,
    lifetime: Duration,
    audience: Option<String>,
) -> (u16, String) {
    let error = |status: u16, code: &str, description: &str| {
        let body = serde_json::json!({ "error": code, "error_description": description });
        (status, body.to_string())
    };
    let now = crate::unix_now();
    let expires = now + lifetime.as_secs();
    match kind {
        TokenKind::Identity => {
            let identity_error = |status: u16, message: &str| {
                let body = serde_json::json!({ "statusCode": status, "message": message });
                (status, body.to_string())
            };
            if request.method != "GET" {
                return identity_error(405, "Only GET is supported.");
            }
            match credential {
                Credential::Missing => {
                    return identity_error(400, "The X-IDENTITY-HEADER header is missing.")
                }
                Credential::Wrong => {
                    return identity_error(401, "The X-IDENTITY-HEADER header is not valid.")
                }
                Credential::Matched => {}
            }
            if request.param("api-version") != Some(IDENTITY_API_VERSION) {
                return identity_error(400, "The api-version is missing or not supported.");
            }
            let Some(resource) = request.param("resource").filter(|r| !r.is_empty()) else {
                return identity_error(400, "The resource parameter is missing.");
            };
            if request.param("client_id").is_some_and(|c| c != CLIENT_ID) {
                return identity_error(400, "Unable to load the requested managed identity.");
            }
            let audience = audience.unwrap_or_else(|| resource.trim_end_matches('/').to_string());
            let token = mint_with(&audience, now - SKEW, expires);
            let body = serde_json::json!({
                "access_token": token,
                "expires_on": expires.to_string(),
                "resource": resource,
                "token_type": "Bearer",
                "client_id": CLIENT_ID,
            });
            (200, body.to_string())
        }
        TokenKind::ClientCredentials => {
            if request.method != "POST" {
                return error(
                    405,
                    "invalid_request",
                    "AADSTS900561: The endpoint only accepts POST requests.",
                );
            }
            if request.path != format!("/{TENANT_ID}/oauth2/v2.0/token") {
                return error(
                    400,
                    "invalid_request",
                    "AADSTS90002: Tenant not found. Check the tenant id.",
                );
            }
            if request.param("grant_type") != Some("client_credentials") {
                return error(
                    400,
                    "unsupported_grant_type",
                    "AADSTS70003: The app requested an unsupported grant type.",
                );
            }
            if request.param("client_id") != Some(CLIENT_ID) {
                return error(
                    400,
                    "unauthorized_client",
                    "AADSTS700016: Application not found in the directory.",
                );
            }
            match credential {
                Credential::Matched => {}
                Credential::Missing => {
                    return error(
                        401,
                        "invalid_client",
                        "AADSTS7000216: 'client_assertion', 'client_secret' or 'request' is \
                         required for the 'client_credentials' grant type.",
                    )
                }
                Credential::Wrong => {
                    return error(
                        401,
                        "invalid_client",
                        "AADSTS7000215: Invalid client secret provided. Ensure the secret being \
                         sent in the request is the client secret value, not the client secret \
                         ID.",
                    )
                }
            }
            let Some(scope) = request
                .param("scope")
                .and_then(|s| s.strip_suffix("/.default"))
            else {
                return error(
                    400,
                    "invalid_scope",
                    "AADSTS1002012: The provided value for scope is not valid: a client \
                     credentials request needs a scope ending in /.default.",
                );
            };
            let audience = audience.unwrap_or_else(|| scope.to_string());
            let token = mint_with(&audience, now - SKEW, expires);
            let body = serde_json::json!({
                "token_type": "Bearer",
                "expires_in": lifetime.as_secs(),
                "ext_expires_in": lifetime.as_secs(),
                "access_token": token,
            });
            (200, body.to_string())
        }
        TokenKind::Other => error(404, "not_found", "No such endpoint."),
    }
}

fn fault_body(status: u16) -> String {
    let code = if status >= 500 {
        "temporarily_unavailable"
    } else {
        "invalid_request"
    };
    serde_json::json!({ "error": code, "error_description": "a test fault" }).to_string()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Reads one request: its head, then a `Content-Length` body (a form's parameters join the
/// query's). `None` when the connection ended early or the request is too large.
fn read_request<R: BufRead>(reader: &mut R) -> Option<Incoming> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        let n = reader
            .by_ref()
            .take((MAX_HEAD - head.len()) as u64)
            .read_until(b'\n', &mut head)
            .ok()?;
        if n == 0 || head.len() >= MAX_HEAD {
            return None;
        }
        let line = &head[before..];
        if line == b"\r\n" || line == b"\n" {
            break;
        }
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let mut lines = text.lines();
    let mut start = lines.next()?.split(' ');
    let method = start.next()?.to_string();
    let target = start.next()?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut incoming = Incoming {
        method,
        path: path.to_string(),
        params: parse_form(query),
        headers,
    };
    let length: usize = match incoming.header("content-length") {
        Some(n) => n.parse().ok()?,
        None => 0,
    };
    if length > MAX_BODY {
        return None;
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let form = incoming
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    if form {
        let params = parse_form(&String::from_utf8_lossy(&body));
        incoming.params.extend(params);
    }
    Some(incoming)
}

/// `a=1&b=x%2Fy+z` as decoded pairs.
fn parse_form(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// Form decoding: `+` is a space, `%XX` a byte; a malformed escape stays as it is.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_decoding() {
        assert_eq!(
            decode("https%3A%2F%2Fstorage.azure.com%2F.default"),
            STORAGE_SCOPE
        );
        assert_eq!(decode("a+b%2"), "a b%2");
        assert_eq!(decode("%zz%41"), "%zzA");
        assert_eq!(
            parse_form("grant_type=client_credentials&x"),
            vec![
                ("grant_type".to_string(), "client_credentials".to_string()),
                ("x".to_string(), String::new())
            ]
        );
    }

    #[test]
    fn minted_tokens_carry_the_claims_azurite_checks() {
        let token = mint(Duration::from_secs(600));
        assert!(token.ends_with('.'), "alg none: an empty signature part");
        assert_eq!(token.matches('.').count(), 2);
        let c = claims(&token).expect("claims");
        assert_eq!(c["aud"], STORAGE_AUDIENCE);
        assert_eq!(c["iss"], format!("https://sts.windows.net/{TENANT_ID}/"));
        let now = crate::unix_now();
        let nbf = c["nbf"].as_u64().unwrap();
        let exp = c["exp"].as_u64().unwrap();
        assert!(nbf < now && now < exp, "{nbf} {now} {exp}");
        assert_eq!(c["iat"], c["nbf"]);
    }
}
