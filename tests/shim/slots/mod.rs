//! Keys with slots (`runlock run --slots N`: at most N holders at once),
//! through the real shim and agents, on every backend: `file://` and the
//! network stores with two agents sharing them as two hosts would,
//! `memory://` and `memory-cas://` with one agent (their locks live in it).
//! Each case is an `async fn(place)`, named per backend by `on_every_place!`
//! (`shim::slots::CASE::BACKEND`). Holding, racing, forcing and refusing slots are
//! here; history, agents that end, and the random model have files of their own.

use crate::support::hosts::{Hosts, Place};
use crate::support::run::Run;
use crate::support::stores::{Azure, Etcd, Gcs, Ministack, Postgres, S3};
use crate::support::{key, Deadline, TestAgent};
use anyhow::{ensure, Context, Result};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod agent_ends;
mod history;
mod model;

use agent_ends::a_lost_host_s_slots_are_taken_over_after_the_ttl_and_not_before;
use history::history_and_release_name_the_slot;
use model::random_mixes_of_counts_never_let_more_in_than_the_smallest_count;

on_every_place!(
    three_runs_hold_a_3_slot_key_at_once_and_a_fourth_exits_75_naming_each,
    three_runs_started_together_each_take_a_slot,
    each_slot_s_token_grows_and_runlock_slot_reads_as_runlock_token,
    a_killed_slot_holder_frees_its_slot_at_once,
    force_takes_a_free_slot_else_the_earliest_holder_s_and_stops_only_that_one,
    a_run_asking_another_slot_count_exits_64_naming_both_counts,
    a_plain_run_is_refused_beside_slot_holders_once_slot_0_is_free,
    history_and_release_name_the_slot,
    random_mixes_of_counts_never_let_more_in_than_the_smallest_count,
);

// Leases that outlive their agent: a dead host's slots are freed by expiry.
test_matrix!(
    [s3: S3, ministack: Ministack, azure: Azure, gcs: Gcs, postgres: Postgres, etcd: Etcd];
    a_lost_host_s_slots_are_taken_over_after_the_ttl_and_not_before,
);

/// The slots every case's key has.
const SLOTS: u32 = 3;

/// Like `support::run::HOLD`, and says its slot on a second line:
/// `ready PID TOKEN`, `slot N`; holds until its stdin closes.
const HOLD_SLOT: &str =
    "echo ready $$ $RUNLOCK_TOKEN; echo slot $RUNLOCK_SLOT; read _line; echo bye";

/// A run holding one slot of a key (see [`HOLD_SLOT`]).
struct Holding {
    run: Run,
    /// The shim's pid: the holder's, as every host sees it.
    pid: u32,
    /// The command's pid (and process group).
    child: u32,
    token: u64,
    slot: u32,
}

/// Starts a [`HOLD_SLOT`] run of `k` with `--slots 3` and `extra` through
/// `agent`, and waits until it holds.
async fn hold(agent: &TestAgent, k: &str, extra: &[&str]) -> Result<Holding> {
    holding(run_slots(agent, k, SLOTS, extra)?).await
}

/// `runlock run --key K --slots N EXTRA... -- sh -c HOLD_SLOT`, started.
fn run_slots(agent: &TestAgent, k: &str, slots: u32, extra: &[&str]) -> Result<Run> {
    let slots = slots.to_string();
    let mut args = vec!["--slots", &slots];
    args.extend_from_slice(extra);
    agent.run(&[k], &args, HOLD_SLOT)
}

/// Waits until a [`HOLD_SLOT`] run holds, and reads what it printed.
async fn holding(mut run: Run) -> Result<Holding> {
    let ready = run.ready().await?;
    let line = run.line().await?;
    let slot = line
        .strip_prefix("slot ")
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no RUNLOCK_SLOT in {line:?}"))?;
    Ok(Holding {
        pid: run.pid()?,
        child: ready.pid,
        token: ready.token(),
        slot,
        run,
    })
}

impl Holding {
    /// Ends the command and expects it to exit `code`.
    async fn end(mut self, code: i32) -> Result<()> {
        self.run.end();
        self.run.finish().await?.expect_code(code)
    }
}

/// Two hosts at `place` and a key, both after `name`, whose every slot is
/// held: through A, then B, then A again (in the order granted).
async fn every_slot_held(place: impl Place, name: &str) -> Result<(Hosts, String, [Holding; 3])> {
    let hosts = place.hosts(name, &[]).await?;
    let k = key(name);
    let first = hold(&hosts.a, &k, &[]).await?;
    let second = hold(hosts.b(), &k, &[]).await?;
    let third = hold(&hosts.a, &k, &[]).await?;
    Ok((hosts, k, [first, second, third]))
}

/// Ends each holder's run in turn; each must exit 0 (it held to the end).
async fn end_all(holders: impl IntoIterator<Item = Holding>) -> Result<()> {
    for h in holders {
        h.end(0).await?;
    }
    Ok(())
}

/// The slots of `k` held now, by slot: (holder pid, token), through `agent`.
async fn held_slots(agent: &TestAgent, k: &str) -> Result<BTreeMap<u64, (u64, u64)>> {
    let record = agent.inspect_json(k).await?;
    let holders = match record["holders"].as_array() {
        Some(holders) => holders.clone(),
        None => Vec::new(),
    };
    holders
        .iter()
        .map(|h| {
            let field = |name: &str| h[name].as_u64().with_context(|| format!("{name}: {h}"));
            Ok((field("slot")?, (field("pid")?, field("token")?)))
        })
        .collect()
}

async fn three_runs_hold_a_3_slot_key_at_once_and_a_fourth_exits_75_naming_each(
    place: impl Place,
) -> Result<()> {
    let (hosts, k, [first, second, third]) = every_slot_held(place, "three-at-once").await?;
    let held = [&first, &second, &third];
    let mut slots: Vec<u32> = held.iter().map(|h| h.slot).collect();
    slots.sort();
    ensure!(slots == [0, 1, 2], "three holders, three slots: {slots:?}");

    let refused = hosts
        .b()
        .run(&[&k], &["--slots", "3"], "echo must-not-run")?
        .finish()
        .await?;
    refused.expect_code(75)?;
    ensure!(!refused.stdout.contains("must-not-run"), "{refused:?}");
    for h in held {
        for want in [
            format!("slot {} (of 3):", h.slot),
            format!("pid:     {}\n", h.pid),
            format!("token:   {}\n", h.token),
        ] {
            ensure!(
                refused.stderr.contains(&want),
                "{want:?} not named: {refused:?}"
            );
        }
    }

    // Every slot, from either host.
    let want: BTreeMap<u64, (u64, u64)> = held
        .iter()
        .map(|h| (h.slot.into(), (h.pid.into(), h.token)))
        .collect();
    for agent in [&hosts.a, hosts.b()] {
        ensure!(held_slots(agent, &k).await? == want, "inspect: {want:?}");
    }
    let record = hosts.b().inspect_json(&k).await?;
    let lowest = &want[&0];
    ensure!(
        record["state"] == "held"
            && record["slots"] == SLOTS
            && record["holder"]["slot"] == 0
            && record["holder"]["pid"] == lowest.0
            && record["token"] == lowest.1,
        "the record's own fields are the lowest held slot's: {record}"
    );
    let text = hosts.a.runlock_output(&["inspect", &k]).await?;
    text.expect_code(0)?;
    ensure!(text.stdout.contains("slots:   3 (3 held)"), "{text:?}");
    for h in held {
        let line = format!("slot {}:  held, token {}\n", h.slot, h.token);
        ensure!(text.stdout.contains(&line), "{line:?} not shown: {text:?}");
    }

    // `status` lists the leases held through its agent, each with its slot.
    let status = hosts.a.runlock_output(&["status", "--json"]).await?;
    status.expect_code(0)?;
    let listed: serde_json::Value = serde_json::from_str(status.stdout.trim())?;
    let mut listed: Vec<(u64, u64)> = listed
        .as_array()
        .context("status --json is not an array")?
        .iter()
        .filter(|l| l["key"] == k.as_str())
        .map(|l| {
            (
                l["slot"].as_u64().unwrap_or(99),
                l["token"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    listed.sort();
    let mut want: Vec<(u64, u64)> = held
        .iter()
        .filter(|h| hosts.one_agent() || h.pid != second.pid)
        .map(|h| (h.slot.into(), h.token))
        .collect();
    want.sort();
    ensure!(listed == want, "status --json: {listed:?}, not {want:?}");
    let text = hosts.a.runlock_output(&["status"]).await?;
    text.expect_code(0)?;
    let mut shown: Vec<(u64, u64)> = text
        .stdout
        .lines()
        .filter(|row| row.split_whitespace().next() == Some(k.as_str()))
        .filter_map(|row| {
            // KEY TOKEN PID CHILD SLOT ...
            let fields: Vec<&str> = row.split_whitespace().collect();
            Some((fields.get(4)?.parse().ok()?, fields.get(1)?.parse().ok()?))
        })
        .collect();
    shown.sort();
    ensure!(shown == want, "status: {shown:?}, not {want:?}: {text:?}");

    end_all([first, second, third]).await
}

/// Runs started by one cron tick ask at once: none of them may take
/// another's contention for a slot for the key being full.
async fn three_runs_started_together_each_take_a_slot(place: impl Place) -> Result<()> {
    let hosts = place.hosts("started-together", &[]).await?;
    let k = key("started-together");
    let runs = [
        run_slots(&hosts.a, &k, SLOTS, &[])?,
        run_slots(&hosts.a, &k, SLOTS, &[])?,
        run_slots(hosts.b(), &k, SLOTS, &[])?,
    ];
    let mut held = Vec::new();
    for run in runs {
        held.push(holding(run).await?);
    }
    let mut slots: Vec<u32> = held.iter().map(|h| h.slot).collect();
    slots.sort();
    ensure!(slots == [0, 1, 2], "three holders, three slots: {slots:?}");
    end_all(held).await
}

async fn each_slot_s_token_grows_and_runlock_slot_reads_as_runlock_token(
    place: impl Place,
) -> Result<()> {
    let hosts = place.hosts("per-slot-tokens", &[]).await?;
    let k = key("per-slot-tokens");
    // Rounds of holders from both hosts; whichever slot each gets, its token
    // is larger than every earlier token of that slot.
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for _round in 0..3 {
        let holders = [
            hold(&hosts.a, &k, &[]).await?,
            hold(hosts.b(), &k, &[]).await?,
        ];
        ensure!(holders[0].slot != holders[1].slot, "two holders, one slot");
        for h in holders {
            if let Some(&before) = last.get(&h.slot) {
                ensure!(
                    h.token > before,
                    "slot {}: token {} after {before}",
                    h.slot,
                    h.token
                );
            }
            last.insert(h.slot, h.token);
            h.end(0).await?;
        }
    }

    // Several keys: one slot and one token per key, on lines in the same order.
    let other = key("per-slot-tokens-2");
    let out = hosts
        .a
        .run(
            &[&other, &k],
            &["--slots", "3"],
            "echo tokens $RUNLOCK_TOKEN; echo slots $RUNLOCK_SLOT",
        )?
        .finish()
        .await?;
    out.expect_code(0)?;
    let words = |prefix: &str| -> Vec<u64> {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let (tokens, slots) = (words("tokens "), words("slots "));
    ensure!(tokens.len() == 2 && slots.len() == 2, "{out:?}");
    ensure!(slots.iter().all(|&s| s < 3), "{out:?}");

    // A plain key has no slot, whatever the caller's environment says.
    let script = "echo slot=${RUNLOCK_SLOT-none}";
    let env = [("RUNLOCK_SLOT", "9")];
    let plain = hosts.a.run_with_env(&[&k], &[], script, &env)?;
    let plain = plain.finish().await?;
    plain.expect_output("slot=none\n")?;
    Ok(())
}

async fn a_killed_slot_holder_frees_its_slot_at_once(place: impl Place) -> Result<()> {
    let hosts = place.hosts("killed-slot", &[]).await?;
    let k = key("killed-slot");
    let first = hold(&hosts.a, &k, &[]).await?;
    let victim = hold(&hosts.a, &k, &[]).await?;
    let third = hold(hosts.b(), &k, &[]).await?;
    hosts.a.wait_attached(victim.child).await?;

    // SIGKILL the shim and the command's group: the agent sees end of file.
    let killed = Instant::now();
    victim.run.signal(Signal::SIGKILL)?;
    victim.run.kill_group()?;
    let deadline = Deadline::new(Duration::from_secs(5), "the slot to be free through B");
    while held_slots(hosts.b(), &k)
        .await?
        .contains_key(&victim.slot.into())
    {
        deadline.tick().await?;
    }
    eprintln!("slot freed {:?} after the kill", killed.elapsed());
    let others: Vec<u64> = held_slots(hosts.b(), &k).await?.into_keys().collect();
    let mut want = vec![u64::from(first.slot), third.slot.into()];
    want.sort();
    ensure!(others == want, "the other holders: {others:?}");

    // The slot is taken again at once, with a larger token.
    let next = hold(hosts.b(), &k, &[]).await?;
    ensure!(
        next.slot == victim.slot && next.token > victim.token,
        "slot {} token {} after slot {} token {}",
        next.slot,
        next.token,
        victim.slot,
        victim.token
    );
    end_all([first, third, next]).await
}

async fn force_takes_a_free_slot_else_the_earliest_holder_s_and_stops_only_that_one(
    place: impl Place,
) -> Result<()> {
    // TTL 6 s: a forced holder notices at its next renewal, about 2 s on.
    let hosts = place.hosts("force-slot", &["--ttl", "6s"]).await?;
    let k = key("force-slot");
    let first = hold(&hosts.a, &k, &[]).await?;
    let second = hold(hosts.b(), &k, &[]).await?;

    // A slot is free: --force takes it and stops nobody.
    let third = hold(hosts.b(), &k, &["--force"]).await?;
    ensure!(
        ![first.slot, second.slot].contains(&third.slot),
        "force took slot {} though one was free",
        third.slot
    );

    // None is free: --force takes the slot of the holder granted earliest.
    let fourth = hold(hosts.b(), &k, &["--force"]).await?;
    ensure!(
        fourth.slot == first.slot && fourth.token > first.token,
        "force took slot {} (token {}); the earliest holder had slot {} (token {})",
        fourth.slot,
        fourth.token,
        first.slot,
        first.token
    );
    let stopped = first.run.finish().await?;
    stopped.expect_stopped()?;

    // The others hold on, as the store says, and end as they end.
    let want: BTreeMap<u64, (u64, u64)> = [&second, &third, &fourth]
        .iter()
        .map(|h| (h.slot.into(), (h.pid.into(), h.token)))
        .collect();
    ensure!(held_slots(&hosts.a, &k).await? == want, "after the forces");
    end_all([second, third, fourth]).await
}

async fn a_run_asking_another_slot_count_exits_64_naming_both_counts(
    place: impl Place,
) -> Result<()> {
    let hosts = place.hosts("slots-mismatch", &[]).await?;
    let k = key("slots-mismatch");
    let first = hold(&hosts.a, &k, &[]).await?;
    let second = hold(hosts.b(), &k, &[]).await?;

    // Another count is an error, not a wait: it exits at once, --wait or not.
    for (asked, extra) in [
        ("5", &["--slots", "5", "--wait", "30s"][..]),
        ("1", &[][..]),
    ] {
        let out = hosts
            .b()
            .run(&[&k], extra, "echo must-not-run")?
            .finish()
            .await?;
        out.expect_code(64)?;
        ensure!(!out.stdout.contains("must-not-run"), "{out:?}");
        ensure!(out.elapsed < Duration::from_secs(10), "it waited: {out:?}");
        ensure!(
            out.stderr.contains(&format!("{asked} slot")) && out.stderr.contains("3 slots"),
            "both counts ({asked} and 3) are not named: {out:?}"
        );
        // A plain acquire is refused on slot 0's holder (which it meets
        // first); another count on every holder it read.
        for h in [&first, &second] {
            let pid = format!("pid:     {}\n", h.pid);
            if asked != "1" || h.slot == 0 {
                ensure!(out.stderr.contains(&pid), "holder {pid:?}: {out:?}");
            }
        }
    }
    // Counts the protocol does not allow never reach the agent.
    for bad in ["0", "65"] {
        let out = hosts
            .a
            .run(&[&k], &["--slots", bad], "true")?
            .finish()
            .await?;
        out.expect_code(64)?;
        ensure!(out.stderr.contains("--slots"), "{out:?}");
    }
    // The holders were not disturbed.
    ensure!(held_slots(&hosts.a, &k).await?.len() == 2, "holders lost");
    first.end(0).await?;
    second.end(0).await
}

/// Issue 27, item 1: the slot-0 holder of a 3-slot key ends; a plain run
/// and a `--slots 2` run, through either agent, take the free record and are
/// then refused (64), never run beside slots 1 and 2 (invariant 10).
async fn a_plain_run_is_refused_beside_slot_holders_once_slot_0_is_free(
    place: impl Place,
) -> Result<()> {
    let (hosts, k, [zero, one, two]) = every_slot_held(place, "slots-plain").await?;
    ensure!(zero.slot == 0, "slot {}", zero.slot);
    zero.end(0).await?;
    for agent in [&hosts.a, hosts.b()] {
        for extra in [&[][..], &["--slots", "2"][..]] {
            let out = agent.run_refused(&[&k], extra, 64).await?;
            ensure!(
                out.stderr.contains("3 slots"),
                "the holders' count: {out:?}"
            );
        }
    }
    // The refused runs gave back what they took: two holders, and slot 0
    // free for a run of their count.
    ensure!(
        held_slots(&hosts.a, &k).await?.len() == 2,
        "holders changed"
    );
    let again = hold(hosts.b(), &k, &[]).await?;
    ensure!(again.slot == 0, "slot {}", again.slot);
    end_all([one, two, again]).await
}
