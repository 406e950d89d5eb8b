//! The shim facing what it must not trust: text another user of the socket
//! chose is printed escaped, an agent that stops answering costs a bounded
//! wait, an agent that refuses (at its limits) never lets a run go ahead
//! unlocked, and a duration the wire cannot carry is a usage error.

use crate::support::bins::bins;
use crate::support::run::{Finished, HOLD};
use crate::support::{key, within, Deadline, Run, TestAgent, WAIT};
use crate::trust::access::{agent as group_agent, as_nobody, RUNLOCK_GROUP};
use anyhow::{ensure, Context, Result};
use futures::{SinkExt, StreamExt};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use runlock_protocol::{AgentCodec, AgentMessage, Envelope, ErrorCode, WireError};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio_util::codec::Framed;

/// A program name a terminal would obey: clear the screen, set the window
/// title, reverse the rest of the line, hide a character. No whitespace, so
/// it survives any cut of a command down to its program name.
const HOSTILE_PROGRAM: &str = "sh\x1b[2J\x1b]0;pwned\x07\u{202e}\u{200b}";
/// How the shim shows it.
const ESCAPED_PROGRAM: &str = r"sh\x1b[2J\x1b]0;pwned\x07\u{202e}\u{200b}";
/// An argument that would print a forged status row.
const FORGED_ROW: &str = "x\ntest:forged 1 1 1 root 2026-01-01T00:00:00.000Z rm -rf /";

/// The shim's bound on an agent that does not answer (its `ANSWER_TIMEOUT`).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Its bound per key on an acquire's backend work (`BACKEND_ANSWER_TIMEOUT`).
const BACKEND_ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// Fails unless `bytes` are UTF-8 with no control character but line ends,
/// and no invisible one (a bidi override or isolate, a zero-width space);
/// returns the text.
fn terminal_safe(what: &str, bytes: &[u8]) -> Result<String> {
    let text = String::from_utf8(bytes.to_vec()).with_context(|| format!("{what}: not UTF-8"))?;
    let raw = text
        .chars()
        .find(|&c| (c.is_control() && c != '\n') || runlock_protocol::is_invisible(c));
    ensure!(raw.is_none(), "{what} prints a raw {raw:?}: {text:?}");
    Ok(text)
}

/// `runlock ARGS...` as root against `agent`, with its exact bytes.
async fn output(agent: &TestAgent, args: &[&str]) -> Result<std::process::Output> {
    let mut command = agent.runlock()?;
    command.args(args).stdin(Stdio::null());
    within(WAIT, "runlock to finish", command.output())
        .await?
        .context("running runlock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_another_user_holds_reaches_roots_terminal_escaped() -> Result<()> {
    let agent = group_agent("").await?;
    let program = agent.dir().join(HOSTILE_PROGRAM);
    std::os::unix::fs::symlink("/bin/sh", &program)?;
    let program = program.to_str().context("a UTF-8 path")?.to_string();
    // No key holds a control or invisible character (bad_input::
    // shim_refuses_invalid_keys_with_64_naming_the_rule): the command does.
    let k = key("escaped-key");
    let escaped_key = "test:escaped-key";
    let args = [
        "run", "--key", &k, "--", &program, "-c", HOLD, "sh", FORGED_ROW,
    ];
    let mut theirs = as_nobody(&agent, &[RUNLOCK_GROUP], &args)?;
    let ready = theirs.ready().await?;
    agent.wait_attached(ready.pid).await?;
    let shim_pid = theirs.pid()?.to_string();

    let status = output(&agent, &["status"]).await?;
    ensure!(status.status.success(), "{status:?}");
    let text = terminal_safe("status", &status.stdout)?;
    let rows: Vec<&str> = text.lines().collect();
    ensure!(rows.len() == 2, "a header and one row: {text}");
    ensure!(
        rows[0].contains(" PID ") && rows[0].contains(" CHILD "),
        "{text}"
    );
    let fields: Vec<&str> = rows[1].split_whitespace().collect();
    ensure!(fields.first() == Some(&escaped_key), "{text}");
    // The holder's pid, as in the held message and inspect; then the command's.
    ensure!(fields.get(2) == Some(&shim_pid.as_str()), "{text}");
    ensure!(
        fields.get(3) == Some(&ready.pid.to_string().as_str()),
        "{text}"
    );
    ensure!(rows[1].contains(ESCAPED_PROGRAM), "{text}");

    let inspect = output(&agent, &["inspect", &k]).await?;
    ensure!(inspect.status.success(), "{inspect:?}");
    let text = terminal_safe("inspect", &inspect.stdout)?;
    ensure!(
        text.starts_with(&format!("key:     {escaped_key}\n")),
        "{text}"
    );
    ensure!(text.contains(&format!("\npid:     {shim_pid}\n")), "{text}");
    let command = text.lines().find(|l| l.starts_with("command: "));
    ensure!(
        command.is_some_and(|l| l.contains(ESCAPED_PROGRAM)),
        "{text}"
    );
    ensure!(
        text.lines().all(|l| l.split_once(": ").is_some()),
        "every line is one field: {text}"
    );

    let contender = output(&agent, &["run", "--key", &k, "--", "echo", "ran"]).await?;
    ensure!(contender.status.code() == Some(75), "{contender:?}");
    ensure!(contender.stdout.is_empty(), "{contender:?}");
    let held = terminal_safe("the held message", &contender.stderr)?;
    ensure!(held.contains(ESCAPED_PROGRAM), "{held}");
    ensure!(
        held.contains(&format!("\n  pid:     {shim_pid}\n")),
        "{held}"
    );

    // JSON escapes through serde_json, and a program reading it gets the truth.
    let json = output(&agent, &["status", "--json"]).await?;
    ensure!(!json.stdout.contains(&0x1b), "{json:?}");
    let leases: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    let command = leases[0]["holder"]["command"].as_str().unwrap_or_default();
    ensure!(command.contains(HOSTILE_PROGRAM), "{leases}");
    ensure!(leases[0]["child_pid"] == ready.pid, "{leases}");

    // The key's history names who took it (by the agent's own records of the
    // peer), never the command line, and prints as safely.
    let history = output(&agent, &["history", &k]).await?;
    ensure!(history.status.success(), "{history:?}");
    let text = terminal_safe("history", &history.stdout)?;
    ensure!(text.contains("granted token 1 to nobody@"), "{text}");
    ensure!(
        !text.contains("pwned") && !text.contains("forged"),
        "the history shows a command line: {text}"
    );

    // The fleet's list reads the store, and prints what it holds as safely.
    let list = output(&agent, &["list"]).await?;
    ensure!(list.status.success(), "{list:?}");
    let text = terminal_safe("list", &list.stdout)?;
    let row = text.lines().nth(1).unwrap_or_default();
    ensure!(row.split_whitespace().next() == Some(escaped_key), "{text}");
    ensure!(row.contains(&shim_pid), "{text}");
    let json = output(&agent, &["list", "--json"]).await?;
    ensure!(!json.stdout.contains(&0x1b), "{json:?}");
    let listing: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    let command = listing["keys"][0]["holders"][0]["command"]
        .as_str()
        .unwrap_or_default();
    ensure!(command.contains(HOSTILE_PROGRAM), "{listing}");

    theirs.end_and_expect_success().await
}

/// A stopped agent (SIGSTOP): it still accepts (the kernel queues the
/// connection) but answers nothing. SIGCONT when dropped.
struct Stopped(Pid);

impl Stopped {
    async fn new(agent: &TestAgent) -> Result<Stopped> {
        let pid = Pid::from_raw(agent.pid().context("agent not running")? as i32);
        kill(pid, Signal::SIGSTOP).context("stopping the agent")?;
        let stopped = Stopped(pid);
        let deadline = Deadline::new(WAIT, "every thread of the agent to stop");
        while !stopped.all_threads_stopped()? {
            deadline.tick().await?;
        }
        Ok(stopped)
    }

    fn all_threads_stopped(&self) -> Result<bool> {
        for task in std::fs::read_dir(format!("/proc/{}/task", self.0))? {
            let stat = std::fs::read_to_string(task?.path().join("stat"))?;
            // The state follows the parenthesised command name.
            let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
            if state != Some(Some('T')) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

/// `runlock ARGS...` against `agent` with `on_unavailable` set as the host's.
fn runlock_with_policy(agent_socket: &Path, policy: &str, args: &[&str]) -> Result<Run> {
    let mut command = tokio::process::Command::new(&bins()?.runlock);
    command
        .arg("--socket")
        .arg(agent_socket)
        .args(args)
        .env_remove("RUNLOCK_SOCKET")
        .env("RUNLOCK_ON_UNAVAILABLE", policy);
    Run::spawn(command)
}

fn ensure_silent_agent(out: &Finished, socket: &Path) -> Result<()> {
    out.expect_code(69)?;
    ensure!(!out.stdout.contains("ran"), "the command ran: {out:?}");
    let said = format!("the agent at {} did not answer within 5s", socket.display());
    ensure!(out.stderr.contains(&said), "{out:?}");
    ensure!(
        out.elapsed < ANSWER_TIMEOUT * 2,
        "not bounded by the shim: {out:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_answers_costs_a_bounded_wait() -> Result<()> {
    let agent = TestAgent::start("memory://").await?;
    let socket = agent.socket();
    let k = key("silent-agent");
    let stopped = Stopped::new(&agent).await?;
    // Side by side, so the three waits overlap.
    let run = ["run", "--key", &k, "--", "sh", "-c", "echo ran"];
    let fail = runlock_with_policy(socket, "fail", &run)?;
    let warn = runlock_with_policy(socket, "warn", &run)?;
    let status = runlock_with_policy(socket, "fail", &["status"])?;
    ensure_silent_agent(&fail.finish().await?, socket).context("run")?;
    ensure_silent_agent(&status.finish().await?, socket).context("status")?;
    // A silent agent is an unreachable one: on_unavailable decides.
    let warn = warn.finish().await?;
    warn.expect_code(0)?;
    ensure!(warn.stdout.contains("ran"), "{warn:?}");
    ensure!(warn.stderr.contains("WITHOUT A LOCK"), "{warn:?}");

    drop(stopped);
    let token = agent.token_of_a_run(&k).await?;
    ensure!(token >= 1, "the agent serves again, token {token}");
    Ok(())
}

/// Answers hello with a welcome, then reads on and answers nothing, as an
/// agent wedged after the handshake would.
fn wedged_agent(socket: &Path) -> Result<tokio::task::JoinHandle<()>> {
    let listener = UnixListener::bind(socket)?;
    Ok(tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut framed = Framed::new(stream, AgentCodec::new());
                let Some(Ok(Ok(hello))) = framed.next().await else {
                    return;
                };
                let welcome = AgentMessage::Welcome {
                    version: runlock_protocol::PROTOCOL_VERSION,
                    agent: "wedged".into(),
                    agent_id: "wedged".into(),
                    backend: "memory://".into(),
                    scope: runlock_protocol::Scope::Host,
                    default_ttl_ms: 30_000,
                    on_unavailable: runlock_protocol::OnUnavailable::Fail,
                    leases_survive_agent: false,
                };
                let reply = Envelope {
                    id: hello.id,
                    body: welcome,
                };
                if framed.send(reply).await.is_ok() {
                    while let Some(Ok(_)) = framed.next().await {}
                }
            });
        }
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_answers_the_acquire_costs_a_bounded_wait() -> Result<()> {
    let dir = crate::support::agent::temp_dir()?;
    let socket = dir.path().join("wedged.sock");
    let fake = wedged_agent(&socket)?;
    let k = key("wedged");
    let run = [
        "run", "--key", &k, "--wait", "1s", "--", "sh", "-c", "echo ran",
    ];
    // The wait, then the agent's own bound on one key's backend operations.
    let limit = Duration::from_secs(1) + BACKEND_ANSWER_TIMEOUT;
    let out = runlock_with_policy(&socket, "fail", &run)?
        .finish_within(limit + WAIT)
        .await?;
    fake.abort();
    out.expect_code(69)?;
    ensure!(!out.stdout.contains("ran"), "the command ran: {out:?}");
    let said = format!("did not answer within {}s", limit.as_secs());
    ensure!(out.stderr.contains(&said), "{out:?}");
    ensure!(out.elapsed < limit + ANSWER_TIMEOUT, "not bounded: {out:?}");
    Ok(())
}

/// Answers every connection with one `error`, as the agent does at its
/// limits (`hello_id: false`: without an id, before reading anything) or to
/// a hello it refuses (`hello_id: true`: with hello's id), then closes.
fn refusing_agent(
    socket: &Path,
    hello_id: bool,
    code: ErrorCode,
    message: &str,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = UnixListener::bind(socket)?;
    let error = AgentMessage::Error(WireError::new(code, message));
    Ok(tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let mut framed = Framed::new(stream, AgentCodec::new());
            let id = match hello_id {
                true => match framed.next().await {
                    Some(Ok(Ok(hello))) => hello.id,
                    _ => None,
                },
                false => None,
            };
            let body = error.clone();
            let _ = framed.send(Envelope { id, body }).await;
        }
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_refuses_never_lets_a_run_go_unlocked() -> Result<()> {
    let dir = crate::support::agent::temp_dir()?;
    let k = key("refused");
    let run = ["run", "--key", &k, "--", "sh", "-c", "echo ran"];
    let busy = "agent busy: 64 connections from uid 65534 \x1b]0;pwned\x07";
    for (hello_id, code, exit) in [
        (false, ErrorCode::Unavailable, 69),
        (true, ErrorCode::UnsupportedVersion, 70),
        (true, ErrorCode::Unavailable, 69),
    ] {
        let socket = dir
            .path()
            .join(format!("{hello_id}-{}.sock", code.as_str()));
        let fake = refusing_agent(&socket, hello_id, code, busy)?;
        for policy in ["warn", "skip"] {
            let out = runlock_with_policy(&socket, policy, &run)?.finish().await?;
            let case = format!("{policy}, {code:?}, hello's id: {hello_id}");
            out.expect_code(exit).context(case.clone())?;
            ensure!(
                !out.stdout.contains("ran"),
                "{case}: the command ran: {out:?}"
            );
            ensure!(!out.stderr.contains("WITHOUT A LOCK"), "{case}: {out:?}");
            let said = terminal_safe("the refusal", out.stderr.as_bytes())?;
            ensure!(
                said.contains(r"agent busy: 64 connections from uid 65534 \x1b]0;pwned\x07"),
                "{case}: {said}"
            );
        }
        fake.abort();
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duration_the_wire_cannot_carry_is_a_usage_error() -> Result<()> {
    let agent = TestAgent::start("memory://").await?;
    let k = key("huge-duration");
    // 30 s past u64::MAX milliseconds: it used to wrap to 30 s.
    let huge = "584542046years 33days 2h 26min 21s 616ms";
    for flag in ["--ttl", "--wait"] {
        let out = agent
            .run(&[&k], &[flag, huge], "echo ran")?
            .finish()
            .await?;
        out.expect_code(64).context(flag)?;
        ensure!(!out.stdout.contains("ran"), "the command ran: {out:?}");
        ensure!(out.stderr.contains(flag), "the flag is named: {out:?}");
    }
    Ok(())
}
