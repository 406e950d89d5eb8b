//! `cargo bench -p runlock-tests`: runs the release binaries and prints one
//! table: acquire/release round trips on memory:// and file:// beside a raw
//! MessagePack echo over a Unix socket, pair throughput over 16 connections,
//! and crash release (SIGKILL of a run until a waiter holds the key); with
//! the emulators' variables, S3, Azure, GCS, PostgreSQL and etcd beside raw
//! writes with the same clients.
//! The figures go into BENCHMARKS.md; nothing here asserts a time.

use anyhow::{bail, Context, Result};
use futures::{SinkExt, StreamExt};
use runlock_protocol::{
    AcquireRequest, AgentMessage, ClientMessage, Envelope, MessageCodec, OnLost, PROTOCOL_VERSION,
};
use runlock_tests::bins::bins;
use runlock_tests::client::RawClient;
use runlock_tests::http;
use runlock_tests::{rss_kib, AgentOptions, TestAgent};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::process::Command;
use tokio_util::codec::Framed;

mod agent_load;
mod databases;
mod local;
mod measure;
mod objects;

use agent_load::*;
use databases::*;
use local::*;
use measure::*;
use objects::*;

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // The echo server runs as a second process of this binary, as the agent does.
    if let Some(path) = std::env::var_os(ECHO_ENV) {
        return runtime.block_on(echo_server(PathBuf::from(path)));
    }
    if std::env::args().any(|a| a == "--list") {
        return Ok(()); // `cargo test --benches` asks for the list of benchmarks
    }
    runtime.block_on(run())
}

/// A group of rows measured against the agent binary, in a scratch directory.
type Group = for<'a> fn(&'a Path) -> futures::future::BoxFuture<'a, Result<Rows>>;

type Rows = Vec<(String, String)>;

async fn run() -> Result<()> {
    // `cargo bench -p runlock-tests -- NAME` measures only the groups whose
    // name contains NAME (memory, file, s3, azure, gcs, postgres, etcd,
    // leases, hostile); the echo always.
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wanted = |group: &str| only.as_deref().is_none_or(|o| group.contains(o));
    // Release binaries (the bench profile is optimised), built as the tests build theirs.
    let bins = bins()?;
    let scratch = tempfile::Builder::new()
        .prefix("runlock-bench")
        .tempdir_in("/tmp")?;
    let mut rows: Vec<(String, String)> = Vec::new();

    let echo = echo_round_trips(scratch.path()).await?;
    rows.push((
        "raw MessagePack echo, one connection".into(),
        percentiles(echo.clone()),
    ));
    let echo_p50 = quantile(&mut echo.clone(), 0.5);

    for (name, uri) in [
        ("memory://", "memory://".to_string()),
        (
            "file://",
            format!("file://{}", scratch.path().join("locks").display()),
        ),
    ] {
        if !wanted(name) {
            continue;
        }
        let mut agent = start_agent(&uri, &[], &[]).await?;
        let (acquire, release, pair) = round_trips(&agent).await?;
        let ratio = quantile(&mut acquire.clone(), 0.5).as_secs_f64() / echo_p50.as_secs_f64();
        rows.push((
            format!("{name} acquire round trip"),
            format!("{}  ({ratio:.2}× echo p50)", percentiles(acquire)),
        ));
        rows.push((format!("{name} release round trip"), percentiles(release)));
        rows.push((format!("{name} acquire+release pair"), percentiles(pair)));
        let shims = [bins.runlock.clone(), static_shim(&bins.runlock)?];
        let (timed, flock) = beside_flock(&shims, agent.socket(), scratch.path()).await?;
        let flock_p50 = quantile(&mut flock.clone(), 0.5).as_secs_f64();
        for (linked, shim) in ["dynamically", "statically"].iter().zip(timed) {
            let ratio = quantile(&mut shim.clone(), 0.5).as_secs_f64() / flock_p50;
            rows.push((
                format!(
                    "{name} `runlock run --key k -- true`, whole process, shim linked {linked}"
                ),
                format!("{}  ({ratio:.2}× flock p50)", percentiles(shim)),
            ));
        }
        rows.push(("`flock FILE true` beside them".into(), percentiles(flock)));
        if name == "memory://" {
            let pairs = throughput(&agent).await?;
            rows.push((
                format!("{name} pairs/s over {THROUGHPUT_CONNECTIONS} connections"),
                format!("{pairs:.0}"),
            ));
        }
        if name == "file://" {
            let crash = crash_release(&agent).await?;
            rows.push((
                "file:// crash release (SIGKILL of a run → waiter holds the key)".into(),
                percentiles(crash),
            ));
        }
        agent.stop().await?;
    }

    let groups: [(&str, Group); 8] = [
        ("s3", |scratch| Box::pin(s3_rows(scratch))),
        ("slots", |scratch| Box::pin(slot_rows(scratch))),
        ("azure", |scratch| Box::pin(azure_rows(scratch))),
        ("gcs", |scratch| Box::pin(gcs_rows(scratch))),
        ("postgres", |scratch| Box::pin(postgres(scratch))),
        ("etcd", |scratch| Box::pin(etcd_rows(scratch))),
        ("leases", |scratch| Box::pin(many_leases(scratch))),
        ("hostile", |scratch| Box::pin(hostile(scratch))),
    ];
    for (name, group) in groups {
        if wanted(name) {
            let measured = group(scratch.path()).await;
            rows.extend(or_failure(name, measured));
        }
    }

    println!();
    println!("| measurement | p50 / p99 (or rate) |");
    println!("| --- | --- |");
    for (what, figure) in rows {
        println!("| {what} | {figure} |");
    }
    Ok(())
}
