//! The overview for a terminal, made from the JSON value [`gather`](super::gather) reads: a
//! section each for leaders, jobs, gates and the sweeper.

use std::fmt::Write as _;

use serde_json::Value;

use crate::status::{counters_line, log_entries, runs_table, seconds, text};

use super::SWEEPER_STATE;

/// The overview for a terminal: a section each for leaders, jobs, gates and the sweeper.
pub fn format_overview(v: &Value) -> String {
    let mut out = String::new();
    let dash = || "-".to_string();
    let _ = writeln!(
        out,
        "container {}{}",
        text(&v["container"]).unwrap_or_else(dash),
        text(&v["serverTime"]).map_or(String::new(), |t| format!(" (storage time {t})"))
    );

    out.push_str("\nleaders\n");
    match v["leaders"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        [] => out.push_str("  none (no leader/ lock blob)\n"),
        leaders => {
            let mut rows = vec![row(&[
                "GROUP",
                "STATE",
                "LEADER",
                "TERM",
                "SINCE",
                "LEASE LEFT",
            ])];
            for l in leaders {
                rows.push(vec![
                    text(&l["group"]).unwrap_or_else(dash),
                    text(&l["state"]).unwrap_or_else(dash),
                    text(&l["leader"]).unwrap_or_else(dash),
                    text(&l["term"]).unwrap_or_else(dash),
                    text(&l["since"]).unwrap_or_else(dash),
                    seconds(&l["leftSeconds"]).unwrap_or_else(dash),
                ]);
            }
            out.push_str(&columns(&rows, "  "));
        }
    }

    out.push_str("\njobs\n");
    let jobs = v["jobs"].as_array().map(Vec::as_slice).unwrap_or_default();
    if jobs.is_empty() {
        out.push_str("  none (no jobs/ blob)\n");
    }
    for j in jobs {
        format_job(&mut out, j);
    }

    out.push_str("\ngates (held lock blobs)\n");
    let mut rows = vec![row(&["PREFIX", "BLOBS", "HELD", "LONGEST HELD"])];
    for g in v["gates"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let longest = &g["longestHeld"];
        let longest = if longest.is_null() {
            dash()
        } else {
            let mut s = text(&longest["lock"]).unwrap_or_else(dash);
            if let Some(holder) = text(&longest["holder"]) {
                let _ = write!(s, " by {holder}");
            }
            if let Some(held) = seconds(&longest["heldSeconds"]) {
                let _ = write!(s, " for {held}");
            }
            if let Some(since) = text(&longest["since"]) {
                let _ = write!(s, " (since {since}");
                if let Some(left) = seconds(&longest["leftSeconds"]) {
                    let _ = write!(s, ", {left} left");
                }
                let _ = write!(
                    s,
                    ", token {})",
                    text(&longest["fencingToken"]).unwrap_or_else(dash)
                );
            }
            s
        };
        rows.push(vec![
            text(&g["prefix"]).unwrap_or_else(dash),
            text(&g["blobs"]).unwrap_or_else(dash),
            text(&g["held"]).unwrap_or_else(dash),
            longest,
        ]);
    }
    out.push_str(&columns(&rows, "  "));

    out.push_str("\nsweeper\n");
    format_sweeper(&mut out, &v["sweeper"]);

    if let Some(bad) = v["unreadable"].as_array().filter(|b| !b.is_empty()) {
        out.push_str("\nunreadable blobs (left out above)\n");
        for b in bad {
            let _ = writeln!(
                out,
                "  {}: {}",
                text(&b["blob"]).unwrap_or_else(dash),
                text(&b["error"]).unwrap_or_else(dash)
            );
        }
    }
    out
}

pub(super) fn format_job(out: &mut String, j: &Value) {
    let dash = || "-".to_string();
    let _ = writeln!(out, "  {}", text(&j["job"]).unwrap_or_else(dash));
    let mut line = |label: &str, value: &str| {
        let _ = writeln!(out, "    {label:<13}{value}");
    };
    if j["paused"].as_bool() == Some(true) {
        line("state", &crate::status::paused(j));
    } else if j["log"].as_bool() == Some(true) {
        line("state", "not paused");
    } else {
        line("state", "no log yet (jobs/JOB/log.json)");
    }
    let running = &j["running"];
    if !running.is_null() {
        let mut s = text(&running["holder"]).map_or("held".to_string(), |h| format!("by {h}"));
        if let Some(since) = text(&running["since"]) {
            let _ = write!(s, " since {since}");
        }
        if let Some(left) = seconds(&running["leftSeconds"]) {
            let _ = write!(s, ", lease {left} left");
        }
        line("running now", &s);
    }
    if let Some(schedule) = text(&j["schedule"]) {
        line("schedule", &schedule);
    }
    match (j["next"].as_array(), text(&j["nextError"])) {
        (Some(next), _) if next.is_empty() => {
            line("next", "none (the schedule has no later occurrence)")
        }
        (Some(next), _) => {
            for (i, n) in next.iter().enumerate() {
                let local = text(&n["local"])
                    .filter(|l| !l.is_empty() && Some(l) != text(&n["utc"]).as_ref());
                let when = match (text(&n["utc"]), local) {
                    (Some(utc), Some(local)) => format!("{utc}  local {local}"),
                    (Some(one), None) | (None, Some(one)) => one,
                    (None, None) => text(n).unwrap_or_else(dash),
                };
                line(if i == 0 { "next" } else { "" }, &when);
            }
        }
        (None, Some(error)) => line("next", &format!("not known: {error}")),
        (None, None) => line(
            "next",
            "not stored in the container (the schedule is the app's job_schedule): \
             add --app URL",
        ),
    }
    let r = &j["reservations"];
    let mut s = format!("{}", r["count"].as_u64().unwrap_or(0));
    if let Some(newest) = text(&r["newest"]) {
        let _ = write!(s, ", newest {newest}");
    }
    let open = r["open"].as_u64().unwrap_or(0);
    if open > 0 {
        let shown: Vec<String> = r["openShown"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|o| {
                format!(
                    "{} {} by {}",
                    text(&o["occurrence"]).unwrap_or_else(dash),
                    text(&o["status"]).unwrap_or_else(dash),
                    text(&o["instance"]).unwrap_or_else(dash)
                )
            })
            .collect();
        let more = open.saturating_sub(shown.len() as u64);
        let _ = write!(
            s,
            "; {open} without a final outcome: {}{}",
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
    }
    line("reservations", &s);
    if let Some(settled) = text(&j["settledThrough"]) {
        line("settled", &format!("through {settled}"));
    }
    if let Some(counters) = j["counters"].as_object().filter(|c| !c.is_empty()) {
        line("counters", &counters_line(counters));
    }
    match log_entries(&j["runs"]).as_deref() {
        Ok([]) => {
            let _ = writeln!(out, "    no runs recorded yet");
        }
        Ok(runs) => {
            let _ = writeln!(out, "    last runs (newest first):");
            for l in runs_table(runs).lines() {
                let _ = writeln!(out, "    {l}");
            }
        }
        Err(e) => {
            let _ = writeln!(out, "    last runs: {e}");
        }
    }
}

pub(super) fn format_sweeper(out: &mut String, s: &Value) {
    let dash = || "-".to_string();
    if s.is_null() {
        let _ = writeln!(
            out,
            "  no state yet ({SWEEPER_STATE}: the sweeper has not ticked)"
        );
        return;
    }
    let mut line = |label: &str, value: &str| {
        let _ = writeln!(out, "  {label:<10}{value}");
    };
    let passes = s["passes"].as_u64().unwrap_or(0);
    line(
        "passes",
        &match text(&s["lastPassCompletedAt"]) {
            Some(at) => format!("{passes} completed, the last at {at}"),
            None => format!("{passes} completed"),
        },
    );
    let containers = s["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let done = containers
        .iter()
        .filter(|c| c["status"].as_str() == Some("last"))
        .count();
    let on: Vec<&Value> = containers
        .iter()
        .filter(|c| c["off"].as_bool() != Some(true))
        .collect();
    // A pass starts no sooner than ttl_pass_interval_seconds after the last one completed.
    let started = on.iter().any(|c| c["status"].as_str() != Some("init"));
    line(
        "progress",
        &if started {
            format!(
                "pass {} under way: {done} of {} targets listed to the end",
                passes + 1,
                on.len()
            )
        } else {
            format!("pass {} not started yet", passes + 1)
        },
    );
    for c in containers {
        let mut target = text(&c["container"]).unwrap_or_else(dash);
        if let Some(prefix) = text(&c["prefix"]).filter(|p| !p.is_empty()) {
            let _ = write!(target, "/{prefix}");
        }
        let status = match (c["status"].as_str(), c["off"].as_bool()) {
            (_, Some(true)) => "off (no longer configured)".to_string(),
            (Some("init"), _) => "not reached yet".to_string(),
            (Some("current"), _) => "in progress, more pages".to_string(),
            (Some("last"), _) => "listed to the end".to_string(),
            _ => text(&c["status"]).unwrap_or_else(dash),
        };
        line(
            "",
            &format!(
                "{target} ({}): {status}",
                text(&c["kind"]).unwrap_or_else(dash)
            ),
        );
    }
    line(
        "counters",
        &format!(
            "purged {}, moved {}, locks removed {}, pages {}",
            s["purged"], s["moved"], s["locksRemoved"], s["pages"]
        ),
    );
    let unusable = s["unusable"].as_u64().unwrap_or(0);
    if unusable > 0 {
        line(
            "unusable",
            &format!("{unusable} marked blob(s) whose names cannot be swept"),
        );
    }
    let ticks = s["ticks"].as_array().map(Vec::as_slice).unwrap_or_default();
    if ticks.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  recent ticks ({} active):",
        s["activeTicks"].as_u64().unwrap_or(0)
    );
    let mut rows = vec![row(&[
        "INSTANCE",
        "LAST WRITE",
        "ACTIVE",
        "PURGED",
        "MOVED",
        "LOCKS REMOVED",
    ])];
    for t in ticks {
        let n = |key: &str| text(&t[key]).unwrap_or_else(|| "0".into());
        rows.push(vec![
            text(&t["instance"]).unwrap_or_else(dash),
            text(&t["since"]).unwrap_or_else(dash),
            match t["active"].as_bool() {
                Some(true) => "yes".into(),
                Some(false) => "no".into(),
                None => dash(),
            },
            n("purged"),
            n("moved"),
            n("locksRemoved"),
        ]);
    }
    out.push_str(&columns(&rows, "  "));
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Aligned columns, each line indented by `indent`, trailing spaces trimmed.
fn columns(rows: &[Vec<String>], indent: &str) -> String {
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..width)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = indent.to_string();
        for (i, cell) in r.iter().enumerate() {
            let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
