//! Slot holders whose agent ends: a lost host's slots are taken over once
//! its leases expire, a restarted agent hands each slot on with its token.

use super::{end_all, held_slots, hold, holding, run_slots, SLOTS};
use crate::support::stores::{Space, Store, S3};
use crate::support::{key, Deadline};
use anyhow::{ensure, Context, Result};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub(super) async fn a_lost_host_s_slots_are_taken_over_after_the_ttl_and_not_before(
    store: impl Store,
) -> Result<()> {
    const TTL: Duration = Duration::from_secs(5);
    let space = Space::create(store, "slot-host-loss").await?;
    let mut a = space.agent("p", &["--ttl", "5s"]).await?;
    let b = space.agent("p", &["--ttl", "30s"]).await?;
    let k = key("slot-host-loss");
    let lost = [hold(&a, &k, &[]).await?, hold(&a, &k, &[]).await?];
    let kept = hold(&b, &k, &[]).await?;
    for h in &lost {
        a.wait_attached(h.child).await?;
    }

    // The host dies: the agent is SIGKILLed and releases nothing.
    a.kill().await?;
    let killed = Instant::now();
    let waiters = [
        run_slots(&b, &k, SLOTS, &["--wait", "30s"])?,
        run_slots(&b, &k, SLOTS, &["--wait", "30s"])?,
    ];
    // A's runs outlive their agent only until their leases' deadline, and
    // must be gone before anyone takes their slots (invariant 4).
    let gone = lost.map(|mut h| {
        tokio::spawn(async move {
            let status = h.run.wait().await;
            (Instant::now(), status, h)
        })
    });
    let mut took = Vec::new();
    for waiter in waiters {
        let h = holding(waiter).await?;
        took.push((killed.elapsed(), h));
    }
    let mut before = BTreeMap::new();
    for run in gone {
        let (at, status, h) = run.await?;
        ensure!(status?.code() == Some(76), "A's run did not exit 76");
        ensure!(
            at.duration_since(killed) < took[0].0,
            "A's run ended {:?} after the kill, B took a slot {:?} after it",
            at.duration_since(killed),
            took[0].0
        );
        before.insert(h.slot, h.token);
    }
    for (after, h) in &took {
        eprintln!("slot {} taken over {after:?} after the kill", h.slot);
        // A renewed at most TTL/3 before it died; the slot lapses TTL after that.
        ensure!(
            *after >= TTL - TTL / 3,
            "slot {} taken over {after:?} after the kill: before the TTL",
            h.slot
        );
        // Late by at most the grace, the store clock's second, the waiters'
        // polls, GCS's one write per object per second (two waiters, one
        // after the other) and a loaded CI machine: bounded, not tight.
        ensure!(
            *after <= TTL * 2 + Duration::from_secs(2),
            "slot {} taken over only {after:?} after the kill",
            h.slot
        );
        let token = before
            .get(&h.slot)
            .with_context(|| format!("B took slot {}, which was not A's: {before:?}", h.slot))?;
        ensure!(
            h.token > *token,
            "slot {}: {} after {token}",
            h.slot,
            h.token
        );
    }
    // B's own holder was never touched.
    let held = held_slots(&b, &k).await?;
    ensure!(
        held.get(&kept.slot.into()) == Some(&(kept.pid.into(), kept.token)),
        "{held:?}"
    );
    kept.end(0).await?;
    end_all(took.into_iter().map(|(_, h)| h)).await
}

/// An agent restarted under its slot runs (SIGTERM hands the leases over):
/// each shim reattaches its slot, with the same slot and token, and the key
/// still admits no more than its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_every_slot_with_its_token() -> Result<()> {
    let space = Space::create(S3, "slots-restart").await?;
    let mut old = space.agent("slots", &[]).await?;
    let k = key("slots-restart");
    let mut held = Vec::new();
    for _ in 0..SLOTS {
        held.push(hold(&old, &k, &[]).await?);
    }
    let before = held_slots(&old, &k).await?;
    old.stop().await?;
    let new = space.agent_on_socket("slots", &[], old.socket()).await?;
    let deadline = Deadline::new(crate::support::WAIT, "every slot run to reattach");
    loop {
        let leases = crate::agent::restart::leases_of(&new).await?;
        if leases.len() == SLOTS as usize && leases.iter().all(|l| l.child_pid.is_some()) {
            break;
        }
        deadline.tick().await?;
    }
    ensure!(
        held_slots(&new, &k).await? == before,
        "slots or tokens changed"
    );
    let refused = run_slots(&new, &k, SLOTS, &[])?.finish().await?;
    refused.expect_code(75)?;
    for h in held {
        let token = h.token;
        let mut run = h.run;
        run.end();
        let out = run.finish().await?;
        out.expect_code(0)?;
        ensure!(out.stderr.contains("reattached"), "token {token}: {out:?}");
    }
    Ok(())
}
