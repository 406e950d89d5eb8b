//! The Rust client's example (clients/rust/examples/hold.rs), run as its
//! users would run it against a real agent: it holds a key with a token
//! that fences, releases it, and is refused a key another run holds.

use crate::support::agent::Backend;
use crate::support::bins::bins;
use crate::support::{key, Run, TestAgent};
use anyhow::{ensure, Context, Result};
use tokio::process::Command;

/// `hold ARGS` with `RUNLOCK_SOCKET` naming `agent`'s socket.
fn hold(agent: &TestAgent, args: &[&str]) -> Result<Run> {
    let mut command = Command::new(&bins()?.hold_example);
    command
        .args(args)
        .env("RUNLOCK_SOCKET", agent.socket())
        .env_remove("XDG_RUNTIME_DIR");
    Run::spawn(command)
}

/// The token on the example's `holding KEY with token N` line.
fn token_held(stdout: &str, key: &str) -> Result<u64> {
    let prefix = format!("holding {key} with token ");
    stdout
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|token| token.parse().ok())
        .with_context(|| format!("no token printed for {key}: {stdout:?}"))
}

#[tokio::test]
async fn the_hold_example_takes_a_key_prints_its_token_and_releases_it() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let k = key("client-example");
    let mut run = hold(&agent, &[&k, "30"])?;
    let holding = run.line().await?;
    let token = token_held(&holding, &k)?;
    // Held while it says so: a run of the shim is refused the key.
    let refused = agent.run(&[&k], &[], "true")?.finish().await?;
    refused.expect_code(runlock_shim::exit::EXIT_HELD.into())?;
    drop(run); // killed: the agent frees the key with the connection

    let out = hold(&agent, &[&k])?.finish().await?;
    out.expect_code(0)?;
    let next = token_held(&out.stdout, &k)?;
    ensure!(next > token, "token {next} does not fence {token}: {out:?}");
    ensure!(out.stdout.contains(&format!("released {k}")), "{out:?}");
    ensure!(
        !agent.client().await?.is_held(&k).await?,
        "still held after release"
    );
    Ok(())
}

#[tokio::test]
async fn the_hold_example_is_refused_a_key_another_run_holds() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let k = key("client-example-held");
    let (holder, _) = agent.hold(&k).await?;
    let out = hold(&agent, &[&k])?.finish().await?;
    out.expect_code(1)?;
    ensure!(out.stderr.contains("is held"), "{out:?}");
    holder.end_and_expect_success().await
}
