//! The proxy's connection to its upstream (plain TCP, or TLS over TCP), and a request forwarded
//! over it.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};

use super::message::{read_message, Message};
use super::{Shared, IO_TIMEOUT};

/// The proxy's connection to its upstream: plain TCP, or TLS over TCP.
pub(super) enum UpstreamStream {
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
pub(super) fn forward(
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
