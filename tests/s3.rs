//! The `s3://` backend against moto, through real agents: two agents with their
//! own sockets and agent ids on one bucket play two hosts. moto is started by
//! `scripts/test`; without it these tests fail (they never skip).

use crate::support::run::HOLD;
use crate::support::s3::{closed_port, env_for, Bucket, RECORDS};
use crate::support::{host_name, key, AgentOptions, Deadline, TestAgent, WAIT};
use anyhow::{ensure, Context, Result};
use nix::sys::signal::Signal;
use std::time::{Duration, Instant, SystemTime};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_names_the_holder_on_the_other_host() -> Result<()> {
    let bucket = Bucket::create("conflict").await?;
    let a = bucket.agent("state", &[]).await?;
    let b = bucket.agent("state", &[]).await?;
    let a_id = a.agent_id().await?;
    ensure!(a_id != b.agent_id().await?, "the two agents share an id");
    let k = key("s3-conflict");
    let mut holder = a.run(&[&k], &[], &format!("{HOLD} # held-through-a"))?;
    let ready = holder.ready().await?;

    let refused = b.run(&[&k], &[], "echo must-not-run")?.finish().await?;
    refused.expect_code(75)?;
    ensure!(!refused.stdout.contains("must-not-run"), "{refused:?}");
    for want in [
        host_name()?,
        holder.pid()?.to_string(),
        format!("token:   {}", ready.token()),
        "held-through-a".to_string(),
    ] {
        ensure!(
            refused.stderr.contains(&want),
            "{want:?} not named: {refused:?}"
        );
    }

    let record = b.inspect_json(&k).await?;
    ensure!(record["state"] == "held", "{record}");
    ensure!(record["scope"] == "global", "{record}");
    ensure!(record["token"] == ready.token(), "{record}");
    ensure!(record["holder"]["agent_id"] == a_id.as_str(), "{record}");
    ensure!(record["holder"]["pid"] == holder.pid()?, "{record}");
    ensure!(
        record["expires_in_ms"]
            .as_u64()
            .is_some_and(|ms| ms <= 30_000),
        "a held S3 record expires: {record}"
    );

    holder.end();
    holder.finish().await?.expect_code(0)?;
    let token = b.token_of_a_run(&k).await?;
    ensure!(token > ready.token(), "{token} after {}", ready.token());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_run_frees_its_key_for_the_other_host_at_once() -> Result<()> {
    let bucket = Bucket::create("killed-run").await?;
    let a = bucket.agent("", &[]).await?;
    let b = bucket.agent("", &[]).await?;
    let k = key("s3-killed-run");
    let mut run = a.run(&[&k], &[], HOLD)?;
    let ready = run.ready().await?;
    a.wait_attached(ready.pid).await?;
    let mut client = b.client().await?;
    ensure!(client.is_held(&k).await?, "B does not see A's lease");

    // SIGKILL the whole run: the agent sees end of file and writes a `free` record.
    let killed = Instant::now();
    run.signal(Signal::SIGKILL)?;
    run.kill_group()?;
    let deadline = Deadline::new(Duration::from_secs(5), "the key to be free through B");
    while client.is_held(&k).await? {
        deadline.tick().await?;
    }
    let freed = killed.elapsed();
    let token = b.token_of_a_run(&k).await?;
    ensure!(token > ready.token(), "{token} after {}", ready.token());
    eprintln!("freed {freed:?} after the kill");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_host_s_lease_is_taken_over_after_its_ttl_and_not_before() -> Result<()> {
    const TTL: Duration = Duration::from_secs(5);
    let bucket = Bucket::create("host-loss").await?;
    let prefix = format!("p/{RECORDS}");
    let mut a = bucket.agent("p", &["--ttl", "5s"]).await?;
    // B's own leases last 30 s, so nothing renews B's record before it is read below.
    let b = bucket.agent("p", &["--ttl", "30s"]).await?;
    let b_id = b.agent_id().await?;
    let k = key("s3-host-loss");
    let mut held = a.run(&[&k], &[], HOLD)?;
    let first = held.ready().await?;
    a.wait_attached(first.pid).await?;

    // The host dies: the agent is SIGKILLed and releases nothing.
    a.kill().await?;
    let killed = Instant::now();
    let mut waiter = b.run(&[&k], &["--wait", "30s"], HOLD)?;
    // A's run outlives its agent only until its lease's deadline; it must be gone
    // before B takes over (invariant 4).
    let a_run = tokio::spawn(async move {
        let status = held.wait().await;
        (Instant::now(), status, held)
    });

    // The record as A last wrote it. A is dead, so it cannot change any more; the
    // pause lets a write A sent just before its death land first, so that this is
    // really A's last write (on loopback a request takes milliseconds).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let last_by_a = bucket.only_object(&prefix).await?;
    let record = last_by_a.json()?;
    ensure!(
        record["state"] == "held" && record["token"] == first.token(),
        "the killed agent's record is not left held: {record}"
    );

    let second = waiter.ready().await?;
    let took = killed.elapsed();
    let (a_gone, a_status, a_run) = a_run.await?;
    let a_status = a_status?;
    ensure!(
        a_status.code() == Some(76),
        "A's run: {:?}",
        a_run.finish().await?
    );
    ensure!(second.token() > first.token(), "{second:?} after {first:?}");

    // Not before: both writes are stamped by the store's own clock, in whole
    // seconds (a write stamped `t` happened in [t, t + 1 s)). A's last write
    // happened before `last_by_a + 1 s`; B's takeover write happened at or after
    // its own stamp. So `B's stamp >= A's stamp + TTL + 1 s` proves B wrote no
    // earlier than TTL after A's last write, by one clock, with no agent's
    // wall clock involved. (The engine waits TTL + grace + 1 s by the store's
    // `Date`, so this holds with room to spare.)
    let taken = bucket.only_object(&prefix).await?;
    let record = taken.json()?;
    ensure!(
        record["holder"]["agent_id"] == b_id.as_str() && record["token"] == second.token(),
        "the record is not B's takeover: {record}"
    );
    let gap = taken
        .last_modified
        .duration_since(last_by_a.last_modified)
        .unwrap_or_default();
    ensure!(
        gap >= TTL + Duration::from_secs(1),
        "B took the key {gap:?} (store clock) after A's last write: sooner than the TTL"
    );
    // And promptly: A's last write was before the kill, and B takes over once the
    // store's date passes it by TTL + grace (0.5 s) + 1 s of date resolution,
    // seen at B's next poll. The bound: TTL + 2 s + a poll (0.5 s) + 1 s.
    let bound = TTL + Duration::from_millis(3500);
    ensure!(
        took <= bound,
        "B took the key {took:?} after A died (bound {bound:?})"
    );
    // A's run stopped before B's command started. B's acquire comes a moment
    // before its command, so this is the order as closely as the test can see
    // it; the margin is wide: A's run stops at TTL - TTL/6 after its last
    // write was sent, B takes over after TTL + grace + 1 s by the store's clock.
    ensure!(
        a_gone.duration_since(killed) < took,
        "A's run ended {:?} after the kill, B acquired {took:?} after it",
        a_gone.duration_since(killed)
    );
    eprintln!("B took over {took:?} after the kill; store-clock gap {gap:?}");
    waiter.end();
    waiter.finish().await?.expect_code(0)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_from_the_other_host_stops_the_first_run_at_its_next_renewal() -> Result<()> {
    let bucket = Bucket::create("force").await?;
    // TTL 6 s: A renews, and so notices the takeover, about every 2 s.
    let a = bucket.agent("", &["--ttl", "6s"]).await?;
    let b = bucket.agent("", &["--ttl", "6s"]).await?;
    let k = key("s3-force");
    let mut first = a.run(&[&k], &[], HOLD)?;
    let first_ready = first.ready().await?;

    let forced_at = Instant::now();
    let mut second = b.run(&[&k], &["--force"], HOLD)?;
    let second_ready = second.ready().await?;
    ensure!(
        second_ready.token() > first_ready.token(),
        "{second_ready:?} after {first_ready:?}"
    );
    let stopped = first.finish().await?;
    let noticed = forced_at.elapsed();
    stopped.expect_code(76)?;
    ensure!(
        !stopped.stdout.contains("bye"),
        "the first command was not stopped: {stopped:?}"
    );
    ensure!(
        noticed < Duration::from_secs(4),
        "the takeover was noticed after {noticed:?}: not at the first renewal (TTL 6 s)"
    );
    let record = a.inspect_json(&k).await?;
    ensure!(
        record["state"] == "held" && record["token"] == second_ready.token(),
        "{record}"
    );
    second.end();
    second.finish().await?.expect_code(0)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_read_back_with_boto3_as_plain_json_beside_meltano_state() -> Result<()> {
    let bucket = Bucket::create("records").await?;
    // Meltano's own files under the same prefix stay untouched.
    let state_key = "meltano/dev:tap-x-to-target-y/state.json";
    bucket.put(state_key, br#"{"completed": {}}"#).await?;
    bucket
        .put("meltano/dev:tap-x-to-target-y/lock", b"")
        .await?;
    let a = bucket.agent("meltano", &[]).await?;
    let a_id = a.agent_id().await?;
    let k = "dev:tap-x-to-target-y";
    let records = format!("meltano/{RECORDS}");

    let mut run = a.run(&[k], &[], HOLD)?;
    let ready = run.ready().await?;
    let object = bucket.only_object(&records).await?;
    ensure!(
        object.key == format!("{records}dev%3Atap-x-to-target-y.json"),
        "{object:?}"
    );
    let held = object.json()?;
    ensure!(held["key"] == k, "{held}");
    ensure!(held["state"] == "held", "{held}");
    ensure!(held["token"] == ready.token(), "{held}");
    ensure!(held["ttl_ms"] == 30_000, "{held}");
    ensure!(
        held["lease_id"].as_str().is_some_and(|s| !s.is_empty()),
        "{held}"
    );
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_millis() as u64;
    ensure!(
        held["renewed_at_ms"]
            .as_u64()
            .is_some_and(|ms| ms <= now_ms && now_ms - ms < 60_000),
        "{held}"
    );
    let holder = &held["holder"];
    ensure!(holder["agent_id"] == a_id.as_str(), "{held}");
    ensure!(holder["host"] == host_name()?.as_str(), "{held}");
    ensure!(holder["pid"] == run.pid()?, "{held}");
    ensure!(holder["token"] == ready.token(), "{held}");

    run.end();
    run.finish().await?.expect_code(0)?;
    let free = bucket.only_object(&records).await?.json()?;
    ensure!(free["state"] == "free", "{free}");
    ensure!(
        free["token"] == ready.token(),
        "release keeps the token: {free}"
    );
    ensure!(
        free["holder"].is_null() && free["lease_id"].is_null(),
        "{free}"
    );

    let all = bucket.objects("meltano/").await?;
    let state = all
        .iter()
        .find(|o| o.key == state_key)
        .context("Meltano's state.json is gone")?;
    ensure!(state.body == r#"{"completed": {}}"#, "{state:?}");
    ensure!(all.len() == 3, "unexpected objects: {all:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_or_a_refusing_endpoint_makes_runs_exit_69() -> Result<()> {
    let missing = Bucket::missing("missing")?;
    let agent = missing.agent("x", &[]).await?;
    let k = key("s3-missing");
    let out = agent.run(&[&k], &[], "echo must-not-run")?.finish().await?;
    out.expect_code(69)?;
    ensure!(!out.stdout.contains("must-not-run"), "{out:?}");
    ensure!(
        out.stderr.contains(&missing.name) && out.stderr.contains("does not exist"),
        "the bucket is not named: {out:?}"
    );
    ensure!(
        agent.log().contains(&missing.name),
        "no start-up warning names the bucket:\n{}",
        agent.log()
    );

    // An endpoint where nothing listens, with a secret that must show nowhere.
    let secret = "sEcReT-must-not-leak";
    let endpoint = format!("http://127.0.0.1:{}", closed_port()?);
    let mut env = env_for(&endpoint);
    for (name, value) in env.iter_mut() {
        if name == "AWS_SECRET_ACCESS_KEY" {
            *value = secret.to_string();
        }
    }
    let options = AgentOptions::new(missing.uri(""));
    let agent = TestAgent::start_with_env(options, &env).await?;
    let started = Instant::now();
    let out = agent.run(&[&k], &[], "echo must-not-run")?.finish().await?;
    out.expect_code(69)?;
    ensure!(
        out.stderr.contains(&endpoint) && out.stderr.contains("cannot reach"),
        "the endpoint is not named: {out:?}"
    );
    ensure!(
        started.elapsed() < WAIT,
        "a refusing endpoint took {:?}",
        started.elapsed()
    );
    ensure!(
        !out.stderr.contains(secret) && !agent.log().contains(secret),
        "the secret leaked"
    );
    Ok(())
}
