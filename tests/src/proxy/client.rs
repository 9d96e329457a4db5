//! The client connection the proxy serves (plain TCP, or TLS over TCP): writing to it, ending it
//! cleanly, and resetting it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use rustls::{ServerConnection, StreamOwned};

/// A client connection the proxy serves: plain TCP, or TLS over TCP.
pub(super) trait ClientStream: Read + Write {
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
pub(super) fn send<S: ClientStream>(stream: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes)?;
    stream.flush()
}

/// Resets the connection (RST, not FIN; with TLS, no `close_notify` either): the peer sees a
/// broken connection.
pub(super) fn reset<S: ClientStream>(stream: S) {
    let _ = socket2::SockRef::from(stream.tcp()).set_linger(Some(Duration::ZERO));
    drop(stream);
}
