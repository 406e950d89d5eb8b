//! What only gs:// has: GCS takes about one write per object per second, so
//! the agent refuses TTLs it could not renew at that pace and spaces its own
//! writes of one key. Against fake-gcs-server, which `scripts/test` starts.

use crate::support::key;
use crate::support::stores::{Gcs, Space};
use anyhow::{ensure, Result};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_too_short_to_renew_once_a_second_is_refused() -> Result<()> {
    let space = Space::create(Gcs, "short-ttl").await?;
    let agent = space.agent("p", &[]).await?;
    let out = agent
        .run(&[&key("short-ttl")], &["--ttl", "4s"], "echo must-not-run")?
        .finish()
        .await?;
    out.expect_code(64)?;
    ensure!(!out.stdout.contains("must-not-run"), "{out:?}");
    ensure!(
        out.stderr.contains("between 5000 and") && out.stderr.contains("gs://"),
        "{out:?}"
    );
    // The shortest TTL itself works.
    agent
        .run(&[&key("short-ttl")], &["--ttl", "5s"], "true")?
        .finish()
        .await?
        .expect_code(0)?;
    // An agent whose default TTL is too short does not start.
    let Err(refused) = space.agent("p", &["--ttl", "2s"]).await else {
        anyhow::bail!("runlockd started on gs:// with a 2 s TTL");
    };
    ensure!(
        format!("{refused:#}").contains("ttl 2s is too short for gs://"),
        "{refused:#}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_runs_on_one_key_write_its_record_a_second_apart() -> Result<()> {
    let space = Space::create(Gcs, "spacing").await?;
    let agent = space.agent("p", &[]).await?;
    let k = key("spacing");
    let started = Instant::now();
    for _ in 0..3 {
        agent
            .run(&[&k], &[], "true")?
            .finish()
            .await?
            .expect_code(0)?;
    }
    // Six writes of one record (acquire and release, three times): five intervals.
    let took = started.elapsed();
    ensure!(
        took >= Duration::from_secs(5),
        "three short runs took {took:?}: the record was written more than once a second"
    );
    let record = space.only_record("p").await?.json()?;
    ensure!(
        record["state"] == "free" && record["token"] == 3,
        "{record}"
    );
    Ok(())
}
