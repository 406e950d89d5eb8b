//! End to end with the real Meltano (tests/scripts/meltano.sh installs it and
//! exports `RUNLOCK_TEST_MELTANO` and `RUNLOCK_TEST_TARGET_JSONL`; a missing
//! install fails the test, it is never skipped). Each test writes a throwaway
//! project: an extractor `tap-hold` (a shell script, no `pip_url`, so no
//! `meltano install`) that emits a SCHEMA, a RECORD and a STATE, appends
//! `started PID` to a side file and then holds until a release file appears
//! (60 s at most), and the loader `target-jsonl` by its absolute `executable:`.

use crate::support::agent::{temp_dir, FileBackendDir};
use crate::support::bins::bins;
use crate::support::{host_name, within, AgentOptions, Deadline, Run, TestAgent, WAIT};
use anyhow::{ensure, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tempfile::TempDir;
use tokio::process::{Child, Command};

/// The state ID (and so runlock's key) of `meltano run tap-hold target-jsonl` in `dev`.
const STATE_ID: &str = "dev:tap-hold-to-target-jsonl";

/// The bound on a Meltano run reaching its tap: Meltano's start-up (and, on
/// a project's first command, its system-database migrations) takes seconds.
const MELTANO_START: Duration = Duration::from_secs(60);

/// A throwaway Meltano project. Dropping it releases any tap still holding.
struct Project {
    dir: TempDir,
    meltano: String,
}

impl Project {
    fn new() -> Result<Project> {
        let meltano = crate::support::meltano_installed("RUNLOCK_TEST_MELTANO")?;
        let target = crate::support::meltano_installed("RUNLOCK_TEST_TARGET_JSONL")?;
        // Built before any tap starts: a tap holds for 60 s at most.
        bins()?;
        let dir = temp_dir()?;
        let root = dir.path();
        let tap = root.join("tap-hold");
        let side = root.join("side");
        let release = root.join("release");
        std::fs::write(
            &tap,
            format!(
                r#"#!/bin/sh
for a in "$@"; do
    case $a in
    --discover) echo '{{"streams": []}}'; exit 0 ;;
    --about) echo '{{"name": "tap-hold"}}'; exit 0 ;;
    esac
done
echo '{{"type": "SCHEMA", "stream": "hold", "schema": {{"properties": {{"id": {{"type": "integer"}}}}}}, "key_properties": ["id"]}}'
echo '{{"type": "RECORD", "stream": "hold", "record": {{"id": 1}}}}'
echo '{{"type": "STATE", "value": {{"hold": 1}}}}'
echo "started $$" >> '{side}'
i=0
while [ ! -e '{release}' ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
"#,
                side = side.display(),
                release = release.display(),
            ),
        )?;
        std::fs::set_permissions(&tap, std::fs::Permissions::from_mode(0o755))?;
        std::fs::create_dir_all(root.join("out"))?;
        std::fs::write(
            root.join("meltano.yml"),
            format!(
                "project_id: runlock-e2e
send_anonymous_usage_stats: false
default_environment: dev
environments:
- name: dev
plugins:
  extractors:
  - name: tap-hold
    namespace: tap_hold
    executable: {tap}
  loaders:
  - name: target-jsonl
    namespace: target_jsonl
    executable: {target}
    config:
      destination_path: {out}
",
                tap = tap.display(),
                out = root.join("out").display(),
            ),
        )?;
        Ok(Project { dir, meltano })
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn system_db(&self) -> PathBuf {
        self.root().join(".meltano/meltano.db")
    }

    /// The environment every Meltano here runs with.
    fn meltano_env(&self, command: &mut Command) {
        command
            .current_dir(self.root())
            .env("MELTANO_SEND_ANONYMOUS_USAGE_STATS", "false")
            .env("MELTANO_DISABLE_TRACKING", "true")
            .env_remove("MELTANO_ENVIRONMENT")
            .env_remove("MELTANO_RUN_FORCE")
            .env_remove("MELTANO_RUN_STATE_ID_SUFFIX")
            .env_remove("MELTANO_PROJECT_ROOT");
    }

    /// `runlock run --meltano [extra] -- meltano run tap-hold target-jsonl` through `agent`.
    fn wrapped(&self, agent: &TestAgent, extra: &[&str]) -> Result<Run> {
        let mut command = agent.runlock()?;
        self.meltano_env(&mut command);
        command.args(["run", "--meltano"]).args(extra).args([
            "--",
            &self.meltano,
            "run",
            "tap-hold",
            "target-jsonl",
        ]);
        Run::spawn(command)
    }

    /// The same Meltano run without runlock, in a process group of its own.
    fn unwrapped(&self) -> Result<Unwrapped> {
        let mut command = Command::new(&self.meltano);
        self.meltano_env(&mut command);
        command
            .args(["run", "tap-hold", "target-jsonl"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        Ok(Unwrapped(command.spawn().context("starting meltano")?))
    }

    /// Chooses a second environment, `prod`, the way `meltano environment`
    /// and `meltano config set` users do: in the project's `.env`, with the
    /// add-on's state backend (`runlock+file://`, in the project) beside it.
    fn choose_prod_in_dotenv(&self) -> Result<()> {
        let file = self.root().join("meltano.yml");
        let yml = std::fs::read_to_string(&file)?;
        std::fs::write(
            &file,
            yml.replace("- name: dev\n", "- name: dev\n- name: prod\n"),
        )?;
        let state = self.root().join("state");
        std::fs::create_dir_all(&state)?;
        std::fs::write(
            self.root().join(".env"),
            format!(
                "# written as `meltano config set` writes it\n\
                 export MELTANO_ENVIRONMENT='prod'\n\
                 MELTANO_STATE_BACKEND_URI='runlock+file://{}'\n",
                state.display()
            ),
        )?;
        Ok(())
    }

    /// `meltano run tap-hold target-jsonl` without the shim, locked by the
    /// add-on through `agent`.
    fn through_the_add_on(&self, agent: &TestAgent) -> Result<Run> {
        let mut command = Command::new(&self.meltano);
        self.meltano_env(&mut command);
        command
            .env("RUNLOCK_SOCKET", agent.socket())
            .args(["run", "tap-hold", "target-jsonl"]);
        Run::spawn(command)
    }

    /// What `runlock run --meltano --print-keys` derives here.
    async fn printed_keys(&self, agent: &TestAgent) -> Result<String> {
        let mut command = agent.runlock()?;
        self.meltano_env(&mut command);
        command.args(["run", "--meltano", "--print-keys", "--", &self.meltano]);
        command.args(["run", "tap-hold", "target-jsonl"]);
        let out = Run::spawn(command)?.finish().await?;
        out.expect_code(0)?;
        Ok(out.stdout)
    }

    /// The taps that have started so far (their pids).
    fn started(&self) -> Vec<u32> {
        std::fs::read_to_string(self.root().join("side"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("started ")?.parse().ok())
            .collect()
    }

    /// Waits until `n` taps have started; returns the last one's pid.
    async fn wait_started(&self, n: usize) -> Result<u32> {
        let deadline = Deadline::new(MELTANO_START, format!("tap number {n} to start"));
        loop {
            let started = self.started();
            if started.len() >= n {
                return Ok(started[n - 1]);
            }
            deadline.tick().await?;
        }
    }

    /// Lets every holding tap finish.
    fn release(&self) -> Result<()> {
        std::fs::write(self.root().join("release"), "").context("writing the release file")
    }

    /// The JSONL files target-jsonl wrote.
    fn output(&self) -> Result<String> {
        let mut all = String::new();
        for entry in std::fs::read_dir(self.root().join("out"))? {
            all += &std::fs::read_to_string(entry?.path())?;
        }
        Ok(all)
    }

    /// The run ids of the `RUNNING` rows in the project's system database.
    async fn running_ids(&self) -> Result<String> {
        let path = self.system_db();
        let read = tokio::task::spawn_blocking(move || {
            let db = rusqlite::Connection::open(&path)?;
            // Meltano writes the file meanwhile: wait for its lock.
            db.busy_timeout(WAIT)?;
            let mut running = db.prepare("SELECT run_id FROM runs WHERE state = 'RUNNING'")?;
            let ids = running
                .query_map([], |row| row.get::<_, String>(0))?
                .map(|id| id.map(|id| id + "\n"))
                .collect::<rusqlite::Result<String>>()?;
            anyhow::Ok(ids)
        });
        within(WAIT, "reading the system database", read)
            .await??
            .context("reading the system database")
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// An unwrapped `meltano run`; dropping it kills its group.
struct Unwrapped(Child);

impl Drop for Unwrapped {
    fn drop(&mut self) {
        if let (Some(pid), Ok(None)) = (self.0.id(), self.0.try_wait()) {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// The process group of `pid` (field 5 of /proc/PID/stat).
fn process_group(pid: u32) -> Result<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("bad stat")?.1;
    after
        .split_whitespace()
        .nth(2)
        .context("no pgrp in stat")?
        .parse()
        .context("bad pgrp")
}

/// Two hosts: each its own project (so each its own system database, and
/// Meltano's own check never sees the other's run) and its own agent, sharing
/// one lock directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_run_one_meltano_pipeline_at_a_time_and_a_killed_run_frees_it() -> Result<()> {
    let (host_a, host_b) = (Project::new()?, Project::new()?);
    let (_locks, a, b) = FileBackendDir::with_two_agents().await?;

    let mut first = host_a.wrapped(&a, &[])?;
    let tap = host_a.wait_started(1).await?;

    let second = host_b.wrapped(&b, &[])?.finish().await?;
    second.expect_code(75)?;
    for want in [format!("\"{STATE_ID}\" is held"), host_name()?] {
        ensure!(
            second.stderr.contains(&want),
            "{want:?} not named: {second:?}"
        );
    }
    ensure!(host_b.started().is_empty(), "a second tap ran: {second:?}");

    // SIGKILL the shim and the group its command runs in (Meltano, tap, target).
    let group = process_group(tap)?;
    first.signal(Signal::SIGKILL)?;
    killpg(Pid::from_raw(group), Signal::SIGKILL).context("killing the run's group")?;
    first.wait().await?;

    // The next run, on the other host, gets the key within a bounded wait.
    let mut third = host_b.wrapped(&b, &["--wait", "10s"])?;
    host_b.wait_started(1).await?;
    host_b.release()?;
    let status = within(MELTANO_START, "the next run to end", third.wait()).await??;
    let third = third.finish().await?;
    ensure!(status.code() == Some(0), "{third:?}");
    let out = host_b.output()?;
    ensure!(out.contains("\"id\": 1"), "target-jsonl wrote {out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwrapped_meltano_run_holds_off_a_wrapped_one_through_its_system_db() -> Result<()> {
    let project = Project::new()?;
    let mut unwrapped = project.unwrapped()?;
    project.wait_started(1).await?;
    let run_ids = project.running_ids().await?;
    let run_id = run_ids
        .lines()
        .next()
        .context("no RUNNING row in the system database")?;

    let mut options = AgentOptions::new("memory://");
    options.args = vec![
        "--legacy-meltano-systemdb".to_string(),
        project.system_db().display().to_string(),
    ];
    let agent = TestAgent::start_with(options).await?;
    let refused = project.wrapped(&agent, &[])?.finish().await?;
    refused.expect_code(75)?;
    for want in [STATE_ID, run_id, "RUNNING in the system database"] {
        ensure!(
            refused.stderr.contains(want),
            "{want:?} not named: {refused:?}"
        );
    }
    ensure!(
        project.started().len() == 1,
        "a second tap ran: {refused:?}"
    );

    project.release()?;
    let status = within(
        MELTANO_START,
        "the unwrapped run to end",
        unwrapped.0.wait(),
    )
    .await??;
    ensure!(
        status.success(),
        "the unwrapped meltano run failed: {status:?}"
    );

    // Its row is no longer RUNNING: the wrapped run goes ahead.
    let mut after = project.wrapped(&agent, &[])?;
    let status = within(MELTANO_START, "the wrapped run to end", after.wait()).await??;
    let after = after.finish().await?;
    ensure!(status.code() == Some(0), "{after:?}");
    ensure!(project.started().len() == 2, "{after:?}");
    Ok(())
}

/// A project whose `.env` chooses the environment: runlock locks the state
/// ID Meltano itself uses there (`prod:…`, not the default's `dev:…`), so a
/// wrapped run on one host and a run locked by the add-on on another
/// exclude each other, in both orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dotenv_environment_is_locked_under_meltanos_key_wrapped_or_by_the_add_on() -> Result<()>
{
    const PROD: &str = "prod:tap-hold-to-target-jsonl";
    let (host_a, host_b) = (Project::new()?, Project::new()?);
    host_a.choose_prod_in_dotenv()?;
    host_b.choose_prod_in_dotenv()?;
    let (_locks, a, b) = FileBackendDir::with_two_agents().await?;
    ensure!(host_a.printed_keys(&a).await? == format!("{PROD}\n"));

    // Wrapped on A, then the add-on's run on B is refused before its tap.
    let mut wrapped = host_a.wrapped(&a, &[])?;
    host_a.wait_started(1).await?;
    let refused = host_b
        .through_the_add_on(&b)?
        .finish_within(MELTANO_START)
        .await?;
    // 75 as the shim's: skipped, not failed.
    refused.expect_code(75)?;
    ensure!(
        refused
            .stderr
            .contains(&format!("'{PROD}' is already running"))
            && refused.stderr.contains(&host_name()?),
        "the refusal names neither the key nor its holder: {refused:?}"
    );
    ensure!(host_b.started().is_empty(), "a second tap ran: {refused:?}");
    host_a.release()?;
    let status = within(MELTANO_START, "the wrapped run to end", wrapped.wait()).await??;
    ensure!(status.code() == Some(0), "{:?}", wrapped.finish().await?);

    // The add-on's run on B holds; the wrapped run on A is refused (75).
    std::fs::remove_file(host_a.root().join("release"))?;
    let mut by_add_on = host_b.through_the_add_on(&b)?;
    host_b.wait_started(1).await?;
    let second = host_a.wrapped(&a, &[])?.finish().await?;
    second.expect_code(75)?;
    ensure!(
        second.stderr.contains(&format!("\"{PROD}\" is held")),
        "{second:?}"
    );
    ensure!(host_a.started().len() == 1, "a second tap ran: {second:?}");
    host_b.release()?;
    let status = within(MELTANO_START, "the add-on's run to end", by_add_on.wait()).await??;
    ensure!(status.code() == Some(0), "{:?}", by_add_on.finish().await?);
    Ok(())
}
