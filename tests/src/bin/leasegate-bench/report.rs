//! What the bench prints: the decisions table, the ratios of the app's rows to the storage
//! rows, the notes on skipped rows and unexpected answers, and the load average beside them.

use crate::rows::{ms, Row, Storage};

/// The 1-minute load average (Linux), to tell a quiet machine from a busy one.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

pub(crate) fn print_table(levels: &[usize], rows: &[Row]) {
    let mut header = vec!["decision".to_string(), "storage req/decision".to_string()];
    for c in levels {
        header.push(format!("c={c} dec/s"));
        header.push("p50 ms".into());
        header.push("p90 ms".into());
        header.push("p99 ms".into());
    }
    header.push("errors".into());
    let mut lines = vec![header];
    for row in rows {
        let mut line = vec![
            row.name.clone(),
            match &row.storage {
                Storage::One => "1".into(),
                Storage::None => "0".into(),
                Storage::Counted(Some(v)) => format!("{v:.2}"),
                Storage::Counted(None) => "–".into(),
            },
        ];
        let mut errors = 0;
        for cell in &row.cells {
            match cell {
                Some(f) => {
                    line.push(format!("{:.0}", f.rate));
                    line.push(ms(f.p50));
                    line.push(ms(f.p90));
                    line.push(ms(f.p99));
                    errors += f.errors;
                }
                None => line.extend(["–".to_string(), "–".into(), "–".into(), "–".into()]),
            }
        }
        line.push(if row.skipped.is_some() {
            "skipped".into()
        } else {
            errors.to_string()
        });
        lines.push(line);
    }
    print_lines(&lines);
}

/// A Markdown table: the first line is the header; the first column left-aligned, the others
/// right-aligned.
pub(crate) fn print_lines(lines: &[Vec<String>]) {
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|k| {
            lines
                .iter()
                .map(|l| l[k].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let render = |line: &Vec<String>| {
        let cells: Vec<String> = line
            .iter()
            .enumerate()
            .map(|(k, s)| {
                if k == 0 {
                    format!("{s:<w$}", w = widths[k])
                } else {
                    format!("{s:>w$}", w = widths[k])
                }
            })
            .collect();
        format!("| {} |", cells.join(" | "))
    };
    println!("{}", render(&lines[0]));
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(k, w)| {
            if k == 0 {
                "-".repeat(w + 2)
            } else {
                format!("{}:", "-".repeat(w + 1))
            }
        })
        .collect();
    println!("|{}|", rule.join("|"));
    for line in &lines[1..] {
        println!("{}", render(line));
    }
}

/// App ÷ SDK and app ÷ ceiling for the app's 1-request decisions, against the refused acquire.
pub(crate) fn print_ratios(levels: &[usize], rows: &[Row]) {
    let storage_row = |prefix: &str, status: u16| {
        rows.iter().find(|r| {
            r.name.starts_with(prefix)
                && r.name.contains(&format!("acquire {status}"))
                && r.skipped.is_none()
        })
    };
    let one_request: Vec<&Row> = rows
        .iter()
        .filter(|r| r.reference.is_some())
        .filter(|r| matches!(r.storage, Storage::Counted(Some(v)) if (v - 1.0).abs() < 0.005))
        .collect();
    if one_request.is_empty() {
        println!("\nNo app row made exactly 1 storage request per decision: no ratios.");
        return;
    }
    println!(
        "\nThe app's 1-request decisions against the storage acquire with the same outcome \
         (throttled: the refused 409; gate GET: the granted 201), decisions/s ratio (p50 ratio):"
    );
    let width = one_request
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0);
    for row in one_request {
        let status = row.reference.unwrap_or(409);
        let sdk = storage_row("Python SDK", status);
        let js = storage_row("JS SDK", status);
        let ceiling = storage_row("storage ceiling", status);
        for (label, reference) in [("÷ SDK", sdk), ("÷ JS SDK", js), ("÷ ceiling", ceiling)] {
            let Some(reference) = reference else {
                println!("  {:<width$}  {label:<9}  (no reference row)", row.name);
                continue;
            };
            let parts: Vec<String> = levels
                .iter()
                .enumerate()
                .map(|(k, c)| match (&row.cells[k], &reference.cells[k]) {
                    (Some(a), Some(b)) if b.rate > 0.0 => {
                        let p50 = match (a.p50, b.p50) {
                            (Some(x), Some(y)) if !y.is_zero() => {
                                format!("{:.2}×", x.as_secs_f64() / y.as_secs_f64())
                            }
                            _ => "–".into(),
                        };
                        format!("c={c} {:.2}× ({p50})", a.rate / b.rate)
                    }
                    _ => format!("c={c} –"),
                })
                .collect();
            println!("  {:<width$}  {label:<9}  {}", row.name, parts.join("   "));
        }
    }
}

/// The notes under the table: rows skipped and why, and every cell with unexpected answers
/// (with samples of them).
pub(crate) fn print_notes(levels: &[usize], rows: &[Row], kv_declared: bool) {
    let mut notes = Vec::new();
    if !kv_declared {
        notes.push(
            "spin.toml declares no kv_cache variable: the kv_cache=on row is skipped".to_string(),
        );
    }
    for row in rows {
        if let Some(why) = &row.skipped {
            notes.push(format!("{}: skipped: {why}", row.name));
        }
        for (k, cell) in row.cells.iter().enumerate() {
            if let Some(f) = cell.as_ref().filter(|f| f.errors > 0) {
                notes.push(format!(
                    "ERROR {} c={}: {} unexpected answers, e.g. {}",
                    row.name,
                    levels[k],
                    f.errors,
                    f.samples.join(" | ")
                ));
            }
        }
    }
    if !notes.is_empty() {
        println!();
        for n in notes {
            println!("{n}");
        }
    }
}
