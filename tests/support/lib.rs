//! The harness the integration tests (`tests/main.rs`) and the bench
//! (`tests/bench/`) share: the real binaries (built once), agents on
//! temporary sockets, shim runs with their output, and a protocol client
//! (runlock-client's) that shows what the agent says as it is. A run's exit
//! is checked against the shim's own exit codes (`runlock_shim::exit`).
//! Every wait in here is bounded.

/// The test matrix: `test_matrix!([name: VALUE, ...]; case, ...)` runs each
/// `async fn case(value) -> anyhow::Result<()>` once per value, as the test
/// `case::name`. VALUEs are written as in the cases' own module (the backends
/// of the lifecycle cases, the stores of the scenarios, Meltano's databases).
#[macro_export]
macro_rules! test_matrix {
    ($values:tt; $($case:ident),* $(,)?) => {$(
        $crate::test_matrix!(@case $case $values);
    )*};
    (@case $case:ident [$($name:ident: $value:expr),* $(,)?]) => {
        mod $case {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    super::$case($value).await
                }
            )*
        }
    };
}

pub mod agent;
pub mod bench_args;
pub mod bins;
pub mod browser;
pub mod client;
pub mod hosts;
pub mod http;
pub mod journal;
pub mod rewriting_proxy;
pub mod run;
pub mod store_requests;
pub mod stores;
pub mod transcript;

pub use agent::{AgentOptions, TestAgent};
pub use run::Run;

use anyhow::Context;
use std::future::Future;
use std::time::Duration;

/// The bound on any single wait for something that should happen promptly
/// (a process starting, a line, an exit): generous for a loaded 2-core machine.
pub const WAIT: Duration = Duration::from_secs(15);

/// Awaits `future` for at most `limit`, naming `what` if it takes longer.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    future: impl Future<Output = T>,
) -> anyhow::Result<T> {
    tokio::time::timeout(limit, future)
        .await
        .with_context(|| format!("timed out after {limit:?} waiting for {what}"))
}

/// A bound on a poll, for states nothing announces (is a key acquirable yet?):
/// `while !done().await? { deadline.tick().await?; }`.
pub struct Deadline {
    at: tokio::time::Instant,
    limit: Duration,
    what: String,
}

impl Deadline {
    /// A deadline `limit` from now for `what`.
    pub fn new(limit: Duration, what: impl Into<String>) -> Deadline {
        Deadline {
            at: tokio::time::Instant::now() + limit,
            limit,
            what: what.into(),
        }
    }

    /// Waits 20 ms before the next check; fails once the deadline has passed.
    pub async fn tick(&self) -> anyhow::Result<()> {
        if tokio::time::Instant::now() >= self.at {
            anyhow::bail!("{}: not true after {:?}", self.what, self.limit);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(())
    }
}

/// `setpriv` set to run its command as `uid`:`gid` with exactly the
/// supplementary `groups`.
pub fn setpriv(uid: u32, gid: u32, groups: &[u32]) -> tokio::process::Command {
    let groups = match groups {
        [] => "--clear-groups".to_string(),
        _ => {
            let list: Vec<String> = groups.iter().map(u32::to_string).collect();
            format!("--groups={}", list.join(","))
        }
    };
    let mut command = tokio::process::Command::new("setpriv");
    command
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg(groups);
    command
}

/// `nobody`, in no group, holding `count` TCP connections to `addr` open
/// and sending nothing on them, once it has opened them all: any user of a
/// host can do this to a port on its loopback. Killed when dropped.
pub async fn nobody_holds_connections(
    addr: std::net::SocketAddr,
    count: usize,
) -> anyhow::Result<Run> {
    let script = format!(
        "for i in $(seq {count}); do exec {{fd}}<>/dev/tcp/{ip}/{port} || exit 1; done; \
         echo ready; read -r _",
        ip = addr.ip(),
        port = addr.port()
    );
    let mut command = setpriv(65534, 65534, &[]);
    command.args(["bash", "-c", &script]);
    let mut run = Run::spawn(command)?;
    let line = run.line().await?;
    anyhow::ensure!(
        line == "ready",
        "nobody did not open its connections to {addr}: {line:?} {}",
        run.stderr_so_far()
    );
    Ok(run)
}

/// What tests/scripts/meltano.sh installed and exported in `var`
/// (`RUNLOCK_TEST_MELTANO`, `RUNLOCK_TEST_TARGET_JSONL`): a missing install
/// fails the test, it is never skipped.
pub fn meltano_installed(var: &str) -> anyhow::Result<String> {
    use anyhow::Context;
    std::env::var(var).with_context(|| {
        format!(
            "{var} is not set: run the tests through scripts/test, or \
             `source tests/scripts/meltano.sh; meltano_install` first"
        )
    })
}

/// A fresh key name for a test, so that no two tests' keys meet even in one backend.
pub fn key(name: &str) -> String {
    format!("test:{name}")
}

/// This machine's host name, as the agent records it.
pub fn host_name() -> anyhow::Result<String> {
    Ok(nix::unistd::gethostname()
        .context("reading the host name")?
        .to_string_lossy()
        .into_owned())
}

/// The user name the agent records for this process's uid.
pub fn user_name() -> String {
    let uid = nix::unistd::geteuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => uid.as_raw().to_string(),
    }
}

/// A port on 127.0.0.1 where nothing listens (bound, then closed).
pub fn closed_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding a local port")?;
    Ok(listener.local_addr()?.port())
}

/// The resident set size of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")
}
