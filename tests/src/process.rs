//! Processes the harness started, seen through Linux's `/proc`: their descendants (Azurite is
//! the child of its wrapper, Spin of its watchdog), whether one still runs, and the memory one
//! holds, in all and by kind of mapping. Also the process groups a test starts itself
//! ([`Group`]), among them the shipped SpinKube ticker ([`Ticker`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A process group started by a test (its leader started with `process_group(0)`; a launcher
/// may exec or start others in it), stopped when dropped: SIGTERM to the group, SIGKILL after
/// 5 s.
pub struct Group(pub Child);

impl Drop for Group {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.wait();
    }
}

/// The shipped SpinKube ticker, `deploy/spinkube/ticker.py`, run as the real process with its
/// environment (`LEASEGATE_TICK_TARGETS`, `LEASEGATE_TIMER_TOKEN`, `LEASEGATE_TICKS`), its
/// JSON lines written to a file in a scratch folder. Stopped, and its folder removed, when
/// dropped.
pub struct Ticker {
    group: Option<Group>,
    dir: PathBuf,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.group.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Ticker {
    /// Starts the ticker against `targets` (loopback `spin up` instances standing for pods) with
    /// the timer token `token` and the `LEASEGATE_TICKS` lines `ticks`.
    pub fn start(targets: &[SocketAddr], token: &str, ticks: &str) -> Ticker {
        let targets: Vec<String> = targets.iter().map(SocketAddr::to_string).collect();
        let dir = crate::spin::scratch_dir("ticker");
        let out = dir.join("ticker.out");
        let child = Command::new("python3")
            .arg(crate::app::root().join("deploy/spinkube/ticker.py"))
            .env("LEASEGATE_TICK_TARGETS", targets.join(","))
            .env("LEASEGATE_TIMER_TOKEN", token)
            .env("LEASEGATE_TICKS", ticks)
            .process_group(0)
            .stdout(std::fs::File::create(&out).expect("create the ticker's output file"))
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start ticker.py");
        Ticker {
            group: Some(Group(child)),
            dir,
        }
    }

    /// The JSON lines the ticker wrote so far (one per event: `start`, then a `tick` per
    /// request with its `status` and `answer`); a line still being written is left out.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        ticker_lines(&self.dir.join("ticker.out"))
    }

    /// Stops the ticker (its requests in flight are cut off) and returns all its lines.
    pub fn stop(mut self) -> Vec<serde_json::Value> {
        self.group.take();
        self.lines()
    }
}

/// The whole lines of the ticker's output file, parsed.
fn ticker_lines(out: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(|l| serde_json::from_str(l).expect("one JSON line per event"))
        .collect()
}

/// The process's parent and state (`R`, `S`, `Z`, ...) from `/proc/{pid}/stat`.
fn stat(pid: u32) -> Option<(u32, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; the command may hold spaces and parentheses.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Whether `pid` runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(_, state)| state != 'Z' && state != 'X')
}

/// Every live descendant of `pid` (children, their children, ...), parents first.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some((ppid, state)) = stat(p) {
                if state != 'Z' && state != 'X' {
                    children.entry(ppid).or_default().push(p);
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut next = vec![pid];
    // Bounded: a process is visited once, and there are finitely many.
    while let Some(p) = next.pop() {
        for c in children.remove(&p).unwrap_or_default() {
            out.push(c);
            next.push(c);
        }
    }
    out
}

/// The command name of `pid` (`/proc/{pid}/comm`), empty if it is gone.
pub fn name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// CPU time `pid` has used (user and system), in seconds; 0 if it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // After `(comm)`: state is field 3, utime 14 and stime 15, in clock ticks of 1/100 s
    // (USER_HZ, 100 on Linux).
    let rest = text.rfind(')').map_or("", |i| &text[i + 1..]);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// How many threads `pid` runs (`/proc/{pid}/status`), 0 if it is gone.
pub fn threads(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// `VmRSS` of `pid` in KiB (`/proc/{pid}/status`), 0 if it is gone.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Where a process's resident memory lives, by kind of mapping (KiB of `Rss` in
/// `/proc/{pid}/smaps`).
///
/// Wasmtime's pooling allocator (Spin's default where the address space allows) reserves its
/// pool of linear memories up front: 1,000 slots of 4 GiB and guard pages, terabytes of address
/// space. The kernel splits it into many mappings (each slot's accessible part, its guard, its
/// memory image), so mappings are first joined into contiguous anonymous regions; a region of a
/// terabyte or more is that pool. What is resident there is what instances touched and what the
/// allocator keeps for reuse (`linear_memory_keep_resident`, warm slots). Executable anonymous
/// mappings are compiled code (they end a region: code may sit right beside the pool); the rest
/// of the anonymous memory (the host's heap, thread and async stacks, tables) is counted
/// together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breakdown {
    /// Anonymous regions of 1 TiB and more: the pool of wasm linear memories.
    pub wasm_memories: u64,
    /// Mappings in that pool holding at least 256 KiB: about the slots kept warm.
    pub warm_slots: u64,
    /// Executable anonymous mappings: compiled wasm code.
    pub code: u64,
    /// Other anonymous memory: the host's heap, thread and async stacks, tables.
    pub heap: u64,
    /// File-backed mappings: the binary, libraries, databases.
    pub files: u64,
}

impl Breakdown {
    /// The sum of every kind.
    pub fn total(&self) -> u64 {
        self.wasm_memories + self.code + self.heap + self.files
    }
}

impl std::ops::Add for Breakdown {
    type Output = Breakdown;

    fn add(self, other: Breakdown) -> Breakdown {
        Breakdown {
            wasm_memories: self.wasm_memories + other.wasm_memories,
            warm_slots: self.warm_slots + other.warm_slots,
            code: self.code + other.code,
            heap: self.heap + other.heap,
            files: self.files + other.files,
        }
    }
}

/// The [`Breakdown`] of `pid`'s resident memory; all zero if it is gone.
pub fn breakdown(pid: u32) -> Breakdown {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    breakdown_of(&text)
}

const TIB: u64 = 1 << 40;

/// One mapping of `smaps`.
struct Mapping {
    start: u64,
    end: u64,
    executable: bool,
    /// Backed by a file (`memfd:` memory images count as anonymous: they live in the pool).
    file: bool,
    rss: u64,
}

fn mappings(smaps: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) =
                (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
            {
                // `start-end perms offset dev inode [path]`.
                let perms = fields.next().unwrap_or("");
                let path = fields.nth(3).unwrap_or("");
                out.push(Mapping {
                    start,
                    end,
                    executable: perms.contains('x'),
                    file: !path.is_empty()
                        && !path.starts_with('[')
                        && !path.starts_with("/memfd:"),
                    rss: 0,
                });
                continue;
            }
        }
        if first == "Rss:" {
            if let Some(m) = out.last_mut() {
                m.rss = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            }
        }
    }
    out
}

fn breakdown_of(smaps: &str) -> Breakdown {
    let mut out = Breakdown::default();
    let maps = mappings(smaps);
    let mut i = 0;
    while i < maps.len() {
        if maps[i].file {
            out.files += maps[i].rss;
            i += 1;
            continue;
        }
        if maps[i].executable {
            out.code += maps[i].rss;
            i += 1;
            continue;
        }
        // A region: contiguous anonymous mappings that are not code.
        let mut j = i + 1;
        while j < maps.len()
            && !maps[j].file
            && !maps[j].executable
            && maps[j].start == maps[j - 1].end
        {
            j += 1;
        }
        let region = &maps[i..j];
        let span = region[region.len() - 1].end - region[0].start;
        let rss: u64 = region.iter().map(|m| m.rss).sum();
        if span >= TIB {
            out.wasm_memories += rss;
            out.warm_slots += region.iter().filter(|m| m.rss >= 256).count() as u64;
        } else {
            out.heap += rss;
        }
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_resident_memory_by_kind_of_mapping() {
        // The binary; the heap; compiled code right below a 2 TiB pool split into a slot, its
        // guard and a memory image; a 1 GiB anonymous mapping; compiled code beside data; an
        // anonymous mapping after a file.
        let smaps = "\
55d0c0a00000-55d0c0b00000 r-xp 00000000 fd:01 123 /usr/local/bin/spin
Rss:                 800 kB
55d0c2000000-55d0c4000000 rw-p 00000000 00:00 0 [heap]
Rss:               12000 kB
7cfffff00000-7d0000000000 r-xp 00000000 00:00 0
Rss:                 500 kB
7d0000000000-7d0000100000 rw-p 00000000 00:00 0
Rss:                1024 kB
7d0000100000-7d0000112000 rw-p 00000000 00:05 9 /memfd:wasm-memory-image (deleted)
Rss:                  64 kB
7d0000112000-7f0000000000 ---p 00000000 00:00 0
Rss:                   0 kB
7f1000000000-7f1040000000 rw-p 00000000 00:00 0
Rss:                3000 kB
7f2000000000-7f2000100000 r-xp 00000000 00:00 0
Rss:                 700 kB
7f2000100000-7f2000200000 rw-p 00000000 00:00 0
Rss:                 100 kB
7f3000000000-7f3000100000 r--p 00000000 fd:01 9 /usr/lib/libc.so.6
Rss:                  40 kB
7f3000100000-7f3000200000 rw-p 00000000 00:00 0
Rss:                  30 kB
";
        let b = breakdown_of(smaps);
        assert_eq!(
            b,
            Breakdown {
                wasm_memories: 1088,
                warm_slots: 1,
                code: 1200,
                heap: 15130,
                files: 840
            }
        );
        assert_eq!(b.total(), 18258);
    }

    #[test]
    fn finds_this_process_and_its_children() {
        let me = std::process::id();
        assert!(alive(me));
        assert!(rss_kib(me) > 0);
        assert!(threads(me) >= 1);
        let spent = cpu_seconds(me);
        let busy = std::time::Instant::now();
        while busy.elapsed() < std::time::Duration::from_millis(300) {
            std::hint::black_box((0..1000).sum::<u64>());
        }
        assert!(cpu_seconds(me) > spent, "CPU time rises while busy");
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("run sleep");
        assert!(descendants(me).contains(&child.id()));
        assert_eq!(name(child.id()), "sleep");
        child.kill().expect("kill sleep");
        child.wait().expect("reap sleep");
        assert!(!alive(child.id()));
    }
}
