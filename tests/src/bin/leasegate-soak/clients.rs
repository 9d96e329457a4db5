//! The requests the soak sends to the app: telemetry threads, gate clients working between two
//! fenced writes, and the job's ticker.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use leasegate_tests::app::{GATE_TOKEN, TELEMETRY_TOKEN, TIMER_TOKEN};
use leasegate_tests::load::{http_request, Connection};
use leasegate_tests::random_below;

use crate::stats::{json, Kind};
use crate::{Soak, GATE_KEYS, GATE_MARGIN, GATE_WINDOWS, GATE_WORK, JOB};

fn auth(token: &str) -> String {
    format!("Bearer {token}")
}

impl Soak<'_> {
    /// A telemetry thread: one reading at a time, deployments in turn, devices at random.
    pub(crate) fn telemetry(&self, thread: usize) {
        let mut conns: Vec<Connection> = self.addrs.iter().map(|a| Connection::new(*a)).collect();
        let token = auth(TELEMETRY_TOKEN);
        let temperature = if self.options.cold { 12.0 } else { 35.0 };
        let mut n = thread;
        while self.running() {
            if thread >= self.options.threads_at(self.started.elapsed()) {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            let d = n % conns.len();
            n += 1;
            let device = random_below(self.options.devices);
            let body = serde_json::json!({
                "deviceId": format!("soak-device-{device}"),
                "temperature": temperature,
            })
            .to_string();
            let request = http_request(
                "POST",
                "/api/telemetry",
                &self.addrs[d].to_string(),
                &[
                    ("authorization", &token),
                    ("content-type", "application/json"),
                ],
                body.as_bytes(),
            );
            let sent = Instant::now();
            let a = conns[d].exchange(&request);
            let storage_ok = a.as_ref().is_ok_and(|a| {
                a.status == 200
                    && json(a)["decisions"].as_array().is_some_and(|ds| {
                        ds.iter().any(|x| {
                            x["decision"] == "notified"
                                || (x["decision"] == "throttled" && x["cached"] != true)
                        })
                    })
            });
            if a.is_err() {
                std::thread::sleep(Duration::from_millis(10));
            }
            self.count(Kind::Telemetry, d, sent, &a, storage_ok);
        }
    }

    /// A gate client of deployment `d`: take a key, work between two fenced writes, release.
    pub(crate) fn gate(&self, d: usize, client: usize) {
        let addr = self.addrs[d];
        let host = addr.to_string();
        let mut conn = Connection::new(addr);
        let fence_addr: SocketAddr = self.fence.authority().parse().expect("the fence's address");
        let mut fence = Connection::new(fence_addr);
        let token = auth(GATE_TOKEN);
        let holder = format!("soak-{d}-{client}");
        while self.running() {
            let key = random_below(GATE_KEYS);
            let window = GATE_WINDOWS[random_below(GATE_WINDOWS.len())];
            let target = format!("/api/gate/soak%2Fk{key}?window={window}&holder={holder}");
            let request = http_request("POST", &target, &host, &[("authorization", &token)], b"");
            let sent = Instant::now();
            let a = conn.exchange(&request);
            let granted = a.as_ref().ok().filter(|a| a.status == 200).map(json);
            self.count(Kind::GatePost, d, sent, &a, granted.is_some());
            let Some(grant) = granted else {
                // Busy or failed: come back soon (not after Retry-After: contention is the point).
                std::thread::sleep(Duration::from_millis(50 + random_below(100) as u64));
                continue;
            };
            self.stats.lock().expect("stats").gate.granted += 1;
            let (fencing, lease, ends) = (
                grant["fencingToken"].as_u64(),
                grant["leaseId"].as_str().unwrap_or("").to_string(),
                grant["expiresAt"].as_str().unwrap_or("").to_string(),
            );
            let ends_at = humantime::parse_rfc3339(&ends).ok();
            let in_time = ends_at.is_some_and(|e| SystemTime::now() + GATE_MARGIN < e);
            match (fencing, in_time) {
                (Some(fencing), true) => {
                    let mut refused = 0;
                    for phase in ["begin", "end"] {
                        let body = serde_json::json!({
                            "key": format!("soak/k{key}"),
                            "fencingToken": fencing,
                            "phase": phase,
                            "leaseEndsAt": ends,
                        })
                        .to_string();
                        let w = http_request(
                            "POST",
                            "/fence",
                            &self.fence.authority(),
                            &[("content-type", "application/json")],
                            body.as_bytes(),
                        );
                        if !fence.exchange(&w).is_ok_and(|a| a.status == 204) {
                            refused += 1;
                        }
                        if phase == "begin" {
                            std::thread::sleep(GATE_WORK);
                        }
                    }
                    let mut s = self.stats.lock().expect("stats");
                    s.gate.worked += 1;
                    s.gate.fence_refused += refused;
                }
                _ => self.stats.lock().expect("stats").gate.late += 1,
            }
            let request = http_request(
                "DELETE",
                &format!("/api/gate/soak%2Fk{key}"),
                &host,
                &[("authorization", &token), ("lease-id", &lease)],
                b"",
            );
            let sent = Instant::now();
            let a = conn.exchange(&request);
            let released = a.as_ref().is_ok_and(|a| a.status == 204);
            if released {
                self.stats.lock().expect("stats").gate.released += 1;
            }
            self.count(Kind::GateDelete, d, sent, &a, released);
            std::thread::sleep(Duration::from_millis(random_below(50) as u64));
        }
    }

    /// The job's scheduler on deployment `d`: a tick every second, at a random point of it.
    pub(crate) fn ticker(&self, d: usize) {
        let addr = self.addrs[d];
        let mut conn = Connection::new(addr);
        let token = auth(TIMER_TOKEN);
        let request = http_request(
            "POST",
            &format!("/api/jobs/{JOB}/tick"),
            &addr.to_string(),
            &[("authorization", &token)],
            b"",
        );
        while self.running() {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("after 1970");
            let into = Duration::from_nanos(u64::from(now.subsec_nanos()));
            let at = Duration::from_millis(100 + random_below(600) as u64);
            let wait = if into < at {
                at - into
            } else {
                Duration::from_secs(1) - into + at
            };
            std::thread::sleep(wait);
            if !self.running() {
                break;
            }
            let sent = Instant::now();
            let a = conn.exchange(&request);
            let ok = a.as_ref().is_ok_and(|a| (200..300).contains(&a.status));
            self.count(Kind::JobTick, d, sent, &a, ok);
        }
    }
}
