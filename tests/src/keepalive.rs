//! A minimal HTTP/1.1 client on one keep-alive connection, with no `TCP_NODELAY` and no
//! buffering tricks: it sees answers the way keep-alive clients (wrk, Python's `http.client`,
//! connection pools) do, delayed-ACK stalls included. It also tells in how many reads each
//! answer arrived.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One answer on a keep-alive connection.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status.
    pub status: u16,
    /// The head (status line and headers), as text.
    pub head: String,
    /// The body (de-chunked).
    pub body: Vec<u8>,
    /// How many reads the whole answer took (1: it arrived in one piece).
    pub reads: usize,
    /// From the request's first byte sent to the answer's last byte read.
    pub took: Duration,
}

/// A keep-alive connection.
pub struct KeepAlive {
    stream: TcpStream,
    host: String,
    buffer: Vec<u8>,
}

impl KeepAlive {
    /// Connects to `addr` (`127.0.0.1:port`).
    pub fn connect(addr: &str) -> std::io::Result<KeepAlive> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(KeepAlive {
            stream,
            host: addr.to_string(),
            buffer: Vec::new(),
        })
    }

    /// Sends one request and reads its answer.
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Reply> {
        let mut request = format!("{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.host);
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        let started = Instant::now();
        self.stream.write_all(&bytes)?;
        let mut reads = 0;
        loop {
            if let Some((reply, used)) = parse(&self.buffer, method == "HEAD") {
                self.buffer.drain(..used);
                return Ok(Reply {
                    reads,
                    took: started.elapsed(),
                    ..reply
                });
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
            reads += 1;
            self.buffer.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A whole answer at the start of `buf`, and how many bytes it took; `None` if incomplete.
fn parse(buf: &[u8], head_only: bool) -> Option<(Reply, usize)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..end - 4]).to_string();
    let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let reply = |body: Vec<u8>| Reply {
        status,
        head: head.clone(),
        body,
        reads: 0,
        took: Duration::ZERO,
    };
    if head_only || status == 204 || status == 304 {
        return Some((reply(Vec::new()), end));
    }
    if header("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        let mut at = end;
        let mut body = Vec::new();
        loop {
            let line_end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
            let size_text = String::from_utf8_lossy(&buf[at..line_end]);
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            at = line_end + 2;
            if size == 0 {
                // No trailers are expected: the final CRLF.
                if buf.len() < at + 2 {
                    return None;
                }
                return Some((reply(body), at + 2));
            }
            if buf.len() < at + size + 2 {
                return None;
            }
            body.extend_from_slice(&buf[at..at + size]);
            at += size + 2;
        }
    }
    let length: usize = header("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    if buf.len() < end + length {
        return None;
    }
    Some((reply(buf[end..end + length].to_vec()), end + length))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn parses_length_and_chunked_answers_and_waits_for_the_rest() {
        let a = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabcHTTP/1.1";
        let (r, used) = parse(a, false).unwrap();
        assert_eq!((r.status, r.body.as_slice(), used), (200, &b"abc"[..], 41));
        assert!(parse(&a[..40], false).is_none());
        let c =
            b"HTTP/1.1 401 Unauthorized\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let (r, used) = parse(c, false).unwrap();
        assert_eq!(
            (r.status, r.body.as_slice(), used),
            (401, &b"abc"[..], c.len())
        );
        assert!(parse(&c[..c.len() - 1], false).is_none());
    }
}
