//! One HTTP/1.1 message read off a connection, head and body kept raw to be passed on as they
//! came.

use std::io::{BufRead, Read};

use super::{MAX_BODY, MAX_HEAD};

/// One HTTP message read off a connection: its head and body, raw.
pub(super) struct Message {
    pub(super) head: Vec<u8>,
    pub(super) body: Vec<u8>,
    /// The first line (request line or status line).
    pub(super) start: String,
    pub(super) headers: Vec<(String, String)>,
}

impl Message {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn bytes(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        out.extend_from_slice(&self.body);
        out
    }
}

/// Reads one message: a request (`request_method` `None`) or the answer to a request made
/// with `request_method`. `None` when the connection ended or the message was malformed.
pub(super) fn read_message<R: BufRead>(
    reader: &mut R,
    request_method: Option<&str>,
) -> Option<Message> {
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
