//! `cargo bench -p runlock-tests --bench listing -- STORE N`: how long
//! `runlock list` takes, and how many store requests it costs, with N keys
//! held in one store (BENCHMARKS.md, "Listing"). Nothing here asserts a
//! figure; `tests/listing.rs` holds what a listing must be.
//!
//! One agent (release build, TTL 1 h so that renewals do not compete) takes
//! the N keys over connections of 200 keys each; then `runlock list --json`
//! runs three times, each timed from spawn to exit, with the store's
//! requests counted at the store (`StoreRequests`). Through PgBouncer that
//! count is PostgreSQL's statistics, which a pooled server connection
//! reports late: it can read low (0 for a listing of 300 keys, here).

use anyhow::{bail, ensure, Result};
use runlock_protocol::AgentMessage;
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
    let usage = "usage: cargo bench -p runlock-tests --bench listing -- STORE N";
    run_store_bench(usage, async |store, n| {
        let rounds = on_store_named!(store.as_str(), listing(n))?;
        println!("| store | keys held | pages | `runlock list` (s) | store requests |");
        println!("| --- | ---: | ---: | ---: | ---: |");
        for round in rounds {
            println!(
                "| {store} | {n} | {} | {:.2} | {} |",
                round.pages,
                round.took.as_secs_f64(),
                round.requests
            );
        }
        Ok(())
    })
}

struct Round {
    pages: u64,
    took: Duration,
    requests: u64,
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
        let mut command = agent.runlock()?;
        command.args(["list", "--json"]);
        let started = Instant::now();
        let out = Run::spawn(command)?
            .finish_within(Duration::from_secs(600))
            .await?;
        let took = started.elapsed();
        out.expect_code(0)?;
        let listing: serde_json::Value = serde_json::from_str(out.stdout.trim())?;
        let listed = listing["keys"].as_array().map_or(0, Vec::len);
        ensure!(listed == n, "{listed} of {n} keys listed");
        rounds.push(Round {
            pages: listing["pages"].as_u64().unwrap_or(0),
            took,
            requests: requests.read().await?.saturating_sub(before),
        });
    }
    drop(holders);
    Ok(rounds)
}
