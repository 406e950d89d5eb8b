//! The agent's leases, by lease id, by key and by connection, and the local
//! waiter queues: one place that decides who holds what on this host.

use crate::access::Access;
use crate::backend::{
    AcquireSpec, Backend, BackendError, Capabilities, Grant, LeaseRef, ProfiledBackend,
};
use crate::legacy::{self, MeltanoSystemDb};
use crate::process::{Peer, Run};
use crate::renewal::deadline;
use crate::renewal::{Renewals, Report};
use crate::shown::{self, Viewer};
use runlock_protocol::timing;
use runlock_protocol::types::MAX_KEY_LEN;
use runlock_protocol::{
    AgentMessage, ErrorCode, Holder, Key, KeyRecord, Lease, LeaseInfo, LostReason, OnLost,
    OnUnavailable, WireError, MAX_COMMAND_LEN, MAX_FRAME_LEN, MAX_KEYS_PER_REQUEST,
};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// At most this many `renewed` events wait for one peer to read them.
pub const RENEWED_BACKLOG: usize = 64;
/// Waiters re-check the backend (for holders on other agents) this often at most.
const POLL_CAP: Duration = Duration::from_millis(500);
const POLL_START: Duration = Duration::from_millis(20);
/// How long naming a lost lease's new holder may take before the run is told without it.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);

/// A connection's id within this agent.
pub type ConnId = u64;

/// The peer's credentials, from SO_PEERCRED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// The connecting process.
    pub pid: u32,
    /// Its uid.
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
}

/// Who this agent is, as recorded in every holder.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Host name.
    pub host: String,
    /// This agent process's id.
    pub agent_id: String,
    /// The uid the agent runs as.
    pub uid: u32,
}

/// The operator's settings the registry applies.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The TTL used when a request gives none.
    pub default_ttl: Duration,
    /// What runs do when the backend cannot be reached (told to clients).
    pub on_unavailable: OnUnavailable,
    /// Who may force and break.
    pub access: Access,
    /// Meltano's system database, checked for legacy runs before each grant.
    pub legacy: Option<Arc<MeltanoSystemDb>>,
}

impl Policy {
    /// The defaults, with this TTL.
    pub fn with_ttl(default_ttl: Duration) -> Policy {
        Policy {
            default_ttl,
            on_unavailable: OnUnavailable::Fail,
            access: Access::default(),
            legacy: None,
        }
    }
}

/// An `acquire` request, decoded.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// Keys as sent; validated here.
    pub keys: Vec<String>,
    /// Requested TTL, or the default.
    pub ttl: Option<Duration>,
    /// How long to wait for held keys.
    pub wait: Duration,
    /// Take keys over from their holders.
    pub force: bool,
    /// The protected command line.
    pub command: String,
    /// What to do to the attached run when a lease is lost after the client is gone.
    pub on_lost: OnLost,
}

/// What `acquire` and `reattach` hand back.
#[derive(Debug)]
pub struct Granted {
    /// One lease per key, in sorted key order.
    pub leases: Vec<Lease>,
    /// Their time to live.
    pub ttl: Duration,
    /// Until when all of them stay guaranteed without another renewal, where
    /// leases outlive the agent and can expire.
    pub valid_until: Option<Instant>,
    /// The locks for the run to hold, one per lease in order, where the
    /// backend hands them over (`Grant::lock`); empty elsewhere.
    pub locks: Vec<OwnedFd>,
}

/// One key taken: its lease, until when it stays guaranteed, its lock for the run.
type Taken = (Lease, Option<Instant>, Option<OwnedFd>);

struct LocalLease {
    key: Key,
    conn: ConnId,
    ttl: Duration,
    holder: Holder,
}

impl LocalLease {
    fn reference(&self, lease_id: &str) -> LeaseRef {
        LeaseRef {
            key: self.key.clone(),
            lease_id: lease_id.to_string(),
            token: self.holder.token,
        }
    }
}

struct Conn {
    peer: PeerCred,
    /// The peer's user name, looked up once: NSS reads files on every call.
    user: String,
    /// Whether the peer may force and break, decided once.
    may_override: bool,
    events: mpsc::UnboundedSender<AgentMessage>,
    /// `renewed` events queued for the peer and not yet written to it.
    renewed_backlog: Arc<AtomicUsize>,
    leases: BTreeSet<String>,
    /// The peer's own process, to tell whether it is still there to act on `lost`.
    shim: Peer,
    child: Option<Run>,
    on_lost: OnLost,
    /// Its leases were adopted from a stopped agent: the run does not hold
    /// this connection, so its end is not the run's end.
    reattached: bool,
}

struct Waiter {
    id: u64,
    notify: Arc<Notify>,
}

#[derive(Default)]
struct State {
    leases: HashMap<String, LocalLease>,
    by_key: HashMap<Key, String>,
    conns: HashMap<ConnId, Conn>,
    queues: HashMap<Key, VecDeque<Waiter>>,
    /// The agent is stopping and its leases outlive it: they are left for
    /// the next agent, neither renewed nor released.
    handing_over: bool,
}

/// Wakes the first local waiter for each key the backend says another agent
/// let go; every waiter when too many came at once to keep count.
async fn wake_on_releases(
    registry: Weak<Registry>,
    mut releases: tokio::sync::broadcast::Receiver<Key>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let released = releases.recv().await;
        let Some(registry) = registry.upgrade() else {
            return;
        };
        let state = registry.state();
        match released {
            Ok(key) => state.wake_head(&key),
            Err(RecvError::Lagged(_)) => {
                for key in state.queues.keys() {
                    state.wake_head(key);
                }
            }
            Err(RecvError::Closed) => return,
        }
    }
}

impl State {
    fn wake_head(&self, key: &Key) {
        if let Some(head) = self.queues.get(key).and_then(|q| q.front()) {
            head.notify.notify_one();
        }
    }

    fn local_holder(&self, key: &Key) -> Option<Holder> {
        self.by_key
            .get(key)
            .and_then(|id| self.leases.get(id))
            .map(|l| l.holder.clone())
    }

    /// Forgets a lease; returns it with its connection's means to be told.
    fn remove_lease(&mut self, lease_id: &str) -> Option<LocalLease> {
        let lease = self.leases.remove(lease_id)?;
        crate::metrics::leases_held(self.leases.len());
        if self.by_key.get(&lease.key).is_some_and(|id| id == lease_id) {
            self.by_key.remove(&lease.key);
        }
        if let Some(conn) = self.conns.get_mut(&lease.conn) {
            conn.leases.remove(lease_id);
        }
        Some(lease)
    }
}

impl Granted {
    fn new(ttl: Duration, capacity: usize) -> Granted {
        Granted {
            leases: Vec::with_capacity(capacity),
            ttl,
            valid_until: None,
            locks: Vec::new(),
        }
    }

    fn add(&mut self, (lease, valid_until, lock): Taken) {
        self.leases.push(lease);
        self.locks.extend(lock);
        self.valid_until = match (self.valid_until, valid_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// The lease registry of one agent.
pub struct Registry {
    backend: Arc<dyn Backend>,
    capabilities: Capabilities,
    min_ttl: Duration,
    description: String,
    identity: Identity,
    policy: Policy,
    state: Mutex<State>,
    renewals: Renewals,
    next_id: AtomicU64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(uid.into()) {
        Ok(Some(user)) => user.name,
        _ => uid.to_string(),
    }
}

fn bad_request(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

/// The key, or `invalid_key` naming the rule it breaks; the key is echoed
/// cut to the longest valid length, so the error fits a frame.
/// Acts on what the renewal scheduler reports, until the registry is gone.
async fn take_reports(registry: Weak<Registry>, mut reports: mpsc::UnboundedReceiver<Report>) {
    while let Some(report) = reports.recv().await {
        let Some(registry) = registry.upgrade() else {
            return;
        };
        match report {
            Report::Renewed {
                lease_id,
                valid_until,
            } => registry.renewed(&lease_id, valid_until),
            // Its own task: finding out who took the lease may wait on the store.
            Report::Lost { lease, taken } => {
                tokio::spawn(async move { registry.renewal_lost(&lease, taken).await });
            }
        }
    }
}

fn valid_key(key: &str) -> Result<Key, WireError> {
    Key::new(key).map_err(|e| WireError {
        key: Some(shown::cut(key, MAX_KEY_LEN)),
        ..WireError::new(ErrorCode::InvalidKey, e.to_string())
    })
}

impl Registry {
    /// A registry over `store`; starts the renewal scheduler on the current runtime.
    pub fn new(
        store: impl Into<ProfiledBackend>,
        identity: Identity,
        policy: Policy,
    ) -> Arc<Registry> {
        let ProfiledBackend { backend, profile } = store.into();
        let releases = profile.releases.map(|sender| sender.subscribe());
        let lease_expires = profile.capabilities.lease_expires;
        let (renewals, reports) = Renewals::start(backend.clone(), lease_expires);
        let registry = Arc::new(Registry {
            capabilities: profile.capabilities,
            min_ttl: profile.min_ttl,
            description: profile.description,
            renewals,
            backend,
            identity,
            policy,
            state: Mutex::new(State::default()),
            next_id: AtomicU64::new(1),
        });
        tokio::spawn(take_reports(Arc::downgrade(&registry), reports));
        if let Some(releases) = releases {
            tokio::spawn(wake_on_releases(Arc::downgrade(&registry), releases));
        }
        registry
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // invariant: nothing panics while holding the lock, so poisoning cannot happen
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This agent's identity.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The backend's promises.
    pub fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    /// The backend's URI, redacted.
    pub fn backend_description(&self) -> String {
        self.description.clone()
    }

    /// The operator's settings.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Registers a connection from `peer`, whose supplementary groups are
    /// `groups` and whose process is `shim`; `events` receives its events.
    pub fn open_connection(
        &self,
        peer: PeerCred,
        shim: Peer,
        groups: &[u32],
        events: mpsc::UnboundedSender<AgentMessage>,
        renewed_backlog: Arc<AtomicUsize>,
    ) -> ConnId {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let user = user_name(peer.uid);
        let access = &self.policy.access;
        let may_override = access.allows(peer.uid, &[peer.gid]) || access.allows(peer.uid, groups);
        let conn = Conn {
            peer,
            user,
            may_override,
            events,
            renewed_backlog,
            leases: BTreeSet::new(),
            shim,
            child: None,
            on_lost: OnLost::Term,
            reattached: false,
        };
        self.state().conns.insert(id, conn);
        id
    }

    /// Ends a connection: every lease it holds is released at once, unless
    /// the agent is handing its leases over to the next one.
    pub async fn close_connection(&self, conn: ConnId) {
        let (leases, handing_over) = {
            let mut state = self.state();
            let leases: Vec<String> = match state.conns.remove(&conn) {
                Some(c) => c.leases.into_iter().collect(),
                None => return,
            };
            if state.handing_over {
                for lease_id in &leases {
                    state.remove_lease(lease_id);
                }
            }
            (leases, state.handing_over)
        };
        if handing_over {
            return;
        }
        for lease_id in leases {
            self.release_lease(&lease_id).await;
        }
    }

    /// The agent is stopping: where leases outlive it, stop renewing and keep
    /// every lease for the runs to `reattach` to the next agent. Returns
    /// whether it does so (elsewhere the leases are released as connections close).
    pub fn hand_over(&self) -> bool {
        if !self.capabilities.survives_agent {
            return false;
        }
        let held = {
            let mut state = self.state();
            if std::mem::replace(&mut state.handing_over, true) {
                return true;
            }
            state.leases.len()
        };
        self.renewals.stop_all();
        tracing::info!(leases = held, "leaving every lease for the next agent");
        true
    }

    /// The process group of a reattached connection's run while it still has
    /// members: such a connection's end (its shim killed) is not the run's.
    pub fn run_outliving(&self, conn: ConnId) -> Option<u32> {
        let run = self
            .state()
            .conns
            .get(&conn)
            .filter(|c| c.reattached && !c.leases.is_empty())?
            .child?;
        // Outside the lock: this reads /proc.
        run.has_members().then_some(run.pgid())
    }

    /// The connection's peer, its user name, and whether it may force and break.
    fn peer(&self, conn: ConnId) -> Result<(PeerCred, String, bool), WireError> {
        self.state()
            .conns
            .get(&conn)
            .map(|c| (c.peer, c.user.clone(), c.may_override))
            .ok_or_else(|| WireError::new(ErrorCode::Internal, "connection is closing"))
    }

    /// How the connection's peer sees holders.
    fn viewer(&self, conn: ConnId) -> Viewer {
        let state = self.state();
        let c = state.conns.get(&conn);
        Viewer {
            uid: c.map_or(u32::MAX, |c| c.peer.uid),
            may_override: c.is_some_and(|c| c.may_override),
        }
    }

    fn show(&self, holder: &Holder, viewer: Viewer) -> Holder {
        shown::holder(holder, viewer, &self.identity.host)
    }

    fn forbidden(&self, peer: PeerCred, what: &str) -> WireError {
        WireError::new(
            ErrorCode::Forbidden,
            format!(
                "uid {} may not {what} (allowed: {})",
                peer.uid,
                self.policy.access.describe()
            ),
        )
    }

    /// Takes every key of `req`, in sorted order, all or nothing.
    pub async fn acquire(
        &self,
        conn: ConnId,
        req: AcquireRequest,
        cancel: &CancellationToken,
    ) -> Result<Granted, WireError> {
        let force = req.force;
        let result = self.acquire_all(conn, req, cancel).await;
        crate::metrics::acquisition(force, &result, cancel.is_cancelled());
        result
    }

    async fn acquire_all(
        &self,
        conn: ConnId,
        req: AcquireRequest,
        cancel: &CancellationToken,
    ) -> Result<Granted, WireError> {
        if req.keys.len() > MAX_KEYS_PER_REQUEST {
            return Err(bad_request(format!(
                "acquire names {} keys; at most {MAX_KEYS_PER_REQUEST} may be taken at once",
                req.keys.len()
            )));
        }
        let mut keys = Vec::with_capacity(req.keys.len());
        for key in &req.keys {
            keys.push(valid_key(key)?);
        }
        // Every agent takes keys in the same order, so multi-key runs cannot deadlock.
        keys.sort();
        keys.dedup();
        if keys.is_empty() {
            return Err(bad_request("acquire needs at least one key"));
        }
        let ttl = req.ttl.unwrap_or(self.policy.default_ttl);
        let shortest = timing::MIN_TTL.max(self.min_ttl);
        if ttl < shortest || ttl > timing::MAX_TTL {
            let on = if shortest > timing::MIN_TTL {
                format!(" on {}", self.description)
            } else {
                String::new()
            };
            return Err(bad_request(format!(
                "ttl_ms must be between {} and {}{on}, got {}",
                shortest.as_millis(),
                timing::MAX_TTL.as_millis(),
                ttl.as_millis()
            )));
        }
        let (peer, user, may_override) = self.peer(conn)?;
        if req.force && !may_override {
            return Err(self.forbidden(peer, "force a lock"));
        }
        let holder = Holder {
            host: self.identity.host.clone(),
            agent_id: self.identity.agent_id.clone(),
            pid: peer.pid,
            uid: peer.uid,
            gid: peer.gid,
            user,
            command: shown::cut(&req.command, MAX_COMMAND_LEN),
            acquired_at_ms: 0,
            token: 0,
        };
        let deadline = Instant::now() + req.wait;
        let mut granted = Granted::new(ttl, keys.len());
        for key in keys {
            match self
                .acquire_key(conn, key, ttl, &req, &holder, deadline, cancel)
                .await
            {
                Ok(taken) => granted.add(taken),
                Err(err) => {
                    for lease in granted.leases {
                        self.release_lease(&lease.lease_id).await;
                    }
                    return Err(err);
                }
            }
        }
        if let Some(c) = self.state().conns.get_mut(&conn) {
            c.on_lost = req.on_lost;
        }
        Ok(granted)
    }

    /// Adopts leases taken through an agent that has stopped, once the backend
    /// confirms each is still held, unexpired, with its id and token, by this
    /// peer's user. All or nothing: on a failure the leases adopted so far
    /// stay with this connection, to be released when it closes (after its
    /// run has stopped).
    pub async fn reattach(
        &self,
        conn: ConnId,
        leases: Vec<Lease>,
        on_lost: OnLost,
    ) -> Result<Granted, WireError> {
        if leases.is_empty() {
            return Err(bad_request("reattach needs at least one lease"));
        }
        let (peer, _, may_override) = self.peer(conn)?;
        let mut granted = Granted::new(Duration::ZERO, leases.len());
        if leases.len() > MAX_KEYS_PER_REQUEST {
            return Err(bad_request(format!(
                "reattach names {} leases; at most {MAX_KEYS_PER_REQUEST} may be adopted at once",
                leases.len()
            )));
        }
        for lease in leases {
            let key = valid_key(&lease.key)?;
            if self.state().leases.contains_key(&lease.lease_id) {
                return Err(bad_request(format!(
                    "lease {} is already held through this agent",
                    lease.lease_id
                )));
            }
            let reference = LeaseRef {
                key: key.clone(),
                lease_id: lease.lease_id.clone(),
                token: lease.token,
            };
            let record = self
                .backend
                .inspect(&key)
                .await
                .map_err(|e| e.to_wire(&key))?;
            if let Some(h) = record.holder.filter(|h| h.uid != peer.uid && !may_override) {
                return Err(WireError {
                    key: Some(key.to_string()),
                    ..self.forbidden(peer, &format!("reattach a lease of uid {}", h.uid))
                });
            }
            let adopted = self
                .backend
                .adopt(&reference, &self.identity.agent_id)
                .await
                .map_err(|e| match e {
                    BackendError::LeaseMismatch => WireError {
                        key: Some(key.to_string()),
                        ..WireError::new(
                            ErrorCode::NotOwner,
                            format!(
                                "lease {} on {key:?} is no longer held: it expired, was \
                                 taken over or was released",
                                lease.lease_id
                            ),
                        )
                    },
                    other => other.to_wire(&key),
                })?;
            granted.ttl = adopted.ttl;
            let spec = AcquireSpec {
                key,
                lease_id: lease.lease_id,
                holder: adopted.grant.holder.clone(),
                ttl: adopted.ttl,
                force: false,
            };
            let taken = self.register(conn, spec, adopted.grant).await?;
            granted.add(taken);
        }
        if let Some(c) = self.state().conns.get_mut(&conn) {
            c.on_lost = on_lost;
            c.reattached = true;
        }
        Ok(granted)
    }

    /// A lease was renewed: its run learns how long it may go on should it lose
    /// this agent (only where leases outlive the agent; the scheduler reports
    /// no renewal of a lease that cannot expire).
    pub(crate) fn renewed(&self, lease_id: &str, valid_until: Instant) {
        if !self.capabilities.survives_agent {
            return;
        }
        let state = self.state();
        if let Some(c) = state
            .leases
            .get(lease_id)
            .and_then(|l| state.conns.get(&l.conn))
        {
            // A peer that does not read would otherwise make the queue grow
            // without end; skipping one only leaves it an earlier, safe deadline.
            if c.renewed_backlog.fetch_add(1, Ordering::Relaxed) >= RENEWED_BACKLOG {
                c.renewed_backlog.fetch_sub(1, Ordering::Relaxed);
                return;
            }
            let _ = c.events.send(AgentMessage::Renewed {
                lease_id: lease_id.to_string(),
                valid_for_ms: valid_until
                    .saturating_duration_since(Instant::now())
                    .as_millis() as u64,
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn acquire_key(
        &self,
        conn: ConnId,
        key: Key,
        ttl: Duration,
        req: &AcquireRequest,
        holder: &Holder,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<Taken, WireError> {
        let place = self.enqueue(&key);
        let mut poll = POLL_START;
        loop {
            let at_head = req.force || self.is_head(&key, place.id);
            let mut unreachable = None;
            let last_holder = if at_head {
                let spec = AcquireSpec {
                    key: key.clone(),
                    lease_id: uuid::Uuid::new_v4().to_string(),
                    holder: Holder {
                        acquired_at_ms: now_ms(),
                        ..holder.clone()
                    },
                    ttl,
                    force: req.force,
                };
                // --force skips Meltano's check, as `meltano run --force` does.
                let legacy = legacy::check(self.policy.legacy.as_deref(), &key, req.force);
                let acquired = match legacy.await {
                    Ok(()) => self.backend.acquire(&spec).await,
                    Err(err) => Err(err),
                };
                match acquired {
                    Ok(grant) => return self.register(conn, spec, grant).await,
                    Err(BackendError::Held(h)) => h,
                    // A run that may wait also waits out a store that cannot be reached.
                    Err(err @ BackendError::Unavailable(_)) if !req.wait.is_zero() => {
                        unreachable = Some(err);
                        None
                    }
                    Err(err) => return Err(err.to_wire(&key)),
                }
            } else {
                None // behind a local waiter: who holds it is looked up only if we give up
            };
            if Instant::now() >= deadline {
                if let Some(err) = unreachable {
                    return Err(err.to_wire(&key));
                }
                let last_holder = match last_holder {
                    Some(holder) => Some(holder),
                    None => self.holder_of(&key).await,
                };
                let waited = !req.wait.is_zero();
                let mut err = WireError::new(
                    if waited {
                        ErrorCode::Timeout
                    } else {
                        ErrorCode::Held
                    },
                    if waited {
                        format!(
                            "key {key:?} is still held after waiting {}",
                            humantime::format_duration(req.wait)
                        )
                    } else {
                        format!("key {key:?} is held")
                    },
                );
                err.key = Some(key.to_string());
                err.holder = last_holder;
                legacy::explain(&mut err);
                let viewer = self.viewer(conn);
                err.holder = err.holder.map(|h| Box::new(self.show(&h, viewer)));
                return Err(err);
            }
            // A local release wakes us at once; polling finds holders on other agents.
            let jittered = poll.mul_f64(0.5 + fastrand::f64());
            tokio::select! {
                _ = place.notify.notified() => {}
                _ = tokio::time::sleep(jittered) => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = cancel.cancelled() => {
                    return Err(WireError::new(ErrorCode::Internal, "acquire cancelled"));
                }
            }
            poll = (poll * 2).min(POLL_CAP);
        }
    }

    /// The key's holder: known here if it is local, else the backend's record.
    async fn holder_of(&self, key: &Key) -> Option<Box<Holder>> {
        let local = self.state().local_holder(key);
        match local {
            Some(holder) => Some(Box::new(holder)),
            None => self
                .backend
                .inspect(key)
                .await
                .ok()
                .and_then(|r| r.holder)
                .map(Box::new),
        }
    }

    fn enqueue(&self, key: &Key) -> Place<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        self.state()
            .queues
            .entry(key.clone())
            .or_default()
            .push_back(Waiter {
                id,
                notify: notify.clone(),
            });
        Place {
            registry: self,
            key: key.clone(),
            id,
            notify,
        }
    }

    fn is_head(&self, key: &Key, id: u64) -> bool {
        self.state()
            .queues
            .get(key)
            .and_then(|q| q.front())
            .is_some_and(|w| w.id == id)
    }

    /// Records a granted lease; a local lease it forced out is told it is lost.
    /// Returns the lease and, where leases outlive the agent, until when it is
    /// guaranteed without a renewal.
    async fn register(
        &self,
        conn: ConnId,
        spec: AcquireSpec,
        grant: Grant,
    ) -> Result<Taken, WireError> {
        let (holder, lock) = (grant.holder, grant.lock);
        let lease_id = spec.lease_id.clone();
        let lease = LocalLease {
            key: spec.key.clone(),
            conn,
            ttl: spec.ttl,
            holder: holder.clone(),
        };
        let reference = lease.reference(&lease_id);
        let registered = {
            let mut state = self.state();
            match state.conns.get_mut(&conn) {
                Some(c) => {
                    c.leases.insert(lease_id.clone());
                    let displaced = state.by_key.insert(spec.key.clone(), lease_id.clone());
                    state.leases.insert(lease_id.clone(), lease);
                    crate::metrics::leases_held(state.leases.len());
                    Some(displaced)
                }
                None => None,
            }
        };
        let Some(displaced) = registered else {
            let _ = self.backend.release(&reference).await;
            return Err(WireError::new(
                ErrorCode::Internal,
                "connection closed during acquire",
            ));
        };
        if self.capabilities.needs_renewal {
            self.renewals.start_lease(reference, spec.ttl, grant.sent);
        }
        if let Some(old) = displaced {
            let message = format!(
                "taken over with --force by {}@{} (pid {})",
                holder.user, holder.host, holder.pid
            );
            self.lose(&old, LostReason::Forced, message, Some(holder.clone()))
                .await;
        }
        tracing::info!(key = %spec.key, token = holder.token, lease = %lease_id, force = spec.force, "acquired");
        let valid_until = (self.capabilities.survives_agent && self.capabilities.lease_expires)
            .then(|| deadline(grant.sent, spec.ttl));
        let lease = Lease {
            key: spec.key.to_string(),
            lease_id,
            token: holder.token,
        };
        Ok((lease, valid_until, lock))
    }

    /// Releases leases this connection holds.
    pub async fn release(&self, conn: ConnId, lease_ids: &[String]) -> Result<u32, WireError> {
        {
            let state = self.state();
            let owned = state.conns.get(&conn).map(|c| &c.leases);
            if let Some(id) = lease_ids
                .iter()
                .find(|id| !owned.is_some_and(|o| o.contains(*id)))
            {
                return Err(WireError::new(
                    ErrorCode::NotOwner,
                    format!("lease {id} is not held by this connection"),
                ));
            }
        }
        let mut count = 0;
        for id in lease_ids {
            count += u32::from(self.release_lease(id).await);
        }
        Ok(count)
    }

    async fn release_lease(&self, lease_id: &str) -> bool {
        let Some(lease) = self.state().remove_lease(lease_id) else {
            return false;
        };
        self.renewals.stop(lease_id);
        if let Err(err) = self.backend.release(&lease.reference(lease_id)).await {
            tracing::warn!(key = %lease.key, error = %err, "release failed");
        }
        tracing::info!(key = %lease.key, token = lease.holder.token, lease = %lease_id, "released");
        // Only after the backend let go, or the woken waiter would find it still held.
        self.state().wake_head(&lease.key);
        true
    }

    /// Breaks whoever holds `key`, on this agent or another sharing the backend.
    pub async fn break_key(&self, conn: ConnId, key: &str) -> Result<u32, WireError> {
        let key = valid_key(key)?;
        let (peer, user, may_override) = self.peer(conn)?;
        if !may_override {
            return Err(self.forbidden(peer, "release another's lock"));
        }
        let local = self.state().by_key.get(&key).cloned();
        if let Some(lease_id) = local {
            let message = format!("released by uid {} (pid {})", peer.uid, peer.pid);
            self.lose(&lease_id, LostReason::Broken, message, None)
                .await;
            return Ok(1);
        }
        let record = self
            .backend
            .inspect(&key)
            .await
            .map_err(|e| e.to_wire(&key))?;
        if record.holder.is_none() && record.state != runlock_protocol::KeyState::Held {
            return Ok(0);
        }
        // Held through another agent: take it over, then let it go.
        let spec = AcquireSpec {
            key: key.clone(),
            lease_id: uuid::Uuid::new_v4().to_string(),
            holder: Holder {
                host: self.identity.host.clone(),
                agent_id: self.identity.agent_id.clone(),
                pid: peer.pid,
                uid: peer.uid,
                gid: peer.gid,
                user,
                command: "runlock release".to_string(),
                acquired_at_ms: now_ms(),
                token: 0,
            },
            ttl: self.policy.default_ttl,
            force: true,
        };
        let grant = self
            .backend
            .acquire(&spec)
            .await
            .map_err(|e| e.to_wire(&key))?;
        let lease = LeaseRef {
            key: key.clone(),
            lease_id: spec.lease_id,
            token: grant.holder.token,
        };
        self.backend
            .release(&lease)
            .await
            .map_err(|e| e.to_wire(&key))?;
        tracing::info!(key = %key, uid = peer.uid, "broke a lease held through another agent");
        Ok(1)
    }

    /// A lease is gone: tell its connection, stop the run if its client is gone.
    pub(crate) async fn lose(
        &self,
        lease_id: &str,
        reason: LostReason,
        message: String,
        holder: Option<Holder>,
    ) {
        let (lease, notice) = {
            let mut state = self.state();
            let Some(lease) = state.remove_lease(lease_id) else {
                return;
            };
            let notice = state.conns.get(&lease.conn).map(|c| {
                let viewer = Viewer {
                    uid: c.peer.uid,
                    may_override: c.may_override,
                };
                (
                    c.events.clone(),
                    viewer,
                    c.child.filter(|_| c.shim.gone()),
                    c.on_lost,
                )
            });
            (lease, notice)
        };
        self.renewals.stop(lease_id);
        tracing::warn!(key = %lease.key, token = lease.holder.token, ?reason, "lease lost");
        crate::metrics::lost(reason);
        let grace = timing::kill_grace(lease.ttl);
        if let Some((events, viewer, orphan, on_lost)) = notice {
            let _ = events.send(AgentMessage::Lost {
                lease_id: lease_id.to_string(),
                key: lease.key.to_string(),
                reason,
                message,
                holder: holder.map(|h| self.show(&h, viewer)),
            });
            // The shim acts on `lost` itself; only when it is gone does the agent act for it.
            if let Some(run) = orphan {
                run.stop(on_lost, grace);
            }
        }
        let reference = lease.reference(lease_id);
        if reason == LostReason::Expired {
            // The record may still name us: freeing it now would let another run
            // start while ours is still being stopped. Free it once ours is gone.
            let backend = self.backend.clone();
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                let _ = backend.release(&reference).await;
            });
        } else {
            // Someone else holds it now: this only lets go of our local hold.
            let _ = self.backend.release(&reference).await;
        }
        self.state().wake_head(&lease.key);
    }

    /// The renewal scheduler gave the lease up: `taken` when the store says it is
    /// someone else's, otherwise its deadline passed without a renewal.
    pub(crate) async fn renewal_lost(&self, lease: &LeaseRef, taken: bool) {
        if !taken {
            // Tell the run now: looking up who else holds it could hang on the same store.
            let message = "the lease could not be renewed before its deadline".to_string();
            return self
                .lose(&lease.lease_id, LostReason::Expired, message, None)
                .await;
        }
        let lookup = tokio::time::timeout(LOOKUP_TIMEOUT, self.backend.inspect(&lease.key));
        let record = lookup.await.ok().and_then(Result::ok);
        let (reason, message, holder) = match record {
            Some(KeyRecord {
                holder: Some(h), ..
            }) => (
                LostReason::Forced,
                format!(
                    "taken over by {}@{} (pid {}, token {})",
                    shown::cut(&h.user, shown::MAX_NAME_LEN),
                    shown::cut(&h.host, shown::MAX_NAME_LEN),
                    h.pid,
                    h.token
                ),
                Some(h),
            ),
            // Free at a later token: someone took it and let it go before we
            // looked, a `runlock release` or a forced run that has already ended.
            Some(r) if r.token > lease.token => (
                LostReason::Broken,
                format!(
                    "taken by another run since (a --force or runlock release), which has \
                     already let it go at token {}",
                    r.token
                ),
                None,
            ),
            _ => (
                LostReason::Expired,
                "the lease is no longer held in the backend".to_string(),
                None,
            ),
        };
        self.lose(&lease.lease_id, reason, message, holder).await;
    }

    /// Names the run's process for every lease of the connection, once it is
    /// found to be the peer's; a refused one leaves any earlier one in place.
    pub fn attach(&self, conn: ConnId, pid: u32, pgid: u32) -> Result<(), WireError> {
        let (peer, _, _) = self.peer(conn)?;
        let run = Run::attach(peer.uid, pid, pgid).inspect_err(|err| {
            tracing::warn!(pid, pgid, error = %err, "attach refused");
        })?;
        if let Some(c) = self.state().conns.get_mut(&conn) {
            c.child = Some(run);
        }
        Ok(())
    }

    /// How many leases this agent holds (without copying them, as `list` does).
    pub fn lease_count(&self) -> usize {
        self.state().leases.len()
    }

    /// Every lease held through this agent.
    pub fn list(&self) -> Vec<LeaseInfo> {
        let state = self.state();
        let mut leases: Vec<LeaseInfo> = state
            .leases
            .iter()
            .map(|(id, l)| LeaseInfo {
                key: l.key.to_string(),
                lease_id: id.clone(),
                ttl_ms: l.ttl.as_millis() as u64,
                holder: l.holder.clone(),
                child_pid: state
                    .conns
                    .get(&l.conn)
                    .and_then(|c| c.child)
                    .map(|run| run.pid()),
            })
            .collect();
        leases.sort_by(|a, b| a.key.cmp(&b.key));
        leases
    }

    /// The leases held through this agent as the connection's peer may see
    /// them, as many as fit one reply; and how many were left out.
    pub fn list_for(&self, conn: ConnId) -> (Vec<LeaseInfo>, u32) {
        // Field names, lease id and integers of one entry take less than this,
        // and the reply's own envelope less than the headroom.
        const ENTRY_OVERHEAD: usize = 320;
        const ENVELOPE_HEADROOM: usize = 4096;
        let viewer = self.viewer(conn);
        let mut room = MAX_FRAME_LEN - ENVELOPE_HEADROOM;
        let mut shown = Vec::new();
        let all = self.list();
        let total = all.len();
        for mut lease in all {
            lease.holder = self.show(&lease.holder, viewer);
            let h = &lease.holder;
            let size = ENTRY_OVERHEAD
                + lease.key.len()
                + h.host.len()
                + h.agent_id.len()
                + h.user.len()
                + h.command.len();
            if size > room {
                break;
            }
            room -= size;
            shown.push(lease);
        }
        let omitted = u32::try_from(total - shown.len()).unwrap_or(u32::MAX);
        (shown, omitted)
    }

    /// The backend's record of a key, as the connection's peer may see it.
    pub async fn inspect_for(&self, conn: ConnId, key: &str) -> Result<KeyRecord, WireError> {
        let mut record = self.inspect(key).await?;
        let viewer = self.viewer(conn);
        record.holder = record.holder.map(|h| self.show(&h, viewer));
        Ok(record)
    }

    /// The backend's record of a key.
    pub async fn inspect(&self, key: &str) -> Result<KeyRecord, WireError> {
        let key = valid_key(key)?;
        self.backend
            .inspect(&key)
            .await
            .map_err(|e| e.to_wire(&key))
    }
}

/// A waiter's place in a key's local queue; leaving it wakes the next in line.
struct Place<'a> {
    registry: &'a Registry,
    key: Key,
    id: u64,
    notify: Arc<Notify>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut state = self.registry.state();
        if let Some(queue) = state.queues.get_mut(&self.key) {
            queue.retain(|w| w.id != self.id);
            if queue.is_empty() {
                state.queues.remove(&self.key);
            } else {
                state.wake_head(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemoryBackend;

    const ROOT: PeerCred = PeerCred {
        pid: 1,
        uid: 0,
        gid: 0,
    };

    fn registry() -> Arc<Registry> {
        let identity = Identity {
            host: "test-host".into(),
            agent_id: "agent-1".into(),
            uid: 0,
        };
        Registry::new(
            Arc::new(MemoryBackend::default()),
            identity,
            Policy::with_ttl(Duration::from_secs(30)),
        )
    }

    fn request(keys: &[&str], wait: Duration, force: bool) -> AcquireRequest {
        AcquireRequest {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            ttl: None,
            wait,
            force,
            command: "test".into(),
            on_lost: OnLost::Ignore,
        }
    }

    fn connect(
        registry: &Registry,
        peer: PeerCred,
    ) -> (ConnId, mpsc::UnboundedReceiver<AgentMessage>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let shim = Peer::of_pid(std::process::id());
        (
            registry.open_connection(peer, shim, &[], tx, Arc::default()),
            rx,
        )
    }

    async fn take(
        registry: &Registry,
        conn: ConnId,
        keys: &[&str],
    ) -> Result<Vec<Lease>, WireError> {
        let never = CancellationToken::new();
        registry
            .acquire(conn, request(keys, Duration::ZERO, false), &never)
            .await
            .map(|g| g.leases)
    }

    fn waiting(registry: &Registry, key: &str) -> usize {
        let key = Key::new(key).expect("valid");
        registry.state().queues.get(&key).map_or(0, |q| q.len())
    }

    /// Two agents on one store whose releases are announced, as a Postgres
    /// `NOTIFY` or an etcd watch announces them.
    struct Announcing {
        store: Arc<MemoryBackend>,
        released: tokio::sync::broadcast::Sender<Key>,
    }

    impl crate::backend::Profiled for Announcing {
        fn profile(&self) -> crate::backend::Profile {
            crate::backend::Profile {
                description: "announcing".into(),
                releases: Some(self.released.clone()),
                ..self.store.profile()
            }
        }
    }

    #[async_trait::async_trait]
    impl Backend for Announcing {
        async fn acquire(
            &self,
            spec: &crate::backend::AcquireSpec,
        ) -> Result<crate::backend::Grant, BackendError> {
            self.store.acquire(spec).await
        }
        async fn renew(&self, lease: &LeaseRef, ttl: Duration) -> Result<(), BackendError> {
            self.store.renew(lease, ttl).await
        }
        async fn release(&self, lease: &LeaseRef) -> Result<(), BackendError> {
            self.store.release(lease).await?;
            let _ = self.released.send(lease.key.clone());
            Ok(())
        }
        async fn inspect(&self, key: &Key) -> Result<runlock_protocol::KeyRecord, BackendError> {
            self.store.inspect(key).await
        }
        async fn adopt(
            &self,
            lease: &LeaseRef,
            agent_id: &str,
        ) -> Result<crate::backend::Adopted, BackendError> {
            self.store.adopt(lease, agent_id).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_the_backend_announces_wakes_a_waiter_on_another_agent_at_once() {
        let (released, _) = tokio::sync::broadcast::channel(16);
        let backend = Arc::new(Announcing {
            store: Arc::new(MemoryBackend::default()),
            released,
        });
        let agent = |id: &str| {
            let identity = Identity {
                host: "test-host".into(),
                agent_id: id.into(),
                uid: 0,
            };
            Registry::new(
                backend.clone(),
                identity,
                Policy::with_ttl(Duration::from_secs(30)),
            )
        };
        let (a, b) = (agent("agent-a"), agent("agent-b"));
        let (holder, _a_events) = connect(&a, ROOT);
        let held = take(&a, holder, &["k"]).await.expect("free");
        let (waiter, _b_events) = connect(&b, ROOT);
        let shared = b.clone();
        let granted = tokio::spawn(async move {
            let never = CancellationToken::new();
            let req = request(&["k"], Duration::from_secs(3600), false);
            let granted = shared.acquire(waiter, req, &never).await;
            (granted.is_ok(), Instant::now())
        });
        // Long enough for B's polls to back off to their cap.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let released_at = Instant::now();
        a.release(holder, &[held[0].lease_id.clone()])
            .await
            .expect("released");
        let (ok, at) = granted.await.expect("the waiter ran");
        assert!(ok, "B was not granted the key");
        // Nothing on the woken path waits on a timer, so no (paused) time passes;
        // polling alone would wait out what is left of a sleep of up to POLL_CAP.
        assert!(
            at - released_at < Duration::from_millis(1),
            "B took the key {:?} after the release",
            at - released_at
        );
    }

    #[tokio::test(start_paused = true)]
    async fn local_waiters_are_served_in_arrival_order() {
        let registry = registry();
        let (holder, _events) = connect(&registry, ROOT);
        let first = take(&registry, holder, &["k"]).await.expect("free");
        let (order_tx, mut order) = mpsc::unbounded_channel();
        for n in 0..3 {
            let (conn, events) = connect(&registry, ROOT);
            let (shared, order_tx) = (registry.clone(), order_tx.clone());
            tokio::spawn(async move {
                let _events = events;
                let never = CancellationToken::new();
                let req = request(&["k"], Duration::from_secs(3600), false);
                let Granted { leases, .. } = shared
                    .acquire(conn, req, &never)
                    .await
                    .expect("granted in turn");
                order_tx.send(n).expect("send");
                shared
                    .release(conn, &[leases[0].lease_id.clone()])
                    .await
                    .expect("release");
            });
            // Each waiter is queued before the next one starts.
            while waiting(&registry, "k") < n + 1 {
                tokio::task::yield_now().await;
            }
        }
        registry
            .release(holder, &[first[0].lease_id.clone()])
            .await
            .expect("release");
        let mut served = Vec::new();
        for _ in 0..3 {
            served.push(
                tokio::time::timeout(Duration::from_secs(60), order.recv())
                    .await
                    .expect("served")
                    .expect("open"),
            );
        }
        assert_eq!(served, vec![0, 1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_woken_by_a_local_release_before_its_next_poll() {
        let registry = registry();
        let (holder, _e1) = connect(&registry, ROOT);
        let (waiter, _e2) = connect(&registry, ROOT);
        let held = take(&registry, holder, &["k"]).await.expect("free");
        let task = {
            let registry = registry.clone();
            tokio::spawn(async move {
                let never = CancellationToken::new();
                registry
                    .acquire(
                        waiter,
                        request(&["k"], Duration::from_secs(60), false),
                        &never,
                    )
                    .await
            })
        };
        while waiting(&registry, "k") < 1 {
            tokio::task::yield_now().await;
        }
        // Let the waiter's polling back off to its cap, so only the wake-up can be fast.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let released_at = Instant::now();
        registry
            .release(holder, &[held[0].lease_id.clone()])
            .await
            .expect("release");
        let Granted { leases, .. } = task.await.expect("task").expect("granted");
        assert_eq!(leases[0].token, 2);
        assert!(
            Instant::now() - released_at < POLL_START,
            "woken at once, not by polling"
        );
    }

    #[tokio::test]
    async fn multi_key_acquire_is_all_or_nothing() {
        let registry = registry();
        let (a, _e1) = connect(&registry, ROOT);
        let (b, _e2) = connect(&registry, ROOT);
        take(&registry, a, &["b"]).await.expect("free");
        let err = take(&registry, b, &["b", "a"])
            .await
            .expect_err("b is held");
        assert_eq!(err.code, ErrorCode::Held);
        assert_eq!(err.key.as_deref(), Some("b"));
        assert_eq!(err.holder.expect("holder").host, "test-host");
        // "a" was taken first (sorted order) and given back.
        assert!(registry.list().iter().all(|l| l.key != "a"));
        take(&registry, a, &["a"]).await.expect("a was released");
    }

    #[tokio::test]
    async fn force_takes_over_and_the_old_holder_is_told() {
        let registry = registry();
        let (old, mut old_events) = connect(&registry, ROOT);
        let (new, _e) = connect(&registry, ROOT);
        let before = take(&registry, old, &["k"]).await.expect("free");
        let never = CancellationToken::new();
        let Granted { leases: after, .. } = registry
            .acquire(new, request(&["k"], Duration::ZERO, true), &never)
            .await
            .expect("forced");
        assert!(after[0].token > before[0].token);
        match old_events.try_recv().expect("lost event") {
            AgentMessage::Lost {
                lease_id,
                reason,
                holder,
                ..
            } => {
                assert_eq!(lease_id, before[0].lease_id);
                assert_eq!(reason, LostReason::Forced);
                assert_eq!(holder.expect("new holder").token, after[0].token);
            }
            other => panic!("expected lost, got {other:?}"),
        }
        let err = registry
            .release(old, &[before[0].lease_id.clone()])
            .await
            .expect_err("no longer ours");
        assert_eq!(err.code, ErrorCode::NotOwner);
    }

    #[tokio::test]
    async fn closing_a_connection_releases_its_leases() {
        let registry = registry();
        let (a, _e1) = connect(&registry, ROOT);
        let (b, _e2) = connect(&registry, ROOT);
        take(&registry, a, &["x", "y"]).await.expect("free");
        registry.close_connection(a).await;
        assert!(registry.list().is_empty());
        let leases = take(&registry, b, &["x", "y"]).await.expect("released");
        assert!(leases.iter().all(|l| l.token == 2));
    }

    #[tokio::test]
    async fn bad_requests_get_their_codes() {
        let registry = registry();
        let stranger = PeerCred {
            pid: 2,
            uid: 4242,
            gid: 4242,
        };
        let (conn, _e) = connect(&registry, stranger);
        let never = CancellationToken::new();
        let code = |r: Result<Granted, WireError>| r.expect_err("refused").code;
        assert_eq!(
            code(
                registry
                    .acquire(conn, request(&[""], Duration::ZERO, false), &never)
                    .await
            ),
            ErrorCode::InvalidKey
        );
        assert_eq!(
            code(
                registry
                    .acquire(conn, request(&[], Duration::ZERO, false), &never)
                    .await
            ),
            ErrorCode::BadRequest
        );
        let mut short = request(&["k"], Duration::ZERO, false);
        short.ttl = Some(Duration::from_millis(10));
        assert_eq!(
            code(registry.acquire(conn, short, &never).await),
            ErrorCode::BadRequest
        );
        assert_eq!(
            code(
                registry
                    .acquire(conn, request(&["k"], Duration::ZERO, true), &never)
                    .await
            ),
            ErrorCode::Forbidden
        );
        assert_eq!(
            registry
                .break_key(conn, "k")
                .await
                .expect_err("not allowed")
                .code,
            ErrorCode::Forbidden
        );
        assert_eq!(
            registry
                .release(conn, &["nope".into()])
                .await
                .expect_err("not ours")
                .code,
            ErrorCode::NotOwner
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_whose_renewals_keep_failing_is_lost_at_its_deadline_not_before() {
        use crate::backend::cas::{testing::FaultyStore, CasEngine, MemoryCasStore};
        let store = Arc::new(FaultyStore::reliable(MemoryCasStore::new()));
        let identity = Identity {
            host: "h".into(),
            agent_id: "a".into(),
            uid: 0,
        };
        let engine = Arc::new(CasEngine::new(store.clone(), ""));
        let registry = Registry::new(engine, identity, Policy::with_ttl(Duration::from_secs(30)));
        let (conn, mut events) = connect(&registry, ROOT);
        let granted = Instant::now();
        take(&registry, conn, &["k"]).await.expect("free");
        store.fail_everything(true);
        let event = tokio::time::timeout(Duration::from_secs(120), events.recv()).await;
        let at = granted.elapsed();
        match event.expect("told within the TTL").expect("open") {
            AgentMessage::Lost { reason, .. } => assert_eq!(reason, LostReason::Expired),
            other => panic!("expected lost, got {other:?}"),
        }
        // The deadline: the grant's write + TTL − TTL/6 = 25 s. Retries back off
        // meanwhile, but never past it.
        assert!(
            at >= Duration::from_secs(25),
            "lost after {at:?}: before the deadline"
        );
        assert!(
            at < Duration::from_millis(25_100),
            "lost after {at:?}: late"
        );
        // From the first renewal (~10 s) to the deadline (25 s), backed-off
        // retries (at least 125 ms doubling, jittered) fit at most 8 times, each
        // up to 6 requests; without backoff there would be thousands.
        assert!(
            store.requests().1 < 60,
            "{:?} requests: retries did not back off",
            store.requests()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_agent_adopts_a_handed_over_lease_with_its_token() {
        use crate::backend::cas::{CasEngine, MemoryCasStore};
        let store = Arc::new(MemoryCasStore::new());
        let agent = |id: &str| {
            let identity = Identity {
                host: "h".into(),
                agent_id: id.into(),
                uid: 0,
            };
            let engine = Arc::new(CasEngine::new(store.clone(), ""));
            Registry::new(engine, identity, Policy::with_ttl(Duration::from_secs(30)))
        };
        let old = agent("old");
        let (conn, mut events) = connect(&old, ROOT);
        let granted = old
            .acquire(
                conn,
                request(&["k"], Duration::ZERO, false),
                &CancellationToken::new(),
            )
            .await
            .expect("free");
        let valid_for = granted.valid_until.expect("leases outlive the agent") - Instant::now();
        assert!(valid_for > Duration::from_secs(24) && valid_for <= Duration::from_secs(25));
        assert!(old.hand_over());
        old.close_connection(conn).await;
        assert!(old.list().is_empty());
        drop(events.try_recv()); // no `lost`: checked below by the record

        let new = agent("new");
        let (conn, _events) = connect(&new, ROOT);
        let lease = granted.leases[0].clone();
        let forged = Lease {
            token: lease.token + 1,
            ..lease.clone()
        };
        let err = new
            .reattach(conn, vec![forged], OnLost::Term)
            .await
            .expect_err("wrong token");
        assert_eq!(err.code, ErrorCode::NotOwner);
        let adopted = new
            .reattach(conn, vec![lease.clone()], OnLost::Term)
            .await
            .expect("adopted");
        assert_eq!(adopted.leases, vec![lease.clone()]);
        let record = new.inspect("k").await.expect("record");
        assert_eq!(record.token, lease.token);
        assert_eq!(record.holder.expect("held").agent_id, "new");
        // Renewed by the new agent from now on: still held long after the old TTL.
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(new.list().len(), 1);
        assert_eq!(
            new.inspect("k").await.expect("record").state,
            runlock_protocol::KeyState::Held
        );
        // Its shim gone, an adopted run keeps its lease while its group has members.
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .expect("spawn");
        new.attach(conn, child.id(), child.id()).expect("our child");
        assert_eq!(new.run_outliving(conn), Some(child.id()));
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert_eq!(new.run_outliving(conn), None);
    }

    #[tokio::test]
    async fn a_backend_whose_locks_die_with_the_agent_refuses_to_reattach() {
        let registry = registry();
        let (conn, _events) = connect(&registry, ROOT);
        assert!(!registry.hand_over());
        let lease = Lease {
            key: "k".into(),
            lease_id: "l".into(),
            token: 1,
        };
        let err = registry
            .reattach(conn, vec![lease], OnLost::Term)
            .await
            .expect_err("memory:// cannot");
        assert_eq!(err.code, ErrorCode::Unsupported);
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_does_not_read_gets_a_bounded_backlog_of_renewed_events() {
        use crate::backend::cas::{CasEngine, MemoryCasStore};
        let identity = Identity {
            host: "h".into(),
            agent_id: "a".into(),
            uid: 0,
        };
        let engine = Arc::new(CasEngine::new(Arc::new(MemoryCasStore::new()), ""));
        let policy = Policy::with_ttl(Duration::from_secs(3));
        let registry = Registry::new(engine, identity, policy);
        let (conn, mut events) = connect(&registry, ROOT);
        take(&registry, conn, &["k"]).await.expect("free");
        // About 300 renewals (one a second); nobody reads the events.
        tokio::time::sleep(Duration::from_secs(300)).await;
        let mut renewed = 0;
        while let Ok(event) = events.try_recv() {
            assert!(matches!(event, AgentMessage::Renewed { .. }), "{event:?}");
            renewed += 1;
        }
        assert_eq!(renewed, RENEWED_BACKLOG);
        assert_eq!(registry.list().len(), 1, "the lease itself is unaffected");
    }
}
