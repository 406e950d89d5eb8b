//! The take-over rule: whether one try of an acquire takes its key, and
//! from whom, read in one place ([`Registry::try_take`]). The waiting
//! around the tries is `acquire`'s; this is what one try decides.
//!
//! A try is made at the acquire's turn only: first in its key's local
//! queue (among the first N for a key with N slots), or at once with
//! `force`. Then:
//!
//! 1. The store decides whether the key's record may be written over
//!    (`Backend::acquire`, by each store's own clock): a free key; a lease
//!    no longer kept (not renewed for its TTL and grace, its agent stopped
//!    or gone; on `file://`, its run's kernel lock let go); or this
//!    lease's own earlier write whose answer was lost. A live holder is
//!    taken over only with `force`, and a stopped agent's leases are left
//!    for `reattach`, by their own user. Anything else is held: the
//!    acquire waits for it, or says who holds it.
//! 2. A key with slots is tried a slot at a time (`slots::take_slot`):
//!    the slot this agent let go last, then the lowest free; a force that
//!    finds every slot held takes the one granted earliest.
//! 3. Every holder holds a key with one count of slots: a holder of
//!    another count refuses the acquire at once (`SlotsMismatch`), never
//!    waited for. A plain force reads every slot before it writes, since
//!    its write ends its holder's run; and after any write the key's other
//!    slots are read again (invariant 10), a holder of another count found
//!    then having the grant given back.
//! 4. A grant older than one this agent already registered for the key
//!    (two forces answered out of order) took nothing: it is refused and
//!    the newer stays (`register`).
//! 5. A grant that displaced a live run is answered only once that run has
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
use crate::backend::{AcquireSpec, BackendError, Ending, Grant, LeaseRef};
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
            true => {
                self.take_slot(key, claim.slots, spec)
                    .await
                    .map_err(|refusal| match refusal {
                        SlotRefusal::Held(holders, incident) => NotTaken::Held(Refusal {
                            holders,
                            incident,
                            ..Refusal::default()
                        }),
                        SlotRefusal::Mismatch(count, holders) => mismatch(count, holders),
                        SlotRefusal::Backend(err) => NotTaken::from_backend(key, err),
                    })?
            }
            false => self.take_plain(key, spec, &mismatch).await?,
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
        match self.backend.acquire(&spec).await {
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
