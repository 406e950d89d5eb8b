//! On `file://` the run holds its kernel lock itself (SPEC 5.4): killing,
//! stopping, restarting or pausing the agent neither stops the run nor frees
//! the key, which is free the moment the run ends, agent or no agent; force
//! and release still stop the run and take the key with a larger token.

use crate::agent::restart::{leases_of, reattached};
use crate::support::agent::FileBackendDir;
use crate::support::run::{Ready, HOLD};
use crate::support::{key, AgentOptions, Deadline, Run, TestAgent, WAIT};
use anyhow::{ensure, Context, Result};
use nix::sys::signal::Signal;
use std::path::Path;
use std::time::{Duration, Instant};

/// An agent on `locks` with `ttl`, on `socket` if given (an agent coming back).
pub(crate) async fn agent_on(
    locks: &FileBackendDir,
    socket: Option<&Path>,
    ttl: &str,
) -> Result<TestAgent> {
    TestAgent::start_with(AgentOptions {
        socket: socket.map(Path::to_path_buf),
        ..AgentOptions::with_ttl(locks.uri(), ttl)
    })
    .await
}

/// What `witness` (another agent on the same directory) says of `k`: it must
/// be held with `token`.
async fn held_with(witness: &TestAgent, k: &str, token: u64) -> Result<()> {
    let record = witness.inspect_json(k).await?;
    ensure!(
        record["state"] == "held" && record["token"] == token,
        "{k} is not held with token {token}: {record}"
    );
    Ok(())
}

async fn the_run_outlives_its_agent(stop: Signal) -> Result<()> {
    let (locks, mut agent, witness) =
        FileBackendDir::with_two_agents_using(|uri| AgentOptions::with_ttl(uri, "5s")).await?;
    let k = key("outlives");
    let (run, ready) = agent.hold(&k).await?;

    agent.signal(stop)?;
    agent.wait().await?;
    // A second agent on the directory finds the key held through the whole gap.
    let gone = Instant::now();
    let deadline = Deadline::new(WAIT, "the gap to last a second");
    while gone.elapsed() < Duration::from_secs(1) {
        held_with(&witness, &k, ready.token()).await?;
        deadline.tick().await?;
    }
    witness.run_refused(&[&k], &[], 75).await?;
    let again = agent_on(&locks, Some(agent.socket()), "5s").await?;
    let adopted = reattached(&again, 1).await?;
    ensure!(adopted[0].holder.token == ready.token(), "{adopted:?}");
    ensure!(adopted[0].child_pid == Some(ready.pid), "{adopted:?}");
    held_with(&witness, &k, ready.token()).await?;

    let out = run.end_and_expect_ran_through().await?;
    ensure!(out.stderr.contains("reattached"), "{out:?}");
    // Free at once, with a larger token.
    let next = witness.token_of_a_run(&k).await?;
    ensure!(next > ready.token(), "{next} after {}", ready.token());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_outlives_an_agent_killed_and_restarted() -> Result<()> {
    the_run_outlives_its_agent(Signal::SIGKILL).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_outlives_an_agent_stopped_and_restarted() -> Result<()> {
    the_run_outlives_its_agent(Signal::SIGTERM).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_agent_left_the_key_is_free_the_moment_the_run_ends() -> Result<()> {
    let (_locks, mut agent, witness) =
        FileBackendDir::with_two_agents_using(|uri| AgentOptions::with_ttl(uri, "5s")).await?;
    let k = key("no-agent");
    // The command leaves a daemon behind that keeps every descriptor it inherited.
    let script = format!("(sleep 60 </dev/null >/dev/null 2>&1 &); {HOLD}");
    let mut run = agent.run(&[&k], &[], &script)?;
    let ready = run.ready().await?;
    agent.kill().await?;
    held_with(&witness, &k, ready.token()).await?;
    run.end_and_expect_success().await?;
    // The shim dropped the lock for the daemon too: the key is free at once.
    let next = witness.token_of_a_run(&k).await?;
    ensure!(next > ready.token(), "{next} after {}", ready.token());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_agent_loses_no_run() -> Result<()> {
    let (_locks, agent, witness) =
        FileBackendDir::with_two_agents_using(|uri| AgentOptions::with_ttl(uri, "5s")).await?;
    let mut runs: Vec<(String, Run, Ready)> = Vec::new();
    for i in 0..3 {
        let k = key(&format!("paused-{i}"));
        let (run, ready) = agent.hold(&k).await?;
        runs.push((k, run, ready));
    }
    // Twice the TTL: a lease that could lapse would be lost by now.
    agent.signal(Signal::SIGSTOP)?;
    let paused = Instant::now();
    let deadline = Deadline::new(WAIT, "the pause to last 10 s");
    while paused.elapsed() < Duration::from_secs(10) {
        deadline.tick().await?;
    }
    for (k, _, ready) in &runs {
        held_with(&witness, k, ready.token()).await?;
    }
    agent.signal(Signal::SIGCONT)?;
    agent.still_serves().await?;
    ensure!(leases_of(&agent).await?.len() == 3, "{}", agent.log());
    for (k, mut run, _) in runs {
        run.end();
        let out = run.finish().await?;
        out.expect_code(0).with_context(|| k.clone())?;
        ensure!(!out.stderr.contains("lost the lock"), "{k}: {out:?}");
    }
    ensure!(!agent.log().contains("lost"), "{}", agent.log());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_restarts_stop_none_of_ten_runs() -> Result<()> {
    const RUNS: usize = 10;
    let locks = FileBackendDir::new()?;
    let first = agent_on(&locks, None, "5s").await?;
    let socket = first.socket().to_path_buf();
    let mut runs: Vec<(String, Run, Ready)> = Vec::new();
    for i in 0..RUNS {
        let k = key(&format!("restarts-{i}"));
        let (run, ready) = first.hold(&k).await?;
        runs.push((k, run, ready));
    }
    // Each agent is kept (its directory holds the socket) until the test ends.
    let mut agents = vec![first];
    for restart in 0..20 {
        let current = agents.last_mut().context("an agent")?;
        match restart % 2 {
            0 => current.stop().await?,
            _ => current.kill().await?,
        };
        let next = agent_on(&locks, Some(&socket), "5s").await?;
        reattached(&next, RUNS)
            .await
            .with_context(|| format!("restart {restart}"))?;
        agents.push(next);
    }
    let last = agents.last().context("an agent")?;
    for lease in leases_of(last).await? {
        let (_, _, ready) = runs
            .iter()
            .find(|(k, _, _)| *k == lease.key)
            .with_context(|| format!("{lease:?} is not a run's"))?;
        ensure!(
            lease.holder.token == ready.token(),
            "{lease:?} vs {ready:?}"
        );
    }
    for (k, mut run, ready) in runs {
        run.end();
        let out = run.finish().await?;
        out.expect_code(0).with_context(|| k.clone())?;
        ensure!(!out.stderr.contains("lost the lock"), "{k}: {out:?}");
        let next = last.token_of_a_run(&k).await?;
        ensure!(next > ready.token(), "{k}: {next} after {}", ready.token());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_and_release_stop_a_reattached_run_and_take_the_key_higher() -> Result<()> {
    let (locks, mut agent, other) =
        FileBackendDir::with_two_agents_using(|uri| AgentOptions::with_ttl(uri, "3s")).await?;
    let (forced, broken) = (key("forced"), key("broken"));
    let mut runs = Vec::new();
    for k in [&forced, &broken] {
        let (run, ready) = agent.hold(k).await?;
        runs.push((run, ready));
    }
    agent.stop().await?;
    let again = agent_on(&locks, Some(agent.socket()), "3s").await?;
    reattached(&again, 2).await?;

    // --force through another agent: the reattached run is stopped, and the
    // forced run has a larger token.
    let mut taker = other.run(&[&forced], &["--force"], HOLD)?;
    let took = taker.ready().await?;
    let (run, ready) = runs.remove(0);
    let out = run.finish().await?;
    out.expect_stopped()?;
    ensure!(took.token() > ready.token(), "{took:?} after {ready:?}");
    taker.end_and_expect_success().await?;

    // `runlock release` through the agent that adopted it.
    let (run, ready) = runs.remove(0);
    again
        .runlock_output(&["release", &broken])
        .await?
        .expect_code(0)?;
    let out = run.finish().await?;
    out.expect_code(76)?;
    let next = other.token_of_a_run(&broken).await?;
    ensure!(next > ready.token(), "{next} after {ready:?}");
    Ok(())
}
