//! The take-over rule: whether one try of an acquire takes its key, and
//! from whom, read in one place ([`Registry::try_take`]). The waiting
//! around the tries is `acquire`'s; this is what one try decides.
//!
//! A try is made at the acquire's turn only: first in its key's local
//! queue (among the first N for a key with N slots), or at once with
//! `force`. Then:
//!
//! 1. A plain try that may wait, at a record this agent holds or is still
//!    releasing, finds it held without asking the store
//!    ([`Registry::acquire_unless_held_here`]): that lease's end wakes the
//!    waiter, and on `file://` its run drops the kernel lock before its
//!    release arrives, when the store would find the key free. A try that
//!    may not wait asks the store, which frees a killed run's key at once.
//! 2. The store decides whether the key's record may be written over
//!    (`Backend::acquire`, by each store's own clock): a free key; a lease
//!    no longer kept (not renewed for its TTL and grace, its agent stopped
//!    or gone; on `file://`, its run's kernel lock let go); or this
//!    lease's own earlier write whose answer was lost. A live holder is
//!    taken over only with `force`, and a stopped agent's leases are left
//!    for `reattach`, by their own user. Anything else is held: the
//!    acquire waits for it, or says who holds it.
//! 3. A key with slots is tried a slot at a time (`slots::take_slot`):
//!    the slot this agent let go last, then the lowest free; a force that
//!    finds every slot held takes the one granted earliest.
//! 4. Every holder holds a key with one count of slots: a holder of
//!    another count refuses the acquire at once (`SlotsMismatch`), never
//!    waited for. A plain force reads every slot before it writes, since
//!    its write ends its holder's run; and after any write the key's other
//!    slots are read again (invariant 10), a holder of another count found
//!    then having the grant given back.
//! 5. A grant older than one this agent already registered for the key
//!    (two forces answered out of order) took nothing: it is refused and
//!    the newer stays (`register`).
//! 6. A grant that displaced a live run is answered only once that run has
//!    stopped (`displaced`); a lease of this agent's it displaced is told
//!    it is lost.
//!
//! A store out of reach is waited out by an acquire that may wait.

use super::error::{backend_on, LeaseError};
use super::event::Loss;
use super::observer::Takeover;
use super::registry::Registry;
use super::renewal::deadline;
use super::slots::{count_of, SlotRefusal};
use super::state::{ConnId, LocalLease};
use crate::backend::{AcquireSpec, BackendError, BackendResult, Ending, Grant, LeaseRef};
use crate::shown;
use runlock_protocol::{Holder, Key, Lease};
use std::os::fd::OwnedFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// One key taken: its lease, until when it stays guaranteed, its lock for the run.
pub(super) type Taken = (Lease, Option<Instant>, Option<OwnedFd>);

/// What each try of one acquire writes: for whom, as whom, how.
pub(super) struct Claim {
    pub(super) conn: ConnId,
    /// The holder recorded; each try sets its time.
    pub(super) holder: Holder,
    pub(super) ttl: Duration,
    /// How many holders each key admits at once (1: a plain key).
    pub(super) slots: u32,
    pub(super) force: bool,
    /// It may wait: a try leaves a key held here to its holder (rule 1).
    pub(super) may_wait: bool,
}

/// The wall clock, in ms since the epoch: when a holder took its key.
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Registry {
    /// One try at `key` for `claim`, at the acquire's turn: the key taken
    /// (answered once any run it displaced has stopped), or why not.
    pub(super) async fn try_take(&self, claim: &Claim, key: &Key) -> Result<Taken, NotTaken> {
        let spec = AcquireSpec {
            key: key.clone(),
            lease_id: uuid::Uuid::new_v4().to_string(),
            holder: Holder {
                acquired_at_ms: now_ms(),
                ..claim.holder.clone()
            },
            ttl: claim.ttl,
            force: claim.force,
            breaking: false,
        };
        let (spec, mut grant) = self.attempt(claim, key, spec).await?;
        let (displaced, sent) = (grant.displaced.take(), grant.sent);
        let taken = (self.register(claim.conn, spec, grant).await).map_err(NotTaken::Refused)?;
        if let Some(displaced) = displaced {
            self.observer.taken_over(Takeover::Force);
            // Invariant 10: answered once the displaced run has stopped.
            self.await_stopped(claim.conn, key, &displaced, sent).await;
        }
        Ok(taken)
    }

    /// The answer to an acquire of `key` for `claim` that waited `waited`
    /// and did not take it, the last try having found `refusal`: who holds
    /// it, as the peer may see them.
    pub(super) async fn held(
        &self,
        claim: &Claim,
        key: Key,
        waited: Duration,
        mut refusal: Refusal,
    ) -> LeaseError {
        if let Some(err) = refusal.unreachable {
            return backend_on(&key)(err);
        }
        // Behind a local waiter: who holds it is looked up only now.
        if claim.slots > 1 && refusal.holders.is_empty() {
            refusal.holders = self.slot_holders(&key).await;
        }
        let holder = match refusal.holder {
            Some(holder) => Some(holder),
            None if refusal.holders.is_empty() => self.holder_of(&key).await,
            None => None,
        };
        // A holder here was answered without the store: the key's last
        // incident, which the store's answer names, is read only now.
        let here = &self.identity().agent_id;
        if refusal.incident.is_none() && holder.as_ref().is_some_and(|h| &h.agent_id == here) {
            let record = self.backend.inspect(&key).await;
            refusal.incident = record.ok().and_then(|r| r.incident);
        }
        let viewer = self.viewer(claim.conn);
        let holders: Vec<Holder> = refusal
            .holders
            .iter()
            .map(|h| self.show(h, viewer))
            .collect();
        LeaseError::Held {
            key,
            waited,
            holder: holder
                .map(|h| Box::new(self.show(&h, viewer)))
                .or_else(|| holders.first().cloned().map(Box::new)),
            holders,
            slots: claim.slots,
            unrecorded: refusal.unrecorded,
            incident: refusal.incident.map(|e| Box::new(shown::event(&e))),
        }
    }

    /// One try at `key` for `spec`: a plain key in one backend call, a key
    /// with slots through `take_slot`. A holder that took the key with
    /// another count of slots is refused, never mixed with.
    async fn attempt(
        &self,
        claim: &Claim,
        key: &Key,
        spec: AcquireSpec,
    ) -> Result<(AcquireSpec, Grant), NotTaken> {
        let viewer = self.viewer(claim.conn);
        let mismatch = |held_with: u32, holders: Vec<Holder>| {
            NotTaken::Refused(LeaseError::SlotsMismatch {
                key: key.clone(),
                asked: claim.slots,
                held_with,
                holders: holders.iter().map(|h| self.show(h, viewer)).collect(),
            })
        };
        let (spec, grant) = match claim.slots > 1 {
            true => self
                .take_slot(key, claim.slots, spec, claim.may_wait)
                .await
                .map_err(|refusal| match refusal {
                    SlotRefusal::Held(holders, incident) => NotTaken::Held(Refusal {
                        holders,
                        incident,
                        ..Refusal::default()
                    }),
                    SlotRefusal::Mismatch(count, holders) => mismatch(count, holders),
                    SlotRefusal::Backend(err) => NotTaken::from_backend(key, err),
                })?,
            false => {
                self.take_plain(key, spec, claim.may_wait, &mismatch)
                    .await?
            }
        };
        // Invariant 10: whatever was read before the write, the key's other
        // slots are read again after it (the slot-retake shortcut included).
        let mine = spec.holder.slot.unwrap_or(0);
        match self.counts_agree(key, claim.slots, mine).await {
            Ok(None) => Ok((spec, grant)),
            Ok(Some((count, holders))) => {
                self.give_back(claim.conn, &spec, grant).await;
                Err(mismatch(count, holders))
            }
            Err(err) => {
                self.give_back(claim.conn, &spec, grant).await;
                Err(NotTaken::from_backend(key, err))
            }
        }
    }

    /// Lets go of a grant that must not stand (invariant 10): at once, or,
    /// if it took the key over, once the run it displaced has stopped.
    async fn give_back(&self, conn: ConnId, spec: &AcquireSpec, grant: Grant) {
        let lease = LeaseRef {
            key: spec.key.clone(),
            lease_id: spec.lease_id.clone(),
            token: grant.holder.token,
        };
        if let Some(forced) = self.held_here_before(&spec.key, lease.token) {
            self.forced_out_here(&forced, &grant.holder).await;
        }
        self.let_go_once_stopped(conn, lease, spec.ttl, &grant, &Ending::Released)
            .await;
    }

    /// A plain key: its own record, one holder.
    async fn take_plain(
        &self,
        key: &Key,
        spec: AcquireSpec,
        may_wait: bool,
        mismatch: &impl Fn(u32, Vec<Holder>) -> NotTaken,
    ) -> Result<(AcquireSpec, Grant), NotTaken> {
        if spec.force {
            // A force ends its holder's run before anything is read again, so
            // every slot is checked first: a plain force never displaces a
            // slot, nor joins slot holders.
            let records = self.records_from(key, 0).await;
            let records = records.map_err(|err| NotTaken::from_backend(key, err))?;
            let holders: Vec<Holder> = records
                .iter()
                .filter(|r| r.state == runlock_protocol::KeyState::Held)
                .filter_map(|r| r.holder.clone())
                .filter(|h| count_of(h) != 1)
                .collect();
            if let Some(h) = holders.first() {
                return Err(mismatch(count_of(h), holders));
            }
        }
        match self.acquire_unless_held_here(&spec, may_wait).await {
            Ok(grant) => Ok((spec, grant)),
            Err(BackendError::Held(Some(h), _)) if count_of(&h) != 1 => {
                Err(mismatch(count_of(&h), vec![*h]))
            }
            Err(BackendError::Held(holder, incident)) => Err(NotTaken::Held(Refusal {
                holder,
                incident,
                ..Refusal::default()
            })),
            Err(BackendError::HeldUnrecorded(why)) => Err(NotTaken::Held(Refusal {
                unrecorded: Some(why),
                ..Refusal::default()
            })),
            Err(BackendError::HeldOutside(outsider)) => Err(NotTaken::Held(Refusal {
                holder: Some(Box::new(outsider.holder)),
                unrecorded: Some(outsider.explanation),
                ..Refusal::default()
            })),
            Err(err) => Err(NotTaken::from_backend(key, err)),
        }
    }

    /// The store's answer to one try of `spec`, but a plain try that may
    /// wait, at a record this agent holds (or is still releasing), finds it
    /// held by that lease whatever the store says: on `file://` a run lets
    /// go of its kernel lock before its release reaches the agent, and the
    /// store finds the key free in between. The lease's end wakes the
    /// waiter. A try that may not wait asks the store: a killed run's key
    /// is free the moment its last process exits, before this agent has
    /// seen its connection close.
    pub(super) async fn acquire_unless_held_here(
        &self,
        spec: &AcquireSpec,
        may_wait: bool,
    ) -> BackendResult<Grant> {
        let here = (may_wait && !spec.force)
            .then(|| self.state().local_holder(&spec.key))
            .flatten();
        match here {
            Some(holder) => Err(BackendError::Held(Some(Box::new(holder)), None)),
            None => self.backend.acquire(spec).await,
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

    /// Records a granted lease; a local lease it forced out is told it is lost.
    /// Returns the lease and, where leases outlive the agent, until when it is
    /// guaranteed without a renewal.
    pub(super) async fn register(
        &self,
        conn: ConnId,
        spec: AcquireSpec,
        grant: Grant,
    ) -> Result<Taken, LeaseError> {
        let (holder, lock) = (grant.holder, grant.lock);
        let lease_id = spec.lease_id.clone();
        let lease = LocalLease {
            key: spec.key.clone(),
            conn,
            ttl: spec.ttl,
            holder: holder.clone(),
            releasing: false,
        };
        let reference = lease.reference(&lease_id);
        let registered = {
            let mut state = self.state();
            // Two forces through this agent can reach the store in one order and
            // be answered in the other. A later grant already registered here
            // means ours was superseded before it began: taking its place would
            // tell the current holder it was forced out, and free its record.
            let newer = (state.by_key.get(&spec.key))
                .and_then(|id| state.leases.get(id))
                .filter(|newer| newer.holder.token > holder.token)
                .map(|newer| newer.holder.clone());
            match (newer, state.conns.get_mut(&conn)) {
                (Some(newer), _) => Err(Some(newer)),
                (None, Some(c)) => {
                    c.leases.insert(lease_id.clone());
                    let displaced = state.by_key.insert(spec.key.clone(), lease_id.clone());
                    // A lease whose release is under way has ended: not lost.
                    let displaced =
                        displaced.filter(|id| state.leases.get(id).is_some_and(|l| !l.releasing));
                    state.leases.insert(lease_id.clone(), lease);
                    self.observer.leases_held(state.leases.len());
                    Ok(displaced)
                }
                (None, None) => Err(None),
            }
        };
        let displaced = match registered {
            Ok(displaced) => displaced,
            Err(newer) => {
                if newer.is_none() {
                    let _ = self.backend.release(&reference).await;
                }
                // Its run never started: a force that displaced it need not wait.
                self.confirm_stopped(vec![reference]).await;
                let Some(newer) = newer else {
                    return Err(LeaseError::ClosedDuringAcquire);
                };
                let viewer = self.viewer(conn);
                return Err(LeaseError::Held {
                    holders: Vec::new(),
                    slots: 1,
                    key: spec.key,
                    waited: Duration::ZERO,
                    holder: Some(Box::new(self.show(&newer, viewer))),
                    unrecorded: None,
                    incident: None,
                });
            }
        };
        if self.capabilities.needs_renewal {
            self.renewals.start_lease(reference, spec.ttl, grant.sent);
        }
        if let Some(old) = displaced {
            self.forced_out_here(&old, &holder).await;
        }
        tracing::info!(key = %spec.key.logged(), token = holder.token, lease = %lease_id, force = spec.force, "acquired");
        let valid_until = (self.capabilities.survives_agent && self.capabilities.lease_expires)
            .then(|| deadline(grant.sent, spec.ttl));
        let lease = Lease {
            key: spec.key.split_slot().0.to_string(),
            lease_id,
            token: holder.token,
            slot: holder.slot,
        };
        Ok((lease, valid_until, lock))
    }

    /// The local lease `lease_id` was taken over through this agent by
    /// `by`: its run is told so, and the key stays `by`'s.
    async fn forced_out_here(&self, lease_id: &str, by: &Holder) {
        let loss = Loss::ForcedHere {
            user: by.user.clone(),
            host: by.host.clone(),
            pid: by.pid,
        };
        self.lose(lease_id, loss, Some(by.clone()), Ending::Released)
            .await;
    }
}

/// Why one try at a key did not take it.
pub(super) enum NotTaken {
    /// Held: wait, or tell who holds it.
    Held(Refusal),
    /// The store cannot be reached: a run that may wait waits it out.
    Unreachable(BackendError),
    /// Refused for good.
    Refused(LeaseError),
}

impl NotTaken {
    fn from_backend(key: &Key, err: BackendError) -> NotTaken {
        match err {
            err @ BackendError::Unavailable(_) => NotTaken::Unreachable(err),
            err => NotTaken::Refused(backend_on(key)(err)),
        }
    }
}

/// What the last try at a key learnt of its holders.
#[derive(Default)]
pub(super) struct Refusal {
    holder: Option<Box<Holder>>,
    /// For a key with slots: every slot's holder.
    holders: Vec<Holder>,
    incident: Option<Box<runlock_protocol::KeyEvent>>,
    /// What the backend knows of a holder that is no lease.
    unrecorded: Option<String>,
    pub(super) unreachable: Option<BackendError>,
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use crate::backend::{Backend, BackendResult, Ending, LeaseRef};
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::Notify;

    /// A store whose `end` frees the record at once but answers only when
    /// told: as on `file://`, where the run's kernel lock is let go before
    /// the agent's release has written its end.
    #[derive(Default)]
    struct FreedEarly {
        freed: Notify,
        answer: Notify,
        /// Until set, every end answers at once.
        holding: AtomicBool,
    }

    #[async_trait::async_trait]
    impl Hooks for FreedEarly {
        async fn end(
            &self,
            store: &dyn Backend,
            lease: &LeaseRef,
            ending: &Ending,
        ) -> BackendResult<()> {
            store.end(lease, ending).await?;
            if self.holding.load(Ordering::SeqCst) {
                self.freed.notify_one();
                self.answer.notified().await;
            }
            Ok(())
        }
    }

    fn reference(lease: &Lease) -> LeaseRef {
        let key = Key::new(&lease.key).expect("valid");
        LeaseRef {
            key: key.slot_record(lease.slot.unwrap_or(0)),
            lease_id: lease.lease_id.clone(),
            token: lease.token,
        }
    }

    /// Polls, in paused time, for as long as a waiter would try many times.
    async fn polls_go_by() {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    /// A run takes `k` (with two slots, another run holds the other, so
    /// that the next has only this run's slot to take), then its record is
    /// freed in the store alone, as `file://` frees it when the run lets go
    /// of its kernel lock: the run's lease.
    async fn taken_then_freed_in_store(
        registry: &Registry,
        store: &Forwarding<FreedEarly>,
        run: ConnId,
        slots: u32,
    ) -> Lease {
        let never = CancellationToken::new();
        let now = || AcquireRequest {
            slots,
            ..request(&["k"], Duration::ZERO, false)
        };
        let held = registry.acquire(run, now(), &never).await;
        let held = held.expect("free").leases.remove(0);
        if slots == 2 {
            let (other, _e) = connect(registry, ROOT);
            registry
                .acquire(other, now(), &never)
                .await
                .expect("slot 1");
        }
        let inner = &store.inner.backend;
        let freed = inner.end(&reference(&held), &Ending::Released).await;
        freed.expect("freed in the store");
        held
    }

    // The shim lets go of its kernel lock, then sends `release`: a waiter
    // trying the store in between finds the key free there.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_leaves_a_key_held_here_to_its_holder_even_where_the_store_finds_it_free() {
        for slots in [1, 2] {
            let store = hooked(FreedEarly::default());
            store.hooks.holding.store(true, Ordering::SeqCst);
            let registry = agent(store.clone(), "agent-1");
            let (holder, mut holder_events) = connect(&registry, ROOT);
            let (waiter, _waiter_events) = connect(&registry, ROOT);
            let held = taken_then_freed_in_store(&registry, &store, holder, slots).await;
            let wait = AcquireRequest {
                slots,
                ..request(&["k"], Duration::from_secs(60), false)
            };
            let waiting = spawn_queued(&registry, waiter, wait).await;
            polls_go_by().await;
            assert!(
                !waiting.is_finished(),
                "{slots} slot(s): taken from its live holder"
            );

            let releasing = {
                let registry = registry.clone();
                tokio::spawn(async move { registry.release(holder, &[held.lease_id]).await })
            };
            store.hooks.freed.notified().await;
            polls_go_by().await;
            assert!(
                !waiting.is_finished(),
                "{slots} slot(s): taken before its release ended"
            );
            store.hooks.answer.notify_one();
            let released = releasing.await.expect("ran").expect("still the holder's");
            assert_eq!(released, 1, "{slots} slot(s)");
            let taken = tokio::time::timeout(Duration::from_secs(1), waiting).await;
            let taken = taken
                .expect("woken by the release")
                .expect("ran")
                .expect("granted");
            assert_eq!(taken.leases[0].slot, held.slot, "{slots} slot(s)");
            assert!(
                holder_events.try_recv().is_err(),
                "{slots} slot(s): the holder was told of a loss"
            );
        }
    }

    // A try that may not wait asks the store, which alone knows at once that
    // a run let go: a killed run's key is free before this agent has seen
    // its connection close, and a lease whose release is under way has
    // ended, so the run that takes its key does not make it lost.
    #[tokio::test(start_paused = true)]
    async fn a_try_that_may_not_wait_takes_a_key_its_holders_run_let_go_of() {
        for slots in [1, 2] {
            let store = hooked(FreedEarly::default());
            let registry = agent(store.clone(), "agent-1");
            let never = CancellationToken::new();
            let now = || AcquireRequest {
                slots,
                ..request(&["k"], Duration::ZERO, false)
            };
            let (killed, _killed_events) = connect(&registry, ROOT);
            let held = taken_then_freed_in_store(&registry, &store, killed, slots).await;
            let (next, mut next_events) = connect(&registry, ROOT);
            let taken = registry.acquire(next, now(), &never).await;
            let taken = taken.expect("a killed run's key is free at once");
            let taken = taken.leases.into_iter().next().expect("one lease");
            assert_eq!(taken.slot, held.slot, "{slots} slot(s)");

            store.hooks.holding.store(true, Ordering::SeqCst);
            let releasing = {
                let registry = registry.clone();
                let id = taken.lease_id.clone();
                tokio::spawn(async move { registry.release(next, &[id]).await })
            };
            store.hooks.freed.notified().await;
            store.hooks.holding.store(false, Ordering::SeqCst);
            let (last, _last_events) = connect(&registry, ROOT);
            let last = registry.acquire(last, now(), &never).await;
            let last = last.expect("freed by a release under way").leases.remove(0);
            store.hooks.answer.notify_one();
            let released = releasing.await.expect("ran").expect("released");
            assert_eq!(released, 1, "{slots} slot(s)");
            assert!(
                next_events.try_recv().is_err(),
                "{slots} slot(s): a lease being released was told it is lost"
            );
            let key = Key::new("k")
                .expect("valid")
                .slot_record(last.slot.unwrap_or(0));
            let here = registry.state().local_holder(&key).map(|h| h.token);
            assert_eq!(
                here,
                Some(last.token),
                "{slots} slot(s): the new holder is known here"
            );
        }
    }
}
