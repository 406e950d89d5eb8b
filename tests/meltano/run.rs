//! `runlock run --meltano`: the shim locks the state IDs Meltano itself would
//! use for a `meltano run` command line. A stand-in `meltano` script (the real
//! one is exercised end to end elsewhere) shows what the command was given.

use crate::support::agent::{temp_dir, Backend};
use crate::support::{host_name, Run, TestAgent};
use anyhow::{ensure, Result};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const PROJECT: &str = "version: 1
default_environment: dev
environments:
- name: dev
- name: prod
  state_id_suffix: blue
plugins:
  extractors:
  - name: tap-smoke-test
  loaders:
  - name: target-jsonl
";

/// A project directory with meltano.yml and a `bin/meltano` that prints its
/// keys and tokens, then holds until its stdin closes.
fn project(dir: &Path) -> Result<String> {
    std::fs::write(dir.join("meltano.yml"), PROJECT)?;
    std::fs::create_dir_all(dir.join("bin"))?;
    let meltano = dir.join("bin/meltano");
    std::fs::write(
        &meltano,
        "#!/bin/sh\necho \"ready $$ $RUNLOCK_TOKEN\"\necho \"keys $RUNLOCK_KEY\"\nread _line\necho bye\n",
    )?;
    std::fs::set_permissions(&meltano, std::fs::Permissions::from_mode(0o755))?;
    Ok(meltano.display().to_string())
}

fn wrapped(agent: &TestAgent, dir: &Path, line: &[&str]) -> Result<Run> {
    let mut command = agent.runlock()?;
    command
        .current_dir(dir)
        .env_remove("MELTANO_ENVIRONMENT")
        .env_remove("MELTANO_RUN_FORCE")
        .env_remove("MELTANO_RUN_STATE_ID_SUFFIX")
        .env_remove("MELTANO_PROJECT_ROOT")
        .args(["run", "--meltano", "--"])
        .args(line);
    Run::spawn(command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_meltano_run_of_the_same_pipeline_is_refused() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let dir = temp_dir()?;
    let meltano = project(dir.path())?;
    let line = [meltano.as_str(), "run", "tap-smoke-test", "target-jsonl"];
    let mut first = wrapped(&agent, dir.path(), &line)?;
    let ready = first.ready().await?;
    first
        .expect_line("keys dev:tap-smoke-test-to-target-jsonl")
        .await?;

    let second = wrapped(&agent, dir.path(), &line)?.finish().await?;
    second.expect_code(75)?;
    second.expect_stderr_has(&[
        "\"dev:tap-smoke-test-to-target-jsonl\" is held",
        &host_name()?,
        &format!("token:   {}", ready.token()),
    ])?;

    // Another environment is another state ID: it runs.
    let prod = [
        meltano.as_str(),
        "--environment=prod",
        "run",
        "tap-smoke-test",
        "target-jsonl",
    ];
    let mut other = wrapped(&agent, dir.path(), &prod)?;
    other.ready().await?;
    other
        .expect_line("keys prod:tap-smoke-test-to-target-jsonl:blue")
        .await?;
    other.end_and_expect_success().await?;

    // Meltano's own --force is runlock's: the first run is stopped (76).
    let forced = [
        meltano.as_str(),
        "run",
        "--force",
        "tap-smoke-test",
        "target-jsonl",
    ];
    let mut taker = wrapped(&agent, dir.path(), &forced)?;
    taker.ready().await?;
    first.finish().await?.expect_code(76)?;
    taker.end_and_expect_success().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_line_without_a_state_id_is_a_usage_error() -> Result<()> {
    let agent = TestAgent::start_on(Backend::Memory).await?;
    let dir = temp_dir()?;
    let meltano = project(dir.path())?;
    let out = wrapped(
        &agent,
        dir.path(),
        &[meltano.as_str(), "run", "tap-nope", "target-jsonl"],
    )?
    .finish()
    .await?;
    out.expect_code(64)?;
    out.expect_stderr_has(&["\"tap-nope\" is not a plugin"])?;
    ensure!(!out.stdout.contains("ready"), "it ran: {out:?}");
    Ok(())
}
