//! The registry of one agent: what it is built from (backend, identity,
//! policy), the connections it serves, and the hand-over to the next agent.

use super::error::LeaseError;
use super::event::{self, Events};
use super::fleet::Fleet;
use super::observer::{Observer, Unobserved};
use super::renewal::Renewals;
use super::state::{Conn, ConnId, PeerCred, State};
use super::user_names::UserNames;
use crate::access::Access;
use crate::backend::{Backend, Capabilities, Ending, ProfiledBackend};
use crate::process::Peer;
use crate::shown::{self, Viewer};
use crate::unpoisoned::Unpoisoned;
use runlock_protocol::{timing, Holder, Key, OnLost, OnUnavailable};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
    /// How often, at most, a waiter re-checks the store for a key held
    /// through another agent (jittered ×0.5–1.5): the handover's delay
    /// where the store cannot announce a release, and a waiting agent's cost.
    pub poll_interval: Duration,
}

/// The default [`Policy::poll_interval`].
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);

impl Policy {
    /// The defaults, with this TTL.
    pub fn with_ttl(default_ttl: Duration) -> Policy {
        Policy {
            default_ttl,
            on_unavailable: OnUnavailable::Fail,
            access: Access::default(),
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }
}

/// The lease registry of one agent. Its operations' modules see the store,
/// its promises, the renewals and the observer, which every operation works
/// with, and the little that one module alone uses; the rest through methods.
pub struct Registry {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) capabilities: Capabilities,
    pub(super) renewals: Renewals,
    /// Told what happens to leases (the agent's metrics).
    pub(super) observer: Arc<dyn Observer>,
    /// `displaced`'s: told when this agent said that runs taken over have
    /// stopped, so that forcers waiting here look again at once.
    pub(super) stopped_here: Notify,
    /// `listing`'s: this agent's report in the store, and the others'.
    pub(super) fleet: Fleet,
    /// The backend's shortest TTL and its description, from its profile.
    min_ttl: Duration,
    description: String,
    identity: Identity,
    policy: Policy,
    state: Mutex<State>,
    next_id: AtomicU64,
    /// Peers' user names, looked up once a while, not once a connection.
    user_names: UserNames,
    /// Every task the lease layer starts, so that shutdown can wait for them.
    tasks: TaskTracker,
    /// Cancelled at shutdown: the scheduler and the store's listeners stop.
    closing: CancellationToken,
}

/// Wakes the first local waiter for each key the backend says another agent
/// let go; every waiter when too many came at once to keep count.
async fn wake_on_releases(
    registry: Weak<Registry>,
    mut releases: tokio::sync::broadcast::Receiver<Key>,
    closing: CancellationToken,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let released = tokio::select! {
            _ = closing.cancelled() => return,
            released = releases.recv() => released,
        };
        let Some(registry) = registry.upgrade() else {
            return;
        };
        let state = registry.state();
        match released {
            Ok(key) => state.queues.wake_head(&key),
            Err(RecvError::Lagged(_)) => state.queues.wake_every_head(),
            Err(RecvError::Closed) => return,
        }
    }
}

impl Registry {
    /// A registry over `store` that no one watches; starts the renewal
    /// scheduler on the current runtime.
    pub fn new(
        store: impl Into<ProfiledBackend>,
        identity: Identity,
        policy: Policy,
    ) -> Arc<Registry> {
        Registry::observed(store, identity, policy, Arc::new(Unobserved))
    }

    /// A registry over `store` that tells `observer` what happens to its
    /// leases; starts the renewal scheduler on the current runtime.
    pub fn observed(
        store: impl Into<ProfiledBackend>,
        identity: Identity,
        policy: Policy,
        observer: Arc<dyn Observer>,
    ) -> Arc<Registry> {
        let ProfiledBackend { backend, profile } = store.into();
        let releases = profile.releases.map(|sender| sender.subscribe());
        let lease_expires = profile.capabilities.lease_expires;
        let (tasks, closing) = (TaskTracker::new(), CancellationToken::new());
        let (renewals, reports) = Renewals::start(
            backend.clone(),
            lease_expires,
            observer.clone(),
            &tasks,
            closing.clone(),
        );
        let fleet = Fleet::new(
            backend.clone(),
            &identity.host,
            &identity.agent_id,
            tasks.clone(),
        );
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
            user_names: UserNames::default(),
            stopped_here: Notify::new(),
            observer,
            tasks,
            closing,
            fleet,
        });
        let reported = Registry::take_reports(Arc::downgrade(&registry), reports);
        registry.tasks.spawn(reported);
        let here = Arc::downgrade(&registry);
        registry.fleet.publish(
            move || {
                let registry = here.upgrade()?;
                let state = registry.state();
                let said = state.report.said(&state.queues);
                Some(said)
            },
            registry.state().report.on_change(),
            registry.closing.clone(),
        );
        if let Some(releases) = releases {
            let woken = wake_on_releases(
                Arc::downgrade(&registry),
                releases,
                registry.closing.clone(),
            );
            registry.tasks.spawn(woken);
        }
        registry
    }

    /// The tracker that owns every task the lease layer starts: a task of
    /// the agent's that outlives its caller (an acquire's store write once
    /// begun, say) belongs here too, so that shutdown waits for it.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// The agent is stopping and its connections are gone: stops the
    /// renewal scheduler and the store's listeners, then waits until
    /// `deadline` for the tasks still at work (a lost lease let go, a
    /// run's SIGKILL after its grace). Returns how many it left running.
    pub async fn close(&self, deadline: Instant) -> usize {
        self.closing.cancel();
        self.tasks.close();
        match tokio::time::timeout_at(deadline, self.tasks.wait()).await {
            Ok(()) => 0,
            Err(_) => self.tasks.len(),
        }
    }

    /// A new id for a connection or a waiter, unique within this agent.
    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The TTL of a request that asked `asked` (none: the policy's
    /// default), if this agent and its backend keep it.
    pub(super) fn ttl(&self, asked: Option<Duration>) -> Result<Duration, LeaseError> {
        let ttl = asked.unwrap_or(self.policy.default_ttl);
        let shortest = timing::MIN_TTL.max(self.min_ttl);
        if ttl < shortest || ttl > timing::MAX_TTL {
            return Err(LeaseError::TtlOutOfRange {
                ttl,
                shortest,
                backend: (shortest > timing::MIN_TTL).then(|| self.description.clone()),
            });
        }
        Ok(ttl)
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.locked()
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
    /// `groups` and whose process is `shim`; returns its id and its events.
    pub fn open_connection(&self, peer: PeerCred, shim: Peer, groups: &[u32]) -> (ConnId, Events) {
        let (events, received) = event::channel();
        let id = self.next_id();
        let user = self.user_names.of(peer.uid);
        let access = &self.policy.access;
        let may_override = access.allows(peer.uid, &[peer.gid]) || access.allows(peer.uid, groups);
        let conn = Conn {
            peer,
            user,
            may_override,
            events,
            leases: BTreeSet::new(),
            shim,
            child: None,
            on_lost: OnLost::Term,
            reattached: false,
            leases_gone: Arc::default(),
            stopped_owed: Vec::new(),
        };
        self.state().conns.insert(id, conn);
        (id, received)
    }

    /// Ends a connection: every lease it holds is released at once, unless
    /// the agent is handing its leases over to the next one.
    pub async fn close_connection(&self, conn: ConnId) {
        let (leases, handing_over, stopped) = {
            let mut state = self.state();
            let (leases, stopped): (Vec<String>, _) = match state.conns.remove(&conn) {
                Some(c) => {
                    // The run holds the connection: its end is the run's end,
                    // unless the run was reattached and outlives its shim.
                    let ended = !c.reattached || !c.child.is_some_and(|run| run.has_members());
                    let stopped = if ended { c.stopped_owed } else { Vec::new() };
                    (c.leases.into_iter().collect(), stopped)
                }
                None => return,
            };
            // No hold ends here: the next agent, reattached, times the run's
            // hold from its grant (the holder's `acquired_at_ms`).
            if state.handing_over {
                for lease_id in &leases {
                    state.remove_lease(lease_id, &*self.observer);
                }
            }
            (leases, state.handing_over, stopped)
        };
        if handing_over {
            return;
        }
        self.confirm_stopped(stopped).await;
        // Still held when its connection closed: its client went away
        // without letting go (killed, or crashed), which the history says.
        self.release_leases(leases, &Ending::ClientGone).await;
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

    /// The connection's peer, its user name, and whether it may force and break.
    pub(super) fn peer(&self, conn: ConnId) -> Result<(PeerCred, String, bool), LeaseError> {
        self.state()
            .conns
            .get(&conn)
            .map(|c| (c.peer, c.user.clone(), c.may_override))
            .ok_or(LeaseError::ConnectionClosing)
    }

    /// The holder this agent records for `peer` (whose user is `user`)
    /// running `command`; the backend sets the token, the caller the time.
    pub(super) fn holder(&self, peer: PeerCred, user: String, command: String) -> Holder {
        Holder {
            slot: None,
            slots: None,
            host: self.identity.host.clone(),
            agent_id: self.identity.agent_id.clone(),
            pid: peer.pid,
            uid: peer.uid,
            gid: peer.gid,
            user,
            command,
            acquired_at_ms: 0,
            token: 0,
        }
    }

    /// How the connection's peer sees holders.
    pub(super) fn viewer(&self, conn: ConnId) -> Viewer {
        let state = self.state();
        let c = state.conns.get(&conn);
        Viewer {
            uid: c.map_or(u32::MAX, |c| c.peer.uid),
            may_override: c.is_some_and(|c| c.may_override),
        }
    }

    pub(super) fn show(&self, holder: &Holder, viewer: Viewer) -> Holder {
        shown::holder(holder, viewer, &self.identity.host)
    }

    /// The peer may not do `action` (to `key`).
    pub(super) fn forbidden(&self, peer: PeerCred, action: &str, key: Option<Key>) -> LeaseError {
        LeaseError::Forbidden {
            uid: peer.uid,
            action: action.to_string(),
            allowed: self.policy.access.describe(),
            key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

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
}
