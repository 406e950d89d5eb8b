//! What `runlock history` and `runlock release` say of a slotted key: each
//! event and each release names its slot.

use super::hold;
use crate::support::hosts::Place;
use crate::support::{key, TestAgent};
use anyhow::{ensure, Context, Result};

/// `runlock history --json KEY` through `agent`: (kind, slot, token,
/// from_token, agent id) of each event, oldest first.
type Event = (String, Option<u64>, u64, Option<u64>, String);

async fn history_of(agent: &TestAgent, k: &str) -> Result<Vec<Event>> {
    let events = agent.history_json(k).await?;
    events
        .iter()
        .map(|e| {
            Ok((
                e["kind"].as_str().context("kind")?.to_string(),
                e["slot"].as_u64(),
                e["token"].as_u64().context("token")?,
                e["from_token"].as_u64(),
                e["agent_id"].as_str().context("agent_id")?.to_string(),
            ))
        })
        .collect()
}

/// Whether `e` is the break of token `token` by agent `by`. Through another
/// agent than the holder's, a break takes the next token and names the one it
/// ended (`from_token`); through the holder's own (one agent for `memory://`)
/// it ends the lease as a release does, under its own token.
/// The event `kind` of the holder of `slot` with `token`, through agent `by`
/// (not a force or break: no token it ended).
fn slot_event(kind: &str, slot: u32, token: u64, by: &str) -> Event {
    (kind.into(), Some(u64::from(slot)), token, None, by.into())
}

fn is_break_of(e: &Event, token: u64, by: &str) -> bool {
    let ended = match e.3 {
        Some(from) => from == token && e.2 > token,
        None => e.2 == token,
    };
    e.0 == "broken" && ended && e.4 == by
}

pub(super) async fn history_and_release_name_the_slot(place: impl Place) -> Result<()> {
    let hosts = place.hosts("slot-history", &[]).await?;
    let (a_id, b_id) = (hosts.a.agent_id().await?, hosts.b().agent_id().await?);
    let k = key("slot-history");
    let first = hold(&hosts.a, &k, &[]).await?;
    let second = hold(hosts.b(), &k, &[]).await?;
    let (first_slot, first_token) = (first.slot, first.token);
    first.end(0).await?;

    // Break the second's slot from A's host; the first's is free already.
    let slot = second.slot.to_string();
    let free = first_slot.to_string();
    let nothing = hosts
        .a
        .runlock_output(&["release", &k, "--slot", &free])
        .await?;
    nothing.expect_code(0)?;
    nothing.expect_stdout_has(&["was not held"])?;
    let broke = hosts
        .a
        .runlock_output(&["release", &k, "--slot", &slot])
        .await?;
    broke.expect_code(0)?;
    broke.expect_stdout_has(&[&format!("released slot {slot} of")])?;
    let second_slot = second.slot;
    let second_token = second.token;
    second.run.finish().await?.expect_code(76)?;

    // Across slots the order is the stores' clocks' (whole seconds for some),
    // so each slot's own events are checked in order.
    let some = |n: u32| Some(u64::from(n));
    for reader in [hosts.b(), &hosts.a] {
        let events = history_of(reader, &k).await?;
        let of =
            |slot: u32| -> Vec<&Event> { events.iter().filter(|e| e.1 == some(slot)).collect() };
        let first_events = of(first_slot);
        ensure!(
            first_events.len() == 2
                && *first_events[0] == slot_event("granted", first_slot, first_token, &a_id)
                && *first_events[1] == slot_event("released", first_slot, first_token, &a_id),
            "slot {first_slot}: {events:?}"
        );
        let second_events = of(second_slot);
        ensure!(
            second_events.len() == 2
                && *second_events[0] == slot_event("granted", second_slot, second_token, &b_id)
                && is_break_of(second_events[1], second_token, &a_id),
            "slot {second_slot}: {events:?}"
        );
        ensure!(events.len() == 4, "events of no slot: {events:?}");
    }
    let text = hosts.a.runlock_output(&["history", &k]).await?;
    text.expect_code(0)?;
    text.expect_stdout_has(&[&format!("slot {second_slot}: broken")])?;
    Ok(())
}
