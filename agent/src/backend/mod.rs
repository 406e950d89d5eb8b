//! The backend trait every store implements, its errors, and `from_uri`.

pub mod cas;
mod etcd;
mod file;
#[cfg(test)]
mod fixtures;
mod key_name;
mod memory;
pub mod postgres;
mod uri;

pub use cas::{AzureOptions, GcsOptions, S3Options};
pub use etcd::{EtcdBackend, EtcdOptions};
pub use file::FileBackend;
pub use memory::MemoryBackend;
pub use postgres::{PostgresBackend, PostgresOptions};
pub use uri::redact_uri;
pub(crate) use uri::split_userinfo;

use async_trait::async_trait;
use runlock_protocol::{ErrorCode, Holder, Key, KeyRecord, Scope, WireError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What a backend can promise; logged at start and reported by `welcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// How far its exclusion reaches.
    pub scope: Scope,
    /// Whether a lease outlives the agent process: network stores, and a
    /// kernel lock the run holds itself.
    pub survives_agent: bool,
    /// Whether the agent must check each lease periodically to notice it was taken.
    pub needs_renewal: bool,
    /// Whether a held lease lapses unless renewed in time. A kernel lock
    /// cannot: it has no deadline, and a slow or paused agent loses nothing.
    pub lease_expires: bool,
    /// Whether the run itself holds the lock (`Grant::lock`), so that its
    /// lease outlives the agent only for a client that takes the lock.
    pub run_holds_lock: bool,
}

/// Everything needed to take one key.
#[derive(Debug, Clone)]
pub struct AcquireSpec {
    /// The key.
    pub key: Key,
    /// The new lease's id.
    pub lease_id: String,
    /// The holder to record; the backend fills in `token`.
    pub holder: Holder,
    /// Time to live.
    pub ttl: Duration,
    /// Take the key over from its holder.
    pub force: bool,
}

/// A lease as the backend knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    /// The key.
    pub key: Key,
    /// The lease's id.
    pub lease_id: String,
    /// The fencing token it was granted with.
    pub token: u64,
}

/// What a successful acquire returns.
#[derive(Debug)]
pub struct Grant {
    /// The recorded holder, with the new fencing token.
    pub holder: Holder,
    /// When the write that granted the lease was sent: the lease's clock starts
    /// here, not when the answer arrived (DESIGN, invariant 1).
    pub sent: tokio::time::Instant,
    /// Where the run holds the lock itself (a kernel lock): a descriptor of
    /// the locked open file description, for the run to inherit, so that the
    /// lock lives exactly as long as the run, agent or no agent.
    pub lock: Option<std::os::fd::OwnedFd>,
}

/// What a successful adopt returns.
#[derive(Debug)]
pub struct Adopted {
    /// The lease, now recorded as this agent's, as if just granted.
    pub grant: Grant,
    /// The lease's time to live, as recorded.
    pub ttl: Duration,
}

/// Why a backend operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Someone else holds the key (the holder is unknown while its record is being written).
    #[error("held")]
    Held(Option<Box<Holder>>),
    /// Meltano's system database records a live run of the key's state ID,
    /// a run runlock does not wrap (`legacy::MeltanoGuard`).
    #[error("held by a legacy Meltano run")]
    HeldByLegacyRun(Box<LegacyRun>),
    /// The lease is no longer ours: taken over, broken or expired.
    #[error("the lease is no longer held")]
    LeaseMismatch,
    /// The store cannot be reached or refused the request.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The store holds something we cannot read; a person must look.
    #[error("{0}")]
    Corrupt(String),
    /// This backend cannot do that.
    #[error("{0}")]
    Unsupported(String),
}

impl BackendError {
    /// The wire code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            BackendError::Held(_) | BackendError::HeldByLegacyRun(_) => ErrorCode::Held,
            BackendError::LeaseMismatch => ErrorCode::NotOwner,
            BackendError::Unavailable(_) => ErrorCode::Unavailable,
            BackendError::Corrupt(_) => ErrorCode::Internal,
            BackendError::Unsupported(_) => ErrorCode::Unsupported,
        }
    }

    /// The error as the peer sees it, about `key`.
    pub fn to_wire(&self, key: &Key) -> WireError {
        let mut wire = WireError::new(self.code(), self.to_string());
        wire.key = Some(key.to_string());
        match self {
            BackendError::Held(holder) => wire.holder = holder.clone(),
            BackendError::HeldByLegacyRun(run) => wire.holder = Some(Box::new(run.holder.clone())),
            _ => return wire,
        }
        wire.message = format!("key {key:?} is held");
        wire
    }
}

/// A `RUNNING` row of Meltano's system database that Meltano would not call
/// stale: a run that holds its state ID without a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyRun {
    /// Meltano's id of the run.
    pub run_id: String,
    /// When it started, if recorded.
    pub started_at_ms: Option<i64>,
    /// The run as a holder is shown to peers.
    pub holder: Holder,
}

/// A lock store. One instance serves every connection; state lives inside.
/// `metrics::TimedBackend` wraps any backend: forward a new method there too.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// What the backend promises.
    fn capabilities(&self) -> Capabilities;
    /// The backend's URI with any secret removed.
    fn describe(&self) -> String;
    /// The shortest TTL it can keep renewed (a store that takes few writes per
    /// record needs renewals far apart); shorter requests are refused.
    fn min_ttl(&self) -> Duration {
        Duration::ZERO
    }
    /// Takes `spec.key` now, or reports its holder; never waits for a holder.
    async fn acquire(&self, spec: &AcquireSpec) -> Result<Grant, BackendError>;
    /// Confirms the lease is still ours and extends it.
    async fn renew(&self, lease: &LeaseRef, ttl: Duration) -> Result<(), BackendError>;
    /// Ends the lease if it is still ours; a lease already lost is not an error.
    async fn release(&self, lease: &LeaseRef) -> Result<(), BackendError>;
    /// Reads the key's record.
    async fn inspect(&self, key: &Key) -> Result<KeyRecord, BackendError>;
    /// Keys that may have just become free through another agent (a Postgres
    /// `NOTIFY`, an etcd watch), so that waiters here try again at once
    /// instead of at their next poll. `None`, the default: waiters poll.
    fn releases(&self) -> Option<tokio::sync::broadcast::Receiver<Key>> {
        None
    }
    /// Takes over a lease granted through an agent that has stopped, if the
    /// store still holds it, unexpired, with this id and token: rewrites its
    /// record naming `agent_id` and extends it, as a renewal would.
    async fn adopt(&self, lease: &LeaseRef, agent_id: &str) -> Result<Adopted, BackendError> {
        let _ = (lease, agent_id);
        Err(BackendError::Unsupported(format!(
            "{} does not keep locks beyond the agent that took them",
            self.describe()
        )))
    }
}

/// Per-backend settings from the configuration file, one section each.
#[derive(Debug, Clone, Default)]
pub struct BackendOptions {
    /// `[s3]`.
    pub s3: S3Options,
    /// `[azure]`.
    pub azure: AzureOptions,
    /// `[gcs]`.
    pub gcs: GcsOptions,
    /// `[postgres]`.
    pub postgres: PostgresOptions,
    /// `[etcd]`.
    pub etcd: EtcdOptions,
}

/// How long the start-up check of a network store may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(6);

/// Whether a backend just opened can serve runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// It answered, and showed it can lock.
    Ready,
    /// It could not be checked now (down, unreachable, refusing us); runs get
    /// `unavailable` until it can.
    Unreachable(String),
    /// It answered and broke a guarantee a lock rests on: it grants nothing.
    Untrusted(String),
}

/// A backend and what its first check found.
pub struct Opened {
    /// The backend.
    pub backend: Arc<dyn Backend>,
    /// What the check found.
    pub readiness: Readiness,
}

/// Builds the backend a URI names and checks it once, as the agent does at
/// start: a network store must answer, and an object store must show that
/// it refuses conflicting writes (`cas::CasEngine::prove`). Fails only on
/// what it was given (a malformed URI, an unreadable file).
pub async fn open(uri: &str, options: &BackendOptions) -> anyhow::Result<Opened> {
    let (scheme, rest) = uri.split_once("://").ok_or_else(|| {
        anyhow::anyhow!(
            "backend {:?} is not a URI (expected file:///path, s3://bucket/prefix, \
             azure://container/prefix, gs://bucket/prefix, postgresql://…,
             etcd://host:port/prefix or memory://)",
            redact_uri(uri)
        )
    })?;
    let ready = |backend: Arc<dyn Backend>| Opened {
        backend,
        readiness: Readiness::Ready,
    };
    match scheme {
        "file" => {
            if rest.is_empty() {
                anyhow::bail!("backend file:// needs a directory, as in file:///var/lib/runlock");
            }
            Ok(ready(Arc::new(FileBackend::open(PathBuf::from(rest))?)))
        }
        "memory" => Ok(ready(Arc::new(MemoryBackend::default()))),
        // The object-store engine over an in-process store: for benchmarks and tests.
        "memory-cas" => {
            let store = cas::MemoryCasStore::new();
            Ok(on_the_lease_engine(store, String::new(), Readiness::Ready).await)
        }
        "s3" => {
            let store = cas::S3Store::open(uri, &options.s3).await?;
            let probed = store_probe(store.probe()).await;
            let prefix = store.records_prefix().to_string();
            Ok(on_the_lease_engine(store, prefix, probed).await)
        }
        "azure" => {
            let store = cas::AzureStore::open(uri, &options.azure)?;
            let probed = store_probe(store.probe()).await;
            let prefix = store.records_prefix().to_string();
            Ok(on_the_lease_engine(store, prefix, probed).await)
        }
        "gs" => {
            let store = cas::GcsStore::open(uri, &options.gcs)?;
            let probed = store_probe(store.probe()).await;
            let prefix = store.records_prefix().to_string();
            Ok(on_the_lease_engine(store, prefix, probed).await)
        }
        "postgresql" | "postgres" => {
            let backend = Arc::new(PostgresBackend::open(uri, &options.postgres)?);
            let readiness = within_probe_timeout(backend.probe()).await;
            Ok(Opened { backend, readiness })
        }
        "etcd" => {
            let backend = Arc::new(EtcdBackend::open(uri, &options.etcd)?);
            let probe = async { backend.probe().await.map_err(|err| err.to_string()) };
            let readiness = within_probe_timeout(probe).await;
            Ok(Opened { backend, readiness })
        }
        other => anyhow::bail!(
            "backend scheme {other:?} is not supported by this build \
             (supported: file://, s3://, azure://, gs://, postgresql://, etcd://, memory://)"
        ),
    }
}

/// [`open`], logging what its check found; the agent starts either way.
pub async fn from_uri(uri: &str, options: &BackendOptions) -> anyhow::Result<Arc<dyn Backend>> {
    let Opened { backend, readiness } = open(uri, options).await?;
    match readiness {
        Readiness::Ready => {}
        Readiness::Unreachable(problem) => tracing::warn!(
            backend = %backend.describe(),
            "the backend cannot be used yet: {problem}; runs will fail as unavailable until it can"
        ),
        Readiness::Untrusted(problem) => tracing::error!(
            backend = %backend.describe(),
            "the backend cannot be trusted to lock: {problem}; every run will fail as unavailable"
        ),
    }
    Ok(backend)
}

/// An object store's own check (it names a missing bucket or a refused
/// credential best), bounded by [`PROBE_TIMEOUT`].
async fn store_probe(
    probe: impl std::future::Future<Output = Result<(), cas::CasError>>,
) -> Readiness {
    within_probe_timeout(async { probe.await.map_err(|err| err.to_string()) }).await
}

/// The object-store lease engine over `store`, its records under `prefix`;
/// once the store's own check (`probed`) passed, the engine's proof that the
/// store refuses conflicting writes.
async fn on_the_lease_engine(
    store: impl cas::CasStore,
    prefix: String,
    probed: Readiness,
) -> Opened {
    let engine = Arc::new(cas::CasEngine::new(Arc::new(store), prefix));
    let readiness = match probed {
        Readiness::Ready => match tokio::time::timeout(PROBE_TIMEOUT, engine.prove()).await {
            Ok(Ok(())) => Readiness::Ready,
            Ok(Err(cas::Unproven::Lacks(what))) => Readiness::Untrusted(what),
            Ok(Err(cas::Unproven::Unanswered(why))) => Readiness::Unreachable(why),
            Err(_) => no_answer(),
        },
        not_ready => not_ready,
    };
    Opened {
        backend: engine,
        readiness,
    }
}

/// A backend's own check, bounded by [`PROBE_TIMEOUT`].
async fn within_probe_timeout(
    probe: impl std::future::Future<Output = Result<(), String>>,
) -> Readiness {
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(())) => Readiness::Ready,
        Ok(Err(problem)) => Readiness::Unreachable(problem),
        Err(_) => no_answer(),
    }
}

fn no_answer() -> Readiness {
    Readiness::Unreachable(format!("no answer within {}s", PROBE_TIMEOUT.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unknown_scheme_is_named() {
        let Err(err) = from_uri("gopher://x", &BackendOptions::default()).await else {
            panic!("gopher:// was accepted");
        };
        assert!(err.to_string().contains("\"gopher\""), "{err}");
        assert!(from_uri("file://", &BackendOptions::default())
            .await
            .is_err());
        assert!(from_uri("not a uri", &BackendOptions::default())
            .await
            .is_err());
        assert!(from_uri("s3://", &BackendOptions::default()).await.is_err());
        assert!(from_uri("azure://", &BackendOptions::default())
            .await
            .is_err());
        assert!(from_uri("gs://", &BackendOptions::default()).await.is_err());
    }
}
