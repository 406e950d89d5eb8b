//! `file://` facing users it must not trust (issue 13): a link planted in
//! the lock directory is never followed out of it, a lock directory others
//! could change stops the agent at start, and lock files keep holders'
//! command lines from other users whatever the umask. Attacks go through the
//! socket as `nobody`; each test also shows that the agent serves others.

use crate::agent::config::runlockd;
use crate::support::agent::{socket_in_temp_dir, temp_dir, FileBackendDir};
use crate::support::run::{Finished, HOLD};
use crate::support::{AgentOptions, TestAgent};
use crate::trust::access::{agent_on, nobody_runs, NOBODY, RUNLOCK_GROUP};
use anyhow::{ensure, Context, Result};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use tokio::process::Command;

fn chmod(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

fn mode(path: &Path) -> Result<u32> {
    let meta = std::fs::symlink_metadata(path).with_context(|| format!("{}", path.display()))?;
    Ok(meta.mode() & 0o7777)
}

/// `runlock run --key K -- echo ran` as `nobody` in the socket's group.
async fn nobody_echoes(agent: &TestAgent, k: &str) -> Result<Finished> {
    nobody_runs(
        agent,
        &[RUNLOCK_GROUP],
        &["run", "--key", k, "--", "echo", "ran"],
    )
    .await
}

/// Refused with `internal` (70) naming `says`, the command never run.
async fn nobody_is_refused(agent: &TestAgent, k: &str, says: &str) -> Result<()> {
    let out = nobody_echoes(agent, k).await?;
    out.expect_code(70).with_context(|| format!("key {k}"))?;
    ensure!(!out.stdout.contains("ran"), "{out:?}");
    ensure!(out.stderr.contains(says), "{says:?} not named: {out:?}");
    Ok(())
}

async fn nobody_is_granted(agent: &TestAgent, k: &str) -> Result<()> {
    let out = nobody_echoes(agent, k).await?;
    out.expect_code(0).with_context(|| format!("key {k}"))?;
    out.expect_stdout_has(&["ran"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_lock_file_link_is_never_followed_and_other_keys_go_on() -> Result<()> {
    let locks = FileBackendDir::new()?;
    let agent = agent_on(&locks.uri(), "").await?;
    let outside = temp_dir()?;
    let precious = outside.path().join("precious");
    std::fs::write(&precious, "keep me\n")?;
    chmod(&precious, 0o644)?;
    let absent = outside.path().join("absent");
    std::os::unix::fs::symlink(&precious, locks.path().join("to-a-file.lock"))?;
    std::os::unix::fs::symlink(&absent, locks.path().join("to-nothing.lock"))?;

    for k in ["to-a-file", "to-nothing"] {
        nobody_is_refused(&agent, k, &format!("{k}.lock is a symbolic link")).await?;
        // Root may force; a force does not follow the link either.
        let forced = agent.run(&[k], &["--force"], "echo ran")?.finish().await?;
        forced
            .expect_code(70)
            .with_context(|| format!("forcing {k}"))?;
        ensure!(!forced.stdout.contains("ran"), "{forced:?}");
    }
    ensure!(
        std::fs::read_to_string(&precious)? == "keep me\n",
        "the target changed"
    );
    ensure!(mode(&precious)? == 0o644, "the target's mode changed");
    ensure!(!absent.exists(), "the dangling link's target was created");
    nobody_is_granted(&agent, "a-plain-key").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_gate_link_refuses_force_and_plain_runs_go_on() -> Result<()> {
    let locks = FileBackendDir::new()?;
    let agent = agent_on(&locks.uri(), "").await?;
    let outside = temp_dir()?;
    let target = outside.path().join("gate-target");
    let gate = locks.path().join(".force.lock");
    std::fs::remove_file(&gate)?;
    std::os::unix::fs::symlink(&target, &gate)?;

    let forced = agent
        .run(&["gated"], &["--force"], "echo ran")?
        .finish()
        .await?;
    forced.expect_code(70)?;
    ensure!(!forced.stdout.contains("ran"), "{forced:?}");
    forced.expect_stderr_has(&[".force.lock"])?;
    ensure!(!target.exists(), "the gate link's target was created");
    nobody_is_granted(&agent, "gated").await?;
    ensure!(!target.exists(), "the gate link's target was created");
    Ok(())
}

/// `runlockd` on `locks` exits 78 naming the directory and why.
async fn refused_at_start(locks: &FileBackendDir, says: &[&str]) -> Result<()> {
    let (_dir, socket) = socket_in_temp_dir()?;
    let socket = socket.as_str();
    let out = runlockd(&["--socket", socket, "--backend", &locks.uri()], &[]).await?;
    out.expect_code(78)?;
    let named = locks.path().display().to_string();
    out.expect_stderr_has(&[&format!("refusing lock directory {named}")])?;
    for want in says {
        ensure!(out.stderr.contains(want), "{want:?} not named: {out:?}");
    }
    ensure!(!Path::new(socket).exists(), "a socket was left");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_directory_another_user_can_change_stops_the_agent_with_78() -> Result<()> {
    let locks = FileBackendDir::new()?;
    std::fs::create_dir(locks.path())?;
    let lock_dir = locks.path().display().to_string();
    chmod(&locks.path(), 0o770)?;
    refused_at_start(
        &locks,
        &[&format!("{lock_dir} is writable by group"), "0770"],
    )
    .await?;
    chmod(&locks.path(), 0o703)?;
    refused_at_start(&locks, &["is writable by all users", "0703"]).await?;

    chmod(&locks.path(), 0o700)?;
    std::os::unix::fs::chown(locks.path(), Some(NOBODY), Some(NOBODY))?;
    refused_at_start(&locks, &[&format!("{lock_dir} is owned by uid {NOBODY}")]).await?;

    // Ours again, but inside a directory nobody owns (and so can swap it).
    std::os::unix::fs::chown(locks.path(), Some(0), Some(0))?;
    std::os::unix::fs::chown(locks.parent(), Some(NOBODY), Some(NOBODY))?;
    let parent = locks.parent().display().to_string();
    refused_at_start(&locks, &[&format!("{parent} is owned by uid {NOBODY}")]).await?;

    // Given back to root, the same directory serves.
    std::os::unix::fs::chown(locks.parent(), Some(0), Some(0))?;
    let agent = TestAgent::start(locks.uri()).await?;
    agent.run_to_success("after").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_files_are_0600_and_unreadable_by_others_even_under_umask_000() -> Result<()> {
    let locks = FileBackendDir::new()?;
    // Only the lock directory's and the files' own modes keep others out.
    chmod(locks.parent(), 0o755)?;
    let mut options = AgentOptions::new(locks.uri());
    options.umask = Some(0);
    let agent = TestAgent::start_with(options).await?;
    let k = "private-command";
    let mut run = agent.run(&[k], &[], &format!("{HOLD} # secret-argument"))?;
    run.ready().await?;
    let file = locks.path().join(format!("{k}.lock"));
    ensure!(
        std::fs::read_to_string(&file)?.contains("secret-argument"),
        "the record does not name the command; nothing to hide"
    );
    for (path, widest) in [
        (locks.path(), 0o700),
        (file.clone(), 0o600),
        (locks.path().join(".force.lock"), 0o600),
    ] {
        let mode = mode(&path)?;
        ensure!(mode & !widest == 0, "{} has mode {mode:o}", path.display());
    }
    let mut cat = Command::new("setpriv");
    cat.arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .arg("--clear-groups")
        .arg("cat")
        .arg(&file);
    let out = crate::support::Run::spawn(cat)?.finish().await?;
    ensure!(
        !out.status.success() && !out.stdout.contains("secret-argument"),
        "nobody read the lock file: {out:?}"
    );
    run.end_and_expect_success().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_a_run_holds_lets_it_neither_write_a_token_nor_read_a_record() -> Result<()> {
    let locks = FileBackendDir::new()?;
    let agent = agent_on(&locks.uri(), "").await?;
    let k = "handed";
    // Through every descriptor it inherited that names a lock file, the run
    // tries to write, to read, and to reach the key's record beside it.
    let script = r#"
        for f in /proc/$$/fd/*; do
            t=$(readlink "$f"); n=${f##*/}
            case "$t" in *.run)
                echo found-lock
                if (printf '{"token":0}' >&"$n") 2>/dev/null; then echo wrote-lock; fi
                if [ -n "$(cat <&"$n")" ]; then echo read-lock; fi
                r="${t%.run}.lock"
                if cat "$r" >/dev/null 2>&1; then echo read-record; fi
                if (printf '{"token":0}' >"$r") 2>/dev/null; then echo wrote-record; fi
                if (printf x >"${t%/*}/other.run") 2>/dev/null; then echo made-a-lock; fi
            esac
        done
        echo ready $$ $RUNLOCK_TOKEN"#;
    let out = nobody_runs(
        &agent,
        &[RUNLOCK_GROUP],
        &["run", "--key", k, "--", "sh", "-c", script],
    )
    .await?;
    out.expect_code(0)?;
    ensure!(
        out.stdout.contains("found-lock"),
        "no lock inherited: {out:?}"
    );
    for refused in [
        "wrote-lock",
        "read-lock",
        "read-record",
        "wrote-record",
        "made-a-lock",
    ] {
        ensure!(!out.stdout.contains(refused), "{refused}: {out:?}");
    }
    let token: u64 = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("ready "))
        .and_then(|l| l.split_whitespace().nth(1))
        .context("no ready line")?
        .parse()?;
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(locks.path().join(format!("{k}.lock")))?)?;
    ensure!(record["token"] == token, "the token moved: {record}");
    ensure!(
        !locks.path().join("other.run").exists(),
        "a lock file was made"
    );
    let next = agent.token_of_a_run(k).await?;
    ensure!(next > token, "{next} after {token}");
    agent.still_serves().await
}
