//! The Azure SDKs beside the app: the same two acquires through the SDK for Python and the SDK
//! for JavaScript, run by their scripts, read from the JSON they print.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use leasegate::{BlobName, ContainerName, LeaseId};
use leasegate_tests::app::root;
use leasegate_tests::Azurite;

use crate::rows::{Bench, Figures, Row, Storage};
use crate::storage::new_lease_id;

/// An Azure SDK the bench runs beside the app: its script prints `scripts/bench_sdk.py`'s JSON.
pub(crate) struct Peer {
    /// In the rows' names: "Azure SDK for Python".
    pub(crate) name: &'static str,
    /// In the rows' names once its version is known: "Python SDK".
    pub(crate) short: &'static str,
    /// The interpreter (`--python`, `--node`); `None`: the rows are skipped.
    pub(crate) program: Option<PathBuf>,
    /// The option that names it, for the skip note.
    pub(crate) option: &'static str,
    /// The script, from the workspace root.
    pub(crate) script: &'static str,
}

/// The SDK rows of `peer`, from its script's JSON.
pub(crate) fn sdk(
    bench: &mut Bench,
    peer: &Peer,
    azurite: &Azurite,
    blobs: &[BlobName],
    container: &ContainerName,
    holder: &LeaseId,
) -> Vec<Row> {
    let levels = bench.options.concurrency.len();
    let names = [
        (
            "granted",
            format!("{}: acquire 201 (holder again)", peer.name),
        ),
        ("refused", format!("{}: acquire 409 (other id)", peer.name)),
    ];
    let script = peer.script.rsplit('/').next().unwrap_or(peer.script);
    let Some(program) = peer.program.clone() else {
        bench.cells_done += 2 * levels;
        return names
            .iter()
            .map(|(_, n)| Row::skipped(n.clone(), levels, format!("no {} given", peer.option)))
            .collect();
    };
    let levels_arg: Vec<String> = bench
        .options
        .concurrency
        .iter()
        .map(|c| c.to_string())
        .collect();
    let blob_arg: Vec<&str> = blobs.iter().map(|b| b.as_str()).collect();
    let output = Command::new(&program)
        .arg(root().join(peer.script))
        .args(["--container", container.as_str()])
        .args(["--blobs", &blob_arg.join(",")])
        .args(["--holder", &holder.to_string()])
        .args(["--other", &new_lease_id().to_string()])
        .args(["--concurrency", &levels_arg.join(",")])
        .args(["--warmup", &bench.options.warmup.to_string()])
        .args(["--seconds", &bench.options.seconds.to_string()])
        // The key travels in the environment, never on a command line or in output.
        .env(
            "LEASEGATE_BENCH_CONNECTION_STRING",
            azurite.connection_string(),
        )
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output();
    let failed = |why: String| -> Vec<Row> {
        names
            .iter()
            .map(|(_, n)| Row::skipped(n.clone(), levels, why.clone()))
            .collect()
    };
    bench.cells_done += 2 * levels;
    let output = match output {
        Ok(o) if o.status.success() => o,
        Ok(o) => return failed(format!("{script} failed ({})", o.status)),
        Err(e) => return failed(format!("could not run {}: {e}", program.display())),
    };
    let json: serde_json::Value = match serde_json::from_slice(&output.stdout) {
        Ok(v) => v,
        Err(e) => return failed(format!("{script} printed no JSON: {e}")),
    };
    let version = json["sdk"].as_str().unwrap_or("?");
    let mut rows = Vec::new();
    for (case, name) in names {
        let mut row = Row::new(
            name.replace(peer.name, &format!("{} ({version})", peer.short)),
            Storage::One,
            levels,
        );
        for cell in json["cells"].as_array().into_iter().flatten() {
            if cell["case"] != case {
                continue;
            }
            let c = cell["concurrency"].as_u64().unwrap_or(0) as usize;
            let Some(k) = bench.options.concurrency.iter().position(|&x| x == c) else {
                continue;
            };
            let duration = |key: &str| {
                cell[key]
                    .as_f64()
                    .map(|v| Duration::from_secs_f64(v / 1000.0))
            };
            let seconds = cell["seconds"].as_f64().unwrap_or(bench.options.seconds);
            let figures = Figures {
                rate: cell["decisions"].as_f64().unwrap_or(0.0) / seconds,
                p50: duration("p50_ms"),
                p90: duration("p90_ms"),
                p99: duration("p99_ms"),
                errors: cell["unexpected"].as_u64().unwrap_or(0),
                samples: cell["samples"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect(),
            };
            row.cells[k] = Some(figures);
        }
        rows.push(row);
    }
    rows
}
