//! The agent's command line and environment, resolved into a `Config`.

use crate::telemetry::LogFormat;
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// runlockd: the runlock agent. Holds locks for the runs on this host and
/// serves `runlock` over a Unix socket.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Args {
    /// Socket path [default: $RUNLOCK_SOCKET, else /run/runlock/agent.sock for
    /// root, else $XDG_RUNTIME_DIR/runlock/agent.sock]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Lock backend: file:///DIR or memory:// [default: file:// under
    /// $XDG_STATE_HOME/runlock, or /var/lib/runlock for root]
    #[arg(long, env = "RUNLOCK_BACKEND", value_name = "URI")]
    pub backend: Option<String>,
    /// Lease time to live when a client gives none (e.g. 500ms, 30s, 10m)
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Log format
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Serve Prometheus metrics over HTTP on ADDR (IP:PORT, e.g. 127.0.0.1:9464), at /metrics
    #[arg(long, env = "RUNLOCK_METRICS", value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
}

/// Parses durations written like `500ms`, `30s`, `10m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (write durations like 500ms, 30s, 10m)"))
}

/// The agent's settings, every default resolved.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen.
    pub socket: PathBuf,
    /// The backend URI.
    pub backend: String,
    /// The default lease TTL.
    pub ttl: Duration,
    /// Where to serve metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
}

impl Config {
    /// Resolves defaults from the environment.
    pub fn from_args(args: &Args) -> anyhow::Result<Config> {
        let socket = runlock_protocol::socket_path::resolve(args.socket.clone())
            .map_err(anyhow::Error::msg)?;
        let backend = match &args.backend {
            Some(uri) => uri.clone(),
            None => format!("file://{}", default_state_dir()?.display()),
        };
        let (min, max) = crate::registry::TTL_RANGE;
        if args.ttl < min || args.ttl > max {
            anyhow::bail!(
                "--ttl must be between 1s and 24h, got {}",
                humantime::format_duration(args.ttl)
            );
        }
        Ok(Config {
            socket,
            backend,
            ttl: args.ttl,
            metrics: args.metrics,
        })
    }
}

fn default_state_dir() -> anyhow::Result<PathBuf> {
    if nix::unistd::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/runlock"));
    }
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var("XDG_STATE_HOME") {
        return Ok(dir.join("runlock"));
    }
    match var("HOME") {
        Some(home) => Ok(home.join(".local/state/runlock")),
        None => anyhow::bail!("no state directory: pass --backend, or set XDG_STATE_HOME or HOME"),
    }
}
