//! Processes the harness started, seen through Linux's `/proc`: their descendants (Azurite is
//! the child of its wrapper, Spin of its watchdog), whether one still runs, and the memory one
//! holds, in all and by kind of mapping.

use std::collections::HashMap;

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
/// Wasmtime's pooling allocator (Spin's default) reserves its pools up front as a few huge
/// anonymous mappings: the linear memories (4 GiB and guard pages per slot, 1,000 slots: terabytes
/// of address space), then the tables, the async stacks and the instances' own data (gigabytes).
/// What of them is resident is what the instances touched, kept after they end up to the
/// configured `keep_resident` sizes. Everything else anonymous is the host's heap (malloc arenas,
/// thread stacks); file mappings are the program, its libraries and compiled components.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breakdown {
    /// Anonymous mappings of 1 TiB and more: the pool of wasm linear memories.
    pub wasm_memories: u64,
    /// Anonymous mappings of 1 GiB up to 1 TiB: the pools of tables, stacks and instances.
    pub pools: u64,
    /// Other anonymous memory: the host's heap, thread stacks.
    pub heap: u64,
    /// File-backed mappings: the binary, libraries, compiled code, databases.
    pub files: u64,
}

impl Breakdown {
    /// The sum of every kind.
    pub fn total(&self) -> u64 {
        self.wasm_memories + self.pools + self.heap + self.files
    }
}

/// The [`Breakdown`] of `pid`'s resident memory; all zero if it is gone.
pub fn breakdown(pid: u32) -> Breakdown {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    breakdown_of(&text)
}

const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

fn breakdown_of(smaps: &str) -> Breakdown {
    let mut out = Breakdown::default();
    // The current mapping: its size in bytes and whether it is backed by a file.
    let mut current: Option<(u64, bool)> = None;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) =
                (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
            {
                // `start-end perms offset dev inode [path]`: a path that is not `[heap]`,
                // `[stack]` and the like names a file.
                let path = fields.nth(4).unwrap_or("");
                let file = !path.is_empty() && !path.starts_with('[');
                current = Some((end.saturating_sub(start), file));
                continue;
            }
        }
        if first == "Rss:" {
            let kib: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            match current {
                Some((_, true)) => out.files += kib,
                Some((size, false)) if size >= TIB => out.wasm_memories += kib,
                Some((size, false)) if size >= GIB => out.pools += kib,
                Some((_, false)) => out.heap += kib,
                None => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_resident_memory_by_kind_of_mapping() {
        let smaps = "\
55d0c0a00000-55d0c0b00000 r-xp 00000000 fd:01 123 /usr/local/bin/spin
Size:               1024 kB
Rss:                 800 kB
55d0c2000000-55d0c4000000 rw-p 00000000 00:00 0 [heap]
Size:              32768 kB
Rss:               12000 kB
7e0000000000-7f0000000000 rw-p 00000000 00:00 0
Size:           17179869184 kB
Rss:               90000 kB
7f1000000000-7f1080000000 rw-p 00000000 00:00 0
Size:            2097152 kB
Rss:                3000 kB
7f2000000000-7f2000100000 rw-p 00000000 00:00 0
Size:               1024 kB
Rss:                  40 kB
";
        let b = breakdown_of(smaps);
        assert_eq!(
            b,
            Breakdown {
                wasm_memories: 90000,
                pools: 3000,
                heap: 12040,
                files: 800
            }
        );
        assert_eq!(b.total(), 105840);
    }

    #[test]
    fn finds_this_process_and_its_children() {
        let me = std::process::id();
        assert!(alive(me));
        assert!(rss_kib(me) > 0);
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
