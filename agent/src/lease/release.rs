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

/// How many of one request's leases are released in the store at once.
const RELEASES_AT_ONCE: usize = 16;

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
        let released = self.release_leases(lease_ids.to_vec(), &Ending::Released);
        Ok(released.await)
    }

    /// Lets go of `lease_ids`, several at once: each key is a request of
    /// its own to the store, and a run holding hundreds of keys should not
    /// wait for them one by one. Returns how many were held.
    pub(super) async fn release_leases(&self, lease_ids: Vec<String>, ending: &Ending) -> u32 {
        use futures::StreamExt;
        let releases = lease_ids
            .into_iter()
            .map(|id| self.release_lease(id, ending))
            .collect::<Vec<_>>();
        let released: Vec<bool> = futures::stream::iter(releases)
            .buffer_unordered(RELEASES_AT_ONCE)
            .collect()
            .await;
        released.into_iter().map(u32::from).sum()
    }

    /// Lets go of one lease, in the backend too (its history says how it
    /// ended), and wakes the next local waiter.
    async fn release_lease(&self, lease_id: String, ending: &Ending) -> bool {
        let lease_id = lease_id.as_str();
        let Some((lease, holder)) = self.state().begin_release(lease_id) else {
            return false;
        };
        self.observer.released(holder.acquired_at_ms, ending);
        self.renewals.stop(lease_id);
        if let Err(err) = self.backend.end(&lease, ending).await {
            tracing::warn!(key = %lease.key.logged(), error = %err, "release failed");
        }
        tracing::info!(key = %lease.key.logged(), token = lease.token, lease = %lease_id, "released");
        let mut state = self.state();
        state.remove_lease(lease_id, &*self.observer);
        if let Some(count) = holder.slots {
            let slot = lease.key.split_slot().1;
            state.free_slots.insert(lease.key.base(), (slot, count));
        }
        // Only after the backend let go, or the woken waiter would find it still held.
        state.queues.wake_head(&lease.key);
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use crate::backend::{Backend, BackendResult, Ending, LeaseRef};

    /// A store whose ends each wait until `together` of them are under way.
    struct Gathering {
        together: tokio::sync::Barrier,
    }

    #[async_trait::async_trait]
    impl Hooks for Gathering {
        async fn end(
            &self,
            store: &dyn Backend,
            lease: &LeaseRef,
            ending: &Ending,
        ) -> BackendResult<()> {
            self.together.wait().await;
            store.end(lease, ending).await
        }
    }

    #[tokio::test]
    async fn a_release_of_many_leases_asks_the_store_for_several_at_once() {
        const AT_ONCE: usize = 8;
        let store = hooked(Gathering {
            together: tokio::sync::Barrier::new(AT_ONCE),
        });
        let registry = agent(store, "agent-1");
        let (conn, _events) = connect(&registry, ROOT);
        let keys: Vec<String> = (0..AT_ONCE).map(|i| format!("k{i}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let leases = take(&registry, conn, &keys).await.expect("free");
        let ids: Vec<String> = leases.into_iter().map(|l| l.lease_id).collect();
        // One at a time, the first end would wait for the others forever.
        let released = tokio::time::timeout(Duration::from_secs(10), registry.release(conn, &ids))
            .await
            .expect("the ends ran together")
            .expect("held here");
        assert_eq!(released as usize, AT_ONCE);
        assert!(registry.list().is_empty());
    }
}
