//! `leasegate-host`: serves the Spin app's components locally with wasmtime, for machines
//! without Spin.
//!
//! ```text
//! leasegate-host [--manifest spin.toml] [--listen 127.0.0.1:3000] [--variable name=value]...
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use leasegate_host::{parse_variable, Host, HostConfig};

fn main() -> Result<()> {
    let mut manifest = PathBuf::from("spin.toml");
    let mut listen: SocketAddr = "127.0.0.1:3000".parse()?;
    let mut variables = HashMap::new();
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
            "--inspect" => {
                let path = PathBuf::from(args.next().context("--inspect needs a .wasm path")?);
                let (imports, exports) = leasegate_host::inspect(&path)?;
                imports.iter().for_each(|i| println!("import {i}"));
                exports.iter().for_each(|e| println!("export {e}"));
                return Ok(());
            }
            "-h" | "--help" => {
                println!("usage: leasegate-host [--manifest spin.toml] [--listen 127.0.0.1:3000] [--variable name=value]...");
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
    })?;
    println!("serving on {} (Ctrl-C to stop)", host.url());
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
