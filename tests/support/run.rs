//! `Run`: one `runlock` process under test, with its stdout read line by line
//! (the child's own lines are how a test knows it is running) and its stderr
//! collected. Dropping a `Run` kills the shim and, once known, the child's group.

use super::{within, WAIT};
use anyhow::{bail, Context};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::fmt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;

/// A script for a run that holds its keys until the test closes its stdin:
/// it prints `ready PID TOKEN...` once it runs, then waits for end of input.
pub const HOLD: &str = "echo ready $$ $RUNLOCK_TOKEN; read _line; echo bye";

/// Like [`HOLD`], but the command ignores SIGTERM (only SIGKILL stops it).
pub const HOLD_IGNORING_TERM: &str =
    "trap '' TERM; echo ready $$ $RUNLOCK_TOKEN; read _line; echo bye";

/// How long `finish` waits for the pipes to close once the shim has exited.
const PIPE_GRACE: Duration = Duration::from_secs(5);

/// What a run's child said when it started (see [`HOLD`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// The child's pid, which is also its process group.
    pub pid: u32,
    /// Its `RUNLOCK_TOKEN` values, one per key.
    pub tokens: Vec<u64>,
}

impl Ready {
    /// The one token of a single-key run.
    pub fn token(&self) -> u64 {
        self.tokens.first().copied().unwrap_or(0)
    }
}

/// A finished `runlock`.
pub struct Finished {
    /// How it exited.
    pub status: ExitStatus,
    /// Everything written to stdout (the child's output, for `run`).
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
    /// From spawn to exit.
    pub elapsed: Duration,
}

impl fmt::Debug for Finished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "runlock exited with {:?} after {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.status, self.elapsed, self.stdout, self.stderr
        )
    }
}

impl Finished {
    /// The exit code (None when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Fails, showing the output, unless the exit code is `want`.
    pub fn expect_code(&self, want: i32) -> anyhow::Result<()> {
        if self.code() != Some(want) {
            bail!("expected exit code {want}, got {self:?}");
        }
        Ok(())
    }

    /// Fails unless the run exited 0 having printed exactly `stdout`.
    pub fn expect_output(&self, stdout: &str) -> anyhow::Result<()> {
        self.expect_code(0)?;
        if self.stdout != stdout {
            bail!("expected the output {stdout:?}: {self:?}");
        }
        Ok(())
    }

    /// Fails, showing the output, unless stdout contains each of `wants`.
    pub fn expect_stdout_has(&self, wants: &[&str]) -> anyhow::Result<()> {
        match wants.iter().find(|want| !self.stdout.contains(**want)) {
            Some(want) => bail!("{want:?} missing from stdout: {self:?}"),
            None => Ok(()),
        }
    }

    /// Fails, showing the output, unless stderr contains each of `wants`.
    pub fn expect_stderr_has(&self, wants: &[&str]) -> anyhow::Result<()> {
        match wants.iter().find(|want| !self.stderr.contains(**want)) {
            Some(want) => bail!("{want:?} missing from stderr: {self:?}"),
            None => Ok(()),
        }
    }

    /// Fails unless the run lost its lock (exit 76) and its [`HOLD`] command
    /// was stopped before it could say `bye`.
    pub fn expect_stopped(&self) -> anyhow::Result<()> {
        self.expect_code(76)?;
        if self.stdout.contains("bye") {
            bail!("the command was not stopped: {self:?}");
        }
        Ok(())
    }
}

/// A running `runlock`.
pub struct Run {
    child: Child,
    started: Instant,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    seen: Vec<String>,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_task: Option<JoinHandle<()>>,
    group: Option<u32>,
}

impl Run {
    /// Starts `command` with piped stdio.
    pub fn spawn(mut command: Command) -> anyhow::Result<Run> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().context("starting runlock")?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("no stdout pipe")?).lines();
        let mut stderr_pipe = child.stderr.take().context("no stderr pipe")?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = stderr.clone();
        let stderr_task = tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stderr_pipe.read(&mut buf).await {
                sink.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(&buf[..n]);
            }
        });
        Ok(Run {
            child,
            started: Instant::now(),
            stdin,
            stdout,
            seen: Vec::new(),
            stderr,
            stderr_task: Some(stderr_task),
            group: None,
        })
    }

    /// The shim's pid.
    pub fn pid(&self) -> anyhow::Result<u32> {
        self.child
            .id()
            .context("runlock has already been waited for")
    }

    /// The stderr written so far.
    pub fn stderr_so_far(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// The next line on stdout, within [`WAIT`].
    pub async fn line(&mut self) -> anyhow::Result<String> {
        let next = within(WAIT, "a line from the run", self.stdout.next_line()).await;
        match next {
            Ok(Ok(Some(line))) => {
                self.seen.push(line.clone());
                Ok(line)
            }
            Ok(Ok(None)) => bail!(
                "the run's stdout closed; exit {:?}; stdout so far {:?}; stderr:\n{}",
                self.child.try_wait().ok().flatten(),
                self.seen,
                self.stderr_so_far()
            ),
            Ok(Err(err)) => Err(err).context("reading the run's stdout"),
            Err(err) => Err(err.context(format!("stderr so far:\n{}", self.stderr_so_far()))),
        }
    }

    /// Reads lines until one equals `want`.
    pub async fn expect_line(&mut self, want: &str) -> anyhow::Result<()> {
        loop {
            if self.line().await? == want {
                return Ok(());
            }
        }
    }

    /// Reads stdout (bounded) until every process holding it has closed it:
    /// how a test sees a run's command die after its shim is gone.
    pub async fn until_stdout_closes(&mut self) -> anyhow::Result<()> {
        let rest = async {
            while let Some(line) = self.stdout.next_line().await? {
                self.seen.push(line);
            }
            anyhow::Ok(())
        };
        within(WAIT, "the run's stdout to close", rest).await?
    }

    /// The stdout lines read so far.
    pub fn lines_seen(&self) -> &[String] {
        &self.seen
    }

    /// Waits for the child's `ready PID TOKEN...` line (see [`HOLD`]).
    pub async fn ready(&mut self) -> anyhow::Result<Ready> {
        let line = self.line().await?;
        let mut words = line.split_whitespace();
        if words.next() != Some("ready") {
            bail!("expected a `ready` line, got {line:?}");
        }
        let pid: u32 = words
            .next()
            .context("no pid in the ready line")?
            .parse()
            .with_context(|| format!("bad pid in {line:?}"))?;
        let tokens = words
            .map(|w| w.parse().with_context(|| format!("bad token in {line:?}")))
            .collect::<anyhow::Result<Vec<u64>>>()?;
        self.group = Some(pid);
        Ok(Ready { pid, tokens })
    }

    /// Closes the run's stdin: a [`HOLD`] child then ends normally.
    pub fn end(&mut self) {
        self.stdin = None;
    }

    /// Ends a [`HOLD`] child (closes its stdin) and expects the run to exit 0.
    pub async fn end_and_expect_success(mut self) -> anyhow::Result<()> {
        self.end();
        self.finish().await?.expect_code(0)
    }

    /// Ends a [`HOLD`] child and checks that nothing stopped it first: it
    /// exits 0 having said "bye".
    pub async fn end_and_expect_ran_through(mut self) -> anyhow::Result<Finished> {
        self.end();
        let out = self.finish().await?;
        out.expect_code(0)?;
        anyhow::ensure!(
            out.stdout.contains("bye"),
            "the command was stopped: {out:?}"
        );
        Ok(out)
    }

    /// Sends `signal` to the shim.
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = self.pid()?;
        kill(Pid::from_raw(pid as i32), signal)
            .with_context(|| format!("sending {signal} to runlock"))
    }

    /// SIGKILLs the child's process group (known once [`Run::ready`] returned).
    pub fn kill_group(&self) -> anyhow::Result<()> {
        let group = self.group.context("the child's group is not known yet")?;
        killpg(Pid::from_raw(group as i32), Signal::SIGKILL).context("killing the child's group")
    }

    /// Waits (bounded) for the shim to exit, without waiting for its pipes.
    pub async fn wait(&mut self) -> anyhow::Result<ExitStatus> {
        within(WAIT, "runlock to exit", self.child.wait())
            .await?
            .context("waiting for runlock")
    }

    /// Waits (bounded) for the shim to exit and collects its output.
    pub async fn finish(self) -> anyhow::Result<Finished> {
        self.finish_within(WAIT).await
    }

    /// Like [`Run::finish`], for a shim that may take up to `limit` to exit.
    pub async fn finish_within(mut self, limit: Duration) -> anyhow::Result<Finished> {
        // Stdout is read meanwhile: a shim that prints more than a pipe holds
        // would otherwise wait for its reader forever.
        let (child, stdout, seen) = (&mut self.child, &mut self.stdout, &mut self.seen);
        let exited = async {
            let mut open = true;
            loop {
                tokio::select! {
                    status = child.wait() => break status,
                    line = stdout.next_line(), if open => match line {
                        Ok(Some(line)) => seen.push(line),
                        _ => open = false,
                    },
                }
            }
        };
        let status = match within(limit, "runlock to exit", exited).await {
            Ok(status) => status.context("waiting for runlock")?,
            Err(err) => bail!(
                "{err:#}; stdout so far {:?}; stderr:\n{}",
                self.seen,
                self.stderr_so_far()
            ),
        };
        let elapsed = self.started.elapsed();
        // The child may outlive the shim (a killed shim); then its pipes stay open.
        let rest = async {
            while let Ok(Some(line)) = self.stdout.next_line().await {
                self.seen.push(line);
            }
            if let Some(task) = self.stderr_task.take() {
                let _ = task.await;
            }
        };
        let _ = tokio::time::timeout(PIPE_GRACE, rest).await;
        let mut stdout = self.seen.join("\n");
        if !stdout.is_empty() {
            stdout.push('\n');
        }
        Ok(Finished {
            status,
            stdout,
            stderr: self.stderr_so_far(),
            elapsed,
        })
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(task) = self.stderr_task.take() {
            task.abort();
        }
        // The shim dies by kill_on_drop; its child lives in a group of its own.
        if let (Some(group), Ok(None)) = (self.group, self.child.try_wait()) {
            let _ = killpg(Pid::from_raw(group as i32), Signal::SIGKILL);
        }
    }
}
