//! A connection served: accepted (a thread each, up to the bound), each request's fault chosen,
//! the request counted and recorded, the fault applied or the request forwarded.

use std::io::BufReader;
use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rustls::{ServerConnection, StreamOwned};

use super::client::{reset, send, ClientStream};
use super::message::{read_message, Message};
use super::record::seen;
use super::rules::{draw, ruled_fault};
use super::upstream::{forward, UpstreamStream};
use super::{Fault, Shared, CONNECTION_LIMIT, IO_TIMEOUT, MAX_CONNECTIONS};

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

pub(super) fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
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

/// The fault for the request `METHOD target` (`line`): the newest matching rule's, else one
/// drawn from the chances, if any.
fn choose_fault(shared: &Shared, line: &str) -> Option<Fault> {
    let ruled = ruled_fault(&mut shared.rules.lock().expect("rules"), line);
    ruled.or_else(|| {
        let chances = shared.chances.lock().expect("chances");
        if chances.is_empty() {
            None
        } else {
            draw(&chances, crate::uniform())
        }
    })
}

/// Counts the request's arrival and its fault, and records it when recording is on.
fn note(shared: &Shared, request: &Message, method: &str, target: &str, fault: &Option<Fault>) {
    shared.arrived.fetch_add(1, Ordering::Relaxed);
    if let Some(f) = fault {
        let mut applied = shared.applied.lock().expect("applied");
        match applied.iter_mut().find(|(g, _)| g == f) {
            Some((_, n)) => *n += 1,
            None => applied.push((f.clone(), 1)),
        }
    }
    if shared.recording.load(Ordering::Relaxed) {
        shared
            .seen
            .lock()
            .expect("seen")
            .push(seen(request, method, target, fault));
    }
}

/// Serves one client connection, a request at a time, until it ends, breaks or runs past its
/// limit.
pub(super) fn serve<S: ClientStream>(client: S, shared: &Shared) {
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
        let fault = choose_fault(shared, &format!("{method} {target}"));
        note(shared, &request, &method, &target, &fault);
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
