//! `leasegate-host`: serves the Spin app's components locally with wasmtime, for machines
//! without Spin.
//!
//! ```text
//! leasegate-host [--manifest spin.toml] [--listen 127.0.0.1:3000] [--variable name=value]...
//!                [--cron] [--clock-offset-ms N]
//! ```
//!
//! `--cron` fires the manifest's `[[trigger.cron]]` components on their schedules (like `spin up`
//! with the `trigger-cron` plugin), printing a line per event; `--clock-offset-ms N` runs the
//! guests' wall clock, and the schedules, N ms ahead of real time (negative: behind).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use leasegate_host::{parse_variable, Host, HostConfig};

fn main() -> Result<()> {
    let mut manifest = PathBuf::from("spin.toml");
    let mut listen: SocketAddr = "127.0.0.1:3000".parse()?;
    let mut variables = HashMap::new();
    let mut cron = false;
    let mut clock_offset_ms = 0i64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--manifest" => manifest = args.next().context("--manifest needs a path")?.into(),
            "--listen" => {
                listen = args
                    .next()
                    .context("--listen needs an address")?
                    .parse()
                    .context("--listen takes host:port")?
            }
            "--variable" => {
                let (k, v) = parse_variable(&args.next().context("--variable needs name=value")?)?;
                variables.insert(k, v);
            }
            "--cron" => cron = true,
            "--clock-offset-ms" => {
                clock_offset_ms = args
                    .next()
                    .context("--clock-offset-ms needs a number")?
                    .parse()
                    .context("--clock-offset-ms takes whole milliseconds, e.g. -1500")?
            }
            "--inspect" => {
                let path = PathBuf::from(args.next().context("--inspect needs a .wasm path")?);
                let (imports, exports) = leasegate_host::inspect(&path)?;
                imports.iter().for_each(|i| println!("import {i}"));
                exports.iter().for_each(|e| println!("export {e}"));
                return Ok(());
            }
            "-h" | "--help" => {
                println!("usage: leasegate-host [--manifest spin.toml] [--listen 127.0.0.1:3000] [--variable name=value]... [--cron] [--clock-offset-ms N]");
                return Ok(());
            }
            other => bail!("unknown argument {other}"),
        }
    }
    if !listen.ip().is_loopback() {
        bail!("this development host listens on loopback addresses only");
    }
    let host = Host::start(HostConfig {
        manifest,
        variables,
        listen,
        echo: true,
        clock_offset_ms,
        cron,
    })?;
    println!("serving on {} (Ctrl-C to stop)", host.url());
    if clock_offset_ms != 0 {
        println!("guests' wall clock: {clock_offset_ms:+} ms from real time");
    }
    for trigger in host.cron_triggers() {
        println!(
            "cron: {} at {:?}{}",
            trigger.component,
            trigger.expression,
            if cron {
                ""
            } else {
                " (not scheduled: pass --cron)"
            }
        );
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        runtime.block_on(async {
            let _ = tokio::signal::ctrl_c().await;
        });
        let _ = tx.send(());
    });
    let _ = rx.recv();
    println!("stopping");
    Ok(())
}
