//! The command line of the benches that measure one store holding N of
//! something (`fleet_bench.rs`, `list_bench.rs`).

use anyhow::{bail, Context, Result};

/// `$bench(STORE, ARGS...).await` on the store named by `$name` (s3, azure,
/// gcs, postgres, pgbouncer or etcd); any other name is an error that lists
/// them.
#[macro_export]
macro_rules! on_store_named {
    ($name:expr, $bench:ident($($arg:expr),* $(,)?)) => {
        match $name {
            "s3" => $bench($crate::stores::S3, $($arg),*).await,
            "azure" => $bench($crate::stores::Azure, $($arg),*).await,
            "gcs" => $bench($crate::stores::Gcs, $($arg),*).await,
            "postgres" => $bench($crate::stores::Postgres, $($arg),*).await,
            "pgbouncer" => $bench($crate::stores::PgBouncer, $($arg),*).await,
            "etcd" => $bench($crate::stores::Etcd, $($arg),*).await,
            other => Err(anyhow::anyhow!(
                "no store {other:?}: s3, azure, gcs, postgres, pgbouncer or etcd"
            )),
        }
    };
}

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

/// The main of such a bench: reads `STORE N` (see [`store_and_count`]) and
/// runs `bench` on them in a multi-threaded runtime; does nothing when
/// `cargo test --benches` only asks for the list of benchmarks.
pub fn run_store_bench<F>(usage: &str, bench: impl FnOnce(String, usize) -> F) -> Result<()>
where
    F: std::future::Future<Output = Result<()>>,
{
    let Some((store, n)) = store_and_count(usage)? else {
        return Ok(());
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(store, n))
}
