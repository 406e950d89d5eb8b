//! Invariant 10 as a seeded random model: runs of mixed slot counts through
//! either agent, never more inside than the smallest count any of them asked.

use super::{run_slots, HOLD_SLOT};
use crate::support::hosts::{Hosts, Place};
use crate::support::run::Run;
use crate::support::{key, TestAgent};
use anyhow::{ensure, Context, Result};

/// How many steps the model below takes, and the counts it draws (1: plain).
const MODEL_STEPS: usize = 24;
/// Seeds per backend: a random one (or `RUNLOCK_MODEL_SEED`) and the next ones.
const MODEL_SEEDS: u64 = 3;
const MODEL_COUNTS: [u32; 6] = [1, 1, 2, 3, 3, 5];

/// Starts a run of `k` taking it with `count` slots (1: a plain run), `--wait 0`.
fn start_counted(agent: &TestAgent, k: &str, count: u32) -> Result<Run> {
    match count {
        1 => agent.run(&[k], &[], HOLD_SLOT),
        n => run_slots(agent, k, n, &[]),
    }
}

/// The run, if it was granted (its command is inside); else checks it was
/// refused as held (75) or for its count (64).
async fn granted_or_refused(mut run: Run) -> Result<Option<Run>> {
    if run.ready().await.is_ok() {
        return Ok(Some(run));
    }
    let out = run.finish().await?;
    ensure!(
        matches!(out.code(), Some(75 | 64)),
        "neither granted nor refused: {out:?}"
    );
    Ok(None)
}

/// Invariant 10 as a seeded model over real agents and shims: runs with
/// random counts (plain = 1), alone and in racing bursts through either
/// agent, ended by their command or by a crash of the whole run (shim and
/// command SIGKILLed); after every step the runs inside are never more than
/// the smallest count any of them asked. `RUNLOCK_MODEL_SEED=N` replays one.
pub(super) async fn random_mixes_of_counts_never_let_more_in_than_the_smallest_count(
    place: impl Place,
) -> Result<()> {
    let hosts = place.hosts("slots-model", &[]).await?;
    let first = std::env::var("RUNLOCK_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..1 << 32));
    for seed in first..first + MODEL_SEEDS {
        model_round(&hosts, seed).await?;
    }
    Ok(())
}

/// One seed's steps of the model, on a key of its own.
async fn model_round(hosts: &Hosts, seed: u64) -> Result<()> {
    let k = key(&format!("slots-model-{seed}"));
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut inside: Vec<(u32, Run)> = Vec::new();
    for step in 0..MODEL_STEPS {
        let at = || format!("seed {seed}, step {step}");
        match rng.u8(0..10) {
            0..=5 => {
                let mut burst = Vec::new();
                for _ in 0..rng.usize(1..=3) {
                    let count = MODEL_COUNTS[rng.usize(..MODEL_COUNTS.len())];
                    let agent = if rng.bool() { &hosts.a } else { hosts.b() };
                    burst.push((count, start_counted(agent, &k, count)?));
                }
                for (count, run) in burst {
                    if let Some(run) = granted_or_refused(run).await.with_context(at)? {
                        inside.push((count, run));
                    }
                }
                let counts: Vec<u32> = inside.iter().map(|(count, _)| *count).collect();
                let smallest = counts.iter().copied().min().unwrap_or(u32::MAX);
                ensure!(
                    counts.len() as u32 <= smallest,
                    "{}: {} runs inside, asking {counts:?}: more than {smallest}",
                    at(),
                    counts.len()
                );
            }
            6..=8 if !inside.is_empty() => {
                let (_, mut run) = inside.swap_remove(rng.usize(..inside.len()));
                run.end();
                run.finish().await.with_context(at)?.expect_code(0)?;
            }
            _ if !inside.is_empty() => {
                let (_, mut run) = inside.swap_remove(rng.usize(..inside.len()));
                run.signal(nix::sys::signal::Signal::SIGKILL)?;
                run.kill_group()?;
                run.wait().await.with_context(at)?;
            }
            _ => {}
        }
    }
    for (_, run) in inside {
        run.end_and_expect_success().await?;
    }
    Ok(())
}
