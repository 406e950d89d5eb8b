//! The agent's settings: a TOML file (`/etc/runlock/runlockd.toml` or
//! `--config`), then `RUNLOCK_*` variables, then flags, each overriding the
//! one before, resolved into one `Config`.

use crate::access::Access;
use crate::backend::{
    AzureOptions, BackendOptions, EtcdOptions, GcsOptions, PostgresOptions, S3Options, Secret,
};
use crate::lease::DEFAULT_POLL_INTERVAL;
use crate::limits::Limits;
use crate::meltano::guard::MeltanoSystemDb;
use crate::telemetry::LogFormat;
use anyhow::Context;
use clap::Parser;
use runlock_protocol::socket_path::{self, CONFIG_ENV, SYSTEM_CONFIG};
use runlock_protocol::{timing, OnUnavailable};
use serde::{Deserialize, Deserializer, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The bounds of `poll_interval`: more often is a store's load for nothing;
/// less often, a handover slower than a run's start.
const MIN_POLL_INTERVAL: Duration = Duration::from_millis(50);
const MAX_POLL_INTERVAL: Duration = Duration::from_secs(60);
/// How long shutdown waits for connections and lease tasks by default.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest `drain_timeout`: past it a stop takes longer than any
/// service manager should wait.
const MAX_DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// runlockd: the runlock agent. Holds locks for the runs on this host and
/// serves `runlock` over a Unix socket.
#[derive(Debug, Parser)]
#[command(name = "runlockd", version, about, after_help = crate::exit_status::help(false))]
pub struct Args {
    /// What to do instead of serving.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Configuration file [default: /etc/runlock/runlockd.toml, when it exists]
    #[arg(long, env = CONFIG_ENV, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
    /// Socket path [default: /run/runlock/agent.sock for root, else
    /// $XDG_RUNTIME_DIR/runlock/agent.sock]
    #[arg(long, env = socket_path::SOCKET_ENV, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
    /// Group that owns the socket (a name or a gid) [default: the agent's]
    #[arg(
        long,
        env = "RUNLOCK_SOCKET_GROUP",
        value_name = "GROUP",
        global = true
    )]
    pub socket_group: Option<String>,
    /// Socket file mode, in octal [default: 0660]
    #[arg(long, env = "RUNLOCK_SOCKET_MODE", value_name = "MODE", global = true,
          value_parser = parse_mode)]
    pub socket_mode: Option<u32>,
    /// Lock backend: file:///DIR, s3://BUCKET/PREFIX, azure://CONTAINER/PREFIX,
    /// gs://BUCKET/PREFIX, postgresql://…, etcd://HOST:PORT[,HOST:PORT]/PREFIX
    /// or memory:// [default:
    /// file:// under $XDG_STATE_HOME/runlock, or /var/lib/runlock for root]
    #[arg(long, env = "RUNLOCK_BACKEND", value_name = "URI", global = true)]
    pub backend: Option<Secret>,
    /// Lease time to live when a client gives none (1s to 24h, e.g. 30s, 10m) [default: 30s]
    #[arg(long, env = "RUNLOCK_TTL", value_name = "DUR", global = true, value_parser = parse_ttl)]
    pub ttl: Option<Duration>,
    /// How often, at most, a waiting run re-checks the store for a holder on
    /// another host (50ms to 60s) [default: 500ms]
    #[arg(long, env = "RUNLOCK_POLL_INTERVAL", value_name = "DUR", global = true,
          value_parser = parse_poll_interval)]
    pub poll_interval: Option<Duration>,
    /// How long a stopping agent waits for its connections, then its lease
    /// tasks, to finish (0s to 10m; keep it under the service manager's stop
    /// timeout) [default: 5s]
    #[arg(long, env = "RUNLOCK_DRAIN_TIMEOUT", value_name = "DUR", global = true,
          value_parser = parse_drain_timeout)]
    pub drain_timeout: Option<Duration>,
    /// What runs do when the backend cannot be reached [default: fail]
    #[arg(long, env = "RUNLOCK_ON_UNAVAILABLE", value_name = "POLICY", global = true,
          value_parser = ["fail", "warn", "skip"])]
    pub on_unavailable: Option<String>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9464)
    #[arg(long, env = "RUNLOCK_METRICS", value_name = "ADDR", global = true)]
    pub metrics: Option<SocketAddr>,
    /// Log format [default: text]
    #[arg(long, env = "RUNLOCK_LOG_FORMAT", value_enum, global = true)]
    pub log_format: Option<LogFormat>,
    /// Meltano's system database (a SQLite path, sqlite:///PATH or
    /// postgresql://...): no key is granted while it records a live RUNNING
    /// run with that state ID, except with --force
    #[arg(
        long,
        env = "RUNLOCK_LEGACY_MELTANO_SYSTEMDB",
        value_name = "DB",
        global = true
    )]
    pub legacy_meltano_systemdb: Option<Secret>,
}

/// For each flag given on the command line with a password in it, a warning
/// saying where to give it instead: every user of the host can read a
/// process's arguments (`/proc/PID/cmdline`, `ps`).
pub fn secrets_on_command_line(args: &Args, matches: &clap::ArgMatches) -> Vec<String> {
    let flags = [
        ("backend", "RUNLOCK_BACKEND", &args.backend),
        (
            "legacy_meltano_systemdb",
            "RUNLOCK_LEGACY_MELTANO_SYSTEMDB",
            &args.legacy_meltano_systemdb,
        ),
    ];
    flags
        .into_iter()
        .filter(|(id, _, value)| {
            matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
                && value
                    .as_ref()
                    .is_some_and(|v| crate::backend::holds_secret(v.expose()))
        })
        .map(|(id, variable, _)| {
            let flag = id.replace('_', "-");
            format!(
                "--{flag} holds a password, which every user of this host can read in the \
                 agent's command line (/proc/PID/cmdline, ps): set {variable} in the \
                 agent's environment (a systemd EnvironmentFile= or drop-in, mode 0600) or \
                 `{id} = \"...\"` in its configuration file instead"
            )
        })
        .collect()
}

/// What runlockd can do besides serving.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Print the effective configuration (secrets redacted) and exit.
    #[command(after_help = crate::exit_status::help(true))]
    CheckConfig {
        /// Instead, print the configuration matching this Meltano project's
        /// state_backend settings (meltano.yml, MELTANO_STATE_BACKEND_*).
        #[arg(long, value_name = "PROJECT_DIR")]
        from_meltano: Option<PathBuf>,
    },
}

/// Parses durations written like `500ms`, `30s`, `10m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (write durations like 500ms, 30s, 10m)"))
}

fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text)?;
    let (min, max) = (timing::MIN_TTL, timing::MAX_TTL);
    if ttl < min || ttl > max {
        return Err(format!(
            "{} is outside {}s..{}h",
            humantime::format_duration(ttl),
            min.as_secs(),
            max.as_secs() / 3600
        ));
    }
    Ok(ttl)
}

fn parse_poll_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval < MIN_POLL_INTERVAL || interval > MAX_POLL_INTERVAL {
        return Err(format!(
            "{} is outside 50ms..60s",
            humantime::format_duration(interval)
        ));
    }
    Ok(interval)
}

fn parse_drain_timeout(text: &str) -> Result<Duration, String> {
    let drain = parse_duration(text)?;
    if drain > MAX_DRAIN_TIMEOUT {
        return Err(format!(
            "{} is outside 0s..10m",
            humantime::format_duration(drain)
        ));
    }
    Ok(drain)
}

fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(format!("{text:?} is not an octal file mode such as 0660")),
    }
}

/// The file's contents. Every field is optional; unknown ones are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    socket: Option<PathBuf>,
    socket_group: Option<String>,
    #[serde(default, deserialize_with = "mode")]
    socket_mode: Option<u32>,
    backend: Option<Secret>,
    #[serde(default, deserialize_with = "ttl")]
    ttl: Option<Duration>,
    #[serde(default, deserialize_with = "on_unavailable")]
    on_unavailable: Option<OnUnavailable>,
    #[serde(default, deserialize_with = "poll_interval")]
    poll_interval: Option<Duration>,
    #[serde(default, deserialize_with = "drain_timeout")]
    drain_timeout: Option<Duration>,
    metrics: Option<SocketAddr>,
    log_format: Option<LogFormat>,
    legacy_meltano_systemdb: Option<Secret>,
    #[serde(default)]
    access: AccessSection,
    #[serde(default)]
    limits: LimitsSection,
    #[serde(default)]
    s3: S3Options,
    #[serde(default)]
    azure: AzureOptions,
    #[serde(default)]
    gcs: GcsOptions,
    #[serde(default)]
    postgres: PostgresOptions,
    #[serde(default)]
    etcd: EtcdOptions,
}

/// `[access]`: who may force a lock or break another's.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessSection {
    #[serde(default)]
    force_users: Option<Vec<NameOrId>>,
    #[serde(default)]
    force_groups: Option<Vec<NameOrId>>,
}

/// `[limits]`: how much of the agent one peer may take.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsSection {
    connections: Option<usize>,
    connections_per_user: Option<usize>,
    #[serde(default, deserialize_with = "handshake_timeout")]
    handshake_timeout: Option<Duration>,
}

impl LimitsSection {
    fn resolve(self) -> anyhow::Result<Limits> {
        let default = Limits::default();
        let limits = Limits {
            connections: self.connections.unwrap_or(default.connections),
            connections_per_user: self
                .connections_per_user
                .unwrap_or(default.connections_per_user),
            handshake_timeout: self.handshake_timeout.unwrap_or(default.handshake_timeout),
        };
        if limits.connections == 0 || limits.connections_per_user == 0 {
            anyhow::bail!("[limits] connections and connections_per_user must be at least 1");
        }
        Ok(limits)
    }
}

fn handshake_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    let timeout = parse_duration(&text).map_err(serde::de::Error::custom)?;
    if timeout < Duration::from_millis(100) || timeout > Duration::from_secs(600) {
        return Err(serde::de::Error::custom(format!(
            "{} is outside 100ms..10m",
            humantime::format_duration(timeout)
        )));
    }
    Ok(Some(timeout))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum NameOrId {
    Id(u32),
    Name(String),
}

fn ttl<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    parse_ttl(&text).map(Some).map_err(serde::de::Error::custom)
}

fn poll_interval<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    parse_poll_interval(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn drain_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    parse_drain_timeout(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    let text = String::deserialize(d)?;
    parse_mode(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn on_unavailable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OnUnavailable>, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map(Some).map_err(serde::de::Error::custom)
}

/// The agent's settings, every default resolved.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file read, if any.
    pub file: Option<PathBuf>,
    /// Where to listen.
    pub socket: PathBuf,
    /// The socket's group, if not the agent's.
    pub socket_group: Option<u32>,
    /// The socket's mode.
    pub socket_mode: u32,
    /// The backend URI (may hold secrets: print it with `redact_uri`).
    pub backend: Secret,
    /// Per-backend options.
    pub backend_options: BackendOptions,
    /// The default lease TTL.
    pub ttl: Duration,
    /// What runs do when the backend cannot be reached.
    pub on_unavailable: OnUnavailable,
    /// How often, at most, a waiter re-checks the store.
    pub poll_interval: Duration,
    /// How long a stopping agent waits for its connections and lease tasks.
    pub drain_timeout: Duration,
    /// Who may force and break.
    pub access: Access,
    /// How much of the agent one peer may take.
    pub limits: Limits,
    /// Where to serve metrics.
    pub metrics: Option<SocketAddr>,
    /// How to log.
    pub log_format: LogFormat,
    /// Meltano's system database to check before each grant (prints redacted).
    pub legacy_meltano_systemdb: Option<Arc<MeltanoSystemDb>>,
}

impl Config {
    /// Reads the file (if any) and layers the environment and flags over it.
    pub fn load(args: &Args) -> anyhow::Result<Config> {
        let (file, settings) = match &args.config {
            Some(path) => (Some(path.clone()), read_file(path)?),
            None if Path::new(SYSTEM_CONFIG).exists() => {
                let path = PathBuf::from(SYSTEM_CONFIG);
                (Some(path.clone()), read_file(&path)?)
            }
            None => (None, FileConfig::default()),
        };
        let socket = socket_path::resolve(args.socket.clone(), settings.socket)
            .map_err(anyhow::Error::msg)?;
        let socket_group = match args
            .socket_group
            .as_ref()
            .or(settings.socket_group.as_ref())
        {
            Some(group) => Some(group_id(group).map_err(anyhow::Error::msg)?),
            None => None,
        };
        let backend = match args.backend.clone().or(settings.backend) {
            Some(uri) => uri,
            None => format!("file://{}", default_state_dir()?.display()).into(),
        };
        let on_unavailable = match &args.on_unavailable {
            Some(text) => text.parse().map_err(anyhow::Error::msg)?,
            None => settings.on_unavailable.unwrap_or_default(),
        };
        let access = Access::new(
            resolve_ids(settings.access.force_users, user_id)?,
            resolve_ids(settings.access.force_groups, group_id)?,
        );
        let legacy_meltano_systemdb = match args
            .legacy_meltano_systemdb
            .as_ref()
            .or(settings.legacy_meltano_systemdb.as_ref())
        {
            Some(setting) => Some(Arc::new(
                MeltanoSystemDb::parse(setting.expose())
                    .map_err(|err| anyhow::anyhow!("legacy_meltano_systemdb: {err}"))?,
            )),
            None => None,
        };
        settings.postgres.schema().map_err(anyhow::Error::msg)?;
        Ok(Config {
            file,
            legacy_meltano_systemdb,
            socket,
            socket_group,
            socket_mode: args.socket_mode.or(settings.socket_mode).unwrap_or(0o660),
            backend,
            backend_options: BackendOptions {
                s3: settings.s3,
                azure: settings.azure,
                gcs: settings.gcs,
                postgres: settings.postgres,
                etcd: settings.etcd,
                ..BackendOptions::default()
            },
            ttl: args.ttl.or(settings.ttl).unwrap_or(Duration::from_secs(30)),
            on_unavailable,
            poll_interval: args
                .poll_interval
                .or(settings.poll_interval)
                .unwrap_or(DEFAULT_POLL_INTERVAL),
            drain_timeout: args
                .drain_timeout
                .or(settings.drain_timeout)
                .unwrap_or(DEFAULT_DRAIN_TIMEOUT),
            access,
            limits: settings.limits.resolve()?,
            metrics: args.metrics.or(settings.metrics),
            log_format: args
                .log_format
                .or(settings.log_format)
                .unwrap_or(LogFormat::Text),
        })
    }

    /// The effective configuration as TOML, with secrets replaced.
    pub fn to_redacted_toml(&self) -> String {
        #[serde_with::skip_serializing_none]
        #[derive(Serialize)]
        struct Shown<'a> {
            socket: &'a Path,
            socket_group: Option<u32>,
            socket_mode: String,
            backend: String,
            ttl: String,
            on_unavailable: OnUnavailable,
            poll_interval: String,
            drain_timeout: String,
            metrics: Option<SocketAddr>,
            log_format: LogFormat,
            legacy_meltano_systemdb: Option<&'a str>,
            access: AccessShown,
            limits: LimitsShown,
            s3: S3Options,
            azure: AzureOptions,
            gcs: &'a GcsOptions,
            postgres: &'a PostgresOptions,
            etcd: &'a EtcdOptions,
        }
        #[derive(Serialize)]
        struct LimitsShown {
            connections: usize,
            connections_per_user: usize,
            handshake_timeout: String,
        }
        #[derive(Serialize)]
        struct AccessShown {
            force_users: Vec<u32>,
            force_groups: Vec<u32>,
        }
        let shown = Shown {
            socket: &self.socket,
            socket_group: self.socket_group,
            socket_mode: format!("{:04o}", self.socket_mode),
            backend: crate::backend::redact_uri(self.backend.expose()),
            ttl: humantime::format_duration(self.ttl).to_string(),
            on_unavailable: self.on_unavailable,
            poll_interval: humantime::format_duration(self.poll_interval).to_string(),
            drain_timeout: humantime::format_duration(self.drain_timeout).to_string(),
            metrics: self.metrics,
            log_format: self.log_format,
            legacy_meltano_systemdb: self
                .legacy_meltano_systemdb
                .as_deref()
                .map(|db| db.describe()),
            access: AccessShown {
                force_users: self.access.uids().to_vec(),
                force_groups: self.access.gids().to_vec(),
            },
            limits: LimitsShown {
                connections: self.limits.connections,
                connections_per_user: self.limits.connections_per_user,
                handshake_timeout: humantime::format_duration(self.limits.handshake_timeout)
                    .to_string(),
            },
            s3: self.backend_options.s3.redacted(),
            azure: self.backend_options.azure.redacted(),
            gcs: &self.backend_options.gcs,
            postgres: &self.backend_options.postgres,
            etcd: &self.backend_options.etcd,
        };
        let source = match &self.file {
            Some(path) => format!("# from {} and the environment\n", path.display()),
            None => "# no configuration file; from the environment and defaults\n".to_string(),
        };
        match toml::to_string(&shown) {
            Ok(text) => source + &text,
            Err(err) => format!("{source}# cannot print the configuration: {err}\n"),
        }
    }
}

/// Reads and parses a config file; errors name the file, the line and the setting.
fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading configuration file {}", path.display()))?;
    toml::from_str(&text).map_err(|err| anyhow::anyhow!(describe_error(path, &text, &err)))
}

fn describe_error(path: &Path, text: &str, err: &toml::de::Error) -> String {
    let message = err.message().trim_end();
    let Some(span) = err.span() else {
        return format!("{}: {message}", path.display());
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    match setting_at(before, &text[before.len()..]) {
        Some(setting) => format!("{}:{line}: `{setting}`: {message}", path.display()),
        None => format!("{}:{line}: {message}", path.display()),
    }
}

/// The dotted name of the setting on the line where `before` ends.
fn setting_at(before: &str, after: &str) -> Option<String> {
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_end = after
        .find('\n')
        .map_or(before.len() + after.len(), |i| before.len() + i);
    let whole = format!("{before}{after}");
    let line = &whole[line_start..line_end];
    let key = line.split_once('=')?.0.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('[') {
        return None;
    }
    let table = before[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && l.ends_with(']'))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    Some(match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_string(),
    })
}

fn resolve_ids(
    names: Option<Vec<NameOrId>>,
    lookup: fn(&str) -> Result<u32, String>,
) -> anyhow::Result<Option<Vec<u32>>> {
    let Some(names) = names else { return Ok(None) };
    names
        .into_iter()
        .map(|entry| match entry {
            NameOrId::Id(id) => Ok(id),
            NameOrId::Name(name) => lookup(&name).map_err(anyhow::Error::msg),
        })
        .collect::<anyhow::Result<Vec<u32>>>()
        .map(Some)
}

fn user_id(name: &str) -> Result<u32, String> {
    if let Ok(id) = name.parse() {
        return Ok(id);
    }
    match nix::unistd::User::from_name(name) {
        Ok(Some(user)) => Ok(user.uid.as_raw()),
        _ => Err(format!("[access] force_users: no user named {name:?}")),
    }
}

fn group_id(name: &str) -> Result<u32, String> {
    if let Ok(id) = name.parse() {
        return Ok(id);
    }
    match nix::unistd::Group::from_name(name) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        _ => Err(format!("no group named {name:?}")),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FileConfig, String> {
        toml::from_str(text).map_err(|e| describe_error(Path::new("/etc/r.toml"), text, &e))
    }

    #[test]
    fn a_full_file_parses() {
        let file = parse(
            "socket = \"/run/x.sock\"\nsocket_mode = \"0600\"\nbackend = \"s3://b/p\"\n\
             ttl = \"10s\"\non_unavailable = \"warn\"\npoll_interval = \"2s\"\nmetrics = \"127.0.0.1:9464\"\n\
             log_format = \"json\"\nlegacy_meltano_systemdb = \"/m/meltano.db\"\n[access]\nforce_users = [\"root\", 1000]\n\
             force_groups = [0]\n[limits]\nconnections = 50\nhandshake_timeout = \"2s\"\n[s3]\nregion = \"eu-west-1\"\n\
             [azure]\naccount_name = \"acct1\"\naccount_key = \"a2V5\"\n\
             [gcs]\ncredentials_file = \"/etc/runlock/gcs-key.json\"\n\
             [postgres]\nschema = \"locks\"\nlisten = false\n\
             [etcd]\nuser = \"ops\"\npassword = \"pa55\"\n",
        )
        .expect("parses");
        assert_eq!(file.socket_mode, Some(0o600));
        assert_eq!(file.ttl, Some(Duration::from_secs(10)));
        assert_eq!(file.on_unavailable, Some(OnUnavailable::Warn));
        assert_eq!(file.poll_interval, Some(Duration::from_secs(2)));
        assert_eq!(file.log_format, Some(LogFormat::Json));
        assert_eq!(
            file.legacy_meltano_systemdb.as_ref().map(Secret::expose),
            Some("/m/meltano.db")
        );
        let limits = file.limits.resolve().expect("valid limits");
        assert_eq!(limits.connections, 50);
        assert_eq!(limits.connections_per_user, 128);
        assert_eq!(limits.handshake_timeout, Duration::from_secs(2));
        assert_eq!(file.s3.region.as_deref(), Some("eu-west-1"));
        assert_eq!(file.azure.account_name.as_deref(), Some("acct1"));
        assert_eq!(
            file.gcs.credentials_file.as_deref(),
            Some(Path::new("/etc/runlock/gcs-key.json"))
        );
        assert_eq!(file.postgres.schema.as_deref(), Some("locks"));
        assert_eq!(file.postgres.listen, Some(false));
        assert_eq!(file.etcd.user.as_deref(), Some("ops"));
        let password = file.etcd.password.as_ref();
        assert_eq!(password.map(Secret::expose), Some("pa55"));
        assert_eq!(
            password.map(ToString::to_string).as_deref(),
            Some("<redacted>")
        );
    }

    #[test]
    fn the_configuration_shows_no_secret_it_holds() {
        let password = "pa55w0rd-in-uri";
        let args = Args::parse_from([
            "runlockd",
            "--socket",
            "/tmp/runlock-config-test.sock",
            "--backend",
            &format!("postgresql://u:{password}@db/x"),
            "--legacy-meltano-systemdb",
            &format!("postgresql://m:{password}@db/meltano"),
        ]);
        assert!(!format!("{args:?}").contains(password));
        let mut config = Config::load(&args).expect("loads");
        assert!(!format!("{config:?}").contains(password));
        assert!(!config.to_redacted_toml().contains(password));
        // An Azure SAS, as a setting or pasted into the account URL.
        let azure = &mut config.backend_options.azure;
        azure.sas_token = Some(format!("sv=2022-11-02&sig={password}").into());
        azure.account_url = Some(format!(
            "https://a.blob.core.windows.net/?sv=1&sig={password}"
        ));
        let shown = config.to_redacted_toml();
        assert!(!shown.contains(password), "{shown}");
        assert!(
            shown.contains("https://a.blob.core.windows.net/?sv=1&sig=***"),
            "{shown}"
        );
        assert_eq!(
            config.backend.expose(),
            format!("postgresql://u:{password}@db/x")
        );
    }

    #[test]
    fn an_unknown_setting_names_file_line_and_setting() {
        let err = parse("ttl = \"10s\"\n\n[access]\nforce_user = [0]\n").expect_err("unknown");
        assert!(
            err.starts_with("/etc/r.toml:4: `access.force_user`: unknown field"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_value_names_file_line_and_setting() {
        let err = parse("backend = \"memory://\"\nttl = \"2 days\"\n").expect_err("bad ttl");
        assert!(err.starts_with("/etc/r.toml:2: `ttl`: "), "{err}");
        assert!(err.contains("outside 1s..24h"), "{err}");
        let err = parse("on_unavailable = \"maybe\"\n").expect_err("bad policy");
        assert!(
            err.starts_with("/etc/r.toml:1: `on_unavailable`: "),
            "{err}"
        );
        assert!(err.contains("fail, warn, skip"), "{err}");
        let err = parse("poll_interval = \"10ms\"\n").expect_err("too often");
        assert!(
            err.starts_with("/etc/r.toml:1: `poll_interval`: ") && err.contains("50ms..60s"),
            "{err}"
        );
        let err = parse("socket_mode = \"999\"\n").expect_err("bad mode");
        assert!(err.contains("octal"), "{err}");
    }

    #[test]
    fn the_drain_timeout_is_read_within_its_bounds() {
        let file = parse("drain_timeout = \"0s\"\n").expect("no drain at all");
        assert_eq!(file.drain_timeout, Some(Duration::ZERO));
        let file = parse("drain_timeout = \"10m\"\n").expect("the longest");
        assert_eq!(file.drain_timeout, Some(Duration::from_secs(600)));
        let err = parse("drain_timeout = \"11m\"\n").expect_err("too long");
        assert!(
            err.starts_with("/etc/r.toml:1: `drain_timeout`: ") && err.contains("0s..10m"),
            "{err}"
        );
    }
}
