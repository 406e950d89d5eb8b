//! A force never runs beside the run it displaces (invariant 10): the forced
//! acquire waits, before it answers, until that run's agent says through the
//! store that the run has stopped, or until the run's deadline has passed;
//! and an agent whose lease was taken over says so once its run has stopped.

use super::registry::Registry;
use super::state::ConnId;
use crate::backend::{Displaced, Ending, Grant, LeaseRef};
use runlock_protocol::{timing, Key};
use std::time::Duration;
use tokio::time::Instant;

/// How soon the forcer first looks for the word that the run has stopped,
/// and how far apart its looks grow.
const FIRST_LOOK: Duration = Duration::from_millis(50);
const LONGEST_LOOK: Duration = Duration::from_millis(500);

/// By when the run `displaced` has stopped whatever its agent does: the
/// force's write was sent after the run's last renewal landed, and a run is
/// stopped by its last renewal's send time + TTL (its deadline, then the
/// kill grace); the grace covers the two monotonic clocks' rates.
fn stopped_by(displaced: &Displaced, force_sent: Instant) -> Instant {
    force_sent + displaced.ttl + timing::grace(displaced.ttl)
}

impl Registry {
    /// Waits until the run `displaced` from `key` has stopped, or until its
    /// deadline ([`stopped_by`]); first tells the peer what it waits for and
    /// how long at most. Not cancelled when the peer goes: the forced lease
    /// is let go only after this, so that no waiter takes the key beside the
    /// run still being stopped. Where the run holds a kernel lock of its own
    /// (`file://`) there is no deadline: that lock says exactly when the run
    /// has stopped, and a run whose agent is gone holds it until its shim
    /// reaches the next agent and is told, or until it ends.
    pub(super) async fn await_stopped(
        &self,
        conn: ConnId,
        key: &Key,
        displaced: &Displaced,
        force_sent: Instant,
    ) {
        let deadline =
            (!self.capabilities.run_holds_lock).then(|| stopped_by(displaced, force_sent));
        let viewer = self.viewer(conn);
        let shown = displaced.holder.as_ref().map(|h| self.show(h, viewer));
        let wait = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if let Some(c) = self.state().conns.get(&conn) {
            c.events.forcing(key.clone(), shown, wait);
        }
        let token = displaced.token;
        tracing::info!(key = %key.logged(), token, ?wait, "waiting for the run taken over to stop");
        let mut look = FIRST_LOOK;
        loop {
            // Armed before the look, so that a word said here meanwhile is not missed.
            let said_here = self.stopped_here.notified();
            tokio::pin!(said_here);
            said_here.as_mut().enable();
            match self.backend.displaced_stopped(key, displaced).await {
                Ok(true) => {
                    tracing::info!(key = %key.logged(), token, "the run taken over has stopped");
                    return;
                }
                Ok(false) => {}
                Err(err) => {
                    tracing::debug!(key = %key.logged(), "looking for the stop of a run taken over: {err}")
                }
            }
            let now = Instant::now();
            let pause = match deadline {
                Some(deadline) if now >= deadline => {
                    tracing::warn!(
                        key = %key.logged(),
                        token,
                        "the run taken over was not said to have stopped; its deadline has passed"
                    );
                    return;
                }
                Some(deadline) => look.min(deadline - now),
                None => look,
            };
            tokio::select! {
                _ = said_here => {}
                _ = tokio::time::sleep(pause) => {}
            }
            look = (look * 2).min(LONGEST_LOOK);
        }
    }

    /// Keeps a forced grant that must not stand (a break, or a force the
    /// slot-count check refuses) renewed until the run it displaced has
    /// stopped, then ends it with `ending`: freed at once, the key would go
    /// to a waiter beside that run (invariant 10).
    pub(super) async fn let_go_once_stopped(
        &self,
        conn: ConnId,
        lease: LeaseRef,
        ttl: Duration,
        grant: &Grant,
        ending: &Ending,
    ) {
        if let Some(displaced) = &grant.displaced {
            if self.capabilities.needs_renewal {
                self.renewals.start_lease(lease.clone(), ttl, grant.sent);
            }
            self.await_stopped(conn, &lease.key, displaced, grant.sent)
                .await;
            self.renewals.stop(&lease.lease_id);
        }
        if let Err(err) = self.backend.end(&lease, ending).await {
            // It then expires as any lease whose agent stopped renewing.
            tracing::warn!(key = %lease.key.logged(), "could not let go of a key taken over: {err}");
        }
        self.state().queues.wake_head(&lease.key);
    }

    /// Says through the store that the runs of `leases`, taken over from
    /// this agent, have stopped; wakes the forcers waiting here.
    pub(super) async fn confirm_stopped(&self, leases: Vec<LeaseRef>) {
        for lease in &leases {
            if let Err(err) = self.backend.confirm_stopped(lease).await {
                tracing::warn!(
                    key = %lease.key.logged(),
                    token = lease.token,
                    "could not say that a run taken over has stopped ({err}): its forcer waits \
                     out the run's deadline"
                );
            }
        }
        if !leases.is_empty() {
            self.stopped_here.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use crate::backend::cas::{CasEngine, MemoryCasStore};
    use tokio::time::Instant;

    /// Two agents on one object store.
    fn two_agents() -> (Arc<Registry>, Arc<Registry>) {
        let store = Arc::new(MemoryCasStore::new());
        let a = agent(Arc::new(CasEngine::new(store.clone())), "agent-a");
        let b = agent(Arc::new(CasEngine::new(store)), "agent-b");
        (a, b)
    }

    fn force(registry: &Arc<Registry>, conn: ConnId) -> tokio::task::JoinHandle<Instant> {
        let registry = registry.clone();
        tokio::spawn(async move {
            let never = CancellationToken::new();
            registry
                .acquire(conn, request(&["k"], Duration::ZERO, true), &never)
                .await
                .expect("forced");
            Instant::now()
        })
    }

    /// A run (`old`) that holds "k" on `registry`, and another connection
    /// (`new`) to force it there; with their events.
    async fn held_here(registry: &Registry) -> ((ConnId, Events), (ConnId, Events)) {
        let (old, old_events) = connect(registry, ROOT);
        take(registry, old, &["k"]).await.expect("free");
        ((old, old_events), connect(registry, ROOT))
    }

    /// Lets the displaced run (`old`, on `holder`) run on for `running`, the
    /// force not answered meanwhile, then stops it: how long after that the
    /// force was answered.
    async fn answered_after_it_stops(
        holder: &Registry,
        old: ConnId,
        forced: tokio::task::JoinHandle<Instant>,
        running: Duration,
    ) -> Duration {
        tokio::time::sleep(running).await;
        assert!(
            !forced.is_finished(),
            "answered while the displaced run still ran"
        );
        let stopped = Instant::now();
        holder.close_connection(old).await;
        let answered = tokio::time::timeout(Duration::from_secs(5), forced)
            .await
            .expect("answered once the displaced run stopped")
            .expect("ran");
        answered
            .checked_duration_since(stopped)
            .expect("answered after the run stopped, not before")
    }

    #[tokio::test(start_paused = true)]
    async fn a_force_through_another_agent_is_answered_once_the_run_it_displaced_has_stopped() {
        let (a, b) = two_agents();
        let (old, mut old_events) = connect(&a, ROOT);
        let taken = take(&a, old, &["k"]).await.expect("free");
        let (new, mut new_events) = connect(&b, ROOT);
        let forced = force(&b, new);
        match new_events.recv().await.expect("open") {
            Event::Forcing { holder, wait, .. } => {
                assert_eq!(holder.expect("named").token, taken[0].token);
                // The displaced lease's TTL and grace, from the force's write.
                let wait = wait.expect("a lease that expires has a deadline");
                assert!(
                    wait > Duration::from_secs(32) && wait <= Duration::from_secs(33),
                    "{wait:?}"
                );
            }
            other => panic!("expected forcing, got {other:?}"),
        }
        // Agent a hears of the force at its next renewal and tells its run.
        let lost = tokio::time::timeout(Duration::from_secs(12), old_events.recv()).await;
        assert!(matches!(lost, Ok(Some(Event::Lost { .. }))), "{lost:?}");
        // The run takes its time to stop; the forced run is not answered meanwhile.
        let after = answered_after_it_stops(&a, old, forced, Duration::from_secs(4)).await;
        assert!(after < Duration::from_secs(1), "{after:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_force_waits_out_the_deadline_of_a_run_whose_agent_is_gone() {
        let (a, b) = two_agents();
        let (old, _old_events) = connect(&a, ROOT);
        take(&a, old, &["k"]).await.expect("free");
        // Agent a stops without a word: its lease neither renews nor stops.
        assert!(a.hand_over());
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (new, _new_events) = connect(&b, ROOT);
        let started = Instant::now();
        let answered = force(&b, new).await.expect("ran");
        let waited = answered - started;
        // Its run stopped itself by its last write + TTL at the latest: the
        // forcer waits TTL + grace from its own write, and no longer.
        assert!(waited >= Duration::from_secs(33), "{waited:?}");
        assert!(waited < Duration::from_secs(34), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_forcer_that_leaves_keeps_the_key_until_the_run_it_displaced_has_stopped() {
        let registry = registry();
        let ((old, _old_events), (new, _new_events)) = held_here(&registry).await;
        let gone = CancellationToken::new();
        let forced = {
            let (registry, gone) = (registry.clone(), gone.clone());
            tokio::spawn(async move {
                let asked = request(&["k"], Duration::ZERO, true);
                registry.acquire(new, asked, &gone).await
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        gone.cancel();
        tokio::time::sleep(Duration::from_secs(3)).await;
        // Still the forcer's, so no waiter can start beside the displaced run.
        assert!(!forced.is_finished());
        let (waiter, _waiter_events) = connect(&registry, ROOT);
        let refused = take(&registry, waiter, &["k"]).await;
        assert!(
            refused.is_err(),
            "taken beside the displaced run: {refused:?}"
        );
        registry.close_connection(old).await;
        let answered = tokio::time::timeout(Duration::from_secs(1), forced).await;
        answered.expect("answered").expect("ran").expect("granted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_force_here_is_answered_once_the_run_it_displaced_here_has_stopped() {
        let registry = registry();
        let ((old, _old_events), (new, _new_events)) = held_here(&registry).await;
        let forced = force(&registry, new);
        let after = answered_after_it_stops(&registry, old, forced, Duration::from_secs(3)).await;
        assert!(after < Duration::from_millis(100), "{after:?}");
    }
}
