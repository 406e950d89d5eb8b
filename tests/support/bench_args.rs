//! The command line of the benches that measure one store holding N of
//! something (`fleet_bench.rs`, `list_bench.rs`).

use anyhow::{bail, Context, Result};

/// `STORE N` from the command line, flags (cargo's `--bench`) passed over;
/// `None` when `cargo test --benches` only asks for the list of benchmarks.
/// `usage` is the message when the arguments are not that.
pub fn store_and_count(usage: &str) -> Result<Option<(String, usize)>> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(None);
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    match args.as_slice() {
        [store, n] => Ok(Some((
            store.clone(),
            n.parse::<usize>().context("N: a number")?,
        ))),
        _ => bail!("{usage}"),
    }
}
