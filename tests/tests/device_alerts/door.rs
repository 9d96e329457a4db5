//! A webhook origin that refuses connections until opened: a port bound but not listening (a
//! connection to it is refused, so the caller knows nothing was sent), which, once opened,
//! passes every connection on to another address (the app's webhook proxy, known only once
//! the app has started).
//!
//! The proxy's `Fault::Refuse` reads the request before it resets the connection, so to the
//! app the webhook may have acted; this is the unreachable webhook.

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::{Domain, Socket, Type};

/// How long a passed-on connection may stay idle.
const IDLE: Duration = Duration::from_secs(120);

/// The door. Dropping it stops accepting.
pub struct Door {
    port: u16,
    socket: Mutex<Option<Socket>>,
    stop: Arc<AtomicBool>,
}

impl Door {
    /// A closed door on a free loopback port.
    pub fn closed() -> Door {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a socket");
        let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
        socket.bind(&any.into()).expect("bind the door");
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .expect("the door's address")
            .port();
        Door {
            port,
            socket: Mutex::new(Some(socket)),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// `http://127.0.0.1:{port}`: the origin the app is given.
    pub fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Opens the door: from now on connections are accepted and passed on to `to`
    /// (`127.0.0.1:port`).
    pub fn open(&self, to: &str) {
        let to: SocketAddr = to.parse().expect("host:port");
        let Some(socket) = self.socket.lock().expect("socket").take() else {
            return;
        };
        socket.listen(128).expect("listen");
        let listener = TcpListener::from(socket);
        listener.set_nonblocking(true).expect("non-blocking accept");
        let stop = self.stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        if let Ok(upstream) =
                            TcpStream::connect_timeout(&to, Duration::from_secs(10))
                        {
                            pipe(client, upstream);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies bytes both ways until either side ends (or stays idle too long).
fn pipe(a: TcpStream, b: TcpStream) {
    for (from, to) in [(&a, &b), (&b, &a)] {
        let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
            return;
        };
        let _ = from.set_read_timeout(Some(IDLE));
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        });
    }
}
