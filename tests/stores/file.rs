//! The `file://` backend through real agents: tokens that survive restarts,
//! agents sharing one lock directory, and the agent's socket file.

use crate::support::agent::FileBackendDir;
use crate::support::client::{self, RawClient};
use crate::support::journal::Journal;
use crate::support::run::HOLD;
use crate::support::{host_name, key, user_name, AgentOptions, Deadline, TestAgent, WAIT};
use anyhow::{bail, ensure, Context, Result};
use runlock_protocol::AgentMessage;
use std::os::fd::AsRawFd;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_growing_across_agent_restarts_and_kills() -> Result<()> {
    let locks = FileBackendDir::new()?;
    let k = key("restart");
    let mut agent = TestAgent::start(locks.uri()).await?;
    let first = agent.token_of_a_run(&k).await?;
    let second = agent.token_of_a_run(&k).await?;
    ensure!(second > first, "{second} after {first}");
    let status = agent.stop().await?;
    ensure!(status.success(), "runlockd exited with {status:?}");

    let mut agent = TestAgent::start(locks.uri()).await?;
    let third = agent.token_of_a_run(&k).await?;
    ensure!(third > second, "{third} after {second}, across a restart");

    // An agent killed while a run holds the key: the run goes on, its record
    // still says held, and it ends as it ends (no agent to release to).
    let mut run = agent.run(&[&k], &[], HOLD)?;
    let fourth = run.ready().await?.token();
    ensure!(fourth > third, "{fourth} after {third}");
    agent.kill().await?;
    run.end_and_expect_success().await?;

    let agent = TestAgent::start(locks.uri()).await?;
    let fifth = agent.token_of_a_run(&k).await?;
    ensure!(fifth > fourth, "{fifth} after {fourth}, across a SIGKILL");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_on_one_directory_exclude_each_other() -> Result<()> {
    let (_locks, a, b) = FileBackendDir::with_two_agents().await?;
    let a_id = a.agent_id().await?;
    let k = key("shared-dir");
    let mut holder = a.run(&[&k], &[], &format!("{HOLD} # held-through-a"))?;
    let ready = holder.ready().await?;
    let holder_pid = holder.pid()?;

    let refused = b.run_refused(&[&k], &[], 75).await?;
    refused.expect_stderr_has(&[
        &holder_pid.to_string(),
        "held-through-a",
        &host_name()?,
        &ready.token().to_string(),
    ])?;

    let record = b.inspect_json(&k).await?;
    ensure!(record["key"] == k.as_str(), "{record}");
    ensure!(record["state"] == "held", "{record}");
    ensure!(record["token"] == ready.token(), "{record}");
    ensure!(record["scope"] == "host", "{record}");
    // A kernel lock does not expire: SPEC.md 7.4 leaves expires_in_ms out.
    ensure!(record["expires_in_ms"].is_null(), "{record}");
    let holder_record = &record["holder"];
    ensure!(holder_record["host"] == host_name()?.as_str(), "{record}");
    ensure!(holder_record["agent_id"] == a_id.as_str(), "{record}");
    ensure!(holder_record["pid"] == holder_pid, "{record}");
    ensure!(
        holder_record["uid"] == nix::unistd::geteuid().as_raw(),
        "{record}"
    );
    ensure!(holder_record["user"] == user_name().as_str(), "{record}");
    ensure!(
        holder_record["command"]
            .as_str()
            .is_some_and(|c| c.contains("held-through-a")),
        "{record}"
    );
    let acquired_at = holder_record["acquired_at"].as_str().unwrap_or_default();
    ensure!(
        acquired_at.len() >= 20 && acquired_at.contains('T') && acquired_at.ends_with('Z'),
        "acquired_at is not RFC 3339: {record}"
    );

    holder.end_and_expect_success().await?;
    let record = b.inspect_json(&k).await?;
    ensure!(
        record["state"] == "free" && record["holder"].is_null(),
        "{record}"
    );
    let token = b.token_of_a_run(&k).await?;
    ensure!(token > ready.token(), "{token} after {}", ready.token());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_through_two_agents_in_opposite_key_orders_never_overlap() -> Result<()> {
    let (_locks, a, b) = FileBackendDir::with_two_agents().await?;
    let journal = Journal::new(a.dir());
    let (x, y) = (key("two-agents-x"), key("two-agents-y"));
    let runs = (0..6)
        .map(|id| {
            let (agent, keys): (&TestAgent, [&str; 2]) = match id % 3 {
                0 => (&a, [&x, &y]),
                1 => (&b, [&y, &x]),
                _ => (&b, [&x, &y]),
            };
            agent.run(&keys, &["--wait", "30s"], &journal.script(id))
        })
        .collect::<Result<Vec<_>>>()?;
    for run in runs {
        run.finish().await?.expect_code(0)?;
    }
    journal.assert_serial(6)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_through_another_agent_stops_the_run_at_its_next_renewal() -> Result<()> {
    let locks = FileBackendDir::new()?;
    // A TTL of 3 s renews (and so notices the break) about every second.
    let a = TestAgent::start_with(AgentOptions::with_ttl(locks.uri(), "3s")).await?;
    let b = TestAgent::start(locks.uri()).await?;
    let k = key("break-across-agents");
    let (run, ready) = a.hold(&k).await?;

    let released = b.runlock_output(&["release", &k]).await?;
    released.expect_code(0)?;
    let broken = run.finish().await?;
    broken.expect_stopped()?;
    ensure!(
        broken.elapsed < Duration::from_secs(10),
        "the break was noticed late: {broken:?}"
    );
    let token = a.token_of_a_run(&k).await?;
    ensure!(
        token > ready.token() + 1,
        "{token}: the break's own token was reused"
    );
    Ok(())
}

/// A key's `KEY.run` removed while its run holds it (a cleanup job ageing
/// the directory): a run through another agent makes and locks a new one,
/// yet is refused as held, naming the run; that run's agent sees its file
/// gone at its next renewal and stops it (76); then the key is free, above
/// its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_file_removed_under_a_live_run_is_never_granted_beside_it() -> Result<()> {
    let locks = FileBackendDir::new()?;
    // A TTL of 3 s renews (and so notices) about every second.
    let a = TestAgent::start_with(AgentOptions::with_ttl(locks.uri(), "3s")).await?;
    let b = TestAgent::start(locks.uri()).await?;
    let k = key("run-file-removed");
    let (holder, ready) = a.hold(&k).await?;
    let run_file = std::fs::read_dir(locks.path())?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()?
        .into_iter()
        .find(|path| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            name.contains("run-file-removed") && name.ends_with(".run")
        })
        .context("the key's run file")?;
    std::fs::remove_file(&run_file)?;

    let refused = b.run_refused(&[&k], &[], 75).await?;
    ensure!(
        refused.stderr.contains(&holder.pid()?.to_string()),
        "the live run is not named: {refused:?}"
    );
    let lost = holder.finish().await?;
    lost.expect_stopped()?;
    // Its own record names it still: nobody took the key over.
    ensure!(
        lost.stderr.contains("no longer held") && !lost.stderr.contains("taken over"),
        "the loss is not said as it is: {lost:?}"
    );
    let token = b.token_of_a_run(&k).await?;
    ensure!(token > ready.token(), "{token} after {}", ready.token());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_error_names_a_holder_on_another_agent_even_behind_a_local_waiter() -> Result<()> {
    let (_locks, a, b) = FileBackendDir::with_two_agents().await?;
    let (first, k) = (key("behind-waiter-a"), key("behind-waiter-b"));
    let (holder, ready) = a.hold(&k).await?;
    let mut client = b.client().await?;
    let waiter = b
        .run_waiting_for(&mut client, &k, &first, "echo waiter-ran")
        .await?;

    // SPEC.md 9: `held` and `timeout` always carry the holder, so the shim can name it.
    for wait in ["300ms", "0s"] {
        let out = b.run_refused(&[&k], &["--wait", wait], 75).await?;
        ensure!(
            out.stderr.contains(&holder.pid()?.to_string())
                && out.stderr.contains(&format!("token:   {}", ready.token())),
            "--wait {wait}: the holder through agent A is not named: {out:?}"
        );
    }
    holder.end_and_expect_success().await?;
    let out = waiter.finish().await?;
    out.expect_code(0)?;
    out.expect_stdout_has(&["waiter-ran"])?;
    Ok(())
}

/// A run lets go of its kernel lock before its release reaches the agent
/// (the shim does so at its end). A run waiting through the same agent in
/// between finds the key free in the directory, yet waits for that
/// release: the key is not taken from its holder, whose end the history
/// records as released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_let_go_of_its_lock_keeps_its_key_until_its_release_arrives() -> Result<()> {
    let locks = FileBackendDir::new()?;
    let agent = TestAgent::start(locks.uri()).await?;
    let k = key("let-go");
    let mut holder = RawClient::connect(agent.socket()).await?;
    holder.hello_taking_locks().await?;
    let lease = match holder.call(client::acquire(&[&k])).await? {
        AgentMessage::Acquired { mut leases, .. } => leases.remove(0),
        other => bail!("expected acquired, got {other:?}"),
    };
    // As the shim's end does: LOCK_UN, which the agent's copy shares.
    for lock in holder.take_locks(1)? {
        // SAFETY: the descriptor is open and ours.
        let unlocked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_UN) };
        ensure!(
            unlocked == 0,
            "LOCK_UN: {}",
            std::io::Error::last_os_error()
        );
    }

    let waiter = agent.run(&[&k], &["--wait", "60s"], "echo waiter-ran")?;
    // Listed as a waiter only once a try has found the key held.
    let deadline = Deadline::new(WAIT, "the run listed as waiting");
    loop {
        let out = agent
            .runlock_output(&["list", "--all", "--json", &k])
            .await?;
        out.expect_code(0)?;
        let listing: serde_json::Value = serde_json::from_str(out.stdout.trim())?;
        let key = listing["keys"].as_array().and_then(|keys| keys.first());
        if key.is_some_and(|key| key["waiters"].as_array().is_some_and(|w| !w.is_empty())) {
            break;
        }
        deadline.tick().await?;
    }
    let released = holder
        .call(client::release(vec![lease.lease_id.clone()]))
        .await?;
    ensure!(
        matches!(released, AgentMessage::Released { count: 1 }),
        "the holder's release found its lease gone: {released:?}"
    );
    let out = waiter.finish().await?;
    out.expect_code(0)?;
    out.expect_stdout_has(&["waiter-ran"])?;
    let events = serde_json::Value::from(agent.history_json(&k).await?);
    let ended = (events.as_array().into_iter().flatten())
        .find(|e| e["token"] == lease.token && e["kind"] != "granted");
    ensure!(
        ended.is_some_and(|e| e["kind"] == "released" && e["reason"] == ""),
        "{events}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_directory_that_is_gone_makes_runs_exit_69() -> Result<()> {
    let locks = FileBackendDir::new()?;
    let agent = TestAgent::start(locks.uri()).await?;
    let dir = locks.path();
    std::fs::remove_dir_all(&dir)?;
    let k = key("gone-directory");
    agent.run_refused(&[&k], &[], 69).await?;
    // The agent keeps serving: once the directory is back, runs go on.
    std::fs::create_dir_all(&dir)?;
    agent.run_to_success(&k).await
}

/// With `--wait`, a store that cannot be reached is waited out like a holder:
/// the run starts once the store is back, or exits 69 when the wait ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_rides_out_an_unreachable_store_until_its_wait_ends() -> Result<()> {
    let locks = FileBackendDir::new()?;
    // Debug logs show each request as it arrives: the event the test waits for.
    let debug = [("RUST_LOG".to_string(), "debug".to_string())];
    let agent = TestAgent::start_with_env(AgentOptions::new(locks.uri()), &debug).await?;
    let dir = locks.path();
    std::fs::remove_dir_all(&dir)?;
    let k = key("unreachable-store");
    agent.run_refused(&[&k], &["--wait", "300ms"], 69).await?;
    let mut waiting = agent.run(&[&k], &["--wait", "30s"], "echo ready $$ $RUNLOCK_TOKEN")?;
    // Once its acquire has reached the agent, bring the directory back: it starts.
    let asked = |log: &str| log.matches("wait_ms: 30000").count() == 1;
    let deadline = Deadline::new(
        Duration::from_secs(10),
        "the waiting run's acquire in the log",
    );
    while !asked(&agent.log()) {
        deadline.tick().await?;
    }
    std::fs::create_dir_all(&dir)?;
    waiting.ready().await?;
    waiting.finish().await?.expect_code(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusual_keys_lock_and_stay_distinct() -> Result<()> {
    let agent = TestAgent::start_on(crate::support::agent::Backend::File).await?;
    let long_a = "é".repeat(200);
    let long_b = "é".repeat(199) + "e";
    let longest = "k".repeat(512);
    let held = [
        "a/b",
        "../escape",
        ".hidden",
        "with space",
        "dev:tap-x-to-target-y",
        "ünïcödé",
        long_a.as_str(),
        longest.as_str(),
    ];
    // Keys that escape or hash to names near those of `held`.
    let free = [
        "a%2Fb",
        "%2E%2E%2Fescape",
        "hidden",
        long_b.as_str(),
        "DEV:tap-x-to-target-y",
    ];
    let mut holder = agent.run(&held, &[], HOLD)?;
    let ready = holder.ready().await?;
    ensure!(ready.tokens == vec![1; held.len()], "{ready:?}");
    for k in held {
        let out = agent.run(&[k], &[], "exit 0")?.finish().await?;
        out.expect_code(75).with_context(|| format!("key {k:?}"))?;
    }
    for k in free {
        let out = agent.run(&[k], &[], "exit 0")?.finish().await?;
        out.expect_code(0).with_context(|| format!("key {k:?}"))?;
    }
    holder.end_and_expect_success().await?;
    // Nothing escaped the lock directory.
    ensure!(
        !agent.dir().join("escape.lock").exists()
            && !std::path::Path::new("/tmp/escape.lock").exists()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_larger_than_the_pre_hello_limit_goes_right_behind_hello() -> Result<()> {
    let locks = FileBackendDir::new()?;
    let agent = TestAgent::start(locks.uri()).await?;
    // 60 keys of 120 bytes: an acquire of over 7 KiB, where frames before the
    // agent's welcome may hold 4 KiB; the shim sends it before the welcome.
    let keys: Vec<String> = (0..60).map(|i| key(&format!("{i:0>110}"))).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let out = agent
        .run(&refs, &[], "echo \"$RUNLOCK_TOKEN\" | wc -l")?
        .finish()
        .await?;
    out.expect_code(0)?;
    ensure!(out.stdout.trim() == "60", "{out:?}");
    Ok(())
}
