//! Where and how to reach PostgreSQL, as libpq would: a `postgresql://` (or
//! `postgres://`) URI, libpq's `PG*` environment variables for whatever it
//! leaves out, and TLS as `sslmode` asks. tokio-postgres parses the result; it
//! knows neither the variables nor `verify-ca`/`verify-full`/`sslrootcert`,
//! which are read here.

use super::link::Link;
use super::tls::{self, SslMode};
use crate::backend::StoreContext;
use std::error::Error as _;
use std::fmt::Write as _;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

/// Connecting (TCP, TLS and login) may take this long, unless the URI says otherwise.
const CONNECT_TIMEOUT: Duration = crate::backend::retry::TIMEOUTS.connect;
/// A dead peer is noticed within about idle + interval × retries = 5 + 3 × 1 s,
/// and unacknowledged writes give up after `TCP_USER_TIMEOUT`.
const KEEPALIVES_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVES_RETRIES: u32 = 3;
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(8);
/// libpq's socket directory on Debian; upstream's default is /tmp.
const SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];

/// libpq parameters read here rather than by tokio-postgres.
const OURS: [&str; 8] = [
    "host",
    "port",
    "user",
    "password",
    "dbname",
    "sslmode",
    "sslrootcert",
    "options",
];

/// A connection to drive, as [`Settings::connect`] opens it.
pub type Connection =
    tokio_postgres::Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

/// Whether `err` is a pooler's refusal of the `options` startup parameter
/// (PgBouncer: "unsupported startup parameter: options").
fn refuses_options(err: &tokio_postgres::Error) -> bool {
    err.as_db_error().is_some_and(|db| {
        db.message().contains("unsupported startup parameter") && db.message().contains("options")
    })
}

/// Where the login's password came from, the first of libpq's places that has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PasswordSource {
    /// The URI's userinfo (`user:password@`).
    Uri,
    /// The URI's `?password=` parameter.
    UriParameter,
    /// `PGPASSWORD`.
    Environment,
    /// None: the server lets the user in without one (trust, peer, a client certificate).
    None,
}

impl PasswordSource {
    /// What `check-config` says of it; never the password.
    pub fn describe(self) -> &'static str {
        match self {
            PasswordSource::Uri => "password from the URI (redacted)",
            PasswordSource::UriParameter => "password from the URI's password parameter (redacted)",
            PasswordSource::Environment => "password from PGPASSWORD",
            PasswordSource::None => {
                "no password (the server must let the user in: trust, peer or a client certificate)"
            }
        }
    }
}

/// A resolved connection target. It holds the password: it is never printed,
/// and messages name it by [`Settings::shown`].
#[derive(Clone)]
pub struct Settings {
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    ssl_mode: SslMode,
    shown: String,
    password_source: PasswordSource,
    /// `config` without the statement timeout this module adds: for a pooler
    /// such as PgBouncer, which refuses the `options` startup parameter.
    pooled_config: Option<tokio_postgres::Config>,
    /// Whether the server refused that parameter: a pooler is in front, and
    /// every connection from then on is made with `pooled_config`.
    behind_pooler: Arc<AtomicBool>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Settings").field(&self.shown).finish()
    }
}

/// Where a message says the server is, and as whom.
fn show(hosts: &[(String, Option<u16>)], default_port: u16, dbname: &str, user: &str) -> String {
    let places: Vec<String> = hosts
        .iter()
        .map(|(host, port)| {
            let port = port.unwrap_or(default_port);
            if host.starts_with('/') {
                format!("{host}/.s.PGSQL.{port}")
            } else if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        })
        .collect();
    format!("{} (database {dbname:?}, user {user:?})", places.join(","))
}

fn decode(text: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| "a percent-encoded part is not UTF-8".to_string())
}

/// A libpq key/value connection string value, quoted.
fn quote(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('\'');
    for c in value.chars() {
        if c == '\'' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('\'');
    quoted
}

/// The parts of a URI, percent-decoded: `[user[:password]@][host[:port][,...]][/dbname][?k=v&...]`.
#[derive(Debug, Default, PartialEq, Eq)]
struct UriParts {
    user: Option<String>,
    password: Option<String>,
    hosts: Vec<(String, Option<u16>)>,
    dbname: Option<String>,
    params: Vec<(String, String)>,
}

fn split_uri(uri: &str) -> Result<UriParts, String> {
    let rest = uri
        .strip_prefix("postgresql://")
        .or_else(|| uri.strip_prefix("postgres://"))
        .ok_or("it does not start with postgresql:// or postgres://")?;
    // The userinfo first, as `redact_uri` hides it: a password may hold `/` or `?`.
    let (userinfo, rest) = crate::backend::split_userinfo(rest);
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (hostspec, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut parts = UriParts::default();
    if let Some(userinfo) = userinfo {
        let (user, password) = match userinfo.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (userinfo, None),
        };
        parts.user = Some(decode(user)?).filter(|u| !u.is_empty());
        parts.password = password.map(decode).transpose()?;
    }
    if !hostspec.is_empty() {
        for chunk in hostspec.split(',') {
            let (host, port) = match chunk.strip_prefix('[') {
                Some(v6) => {
                    let (host, after) = v6.split_once(']').ok_or("an IPv6 host lacks its ']'")?;
                    (host, after.strip_prefix(':'))
                }
                None => match chunk.rsplit_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (chunk, None),
                },
            };
            let port = match port.filter(|p| !p.is_empty()) {
                Some(port) => Some(
                    port.parse::<u16>()
                        .map_err(|_| format!("port {port:?} is not a number"))?,
                ),
                None => None,
            };
            parts.hosts.push((decode(host)?, port));
        }
    }
    parts.dbname = Some(decode(path)?).filter(|d| !d.is_empty());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        parts.params.push((decode(key)?, decode(value)?));
    }
    Ok(parts)
}

/// The OS user's name, libpq's default user.
fn os_user() -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.name)
}

impl Settings {
    /// Resolves `uri` with the process environment. `statement_timeout`, if
    /// given, is set for the session so that the server gives up on a
    /// statement that waits too long (a lock held by a stuck transaction).
    pub fn from_uri(uri: &str, statement_timeout: Option<Duration>) -> Result<Settings, String> {
        Settings::resolve(
            uri,
            statement_timeout,
            &|name| std::env::var(name).ok().filter(|v| !v.is_empty()),
            std::env::var_os("HOME").as_deref().map(Path::new),
        )
    }

    /// Resolves `uri` with `env` standing for the environment and `home` for `$HOME`.
    fn resolve(
        uri: &str,
        statement_timeout: Option<Duration>,
        env: &dyn Fn(&str) -> Option<String>,
        home: Option<&Path>,
    ) -> Result<Settings, String> {
        let parts = split_uri(uri)?;
        let param = |name: &str| {
            parts
                .params
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let mut hosts = parts.hosts.clone();
        if hosts.iter().all(|(h, _)| h.is_empty()) {
            hosts.clear();
            let listed = param("host").or_else(|| env("PGHOST"));
            let listed = listed.unwrap_or_else(|| {
                let dir = SOCKET_DIRS.into_iter().find(|d| Path::new(d).is_dir());
                dir.unwrap_or(SOCKET_DIRS[1]).to_string()
            });
            hosts.extend(listed.split(',').map(|h| (h.to_string(), None)));
        }
        let ports: Vec<u16> = match param("port").or_else(|| env("PGPORT")) {
            Some(list) => list
                .split(',')
                .map(|p| p.trim().parse::<u16>())
                .collect::<Result<_, _>>()
                .map_err(|_| format!("port {list:?} is not a number"))?,
            None => vec![],
        };
        let default_port = match ports.as_slice() {
            [one] => *one,
            _ => 5432,
        };
        if ports.len() > 1 && ports.len() == hosts.len() {
            for ((_, port), listed) in hosts.iter_mut().zip(&ports) {
                port.get_or_insert(*listed);
            }
        } else if ports.len() > 1 {
            return Err(format!(
                "{} ports are given for {} hosts",
                ports.len(),
                hosts.len()
            ));
        }
        let user = parts
            .user
            .clone()
            .or_else(|| param("user"))
            .or_else(|| env("PGUSER"))
            .or_else(os_user)
            .ok_or("no user is given (the URI, PGUSER) and the OS user has no name")?;
        let (password, password_source) = match (parts.password.clone(), param("password")) {
            (Some(password), _) => (Some(password), PasswordSource::Uri),
            (None, Some(password)) => (Some(password), PasswordSource::UriParameter),
            (None, None) => match env("PGPASSWORD") {
                Some(password) => (Some(password), PasswordSource::Environment),
                None => (None, PasswordSource::None),
            },
        };
        let dbname = parts
            .dbname
            .clone()
            .or_else(|| param("dbname"))
            .or_else(|| env("PGDATABASE"))
            .unwrap_or_else(|| user.clone());
        let ssl_mode: SslMode = param("sslmode")
            .or_else(|| env("PGSSLMODE"))
            .map_or(Ok(SslMode::Prefer), |m| m.parse())?;
        let root_cert = param("sslrootcert").or_else(|| env("PGSSLROOTCERT"));
        let theirs = param("options").or_else(|| env("PGOPTIONS"));
        let ours = statement_timeout.map(|t| format!("-c statement_timeout={}", t.as_millis()));

        let mut text = String::new();
        let mut add = |key: &str, value: &str| {
            let _ = write!(text, "{key}={} ", quote(value));
        };
        let host_list: Vec<&str> = hosts.iter().map(|(h, _)| h.as_str()).collect();
        add("host", &host_list.join(","));
        let port_list: Vec<String> = hosts
            .iter()
            .map(|(_, p)| p.unwrap_or(default_port).to_string())
            .collect();
        add("port", &port_list.join(","));
        add("user", &user);
        if let Some(password) = &password {
            add("password", password);
        }
        add("dbname", &dbname);
        add("sslmode", ssl_mode.tokio_postgres_name());
        let given = |name: &str| parts.params.iter().any(|(k, _)| k == name);
        if !given("application_name") {
            add(
                "application_name",
                &env("PGAPPNAME").unwrap_or_else(|| "runlockd".to_string()),
            );
        }
        if !given("connect_timeout") {
            let secs =
                env("PGCONNECT_TIMEOUT").unwrap_or_else(|| CONNECT_TIMEOUT.as_secs().to_string());
            add("connect_timeout", &secs);
        }
        for (key, value) in parts
            .params
            .iter()
            .filter(|(k, _)| !OURS.contains(&k.as_str()))
        {
            add(key, value);
        }
        let with_options = |options: Option<String>| {
            let mut text = text.clone();
            if let Some(options) = options {
                let _ = write!(text, "options={} ", quote(&options));
            }
            // tokio-postgres's cause names an unknown option, or which option has a bad value.
            let mut config =
                tokio_postgres::Config::from_str(&text).map_err(|err| match err.source() {
                    Some(cause) => format!("{err}: {cause}"),
                    None => err.to_string(),
                })?;
            if !given("keepalives_idle") {
                config.keepalives_idle(KEEPALIVES_IDLE);
            }
            if !given("keepalives_interval") {
                config.keepalives_interval(KEEPALIVES_INTERVAL);
            }
            if !given("keepalives_retries") {
                config.keepalives_retries(KEEPALIVES_RETRIES);
            }
            if !given("tcp_user_timeout") {
                config.tcp_user_timeout(TCP_USER_TIMEOUT);
            }
            Ok::<_, String>(config)
        };
        let config = with_options(match (&theirs, &ours) {
            (Some(theirs), Some(ours)) => Some(format!("{theirs} {ours}")),
            (theirs, ours) => theirs.clone().or_else(|| ours.clone()),
        })?;
        let pooled_config = match ours {
            Some(_) => Some(with_options(theirs)?),
            None => None,
        };
        let tls = tls::connector(ssl_mode, root_cert.as_deref(), home)?;
        Ok(Settings {
            config,
            tls,
            ssl_mode,
            shown: show(&hosts, default_port, &dbname, &user),
            password_source,
            pooled_config,
            behind_pooler: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The server, database and user, for messages: never the password.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Where the password came from, for `check-config`.
    pub fn password_source(&self) -> PasswordSource {
        self.password_source
    }

    /// The database's name.
    pub fn dbname(&self) -> &str {
        self.config.get_dbname().unwrap_or_default()
    }

    /// The user's name.
    pub fn user(&self) -> &str {
        self.config.get_user().unwrap_or_default()
    }

    /// The TLS mode asked for.
    pub fn ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }

    /// Whether a connection pooler (PgBouncer) is known to be in front of
    /// the server: it refused the statement timeout as a startup parameter.
    /// Session state (`LISTEN`, `SET`) does not outlive a transaction there.
    pub fn behind_pooler(&self) -> bool {
        self.behind_pooler.load(Ordering::Relaxed)
    }

    /// Opens a connection; the caller drives the returned connection. A
    /// pooler that refuses the statement timeout is connected to without it
    /// (the server then keeps the role's own `statement_timeout`).
    pub async fn connect(&self) -> Result<(Client, Connection), tokio_postgres::Error> {
        let pooled = self.pooled_config.as_ref();
        if let Some(pooled) = pooled.filter(|_| self.behind_pooler()) {
            return pooled.connect(self.tls.clone()).await;
        }
        let err = match self.config.connect(self.tls.clone()).await {
            Ok(connected) => return Ok(connected),
            Err(err) => err,
        };
        let Some(pooled) = pooled.filter(|_| refuses_options(&err)) else {
            return Err(err);
        };
        if !self.behind_pooler.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                server = %self.shown,
                "the server refused the startup parameter `options` (a connection pooler \
                 such as PgBouncer?): connecting without runlock's statement timeout; set \
                 one on the role instead (ALTER ROLE … SET statement_timeout = '3s')"
            );
        }
        pooled.connect(self.tls.clone()).await
    }

    /// Opens a connection driven by a task of `context`'s, which ends when
    /// the connection does, or at closing. Errors name the server and the
    /// cause, never the password.
    pub async fn link(&self, context: &StoreContext) -> Result<Link, String> {
        let (client, connection) = self.connect().await.map_err(|err| {
            super::errors::classify(&err, self, context.observer.as_ref()).message()
        })?;
        let driver = context.spawn_until_closing(async move {
            if let Err(err) = connection.await {
                tracing::debug!("PostgreSQL connection ended: {err}");
            }
        });
        Ok(Link::new(client, driver.abort_handle()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::config::Host;

    fn resolve(uri: &str, env: &[(&str, &str)]) -> Result<Settings, String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::resolve(
            uri,
            None,
            &|name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
            None,
        )
    }

    /// Where a resolved setting points, and as whom.
    struct Target {
        host: &'static str,
        port: u16,
        user: &'static str,
        password: &'static str,
        dbname: &'static str,
        ssl_mode: SslMode,
    }

    impl Target {
        fn assert_is(&self, settings: &Settings) {
            assert_eq!(hosts(settings), [self.host]);
            assert_eq!(settings.config.get_ports(), [self.port]);
            assert_eq!(settings.user(), self.user);
            assert_eq!(
                settings.config.get_password(),
                Some(self.password.as_bytes())
            );
            assert_eq!(settings.dbname(), self.dbname);
            assert_eq!(settings.ssl_mode(), self.ssl_mode);
        }
    }

    fn hosts(settings: &Settings) -> Vec<String> {
        settings
            .config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            })
            .collect()
    }

    #[test]
    fn the_uri_wins_and_the_environment_fills_in_the_rest() {
        let env = [
            ("PGHOST", "envhost"),
            ("PGPORT", "6543"),
            ("PGUSER", "envuser"),
            ("PGPASSWORD", "envpass"),
            ("PGDATABASE", "envdb"),
            ("PGSSLMODE", "disable"),
        ];
        let all_env = resolve("postgresql://", &env).expect("parses");
        let envs = Target {
            host: "envhost",
            port: 6543,
            user: "envuser",
            password: "envpass",
            dbname: "envdb",
            ssl_mode: SslMode::Disable,
        };
        envs.assert_is(&all_env);
        assert_eq!(
            all_env.shown(),
            "envhost:6543 (database \"envdb\", user \"envuser\")"
        );

        let uri = resolve(
            "postgres://u:p%40ss@db.example:5433/meltano?sslmode=require&application_name=x",
            &env,
        )
        .expect("parses");
        let uris = Target {
            host: "db.example",
            port: 5433,
            user: "u",
            password: "p@ss",
            dbname: "meltano",
            ssl_mode: SslMode::Require,
        };
        uris.assert_is(&uri);
        assert_eq!(uri.config.get_application_name(), Some("x"));

        // A host without a port takes PGPORT, as libpq does.
        let no_port = resolve("postgresql://db.example/m", &env).expect("parses");
        assert_eq!(no_port.config.get_ports(), [6543]);
    }

    #[test]
    fn defaults_are_libpqs() {
        let settings = resolve("postgresql:///meltano?user=etl", &[]).expect("parses");
        let host = hosts(&settings);
        assert!(
            host[0].starts_with('/'),
            "a Unix socket directory: {host:?}"
        );
        assert_eq!(settings.config.get_ports(), [5432]);
        assert_eq!(settings.dbname(), "meltano");
        assert_eq!(settings.ssl_mode(), SslMode::Prefer);
        assert_eq!(settings.config.get_application_name(), Some("runlockd"));
        assert!(settings.config.get_keepalives());
        assert_eq!(settings.config.get_keepalives_idle(), KEEPALIVES_IDLE);
        assert_eq!(
            settings.config.get_connect_timeout(),
            Some(&CONNECT_TIMEOUT)
        );
        // The database defaults to the user's name.
        let settings = resolve("postgresql://h?user=etl", &[]).expect("parses");
        assert_eq!(settings.dbname(), "etl");
    }

    #[test]
    fn several_hosts_sockets_and_ipv6_parse() {
        let settings = resolve("postgresql://u@a:1,[::1]:2,%2Frun%2Fpg/d", &[]).expect("parses");
        assert_eq!(hosts(&settings), ["a", "::1", "/run/pg"]);
        assert_eq!(settings.config.get_ports(), [1, 2, 5432]);
        assert!(settings
            .shown()
            .starts_with("a:1,[::1]:2,/run/pg/.s.PGSQL.5432"));
    }

    #[test]
    fn the_statement_timeout_joins_the_users_options() {
        let settings = Settings::resolve(
            "postgresql://h/d?user=u&options=-c%20search_path%3Dx",
            Some(Duration::from_secs(4)),
            &|_| None,
            None,
        )
        .expect("parses");
        assert_eq!(
            settings.config.get_options(),
            Some("-c search_path=x -c statement_timeout=4000")
        );
        // Behind a pooler that refuses startup options, only the user's go.
        let pooled = settings.pooled_config.as_ref().expect("a pooled form");
        assert_eq!(pooled.get_options(), Some("-c search_path=x"));
        assert_eq!(pooled.get_application_name(), Some("runlockd"));
        let plain = Settings::resolve("postgresql://h/d?user=u", None, &|_| None, None);
        assert!(plain.expect("parses").pooled_config.is_none());
    }

    #[test]
    fn bad_uris_are_named_without_their_password() {
        for (uri, says) in [
            ("mysql://u:pa55@h/d", "postgresql://"),
            ("postgresql://u:pa55@h:port/d", "not a number"),
            ("postgresql://u:pa55@h/d?sslmode=sometimes", "sslmode"),
            ("postgresql://u:pa55@h/d?nonsense=1", "nonsense"),
            (
                "postgresql://u:pa55@h/d?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
                "/nonexistent/ca.pem",
            ),
        ] {
            let err = resolve(uri, &[]).expect_err(uri);
            assert!(err.contains(says), "{uri}: {err}");
            assert!(!err.contains("pa55"), "{uri}: {err}");
        }
        let settings = resolve("postgresql://u:pa55@h/d", &[]).expect("parses");
        assert!(!format!("{settings:?}").contains("pa55"));
    }

    #[test]
    fn the_password_source_is_the_first_place_holding_one() {
        let source = |uri: &str, env: &[(&str, &str)]| {
            resolve(uri, env).expect("resolves").password_source()
        };
        let env = [("PGPASSWORD", "envpass")];
        assert_eq!(source("postgresql://u:p@h/d", &env), PasswordSource::Uri);
        assert_eq!(
            source("postgresql://u@h/d?password=p", &env),
            PasswordSource::UriParameter
        );
        assert_eq!(
            source("postgresql://u@h/d", &env),
            PasswordSource::Environment
        );
        assert_eq!(source("postgresql://u@h/d", &[]), PasswordSource::None);
    }

    #[test]
    fn a_password_may_hold_any_character_unencoded() {
        for password in ["pa/ss", "p?w", "p#w", "p:w", "p@w", "a/b?c#d:e@f"] {
            let uri = format!("postgresql://u:{password}@h:6543/d?sslmode=disable");
            let settings = resolve(&uri, &[]).map_err(|e| format!("{uri}: {e}"));
            let settings = settings.expect("parses");
            assert_eq!(settings.config.get_password(), Some(password.as_bytes()));
            assert_eq!(
                (hosts(&settings), settings.config.get_ports().to_vec()),
                (vec!["h".to_string()], vec![6543])
            );
            assert_eq!((settings.user(), settings.dbname()), ("u", "d"));
            assert_eq!(settings.ssl_mode(), SslMode::Disable);
            assert!(!settings.shown().contains(password), "{}", settings.shown());
        }
        // An `@` in a query value, with no userinfo, stays in the query.
        let settings = resolve("postgresql://h/d?application_name=a@b", &[]).expect("parses");
        assert_eq!(
            (hosts(&settings), settings.dbname()),
            (vec!["h".to_string()], "d")
        );
    }
}
