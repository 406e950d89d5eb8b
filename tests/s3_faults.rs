//! Faults around the S3 backend: the store pausing (SIGSTOP of a moto of the
//! test's own) for less and for more than the TTL, and agents whose wall
//! clocks are hours off (libfaketime), which must change nothing.

use crate::support::run::HOLD;
use crate::support::s3::{Bucket, Moto, RECORDS};
use crate::support::{key, Deadline};
use anyhow::{ensure, Result};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_pause_shorter_than_the_ttl_loses_no_lease() -> Result<()> {
    let moto = Moto::start().await?;
    let bucket = Bucket::create_at(&moto.endpoint, "short-pause").await?;
    let a = bucket.agent("p", &["--ttl", "6s"]).await?;
    let k = key("s3-short-pause");
    let mut run = a.run(&[&k], &[], HOLD)?;
    let ready = run.ready().await?;

    // The fault itself: the store answers nothing for 2 s (renewals go every 2 s,
    // the lease's deadline is 5 s after the last one).
    moto.pause()?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    moto.resume()?;
    let resumed_ms = now_ms();

    // The lease lives on: a renewal lands after the pause (the record's own
    // `renewed_at_ms`, written by the agent on this host's clock).
    let prefix = format!("p/{RECORDS}");
    let deadline = Deadline::new(Duration::from_secs(10), "a renewal after the pause");
    loop {
        let record = bucket.only_object(&prefix).await?.json()?;
        ensure!(
            record["token"] == ready.token(),
            "the lease changed hands: {record}"
        );
        if record["renewed_at_ms"].as_u64().unwrap_or(0) > resumed_ms {
            break;
        }
        deadline.tick().await?;
    }
    run.end();
    let done = run.finish().await?;
    done.expect_code(0)?;
    ensure!(!done.stderr.contains("lost"), "{done:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_pause_longer_than_the_ttl_stops_the_holder_before_anyone_takes_over() -> Result<()>
{
    let moto = Moto::start().await?;
    let bucket = Bucket::create_at(&moto.endpoint, "long-pause").await?;
    let a = bucket.agent("p", &["--ttl", "6s"]).await?;
    let b = bucket.agent("p", &["--ttl", "6s"]).await?;
    let k = key("s3-long-pause");
    let mut held = a.run(&[&k], &[], HOLD)?;
    let first = held.ready().await?;
    let mut waiter = b.run(&[&k], &["--wait", "60s"], HOLD)?;

    moto.pause()?;
    let paused = Instant::now();
    // A cannot renew: its run is told at the lease's deadline (≤ 5 s after the last
    // renewal) and stopped within the kill grace (1 s for a 6 s TTL).
    let a_done =
        crate::support::within(Duration::from_secs(15), "A's run to stop", held.wait()).await??;
    let a_gone = Instant::now();
    ensure!(
        a_done.code() == Some(76),
        "A's run: {:?}",
        held.finish().await?
    );
    // Keep the store stopped past TTL + grace + 1 s, so that B may take over as
    // soon as it can ask.
    tokio::time::sleep_until((paused + Duration::from_secs(9)).into()).await;
    moto.resume()?;
    let second = waiter.ready().await?;
    let b_started = Instant::now();
    ensure!(
        a_gone < b_started,
        "B's run started before A's run was stopped"
    );
    ensure!(second.token() > first.token(), "{second:?} after {first:?}");
    waiter.end();
    waiter.finish().await?.expect_code(0)?;
    Ok(())
}

/// libfaketime moves an agent's wall clock; the S3 tests' exclusion, crash
/// release and takeover timing must not notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_whose_wall_clocks_are_hours_off_change_nothing() -> Result<()> {
    const TTL: Duration = Duration::from_secs(5);
    let bucket = Bucket::create("skewed-clocks").await?;
    let mut ahead = bucket
        .agent_with_clock_offset("p", &["--ttl", "5s"], "+5h")
        .await?;
    let behind = bucket
        .agent_with_clock_offset("p", &["--ttl", "5s"], "-5h")
        .await?;
    let k = key("s3-skewed");

    // Exclusion: a holder whose clock is 5 h ahead is not taken for expired by
    // one 5 h behind, and the other way round.
    let mut held = ahead.run(&[&k], &[], HOLD)?;
    let first = held.ready().await?;
    behind
        .run(&[&k], &[], "echo must-not-run")?
        .finish()
        .await?
        .expect_code(75)?;
    held.end();
    held.finish().await?.expect_code(0)?;
    let mut held = behind.run(&[&k], &[], HOLD)?;
    let second = held.ready().await?;
    ensure!(second.token() > first.token());
    ahead
        .run(&[&k], &[], "echo must-not-run")?
        .finish()
        .await?
        .expect_code(75)?;
    held.end();
    held.finish().await?.expect_code(0)?;

    // Host loss: the agent ahead dies holding the key; the one behind takes over
    // after the TTL, not at once (its clock would call any record stale) and not
    // never (its clock would call any record fresh).
    let mut held = ahead.run(&[&k], &[], HOLD)?;
    let third = held.ready().await?;
    ahead.wait_attached(third.pid).await?;
    ahead.kill().await?;
    let killed = Instant::now();
    let mut waiter = behind.run(&[&k], &["--wait", "30s"], HOLD)?;
    let fourth = waiter.ready().await?;
    let took = killed.elapsed();
    ensure!(fourth.token() > third.token());
    ensure!(
        took >= TTL - TTL / 3,
        "taken over {took:?} after the kill: before the TTL"
    );
    ensure!(
        took <= TTL + Duration::from_millis(3500),
        "taken over only {took:?} after the kill"
    );
    let _ = held.wait().await;
    waiter.end();
    waiter.finish().await?.expect_code(0)?;
    Ok(())
}
