//! Taking keys: `acquire` (every key of a request, in sorted order, all or
//! nothing, waiting in the local queue and polling for holders elsewhere) and
//! `reattach` (adopting the leases of a stopped agent).

use super::error::{backend_on, valid_key, valid_slot, LeaseError};
use super::observer::Waiting;
use super::registry::Registry;
use super::state::{ConnId, PeerCred};
use super::takeover::{Claim, NotTaken, Refusal, Taken};
use crate::backend::retry::jittered;
use crate::backend::{history, AcquireSpec, Adopter, BackendError, Ending, LeaseRef};
use crate::shown;
use runlock_protocol::{
    Holder, Key, Lease, OnLost, MAX_COMMAND_LEN, MAX_KEYS_PER_REQUEST, MAX_SLOTS,
};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A waiter's first re-check of the backend (for holders on other agents);
/// its pauses then double up to the policy's `poll_interval`.
pub(super) const POLL_START: Duration = Duration::from_millis(20);

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
    /// How many holders each key admits at once (1: a plain key).
    pub slots: u32,
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

/// One acquire, checked: what each of its keys is tried with, and how
/// long it may wait for them.
struct Acquiring<'a> {
    claim: Claim,
    wait: Duration,
    /// The end of the wait, the same for every key.
    deadline: Instant,
    /// Cancelled when the peer goes away.
    cancel: &'a CancellationToken,
}

impl Registry {
    /// Takes every key of `req`, in sorted order, all or nothing.
    pub async fn acquire(
        &self,
        conn: ConnId,
        req: AcquireRequest,
        cancel: &CancellationToken,
    ) -> Result<Granted, LeaseError> {
        if req.keys.len() > MAX_KEYS_PER_REQUEST {
            return Err(LeaseError::TooManyKeys(req.keys.len()));
        }
        let mut keys = Vec::with_capacity(req.keys.len());
        for key in &req.keys {
            keys.push(valid_key(key)?);
        }
        // Every agent takes keys in the same order, so multi-key runs cannot deadlock.
        keys.sort();
        keys.dedup();
        if keys.is_empty() {
            return Err(LeaseError::NoKeys);
        }
        let ttl = self.ttl(req.ttl)?;
        if req.slots == 0 || req.slots > MAX_SLOTS {
            return Err(LeaseError::SlotsOutOfRange(req.slots));
        }
        let (peer, user, may_override) = self.peer(conn)?;
        if req.force && !may_override {
            return Err(self.forbidden(peer, "force a lock", None));
        }
        let acquiring = Acquiring {
            claim: Claim {
                conn,
                holder: self.holder(peer, user, shown::cut(&req.command, MAX_COMMAND_LEN)),
                ttl,
                slots: req.slots,
                force: req.force,
                may_wait: !req.wait.is_zero(),
            },
            wait: req.wait,
            deadline: Instant::now() + req.wait,
            cancel,
        };
        let mut granted = Granted::new(ttl, keys.len());
        for key in keys {
            match self.acquire_key(&acquiring, key).await {
                Ok(taken) => granted.add(taken),
                Err(err) => {
                    let taken = granted.leases.into_iter().map(|l| l.lease_id).collect();
                    self.release_leases(taken, &Ending::Released).await;
                    if let LeaseError::Held { key, waited, .. } = &err {
                        let user = &acquiring.claim.holder.user;
                        self.note_refusal(key, peer, user, *waited);
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

    /// Notes a refused acquire of `key`, for the fleet page (`list_keys`).
    fn note_refusal(&self, key: &Key, peer: PeerCred, user: &str, waited: Duration) {
        let refusal = runlock_protocol::Refusal {
            at_ms: history::Stamp::agent_now().at_ms,
            host: self.identity().host.clone(),
            uid: peer.uid,
            user: user.to_string(),
            pid: peer.pid,
            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
        };
        let base = Key::new(key.split_slot().0).unwrap_or_else(|_| key.clone());
        self.state().report.refused(base, refusal);
    }

    /// Adopts leases taken through an agent that has stopped, once the backend
    /// confirms each is still held, unexpired, with its id and token, by this
    /// peer's user: checked by the store on the record it rewrites, never on
    /// a view of it, and for everyone alike (a force user forces; it has no
    /// need to adopt another's run). Another user's lease is answered as not
    /// held, which tells a guesser nothing. All or nothing: on a failure the
    /// leases adopted so far stay with this connection, to be released when
    /// it closes (after its run has stopped).
    pub async fn reattach(
        &self,
        conn: ConnId,
        leases: Vec<Lease>,
        on_lost: OnLost,
    ) -> Result<Granted, LeaseError> {
        if leases.is_empty() {
            return Err(LeaseError::NoLeases);
        }
        let (peer, _, _) = self.peer(conn)?;
        let by = Adopter {
            agent_id: self.identity().agent_id.clone(),
            uid: peer.uid,
        };
        let mut granted = Granted::new(Duration::ZERO, leases.len());
        if leases.len() > MAX_KEYS_PER_REQUEST {
            return Err(LeaseError::TooManyLeases(leases.len()));
        }
        for lease in leases {
            let key = valid_key(&lease.key)?;
            let key = valid_slot(&key, lease.slot.unwrap_or(0))?;
            if self.state().leases.contains_key(&lease.lease_id) {
                return Err(LeaseError::AlreadyHeldHere(lease.lease_id));
            }
            let reference = LeaseRef {
                key: key.clone(),
                lease_id: lease.lease_id.clone(),
                token: lease.token,
            };
            let adopted = self
                .backend
                .adopt(&reference, &by)
                .await
                .map_err(|e| match e {
                    BackendError::LeaseMismatch => LeaseError::NoLongerHeld {
                        key: key.clone(),
                        lease_id: lease.lease_id.clone(),
                    },
                    other => backend_on(&key)(other),
                })?;
            granted.ttl = adopted.ttl;
            let spec = AcquireSpec {
                key,
                lease_id: lease.lease_id,
                holder: adopted.grant.holder.clone(),
                ttl: adopted.ttl,
                force: false,
                breaking: false,
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

    /// Takes one key for the connection (one of its slots, for a key with
    /// slots): tried at its turn in the key's local queue, or at once with
    /// `force`, until `deadline`.
    async fn acquire_key(&self, acquiring: &Acquiring<'_>, key: Key) -> Result<Taken, LeaseError> {
        let claim = &acquiring.claim;
        let mut place = self.enqueue(&key, claim.slots, &claim.holder);
        let cap = self.policy().poll_interval;
        let mut poll = POLL_START.min(cap);
        // Set at the first wait, dropped with the answer: the waiters gauge.
        let mut waiting = None;
        loop {
            let mut refusal = Refusal::default();
            if claim.force || self.may_try(&key, place.id) {
                match self.try_take(claim, &key).await {
                    Ok(taken) => return Ok(taken),
                    // A run that may wait also waits out a store that cannot be reached.
                    Err(NotTaken::Unreachable(err)) if claim.may_wait => {
                        refusal.unreachable = Some(err)
                    }
                    Err(NotTaken::Unreachable(err)) => return Err(backend_on(&key)(err)),
                    Err(NotTaken::Refused(err)) => return Err(err),
                    Err(NotTaken::Held(held)) => refusal = held,
                }
            }
            if Instant::now() >= acquiring.deadline {
                return Err(self.held(claim, key, acquiring.wait, refusal).await);
            }
            waiting.get_or_insert_with(|| Waiting::begin(&*self.observer));
            place.waits();
            // A local release wakes us at once; polling finds holders on other agents.
            tokio::select! {
                _ = place.notify.notified() => {}
                _ = tokio::time::sleep(jittered(poll)) => {}
                _ = tokio::time::sleep_until(acquiring.deadline) => {}
                _ = acquiring.cancel.cancelled() => {
                    return Err(LeaseError::Cancelled);
                }
            }
            poll = (poll * 2).min(cap);
        }
    }

    fn enqueue(&self, key: &Key, slots: u32, holder: &Holder) -> Place<'_> {
        let id = self.next_id();
        let notify = Arc::new(Notify::new());
        let who = runlock_protocol::Waiter {
            host: self.identity().host.clone(),
            uid: holder.uid,
            user: holder.user.clone(),
            pid: holder.pid,
            since_ms: history::Stamp::agent_now().at_ms,
        };
        self.state()
            .queues
            .join(key, id, notify.clone(), slots, who);
        Place {
            registry: self,
            key: key.clone(),
            id,
            notify,
            reported: false,
        }
    }

    fn may_try(&self, key: &Key, id: u64) -> bool {
        self.state().queues.may_try(key, id)
    }
}

/// A waiter's place in a key's local queue; leaving it wakes the next in line.
struct Place<'a> {
    registry: &'a Registry,
    key: Key,
    id: u64,
    notify: Arc<Notify>,
    /// It has waited: the agent's report lists it, until it leaves.
    reported: bool,
}

impl Place<'_> {
    /// The acquire waits for a holder: the agent's report says so.
    fn waits(&mut self) {
        if !self.reported {
            let mut state = self.registry.state();
            state.queues.waits(&self.key, self.id);
            state.report.changed();
            self.reported = true;
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut state = self.registry.state();
        state.queues.leave(&self.key, self.id);
        if self.reported {
            state.report.changed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use crate::backend::{AcquireSpec, Backend, BackendResult, Grant};
    use runlock_protocol::{ErrorCode, LostReason};
    use std::sync::atomic::Ordering;
    use tokio::time::Instant;

    #[tokio::test]
    async fn multi_key_acquire_is_all_or_nothing() {
        let registry = registry();
        let (a, _e1) = connect(&registry, ROOT);
        let (b, _e2) = connect(&registry, ROOT);
        take(&registry, a, &["b"]).await.expect("free");
        let err = take(&registry, b, &["b", "a"])
            .await
            .expect_err("b is held");
        assert_eq!(err.code(), ErrorCode::Held);
        assert_eq!(err.key().as_deref(), Some("b"));
        assert_eq!(err.holder().expect("holder").host, "test-host");
        // "a" was taken first (sorted order) and given back.
        assert!(registry.list().iter().all(|l| l.key != "a"));
        take(&registry, a, &["a"]).await.expect("a was released");
    }

    // Paused: the force waits out the old run's deadline (TTL + grace), which
    // no one ends here; auto-advanced, not 33 s of the suite's time.
    #[tokio::test(start_paused = true)]
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
            Event::Lost {
                lease_id,
                loss,
                holder,
                ..
            } => {
                assert_eq!(lease_id, before[0].lease_id);
                assert_eq!(loss.reason(), LostReason::Forced);
                assert_eq!(holder.expect("new holder").token, after[0].token);
            }
            other => panic!("expected lost, got {other:?}"),
        }
        let err = registry
            .release(old, &[before[0].lease_id.clone()])
            .await
            .expect_err("no longer ours");
        assert_eq!(err.code(), ErrorCode::NotOwner);
    }

    /// A store that stages a race around a force. `answers_first_last`: it
    /// holds back its answer to the first acquire until told, so the first
    /// force lands first and is answered last, as a slow network may answer
    /// two forces through one agent. `slot_joins_force`: right after a
    /// force lands, another agent takes slot 1 of the key with a count of 2.
    #[derive(Default)]
    struct Staged {
        answers_first_last: bool,
        slot_joins_force: bool,
        calls: std::sync::atomic::AtomicUsize,
        let_first_answer: tokio::sync::Notify,
    }

    #[async_trait::async_trait]
    impl Hooks for Staged {
        async fn acquire(&self, store: &dyn Backend, spec: &AcquireSpec) -> BackendResult<Grant> {
            let grant = store.acquire(spec).await;
            if self.slot_joins_force && spec.force {
                let mut other =
                    crate::backend::fixtures::spec("k", "other", false, Duration::from_secs(30));
                other.key = spec.key.slot_record(1);
                (other.holder.slot, other.holder.slots) = (Some(1), Some(2));
                store.acquire(&other).await.expect("slot 1 is free");
            }
            if self.answers_first_last && self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                self.let_first_answer.notified().await;
            }
            grant
        }
    }

    #[tokio::test]
    async fn a_force_answered_after_a_later_one_is_refused_and_frees_nothing() {
        let backend = hooked(Staged {
            answers_first_last: true,
            ..Staged::default()
        });
        let registry = agent(backend.clone(), "agent-1");
        let (first, _first_events) = connect(&registry, ROOT);
        let (second, mut second_events) = connect(&registry, ROOT);
        let first_force = spawn_acquire(&registry, first, request(&["k"], Duration::ZERO, true));
        // The first force has reached the store once its record is there.
        let key = Key::new("k").expect("valid");
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while backend
                .inner
                .backend
                .inspect(&key)
                .await
                .expect("inspect")
                .token
                == 0
            {
                tokio::task::yield_now().await;
            }
        });
        waited.await.expect("the first force reached the store");
        let second_force = spawn_acquire(&registry, second, request(&["k"], Duration::ZERO, true));
        // The second force is registered, and waits for the run it displaced.
        let registered = tokio::time::timeout(Duration::from_secs(10), async {
            while registry.list().is_empty() {
                tokio::task::yield_now().await;
            }
        });
        registered.await.expect("the second force registered");
        backend.hooks.let_first_answer.notify_one();
        let err = first_force
            .await
            .expect("the first force ran")
            .expect_err("superseded before it was answered");
        // Its run never started, so the second force need not wait out a TTL.
        let Granted { leases: later, .. } =
            tokio::time::timeout(Duration::from_secs(5), second_force)
                .await
                .expect("answered once the first was refused")
                .expect("the second force ran")
                .expect("the second force");
        assert_eq!(err.code(), ErrorCode::Held);
        assert_eq!(err.holder().expect("holder").token, later[0].token);
        // The later force still holds the key, here and in the store, untold of any loss.
        while let Ok(event) = second_events.try_recv() {
            assert!(
                matches!(event, Event::Forcing { .. }),
                "the later force was told {event:?}"
            );
        }
        assert_eq!(registry.list().len(), 1);
        let record = backend.inner.backend.inspect(&key).await.expect("inspect");
        assert_eq!(record.holder.expect("held").token, later[0].token);
    }

    #[tokio::test(start_paused = true)]
    async fn a_force_given_back_for_its_slot_count_keeps_the_key_until_the_run_it_displaced_has_stopped(
    ) {
        let backend = hooked(Staged {
            slot_joins_force: true,
            ..Staged::default()
        });
        let registry = agent(backend.clone(), "agent-1");
        let (old, mut old_events) = connect(&registry, ROOT);
        take(&registry, old, &["k"]).await.expect("free");
        let (forcer, _forcer_events) = connect(&registry, ROOT);
        let force = spawn_acquire(&registry, forcer, request(&["k"], Duration::ZERO, true));
        let lost = tokio::time::timeout(Duration::from_secs(1), old_events.recv()).await;
        assert!(matches!(lost, Ok(Some(Event::Lost { .. }))), "{lost:?}");
        // The displaced run takes its time to stop: slot 0 stays the forcer's
        // meanwhile, so no plain run starts beside it.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!force.is_finished(), "given back before the run stopped");
        let key = Key::new("k").expect("valid");
        let record = backend.inner.backend.inspect(&key).await.expect("inspect");
        assert!(
            record.holder.is_some(),
            "slot 0 freed beside the displaced run"
        );
        registry.close_connection(old).await;
        let refused = tokio::time::timeout(Duration::from_secs(1), force)
            .await
            .expect("answered once the run stopped")
            .expect("ran")
            .expect_err("its slot count does not match");
        assert_eq!(refused.code(), ErrorCode::SlotsMismatch);
        let record = backend.inner.backend.inspect(&key).await.expect("inspect");
        assert!(record.holder.is_none(), "{record:?}");
    }

    #[tokio::test]
    async fn bad_requests_get_their_codes() {
        let registry = registry();
        let stranger = USER;
        let (conn, _e) = connect(&registry, stranger);
        let never = CancellationToken::new();
        let mut short = request(&["k"], Duration::ZERO, false);
        short.ttl = Some(Duration::from_millis(10));
        for (req, want) in [
            (request(&[""], Duration::ZERO, false), ErrorCode::InvalidKey),
            (request(&[], Duration::ZERO, false), ErrorCode::BadRequest),
            (short, ErrorCode::BadRequest),
            // A stranger may not force.
            (request(&["k"], Duration::ZERO, true), ErrorCode::Forbidden),
        ] {
            let refused = registry.acquire(conn, req, &never).await;
            assert_eq!(refused.expect_err("refused").code(), want);
        }
        assert_eq!(
            registry
                .break_key(conn, "k", 0)
                .await
                .expect_err("not allowed")
                .code(),
            ErrorCode::Forbidden
        );
        assert_eq!(
            registry
                .release(conn, &["nope".into()])
                .await
                .expect_err("not ours")
                .code(),
            ErrorCode::NotOwner
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_agent_adopts_a_handed_over_lease_with_its_token() {
        use crate::backend::cas::{CasEngine, MemoryCasStore};
        let store = Arc::new(MemoryCasStore::new());
        let agent = |id: &str| agent(Arc::new(CasEngine::new(store.clone())), id);
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
        assert_eq!(err.code(), ErrorCode::NotOwner);
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

    #[tokio::test(start_paused = true)]
    async fn another_users_lease_is_not_adopted_even_by_a_force_user() {
        use crate::backend::cas::{CasEngine, MemoryCasStore};
        let store = Arc::new(MemoryCasStore::new());
        let agent = |id: &str| agent(Arc::new(CasEngine::new(store.clone())), id);
        let old = agent("old");
        let owner = USER;
        let (conn, _events) = connect(&old, owner);
        let lease = take(&old, conn, &["k"]).await.expect("free").remove(0);
        assert!(old.hand_over());
        old.close_connection(conn).await;

        let new = agent("new");
        let member = PeerCred {
            pid: 3,
            uid: 4243,
            gid: 4243,
        };
        for stranger in [member, ROOT] {
            let (conn, _events) = connect(&new, stranger);
            let err = new
                .reattach(conn, vec![lease.clone()], OnLost::Term)
                .await
                .expect_err("not theirs");
            assert_eq!(err.code(), ErrorCode::NotOwner, "uid {}", stranger.uid);
        }
        assert!(new.list().is_empty());
        let record = new.inspect("k").await.expect("record");
        assert_eq!(record.holder.expect("held").agent_id, "old");
        let (conn, _events) = connect(&new, owner);
        new.reattach(conn, vec![lease], OnLost::Term)
            .await
            .expect("the owner's");
    }

    #[tokio::test]
    async fn a_backend_whose_locks_die_with_the_agent_refuses_to_reattach() {
        let registry = registry();
        let (conn, _events) = connect(&registry, ROOT);
        assert!(!registry.hand_over());
        let lease = Lease {
            slot: None,
            key: "k".into(),
            lease_id: "l".into(),
            token: 1,
        };
        let err = registry
            .reattach(conn, vec![lease], OnLost::Term)
            .await
            .expect_err("memory:// cannot");
        assert_eq!(err.code(), ErrorCode::Unsupported);
    }
}
