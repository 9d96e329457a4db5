//! A wasmtime-based host for leasegate's Spin app, for tests and for running locally without
//! Spin. It serves the components of a real `spin.toml` the way Spin's HTTP trigger does:
//!
//! * `wasi:http/incoming-handler` per request, with Spin's `spin-*` request headers; the
//!   response head leaves when the guest sets it and the body as it is written, on connections
//!   without `TCP_NODELAY`, as in Spin (see the `response` module: a body written after `set`
//!   costs a keep-alive client its delayed ACK, and [`RequestRecord::complete_at_set`] says so);
//! * `wasi:http/outgoing-handler`, checked against each component's `allowed_outbound_hosts`;
//! * `wasi:cli` (stdout and stderr captured per request into the host's log);
//! * `fermyon:spin/variables@2.0.0`, component variables templated from application variables;
//! * Spin's **cron trigger** (the `trigger-cron` plugin): `[[trigger.cron]]` components export
//!   `handle-cron-event` (`fermyon:spin-cron@2.0.0`); with [`HostConfig::cron`] each trigger
//!   fires on its schedule, and [`Host::fire_cron`] fires one event on demand.
//!
//! For tests it also **records every outbound request per inbound request** (and per cron
//! event) and can **inject faults** on outbound calls to an origin (connection refused, a
//! status such as 503, a delay). Every response carries `leasegate-host-request-id`, the key of
//! its [`RequestRecord`]. [`HostConfig::clock_offset_ms`] shifts the wall clock its guests see
//! (and the clock its cron schedules run by), to model deployments whose clocks disagree.

pub mod kv;
pub mod manifest;
mod pool;
mod response;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use tokio::net::TcpListener;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;
use wasmtime_wasi_http::{WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

use manifest::{App, ComponentConfig, CronTrigger};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit/variables.wit",
        world: "host",
        with: { "fermyon:spin/key-value.store": crate::kv::KvStore },
    });
}
use bindings::fermyon::spin::{key_value, variables};

/// The cron trigger's world, as the `trigger-cron` plugin binds it.
mod cron_bindings {
    wasmtime::component::bindgen!({
        path: "wit/spin-cron.wit",
        world: "spin-cron",
        exports: { default: async },
    });
}
use cron_bindings::fermyon::spin_cron::cron_types;
use cron_bindings::SpinCronPre;

/// How long one guest invocation may run before the host answers 500 and drops it.
pub const GUEST_TIME_LIMIT: Duration = Duration::from_secs(60);
/// Captured guest output per request.
const OUTPUT_CAPACITY: usize = 1 << 20;

/// What to do to outbound requests to one origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Fail as if the connection was refused.
    Refuse,
    /// Answer with this status (and, for 503, `x-ms-error-code: ServerBusy`) without sending.
    Status(u16),
    /// Wait this long, then send.
    Delay(Duration),
    /// Send, wait for the answer's head, then drop it and fail as if the connection timed out:
    /// storage acted, the guest cannot know.
    LoseAnswer,
}

/// One outbound request a guest made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbound {
    /// Method.
    pub method: String,
    /// `host:port`.
    pub authority: String,
    /// Path, without the query (which may hold a SAS).
    pub path: String,
    /// How it was authorized, never the credential itself: `SharedKey` (an `Authorization:
    /// SharedKey` header), `SAS` (a `sig=` in the query) or `none`.
    pub auth: &'static str,
}

/// One inbound request (or cron event) and what its guest did.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// The id sent back as `leasegate-host-request-id` (cron events take ids from the same
    /// sequence).
    pub id: u64,
    /// The component that served it.
    pub component: String,
    /// The method; `CRON` for a cron event.
    pub method: String,
    /// Path and query; for a cron event, its `timestamp` in decimal.
    pub path: String,
    /// The status the guest answered (500 if it trapped or timed out); for a cron event, 200
    /// when `handle-cron-event` returned `Ok`, else 500.
    pub status: u16,
    /// Outbound requests, in order.
    pub outbound: Vec<Outbound>,
    /// The most outbound requests this invocation had in flight at once.
    pub max_in_flight: usize,
    /// Lines the guest wrote to stdout and stderr.
    pub output: Vec<String>,
    /// Wall time of the whole invocation.
    pub duration: Duration,
    /// Its key-value operations, in order (`open`, `get`, `set`, `delete`, ...).
    pub key_value: Vec<String>,
    /// Whether the component had written and finished the response body when it set the
    /// response (so head and body left in one write); `None` if it set none (or a cron event).
    pub complete_at_set: Option<bool>,
}

impl RequestRecord {
    /// Outbound requests to `authority` (`host:port`).
    pub fn outbound_to(&self, authority: &str) -> usize {
        self.outbound
            .iter()
            .filter(|o| o.authority == authority)
            .count()
    }
}

/// One cron event and what its guest did.
#[derive(Debug, Clone)]
pub struct CronRecord {
    /// What `handle-cron-event` returned: `Ok(())`, the guest's own `Err(other(msg))` as
    /// `Err(msg)`, or the host's `Err("guest trapped: ...")` / `Err("guest ran past ...")`.
    pub result: Result<(), String>,
    /// The invocation, recorded like an HTTP request (also in [`Host::records`]): `method` is
    /// `"CRON"`, `path` the event's `timestamp` in decimal (`"1767225600"`), `status` 200 when
    /// `result` is `Ok` and 500 otherwise; `output` holds the guest's lines (and, after a trap or
    /// a time-out, the host's line saying so).
    pub record: RequestRecord,
}

impl CronRecord {
    /// The event's `timestamp` (Unix seconds).
    pub fn timestamp(&self) -> u64 {
        self.record.path.parse().unwrap_or_default()
    }
}

/// How to start a host.
///
/// `HostConfig::new(manifest)` gives the neutral values below; set fields on the result.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The Spin manifest.
    pub manifest: PathBuf,
    /// Application variable overrides (like `spin up --variable`).
    pub variables: HashMap<String, String>,
    /// Where to listen (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Also print guest output and a line per request (and per cron event) on stdout.
    pub echo: bool,
    /// Milliseconds this host's clock is ahead of real time (negative: behind). Its guests'
    /// `wasi:clocks/wall-clock` reads real time plus this, and its cron schedules run by that
    /// clock (the events' `timestamp` included). Monotonic clocks are not shifted. 0: real time.
    pub clock_offset_ms: i64,
    /// Fire each `[[trigger.cron]]` on its schedule while serving, like `spin up` with the
    /// `trigger-cron` plugin. Off: cron components are loaded, and fire only by
    /// [`Host::fire_cron`].
    pub cron: bool,
}

impl HostConfig {
    /// `manifest` with no variable overrides, on `127.0.0.1:0`, no echo, the real clock, cron
    /// schedules off.
    pub fn new(manifest: impl Into<PathBuf>) -> HostConfig {
        HostConfig {
            manifest: manifest.into(),
            variables: HashMap::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            echo: false,
            clock_offset_ms: 0,
            cron: false,
        }
    }
}

/// Time since the Unix epoch by a clock `offset_ms` ahead of the system's (behind if negative).
fn offset_now(offset_ms: i64) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let offset = Duration::from_millis(offset_ms.unsigned_abs());
    if offset_ms >= 0 {
        now.saturating_add(offset)
    } else {
        now.saturating_sub(offset)
    }
}

/// The wall clock a guest sees: the system's, shifted by the host's offset.
struct OffsetWallClock {
    offset_ms: i64,
    system: Box<dyn wasmtime_wasi::HostWallClock + Send>,
}

impl wasmtime_wasi::HostWallClock for OffsetWallClock {
    fn resolution(&self) -> Duration {
        self.system.resolution()
    }

    fn now(&self) -> Duration {
        offset_now(self.offset_ms)
    }
}

/// A fault for every path of an authority (`None`) or only paths containing a string.
type FaultRule = (Option<String>, Fault);

#[derive(Default)]
struct Shared {
    faults: Mutex<HashMap<String, Vec<FaultRule>>>,
    kv: Arc<kv::Kv>,
    records: Mutex<HashMap<u64, RequestRecord>>,
    records_changed: Condvar,
    in_flight: Mutex<u64>,
    cron: Mutex<Vec<CronRecord>>,
    /// Outbound keep-alive connections, pooled as Spin pools them.
    pool: pool::Pool,
}

/// Counts one guest invocation as running (for [`Host::wait_idle`]) until dropped.
struct Running(Arc<Shared>);

impl Running {
    fn start(shared: &Arc<Shared>) -> Running {
        if let Ok(mut n) = shared.in_flight.lock() {
            *n += 1;
        }
        Running(shared.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut n) = self.0.in_flight.lock() {
            *n -= 1;
        }
    }
}

/// A running host. Dropping it stops the server.
pub struct Host {
    addr: SocketAddr,
    shared: Arc<Shared>,
    served: Arc<Served>,
    runtime: tokio::runtime::Handle,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Served {
    app: App,
    engine: Engine,
    /// Components named by a `[[trigger.http]]` route, as `wasi:http/proxy` components.
    pres: HashMap<String, ProxyPre<State>>,
    /// Components named by a `[[trigger.cron]]`, as `fermyon:spin-cron` components.
    cron_pres: HashMap<String, SpinCronPre<State>>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    echo: bool,
    clock_offset_ms: i64,
}

/// What one invocation's guest wrote and sent, captured for its record.
struct Capture {
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
    outbound: Arc<Mutex<Vec<Outbound>>>,
    in_flight: Arc<InFlight>,
    key_value: Arc<Mutex<Vec<String>>>,
}

impl Capture {
    fn new() -> Capture {
        Capture {
            stdout: MemoryOutputPipe::new(OUTPUT_CAPACITY),
            stderr: MemoryOutputPipe::new(OUTPUT_CAPACITY),
            outbound: Arc::new(Mutex::new(Vec::new())),
            in_flight: Arc::new(InFlight::default()),
            key_value: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn key_value(&self) -> Vec<String> {
        self.key_value.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// Stdout's lines, then stderr's.
    fn output(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.stdout.contents())
            .lines()
            .chain(String::from_utf8_lossy(&self.stderr.contents()).lines())
            .map(str::to_string)
            .collect()
    }

    fn outbound(&self) -> Vec<Outbound> {
        self.outbound.lock().map(|o| o.clone()).unwrap_or_default()
    }

    fn max_in_flight(&self) -> usize {
        self.in_flight.max.load(Ordering::SeqCst)
    }
}

struct State {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    hooks: Hooks,
    variables: Arc<HashMap<String, String>>,
    kv: kv::KvAccess,
}

struct Hooks {
    allowed: Arc<Vec<String>>,
    outbound: Arc<Mutex<Vec<Outbound>>>,
    in_flight: Arc<InFlight>,
    shared: Arc<Shared>,
}

/// Outbound requests in flight for one invocation, and the most there ever were.
#[derive(Default)]
struct InFlight {
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
}

/// Counts one request in flight until dropped (when its response head arrived, or it failed).
struct Flying(Arc<InFlight>);

impl Flying {
    fn start(counter: &Arc<InFlight>) -> Flying {
        let now = counter.now.fetch_add(1, Ordering::SeqCst) + 1;
        counter.max.fetch_max(now, Ordering::SeqCst);
        Flying(counter.clone())
    }
}

impl Drop for Flying {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for State {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

type SendFuture = Box<
    dyn std::future::Future<
            Output = wasmtime_wasi_http::Result<(
                http::Response<WasiBody>,
                Box<dyn std::future::Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
            )>,
        > + Send,
>;

impl WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn std::future::Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> SendFuture {
        let scheme = request.uri().scheme_str().unwrap_or("http").to_string();
        let authority = request
            .uri()
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let allowed = manifest::is_allowed(&self.allowed, &scheme, &authority);
        if allowed {
            if let Ok(mut out) = self.outbound.lock() {
                let shared_key = request
                    .headers()
                    .get(http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("SharedKey "));
                let sas = request
                    .uri()
                    .query()
                    .is_some_and(|q| q.split('&').any(|p| p.starts_with("sig=")));
                out.push(Outbound {
                    method: request.method().to_string(),
                    authority: authority.clone(),
                    path: request.uri().path().to_string(),
                    auth: match (shared_key, sas) {
                        (true, _) => "SharedKey",
                        (false, true) => "SAS",
                        (false, false) => "none",
                    },
                });
            }
        }
        // Matched, never kept: the query may hold a SAS.
        let line = format!(
            "{} {}",
            request.method(),
            request
                .uri()
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/")
        );
        let fault = self.shared.faults.lock().ok().and_then(|f| {
            f.get(&authority).and_then(|rules| {
                rules
                    .iter()
                    .find(|(part, _)| part.as_ref().is_none_or(|p| line.contains(p.as_str())))
                    .map(|(_, fault)| fault.clone())
            })
        });
        let in_flight = self.in_flight.clone();
        let shared = self.shared.clone();
        Box::new(async move {
            let _flying = Flying::start(&in_flight);
            if !allowed {
                return Err(wasmtime_wasi_http::Error::HttpRequestDenied);
            }
            match fault {
                Some(Fault::Refuse) => return Err(wasmtime_wasi_http::Error::ConnectionRefused),
                Some(Fault::Status(status)) => {
                    let mut response = http::Response::builder().status(status);
                    if status == 503 {
                        response = response.header("x-ms-error-code", "ServerBusy");
                    }
                    let body = Full::new(Bytes::from_static(b"injected fault"))
                        .map_err(|never| match never {})
                        .boxed_unsync();
                    let response = response
                        .body(body)
                        .map_err(|_| wasmtime_wasi_http::Error::InternalError(None))?;
                    let io: Box<
                        dyn std::future::Future<Output = wasmtime_wasi_http::Result<()>> + Send,
                    > = Box::new(async { Ok(()) });
                    return Ok((response, io));
                }
                Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
                Some(Fault::LoseAnswer) => {
                    let answered = wasmtime_wasi_http::default_send_request(request, options).await;
                    drop(answered);
                    return Err(wasmtime_wasi_http::Error::ConnectionReadTimeout);
                }
                None => {}
            }
            if scheme == "http" {
                let response = shared.pool.send(request, options).await?;
                let io: Box<
                    dyn std::future::Future<Output = wasmtime_wasi_http::Result<()>> + Send,
                > = Box::new(async { Ok(()) });
                return Ok((response, io));
            }
            let (response, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            let io: Box<dyn std::future::Future<Output = wasmtime_wasi_http::Result<()>> + Send> =
                Box::new(io);
            Ok((response.map(BodyExt::boxed_unsync), io))
        })
    }
}

impl variables::Host for State {
    fn get(&mut self, name: String) -> Result<String, variables::Error> {
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(variables::Error::InvalidName(name));
        }
        self.variables
            .get(&name)
            .cloned()
            .ok_or(variables::Error::Undefined(name))
    }
}

impl cron_types::Host for State {}

impl Host {
    /// Loads the manifest, compiles its components and starts serving (and, with
    /// [`HostConfig::cron`], firing its cron triggers).
    pub fn start(config: HostConfig) -> Result<Host> {
        let app = manifest::load(&config.manifest, &config.variables)?;
        let engine = engine()?;
        let mut linker: Linker<State> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        variables::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
        key_value::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
        // The types-only `fermyon:spin-cron/cron-types@2.0.0`, which cron components import.
        cron_types::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
        let http_ids: std::collections::BTreeSet<&String> =
            app.routes.iter().map(|(_, c)| c).collect();
        let cron_ids: std::collections::BTreeSet<&String> =
            app.cron.iter().map(|t| &t.component).collect();
        let mut pres = HashMap::new();
        let mut cron_pres = HashMap::new();
        for (id, c) in &app.components {
            let component = load_component(&engine, &c.source).with_context(|| {
                format!(
                    "loading component {id} from {} (build it: cargo build --release --target wasm32-wasip2)",
                    c.source.display()
                )
            })?;
            // Only the interfaces above are provided: a component importing another Spin
            // interface (key-value, sqlite, ...) fails here, at load time, with its name.
            // (`define_unknown_imports_as_traps` is not used: it shadows the semver-matched
            // WASI imports and breaks the typed `wasi:http` export.)
            let instance_pre = linker
                .instantiate_pre(&component)
                .map_err(anyhow::Error::from)
                .with_context(|| format!("component {id}"))?;
            // Each trigger checks the export it calls, as Spin's triggers do; a component may
            // export both (extra exports are fine).
            if http_ids.contains(id) {
                let pre = ProxyPre::new(instance_pre.clone())
                    .map_err(anyhow::Error::from)
                    .with_context(|| format!("component {id} is not a wasi:http component"))?;
                pres.insert(id.clone(), pre);
            }
            if cron_ids.contains(id) {
                let pre = SpinCronPre::new(instance_pre)
                    .map_err(anyhow::Error::from)
                    .with_context(|| {
                        format!(
                            "component {id} is named by [[trigger.cron]] but does not export \
                             handle-cron-event (fermyon:spin-cron@2.0.0)"
                        )
                    })?;
                cron_pres.insert(id.clone(), pre);
            }
        }
        let shared = Arc::new(Shared::default());
        let served = Arc::new(Served {
            app,
            engine,
            pres,
            cron_pres,
            shared: shared.clone(),
            next_id: AtomicU64::new(1),
            echo: config.echo,
            clock_offset_ms: config.clock_offset_ms,
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let listener = runtime
            .block_on(TcpListener::bind(config.listen))
            .with_context(|| format!("listening on {}", config.listen))?;
        let addr = listener.local_addr()?;
        if config.cron {
            // One task per trigger; they end with the runtime, when the host is dropped.
            for trigger in &served.app.cron {
                runtime.spawn(served.clone().run_schedule(trigger.clone()));
            }
        }
        let handle = runtime.handle().clone();
        let for_server = served.clone();
        let (shutdown, mut stop) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let served = for_server;
            runtime.block_on(async move {
                loop {
                    tokio::select! {
                        _ = &mut stop => break,
                        accepted = listener.accept() => {
                            let Ok((stream, client)) = accepted else { continue };
                            let served = served.clone();
                            tokio::spawn(async move {
                                let service = hyper::service::service_fn(move |req| {
                                    let served = served.clone();
                                    async move { Ok::<_, std::convert::Infallible>(served.handle(req, client).await) }
                                });
                                let _ = http1::Builder::new()
                                    .keep_alive(true)
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            });
                        }
                    }
                }
            });
            runtime.shutdown_timeout(Duration::from_secs(1));
        });
        Ok(Host {
            addr,
            shared,
            served,
            runtime: handle,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://{addr}`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The app's key-value store (`default`).
    pub fn kv(&self) -> &kv::Kv {
        &self.shared.kv
    }

    /// Injects `fault` on outbound requests to `authority` (`host:port`); `None` clears every
    /// fault on it.
    pub fn set_fault(&self, authority: &str, fault: Option<Fault>) {
        if let Ok(mut faults) = self.shared.faults.lock() {
            match fault {
                Some(f) => faults.insert(authority.to_string(), vec![(None, f)]),
                None => faults.remove(authority),
            };
        }
    }

    /// Injects `fault` only on outbound requests to `authority` whose method, path and query
    /// (`PUT /devstoreaccount1/c/alerts/d?comp=metadata`) contain `part`: one device's lock
    /// blob, or one step of an acquisition. Earlier faults stay; the newest matching one wins.
    pub fn set_request_fault(&self, authority: &str, part: &str, fault: Fault) {
        if let Ok(mut faults) = self.shared.faults.lock() {
            faults
                .entry(authority.to_string())
                .or_default()
                .insert(0, (Some(part.to_string()), fault));
        }
    }

    /// The record of inbound request `id`, waiting up to `limit` for its guest to finish.
    pub fn record(&self, id: u64, limit: Duration) -> Option<RequestRecord> {
        let deadline = Instant::now() + limit;
        let mut records = self.shared.records.lock().ok()?;
        loop {
            if let Some(r) = records.get(&id) {
                return Some(r.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            records = self
                .shared
                .records_changed
                .wait_timeout(records, left)
                .ok()?
                .0;
        }
    }

    /// Runs one cron event now, as the `trigger-cron` plugin does on schedule: a fresh instance
    /// of `component` (one of the manifest's `[[trigger.cron]]` components) whose
    /// `handle-cron-event` is called with `timestamp` (Unix seconds) and awaited, at most
    /// [`GUEST_TIME_LIMIT`]. The event is recorded like a request (see [`CronRecord`]).
    ///
    /// Blocks the calling thread; any number of threads may call it at once (call it from
    /// outside an async runtime). `Err` only when the host cannot run the event (unknown or
    /// non-cron component, host stopped); the guest's own outcome is in [`CronRecord::result`].
    pub fn fire_cron(&self, component: &str, timestamp: u64) -> Result<CronRecord> {
        let served = self.served.clone();
        let component = component.to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        self.runtime.spawn(async move {
            let _ = tx.send(served.fire(&component, timestamp).await);
        });
        rx.recv()
            .map_err(|_| anyhow!("the host stopped before the cron event finished"))?
    }

    /// Every finished cron event so far (fired on schedule or by [`Host::fire_cron`]), in the
    /// order they started.
    pub fn cron_records(&self) -> Vec<CronRecord> {
        let mut all = self
            .shared
            .cron
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default();
        all.sort_by_key(|c| c.record.id);
        all
    }

    /// The cron triggers of the manifest.
    pub fn cron_triggers(&self) -> &[CronTrigger] {
        &self.served.app.cron
    }

    /// Every finished request (and cron event) so far.
    pub fn records(&self) -> Vec<RequestRecord> {
        let mut all: Vec<RequestRecord> = self
            .shared
            .records
            .lock()
            .map(|r| r.values().cloned().collect())
            .unwrap_or_default();
        all.sort_by_key(|r| r.id);
        all
    }

    /// Waits until no guest is running (up to `limit`); true if idle.
    pub fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self
                .shared
                .in_flight
                .lock()
                .map(|n| *n == 0)
                .unwrap_or(false)
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The one engine of this process (components compiled for it are shared by every host).
fn engine() -> Result<Engine> {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    if let Some(e) = ENGINE.get() {
        return Ok(e.clone());
    }
    let engine = Engine::new(&Config::new())?;
    Ok(ENGINE.get_or_init(|| engine).clone())
}

/// Compiles a component once per file version (path and modification time).
fn load_component(engine: &Engine, path: &std::path::Path) -> Result<Component> {
    type Cache = Mutex<HashMap<(PathBuf, std::time::SystemTime), Component>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let modified = std::fs::metadata(path)?.modified()?;
    let key = (path.to_path_buf(), modified);
    let cache = CACHE.get_or_init(Default::default);
    if let Some(c) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok(c);
    }
    let component = Component::from_file(engine, path)?;
    if let Ok(mut c) = cache.lock() {
        c.insert(key, component.clone());
    }
    Ok(component)
}

fn plain(status: u16, text: &str) -> hyper::Response<HyperOutgoingBody> {
    let body = Full::new(Bytes::from(text.to_string()))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = hyper::Response::new(body);
    *response.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response
}

impl Served {
    /// A store for one invocation of `config`'s component.
    fn store(&self, config: &ComponentConfig, capture: &Capture) -> Store<State> {
        Store::new(
            &self.engine,
            State {
                wasi: WasiCtx::builder()
                    .stdout(capture.stdout.clone())
                    .stderr(capture.stderr.clone())
                    .wall_clock(OffsetWallClock {
                        offset_ms: self.clock_offset_ms,
                        system: wasmtime_wasi::clocks::wall_clock(),
                    })
                    .build(),
                http: WasiHttpCtx::new(),
                table: ResourceTable::new(),
                hooks: Hooks {
                    allowed: Arc::new(config.allowed_outbound_hosts.clone()),
                    outbound: capture.outbound.clone(),
                    in_flight: capture.in_flight.clone(),
                    shared: self.shared.clone(),
                },
                variables: Arc::new(config.variables.clone()),
                kv: kv::KvAccess {
                    kv: self.shared.kv.clone(),
                    allowed: Arc::new(config.key_value_stores.clone()),
                    ops: capture.key_value.clone(),
                },
            },
        )
    }

    /// Fires `trigger` on its schedule, by this host's (offset) clock, until the runtime ends or
    /// the schedule has no more occurrences. Like the plugin, an event starts on time even if
    /// the previous one still runs.
    async fn run_schedule(self: Arc<Self>, trigger: CronTrigger) {
        let mut last: Option<u64> = None;
        loop {
            let now = offset_now(self.clock_offset_ms);
            // Strictly after the last event: a timer that wakes early never fires one twice.
            let after = last.map_or(now, |l| now.max(Duration::from_secs(l)));
            let Some(next) = trigger.next_after(after) else {
                return;
            };
            let due = Duration::from_secs(next);
            loop {
                let now = offset_now(self.clock_offset_ms);
                if now >= due {
                    break;
                }
                // At most a minute at a time: a far event follows the system clock if it is
                // set while we wait.
                tokio::time::sleep((due - now).min(Duration::from_secs(60))).await;
            }
            last = Some(next);
            let served = self.clone();
            let component = trigger.component.clone();
            tokio::spawn(async move {
                if let Err(e) = served.fire(&component, next).await {
                    eprintln!("cron {component} {next}: {e:#}");
                }
            });
        }
    }

    /// One cron event: a fresh instance of `component`, `handle-cron-event(timestamp)`.
    async fn fire(&self, component: &str, timestamp: u64) -> Result<CronRecord> {
        let config = self
            .app
            .components
            .get(component)
            .ok_or_else(|| anyhow!("no component {component} in the manifest"))?;
        let pre =
            self.cron_pres.get(component).cloned().ok_or_else(|| {
                anyhow!("component {component} is not named by any [[trigger.cron]]")
            })?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let running = Running::start(&self.shared);
        let capture = Capture::new();
        let mut store = self.store(config, &capture);
        let run = async {
            let cron = pre.instantiate_async(&mut store).await?;
            cron.call_handle_cron_event(&mut store, cron_types::Metadata { timestamp })
                .await
        };
        // The host's own failures (a trap, a time-out) also go into the output, as for HTTP.
        let (result, failure) = match tokio::time::timeout(GUEST_TIME_LIMIT, run).await {
            Ok(Ok(Ok(()))) => (Ok(()), None),
            Ok(Ok(Err(cron_types::Error::Other(message)))) => (Err(message), None),
            Ok(Err(e)) => {
                let failure = format!("guest trapped: {e:?}");
                (Err(failure.clone()), Some(failure))
            }
            Err(_) => {
                let failure = format!("guest ran past {GUEST_TIME_LIMIT:?}");
                (Err(failure.clone()), Some(failure))
            }
        };
        drop(store);
        let mut output = capture.output();
        output.extend(failure);
        let record = CronRecord {
            record: RequestRecord {
                id,
                component: component.to_string(),
                method: "CRON".to_string(),
                path: timestamp.to_string(),
                status: if result.is_ok() { 200 } else { 500 },
                outbound: capture.outbound(),
                max_in_flight: capture.max_in_flight(),
                output,
                duration: started.elapsed(),
                complete_at_set: None,
                key_value: capture.key_value(),
            },
            result,
        };
        if self.echo {
            for line in &record.record.output {
                println!("[{component}] {line}");
            }
            println!(
                "CRON {component} timestamp={timestamp} -> {} ({} outbound, {} ms)",
                match &record.result {
                    Ok(()) => "ok".to_string(),
                    Err(e) => format!("error: {e}"),
                },
                record.record.outbound.len(),
                record.record.duration.as_millis()
            );
        }
        if let Ok(mut records) = self.shared.records.lock() {
            records.insert(id, record.record.clone());
        }
        if let Ok(mut cron) = self.shared.cron.lock() {
            cron.push(record.clone());
        }
        self.shared.records_changed.notify_all();
        drop(running);
        Ok(record)
    }

    async fn handle(
        &self,
        mut req: hyper::Request<hyper::body::Incoming>,
        client: SocketAddr,
    ) -> hyper::Response<HyperOutgoingBody> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let path = req.uri().path().to_string();
        let path_and_query = req
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_else(|| "/".into());
        let method = req.method().to_string();
        let Some((route, component)) = self
            .app
            .routes
            .iter()
            .find_map(|(r, c)| r.matches(&path).map(|info| ((r, info), c)))
        else {
            return with_id(plain(404, "no route matches\n"), id);
        };
        let (route, path_info) = route;
        let Some(config) = self.app.components.get(component) else {
            return with_id(plain(500, "unknown component\n"), id);
        };
        let Some(pre) = self.pres.get(component).cloned() else {
            return with_id(plain(500, "component not loaded\n"), id);
        };
        let host = req
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("127.0.0.1")
            .to_string();
        let spin_headers = [
            ("spin-full-url", format!("http://{host}{path_and_query}")),
            ("spin-path-info", path_info.clone()),
            ("spin-matched-route", route.as_written()),
            ("spin-raw-component-route", route.as_written()),
            (
                "spin-component-route",
                route.as_written().trim_end_matches("/...").to_string(),
            ),
            ("spin-base-path", "/".to_string()),
            ("spin-client-addr", client.to_string()),
        ];
        for (name, value) in spin_headers {
            if let Ok(v) = http::HeaderValue::from_str(&value) {
                req.headers_mut().insert(name, v);
            }
        }
        let capture = Capture::new();
        let mut store = self.store(config, &capture);
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let complete_at_set = Arc::new(Mutex::new(None));
        let prepared = (|| -> Result<_> {
            let req = store
                .data_mut()
                .http()
                .new_incoming_request(Scheme::Http, req)?;
            // Spin sends the head the moment the component sets the response (see `response`).
            let at_set = complete_at_set.clone();
            let out = store
                .data_mut()
                .http()
                .new_response_outparam_from_callback(move |set| {
                    let set = set.map(|r| {
                        let (r, complete) = response::at_set(r);
                        if let Ok(mut c) = at_set.lock() {
                            *c = Some(complete);
                        }
                        r
                    });
                    let _ = sender.send(set);
                })?;
            Ok((req, out))
        })();
        let (guest_req, out) = match prepared {
            Ok(p) => p,
            Err(e) => return with_id(plain(400, &format!("bad request: {e}\n")), id),
        };
        if let Ok(mut n) = self.shared.in_flight.lock() {
            *n += 1;
        }
        let (status_tx, status_rx) = tokio::sync::oneshot::channel::<u16>();
        let shared = self.shared.clone();
        let echo = self.echo;
        let component_id = component.clone();
        let method_for_record = method.clone();
        let path_for_record = path_and_query.clone();
        tokio::spawn(async move {
            let run = async {
                let proxy = pre.instantiate_async(&mut store).await?;
                proxy
                    .wasi_http_incoming_handler()
                    .call_handle(&mut store, guest_req, out)
                    .await
            };
            let result = tokio::time::timeout(GUEST_TIME_LIMIT, run).await;
            let failure = match result {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("guest trapped: {e:?}")),
                Err(_) => Some(format!("guest ran past {GUEST_TIME_LIMIT:?}")),
            };
            drop(store);
            let status = status_rx.await.unwrap_or(500);
            let mut output = capture.output();
            if let Some(f) = failure {
                output.push(f);
            }
            let record = RequestRecord {
                id,
                component: component_id,
                method: method_for_record,
                path: path_for_record,
                status,
                outbound: capture.outbound(),
                max_in_flight: capture.max_in_flight(),
                output,
                duration: started.elapsed(),
                complete_at_set: complete_at_set.lock().ok().and_then(|c| *c),
                key_value: capture.key_value(),
            };
            if echo {
                for line in &record.output {
                    println!("[{}] {line}", record.component);
                }
                println!(
                    "{} {} -> {} ({} outbound, {} ms)",
                    record.method,
                    record.path,
                    record.status,
                    record.outbound.len(),
                    record.duration.as_millis()
                );
            }
            if let Ok(mut records) = shared.records.lock() {
                records.insert(id, record);
            }
            shared.records_changed.notify_all();
            if let Ok(mut n) = shared.in_flight.lock() {
                *n -= 1;
            }
        });
        let response = match tokio::time::timeout(GUEST_TIME_LIMIT, receiver).await {
            Ok(Ok(Ok(response))) => response,
            Ok(Ok(Err(code))) => plain(500, &format!("guest answered an error: {code:?}\n")),
            Ok(Err(_)) => plain(500, "guest did not answer (trapped?)\n"),
            Err(_) => plain(500, "guest did not answer in time\n"),
        };
        let _ = status_tx.send(response.status().as_u16());
        with_id(response, id)
    }
}

fn with_id(
    mut response: hyper::Response<HyperOutgoingBody>,
    id: u64,
) -> hyper::Response<HyperOutgoingBody> {
    response
        .headers_mut()
        .insert("leasegate-host-request-id", http::HeaderValue::from(id));
    response
}

/// The import and export names of a component file (for diagnosing link errors).
pub fn inspect(path: &std::path::Path) -> Result<(Vec<String>, Vec<String>)> {
    let engine = engine()?;
    let component = load_component(&engine, path)?;
    let ty = component.component_type();
    let imports = ty
        .imports(&engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let exports = ty
        .exports(&engine)
        .map(|(name, _)| name.to_string())
        .collect();
    Ok((imports, exports))
}

/// Parses `name=value` variable overrides.
pub fn parse_variable(arg: &str) -> Result<(String, String)> {
    let (name, value) = arg
        .split_once('=')
        .ok_or_else(|| anyhow!("--variable takes name=value"))?;
    Ok((name.trim().to_string(), value.to_string()))
}
