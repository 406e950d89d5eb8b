//! The per-key local waiter queues: runs on this agent waiting for the same
//! key are served in arrival order, and a release here wakes the next at once.
//! For a key with N slots the first N in line may try at once (each may find
//! a slot of its own); a plain key's head tries alone.

use runlock_protocol::{Key, Waiter as Who};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::Notify;

struct Waiter {
    id: u64,
    notify: Arc<Notify>,
    /// The slots its request asked: how near the front it must be to try.
    slots: u32,
    /// Who waits, since when: for listings across the fleet…
    who: Who,
    /// …once it waits for a holder (until then, it is only trying).
    waits: bool,
}

/// Every key's queue of local waiters, head first.
#[derive(Default)]
pub(super) struct Queues(HashMap<Key, VecDeque<Waiter>>);

impl Queues {
    /// Puts waiter `id`, `who` asking `slots`, at the back of `key`'s
    /// queue; `notify` wakes it.
    pub(super) fn join(&mut self, key: &Key, id: u64, notify: Arc<Notify>, slots: u32, who: Who) {
        self.0.entry(key.clone()).or_default().push_back(Waiter {
            id,
            notify,
            slots,
            who,
            waits: false,
        });
    }

    /// Waiter `id` waits for a holder of `key`.
    pub(super) fn waits(&mut self, key: &Key, id: u64) {
        let queue = self.0.get_mut(key).into_iter().flatten();
        for waiter in queue.filter(|w| w.id == id) {
            waiter.waits = true;
        }
    }

    /// Whether waiter `id` is near enough the front of `key`'s queue to try:
    /// first in line, or among the first N for a key with N slots.
    pub(super) fn may_try(&self, key: &Key, id: u64) -> bool {
        self.may_try_now(key).any(|w| w.id == id)
    }

    /// The waiters for `key` that may try now, front first: at most 64, so
    /// a long queue costs no more to look at than a short one.
    fn may_try_now(&self, key: &Key) -> impl Iterator<Item = &Waiter> {
        self.0
            .get(key)
            .into_iter()
            .flatten()
            .enumerate()
            .take_while(|(at, w)| *at < w.slots as usize)
            .map(|(_, w)| w)
    }

    /// Takes waiter `id` out of `key`'s queue and wakes whoever is now first.
    pub(super) fn leave(&mut self, key: &Key, id: u64) {
        if let Some(queue) = self.0.get_mut(key) {
            queue.retain(|w| w.id != id);
            if queue.is_empty() {
                self.0.remove(key);
            } else {
                self.wake_head(key);
            }
        }
    }

    /// Wakes the waiters for `key` that may try (for a slot's record, for
    /// its key), if any.
    pub(super) fn wake_head(&self, key: &Key) {
        let key = match key.split_slot() {
            (_, 0) => std::borrow::Cow::Borrowed(key),
            _ => std::borrow::Cow::Owned(key.base()),
        };
        for waiter in self.may_try_now(&key) {
            waiter.notify.notify_one();
        }
    }

    /// Wakes the first waiter for every key.
    pub(super) fn wake_every_head(&self) {
        for key in self.0.keys() {
            self.wake_head(key);
        }
    }

    /// How many wait for `key`.
    pub(super) fn len(&self, key: &Key) -> usize {
        self.0.get(key).map_or(0, |q| q.len())
    }

    /// Who waits for a holder of `key`, first in line first.
    pub(super) fn waiting_for(&self, key: &Key) -> impl Iterator<Item = &Who> {
        (self.0.get(key).into_iter().flatten())
            .filter(|w| w.waits)
            .map(|w| &w.who)
    }

    /// Every key waited for, with who waits for its holder.
    pub(super) fn every_waiter(&self) -> impl Iterator<Item = (&Key, &Who)> {
        (self.0.iter())
            .flat_map(|(key, queue)| (queue.iter().filter(|w| w.waits)).map(move |w| (key, &w.who)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use crate::backend::{Backend, BackendResult, LeaseRef};
    use crate::lease::acquire::POLL_START;
    use tokio::time::Instant;

    /// Two agents on one store whose releases are announced, as a Postgres
    /// `NOTIFY` or an etcd watch announces them.
    struct Announcing {
        released: tokio::sync::broadcast::Sender<Key>,
    }

    #[async_trait::async_trait]
    impl Hooks for Announcing {
        async fn end(
            &self,
            store: &dyn Backend,
            lease: &LeaseRef,
            ending: &crate::backend::Ending,
        ) -> BackendResult<()> {
            store.end(lease, ending).await?;
            let _ = self.released.send(lease.key.clone());
            Ok(())
        }

        fn profile(&self, store: crate::backend::Profile) -> crate::backend::Profile {
            crate::backend::Profile {
                description: "announcing".into(),
                releases: Some(self.released.clone()),
                ..store
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_the_backend_announces_wakes_a_waiter_on_another_agent_at_once() {
        let (released, _) = tokio::sync::broadcast::channel(16);
        let backend = hooked(Announcing { released });
        let agent = |id: &str| agent(backend.clone(), id);
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
        // polling alone would wait out what is left of a sleep of up to the poll interval.
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
        let task = spawn_queued(
            &registry,
            waiter,
            request(&["k"], Duration::from_secs(60), false),
        )
        .await;
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
}
