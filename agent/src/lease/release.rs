//! Giving keys back: a peer's own leases (`release`), and whoever holds a
//! key, here or on another agent (`break_key`, for `runlock release --key`).

use super::error::{backend_on, valid_key, valid_slot, LeaseError};
use super::event::Loss;
use super::observer::Takeover;
use super::registry::Registry;
use super::state::ConnId;
use super::takeover::now_ms;
use crate::backend::{AcquireSpec, Ending, LeaseRef};
use runlock_protocol::{Holder, Key};

impl Registry {
    /// Releases leases this connection holds.
    pub async fn release(&self, conn: ConnId, lease_ids: &[String]) -> Result<u32, LeaseError> {
        {
            let state = self.state();
            let owned = state.conns.get(&conn).map(|c| &c.leases);
            if let Some(id) = lease_ids
                .iter()
                .find(|id| !owned.is_some_and(|o| o.contains(*id)))
            {
                return Err(LeaseError::NotHeldHere(id.clone()));
            }
        }
        let mut count = 0;
        for id in lease_ids {
            count += u32::from(self.release_lease(id, &Ending::Released).await);
        }
        Ok(count)
    }

    /// Lets go of one lease, in the backend too (its history says how it
    /// ended), and wakes the next local waiter.
    pub(super) async fn release_lease(&self, lease_id: &str, ending: &Ending) -> bool {
        let Some(lease) = self.state().remove_lease(lease_id, &*self.observer) else {
            return false;
        };
        self.observer.released(lease.holder.acquired_at_ms, ending);
        self.renewals.stop(lease_id);
        if let Err(err) = self.backend.end(&lease.reference(lease_id), ending).await {
            tracing::warn!(key = %lease.key.logged(), error = %err, "release failed");
        }
        tracing::info!(key = %lease.key.logged(), token = lease.holder.token, lease = %lease_id, "released");
        if let Some(count) = lease.holder.slots {
            let slot = lease.key.split_slot().1;
            self.state()
                .free_slots
                .insert(lease.key.base(), (slot, count));
        }
        // Only after the backend let go, or the woken waiter would find it still held.
        self.state().queues.wake_head(&lease.key);
        true
    }

    /// Breaks whoever holds `key`, on this agent or another sharing the
    /// backend: takes it over as a force does, waits until the run it
    /// displaced has stopped (telling the peer, as a force does), then lets
    /// it go. Freed at once, the key would go to a waiter beside that run.
    pub async fn break_key(&self, conn: ConnId, key: &str, slot: u32) -> Result<u32, LeaseError> {
        let key = valid_key(key)?;
        let key = valid_slot(&key, slot)?;
        let (peer, user, may_override) = self.peer(conn)?;
        if !may_override {
            return Err(self.forbidden(peer, "release another's lock", None));
        }
        let mut breaker = Holder {
            acquired_at_ms: now_ms(),
            ..self.holder(peer, user, "runlock release".to_string())
        };
        let held_here = {
            let state = self.state();
            let lease = state.by_key.get(&key).and_then(|id| state.leases.get(id));
            lease.map(|l| l.holder.slots)
        };
        let slots = match held_here {
            Some(slots) => slots,
            None => {
                let record = self.backend.inspect(&key).await.map_err(backend_on(&key))?;
                if record.holder.is_none() && record.state != runlock_protocol::KeyState::Held {
                    return Ok(0);
                }
                record.holder.as_ref().and_then(|h| h.slots)
            }
        };
        // The break is an event of the slot it ends.
        breaker.slots = slots;
        breaker.slot = slots.map(|_| slot);
        let spec = AcquireSpec {
            key: key.clone(),
            lease_id: uuid::Uuid::new_v4().to_string(),
            holder: breaker,
            ttl: self.policy().default_ttl,
            force: true,
            breaking: true,
        };
        let grant = self
            .backend
            .acquire(&spec)
            .await
            .map_err(backend_on(&key))?;
        let lease = LeaseRef {
            key: key.clone(),
            lease_id: spec.lease_id,
            token: grant.holder.token,
        };
        if grant.displaced.is_some() {
            self.observer.taken_over(Takeover::Break);
        }
        if let Some(broken) = self.held_here_before(&key, lease.token) {
            let loss = Loss::BrokenHere {
                uid: peer.uid,
                pid: peer.pid,
            };
            self.lose(&broken, loss, None, Ending::Released).await;
        }
        self.let_go_once_stopped(conn, lease, spec.ttl, &grant, &Ending::AfterBreak)
            .await;
        tracing::info!(key = %key.logged(), uid = peer.uid, "broke a lease");
        Ok(1)
    }

    /// The lease held here on `key` with a token older than `token`: the
    /// one a take-over with `token` displaced.
    pub(super) fn held_here_before(&self, key: &Key, token: u64) -> Option<String> {
        let state = self.state();
        let lease_id = state.by_key.get(key)?;
        let lease = state.leases.get(lease_id)?;
        (lease.holder.token < token).then(|| lease_id.clone())
    }
}
