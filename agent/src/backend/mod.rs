//! The backend trait every store implements and its errors; `open.rs` opens
//! the one a URI names.

pub mod cas;
mod context;
pub mod credentials;
#[cfg(feature = "etcd")]
mod etcd;
mod failure;
mod file;
#[cfg(any(test, feature = "test-support"))]
pub(crate) mod fixtures;
pub(crate) mod forwarding;
pub mod history;
mod key_name;
mod memory;
mod open;
mod options;
pub mod postgres;
mod record;
mod report;
pub(crate) mod retry;
mod secret;
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub mod testing;
mod uri;

pub use context::{StoreContext, StoreObserver, Unobserved};
#[cfg(feature = "etcd")]
pub use etcd::EtcdBackend;
pub use file::FileBackend;
pub use memory::MemoryBackend;
pub use open::{from_uri, open, Opened, Readiness};
pub use options::{
    AzureOptions, BackendOptions, EtcdOptions, GcsOptions, PostgresOptions, S3Options,
};
#[cfg(feature = "postgres")]
pub use postgres::PostgresBackend;
pub use report::{ReportName, StoredReport, MAX_REPORT_LEN};
pub use secret::Secret;
pub(crate) use uri::split_userinfo;
pub use uri::{holds_secret, redact_uri};

use async_trait::async_trait;
use runlock_protocol::{ErrorCode, EventKind, Holder, Key, KeyEvent, KeyRecord, Scope};
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

impl Capabilities {
    /// A network store's: exclusion across hosts, leases that outlive the
    /// agent and lapse unless renewed (the object stores, PostgreSQL, etcd).
    pub const SHARED_LEASES: Capabilities = Capabilities {
        scope: Scope::Global,
        survives_agent: true,
        needs_renewal: true,
        lease_expires: true,
        run_holds_lock: false,
    };
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
    /// The take-over is a break (`release{key}` of a lease held elsewhere):
    /// the history says `broken`, not `forced`.
    pub breaking: bool,
}

/// How a lease ends, for the key's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Its holder let it go, or its run ended.
    Released,
    /// Its client went away still holding it (killed, or crashed): released,
    /// with [`runlock_protocol::REASON_CLIENT_GONE`] as the reason.
    ClientGone,
    /// Its agent gave it up, unable to renew it in time: why.
    Lost(String),
    /// The lease a break (`release{key}`) took the key over with: the
    /// `broken` event is already written, so its end adds none.
    AfterBreak,
}

impl Ending {
    /// The event ending the lease of `holder` (with its token), if any.
    pub fn event(&self, holder: &Holder, at: history::Stamp) -> Option<KeyEvent> {
        let (kind, reason) = self.kind()?;
        let mut event = history::event(kind, holder, holder.token, at);
        event.reason = reason.to_string();
        Some(event)
    }

    /// The event ending the lease that `grant` (the event that granted or
    /// adopted it) began, by the same holder, if any.
    pub fn event_after(&self, grant: &KeyEvent, at: history::Stamp) -> Option<KeyEvent> {
        let (kind, reason) = self.kind()?;
        Some(KeyEvent {
            kind,
            at_ms: at.at_ms,
            clock: at.clock,
            from_token: None,
            reason: reason.to_string(),
            ..grant.clone()
        })
    }

    /// The kind of event ending the lease this way, and its reason; `None`:
    /// none is written.
    pub fn kind(&self) -> Option<(EventKind, &str)> {
        match self {
            Ending::Released => Some((EventKind::Released, "")),
            Ending::ClientGone => Some((EventKind::Released, runlock_protocol::REASON_CLIENT_GONE)),
            Ending::Lost(why) => Some((EventKind::Lost, why.as_str())),
            Ending::AfterBreak => None,
        }
    }
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
    /// The live lease a force took the key from, whose run must have
    /// stopped before the forced run starts (invariant 10).
    pub displaced: Option<Displaced>,
}

/// Where a renewed lease's TTL now counts from, by the holder's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewed {
    /// From when this renewal was asked for: it wrote to the store itself.
    ByThisCall,
    /// From an earlier write, sent then: a store lease that many keys share
    /// and that is kept alive for all of them (etcd's), not per key.
    Since(tokio::time::Instant),
}

impl Renewed {
    /// When the lease's clock started, for a renewal asked for at `called`.
    pub fn since(self, called: tokio::time::Instant) -> tokio::time::Instant {
        match self {
            Renewed::ByThisCall => called,
            Renewed::Since(sent) => sent,
        }
    }
}

/// A live lease taken over by a force (or a break): whose run it was, and
/// what tells that the run has stopped.
#[derive(Debug, Clone)]
pub struct Displaced {
    /// Its fencing token.
    pub token: u64,
    /// Its holder, where the store said (not after a retried write).
    pub holder: Option<Holder>,
    /// Its time to live: its run is stopped by its agent, or stops itself
    /// at its deadline, within this (and the grace) of the force's write.
    pub ttl: Duration,
    /// `file://`: what tells that the run has stopped, its lock file.
    pub lock: Option<file::RunLock>,
}

/// Who takes a lease over with [`Backend::adopt`]: the adopting agent, and
/// the user its client runs as, whom the stored record must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopter {
    /// The adopting agent's id, recorded as the holder's from then on.
    pub agent_id: String,
    /// The uid of the client asking to adopt (`SO_PEERCRED`).
    pub uid: u32,
}

impl Adopter {
    /// Whether the stored `holder` is the asking user: each store checks it
    /// on the record it rewrites, in the same conditional write, never on a
    /// view read earlier (a `file://` view shows no holder once its run ended).
    pub fn owns(&self, holder: &Holder) -> bool {
        holder.uid == self.uid
    }
}

/// What a successful adopt returns.
#[derive(Debug)]
pub struct Adopted {
    /// The lease, now recorded as this agent's, as if just granted.
    pub grant: Grant,
    /// The lease's time to live, as recorded.
    pub ttl: Duration,
}

impl Adopted {
    /// `holder`'s lease, adopted by the write sent at `sent`: no kernel lock
    /// (a run's own lock was never the agent's) and nothing displaced.
    pub fn new(holder: Holder, sent: tokio::time::Instant, ttl: Duration) -> Adopted {
        Adopted {
            grant: Grant {
                holder,
                sent,
                lock: None,
                displaced: None,
            },
            ttl,
        }
    }
}

/// What a backend operation answers.
pub type BackendResult<T> = Result<T, BackendError>;

/// Why a backend operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Someone else holds the key (the holder is unknown while its record is
    /// being written); and the key's last incident, where its record keeps one.
    #[error("held")]
    Held(Option<Box<Holder>>, Option<Box<KeyEvent>>),
    /// The key is held by someone no record names (a process that is not a
    /// run any agent granted); what is known of it, for the peer.
    #[error("{0}")]
    HeldUnrecorded(String),
    /// A guard around the store found the key held by a run no lease
    /// names (`meltano::guard::MeltanoGuard`: a Meltano run runlock does not wrap).
    #[error("held by {}", .0.what)]
    HeldOutside(Box<Outsider>),
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
            BackendError::Held(..)
            | BackendError::HeldUnrecorded(_)
            | BackendError::HeldOutside(_) => ErrorCode::Held,
            BackendError::LeaseMismatch => ErrorCode::NotOwner,
            BackendError::Unavailable(_) => ErrorCode::Unavailable,
            BackendError::Corrupt(_) => ErrorCode::Internal,
            BackendError::Unsupported(_) => ErrorCode::Unsupported,
        }
    }
}

/// Who holds a key outside any lease, as a guard around the store found
/// it: the guard's own words, carried as data to the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outsider {
    /// What it is, in a few words ("a legacy Meltano run"): the error's text.
    pub what: &'static str,
    /// The holder peers are shown for it.
    pub holder: Holder,
    /// What a refused peer is told after "key … is held": who holds it,
    /// and what to do.
    pub explanation: String,
}

/// What a backend is, fixed when it opens: data the agent reads once, never
/// a method a decorator must remember to pass on.
#[derive(Debug, Clone)]
pub struct Profile {
    /// What it promises.
    pub capabilities: Capabilities,
    /// The shortest TTL it can keep renewed (a store that takes few writes per
    /// record needs renewals far apart); shorter requests are refused.
    pub min_ttl: Duration,
    /// Its URI with any secret removed.
    pub description: String,
    /// Keys that may have just become free through another agent (a Postgres
    /// `NOTIFY`, an etcd watch), so that waiters here try again at once
    /// instead of at their next poll; `None`: waiters poll.
    pub releases: Option<tokio::sync::broadcast::Sender<Key>>,
}

/// A backend that states its [`Profile`]: each store, once opened.
pub trait Profiled {
    /// What the backend is.
    fn profile(&self) -> Profile;
}

/// A backend and what it is: what `open` returns and the registry serves
/// over. A decorator wraps `backend` and keeps `profile`.
#[derive(Clone)]
pub struct ProfiledBackend {
    /// The operations.
    pub backend: Arc<dyn Backend>,
    /// What it is.
    pub profile: Profile,
}

impl<B: Backend + Profiled> From<Arc<B>> for ProfiledBackend {
    fn from(backend: Arc<B>) -> ProfiledBackend {
        ProfiledBackend {
            profile: backend.profile(),
            backend,
        }
    }
}

/// Where a listing goes on ([`Backend::list`]): a page of the store, and
/// the last record already listed from it. Opaque to peers, who hand back
/// what a `keys` reply gave them.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ListFrom {
    /// The store's own token for the page (an object store's continuation);
    /// none: the first page.
    pub page: Option<String>,
    /// The store's name of the last record listed; it and the names before
    /// it are skipped.
    pub after: Option<String>,
    /// A store that names keys by escaping them (`key_name`) has listed the
    /// names that spell a prefix and now reads those of keys too long to
    /// spell, named by their hash.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hashed: bool,
}

/// Which page of a listing to read ([`Backend::list`]).
#[derive(Debug, Clone, Copy)]
pub struct PageAsk<'a> {
    /// Only records whose key (a slot's base key) starts with this.
    pub prefix: &'a str,
    /// Where the listing goes on.
    pub from: &'a ListFrom,
    /// At most this many records.
    pub limit: usize,
}

/// One record of a listing: a key's, or one slot's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The store's name for the record: the listing's order, and where the
    /// next page starts after it.
    pub name: String,
    /// The record as `inspect` reports it (its `key` is the record's: a
    /// slot's names the slot, `Key::slot_record`) with its history; or, for
    /// a record that could not be read, why.
    pub read: Result<(KeyRecord, Vec<KeyEvent>), String>,
}

impl Listed {
    /// Whether the record is of a key that starts with `prefix`: a name
    /// read by its hash says nothing of its key. An unreadable record is
    /// kept, to be shown rather than dropped.
    pub fn belongs_under(&self, prefix: &str) -> bool {
        match &self.read {
            Ok((record, _)) => Key::parse_record(&record.key)
                .map(|key| key.split_slot().0.starts_with(prefix))
                .unwrap_or(true),
            Err(_) => true,
        }
    }
}

/// One page of a listing, in the store's name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    /// The records.
    pub records: Vec<Listed>,
    /// Where the listing goes on; `None` after the last record.
    pub next: Option<ListFrom>,
}

/// A lock store's operations. One instance serves every connection; state
/// lives inside. What the store is travels beside it, as [`Profile`], so a
/// decorator (`metrics::TimedBackend`) implements exactly these.
#[async_trait]
pub trait Backend: Reports + Send + Sync + 'static {
    /// Takes `spec.key` now, or reports its holder; never waits for a holder.
    async fn acquire(&self, spec: &AcquireSpec) -> BackendResult<Grant>;
    /// Confirms the lease is still ours and extends it; says from when the
    /// store now counts its TTL.
    async fn renew(&self, lease: &LeaseRef, ttl: Duration) -> BackendResult<Renewed>;
    /// Ends the lease if it is still ours, recording `ending` in the key's
    /// history; a lease already lost is not an error.
    async fn end(&self, lease: &LeaseRef, ending: &Ending) -> BackendResult<()>;
    /// Ends the lease as its holder letting go ([`Backend::end`]).
    async fn release(&self, lease: &LeaseRef) -> BackendResult<()> {
        self.end(lease, &Ending::Released).await
    }
    /// Reads the key's record.
    async fn inspect(&self, key: &Key) -> BackendResult<KeyRecord>;
    /// Reads the key's history, oldest first: the same read as `inspect`.
    async fn history(&self, key: &Key) -> BackendResult<Vec<KeyEvent>>;
    /// Lists, in the store's name order, the page `ask` names: every
    /// record the store keeps, held or free. A record that cannot be read is
    /// listed with why, never left out; a failing store request fails the page.
    async fn list(&self, ask: PageAsk<'_>) -> BackendResult<ListPage>;
    /// The records of `key`'s slots from 1 up that the store keeps, as
    /// [`Backend::list`] reads them: where a listing gives versions, a record
    /// unchanged since the last read is not read again. `None`: the store
    /// has nothing cheaper than reading each slot as `inspect` does.
    async fn list_slots(&self, _key: &Key) -> BackendResult<Option<Vec<Listed>>> {
        Ok(None)
    }
    /// Takes over a lease granted through an agent that has stopped, if the
    /// store still holds it, unexpired, with this id and token, for the
    /// adopter's user (`LeaseMismatch` otherwise, so that a stranger learns
    /// nothing): rewrites its record naming the adopting agent and extends
    /// it, as a renewal would. A store whose leases die with their agent
    /// answers `Unsupported`.
    async fn adopt(&self, lease: &LeaseRef, by: &Adopter) -> BackendResult<Adopted>;
    /// Says, through the store, that the run of `lease`, taken over from
    /// this agent, has stopped, so that the forcer waiting on it may start.
    async fn confirm_stopped(&self, lease: &LeaseRef) -> BackendResult<()>;
    /// Whether the run of the lease `displaced` from `key` has stopped: its
    /// agent said so through the store (and the word is then removed), or
    /// on `file://` its lock is free.
    async fn displaced_stopped(&self, key: &Key, displaced: &Displaced) -> BackendResult<bool>;
}

/// The agents' reports a store keeps beside its keys' records (what each
/// agent alone knows: its waiters and refusals), for the fleet view. Apart
/// from [`Backend`] so that each store keeps them in a module of their own.
#[async_trait]
pub trait Reports: Send + Sync {
    /// Writes this agent's report over the one it wrote before, whatever
    /// that was.
    async fn put_report(&self, agent_id: &ReportName, body: Vec<u8>) -> BackendResult<()>;
    /// Every agent's report the store keeps, as written. A report that
    /// cannot be read is listed with why; a failing store request fails all.
    async fn reports(&self) -> BackendResult<Vec<StoredReport>>;
    /// Removes an agent's report: one that has said nothing for a day.
    async fn remove_report(&self, agent_id: &ReportName) -> BackendResult<()>;
}
