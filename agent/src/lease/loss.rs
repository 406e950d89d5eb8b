//! A lease lost (forced, broken, expired): its run is told, and stopped if
//! its client is gone; and what the renewal scheduler reports, drained here.

use super::event::Loss;
use super::registry::Registry;
use super::renewal::Report;
use crate::backend::{Ending, LeaseRef};
use crate::shown::Viewer;
use runlock_protocol::timing;
use runlock_protocol::{Holder, KeyRecord, LostReason};
use std::sync::Weak;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long naming a lost lease's new holder may take before the run is told without it.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);

impl Registry {
    /// Acts on what the renewal scheduler reports, until the registry is gone.
    pub(super) async fn take_reports(
        registry: Weak<Registry>,
        mut reports: mpsc::UnboundedReceiver<Report>,
    ) {
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
                    let tasks = registry.tasks().clone();
                    tasks.spawn(async move { registry.renewal_lost(&lease, taken).await });
                }
            }
        }
    }

    /// A lease was renewed: its run learns how long it may go on should it lose
    /// this agent (only where leases outlive the agent; the scheduler reports
    /// no renewal of a lease that cannot expire).
    fn renewed(&self, lease_id: &str, valid_until: Instant) {
        if !self.capabilities.survives_agent {
            return;
        }
        let state = self.state();
        if let Some(c) = state
            .leases
            .get(lease_id)
            .and_then(|l| state.conns.get(&l.conn))
        {
            c.events.renewed(lease_id, valid_until);
        }
    }

    /// A lease is gone: tell its connection, stop the run if its client is
    /// gone, and let go of the record with `ending` if it is still ours.
    pub(super) async fn lose(
        &self,
        lease_id: &str,
        loss: Loss,
        holder: Option<Holder>,
        ending: Ending,
    ) {
        let reason = loss.reason();
        let (lease, notice) = {
            let mut state = self.state();
            let Some(lease) = state.remove_lease(lease_id, &*self.observer) else {
                return;
            };
            // Its forcer or breaker waits for the run to stop (invariant 10).
            if matches!(
                loss,
                Loss::ForcedHere { .. }
                    | Loss::BrokenHere { .. }
                    | Loss::TakenOver { .. }
                    | Loss::Gone
            ) {
                if let Some(c) = state.conns.get_mut(&lease.conn) {
                    c.stopped_owed.push(lease.reference(lease_id));
                }
            }
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
        tracing::warn!(key = %lease.key.logged(), token = lease.holder.token, ?reason, "lease lost");
        self.observer.lost(lease.holder.acquired_at_ms, reason);
        let grace = timing::kill_grace(lease.ttl);
        if let Some((events, viewer, orphan, on_lost)) = notice {
            let holder = holder.map(|h| self.show(&h, viewer));
            events.lost(lease_id, lease.key.clone(), loss, holder);
            // The shim acts on `lost` itself; only when it is gone does the agent act for it.
            if let Some(run) = orphan {
                run.stop(on_lost, grace, self.tasks());
            }
        }
        let reference = lease.reference(lease_id);
        if reason == LostReason::Expired {
            // The record may still name us: freeing it now would let another run
            // start while ours is still being stopped. Free it once ours is gone.
            let backend = self.backend.clone();
            self.tasks().spawn(async move {
                tokio::time::sleep(grace).await;
                let _ = backend.end(&reference, &ending).await;
            });
        } else {
            // Someone else holds it now (or, broken here, about to be freed
            // as `ending` says): this only lets go of our local hold.
            let _ = self.backend.end(&reference, &ending).await;
        }
        self.state().queues.wake_head(&lease.key);
    }

    /// The renewal scheduler gave the lease up: `taken` when the store says it is
    /// someone else's, otherwise its deadline passed without a renewal.
    async fn renewal_lost(&self, lease: &LeaseRef, taken: bool) {
        if !taken {
            // Tell the run now: looking up who else holds it could hang on the same store.
            let ending = Ending::Lost(Loss::NotRenewed.to_string());
            return self
                .lose(&lease.lease_id, Loss::NotRenewed, None, ending)
                .await;
        }
        let lookup = tokio::time::timeout(LOOKUP_TIMEOUT, self.backend.inspect(&lease.key));
        let record = lookup.await.ok().and_then(Result::ok);
        let (loss, holder) = match record {
            // A record still naming this lease (`file://`: its lock file
            // was removed) names nobody who took it.
            Some(KeyRecord {
                holder: Some(h), ..
            }) if h.token != lease.token => {
                let loss = Loss::TakenOver {
                    user: h.user.clone(),
                    host: h.host.clone(),
                    pid: h.pid,
                    token: h.token,
                };
                (loss, Some(h))
            }
            // Free at a later token: someone took it and let it go before we
            // looked, a `runlock release` or a forced run that has already ended.
            Some(r) if r.token > lease.token => (Loss::FreedSince(r.token), None),
            _ => (Loss::Gone, None),
        };
        self.lose(&lease.lease_id, loss, holder, Ending::Released)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::super::event::RENEWED_BACKLOG;
    use super::super::testing::*;
    use runlock_protocol::LostReason;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn a_lease_whose_renewals_keep_failing_is_lost_at_its_deadline_not_before() {
        use crate::backend::cas::{testing::FaultyStore, CasEngine, MemoryCasStore};
        let store = Arc::new(FaultyStore::reliable(MemoryCasStore::new()));
        let registry = agent(Arc::new(CasEngine::new(store.clone())), "a");
        let (conn, mut events) = connect(&registry, ROOT);
        let granted = Instant::now();
        take(&registry, conn, &["k"]).await.expect("free");
        // The store's proof and the grant wrote before: only retries count.
        let (_, writes_before) = store.requests();
        store.fail_everything(true);
        let event = tokio::time::timeout(Duration::from_secs(120), events.recv()).await;
        let at = granted.elapsed();
        match event.expect("told within the TTL").expect("open") {
            Event::Lost { loss, .. } => assert_eq!(loss.reason(), LostReason::Expired),
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
        let retries = store.requests().1 - writes_before;
        assert!(retries < 60, "{retries} writes: retries did not back off");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_lost_while_its_record_still_names_it_is_recorded_as_lost() {
        use crate::backend::cas::{testing::FaultyStore, CasEngine, MemoryCasStore};
        use runlock_protocol::EventKind;
        let store = Arc::new(FaultyStore::reliable(MemoryCasStore::new()));
        let registry = agent(Arc::new(CasEngine::new(store.clone())), "a");
        let (conn, mut events) = connect(&registry, ROOT);
        take(&registry, conn, &["k"]).await.expect("free");
        store.fail_everything(true);
        let event = tokio::time::timeout(Duration::from_secs(120), events.recv()).await;
        assert!(matches!(event, Ok(Some(Event::Lost { .. }))), "{event:?}");
        // The store answers again before anyone else could take the key: the
        // agent frees its record once the run's kill grace has passed.
        store.fail_everything(false);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let history = registry.history("k", 0).await.expect("history");
        let kinds: Vec<_> = history.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventKind::Granted, EventKind::Lost]);
        assert!(history[1].reason.contains("deadline"), "{history:?}");
        let record = registry.inspect("k").await.expect("record");
        assert_eq!(record.incident.map(|e| e.kind), Some(EventKind::Lost));
        // `limit` keeps the latest.
        let latest = registry.history("k", 1).await.expect("history");
        assert_eq!(latest.len(), 1);
        assert_eq!(latest[0].kind, EventKind::Lost);
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_does_not_read_gets_a_bounded_backlog_of_renewed_events() {
        use crate::backend::cas::{CasEngine, MemoryCasStore};
        let engine = Arc::new(CasEngine::new(Arc::new(MemoryCasStore::new())));
        let registry = agent_with(engine, "a", Policy::with_ttl(Duration::from_secs(3)));
        let (conn, mut events) = connect(&registry, ROOT);
        take(&registry, conn, &["k"]).await.expect("free");
        // About 300 renewals (one a second); nobody reads the events.
        tokio::time::sleep(Duration::from_secs(300)).await;
        let mut renewed = 0;
        while let Ok(event) = events.try_recv() {
            assert!(matches!(event, Event::Renewed { .. }), "{event:?}");
            renewed += 1;
        }
        assert_eq!(renewed, RENEWED_BACKLOG);
        assert_eq!(registry.list().len(), 1, "the lease itself is unaffected");
    }
}
