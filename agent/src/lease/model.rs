//! A seeded model test of invariant 10 (at most N): several agents on one
//! store take one key with random counts (plain = 1), alone and in racing
//! bursts, and let go of it by release or by their run ending; after every
//! step the runs holding the key are never more than the smallest count any
//! of them asked for. `RUNLOCK_MODEL_SEED=N` replays one seed.

use super::testing::*;
use crate::backend::cas::{testing::FaultyStore, CasEngine, MemoryCasStore};
use runlock_protocol::ErrorCode;

/// A run that holds the key, as the model knows it.
struct Holding {
    agent: usize,
    conn: ConnId,
    lease_id: String,
    count: u32,
    _events: Events,
}

const AGENTS: usize = 3;
const STEPS: usize = 120;
const COUNTS: [u32; 6] = [1, 1, 2, 3, 3, 5];

async fn try_take(registry: &Registry, agent: usize, count: u32) -> Option<Holding> {
    let (conn, events) = connect(registry, ROOT);
    let asked = AcquireRequest {
        slots: count,
        ..request(&["w"], Duration::ZERO, false)
    };
    match registry
        .acquire(conn, asked, &CancellationToken::new())
        .await
    {
        Ok(granted) => Some(Holding {
            agent,
            conn,
            lease_id: granted.leases[0].lease_id.clone(),
            count,
            _events: events,
        }),
        Err(err) => {
            assert!(
                matches!(err.code(), ErrorCode::Held | ErrorCode::SlotsMismatch),
                "count {count}: {err}"
            );
            registry.close_connection(conn).await;
            None
        }
    }
}

async fn run_model(seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let store = Arc::new(FaultyStore::random(
        MemoryCasStore::new(),
        seed,
        Duration::from_millis(2),
        0.0,
        0.0,
    ));
    let agents: Vec<Arc<Registry>> = (0..AGENTS)
        .map(|i| {
            agent(
                Arc::new(CasEngine::new(store.clone())),
                &format!("agent-{i}"),
            )
        })
        .collect();
    let mut holding: Vec<Holding> = Vec::new();
    for step in 0..STEPS {
        match rng.u8(0..10) {
            // A burst: runs of different counts through different agents at once.
            0..=3 => {
                let burst: Vec<(usize, u32)> = (0..rng.usize(2..=4))
                    .map(|_| (rng.usize(0..AGENTS), COUNTS[rng.usize(0..COUNTS.len())]))
                    .collect();
                let tries = burst
                    .iter()
                    .map(|&(a, count)| try_take(&agents[a], a, count));
                holding.extend(futures::future::join_all(tries).await.into_iter().flatten());
            }
            4..=6 if !holding.is_empty() => {
                let gone = holding.swap_remove(rng.usize(0..holding.len()));
                agents[gone.agent]
                    .release(gone.conn, &[gone.lease_id])
                    .await
                    .expect("its own lease");
            }
            7..=8 if !holding.is_empty() => {
                // The run ends however it ends: its connection closes.
                let gone = holding.swap_remove(rng.usize(0..holding.len()));
                agents[gone.agent].close_connection(gone.conn).await;
            }
            _ => {
                let a = rng.usize(0..AGENTS);
                let count = COUNTS[rng.usize(0..COUNTS.len())];
                holding.extend(try_take(&agents[a], a, count).await);
            }
        }
        let smallest = holding.iter().map(|h| h.count).min().unwrap_or(u32::MAX);
        let counts: Vec<u32> = holding.iter().map(|h| h.count).collect();
        assert!(
            holding.len() as u64 <= u64::from(smallest),
            "seed {seed}, step {step}: {} holders with counts {counts:?}",
            holding.len()
        );
    }
}

/// Seeds 1 to 12 (or `RUNLOCK_MODEL_SEED` alone, in the first half), in two
/// halves, each a test of its own, so that they run on two threads at once.
async fn no_mix_of_counts_releases_and_ended_runs_ever_holds_a_key_past_its_smallest_count(
    half: u64,
) {
    let seeds: Vec<u64> = match std::env::var("RUNLOCK_MODEL_SEED") {
        Ok(seed) if half == 0 => vec![seed.parse().expect("RUNLOCK_MODEL_SEED: a number")],
        Ok(_) => Vec::new(),
        Err(_) => (1 + 6 * half..=6 + 6 * half).collect(),
    };
    for seed in seeds {
        run_model(seed).await;
    }
}

#[tokio::test]
async fn no_mix_of_counts_releases_and_ended_runs_ever_holds_a_key_past_its_smallest_count_first_half(
) {
    no_mix_of_counts_releases_and_ended_runs_ever_holds_a_key_past_its_smallest_count(0).await
}

#[tokio::test]
async fn no_mix_of_counts_releases_and_ended_runs_ever_holds_a_key_past_its_smallest_count_second_half(
) {
    no_mix_of_counts_releases_and_ended_runs_ever_holds_a_key_past_its_smallest_count(1).await
}
