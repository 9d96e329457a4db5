//! The proxy's own tests: random faults drawn in their shares, applied and counted.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::rules::draw;
use super::{Fault, Proxy};

#[test]
fn a_draw_falls_in_one_faults_share_or_in_none() {
    let chances = [(Fault::Refuse, 0.1), (Fault::Status(503), 0.2)];
    assert_eq!(draw(&chances, 0.0), Some(Fault::Refuse));
    assert_eq!(draw(&chances, 0.099), Some(Fault::Refuse));
    assert_eq!(draw(&chances, 0.1), Some(Fault::Status(503)));
    assert_eq!(draw(&chances, 0.299), Some(Fault::Status(503)));
    assert_eq!(draw(&chances, 0.31), None);
    assert_eq!(draw(&chances, 0.999), None);
    assert_eq!(draw(&[], 0.0), None);
    let u: Vec<f64> = (0..1000).map(|_| crate::uniform()).collect();
    assert!(u.iter().all(|u| (0.0..1.0).contains(u)));
    let low = u.iter().filter(|u| **u < 0.5).count();
    assert!((400..600).contains(&low), "{low} of 1000 below 0.5");
}

/// One request on a new connection: the status, or `None` if the connection broke.
fn get(proxy: &Proxy) -> Option<u16> {
    let mut s = TcpStream::connect(proxy.authority()).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /x HTTP/1.1\r\nhost: sink\r\nconnection: close\r\n\r\n")
        .ok()?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).ok()?;
    String::from_utf8_lossy(&answer)
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
}

#[test]
fn random_faults_land_on_about_their_share_and_are_counted() {
    let sink = crate::sink::Sink::start();
    let proxy = Proxy::start(&sink.authority());
    proxy.set_recording(false);
    proxy.set_random_faults(&[(Fault::Status(503), 0.2), (Fault::Refuse, 0.1)]);
    let n = 1000;
    let (mut passed, mut busy, mut broken) = (0, 0, 0);
    for _ in 0..n {
        match get(&proxy) {
            Some(204) => passed += 1,
            Some(503) => busy += 1,
            None => broken += 1,
            Some(other) => panic!("answered {other}"),
        }
    }
    // Expected 200 and 100; five standard deviations either side (13 and 9.5).
    assert!((137..=263).contains(&busy), "503 on {busy} of {n}");
    assert!((52..=148).contains(&broken), "refused {broken} of {n}");
    assert_eq!(passed + busy + broken, n);
    assert_eq!(proxy.count(), n);
    assert!(proxy.seen().is_empty(), "recording was off");
    let applied = proxy.faults_applied();
    let of = |f: Fault| applied.iter().find(|(g, _)| *g == f).map_or(0, |(_, n)| *n);
    assert_eq!((of(Fault::Status(503)), of(Fault::Refuse)), (busy, broken));
    assert_eq!(
        sink.received().len(),
        passed,
        "only the unfaulted reached the sink"
    );
    // Rules still win over chances, and an empty list turns them off.
    proxy.set_fault(Some(Fault::Status(500)));
    assert_eq!(get(&proxy), Some(500));
    proxy.set_fault(None);
    proxy.set_random_faults(&[]);
    proxy.set_recording(true);
    assert!((0..20).all(|_| get(&proxy) == Some(204)));
    assert_eq!(proxy.seen().len(), 20);
}
