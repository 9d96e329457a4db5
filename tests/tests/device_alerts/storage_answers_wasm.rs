//! The HTTP functions, as `.wasm` under the real `spin up`, against storage answers that are odd
//! (Azurite behind a forwarding proxy that alters them: a broken or hostile server, or a man in
//! the middle on `http`), and against term switches whose steps fail (found by review).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use leasegate_tests::app::{call, post_telemetry, Answer, App};
use leasegate_tests::proxy::Fault;
use leasegate_tests::Azurite;
use serde_json::json;

const AUTH: (&str, &str) = ("authorization", "Bearer test-gate-token-7f3a");

/// Reads up to the end of an HTTP head (`\r\n\r\n`); `None` when the peer closed first.
fn read_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
        if head.len() > 64 * 1024 {
            return None;
        }
    }
    Some(head)
}

fn header_value(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// Replaces (or adds) header `name` in an HTTP head.
fn set_header(head: &str, name: &str, value: &str) -> String {
    let mut lines: Vec<String> = head
        .trim_end_matches("\r\n")
        .split("\r\n")
        .filter(|l| {
            !l.split_once(':')
                .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        })
        .map(str::to_string)
        .collect();
    lines.push(format!("{name}: {value}"));
    format!("{}\r\n\r\n", lines.join("\r\n"))
}

/// Forwards every request to Azurite, one per connection; answers to lease acquires get
/// `Date: date`. Returns the proxy's port.
fn start_proxy(date: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let azurite = Azurite::shared().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { continue };
            std::thread::spawn(move || {
                let _ = client.set_read_timeout(Some(Duration::from_secs(30)));
                let Some(head) = read_head(&mut client) else {
                    return;
                };
                let head = String::from_utf8_lossy(&head).to_string();
                let length: usize = header_value(&head, "content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0u8; length];
                if client.read_exact(&mut body).is_err() {
                    return;
                }
                let acquire = header_value(&head, "x-ms-lease-action")
                    .is_some_and(|a| a.eq_ignore_ascii_case("acquire"));
                let mut upstream = TcpStream::connect(("127.0.0.1", azurite)).unwrap();
                let head = set_header(&head, "connection", "close");
                upstream.write_all(head.as_bytes()).unwrap();
                upstream.write_all(&body).unwrap();
                let mut answer = Vec::new();
                let _ = upstream.read_to_end(&mut answer);
                let split = answer
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .map_or(answer.len(), |p| p + 4);
                let (ahead, abody) = answer.split_at(split);
                let mut ahead = String::from_utf8_lossy(ahead).to_string();
                if acquire {
                    ahead = set_header(&ahead, "date", date);
                }
                ahead = set_header(&ahead, "connection", "close");
                let _ = client.write_all(ahead.as_bytes());
                let _ = client.write_all(abody);
                let _ = client.flush();
            });
        }
    });
    port
}

/// A lease acquire answered with `Date: Fri, 31 Dec 9999
/// 23:59:59 GMT` makes `Acquired::expires_at` fall in year 10000 (`native::acquire`:
/// `granted + d`), and `web::rfc3339` (humantime `format_rfc3339_seconds(..).to_string()`)
/// panics on it: the gate component traps (Spin answers 500) instead of a JSON answer.
#[test]
fn the_gate_survives_a_far_future_storage_date() {
    let proxy = start_proxy("Fri, 31 Dec 9999 23:59:59 GMT");
    let app = App::start(
        "dategate",
        &[("storage_origin", &format!("http://127.0.0.1:{proxy}"))],
    );
    let a = call(
        "POST",
        &app.url("/api/gate/far-future?window=30"),
        &[AUTH],
        b"",
    );
    assert!(
        a.status != 500 && a.json.is_object(),
        "the gate trapped on a storage Date: {} {}",
        a.status,
        a.text
    );
}

/// The same for device-alerts: a clear answer, never a trap.
#[test]
fn telemetry_survives_a_far_future_storage_date() {
    let proxy = start_proxy("Fri, 31 Dec 9999 23:59:59 GMT");
    let app = App::start(
        "datetel",
        &[("storage_origin", &format!("http://127.0.0.1:{proxy}"))],
    );
    let a = post_telemetry(
        &app,
        &json!({"deviceId": "far-future", "temperature": 99.0}),
    );
    assert!(
        a.status != 500 && a.json.is_object(),
        "device-alerts trapped on a storage Date: {} {}",
        a.status,
        a.text
    );
}

/// The proxy itself is transparent with an ordinary `Date`.
#[test]
fn the_proxy_is_transparent() {
    let proxy = start_proxy("Sat, 21 Nov 2026 14:00:00 GMT");
    let app = App::start(
        "datectl",
        &[("storage_origin", &format!("http://127.0.0.1:{proxy}"))],
    );
    let a = call(
        "POST",
        &app.url("/api/gate/control?window=30"),
        &[AUTH],
        b"",
    );
    assert_eq!(a.status, 200, "{}", a.text);
}

fn gate(app: &App, method: &str, path_and_query: &str, headers: &[(&str, &str)]) -> Answer {
    call(
        method,
        &app.url(&format!("/api/gate/{path_and_query}")),
        headers,
        b"",
    )
}

/// `DELETE` after a window change whose lease could not be let go frees the gate both ways.
///
/// Holder `h` takes the gate with `window=30` (native lease), then moves to `window=120` with
/// its `Lease-Id` (a record written under its lease, then the lease is given back). The
/// give-back (the only `comp=lease` request of that call) fails, which `record::acquire`
/// ignores: 200, acquired.
/// `DELETE` with `h`'s lease id then releases the native lease and `Locks::release` returns at
/// once, leaving the 120 s record: another holder gets 429 for two minutes.
#[test]
fn delete_frees_a_gate_after_a_window_change() {
    let app = App::start("gatedel", &[]);
    let key = "switched";
    let a = gate(&app, "POST", &format!("{key}?window=30&holder=h"), &[AUTH]);
    assert_eq!(a.status, 200, "{}", a.text);
    let lease_id = a.json["leaseId"].as_str().unwrap().to_string();
    let own = [AUTH, ("lease-id", lease_id.as_str())];
    app.storage.fault_on("comp=lease", Fault::Status(503));
    let moved = gate(&app, "POST", &format!("{key}?window=120&holder=h"), &own);
    app.storage.set_fault(None);
    assert_eq!(moved.status, 200, "{}", moved.text);
    assert_eq!(moved.json["leaseId"], lease_id.as_str());
    assert_eq!(moved.json["extended"], true);
    let del = gate(
        &app,
        "DELETE",
        key,
        &[AUTH, ("lease-id", lease_id.as_str())],
    );
    assert_eq!(del.status, 204, "{}", del.text);
    let other = gate(
        &app,
        "POST",
        &format!("{key}?window=120&holder=other"),
        &[AUTH],
    );
    let state = gate(&app, "GET", key, &[AUTH]);
    assert_eq!(
        other.status, 200,
        "h's DELETE answered 204, yet another holder is refused: {} (GET: {})",
        other.text, state.text
    );
}

/// A window change (15 s native to 120 s record) whose compare-and-swap answer is lost: 503,
/// and the holder keeps its gate (the error takes away nothing it held); its next POST settles
/// the state and its DELETE frees the gate.
#[test]
fn a_lost_window_change_is_settled_by_the_holder() {
    let app = App::start("gate503", &[]);
    let key = "lost-switch";
    let a = gate(&app, "POST", &format!("{key}?window=15&holder=h"), &[AUTH]);
    assert_eq!(a.status, 200, "{}", a.text);
    let lease_id = a.json["leaseId"].as_str().unwrap().to_string();
    let own = [AUTH, ("lease-id", lease_id.as_str())];
    app.storage.fault_on("comp=metadata", Fault::LoseAnswer);
    let moved = gate(&app, "POST", &format!("{key}?window=120&holder=h"), &own);
    app.storage.set_fault(None);
    assert_eq!(moved.status, 503, "{}", moved.text);
    let other = gate(
        &app,
        "POST",
        &format!("{key}?window=120&holder=other"),
        &[AUTH],
    );
    assert_eq!(other.status, 429, "{}", other.text);
    assert_eq!(other.json["holder"], "h");
    let again = gate(&app, "POST", &format!("{key}?window=120&holder=h"), &own);
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["leaseId"], lease_id.as_str());
    assert_eq!(
        again.json["fencingToken"], a.json["fencingToken"],
        "h's tenure goes on"
    );
    let del = gate(&app, "DELETE", key, &own);
    assert_eq!(del.status, 204);
    let other = gate(
        &app,
        "POST",
        &format!("{key}?window=120&holder=other"),
        &[AUTH],
    );
    assert_eq!(other.status, 200, "{}", other.text);
}

/// A holder's failed extension keeps its gate: nobody else gets it while its earlier
/// `expiresAt` is minutes away.
///
/// `h` holds `window=300` (a record, `expiresAt` ≈ now + 300 s). It extends with its
/// `Lease-Id` and `window=301` (so that the extension says more than the record and its
/// compare-and-swap is sent even within the same second), and that write's answer is lost;
/// `record::acquire` once cleared the record "given back" with `h`'s id, which removed the
/// tenure `h` already had, and `other` acquired at once: both callers were told they hold the
/// gate now.
#[test]
fn a_failed_extension_keeps_the_holders_gate() {
    let app = App::start("gateext", &[]);
    let key = "leader";
    let a = gate(&app, "POST", &format!("{key}?window=300&holder=h"), &[AUTH]);
    assert_eq!(a.status, 200, "{}", a.text);
    let lease_id = a.json["leaseId"].as_str().unwrap().to_string();
    app.storage.fault_on("comp=metadata", Fault::LoseAnswer);
    let (ext, seen) = app.counted(|| {
        gate(
            &app,
            "POST",
            &format!("{key}?window=301&holder=h"),
            &[AUTH, ("lease-id", lease_id.as_str())],
        )
    });
    app.storage.set_fault(None);
    assert_eq!(ext.status, 503, "{}", ext.text);
    let lost: Vec<String> = seen
        .iter()
        .filter(|o| o.fault == Some(Fault::LoseAnswer))
        .map(|o| o.describe())
        .collect();
    assert_eq!(
        lost,
        ["PUT metadata"],
        "the extension's write was sent and its answer lost: {seen:?}"
    );
    let other = gate(
        &app,
        "POST",
        &format!("{key}?window=300&holder=other"),
        &[AUTH],
    );
    assert_eq!(
        other.status, 429,
        "h was told it holds the gate until {} and its extension failed (503), yet another \
         holder acquired it now: {}",
        a.json["expiresAt"], other.text
    );
}
