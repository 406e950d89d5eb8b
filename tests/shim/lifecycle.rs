//! A run's life through one agent: contention, waiting, fencing tokens, exit
//! statuses, signals, several keys, force and release, on `file://` and `memory://`.

use crate::support::agent::{Backend, HeldWithAWaiter};
use crate::support::journal::Journal;
use crate::support::run::HOLD;
use crate::support::{host_name, key, user_name, Deadline, Run, TestAgent};
use anyhow::{ensure, Context, Result};
use nix::sys::signal::Signal;
use runlock_shim::exit as shim_exit;
use std::time::Duration;

test_matrix!(
    [file: Backend::File, memory: Backend::Memory];
    held_key_makes_a_second_run_exit_75_naming_the_holder,
    waiting_run_acquires_once_the_holder_ends,
    wait_that_runs_out_exits_75,
    tokens_strictly_increase_across_runs,
    exit_status_passes_through_and_the_key_is_free_at_once,
    signals_to_the_shim_reach_the_command,
    opposite_key_orders_neither_deadlock_nor_overlap,
    force_stops_the_holder_with_76_and_a_larger_token,
    release_breaks_a_run_with_76_and_status_lists_leases,
    waiters_are_served_in_arrival_order,
    an_interrupted_waiter_gives_back_the_keys_it_took,
    a_run_that_cannot_take_every_key_takes_none,
    force_and_break_send_lost_events_to_the_holder,
);

test_matrix!(
    [file: Backend::File, memory: Backend::Memory, memory_cas: Backend::MemoryCas];
    history_lists_grants_forces_releases_and_breaks_in_order,
);

/// The value of a `name: value` line in the shim's description of a holder.
fn holder_field<'a>(stderr: &'a str, name: &str) -> Option<&'a str> {
    stderr
        .lines()
        .filter_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
        .next()
}

/// The tokens a child printed as `WORD TOKEN...` on the line starting with `word`.
fn printed_tokens(stdout: &str, word: &str) -> Result<Vec<u64>> {
    let line = stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(word))
        .with_context(|| format!("no {word:?} line in {stdout:?}"))?;
    line.split_whitespace()
        .skip(1)
        .map(|t| t.parse().with_context(|| format!("bad token in {line:?}")))
        .collect()
}

async fn held_key_makes_a_second_run_exit_75_naming_the_holder(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("contention");
    let mut holder = agent.run(&[&k], &[], &format!("{HOLD} # the-first-run"))?;
    let ready = holder.ready().await?;

    let second = agent.run_refused(&[&k], &[], 75).await?;
    let field = |name| holder_field(&second.stderr, name).unwrap_or_default();
    ensure!(field("host") == host_name()?, "holder host: {second:?}");
    ensure!(
        field("pid") == holder.pid()?.to_string(),
        "holder pid: {second:?}"
    );
    ensure!(
        field("user").starts_with(&user_name()),
        "holder user: {second:?}"
    );
    ensure!(
        field("command").contains("the-first-run"),
        "holder command: {second:?}"
    );
    ensure!(
        field("token") == ready.token().to_string(),
        "holder token: {second:?}"
    );

    holder.end_and_expect_success().await
}

/// Fails, saying `what`, unless the runs wrote exactly `want` to `journal`.
fn journal_reads(journal: &std::path::Path, want: &str, what: &str) -> Result<()> {
    let order = std::fs::read_to_string(journal)?;
    ensure!(order == want, "{what}: {order:?}");
    Ok(())
}

async fn waiting_run_acquires_once_the_holder_ends(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let journal = agent.dir().join("journal");
    let j = journal.display();
    // The waiter also takes `first`, which sorts before `k` (see `run_waiting_for`).
    let (first, k) = (key("wait-a"), key("wait-b"));
    let mut holder = agent.run(
        &[&k],
        &[],
        &format!("echo ready $$ $RUNLOCK_TOKEN; read _line; echo holder-end >> {j}"),
    )?;
    let ready = holder.ready().await?;
    let mut client = agent.client().await?;
    let script = format!("echo waiter-start >> {j}; echo ran $RUNLOCK_TOKEN");
    let waiter = agent
        .run_waiting_for(&mut client, &k, &first, &script)
        .await?;
    ensure!(!journal.exists(), "the waiter ran while the key was held");

    holder.end_and_expect_success().await?;
    let waited = waiter.finish().await?;
    waited.expect_code(0)?;
    let tokens = printed_tokens(&waited.stdout, "ran")?;
    ensure!(tokens.len() == 2, "one token per key, sorted: {waited:?}");
    ensure!(
        tokens[1] > ready.token(),
        "token of {k} did not grow: {waited:?}"
    );
    journal_reads(&journal, "holder-end\nwaiter-start\n", "runs overlapped")
}

async fn waiters_are_served_in_arrival_order(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let mut client = agent.client().await?;
    let journal = agent.dir().join("journal");
    let k = key("fifo-k");
    let (holder, _) = agent.hold(&k).await?;
    let mut waiters = Vec::new();
    for n in 1..=3 {
        let first = key(&format!("fifo-a{n}"));
        let script = format!("echo waiter-{n} >> {}", journal.display());
        waiters.push(
            agent
                .run_waiting_for(&mut client, &k, &first, &script)
                .await?,
        );
    }
    holder.end_and_expect_success().await?;
    for waiter in waiters {
        waiter.finish().await?.expect_code(0)?;
    }
    journal_reads(
        &journal,
        "waiter-1\nwaiter-2\nwaiter-3\n",
        "served out of order",
    )
}

async fn an_interrupted_waiter_gives_back_the_keys_it_took(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let mut client = agent.client().await?;
    let HeldWithAWaiter {
        first,
        k,
        holder,
        waiter,
    } = agent.held_with_a_waiter(&mut client, "interrupted").await?;

    waiter.signal(Signal::SIGTERM)?;
    let out = waiter.finish().await?;
    out.expect_code(i32::from(shim_exit::for_signal(Signal::SIGTERM as i32)))?;
    ensure!(!out.stdout.contains("must-not-run"), "{out:?}");
    // All or nothing: the key it held while it waited is free again.
    let deadline = Deadline::new(Duration::from_secs(5), format!("{first} to be free"));
    while client.is_held(&first).await? {
        deadline.tick().await?;
    }
    ensure!(client.is_held(&k).await?, "the holder lost {k}");
    holder.end_and_expect_success().await
}

async fn a_run_that_cannot_take_every_key_takes_none(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let mut client = agent.client().await?;
    let (a, b, c) = (key("partial-a"), key("partial-b"), key("partial-c"));
    let (holder, _) = agent.hold(&b).await?;
    for wait in ["0s", "300ms"] {
        agent
            .run_refused(&[&c, &b, &a], &["--wait", wait], 75)
            .await?;
        // `a` was taken before `b` was found held; it is given back before the reply.
        ensure!(
            !client.is_held(&a).await?,
            "--wait {wait}: {a} is still held"
        );
        ensure!(!client.is_held(&c).await?, "--wait {wait}: {c} was taken");
    }
    holder.end_and_expect_success().await
}

async fn wait_that_runs_out_exits_75(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("wait-runs-out");
    let (holder, _) = agent.hold(&k).await?;

    let late = agent.run_refused(&[&k], &["--wait", "300ms"], 75).await?;
    ensure!(
        late.elapsed >= Duration::from_millis(300),
        "gave up early: {late:?}"
    );
    ensure!(
        holder_field(&late.stderr, "pid") == Some(&holder.pid()?.to_string()),
        "the holder is not named: {late:?}"
    );

    holder.end_and_expect_success().await
}

async fn tokens_strictly_increase_across_runs(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("tokens");
    let mut last = 0;
    for _ in 0..4 {
        let out = agent
            .run(&[&k], &[], "echo token $RUNLOCK_TOKEN")?
            .finish()
            .await?;
        out.expect_code(0)?;
        let token = printed_tokens(&out.stdout, "token")?;
        ensure!(
            token.len() == 1 && token[0] > last,
            "token {token:?} after {last}"
        );
        last = token[0];
    }
    Ok(())
}

async fn exit_status_passes_through_and_the_key_is_free_at_once(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("exit-status");
    // Each run starts right after the last one exited: the key must already be free.
    for (script, want) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("exit 255", 255),
        ("kill -TERM $$", 143),
        ("kill -KILL $$", 137),
        (
            "kill -USR1 $$",
            i32::from(shim_exit::for_signal(Signal::SIGUSR1 as i32)),
        ),
    ] {
        let out = agent.run(&[&k], &[], script)?.finish().await?;
        out.expect_code(want)
            .with_context(|| format!("running {script:?}"))?;
    }

    let missing = agent
        .runlock_output(&[
            "run",
            "--key",
            &k,
            "--",
            "/nonexistent/runlock-test-command",
        ])
        .await?;
    missing.expect_code(127)?;
    let not_executable = agent.dir().join("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n")?;
    let denied = agent
        .runlock_output(&[
            "run",
            "--key",
            &k,
            "--",
            &not_executable.display().to_string(),
        ])
        .await?;
    denied.expect_code(126)?;

    // A command that could not start leaves the key free at once too: the
    // runs above and this one start right after it, without --wait.
    let after = agent.run(&[&k], &[], "exit 0")?.finish().await?;
    after.expect_code(0)?;
    Ok(())
}

async fn signals_to_the_shim_reach_the_command(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("signals");
    let script = "trap 'echo got USR1' USR1; trap 'echo got USR2' USR2; trap 'echo got HUP' HUP; \
                  trap 'echo got INT' INT; trap 'echo got TERM; exit 7' TERM; \
                  echo ready $$ $RUNLOCK_TOKEN; \
                  i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; echo no-signal";
    let mut run = agent.run(&[&k], &[], script)?;
    run.ready().await?;
    for (signal, line) in [
        (Signal::SIGUSR1, "got USR1"),
        (Signal::SIGUSR2, "got USR2"),
        (Signal::SIGHUP, "got HUP"),
        (Signal::SIGINT, "got INT"),
    ] {
        run.signal(signal)?;
        run.expect_line(line).await?;
    }
    run.signal(Signal::SIGTERM)?;
    run.expect_line("got TERM").await?;
    let out = run.finish().await?;
    out.expect_code(7)?;
    ensure!(!out.stdout.contains("no-signal"), "{out:?}");
    Ok(())
}

async fn opposite_key_orders_neither_deadlock_nor_overlap(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let journal = Journal::new(agent.dir());
    let (a, b) = (key("multi-a"), key("multi-b"));
    let runs = (0..8)
        .map(|id| {
            let keys: [&str; 2] = if id % 2 == 0 { [&a, &b] } else { [&b, &a] };
            agent.run(&keys, &["--wait", "30s"], &journal.script(id))
        })
        .collect::<Result<Vec<_>>>()?;
    for run in runs {
        run.finish().await?.expect_code(0)?;
    }
    journal.assert_serial(8)
}

async fn force_stops_the_holder_with_76_and_a_larger_token(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("force");
    let (holder, ready) = agent.hold(&k).await?;

    let forced = agent
        .run(&[&k], &["--force"], "echo token $RUNLOCK_TOKEN")?
        .finish()
        .await?;
    forced.expect_code(0)?;
    let new_token = printed_tokens(&forced.stdout, "token")?;

    let old = holder.finish().await?;
    old.expect_stopped()?;
    ensure!(
        old.stderr.contains("lost"),
        "the shim does not say why: {old:?}"
    );
    ensure!(
        new_token == [ready.token() + 1],
        "token {new_token:?} after {}",
        ready.token()
    );
    Ok(())
}

async fn release_breaks_a_run_with_76_and_status_lists_leases(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("release");
    let (holder, ready) = agent.run_attached(&[&k], HOLD).await?;

    let status = agent.runlock_output(&["status", "--json"]).await?;
    status.expect_code(0)?;
    let leases: serde_json::Value = serde_json::from_str(status.stdout.trim())?;
    let leases = leases.as_array().context("status --json is not an array")?;
    ensure!(leases.len() == 1, "{status:?}");
    let lease = &leases[0];
    ensure!(lease["key"] == k.as_str(), "{status:?}");
    ensure!(lease["token"] == ready.token(), "{status:?}");
    ensure!(lease["child_pid"] == ready.pid, "{status:?}");
    ensure!(
        lease["lease_id"].as_str().is_some_and(|id| !id.is_empty()),
        "{status:?}"
    );
    ensure!(lease["holder"]["pid"] == holder.pid()?, "{status:?}");
    ensure!(
        lease["holder"]["host"] == host_name()?.as_str(),
        "{status:?}"
    );

    agent
        .runlock_output(&["release", &k])
        .await?
        .expect_code(0)?;
    let broken = holder.finish().await?;
    broken.expect_stopped()?;

    let status = agent.runlock_output(&["status", "--json"]).await?;
    status.expect_code(0)?;
    ensure!(status.stdout.trim() == "[]", "{status:?}");
    let again = agent.run(&[&k], &[], "exit 0")?.finish().await?;
    again.expect_code(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_reach_the_command_newline_joined_in_sorted_order() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let script = r#"printf '%s\n--\n' "$RUNLOCK_KEY" "$RUNLOCK_TOKEN" "$RUNLOCK_LEASE_ID""#;
    let out = agent
        .run(&["env-c", "env-a", "env-b", "env-a"], &[], script)?
        .finish()
        .await?;
    out.expect_code(0)?;
    let parts: Vec<&str> = out.stdout.split("\n--\n").collect();
    ensure!(parts.len() == 4, "{out:?}");
    ensure!(parts[0] == "env-a\nenv-b\nenv-c", "RUNLOCK_KEY: {out:?}");
    ensure!(parts[1] == "1\n1\n1", "RUNLOCK_TOKEN: {out:?}");
    let ids: Vec<&str> = parts[2].lines().collect();
    ensure!(
        ids.len() == 3 && ids.iter().all(|id| !id.is_empty()),
        "RUNLOCK_LEASE_ID: {out:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_ignore_lets_the_command_finish_but_exits_76() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let k = key("on-lost-ignore");
    let mut holder = agent.run(&[&k], &["--on-lost", "ignore"], HOLD)?;
    holder.ready().await?;
    let forced = agent.run(&[&k], &["--force"], "echo forced")?;
    let told = Deadline::new(crate::support::WAIT, "the holder to be told of the force");
    while !holder.stderr_so_far().contains("lost the lock") {
        told.tick().await?;
    }
    // The command goes on: it still reads its input and says goodbye.
    holder.end();
    holder.expect_line("bye").await?;
    let old = holder.finish().await?;
    old.expect_code(76)?;
    // The forced run waited for it to end (not for the deadline: 33 s here).
    let forced = forced.finish().await?;
    forced.expect_output("forced\n")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_agent_on_the_socket_exits_69() -> Result<()> {
    let dir = crate::support::agent::temp_dir()?;
    let socket = dir.path().join("nobody.sock");
    let runlock = &crate::support::bins::bins()?.runlock;
    let socket_arg = socket.display().to_string();
    for args in [
        vec!["run", "--socket", &socket_arg, "--key", "k", "--", "true"],
        vec!["--socket", &socket_arg, "status"],
        vec!["--socket", &socket_arg, "inspect", "k", "--json"],
        vec!["--socket", &socket_arg, "release", "k"],
    ] {
        let mut command = tokio::process::Command::new(runlock);
        command.args(&args);
        let out = crate::support::Run::spawn(command)?.finish().await?;
        out.expect_code(69)
            .with_context(|| format!("runlock {args:?}"))?;
        ensure!(
            out.stderr.contains(&socket_arg),
            "the socket is not named: {out:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shim_finds_the_agent_through_runlock_socket() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let mut command = tokio::process::Command::new(&crate::support::bins::bins()?.runlock);
    command.env("RUNLOCK_SOCKET", agent.socket()).args([
        "run",
        "--key",
        "via-env",
        "--",
        "sh",
        "-c",
        "echo $RUNLOCK_KEY",
    ]);
    let out = Run::spawn(command)?.finish().await?;
    out.expect_output("via-env\n")?;
    Ok(())
}

async fn force_and_break_send_lost_events_to_the_holder(backend: Backend) -> Result<()> {
    use crate::support::client::{acquire, break_lease, release};
    use runlock_protocol::{AgentMessage, ClientMessage, LostReason};

    let agent = TestAgent::start_on(backend).await?;
    let k = key("lost-events");
    let mut holder = agent.client().await?;
    let AgentMessage::Acquired { leases, .. } = holder.call(acquire(&[&k])).await? else {
        anyhow::bail!("the holder could not acquire");
    };
    let old = leases[0].clone();

    let mut forcer = agent.client().await?;
    let mut force = acquire(&[&k]);
    if let ClientMessage::Acquire(req) = &mut force {
        req.force = true;
    }
    let forced = forcer.send(force).await?;
    let new_token = match holder.next_event().await? {
        AgentMessage::Lost {
            lease_id,
            key: lost_key,
            reason: LostReason::Forced,
            holder: Some(h),
            ..
        } => {
            ensure!(
                lease_id == old.lease_id && lost_key == k,
                "{lease_id} {lost_key}"
            );
            ensure!(h.token > old.token && h.pid == std::process::id(), "{h:?}");
            h.token
        }
        other => anyhow::bail!("expected lost{{forced}}, got {other:?}"),
    };
    // The lost lease is no longer the holder's to release.
    let reply = holder.call(release(vec![old.lease_id.clone()])).await?;
    ensure!(matches!(reply, AgentMessage::Error(_)), "{reply:?}");
    // The forced run is answered once the run it displaced has stopped: the
    // holder's connection is its run.
    drop(holder);
    let AgentMessage::Acquired { leases, .. } = forcer.reply(forced).await? else {
        anyhow::bail!("force failed");
    };
    let new = leases[0].clone();
    ensure!(
        new.token == new_token,
        "{new:?}, the holder was told {new_token}"
    );
    match forcer.forcing.as_slice() {
        [AgentMessage::Forcing {
            holder: Some(h),
            wait_ms,
            ..
        }] => ensure!(
            // file:// waits for the run's own lock, with no deadline.
            h.token == old.token && *wait_ms != Some(0),
            "{h:?} {wait_ms:?}"
        ),
        other => anyhow::bail!("expected one forcing event, got {other:?}"),
    }

    let mut breaker = agent.client().await?;
    let breaking = breaker.send(break_lease(&k)).await?;
    match forcer.next_event().await? {
        AgentMessage::Lost {
            lease_id,
            reason: LostReason::Broken,
            ..
        } => ensure!(lease_id == new.lease_id, "{lease_id}"),
        other => anyhow::bail!("expected lost{{broken}}, got {other:?}"),
    }
    // The break, too, is answered once the run it broke has stopped.
    drop(forcer);
    let reply = breaker.reply(breaking).await?;
    ensure!(reply == AgentMessage::Released { count: 1 }, "{reply:?}");
    match breaker.forcing.as_slice() {
        [AgentMessage::Forcing {
            holder: Some(h), ..
        }] => ensure!(h.token == new.token, "{h:?}"),
        other => anyhow::bail!("expected one forcing event, got {other:?}"),
    }
    let reply = breaker.call(break_lease(&k)).await?;
    ensure!(
        reply == AgentMessage::Released { count: 0 },
        "a free key: {reply:?}"
    );
    Ok(())
}

async fn history_lists_grants_forces_releases_and_breaks_in_order(backend: Backend) -> Result<()> {
    let agent = TestAgent::start_on(backend).await?;
    let k = key("history");
    let (t1, t2) = agent.held_then_forced_through(&agent, &k).await?;
    let mut broken = agent.run(&[&k], &[], HOLD)?;
    let t3 = broken.ready().await?.token();
    agent
        .runlock_output(&["release", &k])
        .await?
        .expect_code(0)?;
    broken.finish().await?.expect_code(76)?;

    let events = agent.history_json(&k).await?;
    let got: Vec<(&str, u64, Option<u64>)> = events
        .iter()
        .map(|e| {
            let kind = e["kind"].as_str().unwrap_or("?");
            (
                kind,
                e["token"].as_u64().unwrap_or(0),
                e["from_token"].as_u64(),
            )
        })
        .collect();
    // A break takes the key over with a token of its own, then frees it.
    let t4 = got.last().map_or(0, |e| e.1);
    ensure!(t4 > t3, "{got:?}");
    let want = [
        ("granted", t1, None),
        ("forced", t2, Some(t1)),
        ("released", t2, None),
        ("granted", t3, None),
        ("broken", t4, Some(t3)),
    ];
    ensure!(got == want, "{got:?}, not {want:?}");
    let host = host_name()?;
    for e in &events {
        ensure!(
            e["host"] == host.as_str() && e["user"] == user_name().as_str(),
            "{e}"
        );
    }

    // --limit keeps the latest; the people's form names each event.
    let out = agent
        .runlock_output(&["history", &k, "--limit", "2"])
        .await?;
    out.expect_code(0)?;
    let lines: Vec<&str> = out.stdout.lines().collect();
    ensure!(lines.len() == 2, "{out:?}");
    ensure!(lines[0].contains(&format!("granted token {t3}")), "{out:?}");
    ensure!(lines[1].contains(&format!("broken: token {t3}")), "{out:?}");
    // A held key's refusal and its record name the last incident.
    let (holder, _) = agent.hold(&k).await?;
    let refused = agent.run(&[&k], &[], "exit 0")?.finish().await?;
    refused.expect_code(75)?;
    ensure!(refused.stderr.contains("last broken by"), "{refused:?}");
    let record = agent.inspect_json(&k).await?;
    ensure!(record["incident"]["kind"] == "broken", "{record}");
    holder.end_and_expect_success().await?;
    Ok(())
}
