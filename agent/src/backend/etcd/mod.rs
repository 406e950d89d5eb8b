//! `etcd://host:port[,host:port]/prefix`: each held key is an etcd key under
//! `prefix/`, attached to an etcd lease of its own. Native semantics, not the
//! object-store engine:
//!
//! - acquire: grant a lease of TTL + grace (by etcd's clock), then one
//!   transaction: if the key does not exist, put it with that lease, else read
//!   it (the holder). `--force` deletes the key if it is unchanged since that
//!   read, revokes its lease, and creates the key again.
//! - the fencing token is the key's create revision: the store revision of the
//!   transaction that granted it. etcd's revision is one counter for the whole
//!   keyspace that only grows and is persisted, and every acquisition creates
//!   the key anew, so each grant's token is larger than every earlier grant's
//!   of that key, whichever agent made it, across agent and etcd restarts. Only
//!   a new cluster, or a restore from an older backup, counts from the start.
//! - renew: keep the lease alive, and read the key to see that it is still
//!   attached to that lease with that create revision (a `--force` elsewhere
//!   replaces it).
//! - release: revoke the lease; etcd deletes the key with it, atomically, and
//!   only if the key is still attached to it.
//! - a holder whose agent dies stops keeping its lease alive, and etcd deletes
//!   the key when the lease runs out, by etcd's own clock.
//! - waiters: one watch on the prefix reports deleted keys (`releases`).
//!
//! No message built here carries the password: etcd's own messages never
//! echo it, and the endpoints are kept without userinfo.

use super::{key_name, AcquireSpec, Adopted, Backend, BackendError, Capabilities, Grant, LeaseRef};
mod tls;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions,
    TlsOptions, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use runlock_protocol::{timing, Holder, Key, KeyRecord, KeyState, Scope};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// etcd's client port, when the URI names none.
const DEFAULT_PORT: u16 = 2379;
/// The key prefix when the URI names none.
const DEFAULT_PREFIX: &str = "runlock";
/// Connecting to etcd may take this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One request may take this long.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
/// One operation, retries included, may take this long: a hung etcd never blocks for longer.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests per operation when etcd cannot be reached (each within the operation's bound).
const ATTEMPTS: u32 = 3;
/// How often a forced acquire may find the key taken again between its delete and its create.
const FORCE_ATTEMPTS: usize = 4;
/// HTTP/2 pings find a dead connection (the watch's, above all); etcd refuses
/// pings more often than every 5 s.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// Released keys queued for a slow waiter before it is told it missed some.
const RELEASED_BACKLOG: usize = 256;

const GRPC_CANCELLED: i32 = 1;
const GRPC_DEADLINE_EXCEEDED: i32 = 4;
const GRPC_PERMISSION_DENIED: i32 = 7;
const GRPC_RESOURCE_EXHAUSTED: i32 = 8;
const GRPC_ABORTED: i32 = 10;
const GRPC_UNAVAILABLE: i32 = 14;

/// The configuration file's `[etcd]` settings. Without them, the URI's
/// userinfo or etcdctl's own `ETCDCTL_USER` / `ETCDCTL_PASSWORD` are used.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdOptions {
    /// The etcd user, where etcd has authentication enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Its password: never printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// The CA that signed etcd's certificate (PEM); turns TLS on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// A client certificate (PEM), for etcd's `--client-cert-auth`; turns TLS on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

impl EtcdOptions {
    /// The options with the password replaced, for printing.
    pub fn redacted(&self) -> EtcdOptions {
        EtcdOptions {
            password: self.password.as_ref().map(|_| "<redacted>".into()),
            ..self.clone()
        }
    }
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = self.redacted();
        f.debug_struct("EtcdOptions")
            .field("user", &shown.user)
            .field("password", &shown.password)
            .field("ca_file", &shown.ca_file)
            .field("cert_file", &shown.cert_file)
            .field("key_file", &shown.key_file)
            .finish()
    }
}

/// What an `etcd://` URI names (no `Debug`: it may hold a password).
struct Target {
    /// `host:port` each.
    hosts: Vec<String>,
    /// Ends with `/`.
    prefix: String,
    /// From the URI's userinfo; the password may be absent.
    user: Option<(String, Option<String>)>,
    /// Whether waiters are woken by a watch (`?watch=false` leaves them to polling).
    watch: bool,
    /// `?tls=true`: TLS even without certificate files (the system's roots).
    tls: bool,
}

fn parse_uri(uri: &str) -> anyhow::Result<Target> {
    let shown = super::redact_uri(uri);
    let rest = uri
        .strip_prefix("etcd://")
        .ok_or_else(|| anyhow::anyhow!("{shown:?} is not an etcd:// URI"))?;
    // The userinfo first, as `redact_uri` hides it: a password may hold `/` or `?`.
    let (userinfo, rest) = super::split_userinfo(rest);
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    let hosts = hosts
        .split(',')
        .map(|host| {
            if host.is_empty() {
                anyhow::bail!("{shown:?} names no etcd host (etcd://host:port/prefix)");
            }
            // `[v6]` or a name without a port gets etcd's; a given port must be a number.
            match host.rsplit_once(':').filter(|(h, _)| !h.ends_with(':')) {
                Some((name, port)) if !host.ends_with(']') => {
                    port.parse::<u16>()
                        .map_err(|_| anyhow::anyhow!("{shown:?}: {port:?} is not a port number"))?;
                    Ok(format!("{name}:{port}"))
                }
                _ => Ok(format!("{host}:{DEFAULT_PORT}")),
            }
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let user = match userinfo {
        None => None,
        Some(info) => {
            let (name, password) = match info.split_once(':') {
                Some((name, password)) => (name, Some(percent_decode(password)?)),
                None => (info, None),
            };
            Some((percent_decode(name)?, password))
        }
    };
    let (mut watch, mut tls) = (true, false);
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        match pair.split_once('=') {
            Some(("watch", "false")) => watch = false,
            Some(("watch", "true")) => watch = true,
            Some(("tls", "false")) => tls = false,
            Some(("tls", "true")) => tls = true,
            // Only the name: a value is not for the log, whatever was put in it.
            _ => anyhow::bail!(
                "{shown:?}: unknown setting {:?} (there are watch=false and tls=true)",
                pair.split_once('=').map_or(pair, |(name, _)| name)
            ),
        }
    }
    let prefix = match path.trim_matches('/') {
        "" => DEFAULT_PREFIX,
        given => given,
    };
    Ok(Target {
        hosts,
        prefix: format!("{prefix}/"),
        user,
        watch,
        tls,
    })
}

/// `%XX` escapes in a URI's userinfo (a password may hold `@` or `:`).
fn percent_decode(text: &str) -> anyhow::Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| anyhow::anyhow!("the etcd URI's userinfo has a bad % escape"))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| anyhow::anyhow!("the etcd URI's userinfo is not UTF-8"))
}

/// Who to authenticate as: the URI's userinfo, else `[etcd]`, else etcdctl's variables.
fn credentials(
    from_uri: Option<(String, Option<String>)>,
    options: &EtcdOptions,
) -> anyhow::Result<Option<(String, String)>> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (user, password) = match (from_uri, &options.user) {
        (Some((user, password)), _) => (user, password.or_else(|| options.password.clone())),
        (None, Some(user)) => (user.clone(), options.password.clone()),
        (None, None) => match env("ETCDCTL_USER") {
            // etcdctl's form: `user` or `user:password`.
            Some(given) => match given.split_once(':') {
                Some((user, password)) => (user.to_string(), Some(password.to_string())),
                None => (given, None),
            },
            None => return Ok(None),
        },
    };
    let password = password.or_else(|| env("ETCDCTL_PASSWORD"));
    match password {
        Some(password) => Ok(Some((user, password))),
        None => anyhow::bail!(
            "etcd user {user:?} has no password: give it in the URI (etcd://user:password@host/prefix), \
             as [etcd] password, or in ETCDCTL_PASSWORD"
        ),
    }
}

/// The etcd lease TTL for a runlock TTL: others may take the key only after
/// TTL + grace by etcd's clock, the same margin the object stores give (see
/// `renewal::deadline`). etcd counts whole seconds.
fn lease_seconds(ttl: Duration) -> i64 {
    (ttl + timing::grace(ttl)).as_secs_f64().ceil() as i64
}

/// A key's value in etcd: readable with `etcdctl get --prefix -w json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct EtcdRecord {
    /// The key.
    key: String,
    /// Always `held`: a free key has no record.
    state: KeyState,
    /// The holding lease's id (runlock's, not etcd's: that is the key's `lease`).
    lease_id: String,
    /// The holder's TTL in milliseconds.
    ttl_ms: u64,
    /// The holder, without its token: the token is the key's create revision,
    /// which is known only once the key is written.
    holder: serde_json::Map<String, serde_json::Value>,
}

impl EtcdRecord {
    fn new(spec: &AcquireSpec) -> EtcdRecord {
        let mut holder = match serde_json::to_value(&spec.holder) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(), // invariant: a Holder serializes to an object
        };
        holder.remove("token");
        EtcdRecord {
            key: spec.key.to_string(),
            state: KeyState::Held,
            lease_id: spec.lease_id.clone(),
            ttl_ms: spec.ttl.as_millis() as u64,
            holder,
        }
    }

    fn body(&self) -> Vec<u8> {
        // invariant: plain strings, numbers and a JSON map always serialize
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The holder, with the token it was granted (the key's create revision).
    fn holder(&self, token: u64) -> Option<Holder> {
        let mut holder = self.holder.clone();
        holder.insert("token".into(), token.into());
        serde_json::from_value(serde_json::Value::Object(holder)).ok()
    }
}

/// What a force writes: the key's name, its marker's, the record, the lease.
#[derive(Clone, Copy)]
struct Forced<'a> {
    name: &'a str,
    marker: &'a str,
    body: &'a [u8],
    lease: i64,
}

/// A granted etcd lease and when its grant was sent: the lease's clock starts there.
#[derive(Debug, Clone, Copy)]
struct EtcdLease {
    id: i64,
    seconds: i64,
    sent: Instant,
}

/// Why one request failed.
#[derive(Debug)]
enum Problem {
    /// Not reachable, no leader, timed out: worth another attempt.
    Transient(String),
    /// The lease does not exist (any more).
    LeaseGone,
    /// Refused: credentials or permissions; another attempt would not help.
    Refused(String),
    /// Anything else etcd answered.
    Other(String),
}

/// The client, made at first use (with authentication, making it is a request).
struct Connection {
    endpoints: Vec<String>,
    user: Option<(String, String)>,
    client: tokio::sync::Mutex<Option<Client>>,
    /// `None` for plain HTTP.
    tls: Option<TlsOptions>,
    /// `etcd at host:port,…`, for messages.
    place: String,
    prefix: String,
}

impl Connection {
    async fn client(&self) -> Result<Client, etcd_client::Error> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref() {
            return Ok(client.clone());
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(ATTEMPT_TIMEOUT)
            .with_keep_alive(PING_INTERVAL, PING_TIMEOUT);
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls.clone());
        }
        if let Some((user, password)) = &self.user {
            // Tokens expire (etcd's --auth-token-ttl): get a new one when refused.
            options = options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        let client = Client::connect(&self.endpoints, Some(options)).await?;
        *slot = Some(client.clone());
        Ok(client)
    }

    fn who(&self) -> String {
        match &self.user {
            Some((user, _)) => format!("user {user:?}"),
            None => "a client without a user".to_string(),
        }
    }

    fn classify(&self, err: etcd_client::Error) -> Problem {
        use etcd_client::Error as E;
        match err {
            E::GRpcStatus(status) if tls_refused(&cause_of(&status, status.message())) => {
                self.tls_refusal(&cause_of(&status, status.message()))
            }
            E::GRpcStatus(status) if status.message() == "transport error" => {
                Problem::Transient(cause_of(&status, status.message()))
            }
            E::GRpcStatus(status) => {
                let message = status.message().to_string();
                // gRPC's numeric codes (tonic's `Code` is not re-exported by etcd-client).
                match status.code() as i32 {
                    GRPC_CANCELLED
                    | GRPC_DEADLINE_EXCEEDED
                    | GRPC_RESOURCE_EXHAUSTED
                    | GRPC_ABORTED
                    | GRPC_UNAVAILABLE => Problem::Transient(message),
                    _ if message.contains("lease not found") => Problem::LeaseGone,
                    _ if message.contains("authentication failed") => Problem::Refused(format!(
                        "{} refused {}: check the etcd user name and password",
                        self.place,
                        self.who()
                    )),
                    _ if message.contains("user name is empty")
                        || message.contains("invalid auth token") =>
                    {
                        Problem::Refused(format!(
                            "{} requires authentication: give an etcd user and password \
                             (etcd://user:password@host/prefix, [etcd] user and password, \
                             or ETCDCTL_USER)",
                            self.place
                        ))
                    }
                    GRPC_PERMISSION_DENIED => Problem::Refused(format!(
                        "{} denied {} access to {}: grant it a role with readwrite on that \
                         prefix (etcdctl role grant-permission ROLE --prefix=true readwrite {})",
                        self.place,
                        self.who(),
                        self.prefix,
                        self.prefix
                    )),
                    _ => Problem::Other(format!("{} answered: {message}", self.place)),
                }
            }
            E::LeaseKeepAliveError(message) if message.contains("not found") => Problem::LeaseGone,
            E::TransportError(_) | E::IoError(_) if tls_refused(&error_chain(&err)) => {
                self.tls_refusal(&error_chain(&err))
            }
            E::TransportError(_) | E::IoError(_) | E::LeaseKeepAliveError(_) | E::WatchError(_) => {
                Problem::Transient(error_chain(&err))
            }
            other => Problem::Other(format!("{}: {}", self.place, error_chain(&other))),
        }
    }

    fn tls_refusal(&self, detail: &str) -> Problem {
        Problem::Refused(format!(
            "{}: the TLS handshake failed ({detail}): check the CA that signed etcd's \
             certificate ([etcd] ca_file or ETCDCTL_CACERT) and, where etcd asks for one, the \
             client certificate ([etcd] cert_file and key_file, or ETCDCTL_CERT and ETCDCTL_KEY)",
            self.place
        ))
    }

    fn unavailable(&self, problem: Problem) -> BackendError {
        BackendError::Unavailable(match problem {
            // etcd drops a TLS client without the certificate it requires
            // after the handshake: the client sees only a closed connection.
            Problem::Transient(why) if self.tls.is_some() => format!(
                "cannot reach {} over TLS ({why}): check that etcd runs there and this host \
                 can reach it, and, where etcd requires client certificates, that [etcd] \
                 cert_file and key_file (or ETCDCTL_CERT and ETCDCTL_KEY) name one its CA signed",
                self.place
            ),
            Problem::Transient(why) => format!(
                "cannot reach {} ({why}): check that etcd runs there and this host can reach it",
                self.place
            ),
            Problem::LeaseGone => format!("{}: the lease is gone", self.place),
            Problem::Refused(why) | Problem::Other(why) => why,
        })
    }

    /// One request, attempted again (a bounded number of times) while etcd
    /// cannot be reached. Every request here may be repeated safely: a write
    /// whose answer was lost is recognised when it is read back.
    async fn call<T, F, Fut>(&self, mut request: F) -> Result<T, Problem>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut attempt = 0;
        loop {
            let answer = tokio::time::timeout(ATTEMPT_TIMEOUT, async {
                let client = self.client().await?;
                request(client).await
            })
            .await;
            let problem = match answer {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(err)) => self.classify(err),
                Err(_) => {
                    Problem::Transient(format!("no answer within {} s", ATTEMPT_TIMEOUT.as_secs()))
                }
            };
            attempt += 1;
            match problem {
                Problem::Transient(_) if attempt < ATTEMPTS => {
                    let pause = Duration::from_millis(50 << attempt);
                    tokio::time::sleep(pause.mul_f64(0.5 + fastrand::f64())).await;
                }
                problem => return Err(problem),
            }
        }
    }

    async fn revoke(&self, id: i64) -> Result<(), Problem> {
        match self
            .call(|mut c| async move { c.lease_revoke(id).await })
            .await
        {
            Ok(_) | Err(Problem::LeaseGone) => Ok(()),
            Err(problem) => Err(problem),
        }
    }
}

/// Whether a transport error is a TLS refusal (a certificate not trusted,
/// or none given where etcd requires one), which no retry mends.
fn tls_refused(chain: &str) -> bool {
    let chain = chain.to_ascii_lowercase();
    ["certificate", "handshake", "unknownissuer", "tls alert"]
        .iter()
        .any(|word| chain.contains(word))
}

/// What a gRPC status says went wrong: its source's chain where it has one
/// (a transport failure), not the status's debug form.
fn cause_of(status: &(dyn std::error::Error + 'static), message: &str) -> String {
    match status.source() {
        Some(source) => error_chain(source),
        None => message.to_string(),
    }
}

/// An error with its sources, as one line.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

/// The lock store on an etcd cluster.
pub struct EtcdBackend {
    connection: Arc<Connection>,
    /// `etcd://hosts/prefix`, and the user if any: never the password.
    description: String,
    /// runlock lease id → the etcd lease that holds its key.
    held: Mutex<HashMap<String, i64>>,
    /// A lease granted for an acquire that found the key held, kept for the
    /// next attempt (a waiter polls): only while young enough, see `take_spare`.
    spare: Mutex<Option<EtcdLease>>,
    watch: bool,
    released: OnceLock<broadcast::Sender<Key>>,
    /// Stops the watch when the backend goes.
    stop: CancellationToken,
}

impl EtcdBackend {
    /// Opens `etcd://[user:password@]host:port[,host:port]/prefix`. Makes no
    /// request; see [`EtcdBackend::probe`].
    pub fn open(uri: &str, options: &EtcdOptions) -> anyhow::Result<EtcdBackend> {
        let target = parse_uri(uri)?;
        let user = credentials(target.user, options)?;
        let tls = tls::settings(target.tls, options)?;
        let hosts = target.hosts.join(",");
        let prefix = target.prefix;
        let mut description = format!("etcd://{hosts}/{}", prefix.trim_end_matches('/'));
        match (&user, &tls) {
            (Some((name, _)), Some(_)) => description.push_str(&format!(" (user {name}, TLS)")),
            (Some((name, _)), None) => description.push_str(&format!(" (user {name})")),
            (None, Some(_)) => description.push_str(" (TLS)"),
            (None, None) => {}
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        Ok(EtcdBackend {
            connection: Arc::new(Connection {
                endpoints: target
                    .hosts
                    .iter()
                    .map(|h| format!("{scheme}://{h}"))
                    .collect(),
                user,
                tls,
                client: tokio::sync::Mutex::new(None),
                place: format!("etcd at {hosts}"),
                prefix: prefix.clone(),
            }),
            description,
            held: Mutex::new(HashMap::new()),
            spare: Mutex::new(None),
            watch: target.watch,
            released: OnceLock::new(),
            stop: CancellationToken::new(),
        })
    }

    /// Checks that etcd answers and lets this user read the prefix; the
    /// error names the cause.
    pub async fn probe(&self) -> Result<(), BackendError> {
        let prefix = self.connection.prefix.clone();
        self.bounded(async {
            self.connection
                .call(|mut c| {
                    let prefix = prefix.clone();
                    async move {
                        let only_one = GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_limit(1);
                        c.get(prefix, Some(only_one)).await
                    }
                })
                .await
                .map(|_| ())
                .map_err(|p| self.connection.unavailable(p))
        })
        .await
    }

    fn name(&self, key: &Key) -> String {
        format!("{}{}", self.connection.prefix, key_name::escaped(key))
    }

    /// Bounds a whole operation: a hung etcd never blocks a caller for longer.
    async fn bounded<T>(
        &self,
        operation: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout(OPERATION_TIMEOUT, operation).await {
            Ok(result) => result,
            Err(_) => Err(BackendError::Unavailable(format!(
                "{} gave no answer within {} s: check that etcd runs there and this host can \
                 reach it",
                self.connection.place,
                OPERATION_TIMEOUT.as_secs()
            ))),
        }
    }

    fn parse(&self, name: &str, kv: &KeyValue) -> Result<EtcdRecord, BackendError> {
        serde_json::from_slice(kv.value()).map_err(|e| {
            BackendError::Corrupt(format!(
                "{name} in {} is not a runlock record ({e}); delete it to free the key",
                self.description
            ))
        })
    }

    fn holder_of(&self, name: &str, kv: &KeyValue) -> Result<Holder, BackendError> {
        self.parse(name, kv)?
            .holder(kv.create_revision() as u64)
            .ok_or_else(|| {
                BackendError::Corrupt(format!(
                    "{name} in {} names no readable holder; delete it to free the key",
                    self.description
                ))
            })
    }

    fn lease_of(&self, lease_id: &str) -> Option<i64> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(lease_id)
            .copied()
    }

    /// A lease for one acquire attempt: the spare one if it is young, else a new grant.
    async fn lease_for(&self, ttl: Duration) -> Result<EtcdLease, BackendError> {
        let seconds = lease_seconds(ttl);
        if let Some(spare) = self.take_spare(seconds, ttl) {
            return Ok(spare);
        }
        let sent = Instant::now();
        let granted = self
            .connection
            .call(|mut c| async move { c.lease_grant(seconds, None).await })
            .await
            .map_err(|p| self.connection.unavailable(p))?;
        Ok(EtcdLease {
            id: granted.id(),
            seconds,
            sent,
        })
    }

    /// The spare lease, if it has these seconds and is at most TTL/6 old: a
    /// grant counts from its own send time, so an older one would leave the
    /// first renewal (at TTL/3) too close to the holder's deadline.
    fn take_spare(&self, seconds: i64, ttl: Duration) -> Option<EtcdLease> {
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        // One that does not fit is left to expire by itself.
        (spare.seconds == seconds && spare.sent.elapsed() <= timing::margin(ttl)).then_some(spare)
    }

    fn keep_spare(&self, lease: EtcdLease) {
        *self.spare.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease);
    }

    /// Revokes a lease whose acquire failed in an unknown state, in the
    /// background: if its key landed, nobody was told, so deleting it is right.
    fn abandon(&self, lease: EtcdLease) {
        let connection = self.connection.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(OPERATION_TIMEOUT, connection.revoke(lease.id)).await;
        });
    }

    fn granted(&self, spec: &AcquireSpec, lease: i64, token: u64, sent: Instant) -> Grant {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(spec.lease_id.clone(), lease);
        Grant {
            holder: Holder {
                token,
                ..spec.holder.clone()
            },
            sent,
            lock: None,
        }
    }

    /// One acquire: create the key with a lease, or read who has it.
    async fn try_acquire(&self, spec: &AcquireSpec) -> Result<Grant, BackendError> {
        let name = self.name(&spec.key);
        let marker = self.force_marker(&spec.key);
        let body = EtcdRecord::new(spec).body();
        for _ in 0..FORCE_ATTEMPTS {
            let lease = self.lease_for(spec.ttl).await?;
            let create = Txn::new()
                .when([
                    Compare::create_revision(name.clone(), CompareOp::Equal, 0),
                    Compare::create_revision(marker.clone(), CompareOp::Equal, 0),
                ])
                .and_then([TxnOp::put(
                    name.clone(),
                    body.clone(),
                    Some(PutOptions::new().with_lease(lease.id)),
                )])
                .or_else([TxnOp::get(name.clone(), None)]);
            let answer = match self
                .connection
                .call(|mut c| {
                    let create = create.clone();
                    async move { c.txn(create).await }
                })
                .await
            {
                Ok(answer) => answer,
                Err(problem) => {
                    self.abandon(lease);
                    return Err(self.connection.unavailable(problem));
                }
            };
            if answer.succeeded() {
                let token = answer.header().map(|h| h.revision()).unwrap_or(0) as u64;
                return Ok(self.granted(spec, lease.id, token, lease.sent));
            }
            let current = answer.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(mut got) => got.take_kvs().into_iter().next(),
                _ => None,
            });
            let Some(current) = current else {
                // No key, so the force marker: another agent is forcing it
                // and holds it meanwhile.
                self.keep_spare(lease);
                if !spec.force {
                    return Err(BackendError::Held(None));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let record = match self.parse(&name, &current) {
                Ok(record) => record,
                Err(err) => {
                    self.keep_spare(lease);
                    return Err(err);
                }
            };
            // A retried create whose first answer was lost finds its own write.
            if record.lease_id == spec.lease_id && current.lease() == lease.id {
                let token = current.create_revision() as u64;
                return Ok(self.granted(spec, lease.id, token, lease.sent));
            }
            let holder = match self.holder_of(&name, &current) {
                Ok(holder) => holder,
                Err(err) => {
                    self.keep_spare(lease);
                    return Err(err);
                }
            };
            if !spec.force {
                self.keep_spare(lease);
                return Err(BackendError::Held(Some(Box::new(holder))));
            }
            let forced = Forced {
                name: &name,
                marker: &marker,
                body: &body,
                lease: lease.id,
            };
            match self.take_over(&forced, &current).await {
                Ok(Some(token)) => return Ok(self.granted(spec, lease.id, token, lease.sent)),
                Ok(None) => self.keep_spare(lease),
                Err(err) => {
                    self.abandon(lease);
                    return Err(err);
                }
            }
        }
        Err(BackendError::Unavailable(format!(
            "{name} in {}: taken again {FORCE_ATTEMPTS} times while forcing it; try again",
            self.description
        )))
    }

    /// `--force`, in two transactions, as etcd allows no put and delete of
    /// one key in one: the key, if still as read, is deleted and the force
    /// marker put in its place (on the forcer's lease, so that it expires
    /// if the forcer dies), then the key is created and the marker deleted.
    /// Between the two, a waiter woken by the delete finds the marker and is
    /// told the key is held: only the forcer can take it. The old holder's
    /// lease is revoked so its renewals fail at once. `Ok(None)`: the key
    /// changed meanwhile; read it again.
    async fn take_over(
        &self,
        forced: &Forced<'_>,
        current: &KeyValue,
    ) -> Result<Option<u64>, BackendError> {
        let Forced {
            name,
            marker,
            body,
            lease,
        } = *forced;
        let with_lease = || Some(PutOptions::new().with_lease(lease));
        let delete = Txn::new()
            .when([
                Compare::mod_revision(name, CompareOp::Equal, current.mod_revision()),
                Compare::create_revision(marker, CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::delete(name, None),
                TxnOp::put(marker, body, with_lease()),
            ]);
        if !self.transact(delete).await?.succeeded() {
            return Ok(None);
        }
        if current.lease() != 0 {
            // The key is gone either way; this only makes the old holder's
            // keep-alives fail too.
            let _ = self.connection.revoke(current.lease()).await;
        }
        let create = Txn::new()
            .when([
                Compare::value(marker, CompareOp::Equal, body),
                Compare::create_revision(name, CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(name, body, with_lease()),
                TxnOp::delete(marker, None),
            ])
            // Only an agent of an older version, which knows no marker, can
            // have created the key meanwhile: give the marker up, read again.
            .or_else([TxnOp::delete(marker, None)]);
        let created = self.transact(create).await?;
        Ok(created
            .succeeded()
            .then(|| created.header().map(|h| h.revision()).unwrap_or(0) as u64))
    }

    /// Where a force in progress marks its key (see `take_over`): a name no
    /// escaped key can have, since escaping turns a leading `.` into `%2E`.
    fn force_marker(&self, key: &Key) -> String {
        format!(
            "{}.force/{}",
            self.connection.prefix,
            key_name::escaped(key)
        )
    }

    async fn transact(&self, txn: Txn) -> Result<etcd_client::TxnResponse, BackendError> {
        self.connection
            .call(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(|p| self.connection.unavailable(p))
    }

    async fn keep_alive(&self, id: i64) -> Result<(), BackendError> {
        match self
            .connection
            .call(|mut c| async move { c.lease_keep_alive(id).await.map(|_| ()) })
            .await
        {
            Ok(()) => Ok(()),
            Err(Problem::LeaseGone) => Err(BackendError::LeaseMismatch),
            Err(problem) => Err(self.connection.unavailable(problem)),
        }
    }

    async fn read(&self, name: &str) -> Result<Option<KeyValue>, BackendError> {
        let name = name.to_string();
        let mut got = self
            .connection
            .call(|mut c| {
                let name = name.clone();
                async move { c.get(name, None).await }
            })
            .await
            .map_err(|p| self.connection.unavailable(p))?;
        Ok(got.take_kvs().into_iter().next())
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            scope: Scope::Global,
            // The etcd lease outlives the agent; the next agent adopts it.
            survives_agent: true,
            needs_renewal: true,
            lease_expires: true,
            run_holds_lock: false,
        }
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    async fn acquire(&self, spec: &AcquireSpec) -> Result<Grant, BackendError> {
        self.bounded(self.try_acquire(spec)).await
    }

    /// Keeps the etcd lease alive (its TTL was set at the grant; `ttl` is the
    /// same) and checks the key is still ours: both requests at once.
    async fn renew(&self, lease: &LeaseRef, _ttl: Duration) -> Result<(), BackendError> {
        let id = self
            .lease_of(&lease.lease_id)
            .ok_or(BackendError::LeaseMismatch)?;
        let name = self.name(&lease.key);
        self.bounded(async {
            let (kept, read) = tokio::join!(self.keep_alive(id), self.read(&name));
            kept?;
            let ours = read?
                .is_some_and(|kv| kv.lease() == id && kv.create_revision() as u64 == lease.token);
            if ours {
                Ok(())
            } else {
                Err(BackendError::LeaseMismatch)
            }
        })
        .await
    }

    async fn release(&self, lease: &LeaseRef) -> Result<(), BackendError> {
        let id = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&lease.lease_id);
        let Some(id) = id else {
            return Ok(()); // not ours (any more): nothing to let go of
        };
        self.bounded(async {
            self.connection
                .revoke(id)
                .await
                .map_err(|p| self.connection.unavailable(p))
        })
        .await
    }

    async fn inspect(&self, key: &Key) -> Result<KeyRecord, BackendError> {
        let name = self.name(key);
        self.bounded(async {
            let mut answer = KeyRecord {
                key: key.to_string(),
                state: KeyState::Free,
                // etcd forgets a deleted key; the next grant's token is still larger.
                token: 0,
                holder: None,
                expires_in_ms: None,
                scope: Scope::Global,
            };
            let Some(kv) = self.read(&name).await? else {
                return Ok(answer);
            };
            let record = self.parse(&name, &kv)?;
            let holder = self.holder_of(&name, &kv)?;
            answer.state = KeyState::Held;
            answer.token = holder.token;
            answer.holder = Some(holder);
            let id = kv.lease();
            if id != 0 {
                let left = self
                    .connection
                    .call(|mut c| async move { c.lease_time_to_live(id, None).await })
                    .await;
                // Whole seconds by etcd's clock, less the grace the lease was
                // given (as the object stores report it); unknown, rather than
                // an error, if etcd cannot say.
                if let Ok(left) = left.map(|l| l.ttl().max(0) as u64) {
                    let ttl = Duration::from_millis(record.ttl_ms);
                    let grace = lease_seconds(ttl) as u64 * 1000 - record.ttl_ms;
                    answer.expires_in_ms = Some((left * 1000).saturating_sub(grace));
                }
            }
            Ok(answer)
        })
        .await
    }

    async fn adopt(&self, lease: &LeaseRef, agent_id: &str) -> Result<Adopted, BackendError> {
        let name = self.name(&lease.key);
        self.bounded(async {
            let kv = self.read(&name).await?.ok_or(BackendError::LeaseMismatch)?;
            let mut record = self.parse(&name, &kv)?;
            let id = kv.lease();
            let ours = record.lease_id == lease.lease_id
                && kv.create_revision() as u64 == lease.token
                && id != 0;
            if !ours {
                return Err(BackendError::LeaseMismatch);
            }
            let sent = Instant::now();
            self.keep_alive(id).await?;
            record.holder.insert("agent_id".into(), agent_id.into());
            // Rewritten only if untouched since the read: a force in between wins.
            let rewrite = Txn::new()
                .when([Compare::mod_revision(
                    name.clone(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([TxnOp::put(
                    name.clone(),
                    record.body(),
                    Some(PutOptions::new().with_lease(id)),
                )]);
            let written = self
                .connection
                .call(|mut c| {
                    let rewrite = rewrite.clone();
                    async move { c.txn(rewrite).await }
                })
                .await
                .map_err(|p| self.connection.unavailable(p))?;
            if !written.succeeded() {
                return Err(BackendError::LeaseMismatch);
            }
            let holder = record.holder(lease.token).ok_or_else(|| {
                BackendError::Corrupt(format!(
                    "{name} in {} names no readable holder",
                    self.description
                ))
            })?;
            self.held
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(lease.lease_id.clone(), id);
            Ok(Adopted {
                grant: Grant {
                    holder,
                    sent,
                    lock: None,
                },
                ttl: Duration::from_millis(record.ttl_ms),
            })
        })
        .await
    }

    fn releases(&self) -> Option<broadcast::Receiver<Key>> {
        if !self.watch {
            return None;
        }
        let sender = self.released.get_or_init(|| {
            let (sender, _) = broadcast::channel(RELEASED_BACKLOG);
            tokio::spawn(watch_releases(
                self.connection.clone(),
                sender.clone(),
                self.stop.clone(),
            ));
            sender
        });
        Some(sender.subscribe())
    }
}

/// Reports every key deleted under the prefix (released, expired or forced
/// out) until `stop`, reconnecting with backoff; after a gap it resumes from
/// the revision it last saw, so no release is missed unless etcd compacted it.
async fn watch_releases(
    connection: Arc<Connection>,
    released: broadcast::Sender<Key>,
    stop: CancellationToken,
) {
    let mut next_revision = 0;
    let mut failures: u32 = 0;
    loop {
        let watched = tokio::select! {
            _ = stop.cancelled() => return,
            watched = watch_once(&connection, &released, &mut next_revision, &mut failures) =>
                watched,
        };
        match watched {
            Ok(()) => {}
            Err(why) => {
                if failures == 0 {
                    tracing::warn!(
                        backend = %connection.place,
                        "watching for released keys failed ({why}); waiters poll until it is back"
                    );
                }
                failures += 1;
            }
        }
        let pause = Duration::from_millis(100 << failures.min(6));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

async fn watch_once(
    connection: &Connection,
    released: &broadcast::Sender<Key>,
    next_revision: &mut i64,
    failures: &mut u32,
) -> Result<(), String> {
    let describe = |err: etcd_client::Error| match connection.classify(err) {
        Problem::Transient(why) | Problem::Refused(why) | Problem::Other(why) => why,
        Problem::LeaseGone => "lease gone".to_string(),
    };
    let mut options = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_filters([WatchFilterType::NoPut]);
    if *next_revision > 0 {
        options = options.with_start_revision(*next_revision);
    }
    let prefix = connection.prefix.clone();
    let mut stream = tokio::time::timeout(ATTEMPT_TIMEOUT, async {
        let mut client = connection.client().await?;
        client.watch(prefix, Some(options)).await
    })
    .await
    .map_err(|_| format!("no answer within {} s", ATTEMPT_TIMEOUT.as_secs()))?
    .map_err(describe)?;
    while let Some(answer) = stream.message().await.map_err(describe)? {
        if answer.canceled() {
            if answer.compact_revision() > 0 {
                *next_revision = 0; // what was missed is gone: watch from now
            }
            return Err(format!("etcd ended the watch: {}", answer.cancel_reason()));
        }
        // Watching again: the next failure is news worth a warning.
        *failures = 0;
        for event in answer.events() {
            if event.event_type() != EventType::Delete {
                continue;
            }
            if let Some(kv) = event.kv() {
                *next_revision = kv.mod_revision() + 1;
            }
            let key = event
                .prev_kv()
                .and_then(|kv| serde_json::from_slice::<EtcdRecord>(kv.value()).ok())
                .and_then(|record| Key::new(record.key).ok());
            if let Some(key) = key {
                let _ = released.send(key);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fixtures::{lease, spec};
    use etcd_client::Permission;

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn uris_name_hosts_prefix_user_and_watch() {
        let target = parse_uri("etcd://h1:2380,h2/team/locks/").expect("valid");
        assert_eq!(target.hosts, ["h1:2380", "h2:2379"]);
        assert_eq!(target.prefix, "team/locks/");
        assert_eq!((target.user, target.watch), (None, true));

        let target = parse_uri("etcd://ops:p%40ss%3Aword@[::1]?watch=false").expect("valid");
        assert_eq!(target.hosts, ["[::1]:2379"]);
        assert_eq!(target.prefix, "runlock/");
        assert_eq!(
            target.user,
            Some(("ops".to_string(), Some("p@ss:word".to_string())))
        );
        assert!(!target.watch);

        assert!(parse_uri("etcd://h/p?tls=true").expect("valid").tls);
        for bad in ["etcd://", "etcd://h:port/x", "etcd://h?tls=1", "s3://b"] {
            assert!(parse_uri(bad).is_err(), "{bad} was accepted");
        }
        let Err(err) = parse_uri("etcd://u:secret@h:x/p") else {
            panic!("a bad port was accepted");
        };
        assert!(!err.to_string().contains("secret"), "{err}");
        for password in ["pa/ss", "p?w", "p#w", "p:w", "p@w", "a/b?c#d:e@f"] {
            let uri = format!("etcd://ops:{password}@h1,h2:2380/team?watch=false");
            let target = parse_uri(&uri).expect("valid");
            assert_eq!(target.hosts, ["h1:2379", "h2:2380"]);
            assert_eq!((target.prefix.as_str(), target.watch), ("team/", false));
            assert_eq!(
                target.user,
                Some(("ops".to_string(), Some(password.to_string())))
            );
            let Err(err) = parse_uri(&format!("etcd://ops:{password}@h:x/p?tls=1")) else {
                panic!("a bad port was accepted");
            };
            assert!(!err.to_string().contains(password), "{err}");
        }
    }

    #[test]
    fn credentials_come_from_the_uri_before_the_file() {
        let file = EtcdOptions {
            user: Some("file-user".into()),
            password: Some("file-pw".into()),
            ..EtcdOptions::default()
        };
        let from_uri = Some(("uri-user".to_string(), Some("uri-pw".to_string())));
        assert_eq!(
            credentials(from_uri, &file).expect("both"),
            Some(("uri-user".into(), "uri-pw".into()))
        );
        // A user in the URI may take the file's password.
        let from_uri = Some(("uri-user".to_string(), None));
        assert_eq!(
            credentials(from_uri, &file).expect("both"),
            Some(("uri-user".into(), "file-pw".into()))
        );
        assert_eq!(
            credentials(None, &file).expect("file"),
            Some(("file-user".into(), "file-pw".into()))
        );
        let shown = format!("{file:?}");
        assert!(
            !shown.contains("file-pw") && shown.contains("file-user"),
            "{shown}"
        );
    }

    #[test]
    fn leases_last_ttl_and_grace_in_whole_seconds() {
        assert_eq!(lease_seconds(Duration::from_secs(1)), 2); // 1 s + 0.5 s
        assert_eq!(lease_seconds(Duration::from_secs(30)), 33);
        assert_eq!(lease_seconds(Duration::from_millis(5500)), 7); // 5.5 + 0.55
    }

    #[test]
    fn a_record_keeps_the_holder_but_not_its_token() {
        let spec = spec("dev:tap-a-to-target-b", "l1", false, TTL);
        let record = EtcdRecord::new(&spec);
        let body: serde_json::Value = serde_json::from_slice(&record.body()).expect("json");
        assert_eq!(body["state"], "held");
        assert_eq!(body["key"], "dev:tap-a-to-target-b");
        assert_eq!(body["holder"]["host"], "host-of-l1");
        assert!(body["holder"].get("token").is_none(), "{body}");
        let holder = record.holder(42).expect("holder");
        assert_eq!(
            holder,
            Holder {
                token: 42,
                ..spec.holder
            }
        );
    }

    /// The etcd that `tests/scripts/etcd.sh` started (scripts/test does); its
    /// absence is a failure, never a skip.
    fn endpoint(var: &str) -> String {
        match std::env::var(var) {
            Ok(url) if !url.is_empty() => url.trim_start_matches("http://").to_string(),
            _ => panic!(
                "{var} is not set: these tests need etcd; run `bash scripts/test`, or \
                 `bash tests/scripts/etcd.sh` and export what it prints"
            ),
        }
    }

    /// A prefix no other test (or earlier run) uses.
    fn fresh_prefix(test: &str) -> String {
        format!("unit-{test}-{}-{}", std::process::id(), fastrand::u64(..))
    }

    fn open(prefix: &str) -> EtcdBackend {
        let host = endpoint("RUNLOCK_TEST_ETCD_ENDPOINT");
        EtcdBackend::open(&format!("etcd://{host}/{prefix}"), &EtcdOptions::default())
            .expect("opens")
    }

    fn key(name: &str) -> Key {
        Key::new(name).expect("valid")
    }

    #[tokio::test]
    async fn agents_exclude_each_other_and_every_grant_has_a_larger_token() {
        let prefix = fresh_prefix("exclude");
        let (one, two) = (open(&prefix), open(&prefix));
        one.probe().await.expect("etcd answers");
        let first = one
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect("free");
        match two.acquire(&spec("k", "l2", false, TTL)).await {
            Err(BackendError::Held(Some(h))) => {
                assert_eq!(
                    (h.host.as_str(), h.token),
                    ("host-of-l1", first.holder.token)
                )
            }
            other => panic!("expected held, got {other:?}"),
        }
        let record = two.inspect(&key("k")).await.expect("inspect");
        assert_eq!(
            (record.state, record.token, record.scope),
            (KeyState::Held, first.holder.token, Scope::Global)
        );
        let left = record.expires_in_ms.expect("a lease expires");
        assert!(left <= TTL.as_millis() as u64 && left > 0, "{left}");

        let first_lease = lease("k", "l1", first.holder.token);
        one.renew(&first_lease, TTL).await.expect("renew");
        one.release(&first_lease).await.expect("release");
        let record = two.inspect(&key("k")).await.expect("inspect");
        assert_eq!((record.state, record.holder), (KeyState::Free, None));
        let second = two
            .acquire(&spec("k", "l2", false, TTL))
            .await
            .expect("freed");
        assert!(second.holder.token > first.holder.token, "{second:?}");
        // A lease already let go releases quietly, and frees nothing of the new holder's.
        one.release(&first_lease).await.expect("quiet");
        assert!(matches!(
            one.renew(&first_lease, TTL).await,
            Err(BackendError::LeaseMismatch)
        ));
        assert_eq!(
            one.inspect(&key("k")).await.expect("inspect").state,
            KeyState::Held
        );
    }

    #[tokio::test]
    async fn force_takes_the_key_with_a_larger_token_and_the_old_holder_loses_it() {
        let prefix = fresh_prefix("force");
        let (one, two) = (open(&prefix), open(&prefix));
        let first = one
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect("free");
        let forced = two
            .acquire(&spec("k", "l2", true, TTL))
            .await
            .expect("forced");
        assert!(forced.holder.token > first.holder.token);
        let old = lease("k", "l1", first.holder.token);
        assert!(matches!(
            one.renew(&old, TTL).await,
            Err(BackendError::LeaseMismatch)
        ));
        one.release(&old)
            .await
            .expect("a lost lease releases quietly");
        let record = one.inspect(&key("k")).await.expect("inspect");
        assert_eq!(record.holder.map(|h| h.host), Some("host-of-l2".into()));
        two.renew(&lease("k", "l2", forced.holder.token), TTL)
            .await
            .expect("the new holder renews");
    }

    /// Between a force's delete and its create, a waiter woken by the delete
    /// must find the key held, never take it (chaos run, issue 15).
    #[tokio::test]
    async fn in_the_middle_of_a_force_the_key_is_held_for_the_forcer() {
        let prefix = fresh_prefix("mid-force");
        let (forcer, waiter) = (open(&prefix), open(&prefix));
        let marker = forcer.force_marker(&key("k"));
        let put = Txn::new().and_then([TxnOp::put(marker.as_str(), b"{}".to_vec(), None)]);
        forcer.transact(put).await.expect("marker written");
        assert!(matches!(
            waiter.acquire(&spec("k", "w1", false, TTL)).await,
            Err(BackendError::Held(None))
        ));
        let delete = Txn::new().and_then([TxnOp::delete(marker.as_str(), None)]);
        forcer.transact(delete).await.expect("marker deleted");
        let granted = waiter
            .acquire(&spec("k", "w1", false, TTL))
            .await
            .expect("free once the marker is gone");
        // A force leaves no marker behind.
        let forced = forcer
            .acquire(&spec("k", "f1", true, TTL))
            .await
            .expect("forced");
        assert!(forced.holder.token > granted.holder.token);
        assert!(forcer.read(&marker).await.expect("read").is_none());
    }

    #[tokio::test]
    async fn an_unrenewed_lease_is_taken_over_after_ttl_and_grace_by_etcd_s_clock() {
        let prefix = fresh_prefix("expiry");
        let (one, two) = (open(&prefix), open(&prefix));
        let short = AcquireSpec {
            ttl: Duration::from_secs(1),
            ..spec("k", "l1", false, TTL)
        };
        let granted = one.acquire(&short).await.expect("free");
        // The holder trusts its lease until sent + TTL - TTL/6; nobody may take
        // it before sent + TTL (etcd gives TTL + grace, in whole seconds).
        let earliest = granted.sent + short.ttl;
        let mut reports = two.releases().expect("etcd reports releases");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match two.acquire(&spec("k", "l2", false, TTL)).await {
                Ok(_) => break,
                Err(BackendError::Held(_)) => {}
                Err(other) => panic!("{other}"),
            }
            assert!(Instant::now() < deadline, "never expired");
            // The watch reports the expiry; the timeout only bounds the wait.
            let _ = tokio::time::timeout(Duration::from_secs(1), reports.recv()).await;
        }
        let at = Instant::now();
        assert!(at >= earliest, "taken {:?} too early", earliest - at);
        assert!(
            at <= granted.sent + Duration::from_secs(lease_seconds(short.ttl) as u64 + 2),
            "taken {:?} after the grant",
            at - granted.sent
        );
        assert!(matches!(
            one.renew(&lease("k", "l1", granted.holder.token), short.ttl)
                .await,
            Err(BackendError::LeaseMismatch)
        ));
    }

    #[tokio::test]
    async fn a_release_is_reported_to_other_agents_watching() {
        let prefix = fresh_prefix("watch");
        let (one, two) = (open(&prefix), open(&prefix));
        let mut reports = two.releases().expect("etcd reports releases");
        // The watch starts in the background: wait until it reports a first release.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let probe = one
                .acquire(&spec("probe", "p", false, TTL))
                .await
                .expect("free");
            one.release(&lease("probe", "p", probe.holder.token))
                .await
                .expect("release");
            match tokio::time::timeout(Duration::from_millis(200), reports.recv()).await {
                Ok(Ok(k)) if k == key("probe") => break,
                _ => assert!(Instant::now() < deadline, "the watch never reported"),
            }
        }
        let held = one
            .acquire(&spec("dev:x", "l1", false, TTL))
            .await
            .expect("free");
        one.release(&lease("dev:x", "l1", held.holder.token))
            .await
            .expect("release");
        let reported = tokio::time::timeout(Duration::from_secs(5), reports.recv())
            .await
            .expect("reported within 5 s")
            .expect("open");
        assert_eq!(reported, key("dev:x"));

        let polling = EtcdBackend::open(
            &format!(
                "etcd://{}/{prefix}?watch=false",
                endpoint("RUNLOCK_TEST_ETCD_ENDPOINT")
            ),
            &EtcdOptions::default(),
        )
        .expect("opens");
        assert!(polling.releases().is_none());
    }

    #[tokio::test]
    async fn another_agent_adopts_a_live_lease_and_names_itself() {
        let prefix = fresh_prefix("adopt");
        let (old, new) = (open(&prefix), open(&prefix));
        let granted = old
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect("free");
        let taken = lease("k", "l1", granted.holder.token);
        assert!(matches!(
            new.adopt(&lease("k", "l1", granted.holder.token + 1), "new")
                .await,
            Err(BackendError::LeaseMismatch)
        ));
        let adopted = new.adopt(&taken, "new").await.expect("adopted");
        assert_eq!(adopted.ttl, TTL);
        assert_eq!(
            (
                adopted.grant.holder.agent_id.as_str(),
                adopted.grant.holder.token
            ),
            ("new", granted.holder.token)
        );
        let record = new.inspect(&key("k")).await.expect("inspect");
        assert_eq!(record.holder.map(|h| h.agent_id), Some("new".into()));
        new.renew(&taken, TTL).await.expect("renews");
        new.release(&taken).await.expect("releases");
        assert_eq!(
            new.inspect(&key("k")).await.expect("inspect").state,
            KeyState::Free
        );
    }

    /// The etcd served over TLS that requires client certificates, and the
    /// directory of the CA that signed its certificate and the client's.
    fn tls_etcd() -> (String, PathBuf) {
        let host = endpoint("RUNLOCK_TEST_ETCD_TLS_ENDPOINT");
        let host = host.trim_start_matches("https://").to_string();
        let dir = std::env::var_os("RUNLOCK_TEST_ETCD_TLS_DIR")
            .map(PathBuf::from)
            .expect("RUNLOCK_TEST_ETCD_TLS_DIR is set with RUNLOCK_TEST_ETCD_TLS_ENDPOINT");
        (host, dir)
    }

    #[tokio::test]
    async fn tls_with_the_ca_and_a_client_certificate_serves_and_without_them_is_named() {
        let (host, dir) = tls_etcd();
        let prefix = fresh_prefix("tls");
        let uri = format!("etcd://{host}/{prefix}");
        let full = EtcdOptions {
            ca_file: Some(dir.join("ca.crt")),
            cert_file: Some(dir.join("client.crt")),
            key_file: Some(dir.join("client.key")),
            ..EtcdOptions::default()
        };
        let backend = EtcdBackend::open(&uri, &full).expect("opens");
        assert!(
            backend.describe().ends_with("(TLS)"),
            "{}",
            backend.describe()
        );
        backend.probe().await.expect("etcd answers over TLS");
        let granted = backend
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect("free");
        let held = lease("k", "l1", granted.holder.token);
        backend.renew(&held, TTL).await.expect("renew");
        backend.release(&held).await.expect("release");

        let refused = |options: EtcdOptions, uri: String| async move {
            let backend = EtcdBackend::open(&uri, &options).expect("opens");
            match backend.probe().await {
                Err(BackendError::Unavailable(text)) => text,
                other => panic!("expected a refusal, got {other:?}"),
            }
        };
        // etcd requires a client certificate; none is given. etcd closes the
        // connection after the handshake, so the message can only point at it.
        let ca_only = EtcdOptions {
            ca_file: full.ca_file.clone(),
            ..EtcdOptions::default()
        };
        let text = refused(ca_only, uri.clone()).await;
        assert!(text.contains("cert_file"), "{text}");
        assert!(text.contains(&host), "{text}");
        // The system's roots do not know the test CA.
        let no_ca = EtcdOptions {
            ca_file: None,
            ..full.clone()
        };
        let text = refused(no_ca, format!("{uri}?tls=true")).await;
        assert!(text.contains("the TLS handshake failed"), "{text}");
        assert!(text.contains("ca_file"), "{text}");
    }

    /// A cluster URI names every member; one of them down (here: the first,
    /// where nothing listens) must not fail the runs the others can serve.
    #[tokio::test]
    async fn a_member_down_leaves_the_others_serving() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let live = endpoint("RUNLOCK_TEST_ETCD_ENDPOINT");
        let prefix = fresh_prefix("member-down");
        let uri = format!("etcd://127.0.0.1:{closed},{live}/{prefix}");
        let backend = EtcdBackend::open(&uri, &EtcdOptions::default()).expect("opens");
        backend.probe().await.expect("the live member answers");
        let mut last_token = 0;
        for round in 0..20 {
            let granted = backend
                .acquire(&spec("k", &format!("l{round}"), false, TTL))
                .await
                .unwrap_or_else(|err| panic!("acquire {round}: {err}"));
            assert!(granted.holder.token > last_token);
            last_token = granted.holder.token;
            let held = lease("k", &format!("l{round}"), last_token);
            backend.renew(&held, TTL).await.expect("renew");
            backend.release(&held).await.expect("release");
        }
    }

    #[tokio::test]
    async fn an_unreachable_etcd_is_named_within_the_bound() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let backend = EtcdBackend::open(
            &format!("etcd://127.0.0.1:{closed}/x"),
            &EtcdOptions::default(),
        )
        .expect("opens");
        let started = Instant::now();
        let err = backend
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect_err("nothing listens");
        assert!(started.elapsed() <= OPERATION_TIMEOUT + Duration::from_millis(500));
        match err {
            BackendError::Unavailable(why) => {
                assert!(why.contains(&format!("127.0.0.1:{closed}")), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_wrong_password_and_a_missing_permission_are_named_without_the_password() {
        let host = endpoint("RUNLOCK_TEST_ETCD_AUTH_ENDPOINT");
        let root = std::env::var("RUNLOCK_TEST_ETCD_ROOT_PASSWORD").expect("set by etcd.sh");
        let prefix = fresh_prefix("auth");
        let reader = format!("reader-{}", fastrand::u32(..));
        let mut admin = Client::connect(
            [format!("http://{host}")],
            Some(ConnectOptions::new().with_user("root", root)),
        )
        .await
        .expect("root connects");
        admin.role_add(&reader).await.expect("role");
        admin
            .role_grant_permission(
                &reader,
                Permission::read(format!("{prefix}/")).with_prefix(),
            )
            .await
            .expect("grant");
        admin
            .user_add(&reader, "reader-secret", None)
            .await
            .expect("user");
        admin
            .user_grant_role(&reader, &reader)
            .await
            .expect("user role");

        let wrong = EtcdBackend::open(
            &format!("etcd://{reader}:not-the-secret@{host}/{prefix}"),
            &EtcdOptions::default(),
        )
        .expect("opens");
        let err = wrong.probe().await.expect_err("wrong password").to_string();
        assert!(err.contains(&reader) && err.contains("password"), "{err}");
        assert!(!err.contains("not-the-secret"), "{err}");
        assert!(!wrong.describe().contains("not-the-secret"));

        let read_only = EtcdBackend::open(
            &format!("etcd://{reader}:reader-secret@{host}/{prefix}"),
            &EtcdOptions::default(),
        )
        .expect("opens");
        read_only.probe().await.expect("may read");
        let err = read_only
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect_err("may not write")
            .to_string();
        assert!(err.contains("denied") && err.contains(&prefix), "{err}");
        assert!(!err.contains("reader-secret"), "{err}");

        let anonymous = open_at(&host, &prefix);
        let err = anonymous.probe().await.expect_err("no user").to_string();
        assert!(err.contains("requires authentication"), "{err}");
    }

    fn open_at(host: &str, prefix: &str) -> EtcdBackend {
        EtcdBackend::open(&format!("etcd://{host}/{prefix}"), &EtcdOptions::default())
            .expect("opens")
    }
}
