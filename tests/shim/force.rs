//! `--force` never runs beside the run it displaces (invariant 10), through
//! the real shim and agents, on every backend: the forced command starts
//! once the displaced run has stopped, or once that run's deadline has
//! passed when its host is gone; the forced run says what it waits for.
//! A break (`runlock release KEY`) frees the key only then, too.
//! Each case is an `async fn(place)`, named per backend by `on_every_place!`
//! (`shim::force::CASE::BACKEND`).

use super::run_holds_lock::agent_on;
use crate::support::agent::FileBackendDir;
use crate::support::hosts::Place;
use crate::support::run::Finished;
use crate::support::stores::{Azure, Etcd, Gcs, Ministack, Postgres, Space, Store, S3};
use crate::support::{key, Deadline, TestAgent};
use anyhow::{ensure, Result};
use std::time::{Duration, Instant};

on_every_place!(
    a_forced_run_starts_once_the_run_it_displaced_has_stopped,
    a_break_through_the_holders_agent_frees_the_key_once_the_run_has_stopped,
    a_break_through_another_agent_frees_the_key_once_the_run_has_stopped,
);

// Leases that outlive their agent: a dead host's run stops at its deadline.
test_matrix!(
    [s3: S3, ministack: Ministack, azure: Azure, gcs: Gcs, postgres: Postgres, etcd: Etcd];
    a_forced_run_waits_out_the_deadline_of_a_run_whose_host_is_gone,
);

/// The holder: holds an exclusive `flock` on `$WITNESS` for as long as any
/// process of its run lives, so that a run beside it cannot take it; says
/// `ready PID TOKEN` (PID: the command's, now `flock`) once it holds it.
const HOLDER: &str =
    "exec flock \"$WITNESS\" sh -c 'echo ready $PPID $RUNLOCK_TOKEN; read _line; echo bye'";

/// The forced run: whether it started alone, by the witness.
const FORCED: &str =
    "if flock -n \"$WITNESS\" true; then echo alone $RUNLOCK_TOKEN; else echo beside; fi";

/// A witness file for one case, and the environment that names it.
fn witness(case: &str) -> Result<(tempfile::TempDir, String)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join(case);
    std::fs::write(&path, b"")?;
    Ok((dir, path.display().to_string()))
}

/// Checks that the forced run ran alone, after saying what it waited for.
fn ran_alone(forced: &Finished, displaced_token: u64) -> Result<()> {
    forced.expect_code(0)?;
    ensure!(
        forced.stdout.starts_with("alone "),
        "the forced run started beside the run it displaced: {forced:?}"
    );
    ensure!(
        forced
            .stderr
            .contains("is taken over; waiting for the run of")
            && forced.stderr.contains(&format!("token {displaced_token})"))
            && (forced.stderr.contains("at most") || forced.stderr.contains("no deadline")),
        "the forced run did not say what it waited for: {forced:?}"
    );
    Ok(())
}

async fn a_forced_run_starts_once_the_run_it_displaced_has_stopped(
    place: impl Place,
) -> Result<()> {
    // TTL 6 s: through another agent, the holder hears of the force at its
    // next renewal, about 2 s on.
    let hosts = place.hosts("force-waits", &["--ttl", "6s"]).await?;
    let k = key("force-waits");
    let (_dir, witness) = witness("force-waits")?;
    let env = [("WITNESS", witness.as_str())];
    let mut holder = hosts.a.run_with_env(&[&k], &[], HOLDER, &env)?;
    let token = holder.ready().await?.token();

    let forced = hosts.b().run_with_env(&[&k], &["--force"], FORCED, &env)?;
    let forced = forced.finish().await?;
    ran_alone(&forced, token)?;
    let stopped = holder.finish().await?;
    stopped.expect_stopped()?;
    Ok(())
}

async fn a_forced_run_waits_out_the_deadline_of_a_run_whose_host_is_gone(
    store: impl Store,
) -> Result<()> {
    const TTL: Duration = Duration::from_secs(5);
    let space = Space::create(store, "force-deadline").await?;
    let mut a = space.agent("f", &["--ttl", "5s"]).await?;
    let b: TestAgent = space.agent("f", &["--ttl", "5s"]).await?;
    let k = key("force-deadline");
    let (_dir, witness) = witness("force-deadline")?;
    let env = [("WITNESS", witness.as_str())];
    let (holder, ready) = a.run_attached_with_env(&[&k], HOLDER, &env).await?;

    // The host's agent dies: nobody tells the holder of the force, and its
    // shim stops the run at its lease's deadline.
    a.kill().await?;
    let started = Instant::now();
    let forced = b.run_with_env(&[&k], &["--force"], FORCED, &env)?;
    let forced = forced.finish_within(TTL * 4).await?;
    ran_alone(&forced, ready.token())?;
    ensure!(
        forced.elapsed >= TTL / 2,
        "answered after {:?}: before the displaced run could have stopped",
        forced.elapsed
    );
    let stopped = holder.finish().await?;
    stopped.expect_code(76)?;
    ensure!(started.elapsed() < TTL * 4, "{:?}", started.elapsed());
    Ok(())
}

/// A holder whose run outlives SIGTERM: it is stopped only by the SIGKILL a
/// kill grace later, so a key freed before then would let a waiter in
/// beside it.
const STUBBORN_HOLDER: &str = "exec flock \"$WITNESS\" sh -c 'trap \"\" TERM; echo ready $PPID $RUNLOCK_TOKEN; read _line; echo bye'";

async fn a_break_through_the_holders_agent_frees_the_key_once_the_run_has_stopped(
    place: impl Place,
) -> Result<()> {
    a_break_frees_the_key_once_the_run_has_stopped(place, "break-here", true).await
}

async fn a_break_through_another_agent_frees_the_key_once_the_run_has_stopped(
    place: impl Place,
) -> Result<()> {
    a_break_frees_the_key_once_the_run_has_stopped(place, "break-there", false).await
}

/// A run holds the key on A and a waiter queues on B; `runlock release`
/// through A (`here`) or B breaks the run, says what it waits for, and
/// answers once the run has stopped: the waiter then starts alone.
async fn a_break_frees_the_key_once_the_run_has_stopped(
    place: impl Place,
    case: &str,
    here: bool,
) -> Result<()> {
    let hosts = place.hosts(case, &["--ttl", "6s"]).await?;
    let k = key(case);
    let (_dir, witness) = witness(case)?;
    let env = [("WITNESS", witness.as_str())];
    let mut holder = hosts.a.run_with_env(&[&k], &[], STUBBORN_HOLDER, &env)?;
    let token = holder.ready().await?.token();
    let waiter = hosts
        .b()
        .run_with_env(&[&k], &["--wait", "60s"], FORCED, &env)?;

    let breaker = if here { &hosts.a } else { hosts.b() };
    let broken = breaker.runlock_output(&["release", &k]).await?;
    let stopped = holder.finish().await?;
    let waiter = waiter.finish().await?;
    waiter.expect_code(0)?;
    ensure!(
        waiter.stdout.starts_with("alone "),
        "the waiter started beside the broken run: {waiter:?}"
    );
    stopped.expect_stopped()?;
    broken.expect_code(0)?;
    ensure!(broken.stdout.starts_with("released"), "{broken:?}");
    ensure!(
        broken
            .stderr
            .contains("is taken over; waiting for the run of")
            && broken.stderr.contains(&format!("token {token})")),
        "the break did not say what it waited for: {broken:?}"
    );
    Ok(())
}

/// `file://`, its agent down: the run holds its kernel lock, which has no
/// deadline, so a force through another agent waits for that lock however
/// long (past the TTL + grace a lease's run would be stopped by), and
/// starts once the run's shim has reached the next agent and been stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_file_a_forced_run_waits_for_the_lock_of_a_run_whose_agent_is_down() -> Result<()> {
    const TTL: Duration = Duration::from_secs(2);
    let locks = FileBackendDir::new()?;
    let mut a = agent_on(&locks, None, "2s").await?;
    let b = agent_on(&locks, None, "2s").await?;
    let k = key("force-file-down");
    let (_dir, witness) = witness("force-file-down")?;
    let env = [("WITNESS", witness.as_str())];
    let (holder, ready) = a.run_attached_with_env(&[&k], HOLDER, &env).await?;
    a.kill().await?;

    let mut forced = b.run_with_env(&[&k], &["--force"], FORCED, &env)?;
    let told = Deadline::new(Duration::from_secs(15), "the forced run's notice");
    while !forced.stderr_so_far().contains("is taken over; waiting") {
        told.tick().await?;
    }
    // Past the deadline a lease's run would have been stopped by, the forced
    // command has still not started: the run's lock is held.
    let started = tokio::time::timeout(TTL * 2, forced.line()).await;
    ensure!(
        started.is_err(),
        "the forced run started while the run it displaced held its lock: {started:?}"
    );
    // The run's own agent comes back: its shim reattaches, is refused (the
    // key was taken), and stops the run; the forced run then starts alone.
    let _back = agent_on(&locks, Some(a.socket()), "2s").await?;
    let stopped = holder.finish().await?;
    stopped.expect_code(76)?;
    let forced = forced.finish().await?;
    forced.expect_code(0)?;
    ensure!(
        forced.stdout.starts_with("alone "),
        "the forced run started beside the run it displaced: {forced:?}"
    );
    ensure!(
        forced.stderr.contains(&format!("token {})", ready.token()))
            && forced.stderr.contains("no deadline"),
        "the forced run did not say what it waited for: {forced:?}"
    );
    Ok(())
}

/// `file://`: a forcer's agent killed while it waits for the run it
/// displaced (whose own agent is down, so that run goes on) takes its lock on
/// the new `KEY.run` with it. The run it displaced still holds the old one,
/// renamed away: neither a plain run nor a second force through a third
/// agent may start beside it; the second force waits for it, as the first did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_file_a_forcer_killed_while_it_waits_lets_no_run_in_beside_the_run_it_displaced(
) -> Result<()> {
    let locks = FileBackendDir::new()?;
    let mut a = agent_on(&locks, None, "2s").await?;
    let mut b = agent_on(&locks, None, "2s").await?;
    let c = agent_on(&locks, None, "2s").await?;
    let k = key("force-file-forcer-killed");
    let (_dir, witness) = witness("force-file-forcer-killed")?;
    let env = [("WITNESS", witness.as_str())];
    let (holder, ready) = a.run_attached_with_env(&[&k], HOLDER, &env).await?;
    a.kill().await?;

    let waiting =
        |run: &crate::support::run::Run| run.stderr_so_far().contains("is taken over; waiting");
    let first = b.run_with_env(&[&k], &["--force"], FORCED, &env)?;
    let told = Deadline::new(Duration::from_secs(15), "the first force's notice");
    while !waiting(&first) {
        told.tick().await?;
    }
    b.kill().await?;
    let first = first.finish().await?;
    ensure!(
        !first.stdout.contains("alone") && !first.stdout.contains("beside"),
        "the first forced command ran although its agent died while it waited: {first:?}"
    );

    let plain = c.run_with_env(&[&k], &[], FORCED, &env)?.finish().await?;
    plain.expect_code(75)?;
    let names_holder = plain.stderr.lines().any(|line| {
        let line = line.trim();
        line.starts_with("token:") && line.ends_with(&format!(" {}", ready.token()))
    });
    ensure!(
        names_holder,
        "the refusal does not name the run still holding the key: {plain:?}"
    );

    let mut second = c.run_with_env(&[&k], &["--force"], FORCED, &env)?;
    let told = Deadline::new(Duration::from_secs(15), "the second force's notice");
    while !waiting(&second) {
        told.tick().await?;
    }
    let started = tokio::time::timeout(Duration::from_secs(3), second.line()).await;
    ensure!(
        started.is_err(),
        "the second force started while the run it displaced held its lock: {started:?}"
    );
    // The displaced run's agent comes back: its shim reattaches, is told
    // the key was taken, and stops the run; the second force then starts alone.
    let _back = agent_on(&locks, Some(a.socket()), "2s").await?;
    holder.finish().await?.expect_code(76)?;
    let second = second.finish().await?;
    second.expect_code(0)?;
    ensure!(
        second.stdout.starts_with("alone "),
        "the second force started beside the run it displaced: {second:?}"
    );
    Ok(())
}
