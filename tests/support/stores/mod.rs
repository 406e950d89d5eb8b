//! The stores the scenario suite (`tests/shim/scenarios.rs`) runs against, behind
//! one trait: each store says how to reach the instance `scripts/test`
//! started, how to start one of a test's own, how to make a fresh space in it,
//! and how to read its lock records with the store's own tools.

pub mod azure;
mod etcd;
mod gcs;
mod postgres;
mod python_sdk;
mod s3;

pub use azure::Azure;
pub use etcd::Etcd;
pub use gcs::Gcs;
pub use postgres::{PgBouncer, Postgres};
pub use s3::{env_for as s3_env_for, Ministack, S3};

use super::agent::{AgentOptions, TestAgent};
use super::Deadline;
use anyhow::{bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::process::{Child, Command};

/// Where a store instance answers: `http://127.0.0.1:PORT`, `postgresql://…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Its URL.
    pub url: String,
}

/// One lock record as the store's own tools read it.
#[derive(Debug, Clone)]
pub struct Record {
    /// Its name in the store (object key, row key, etcd key).
    pub name: String,
    /// When it was last written, by the store's clock, where the store keeps one.
    pub written: Option<SystemTime>,
    /// The record as JSON text.
    pub body: String,
}

impl Record {
    /// The body as JSON.
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("{} is not JSON: {:?}", self.name, self.body))
    }
}

/// A way the store cannot be used: an agent started with `uri` and `env`
/// must make a wrapped run exit 69 naming each of `names`, and `secret`
/// must show in no output and no log.
#[derive(Debug, Clone)]
pub struct Failure {
    /// What is wrong, for the test's messages.
    pub what: String,
    /// The agent's backend URI.
    pub uri: String,
    /// The agent's environment.
    pub env: Vec<(String, String)>,
    /// What the run's stderr must contain.
    pub names: Vec<String>,
    /// A secret the agent was given, which must never be shown.
    pub secret: Option<String>,
}

/// A store's name, the variable that holds the endpoint of the instance
/// `scripts/test` started, and the script under tests/scripts that starts it.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    pub name: &'static str,
    pub shared_var: &'static str,
    pub script: &'static str,
}

impl Kind {
    pub const fn new(name: &'static str, shared_var: &'static str, script: &'static str) -> Kind {
        Kind {
            name,
            shared_var,
            script,
        }
    }
}

/// A store's contents read and written with the store's own tools, as a
/// person would check what the agent wrote.
#[async_trait::async_trait]
pub trait Objects: Send + Sync {
    /// Every lock record of space `name` under `prefix`.
    async fn records(&self, at: &Endpoint, name: &str, prefix: &str) -> Result<Vec<Record>>;
    /// Object stores only: writes a raw object beside the lock records.
    async fn put(&self, at: &Endpoint, name: &str, object: &str, body: &[u8]) -> Result<()>;
    /// Object stores only: reads a raw object; `None` when there is none.
    async fn get(&self, at: &Endpoint, name: &str, object: &str) -> Result<Option<String>>;
}

/// One kind of store the scenario suite runs against.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Which store this is, and where `scripts/test` says its instance is.
    fn kind(&self) -> Kind;
    /// "s3", "ministack", "azure", "gcs", "postgres", "pgbouncer", "etcd".
    fn name(&self) -> &'static str {
        self.kind().name
    }
    /// The agent's name for this kind of store, as its metrics label it
    /// ("s3" for both S3 emulators).
    fn backend(&self) -> &'static str {
        self.name()
    }
    /// The instance `scripts/test` started; an error saying how to start it
    /// when its variable is unset.
    fn shared(&self) -> Result<Endpoint> {
        let kind = self.kind();
        Ok(Endpoint {
            url: test_var(kind.shared_var, kind.script)?,
        })
    }
    /// Starts an instance of the test's own (for the pause scenarios); ready
    /// when this returns.
    async fn start_own(&self) -> Result<OwnServer>;
    /// Makes a new, empty space (bucket, container, database, key prefix) called `name` at `at`.
    async fn create(&self, at: &Endpoint, name: &str) -> Result<()>;
    /// The backend URI for space `name`, lock records under `prefix` (may be empty).
    fn uri(&self, at: &Endpoint, name: &str, prefix: &str) -> String;
    /// The environment an agent needs to use `at`.
    fn env(&self, at: &Endpoint) -> Vec<(String, String)>;
    /// What reads and writes the store's spaces beside the agent: the store
    /// itself, or the tools it shares with another (an SDK, PostgreSQL behind
    /// PgBouncer).
    fn objects(&self) -> &dyn Objects;
    /// The store's own failure modes.
    async fn failures(&self, at: &Endpoint) -> Result<Vec<Failure>>;
    /// How coarse [`Record::written`] is: a write stamped `t` happened in
    /// `[t, t + this)`. HTTP dates (`Last-Modified`) have whole seconds.
    fn stamp_resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// A store instance a test started for itself, in a process group of its own.
/// Dropping it kills the group.
pub struct OwnServer {
    /// Where it answers.
    pub endpoint: Endpoint,
    child: Child,
    group: Pid,
    _dir: Option<tempfile::TempDir>,
}

impl OwnServer {
    /// Spawns `command` in a new process group and waits (at most 30 s) until
    /// `ready` succeeds; `dir` (its data, if any) is deleted with it.
    pub async fn spawn(
        mut command: Command,
        endpoint: Endpoint,
        dir: Option<tempfile::TempDir>,
        mut ready: impl FnMut() -> Ready,
    ) -> Result<OwnServer> {
        command
            .process_group(0)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("starting {:?}", command.as_std().get_program()))?;
        let group = Pid::from_raw(child.id().context("the server's pid")? as i32);
        let mut server = OwnServer {
            endpoint,
            child,
            group,
            _dir: dir,
        };
        let what = format!("{} to answer", server.endpoint.url);
        let deadline = Deadline::new(Duration::from_secs(30), what);
        loop {
            if ready().await? {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("{} exited at start: {status}", server.endpoint.url);
            }
            deadline.tick().await?;
        }
    }

    /// Stops the store dead (SIGSTOP to its group): connections open, nothing answers.
    pub fn pause(&self) -> Result<()> {
        Ok(killpg(self.group, Signal::SIGSTOP)?)
    }

    /// Lets it go on (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        Ok(killpg(self.group, Signal::SIGCONT)?)
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = killpg(self.group, Signal::SIGCONT);
        let _ = killpg(self.group, Signal::SIGKILL);
    }
}

/// One check of whether a server [`OwnServer::spawn`] started is up yet.
pub type Ready = futures::future::BoxFuture<'static, Result<bool>>;

/// A [`Ready`] check: `url` answers a GET with a status `accepts`.
pub fn http_ready(url: String, accepts: fn(u16) -> bool) -> impl FnMut() -> Ready {
    move || {
        let url = url.clone();
        Box::pin(async move { Ok(crate::http::answers(&url, accepts).await) })
    }
}

/// A status that is no error (below 400): the server is up and serving.
pub fn not_an_error(status: u16) -> bool {
    status < 400
}

/// A fresh space on one store instance: the place two agents share, as two
/// hosts would.
pub struct Space {
    store: Arc<dyn Store>,
    /// Where the store answers.
    pub at: Endpoint,
    /// The space's name (bucket, container, database, prefix).
    pub name: String,
}

/// A name no other test uses: `runlock-HINT-PID-N`, lower case, fit for any store.
pub fn unique_name(hint: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let hint: String = hint
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(24)
        .collect();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("runlock-{hint}-{}-{n}", std::process::id())
}

impl Space {
    /// A new space on the store's shared instance.
    pub async fn create(store: impl Store, hint: &str) -> Result<Space> {
        let at = store.shared()?;
        Space::create_at(store, at, hint).await
    }

    /// A new space on the instance at `at` (a test's own).
    pub async fn create_at(store: impl Store, at: Endpoint, hint: &str) -> Result<Space> {
        let name = unique_name(hint);
        store
            .create(&at, &name)
            .await
            .with_context(|| format!("creating {name} in {} at {}", store.name(), at.url))?;
        Ok(Space {
            store: Arc::new(store),
            at,
            name,
        })
    }

    /// Which store it is on ("s3", "postgres", …).
    pub fn store_name(&self) -> &'static str {
        self.store.name()
    }

    /// The backend URI with records under `prefix`.
    pub fn uri(&self, prefix: &str) -> String {
        self.store.uri(&self.at, &self.name, prefix)
    }

    /// The environment an agent needs.
    pub fn env(&self) -> Vec<(String, String)> {
        self.store.env(&self.at)
    }

    /// Starts an agent on `uri(prefix)` with `args`.
    pub async fn agent(&self, prefix: &str, args: &[&str]) -> Result<TestAgent> {
        self.agent_with(prefix, args, None, Vec::new()).await
    }

    /// Like [`Space::agent`], with the agent's wall clock moved by `offset`
    /// (libfaketime, e.g. `+5h`), as if the host's clock were that far off.
    /// Its monotonic clock is left alone, as a real host's would be.
    pub async fn agent_with_clock_offset(
        &self,
        prefix: &str,
        args: &[&str],
        offset: &str,
    ) -> Result<TestAgent> {
        let env = vec![
            ("LD_PRELOAD".to_string(), faketime_library()?),
            ("FAKETIME".to_string(), offset.to_string()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".to_string(), "1".to_string()),
        ];
        self.agent_with(prefix, args, None, env).await
    }

    /// Like [`Space::agent`], listening on `socket`: the next agent of a host
    /// whose previous agent stopped.
    pub async fn agent_on_socket(
        &self,
        prefix: &str,
        args: &[&str],
        socket: &Path,
    ) -> Result<TestAgent> {
        self.agent_with(prefix, args, Some(socket), Vec::new())
            .await
    }

    /// The log of a `RUST_LOG=trace` agent on `uri("p")` with `args`, after one
    /// run through it; `env` comes after the space's own, so it may replace a
    /// credential with one a test can look for.
    pub async fn trace_log_of_one_run(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<String> {
        let mut all = self.env();
        all.push(("RUST_LOG".into(), "trace".into()));
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut options = AgentOptions::new(self.uri("p"));
        options.args = args.iter().map(|a| a.to_string()).collect();
        let agent = TestAgent::start_with_env(options, &all).await?;
        agent
            .run(&[&super::key("trace-log")], &[], "true")?
            .finish()
            .await?
            .expect_code(0)?;
        Ok(agent.log())
    }

    async fn agent_with(
        &self,
        prefix: &str,
        args: &[&str],
        socket: Option<&Path>,
        mut env: Vec<(String, String)>,
    ) -> Result<TestAgent> {
        let mut options = AgentOptions::new(self.uri(prefix));
        options.args = args.iter().map(|a| a.to_string()).collect();
        options.socket = socket.map(Path::to_path_buf);
        env.extend(self.env());
        TestAgent::start_with_env(options, &env).await
    }

    /// Every lock record under `prefix`.
    pub async fn records(&self, prefix: &str) -> Result<Vec<Record>> {
        let objects = self.store.objects();
        objects.records(&self.at, &self.name, prefix).await
    }

    /// The one lock record under `prefix` (fails if there are none or several).
    pub async fn only_record(&self, prefix: &str) -> Result<Record> {
        let mut records = self.records(prefix).await?;
        if records.len() != 1 {
            bail!("expected one record under {prefix:?}, found {records:?}");
        }
        Ok(records.remove(0))
    }

    /// Reads a raw object (object stores only).
    pub async fn get(&self, object: &str) -> Result<Option<String>> {
        self.store.objects().get(&self.at, &self.name, object).await
    }

    /// Writes a raw object (object stores only).
    pub async fn put(&self, object: &str, body: &[u8]) -> Result<()> {
        let objects = self.store.objects();
        objects.put(&self.at, &self.name, object, body).await
    }
}

/// libfaketime's multi-threaded library, which `scripts/test` installs.
fn faketime_library() -> Result<String> {
    let found = std::fs::read_dir("/usr/lib")?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.exists());
    match found {
        Some(path) => Ok(path.display().to_string()),
        None => bail!(
            "libfaketime is not installed (apt-get install faketime); run `bash scripts/test`"
        ),
    }
}

/// A variable `scripts/test` exports for a store's tests; an error naming the
/// script that starts the store when it is unset (the suite never skips).
pub fn test_var(name: &str, script: &str) -> Result<String> {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => Ok(value),
        _ => bail!(
            "{name} is not set: run the tests with `bash scripts/test`, which starts the \
             store (or start it with `bash tests/scripts/{script}` and export what it prints)"
        ),
    }
}

/// Runs `command` (bounded by 30 s) and returns its stdout; fails with its stderr.
pub async fn output_of(mut command: Command, input: &[u8], what: &str) -> Result<String> {
    use tokio::io::AsyncWriteExt;
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let mut stdin = child.stdin.take().context("no stdin pipe")?;
    stdin.write_all(input).await?;
    drop(stdin);
    let out = super::within(Duration::from_secs(30), what, child.wait_with_output())
        .await?
        .with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Where the lease engine keeps its records in an object store, below the prefix.
pub const RECORDS: &str = ".runlock/locks/";

/// `SCHEME://NAME/PREFIX` (no slash when the prefix is empty): a space's URI
/// on an object store.
fn object_uri(scheme: &str, name: &str, prefix: &str) -> String {
    if prefix.is_empty() {
        format!("{scheme}://{name}")
    } else {
        format!("{scheme}://{name}/{prefix}")
    }
}

/// The object name prefix of the records of a space with `prefix`.
fn records_under(prefix: &str) -> String {
    if prefix.is_empty() {
        RECORDS.to_string()
    } else {
        format!("{prefix}/{RECORDS}")
    }
}

/// An object an agent checks the store on (`cas/proof.rs`), beside the
/// records but not one of them (removed after the check, but a listing may
/// catch one in between).
fn is_probe(object: &str) -> bool {
    object
        .rsplit('/')
        .next()
        .is_some_and(|leaf| leaf.starts_with("probe-") && !leaf.ends_with(".json"))
}
