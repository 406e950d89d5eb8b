//! `runlockd` as a process: its socket file (a live agent is never displaced, a
//! stale file is replaced, the mode is 0660, a clean stop removes it), its
//! flags and its logs.

use crate::support::agent::{temp_dir, Backend, FileBackendDir};
use crate::support::bins::bins;
use crate::support::run::HOLD;
use crate::support::{key, within, AgentOptions, Run, TestAgent, WAIT};
use anyhow::{ensure, Context, Result};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::process::{Output, Stdio};

/// Runs a `runlockd` that is expected to refuse to start.
pub(crate) async fn runlockd_refusing(args: &[&str]) -> Result<Output> {
    let mut command = tokio::process::Command::new(&bins()?.runlockd);
    command
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUNLOCK_SOCKET")
        .env_remove("RUNLOCK_BACKEND")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = within(WAIT, "runlockd to give up", command.output())
        .await?
        .context("running runlockd")?;
    ensure!(
        !out.status.success(),
        "runlockd {args:?} started: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_refuses_a_socket_another_agent_listens_on() -> Result<()> {
    let first = TestAgent::start_on(Backend::File).await?;
    let socket = first.socket().display().to_string();
    let out = runlockd_refusing(&["--socket", &socket, "--backend", first.backend()]).await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        stderr.contains("already listening") && stderr.contains(&socket),
        "no clear message: {stderr}"
    );
    // The first agent's socket is untouched and it still serves.
    ensure!(
        first.socket().exists(),
        "the refused agent removed the socket"
    );
    let k = key("after-refusal");
    first.run_to_success(&k).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_replaces_a_stale_socket_left_by_a_killed_agent() -> Result<()> {
    let dir = temp_dir()?;
    let socket = dir.path().join("agent.sock");
    let locks = FileBackendDir::new()?;
    let mut options = AgentOptions::new(locks.uri());
    options.socket = Some(socket.clone());
    let mut killed = TestAgent::start_with(options.clone()).await?;
    killed.kill().await?;
    ensure!(socket.exists(), "SIGKILL left no socket file to test with");

    let agent = TestAgent::start_with(options).await?;
    let k = key("stale-socket");
    agent.run_to_success(&k).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_is_mode_0660_and_a_clean_stop_removes_it() -> Result<()> {
    let mut agent = TestAgent::start_on(Backend::File).await?;
    let meta = std::fs::metadata(agent.socket())?;
    ensure!(meta.file_type().is_socket(), "{meta:?}");
    ensure!(
        meta.permissions().mode() & 0o777 == 0o660,
        "mode {:o}",
        meta.permissions().mode() & 0o777
    );
    let status = agent.stop().await?;
    ensure!(status.success(), "runlockd exited with {status:?}");
    ensure!(!agent.socket().exists(), "the socket file is left behind");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_stop_the_agent_with_a_message() -> Result<()> {
    let dir = temp_dir()?;
    let socket = dir.path().join("agent.sock").display().to_string();
    for (args, says) in [
        (vec!["--backend", "gopher://x"], "gopher"),
        (vec!["--backend", "not a uri"], "not a URI"),
        (vec!["--backend", "memory://", "--ttl", "10ms"], "--ttl"),
        (vec!["--backend", "memory://", "--ttl", "soon"], "soon"),
    ] {
        let mut all = vec!["--socket", socket.as_str()];
        all.extend(args.iter().copied());
        let out = runlockd_refusing(&all).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(stderr.contains(says), "runlockd {args:?}: {stderr}");
    }
    ensure!(
        !dir.path().join("agent.sock").exists(),
        "a refused start left a socket"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() -> Result<()> {
    let locks = FileBackendDir::new()?;
    let mut options = AgentOptions::new(locks.uri());
    options.args = vec!["--log-format".into(), "json".into()];
    let mut agent = TestAgent::start_with(options).await?;
    let k = key("json-logs");
    agent.run_to_success(&k).await?;
    agent.stop().await?;
    let log = agent.log();
    let mut keys_logged = 0;
    for line in log.lines() {
        let entry: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("not JSON: {line:?}"))?;
        if entry.to_string().contains(&k) {
            keys_logged += 1;
        }
    }
    ensure!(
        keys_logged >= 2,
        "acquire and release are not logged:\n{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_users_may_run_but_not_force_or_release() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        // Another uid is needed on the far side of the socket; only root can switch.
        eprintln!("skipped: needs root to run the shim as another user");
        return Ok(());
    }
    let agent = TestAgent::start_on(Backend::File).await?;
    let nobody = nix::unistd::User::from_name("nobody")?.context("no user nobody")?;
    std::fs::set_permissions(agent.dir(), std::fs::Permissions::from_mode(0o711))?;
    let as_nobody = |args: &[&str]| -> Result<Run> {
        let mut command = agent.runlock()?;
        command
            .args(args)
            .uid(nobody.uid.as_raw())
            .gid(nobody.gid.as_raw());
        Run::spawn(command)
    };

    // Mode 0660 keeps out users outside the socket's group.
    let out = as_nobody(&["status"])?.finish().await?;
    out.expect_code(69)?;

    std::fs::set_permissions(agent.socket(), std::fs::Permissions::from_mode(0o666))?;
    let k = key("other-user");
    let mut theirs = as_nobody(&["run", "--key", &k, "--", "sh", "-c", HOLD])?;
    let ready = theirs.ready().await?;
    let record = agent.inspect_json(&k).await?;
    ensure!(record["holder"]["uid"] == nobody.uid.as_raw(), "{record}");
    ensure!(record["holder"]["user"] == "nobody", "{record}");
    ensure!(record["token"] == ready.token(), "{record}");
    theirs.end_and_expect_success().await?;

    let (ours, _) = agent.hold(&k).await?;
    let forced = as_nobody(&["run", "--key", &k, "--force", "--", "true"])?
        .finish()
        .await?;
    forced.expect_code(77)?;
    let released = as_nobody(&["release", &k])?.finish().await?;
    released.expect_code(77)?;
    ensure!(
        agent.inspect_json(&k).await?["state"] == "held",
        "the lease was broken"
    );
    ours.end_and_expect_success().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_flag_sets_the_default_lease_ttl() -> Result<()> {
    use crate::support::client::acquire;
    use runlock_protocol::{AgentMessage, ClientMessage};

    let locks = FileBackendDir::new()?;
    let agent = TestAgent::start_with(AgentOptions::with_ttl(locks.uri(), "7s")).await?;
    let mut client = crate::support::client::RawClient::connect(agent.socket()).await?;
    let welcome = client.hello().await?;
    ensure!(
        matches!(
            welcome,
            AgentMessage::Welcome {
                default_ttl_ms: 7000,
                version: 1,
                ..
            }
        ),
        "{welcome:?}"
    );
    let reply = client.call(acquire(&[&key("default-ttl")])).await?;
    ensure!(
        matches!(reply, AgentMessage::Acquired { ttl_ms: 7000, .. }),
        "{reply:?}"
    );
    let mut own = acquire(&[&key("own-ttl")]);
    if let ClientMessage::Acquire(req) = &mut own {
        req.ttl_ms = Some(5000);
    }
    let reply = client.call(own).await?;
    ensure!(
        matches!(reply, AgentMessage::Acquired { ttl_ms: 5000, .. }),
        "{reply:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_is_prompt_even_with_a_peer_that_never_said_hello() -> Result<()> {
    let mut agent = TestAgent::start_on(Backend::File).await?;
    let mut shim_like = agent.client().await?;
    let _silent = crate::support::client::RawClient::connect(agent.socket()).await?;
    // Make sure the silent connection has been accepted before the stop.
    let mut probe = agent.client().await?;
    probe.call(runlock_protocol::ClientMessage::Ping).await?;

    let started = std::time::Instant::now();
    let status = agent.stop().await?;
    let took = started.elapsed();
    ensure!(status.success(), "runlockd exited with {status:?}");
    ensure!(
        matches!(
            shim_like.next_event().await?,
            runlock_protocol::AgentMessage::Restarting
        ),
        "a connected client was not told the agent is restarting"
    );
    ensure!(
        took < std::time::Duration::from_secs(2),
        "stopping took {took:?}: a connection still in its handshake held up the drain\n{}",
        agent.log()
    );
    Ok(())
}

/// Starts an agent with `env`, runs a locked command through it, stops it and
/// returns its text log.
async fn text_log_with(env: &[(&str, &str)]) -> Result<String> {
    let locks = FileBackendDir::new()?;
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut agent = TestAgent::start_with_env(AgentOptions::new(locks.uri()), &env).await?;
    agent.run_to_success(&key("text-logs")).await?;
    agent.stop().await?;
    Ok(agent.log())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_under_systemd_have_no_colours_or_timestamps() -> Result<()> {
    for var in ["JOURNAL_STREAM", "INVOCATION_ID"] {
        let log = text_log_with(&[(var, "8:123456")]).await?;
        ensure!(
            log.lines().count() >= 3,
            "too little logged with {var}:\n{log}"
        );
        ensure!(!log.contains('\x1b'), "ANSI escapes with {var}:\n{log}");
        // Without a timestamp each line opens with its level.
        for line in log.lines() {
            ensure!(
                ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"]
                    .iter()
                    .any(|level| line.trim_start().starts_with(level)),
                "a line with {var} does not open with its level: {line:?}\n{log}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_elsewhere_keep_their_timestamps() -> Result<()> {
    let log = text_log_with(&[]).await?;
    ensure!(!log.contains('\x1b'), "ANSI escapes in a log file:\n{log}");
    // RFC 3339, as in 2026-11-30T06:35:59.123456Z.
    let stamped = |line: &str| {
        let b = line.as_bytes();
        b.len() > 20 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[10] == b'T'
    };
    ensure!(
        log.lines().all(stamped),
        "a line without a timestamp:\n{log}"
    );
    Ok(())
}
