//! A deterministic simulation of several agents sharing one object store, in
//! paused time: requests are delayed, fail, or lose their answers; agents
//! freeze (a GC pause, a SIGSTOP) for up to 1.5 TTL. Over thousands of seeded
//! schedules it checks invariants 1 and 5: no two leases on one key are
//! believed valid at once, and tokens only grow.
//!
//! A holder believes in its lease from the moment it is granted until it lets
//! go, learns otherwise, or reaches the send time of its last successful
//! write + `timing::trusted_for(TTL)`, exactly as the agent's scheduler does.
//! `RUNLOCK_SIM_SCHEDULES` sets how many schedules run (default 2000).

use super::testing::FaultyStore;
use super::{CasEngine, MemoryCasStore};
use crate::backend::{AcquireSpec, Backend, BackendError, LeaseRef};
use crate::unpoisoned::Unpoisoned;
use runlock_protocol::{timing, Holder, Key};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Clone)]
struct Belief {
    key: Key,
    token: u64,
    agent: usize,
    from: Instant,
    to: Instant,
}

fn holder(agent: usize) -> Holder {
    Holder {
        slot: None,
        slots: None,
        host: format!("host-{agent}"),
        agent_id: format!("agent-{agent}"),
        pid: 1,
        uid: 0,
        gid: 0,
        user: "sim".into(),
        command: "sim".into(),
        acquired_at_ms: 0,
        token: 0,
    }
}

struct Agent {
    id: usize,
    engine: CasEngine,
    rng: fastrand::Rng,
    keys: Vec<Key>,
    ttl: Duration,
    end: Instant,
    beliefs: Arc<Mutex<Vec<Belief>>>,
}

impl Agent {
    fn jitter(&mut self, max: Duration) -> Duration {
        max.mul_f64(self.rng.f64())
    }

    async fn run(mut self) {
        let mut leases = 0;
        while Instant::now() < self.end {
            let pause = self.jitter(self.ttl / 2);
            tokio::time::sleep(pause).await;
            let key = self.keys[self.rng.usize(..self.keys.len())].clone();
            leases += 1;
            let spec = AcquireSpec {
                key: key.clone(),
                lease_id: format!("{}-{leases}", self.id),
                holder: holder(self.id),
                ttl: self.ttl,
                force: false,
                breaking: false,
            };
            let Ok(grant) = self.engine.acquire(&spec).await else {
                continue;
            };
            let lease = LeaseRef {
                key: key.clone(),
                lease_id: spec.lease_id,
                token: grant.holder.token,
            };
            let from = Instant::now();
            let to = self.hold(&lease, grant.sent, from).await;
            if to > from {
                let belief = Belief {
                    key,
                    token: lease.token,
                    agent: self.id,
                    from,
                    to,
                };
                self.beliefs.locked().push(belief);
            }
        }
    }

    /// Holds the lease as the agent's scheduler would; returns when belief ended.
    async fn hold(&mut self, lease: &LeaseRef, granted: Instant, from: Instant) -> Instant {
        let ttl = self.ttl;
        let hold_until = from + self.jitter(ttl * 3);
        let mut last_ok = granted;
        loop {
            let until = last_ok + timing::trusted_for(ttl);
            if self.rng.f64() < 0.1 {
                let freeze = self.jitter(ttl * 3 / 2);
                tokio::time::sleep(freeze).await; // the whole agent stops: no renewals
            }
            let period =
                runlock_protocol::timing::renewal_period(ttl).mul_f64(0.9 + 0.2 * self.rng.f64());
            tokio::time::sleep_until((Instant::now() + period).min(hold_until)).await;
            let now = Instant::now();
            if now >= until {
                return until;
            }
            if now >= hold_until {
                let _ = self.engine.release(lease).await;
                return now;
            }
            match tokio::time::timeout_at(until, self.engine.renew(lease, ttl)).await {
                Ok(Ok(renewed)) => last_ok = renewed.since(now),
                Ok(Err(BackendError::LeaseMismatch)) => return Instant::now().min(until),
                Ok(Err(_)) => {}
                Err(_) => return until,
            }
        }
    }
}

/// Runs one schedule; returns every belief, in no particular order.
async fn schedule(seed: u64) -> Vec<Belief> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let clock = rng.f64() < 0.75;
    let max_delay = Duration::from_millis(rng.u64(0..400));
    let store = Arc::new(FaultyStore::random(
        MemoryCasStore::with_clock(clock),
        seed,
        max_delay,
        0.05,
        0.05,
    ));
    let ttl = Duration::from_millis(rng.u64(2_000..6_000));
    let keys: Vec<Key> = ["a", "b"][..rng.usize(1..=2)]
        .iter()
        .map(|k| Key::new(*k).expect("valid"))
        .collect();
    let beliefs = Arc::new(Mutex::new(Vec::new()));
    let end = Instant::now() + Duration::from_secs(40);
    let agents: Vec<_> = (0..rng.usize(2..=4))
        .map(|id| Agent {
            id,
            engine: CasEngine::new(store.clone()),
            rng: fastrand::Rng::with_seed(seed.wrapping_mul(31).wrapping_add(id as u64)),
            keys: keys.clone(),
            ttl,
            end,
            beliefs: beliefs.clone(),
        })
        .collect();
    let tasks: Vec<_> = agents.into_iter().map(|a| tokio::spawn(a.run())).collect();
    for task in tasks {
        task.await.expect("agent task");
    }
    let beliefs = beliefs.locked().clone();
    beliefs
}

/// Invariants 1 and 5 over one schedule's beliefs.
fn check(seed: u64, mut beliefs: Vec<Belief>) -> usize {
    beliefs.sort_by_key(|b| (b.key.clone(), b.from));
    for pair in beliefs.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.key != b.key {
            continue;
        }
        assert!(
            a.to <= b.from,
            "seed {seed}: agents {} and {} both held {:?}: {a:?} and {b:?}",
            a.agent,
            b.agent,
            a.key
        );
        assert!(
            a.token < b.token,
            "seed {seed}: tokens went backwards: {a:?} then {b:?}"
        );
    }
    beliefs.len()
}

/// The schedules, `RUNLOCK_SIM_SCHEDULES` of them (2,000 unless set), in two
/// halves, each a test of its own, so that they run on two threads at once.
async fn no_two_leases_on_a_key_are_valid_at_once_and_tokens_only_grow(half: u64) {
    let schedules: u64 = std::env::var("RUNLOCK_SIM_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let seeds = if half == 0 {
        0..schedules / 2
    } else {
        schedules / 2..schedules
    };
    let count = seeds.end - seeds.start;
    let mut leases = 0;
    for seed in seeds {
        leases += check(seed, schedule(seed).await);
    }
    // The simulation must actually grant and hand over leases to prove anything.
    assert!(
        leases as u64 > count * 5,
        "only {leases} leases in {count} schedules"
    );
}

#[tokio::test(start_paused = true)]
async fn no_two_leases_on_a_key_are_valid_at_once_and_tokens_only_grow_first_half() {
    no_two_leases_on_a_key_are_valid_at_once_and_tokens_only_grow(0).await
}

#[tokio::test(start_paused = true)]
async fn no_two_leases_on_a_key_are_valid_at_once_and_tokens_only_grow_second_half() {
    no_two_leases_on_a_key_are_valid_at_once_and_tokens_only_grow(1).await
}
