//! What the registry records under its one lock: leases by id and by key,
//! connections, and the waiter queues.

use super::event::EventSender;
use super::fleet;
use super::observer::Observer;
use super::queue::Queues;
use crate::backend::LeaseRef;
use crate::process::{Peer, Run};
use runlock_protocol::{Holder, Key, OnLost};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

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

pub(super) struct LocalLease {
    pub(super) key: Key,
    pub(super) conn: ConnId,
    pub(super) ttl: Duration,
    pub(super) holder: Holder,
    /// Its release is under way: it stays the key's here until the store
    /// has let go, so that no local waiter tries the key before then.
    pub(super) releasing: bool,
}

impl LocalLease {
    pub(super) fn reference(&self, lease_id: &str) -> LeaseRef {
        LeaseRef {
            key: self.key.clone(),
            lease_id: lease_id.to_string(),
            token: self.holder.token,
        }
    }
}

pub(super) struct Conn {
    pub(super) peer: PeerCred,
    /// The peer's user name, as `user_names` had it when it connected.
    pub(super) user: String,
    /// Whether the peer may force and break, decided once.
    pub(super) may_override: bool,
    pub(super) events: EventSender,
    pub(super) leases: BTreeSet<String>,
    /// The peer's own process, to tell whether it is still there to act on `lost`.
    pub(super) shim: Peer,
    pub(super) child: Option<Run>,
    pub(super) on_lost: OnLost,
    /// Its leases were adopted from a stopped agent: the run does not hold
    /// this connection, so its end is not the run's end.
    pub(super) reattached: bool,
    /// Told when its last lease goes: no run need be waited for any more.
    pub(super) leases_gone: Arc<Notify>,
    /// Its leases taken over by a force: once its run has stopped, this
    /// agent says so through the store, for the forcer waiting on it.
    pub(super) stopped_owed: Vec<LeaseRef>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) leases: HashMap<String, LocalLease>,
    pub(super) by_key: HashMap<Key, String>,
    pub(super) conns: HashMap<ConnId, Conn>,
    pub(super) queues: Queues,
    /// What this agent's report says besides its waiters (the acquires
    /// refused lately), and when it changed.
    pub(super) report: fleet::Here,
    /// For a key with slots: the slot this agent last let go and the count
    /// it was held with, taken (and so forgotten) by the next acquire, which
    /// tries it first (one write where the store remembers the slot free).
    pub(super) free_slots: HashMap<Key, (u32, u32)>,
    /// Per user: the slot acquire attempts that may run at once, so that one
    /// user's slot waiters cost the store a bounded number of reads.
    pub(super) slot_turns: HashMap<u32, Arc<tokio::sync::Semaphore>>,
    /// The agent is stopping and its leases outlive it: they are left for
    /// the next agent, neither renewed nor released.
    pub(super) handing_over: bool,
}

impl State {
    pub(super) fn local_holder(&self, key: &Key) -> Option<Holder> {
        self.by_key
            .get(key)
            .and_then(|id| self.leases.get(id))
            .map(|l| l.holder.clone())
    }

    /// Marks a lease as being released, once: its reference and holder,
    /// unless it is gone or already being released.
    pub(super) fn begin_release(&mut self, lease_id: &str) -> Option<(LeaseRef, Holder)> {
        let lease = self.leases.get_mut(lease_id).filter(|l| !l.releasing)?;
        lease.releasing = true;
        Some((lease.reference(lease_id), lease.holder.clone()))
    }

    /// Forgets a lease, telling `observer` how many are left; returns it.
    pub(super) fn remove_lease(
        &mut self,
        lease_id: &str,
        observer: &dyn Observer,
    ) -> Option<LocalLease> {
        let lease = self.leases.remove(lease_id)?;
        observer.leases_held(self.leases.len());
        if self.by_key.get(&lease.key).is_some_and(|id| id == lease_id) {
            self.by_key.remove(&lease.key);
        }
        if let Some(conn) = self.conns.get_mut(&lease.conn) {
            conn.leases.remove(lease_id);
            if conn.leases.is_empty() {
                conn.leases_gone.notify_one();
            }
        }
        Some(lease)
    }
}
