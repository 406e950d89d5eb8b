//! `TestAgent`: a real `runlockd` on a socket in its own temporary directory,
//! started with its own `NOTIFY_SOCKET` and ready once it sends `READY=1`.

use super::bins::bins;
use super::client::RawClient;
use super::run::{Finished, Ready, Run};
use super::{within, Deadline, WAIT};
use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use runlock_protocol::{AgentMessage, ClientMessage};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use tempfile::TempDir;
use tokio::net::UnixDatagram;
use tokio::process::{Child, Command};

/// How to start an agent.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The backend URI (`file:///DIR` or `memory://`).
    pub backend: String,
    /// The socket path; `<tempdir>/agent.sock` when `None`.
    pub socket: Option<PathBuf>,
    /// More flags for `runlockd`.
    pub args: Vec<String>,
    /// The agent's umask, if not the test's.
    pub umask: Option<u32>,
    /// The `runlockd` to start, if not the one the tests built.
    pub program: Option<PathBuf>,
    /// The uid and gid to run the agent as (no supplementary groups), if not
    /// the test's: as the package's user, say.
    pub user: Option<(u32, u32)>,
    /// Print the agent's log when it is dropped (the test harness shows it
    /// only for a failing test); the bench, which has no harness, does not.
    pub log_on_drop: bool,
}

impl AgentOptions {
    /// An agent on `backend` with its own socket and default flags.
    pub fn new(backend: impl Into<String>) -> AgentOptions {
        AgentOptions {
            backend: backend.into(),
            socket: None,
            args: Vec::new(),
            umask: None,
            program: None,
            user: None,
            log_on_drop: true,
        }
    }

    /// An agent on `backend` whose leases last `ttl` (`"3s"`) unless renewed:
    /// how the tests make renewals, and so noticing a lost lease, quick.
    pub fn with_ttl(backend: impl Into<String>, ttl: &str) -> AgentOptions {
        AgentOptions {
            args: vec!["--ttl".into(), ttl.into()],
            ..AgentOptions::new(backend)
        }
    }
}

/// A running `runlockd`. Dropping it kills the agent (SIGKILL) and, when the
/// test is failing, its log is shown with the test's output.
pub struct TestAgent {
    dir: TempDir,
    socket: PathBuf,
    backend: String,
    child: Option<Child>,
    log: PathBuf,
    log_on_drop: bool,
    _notify: UnixDatagram,
}

/// A temporary directory under /tmp, where socket paths stay well inside sun_path's ~108 bytes.
pub fn temp_dir() -> anyhow::Result<TempDir> {
    tempfile::Builder::new()
        .prefix("runlock-it-")
        .tempdir_in("/tmp")
        .context("creating a temporary directory in /tmp")
}

/// A temporary directory, and the path of a socket in it: for an agent
/// started by hand (one that must refuse to start, say).
pub fn socket_in_temp_dir() -> anyhow::Result<(TempDir, String)> {
    let dir = temp_dir()?;
    let socket = dir.path().join("agent.sock");
    let socket = socket.to_str().context("utf-8 path")?.to_string();
    Ok((dir, socket))
}

/// A `file://` backend directory that outlives any one agent.
pub struct FileBackendDir {
    dir: TempDir,
}

impl FileBackendDir {
    /// A new, empty lock directory.
    pub fn new() -> anyhow::Result<FileBackendDir> {
        Ok(FileBackendDir { dir: temp_dir()? })
    }

    /// Its URI.
    pub fn uri(&self) -> String {
        format!("file://{}", self.path().display())
    }

    /// The lock directory (the agent creates it).
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("locks")
    }

    /// The directory the lock directory is made in.
    pub fn parent(&self) -> &Path {
        self.dir.path()
    }

    /// A fresh lock directory with two agents on it, as two hosts sharing it.
    /// Keep the directory while the agents use it.
    pub async fn with_two_agents() -> anyhow::Result<(FileBackendDir, TestAgent, TestAgent)> {
        FileBackendDir::with_two_agents_using(AgentOptions::new).await
    }

    /// The same, each agent started with the options `options` makes for the URI.
    pub async fn with_two_agents_using(
        options: impl Fn(String) -> AgentOptions,
    ) -> anyhow::Result<(FileBackendDir, TestAgent, TestAgent)> {
        let locks = FileBackendDir::new()?;
        let a = TestAgent::start_with(options(locks.uri())).await?;
        let b = TestAgent::start_with(options(locks.uri())).await?;
        Ok((locks, a, b))
    }
}

/// What [`TestAgent::held_with_a_waiter`] started.
pub struct HeldWithAWaiter {
    /// The key the waiter holds already.
    pub first: String,
    /// The key the holder holds and the waiter waits for.
    pub k: String,
    /// The run holding `k`.
    pub holder: Run,
    /// The run waiting for `k`.
    pub waiter: Run,
}

/// The backends the lifecycle cases run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `file://` in a temporary directory.
    File,
    /// `memory://`.
    Memory,
    /// `memory-cas://`: the object stores' lease engine over memory.
    MemoryCas,
}

impl TestAgent {
    /// Starts an agent on `backend` and waits until it is ready.
    pub async fn start(backend: impl Into<String>) -> anyhow::Result<TestAgent> {
        TestAgent::start_with(AgentOptions::new(backend)).await
    }

    /// Starts an agent on a fresh backend of `kind` (a `file://` directory inside the agent's own tempdir).
    pub async fn start_on(kind: Backend) -> anyhow::Result<TestAgent> {
        match kind {
            Backend::Memory => TestAgent::start("memory://").await,
            Backend::MemoryCas => TestAgent::start("memory-cas://").await,
            Backend::File => {
                let dir = temp_dir()?;
                let uri = format!("file://{}", dir.path().join("locks").display());
                TestAgent::launch(dir, AgentOptions::new(uri), &[]).await
            }
        }
    }

    /// Starts an agent as `options` say and waits until it is ready.
    pub async fn start_with(options: AgentOptions) -> anyhow::Result<TestAgent> {
        TestAgent::launch(temp_dir()?, options, &[]).await
    }

    /// Like [`TestAgent::start_with`], with more environment variables for the
    /// agent (a network backend's endpoint and credentials).
    pub async fn start_with_env(
        options: AgentOptions,
        env: &[(String, String)],
    ) -> anyhow::Result<TestAgent> {
        TestAgent::launch(temp_dir()?, options, env).await
    }

    async fn launch(
        dir: TempDir,
        options: AgentOptions,
        env: &[(String, String)],
    ) -> anyhow::Result<TestAgent> {
        let bins = bins()?;
        let socket = options
            .socket
            .clone()
            .unwrap_or_else(|| dir.path().join("agent.sock"));
        let notify_path = dir.path().join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path)
            .with_context(|| format!("binding {}", notify_path.display()))?;
        let log = dir.path().join("runlockd.log");
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut command = Command::new(options.program.as_deref().unwrap_or(&bins.runlockd));
        command
            .arg("--socket")
            .arg(&socket)
            .arg("--backend")
            .arg(&options.backend)
            .args(&options.args)
            .env("NOTIFY_SOCKET", &notify_path)
            .env_remove("RUNLOCK_SOCKET")
            .env_remove("RUNLOCK_BACKEND")
            .env_remove("RUNLOCK_METRICS")
            // Set when the tests themselves run under systemd; they change the log's format.
            .env_remove("JOURNAL_STREAM")
            .env_remove("INVOCATION_ID")
            // After the removals, so a test can set these on purpose.
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true);
        if let Some(mask) = options.umask {
            let mask = nix::sys::stat::Mode::from_bits_truncate(mask);
            // SAFETY: umask is async-signal-safe and touches no memory of ours.
            unsafe {
                command.pre_exec(move || {
                    nix::sys::stat::umask(mask);
                    Ok(())
                });
            }
        }
        if let Some((uid, gid)) = options.user {
            // The agent must reach its notify socket and its tempdir as that user.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
            std::fs::set_permissions(&notify_path, std::fs::Permissions::from_mode(0o777))?;
            // From root, std drops the supplementary groups too.
            command.uid(uid).gid(gid);
        }
        let child = spawn_written(&mut command).await?;
        let mut agent = TestAgent {
            dir,
            socket,
            backend: options.backend,
            child: Some(child),
            log,
            log_on_drop: options.log_on_drop,
            _notify: notify,
        };
        if let Err(err) = agent.wait_ready().await {
            bail!("{err:#}\n--- runlockd log ---\n{}", agent.log());
        }
        Ok(agent)
    }

    /// Waits for `READY=1` on the notify socket; fails at once if the agent exits first.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let child = self.child.as_mut().context("agent not running")?;
        let notify = &self._notify;
        let ready = async {
            let mut buf = vec![0u8; 4096];
            loop {
                let n = notify
                    .recv(&mut buf)
                    .await
                    .context("reading NOTIFY_SOCKET")?;
                let text = String::from_utf8_lossy(&buf[..n]);
                if text.lines().any(|line| line == "READY=1") {
                    return anyhow::Ok(());
                }
            }
        };
        within(WAIT, "runlockd to send READY=1", async {
            tokio::select! {
                ready = ready => ready,
                status = child.wait() => bail!("runlockd exited before it was ready: {:?}", status?),
            }
        })
        .await?
    }

    /// The agent's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The backend URI it was started with.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// The agent's temporary directory (for test files beside it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The agent's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// What the agent has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(cannot read log: {e})"))
    }

    /// The shim, preconfigured with this agent's `--socket`.
    pub fn runlock(&self) -> anyhow::Result<Command> {
        let mut command = Command::new(&bins()?.runlock);
        command
            .arg("--socket")
            .arg(&self.socket)
            .env_remove("RUNLOCK_SOCKET")
            .kill_on_drop(true);
        Ok(command)
    }

    /// `runlock run --key K... [extra] -- sh -c SCRIPT`, started.
    pub fn run(&self, keys: &[&str], extra: &[&str], script: &str) -> anyhow::Result<Run> {
        self.run_with_env(keys, extra, script, &[])
    }

    /// A [`HOLD`] run of the one key `key`, once it runs (holds the key).
    ///
    /// [`HOLD`]: crate::run::HOLD
    pub async fn hold(&self, key: &str) -> anyhow::Result<(Run, Ready)> {
        let mut run = self.run(&[key], &[], crate::run::HOLD)?;
        let ready = run.ready().await?;
        Ok((run, ready))
    }

    /// A run of `keys` with `script` (which says `ready` as [`HOLD`] does),
    /// once it runs and its shim has attached to this agent: from then on the
    /// agent acts for the run even when its shim is gone.
    ///
    /// [`HOLD`]: crate::run::HOLD
    pub async fn run_attached(&self, keys: &[&str], script: &str) -> anyhow::Result<(Run, Ready)> {
        self.run_attached_with_env(keys, script, &[]).await
    }

    /// Like [`TestAgent::run_attached`], with `env` set for the command.
    pub async fn run_attached_with_env(
        &self,
        keys: &[&str],
        script: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<(Run, Ready)> {
        let mut run = self.run_with_env(keys, &[], script, env)?;
        let ready = run.ready().await?;
        self.wait_attached(ready.pid).await?;
        Ok((run, ready))
    }

    /// A run of `echo must-not-run` on `keys` with `extra` that must not
    /// start: it exits `code` and its command never ran.
    pub async fn run_refused(
        &self,
        keys: &[&str],
        extra: &[&str],
        code: i32,
    ) -> anyhow::Result<Finished> {
        let out = self.run(keys, extra, "echo must-not-run")?.finish().await?;
        out.expect_code(code)?;
        anyhow::ensure!(
            !out.stdout.contains("must-not-run"),
            "the command ran: {out:?}"
        );
        Ok(out)
    }

    /// A run on `key` that starts and exits 0: the agent grants and serves.
    pub async fn run_to_success(&self, key: &str) -> anyhow::Result<()> {
        self.run(&[key], &[], "exit 0")?
            .finish()
            .await?
            .expect_code(0)
    }

    /// Like [`TestAgent::run`], with `env` set for the command.
    pub fn run_with_env(
        &self,
        keys: &[&str],
        extra: &[&str],
        script: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Run> {
        let mut command = self.runlock()?;
        command.envs(env.iter().copied());
        command.arg("run");
        for key in keys {
            command.args(["--key", key]);
        }
        command.args(extra).args(["--", "sh", "-c", script]);
        Run::spawn(command)
    }

    /// Starts a run of `k` and `first` (which sorts before `k`) with
    /// `--wait 20s`, and returns once it waits for `k`: keys are taken in
    /// sorted order, so its hold on `first` (seen through `client`) shows that
    /// its acquire is in the agent, waiting for `k`.
    pub async fn run_waiting_for(
        &self,
        client: &mut RawClient,
        k: &str,
        first: &str,
        script: &str,
    ) -> anyhow::Result<Run> {
        anyhow::ensure!(first < k, "{first:?} must sort before {k:?}");
        let run = self.run(&[k, first], &["--wait", "20s"], script)?;
        let deadline = Deadline::new(WAIT, format!("the waiter to take {first}"));
        while !client.is_held(first).await? {
            deadline.tick().await?;
        }
        Ok(run)
    }

    /// A [`HOLD`] run holding `k`, and behind it an `echo must-not-run` run
    /// waiting for `k` (see [`TestAgent::run_waiting_for`]) that holds `first`
    /// already: the keys are `NAME-b` and `NAME-a`, after `name`.
    ///
    /// [`HOLD`]: crate::run::HOLD
    pub async fn held_with_a_waiter(
        &self,
        client: &mut RawClient,
        name: &str,
    ) -> anyhow::Result<HeldWithAWaiter> {
        let (first, k) = (
            super::key(&format!("{name}-a")),
            super::key(&format!("{name}-b")),
        );
        let mut holder = self.run(&[&k], &[], crate::run::HOLD)?;
        holder.ready().await?;
        let waiter = self
            .run_waiting_for(client, &k, &first, "echo must-not-run")
            .await?;
        Ok(HeldWithAWaiter {
            first,
            k,
            holder,
            waiter,
        })
    }

    /// A [`HOLD`] run takes `k` through this agent; a forced one through
    /// `forcer` takes it over (the first exits 76) and then ends. Returns the
    /// tokens of the two grants, for a history to name.
    ///
    /// [`HOLD`]: crate::run::HOLD
    pub async fn held_then_forced_through(
        &self,
        forcer: &TestAgent,
        k: &str,
    ) -> anyhow::Result<(u64, u64)> {
        let hold = crate::run::HOLD;
        let mut first = self.run(&[k], &[], hold)?;
        let granted = first.ready().await?.token();
        let mut forced = forcer.run(&[k], &["--force"], hold)?;
        let took = forced.ready().await?.token();
        first.finish().await?.expect_code(76)?;
        forced.end_and_expect_success().await?;
        Ok((granted, took))
    }

    /// Runs `runlock ARGS...` to its end.
    pub async fn runlock_output(&self, args: &[&str]) -> anyhow::Result<Finished> {
        let mut command = self.runlock()?;
        command.args(args);
        Run::spawn(command)?.finish().await
    }

    /// `runlock history KEY --json`, parsed: its events, oldest first.
    pub async fn history_json(&self, key: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        let out = self.runlock_output(&["history", key, "--json"]).await?;
        out.expect_code(0)?;
        match serde_json::from_str(out.stdout.trim()) {
            Ok(serde_json::Value::Array(events)) => Ok(events),
            _ => bail!("history --json printed no JSON array: {out:?}"),
        }
    }

    /// `runlock inspect KEY --json`, parsed.
    pub async fn inspect_json(&self, key: &str) -> anyhow::Result<serde_json::Value> {
        let out = self.runlock_output(&["inspect", key, "--json"]).await?;
        out.expect_code(0)?;
        serde_json::from_str(out.stdout.trim())
            .with_context(|| format!("inspect --json printed non-JSON: {out:?}"))
    }

    /// The fencing token a `echo token $RUNLOCK_TOKEN` run through this agent printed.
    pub async fn token_of_a_run(&self, key: &str) -> anyhow::Result<u64> {
        let out = self
            .run(&[key], &[], "echo token $RUNLOCK_TOKEN")?
            .finish()
            .await?;
        out.expect_code(0)?;
        out.stdout
            .trim()
            .strip_prefix("token ")
            .and_then(|t| t.parse().ok())
            .with_context(|| format!("no token printed: {out:?}"))
    }

    /// Fails unless the agent still serves root: a ping, and a run that
    /// takes and frees a key of its own (after an attack, say).
    pub async fn still_serves(&self) -> anyhow::Result<()> {
        let mut client = self.client().await?;
        let pong = client.call(ClientMessage::Ping).await?;
        anyhow::ensure!(matches!(pong, AgentMessage::Pong), "{pong:?}");
        let out = self
            .run(&[&super::key("still-served")], &[], "echo served")?
            .finish()
            .await?;
        out.expect_code(0)?;
        anyhow::ensure!(out.stdout.contains("served"), "{out:?}");
        Ok(())
    }

    /// The agent's id, from its `welcome`.
    pub async fn agent_id(&self) -> anyhow::Result<String> {
        let mut client = RawClient::connect(self.socket()).await?;
        let welcome = client.hello().await?;
        RawClient::agent_id(&welcome)
    }

    /// A raw protocol connection that has said hello.
    pub async fn client(&self) -> anyhow::Result<RawClient> {
        let mut client = RawClient::connect(&self.socket).await?;
        client.hello().await?;
        Ok(client)
    }

    /// Waits until the agent knows a run's command (the shim's `attach`), so
    /// that it can act for a shim that is gone. A command may print its first
    /// line before its shim has sent `attach`.
    pub async fn wait_attached(&self, child_pid: u32) -> anyhow::Result<()> {
        let mut client = self.client().await?;
        let deadline = Deadline::new(WAIT, format!("the agent to know child {child_pid}"));
        loop {
            match client.call(ClientMessage::List).await? {
                AgentMessage::Leases { leases, .. } => {
                    if leases.iter().any(|l| l.child_pid == Some(child_pid)) {
                        return Ok(());
                    }
                }
                other => bail!("expected leases, got {other:?}"),
            }
            deadline.tick().await?;
        }
    }

    /// SIGTERM, then waits (bounded) for the agent to exit.
    pub async fn stop(&mut self) -> anyhow::Result<ExitStatus> {
        self.signal(Signal::SIGTERM)?;
        self.wait().await
    }

    /// SIGKILL, then waits for the agent to be gone.
    pub async fn kill(&mut self) -> anyhow::Result<ExitStatus> {
        self.signal(Signal::SIGKILL)?;
        self.wait().await
    }

    /// Sends `signal` to the agent (SIGSTOP and SIGCONT pause and resume it).
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = self.pid().context("agent not running")?;
        kill(Pid::from_raw(pid as i32), signal)
            .with_context(|| format!("sending {signal} to runlockd"))
    }

    pub async fn wait(&mut self) -> anyhow::Result<ExitStatus> {
        let mut child = self.child.take().context("agent not running")?;
        within(WAIT, "runlockd to exit", child.wait())
            .await?
            .context("waiting for runlockd")
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        if !self.log_on_drop {
            return;
        }
        // Captured by the test harness and shown only when the test fails.
        eprintln!(
            "--- runlockd log ({}, {}) ---\n{}",
            self.socket.display(),
            self.backend,
            self.log()
        );
    }
}

/// Spawns `command`, whose program may have just been written (a copy
/// installed by a test). Until a child that another test of this process
/// forks meanwhile has exec'd, it holds a copy of every descriptor, the
/// writer's too, and exec refuses a file open for writing (ETXTBSY); so
/// that refusal is waited out, for 5 s at most.
async fn spawn_written(command: &mut Command) -> anyhow::Result<Child> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match command.spawn() {
            Err(err)
                if err.raw_os_error() == Some(libc::ETXTBSY)
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            spawned => {
                let program = command
                    .as_std()
                    .get_program()
                    .to_string_lossy()
                    .into_owned();
                return spawned.with_context(|| format!("starting {program}"));
            }
        }
    }
}
