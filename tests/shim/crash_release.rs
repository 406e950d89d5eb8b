//! Crash release (DESIGN invariant 2): the lock lasts exactly as long as some
//! process of the run lives, however the run ends; a run whose agent goes
//! away keeps going where it holds its lock itself (`file://`) and is stopped
//! where the lock died with the agent (`memory://`: invariant 4, loss is
//! never silent).

use crate::support::agent::{Backend, HeldWithAWaiter};
use crate::support::run::{Finished, HOLD, HOLD_IGNORING_TERM};
use crate::support::{key, TestAgent};
use anyhow::{ensure, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use runlock_protocol::timing::MAX_KILL_GRACE;
use std::time::{Duration, Instant};

/// How soon a crashed run's key must be free. The agent sees the connection
/// close and releases in milliseconds; the exact figure is the benchmark's.
const CRASH_RELEASE_BOUND: Duration = Duration::from_secs(5);

test_matrix!(
    [file: Backend::File, memory: Backend::Memory];
    sigkill_of_the_whole_run_frees_the_key_at_once,
    sigkill_of_the_shim_alone_keeps_the_key_until_the_command_dies,
    a_daemon_left_behind_by_the_command_does_not_keep_the_key,
    agent_stop_stops_only_a_run_whose_lock_died_with_it,
    agent_stops_an_orphaned_command_whose_lease_is_broken_or_forced,
    a_waiting_run_whose_agent_dies_exits_69,
);

/// Waits (up to the bound) until a run can take `key`; returns how long it took.
async fn acquirable_within(agent: &TestAgent, key: &str, bound: Duration) -> Result<Duration> {
    let start = Instant::now();
    // --wait turns "poll until free" into one request the agent answers as
    // soon as the key is released; the run's own wait is longer than the bound
    // so that a slow release shows as a failed bound, not as exit 75.
    let out = agent
        .run(&[key], &["--wait", "30s"], "echo acquired")?
        .finish()
        .await?;
    let took = start.elapsed();
    out.expect_code(0)?;
    ensure!(out.stdout.contains("acquired"), "{out:?}");
    ensure!(
        took < bound,
        "the key became free only after {took:?}: {out:?}"
    );
    Ok(took)
}

async fn sigkill_of_the_whole_run_frees_the_key_at_once(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("crash-whole-run");
    let (mut run, _) = agent.hold(&k).await?;

    run.signal(Signal::SIGKILL)?;
    run.kill_group()?;
    let status = run.wait().await?;
    ensure!(
        status.code().is_none(),
        "the shim was not killed: {status:?}"
    );
    acquirable_within(&agent, &k, CRASH_RELEASE_BOUND).await?;
    // The history tells a crash from a release: its client went away holding it.
    let events = serde_json::Value::from(agent.history_json(&k).await?);
    let crashed = &events[1];
    ensure!(
        crashed["kind"] == "released" && crashed["reason"] == runlock_protocol::REASON_CLIENT_GONE,
        "{events}"
    );
    ensure!(
        events[3]["kind"] == "released" && events[3]["reason"] == "",
        "{events}"
    );
    Ok(())
}

async fn sigkill_of_the_shim_alone_keeps_the_key_until_the_command_dies(
    backend: Backend,
) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("crash-shim-only");
    let (mut run, ready) = agent.hold(&k).await?;

    run.signal(Signal::SIGKILL)?;
    run.wait().await?;
    // The command still holds its inherited copy of the agent socket.
    agent.run_refused(&[&k], &[], 75).await?;
    let record = agent.inspect_json(&k).await?;
    ensure!(record["state"] == "held", "{record}");
    ensure!(record["token"] == ready.token(), "{record}");

    kill(Pid::from_raw(ready.pid as i32), Signal::SIGKILL)?;
    acquirable_within(&agent, &k, CRASH_RELEASE_BOUND).await?;
    Ok(())
}

async fn a_daemon_left_behind_by_the_command_does_not_keep_the_key(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("daemon-left-behind");
    // The daemon inherits the agent socket too, but the shim releases when the command exits.
    let out = agent
        .run(
            &[&k],
            &[],
            "sleep 30 </dev/null >/dev/null 2>&1 & echo daemon $!",
        )?
        .finish()
        .await?;
    let daemon: Option<i32> = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("daemon ")?.parse().ok());
    let result = async {
        out.expect_code(0)?;
        let next = agent.run(&[&k], &[], "exit 0")?.finish().await?;
        next.expect_code(0)
    }
    .await;
    if let Some(pid) = daemon {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    result
}

async fn agent_stop_stops_only_a_run_whose_lock_died_with_it(backend: Backend) -> Result<()> {
    let mut agent = TestAgent::start_on(backend).await?;
    let k = key("agent-stops");
    let (run, _) = agent.hold(&k).await?;

    let status = agent.stop().await?;
    ensure!(
        status.success(),
        "runlockd exited with {status:?}: {}",
        agent.log()
    );
    if backend == Backend::File {
        // The run holds the kernel lock itself: it goes on, and ends as it ends.
        run.end_and_expect_ran_through().await?;
        return Ok(());
    }
    // memory:// locks die with the agent, so the run must stop.
    let out = run.finish().await?;
    out.expect_stopped()?;
    Ok(())
}

async fn agent_stops_an_orphaned_command_whose_lease_is_broken_or_forced(
    backend: Backend,
) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("orphan");
    for breaker in [
        &["release", k.as_str()][..],
        &["run", "--key", &k, "--force", "--", "true"],
    ] {
        let (mut run, _) = agent.run_attached(&[&k], HOLD).await?;
        run.signal(Signal::SIGKILL)?;
        run.wait().await?;

        agent.runlock_output(breaker).await?.expect_code(0)?;
        // The shim is gone, so the agent applies --on-lost term to the attached group itself.
        run.until_stdout_closes().await?;
        ensure!(
            !run.lines_seen().iter().any(|l| l == "bye"),
            "{breaker:?}: the command ended on its own, it was not stopped"
        );
        acquirable_within(&agent, &k, CRASH_RELEASE_BOUND).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_kills_an_orphaned_command_that_ignores_sigterm_after_the_grace() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let k = key("orphan-ignores-term");
    let (mut run, _) = agent.run_attached(&[&k], HOLD_IGNORING_TERM).await?;
    run.signal(Signal::SIGKILL)?;
    run.wait().await?;

    let broken_at = Instant::now();
    agent
        .runlock_output(&["release", &k])
        .await?
        .expect_code(0)?;
    run.until_stdout_closes().await?;
    let took = broken_at.elapsed();
    let grace = MAX_KILL_GRACE;
    ensure!(
        took >= grace / 2 && took < grace + Duration::from_secs(5),
        "the command ignoring SIGTERM was stopped after {took:?}, not after the {grace:?} grace"
    );
    ensure!(
        !run.lines_seen().iter().any(|l| l == "bye"),
        "{:?}",
        run.lines_seen()
    );
    Ok(())
}

/// A run that ignores SIGTERM on a key of its own (`name`, with `options`),
/// forced out by another run: how it ended (it must lose the key, with
/// code 76, before saying "bye") and how long after the force.
async fn forced_out_ignoring_term(name: &str, options: &[&str]) -> Result<(Finished, Duration)> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let k = key(name);
    let mut holder = agent.run(&[&k], options, HOLD_IGNORING_TERM)?;
    holder.ready().await?;

    let forced_at = Instant::now();
    agent
        .run(&[&k], &["--force"], "exit 0")?
        .finish()
        .await?
        .expect_code(0)?;
    let old = holder.finish().await?;
    let took = forced_at.elapsed();
    old.expect_stopped()?;
    Ok((old, took))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shim_kills_a_command_that_ignores_sigterm_after_the_grace() -> Result<()> {
    let (old, took) = forced_out_ignoring_term("ignores-term", &[]).await?;
    let grace = MAX_KILL_GRACE;
    ensure!(
        took >= grace / 2 && took < grace + Duration::from_secs(5),
        "the command ignoring SIGTERM was stopped after {took:?}, not after the {grace:?} grace: {old:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_kill_stops_even_a_command_that_ignores_sigterm_at_once() -> Result<()> {
    let (old, took) = forced_out_ignoring_term("on-lost-kill", &["--on-lost", "kill"]).await?;
    let grace = MAX_KILL_GRACE;
    ensure!(took < grace / 2, "--on-lost kill waited {took:?}: {old:?}");
    Ok(())
}

async fn a_waiting_run_whose_agent_dies_exits_69(backend: Backend) -> Result<()> {
    let mut agent = TestAgent::start_on(backend).await?;
    let mut client = agent.client().await?;
    let HeldWithAWaiter {
        mut holder, waiter, ..
    } = agent.held_with_a_waiter(&mut client, "agent-dies").await?;

    agent.kill().await?;
    let out = waiter.finish().await?;
    out.expect_code(69)?;
    ensure!(!out.stdout.contains("must-not-run"), "{out:?}");
    // The holder goes on only where it holds its lock itself.
    if backend == Backend::File {
        holder.end();
        return holder.finish().await?.expect_code(0);
    }
    holder.finish().await?.expect_code(76)
}
