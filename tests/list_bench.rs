//! `cargo bench -p runlock-tests --bench listing -- STORE N`: how long
//! `runlock list` takes, and how many store requests it costs, with N keys
//! held in one store (BENCHMARKS.md, "Listing"). Nothing here asserts a
//! figure; `tests/shim/listing.rs` holds what a listing must be.
//!
//! `file` lists N free keys with `runlock list --all` instead: an agent
//! holds a kernel lock's descriptor per key held, and the machine allows
//! far fewer than the 150,000 keys a lock directory is measured with. The
//! records are copies of one the agent wrote, under each key's name.
//!
//! One agent (release build, TTL 1 h so that renewals do not compete) takes
//! the N keys over connections of 200 keys each; then `runlock list --json`
//! runs three times, each timed from spawn to exit, with the store's
//! requests counted at the store (`StoreRequests`). Through PgBouncer that
//! count is PostgreSQL's statistics, which a pooled server connection
//! reports late: it can read low (0 for a listing of 300 keys, here).

use anyhow::{bail, ensure, Result};
use runlock_protocol::AgentMessage;
use runlock_tests::agent::Backend;
use runlock_tests::bench_args::run_store_bench;
use runlock_tests::client::{acquire, RawClient};
use runlock_tests::on_store_named;
use runlock_tests::store_requests::StoreRequests;
use runlock_tests::stores::{Space, Store};
use runlock_tests::{AgentOptions, Run, TestAgent};
use std::time::{Duration, Instant};

/// Keys one acquire takes: few enough to be answered within the test
/// client's 15 s on an emulator that is busy with the other acquires.
const BATCH: usize = 200;
/// Acquires in flight at once while the keys are taken.
const TAKERS: usize = 8;
/// Listings timed.
const ROUNDS: usize = 3;

fn main() -> Result<()> {
    let usage = "usage: cargo bench -p runlock-tests --bench listing -- STORE N (STORE: file or a network store)";
    run_store_bench(usage, async |store, n| {
        let rounds = match store.as_str() {
            "file" => file_listing(n).await?,
            named => on_store_named!(named, listing(n))?,
        };
        println!("| store | keys held | pages | `runlock list` (s) | store requests |");
        println!("| --- | ---: | ---: | ---: | ---: |");
        for round in rounds {
            let requests = round.requests.map_or("-".to_string(), |n| n.to_string());
            println!(
                "| {store} | {n} | {} | {:.2} | {requests} |",
                round.pages,
                round.took.as_secs_f64(),
            );
        }
        Ok(())
    })
}

struct Round {
    pages: u64,
    took: Duration,
    /// Counted at the store; `None` for a lock directory.
    requests: Option<u64>,
}

async fn listing(store: impl Store, n: usize) -> Result<Vec<Round>> {
    let mut space = Space::create(store, "listing").await?;
    let requests = StoreRequests::count(&mut space).await?;
    let mut options = AgentOptions::new(space.uri(""));
    options.args = vec!["--ttl".into(), "1h".into()];
    options.log_on_drop = false;
    let agent = TestAgent::start_with_env(options, &space.env()).await?;

    let taken = Instant::now();
    let keys: Vec<String> = (0..n).map(|i| format!("pipelines/run-{i:06}")).collect();
    let mut holders = Vec::new();
    for batches in keys.chunks(BATCH * TAKERS) {
        let takes = batches.chunks(BATCH).map(|batch| async {
            let mut client = agent.client().await?;
            let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
            match client
                .call_within(Duration::from_secs(120), acquire(&refs))
                .await?
            {
                AgentMessage::Acquired { .. } => Ok::<RawClient, anyhow::Error>(client),
                other => bail!("taking {} keys: {other:?}", batch.len()),
            }
        });
        for client in futures::future::join_all(takes).await {
            holders.push(client?);
        }
    }
    eprintln!("{n} keys taken in {:.1}s", taken.elapsed().as_secs_f64());

    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        let before = requests.read().await?;
        let (pages, took) = timed_listing(&agent, &[], n).await?;
        rounds.push(Round {
            pages,
            took,
            requests: Some(requests.read().await?.saturating_sub(before)),
        });
    }
    drop(holders);
    Ok(rounds)
}

/// `runlock list --json ARGS` through `agent`, which must list `n` keys:
/// its pages and how long it took.
async fn timed_listing(agent: &TestAgent, args: &[&str], n: usize) -> Result<(u64, Duration)> {
    let mut command = agent.runlock()?;
    command.args(["list", "--json"]).args(args);
    let started = Instant::now();
    let out = Run::spawn(command)?
        .finish_within(Duration::from_secs(600))
        .await?;
    let took = started.elapsed();
    out.expect_code(0)?;
    let listing: serde_json::Value = serde_json::from_str(out.stdout.trim())?;
    let listed = listing["keys"].as_array().map_or(0, Vec::len);
    ensure!(listed == n, "{listed} of {n} keys listed");
    Ok((listing["pages"].as_u64().unwrap_or(0), took))
}

/// N free keys in a lock directory, listed with `--all`.
async fn file_listing(n: usize) -> Result<Vec<Round>> {
    let agent = TestAgent::start_on(Backend::File).await?;
    // `start_on(Backend::File)` keeps the lock directory beside the socket.
    let dir = agent.dir().join("locks");
    let first = "pipelines/run-000000";
    agent
        .run(&[first], &[], "true")?
        .finish()
        .await?
        .expect_code(0)?;
    let written = std::fs::read(dir.join("pipelines%2Frun-000000.lock"))?;
    let mut record: serde_json::Value = serde_json::from_slice(&written)?;
    let made = Instant::now();
    for i in 1..n {
        let key = format!("pipelines/run-{i:06}");
        record["key"] = key.clone().into();
        let name = format!("{}.lock", key.replace('/', "%2F"));
        std::fs::write(dir.join(name), serde_json::to_vec(&record)?)?;
    }
    eprintln!(
        "{n} records written in {:.1}s",
        made.elapsed().as_secs_f64()
    );
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        let (pages, took) = timed_listing(&agent, &["--all"], n).await?;
        rounds.push(Round {
            pages,
            took,
            requests: None,
        });
    }
    Ok(rounds)
}
