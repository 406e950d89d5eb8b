//! Restarting the agent without dropping runs: on SIGTERM it hands its leases
//! over instead of releasing them, the shims reattach to the next agent, and
//! only a run that cannot reattach before its lease's deadline is stopped (76).
//! An upgrade (the binary replaced, then a restart) is the same restart.

use crate::support::agent::{temp_dir, FileBackendDir};
use crate::support::bins::bins;
use crate::support::run::{Ready, HOLD};
use crate::support::stores::{Space, S3};
use crate::support::{key, AgentOptions, Deadline, Run, TestAgent, WAIT};
use anyhow::{ensure, Context, Result};
use runlock_protocol::{AgentMessage, ClientMessage, LeaseInfo};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const RUNS: usize = 100;

/// `RUNS` runs holding one key each through `agent`, all started.
async fn hold_many(agent: &TestAgent, hint: &str) -> Result<Vec<(String, Run, Ready)>> {
    let mut runs = Vec::with_capacity(RUNS);
    for i in 0..RUNS {
        let k = key(&format!("{hint}-{i:03}"));
        runs.push((k.clone(), agent.run(&[&k], &[], HOLD)?));
    }
    let mut ready = Vec::with_capacity(RUNS);
    for (k, mut run) in runs {
        let started = run.ready().await.with_context(|| format!("run of {k}"))?;
        ready.push((k, run, started));
    }
    Ok(ready)
}

/// Every lease `agent` holds, through `list`.
pub(crate) async fn leases_of(agent: &TestAgent) -> Result<Vec<LeaseInfo>> {
    match agent.client().await?.call(ClientMessage::List).await? {
        AgentMessage::Leases { leases, .. } => Ok(leases),
        other => anyhow::bail!("expected leases, got {other:?}"),
    }
}

/// Waits until `agent` holds `count` leases, each attached to its run.
pub(crate) async fn reattached(agent: &TestAgent, count: usize) -> Result<Vec<LeaseInfo>> {
    let deadline = Deadline::new(WAIT, format!("{count} runs to reattach"));
    loop {
        let leases = leases_of(agent).await?;
        if leases.len() == count && leases.iter().all(|l| l.child_pid.is_some()) {
            return Ok(leases);
        }
        deadline.tick().await?;
    }
}

/// [`hold_many`] runs of keys after `hint` through an agent with leases of
/// `ttl` on a fresh S3 space, then that agent stopped (SIGTERM): the space,
/// the stopped agent, its runs and when it was stopped.
async fn runs_of_a_stopped_agent(
    hint: &str,
    ttl: Duration,
) -> Result<(Space, TestAgent, Vec<(String, Run, Ready)>, Instant)> {
    let ttl = format!("{}s", ttl.as_secs());
    let space = Space::create(S3, &format!("restart-{hint}")).await?;
    let mut old = space.agent("state", &["--ttl", &ttl]).await?;
    let runs = hold_many(&old, hint).await?;
    let stopped = Instant::now();
    old.stop().await?;
    Ok((space, old, runs, stopped))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_within_the_ttl_keeps_every_run_and_its_token() -> Result<()> {
    // 100 runs reattach at once, each with a write to moto: on a loaded CI
    // machine that took 3 s, and with 12 s the shims' deadlines (TTL − TTL/6
    // − the kill grace after the last write) came first and stopped the runs.
    let ttl = Duration::from_secs(20);
    let (space, old, runs, stopped) = runs_of_a_stopped_agent("kept", ttl).await?;
    let new = space
        .agent_on_socket("state", &["--ttl", "20s"], old.socket())
        .await?;
    let new_id = new.agent_id().await?;

    // Every run reattaches to the new agent, with its own lease and token.
    let adopted = reattached(&new, RUNS).await?;
    let by_key: HashMap<&str, &LeaseInfo> = adopted.iter().map(|l| (l.key.as_str(), l)).collect();
    for (k, _, ready) in &runs {
        let lease = by_key
            .get(k.as_str())
            .with_context(|| format!("{k} not adopted"))?;
        ensure!(
            lease.holder.token == ready.token(),
            "{k}: token changed: {lease:?}"
        );
        ensure!(
            lease.holder.agent_id == new_id,
            "{k}: not the new agent's: {lease:?}"
        );
        ensure!(
            lease.child_pid == Some(ready.pid),
            "{k}: run not attached: {lease:?}"
        );
    }
    // Past the old agent's last possible deadline, the new agent still holds
    // them all: it renews what it adopted.
    let deadline = Deadline::new(ttl + WAIT, "the old agent's leases' expiry to pass");
    while stopped.elapsed() < ttl + Duration::from_secs(2) {
        deadline.tick().await?;
    }
    for (k, _, ready) in &runs {
        let record = new.inspect_json(k).await?;
        ensure!(record["state"] == "held", "{k} was let go: {record}");
        ensure!(record["token"] == ready.token(), "{k}: {record}");
    }
    for (k, mut run, _) in runs {
        run.end();
        let out = run.finish().await?;
        out.expect_code(0).with_context(|| k.clone())?;
        ensure!(out.stderr.contains("reattached"), "{k}: {out:?}");
        ensure!(!out.stderr.contains("lost"), "{k}: {out:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_slower_than_the_deadline_stops_every_run_before_expiry() -> Result<()> {
    let ttl = Duration::from_secs(6);
    let (_space, _old, runs, stopped) = runs_of_a_stopped_agent("dropped", ttl).await?;
    // No agent comes back: every run is stopped by its shim before its lease
    // could expire (deadline = last write + TTL − TTL/6, then the kill grace).
    for (k, run, _) in runs {
        let out = run.finish().await?;
        out.expect_code(76).with_context(|| k.clone())?;
        ensure!(out.stderr.contains("before its deadline"), "{k}: {out:?}");
        ensure!(
            stopped.elapsed() < ttl,
            "{k} was stopped only {:?} after the agent, past the TTL",
            stopped.elapsed()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_agent_is_replaced_without_stopping_the_run() -> Result<()> {
    let space = Space::create(S3, "crash-replace").await?;
    let mut old = space.agent("state", &["--ttl", "12s"]).await?;
    let k = key("crash-replace");
    let (mut run, ready) = old.hold(&k).await?;
    old.kill().await?;
    let new = space
        .agent_on_socket("state", &["--ttl", "12s"], old.socket())
        .await?;
    let deadline = Deadline::new(WAIT, "the run to reattach");
    while leases_of(&new).await?.is_empty() {
        deadline.tick().await?;
    }
    // Held through the new agent: a second run is refused, naming the first.
    let refused = new.run_refused(&[&k], &[], 75).await?;
    refused.expect_stderr_has(&[&format!("token:   {}", ready.token())])?;
    run.end();
    let out = run.finish().await?;
    out.expect_code(0)?;
    // Released to the new agent at the end: the key is free at once.
    new.run(&[&k], &[], "true")?
        .finish()
        .await?
        .expect_code(0)?;
    Ok(())
}

/// An upgrade as operators do it: the binary replaced where it is installed
/// (a new file renamed over the old, as `install` does) while the agent runs
/// from it, then the agent restarted from that path. The run goes on, with
/// its token, and ends through the new agent.
async fn an_agent_upgraded_in_place_keeps_the_run(
    backend: String,
    env: Vec<(String, String)>,
) -> Result<()> {
    let installed = temp_dir()?;
    let program = installed.path().join("runlockd");
    let install = |from: &std::path::Path| -> Result<()> {
        let staged = installed.path().join(".runlockd.new");
        std::fs::copy(from, &staged)?;
        std::fs::rename(&staged, &program)?;
        Ok(())
    };
    install(&bins()?.runlockd)?;
    let options = |socket: Option<&std::path::Path>| AgentOptions {
        socket: socket.map(|s| s.to_path_buf()),
        program: Some(program.clone()),
        args: vec!["--ttl".into(), "12s".into()],
        ..AgentOptions::new(backend.clone())
    };
    let mut old = TestAgent::start_with_env(options(None), &env).await?;
    let k = key("upgraded");
    let (mut run, ready) = old.hold(&k).await?;

    install(&bins()?.runlockd)?;
    old.stop().await?;
    let new = TestAgent::start_with_env(options(Some(old.socket())), &env).await?;
    let deadline = Deadline::new(WAIT, "the run to reattach");
    let adopted = loop {
        let leases = leases_of(&new).await?;
        if leases.iter().any(|l| l.child_pid.is_some()) {
            break leases;
        }
        deadline.tick().await?;
    };
    ensure!(
        adopted.len() == 1 && adopted[0].holder.token == ready.token(),
        "{adopted:?}"
    );
    run.end();
    let out = run.finish().await?;
    out.expect_code(0)?;
    out.expect_stderr_has(&["reattached"])?;
    new.run(&[&k], &[], "true")?.finish().await?.expect_code(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_in_place_keeps_a_file_run() -> Result<()> {
    let locks = FileBackendDir::new()?;
    an_agent_upgraded_in_place_keeps_the_run(locks.uri(), Vec::new()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_in_place_keeps_an_s3_run() -> Result<()> {
    let space = Space::create(S3, "upgrade").await?;
    an_agent_upgraded_in_place_keeps_the_run(space.uri("state"), space.env()).await
}
