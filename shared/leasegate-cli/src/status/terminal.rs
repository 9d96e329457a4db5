//! A `GET /api/jobs/{job}` answer for a terminal ([`format_status`]), and the pieces the
//! overview's table shares: a job's counters, its last runs (the log's entries, read by the
//! toolkit's record schema), and stored words cleaned for the terminal.

use std::fmt::Write as _;
use std::time::Duration;

use leasegate_spin::record::LogEntry;
use serde_json::Value;

/// How many characters of a run's reason the table shows.
const REASON_CHARS: usize = 48;

/// A `GET /api/jobs/{job}` answer for a terminal: the job, its schedule and zone, the next
/// occurrences, whether it is paused, its policies, its counters and the last runs as a table.
/// What the answer lacks (an older app answers only `job`, `periodSeconds`, `overlap` and
/// `reservations`) is left out; counters it lacks are 0.
pub fn format_status(v: &Value) -> String {
    let mut out = String::new();
    if !v.is_object() {
        out.push_str(&clean(&v.to_string()));
        out.push('\n');
        return out;
    }
    let mut line = |label: &str, value: &str| {
        let _ = writeln!(out, "{label:<10}{value}");
    };
    if let Some(job) = text(&v["job"]) {
        line("job", &job);
    }
    match (text(&v["schedule"]), text(&v["timeZone"])) {
        (Some(schedule), Some(zone)) => line("schedule", &format!("{schedule} ({zone})")),
        (Some(schedule), None) => line("schedule", &schedule),
        (None, Some(zone)) => line("time zone", &zone),
        (None, None) => {}
    }
    if let Some(period) = seconds(&v["periodSeconds"]) {
        line("period", &period);
    }
    if let Some(next) = v["next"].as_array() {
        if next.is_empty() {
            line("next", "none (the schedule has no later occurrence)");
        }
        for (i, n) in next.iter().enumerate() {
            // A UTC schedule's local time is its UTC time: said once.
            let local =
                text(&n["local"]).filter(|l| !l.is_empty() && Some(l) != text(&n["utc"]).as_ref());
            let when = match (text(&n["utc"]), local) {
                (Some(utc), Some(local)) => format!("{utc}  local {local}"),
                (Some(one), None) | (None, Some(one)) => one,
                (None, None) => text(n).unwrap_or_else(|| "-".into()),
            };
            line(if i == 0 { "next" } else { "" }, &when);
        }
    }
    match v["paused"].as_bool() {
        Some(true) => line("state", &paused(v)),
        Some(false) => line("state", "running normally"),
        None => {}
    }
    match (text(&v["catchUp"]), seconds(&v["catchUpWindowSeconds"])) {
        (Some(policy), Some(window)) => line("catch-up", &format!("{policy}, window {window}")),
        (Some(policy), None) => line("catch-up", &policy),
        (None, Some(window)) => line("catch-up", &format!("window {window}")),
        (None, None) => {}
    }
    if let Some(overlap) = text(&v["overlap"]) {
        line("overlap", &overlap);
    }
    match (&v["retries"], seconds(&v["retryDelaySeconds"])) {
        (r, _) if r.as_u64() == Some(0) => line("retries", "none"),
        (r, delay) if !r.is_null() => {
            let retries = text(r).unwrap_or_default();
            match delay {
                Some(delay) => line("retries", &format!("{retries}, {delay} apart")),
                None => line("retries", &retries),
            }
        }
        (_, Some(delay)) => line("retries", &format!("{delay} apart")),
        _ => {}
    }
    if let Some(settled) = text(&v["settledThrough"]) {
        line("settled", &format!("through {settled}"));
    }
    if let Some(counters) = v["counters"].as_object() {
        line("counters", &counters_line(counters));
    }
    match v["reservations"].as_array() {
        None => {}
        Some(runs) if runs.is_empty() => {
            out.push_str("\nno runs recorded yet\n");
        }
        Some(_) => match log_entries(&v["reservations"]) {
            Ok(runs) => {
                out.push_str("\nlast runs (newest first):\n");
                out.push_str(&runs_table(&runs));
            }
            Err(e) => {
                let _ = writeln!(out, "\nlast runs: {e}");
            }
        },
    }
    out
}

/// The log's entries in `runs` (the app's `reservations`, the overview's `runs`), as the
/// record schema reads them ([`leasegate_spin::record::LogEntry`]: fields it does not know
/// are ignored; none where `runs` is absent), or why they cannot be read.
pub(crate) fn log_entries(runs: &Value) -> Result<Vec<LogEntry>, String> {
    if runs.is_null() {
        return Ok(Vec::new());
    }
    serde_json::from_value(runs.clone()).map_err(|e| {
        format!(
            "not readable as job log entries ({})",
            clean(&e.to_string())
        )
    })
}

/// A job's counters in words: the known ones in their order (0 when absent), then any other.
pub(crate) fn counters_line(counters: &serde_json::Map<String, Value>) -> String {
    const KNOWN: [(&str, &str); 6] = [
        ("ran", "ran"),
        ("failed", "failed"),
        ("retried", "retried"),
        ("skippedOverlap", "skipped (overlap)"),
        ("skippedPaused", "skipped (paused)"),
        ("missed", "missed"),
    ];
    let mut parts: Vec<String> = KNOWN
        .iter()
        .map(|(key, name)| {
            let n = text(&counters.get(*key).cloned().unwrap_or(Value::Null));
            format!("{name} {}", n.unwrap_or_else(|| "0".into()))
        })
        .collect();
    for (key, n) in counters {
        if !KNOWN.iter().any(|(k, _)| k == key) {
            parts.push(format!("{} {}", clean(key), text(n).unwrap_or_default()));
        }
    }
    parts.join(", ")
}

/// The last runs (log entries) as aligned columns.
pub(crate) fn runs_table(runs: &[LogEntry]) -> String {
    let header = [
        "OCCURRENCE",
        "STATUS",
        "ATTEMPT",
        "INSTANCE",
        "TRIGGER",
        "PAST DUE",
        "FENCING TOKEN",
        "REASON",
    ];
    let dash = || "-".to_string();
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for r in runs {
        rows.push(vec![
            clean(&r.occurrence),
            clean(r.status.as_str()),
            r.attempt.map_or_else(dash, |a| a.to_string()),
            clean(&r.instance),
            clean(&r.trigger),
            if r.past_due { "yes" } else { "no" }.to_string(),
            r.fencing_token.map_or_else(dash, |t| t.to_string()),
            r.reason
                .as_deref()
                .map_or_else(dash, |r| shorten(&clean(r), REASON_CHARS)),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 < row.len() {
                let _ = write!(line, "{cell:<width$}  ", width = widths[i]);
            } else {
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `s` cut to `max` characters, the cut marked with `…`.
fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut cut: String = s.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// A field for the terminal: `None` when absent or null; strings cleaned ([`clean`]), other
/// values as compact JSON.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(clean(s)),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        other => Some(clean(&other.to_string())),
    }
}

/// A number of seconds with its reading: `3600 s (1h)`; not a whole number: as it is.
pub(crate) fn seconds(v: &Value) -> Option<String> {
    match v.as_u64() {
        Some(s) if s >= 60 => Some(format!(
            "{s} s ({})",
            humantime::format_duration(Duration::from_secs(s))
        )),
        Some(s) => Some(format!("{s} s")),
        None => text(v),
    }
}

/// `s` with every control, format or separator character (an escape sequence, U+202E ...)
/// shown as `\u{..}`: the app's words reach the terminal as text, never as commands.
pub(crate) fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() || leasegate::is_format_or_separator(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A paused job's state line: `paused since <when>: <note>` (each part where the job's status
/// `v` has it).
pub(crate) fn paused(v: &Value) -> String {
    let mut state = "paused".to_string();
    if let Some(since) = text(&v["pausedSince"]) {
        let _ = write!(state, " since {since}");
    }
    if let Some(note) = text(&v["pauseNote"]) {
        let _ = write!(state, ": {note}");
    }
    state
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn full() -> Value {
        json!({
            "job": "example-job",
            "schedule": "0 9 * * MON-FRI",
            "timeZone": "Europe/Berlin",
            "periodSeconds": 259200,
            "next": [
                {"utc": "2026-11-30T08:00:00Z", "local": "2026-11-30T09:00:00+01:00"},
                {"utc": "2026-12-01T08:00:00Z", "local": "2026-12-01T09:00:00+01:00"},
                {"utc": "2026-12-02T08:00:00Z", "local": "2026-12-02T09:00:00+01:00"}
            ],
            "catchUp": "latest",
            "catchUpWindowSeconds": 3600,
            "overlap": "skip",
            "counters": {"ran": 12, "failed": 1, "retried": 1, "skippedOverlap": 0,
                         "skippedPaused": 2, "missed": 3},
            "paused": true,
            "pausedSince": "2026-11-27T10:00:00Z",
            "pauseNote": "db migration",
            "retries": 2,
            "retryDelaySeconds": 60,
            "settledThrough": "2026-11-27T09:00:00Z",
            "reservations": [
                {"occurrence": "2026-11-27T09:00:00Z", "occurrenceUnix": 1796202000u64,
                 "instance": "node-a", "reservedAt": "2026-11-27T09:00:00Z",
                 "status": "succeeded", "fencingToken": 117700000000000u64, "trigger": "cron",
                 "pastDue": false, "finishedAt": "2026-11-27T09:00:02Z", "attempt": 1},
                {"occurrence": "2026-11-26T09:00:00Z", "occurrenceUnix": 1796115600u64,
                 "instance": "node-b", "reservedAt": "2026-11-26T09:00:01Z",
                 "status": "failed", "fencingToken": 117694336000000u64, "trigger": "azure",
                 "pastDue": true, "finishedAt": "2026-11-26T09:00:31Z",
                 "reason": "the job answered 503 Service Unavailable after 30 s: upstream \
                            database refused the connection",
                 "attempt": 3},
                {"occurrence": "2026-11-25T09:00:00Z", "occurrenceUnix": 1796029200u64,
                 "instance": "node-a", "reservedAt": "2026-11-25T09:00:00Z",
                 "status": "skipped_paused", "trigger": "http", "pastDue": false,
                 "reason": null}
            ]
        })
    }

    fn old() -> Value {
        json!({
            "job": "example-job",
            "periodSeconds": 60,
            "overlap": "allow",
            "reservations": [
                {"occurrence": "2026-03-08T07:00:00Z", "occurrenceUnix": 1772953200u64,
                 "instance": "test-instance", "reservedAt": "2026-03-08T07:00:00Z",
                 "status": "succeeded", "fencingToken": 116175060172800u64, "trigger": "http",
                 "pastDue": false, "finishedAt": "2026-03-08T07:00:01Z"}
            ]
        })
    }

    #[test]
    fn the_full_answer_for_a_terminal() {
        let text = format_status(&full());
        let want = "\
job       example-job
schedule  0 9 * * MON-FRI (Europe/Berlin)
period    259200 s (3days)
next      2026-11-30T08:00:00Z  local 2026-11-30T09:00:00+01:00
          2026-12-01T08:00:00Z  local 2026-12-01T09:00:00+01:00
          2026-12-02T08:00:00Z  local 2026-12-02T09:00:00+01:00
state     paused since 2026-11-27T10:00:00Z: db migration
catch-up  latest, window 3600 s (1h)
overlap   skip
retries   2, 60 s (1m) apart
settled   through 2026-11-27T09:00:00Z
counters  ran 12, failed 1, retried 1, skipped (overlap) 0, skipped (paused) 2, missed 3

last runs (newest first):
OCCURRENCE            STATUS          ATTEMPT  INSTANCE  TRIGGER  PAST DUE  FENCING TOKEN    REASON
2026-11-27T09:00:00Z  succeeded       1        node-a    cron     no        117700000000000  -
2026-11-26T09:00:00Z  failed          3        node-b    azure    yes       117694336000000  the job answered 503 Service Unavailable after …
2026-11-25T09:00:00Z  skipped_paused  -        node-a    http     no        -                -
";
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn an_older_apps_answer_shows_what_it_has() {
        let text = format_status(&old());
        let want = "\
job       example-job
period    60 s (1m)
overlap   allow

last runs (newest first):
OCCURRENCE            STATUS     ATTEMPT  INSTANCE       TRIGGER  PAST DUE  FENCING TOKEN    REASON
2026-03-08T07:00:00Z  succeeded  -        test-instance  http     no        116175060172800  -
";
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn gaps_defaults_and_odd_values() {
        let mut v = full();
        v["paused"] = json!(false);
        v["counters"] = json!({"ran": 4, "compacted": 7});
        v["retries"] = json!(0);
        v["reservations"] = json!([]);
        v["next"] = json!([]);
        let text = format_status(&v);
        let mut utc = old();
        utc["next"] = json!([
            {"utc": "2026-11-30T08:00:00Z", "local": "2026-11-30T08:00:00Z"},
            {"utc": "2026-11-30T08:01:00Z", "local": ""},
            {"utc": "2026-11-30T08:02:00Z"}
        ]);
        assert!(
            format_status(&utc).contains(
                "next      2026-11-30T08:00:00Z\n          2026-11-30T08:01:00Z\n          \
                 2026-11-30T08:02:00Z\n"
            ),
            "{}",
            format_status(&utc)
        );
        assert!(text.contains("state     running normally\n"), "{text}");
        assert!(!text.contains("db migration"), "{text}");
        assert!(
            text.contains(
                "counters  ran 4, failed 0, retried 0, skipped (overlap) 0, skipped (paused) 0, \
                 missed 0, compacted 7\n"
            ),
            "{text}"
        );
        assert!(text.contains("retries   none\n"), "{text}");
        assert!(text.contains("next      none"), "{text}");
        assert!(text.ends_with("\nno runs recorded yet\n"), "{text}");

        // Nulls are absent; a paused job without note or time says only that.
        let v = json!({"job": "j", "paused": true, "pausedSince": null, "schedule": null,
                       "timeZone": "UTC", "retryDelaySeconds": 30});
        let text = format_status(&v);
        assert_eq!(
            text,
            "job       j\ntime zone UTC\nstate     paused\nretries   30 s apart\n"
        );
        // Not an object: shown as it is.
        assert_eq!(format_status(&json!(["x"])), "[\"x\"]\n");
    }

    /// The last runs are read by the record schema: fields it does not know are ignored; an
    /// answer whose entries it cannot read says so in their place, the rest shown.
    #[test]
    fn runs_the_schema_cannot_read() {
        let mut v = old();
        v["reservations"][0]["addedLater"] = json!({"x": 1});
        assert_eq!(format_status(&v), format_status(&old()));
        v["reservations"][0]["occurrenceUnix"] = json!("soon");
        let text = format_status(&v);
        assert!(text.starts_with("job       example-job\n"), "{text}");
        assert!(
            text.contains("\nlast runs: not readable as job log entries (invalid type: string"),
            "{text}"
        );
    }

    #[test]
    fn the_apps_words_cannot_drive_the_terminal() {
        let mut v = old();
        v["reservations"][0]["reason"] = json!("bad\u{1b}[2J\nline\u{202e}");
        v["reservations"][0]["instance"] = json!("n\u{7}");
        v["pauseNote"] = json!("x");
        let text = format_status(&v);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        assert!(!text.contains('\u{202e}'), "{text:?}");
        assert!(text.contains("bad\\u{1b}[2J\\u{a}line\\u{202e}"), "{text}");
        assert_eq!(text.lines().count(), 7, "{text}");
    }
}
