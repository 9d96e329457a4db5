//! The bench's command line: its options and the section `--only` runs alone.

use std::path::PathBuf;

pub(crate) struct Options {
    pub(crate) python: Option<PathBuf>,
    pub(crate) node: Option<PathBuf>,
    pub(crate) seconds: f64,
    pub(crate) warmup: f64,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) components: Vec<PathBuf>,
    /// Only this section (`--only`, `--components-only`); `None`: all of them.
    pub(crate) only: Option<Section>,
}

/// A section that can run alone (`--only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    /// Bearer token against SharedKey over HTTPS (`entra.rs`).
    Entra,
    /// The components' size and what it costs (`coldstart.rs`).
    Components,
    /// The floor per build of device-alerts against the hello world (`floor.rs`).
    Floor,
}

pub(crate) const USAGE: &str =
    "usage: leasegate-bench [--python PATH] [--node PATH] [--seconds S] [--warmup S] \
                     [--concurrency 1,4,16] [--components DIR]... [--components-only] \
                     [--only entra|components|floor]";

pub(crate) fn options() -> Result<Options, String> {
    let mut o = Options {
        python: None,
        node: None,
        seconds: 2.5,
        warmup: 0.5,
        concurrency: vec![1, 4, 16],
        components: Vec::new(),
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--python" => o.python = Some(PathBuf::from(value()?)),
            "--node" => o.node = Some(PathBuf::from(value()?)),
            "--seconds" => o.seconds = value()?.parse().map_err(|_| "bad --seconds")?,
            "--warmup" => o.warmup = value()?.parse().map_err(|_| "bad --warmup")?,
            "--concurrency" => {
                o.concurrency = value()?
                    .split(',')
                    .map(|c| c.trim().parse::<usize>().ok().filter(|&c| c > 0))
                    .collect::<Option<_>>()
                    .ok_or("bad --concurrency")?
            }
            "--components" => o.components.push(PathBuf::from(value()?)),
            "--components-only" => o.only = Some(Section::Components),
            "--only" => {
                o.only = Some(match value()?.as_str() {
                    "entra" => Section::Entra,
                    "components" => Section::Components,
                    "floor" => Section::Floor,
                    other => return Err(format!("unknown section {other}; {USAGE}")),
                })
            }
            _ => return Err(format!("unknown argument {arg}; {USAGE}")),
        }
    }
    if !(o.seconds > 0.0 && o.warmup >= 0.0) || o.concurrency.is_empty() {
        return Err("--seconds must be positive, --warmup not negative".into());
    }
    Ok(o)
}
