//! Who may do what: the socket's group and mode keep other users out, the
//! holder records the peer's uid and gid, and only the users and groups the
//! configuration lists (default: root and the agent's user) may force or
//! break another's lock. A second, unprivileged user is played by `nobody`
//! through `setpriv`.

use crate::support::bins::bins;
use crate::support::run::{Finished, Ready, HOLD};
use crate::support::{key, setpriv, AgentOptions, Run, TestAgent};
use anyhow::{ensure, Context, Result};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use tokio::process::Command;

pub(crate) const NOBODY: u32 = 65534;
/// The socket's group: any gid will do, root can give the socket to it.
pub(crate) const RUNLOCK_GROUP: u32 = 4242;
/// A group the configuration lets force and break.
const ADMIN_GROUP: u32 = 4243;

/// An agent whose socket belongs to `RUNLOCK_GROUP`, mode 0660, in a
/// directory others may pass through; `config` is its configuration file.
pub(crate) async fn agent(config: &str) -> Result<TestAgent> {
    agent_on("memory://", config).await
}

/// Like [`agent`], on `backend`.
pub(crate) async fn agent_on(backend: &str, config: &str) -> Result<TestAgent> {
    agent_on_with_env(backend, config, &[], &[]).await
}

/// Like [`agent_on`], with more arguments and the environment a network
/// store needs.
pub(crate) async fn agent_on_with_env(
    backend: &str,
    config: &str,
    args: &[&str],
    env: &[(String, String)],
) -> Result<TestAgent> {
    let dir = crate::support::agent::temp_dir()?;
    let file = dir.path().join("runlockd.toml");
    std::fs::write(&file, config)?;
    let mut options = AgentOptions::new(backend);
    options.args = vec![
        "--config".into(),
        file.display().to_string(),
        "--socket-group".into(),
        RUNLOCK_GROUP.to_string(),
    ];
    options.args.extend(args.iter().map(|a| a.to_string()));
    let agent = TestAgent::start_with_env(options, env).await?;
    std::fs::set_permissions(agent.dir(), std::fs::Permissions::from_mode(0o755))?;
    drop(dir);
    Ok(agent)
}

/// `runlock --socket S ARGS...` as `nobody` with the supplementary `groups`.
pub(crate) fn as_nobody(agent: &TestAgent, groups: &[u32], args: &[&str]) -> Result<Run> {
    let mut command = setpriv(NOBODY, NOBODY, groups);
    command
        .arg(&bins()?.runlock)
        .arg("--socket")
        .arg(agent.socket())
        .args(args)
        .env_remove("RUNLOCK_SOCKET")
        .env_remove("RUNLOCK_CONFIG");
    Run::spawn(command)
}

/// `nobody`, a member of the socket's group, running a [`HOLD`] of `key`,
/// once it holds it (as [`TestAgent::hold`] does for root).
pub(crate) async fn member_holds(agent: &TestAgent, key: &str) -> Result<(Run, Ready)> {
    let mut run = as_nobody(
        agent,
        &[RUNLOCK_GROUP],
        &["run", "--key", key, "--", "sh", "-c", HOLD],
    )?;
    let ready = run.ready().await?;
    Ok((run, ready))
}

pub(crate) async fn nobody_runs(
    agent: &TestAgent,
    groups: &[u32],
    args: &[&str],
) -> Result<Finished> {
    as_nobody(agent, groups, args)?.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_outside_the_sockets_group_cannot_connect() -> Result<()> {
    let agent = agent("").await?;
    let meta = std::fs::metadata(agent.socket())?;
    ensure!(meta.gid() == RUNLOCK_GROUP, "socket group {}", meta.gid());
    ensure!(
        meta.mode() & 0o777 == 0o660,
        "socket mode {:o}",
        meta.mode()
    );
    let k = key("outsider");
    let out = nobody_runs(&agent, &[], &["run", "--key", &k, "--", "echo", "ran"]).await?;
    out.expect_code(69)?;
    ensure!(!out.stdout.contains("ran"), "{out:?}");
    out.expect_stderr_has(&["ermission denied"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_holds_locks_under_its_own_uid_and_gid() -> Result<()> {
    let agent = agent("").await?;
    let k = key("member");
    let (run, _) = member_holds(&agent, &k).await?;
    let record = agent.inspect_json(&k).await?;
    ensure!(record["holder"]["uid"] == NOBODY, "{record}");
    ensure!(record["holder"]["gid"] == NOBODY, "{record}");
    ensure!(record["holder"]["user"] == "nobody", "{record}");
    run.end_and_expect_success().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_only_root_and_the_agents_user_force_or_break() -> Result<()> {
    let agent = agent("").await?;
    let k = key("roots");
    let (held, _) = agent.hold(&k).await?;
    let release = nobody_runs(&agent, &[RUNLOCK_GROUP], &["release", &k]).await?;
    release.expect_code(77)?;
    release.expect_stderr_has(&["uid 65534 may not release"])?;
    let force = ["run", "--force", "--key", &k, "--", "echo", "ran"];
    let forced = nobody_runs(&agent, &[RUNLOCK_GROUP], &force).await?;
    forced.expect_code(77)?;
    ensure!(!forced.stdout.contains("ran"), "{forced:?}");
    // The holder was never disturbed.
    held.end_and_expect_success().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_group_may_break_anothers_lock() -> Result<()> {
    let config = format!("[access]\nforce_groups = [{ADMIN_GROUP}]\n");
    let agent = agent(&config).await?;
    let k = key("admins");
    let (held, _) = agent.hold(&k).await?;
    let plain = nobody_runs(&agent, &[RUNLOCK_GROUP], &["release", &k]).await?;
    plain.expect_code(77)?;
    let admin = nobody_runs(&agent, &[RUNLOCK_GROUP, ADMIN_GROUP], &["release", &k]).await?;
    admin.expect_code(0)?;
    let out = held.finish().await?;
    out.expect_code(76)?;
    out.expect_stderr_has(&["released by uid 65534"])?;
    Ok(())
}

#[tokio::test]
async fn the_socket_group_must_exist() -> Result<()> {
    let out = {
        let mut command = Command::new(&bins()?.runlockd);
        command.args(["check-config", "--socket-group", "no-such-group-here"]);
        Run::spawn(command)?.finish().await?
    };
    out.expect_code(78).context("an unknown group")?;
    out.expect_stderr_has(&["no-such-group-here"])?;
    Ok(())
}
