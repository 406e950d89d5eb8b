//! The cross-host scenarios, written once and run for every shared store:
//! two agents with their own sockets and agent ids on one space play two
//! hosts. Each case is an `async fn(store)`; `test_matrix!` names it as one
//! test per store (`shim::scenarios::CASE::STORE`). The stores' emulators are
//! started by `scripts/test`; without them these tests fail (they never skip).

use crate::support::run::{Ready, HOLD};
use crate::support::stores::{
    Azure, Etcd, Gcs, Ministack, PgBouncer, Postgres, Space, Store, RECORDS, S3,
};
use crate::support::{host_name, key, AgentOptions, Deadline, TestAgent, WAIT};
use anyhow::{ensure, Context, Result};
use nix::sys::signal::Signal;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

test_matrix!(
    [s3: S3, ministack: Ministack, azure: Azure, gcs: Gcs, postgres: Postgres, etcd: Etcd];
    a_conflict_names_the_holder_on_the_other_host,
    a_killed_run_frees_its_key_for_the_other_host_at_once,
    a_lost_host_s_lease_is_taken_over_after_its_ttl_and_not_before,
    force_from_the_other_host_stops_the_first_run_at_its_next_renewal,
    a_store_pause_shorter_than_the_ttl_loses_no_lease,
    a_store_pause_longer_than_the_ttl_stops_the_holder_before_anyone_takes_over,
    agents_whose_wall_clocks_are_hours_off_change_nothing,
    the_store_s_own_failures_make_runs_exit_69_with_a_clear_message,
    history_lists_every_grant_force_release_expiry_and_break_from_either_host,
);

/// Through PgBouncer's transaction pooling: no session state, no `LISTEN`.
/// (The pauses and the store's own failures are PostgreSQL's, tested above.)
mod through_pgbouncer {
    use super::*;
    test_matrix!(
        [pgbouncer: PgBouncer];
        a_conflict_names_the_holder_on_the_other_host,
        a_killed_run_frees_its_key_for_the_other_host_at_once,
        a_lost_host_s_lease_is_taken_over_after_its_ttl_and_not_before,
        force_from_the_other_host_stops_the_first_run_at_its_next_renewal,
        agents_whose_wall_clocks_are_hours_off_change_nothing,
        history_lists_every_grant_force_release_expiry_and_break_from_either_host,
    );
}

// The object stores' records sit beside Meltano's own state files.
test_matrix!(
    [s3: S3, ministack: Ministack, azure: Azure, gcs: Gcs];
    records_read_back_with_the_store_s_own_tools_as_json_beside_meltano_state,
    the_history_costs_no_store_request,
);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn a_conflict_names_the_holder_on_the_other_host(store: impl Store) -> Result<()> {
    let space = Space::create(store, "conflict").await?;
    let a = space.agent("state", &[]).await?;
    let b = space.agent("state", &[]).await?;
    let a_id = a.agent_id().await?;
    ensure!(a_id != b.agent_id().await?, "the two agents share an id");
    let k = key("conflict");
    let mut holder = a.run(&[&k], &[], &format!("{HOLD} # held-through-a"))?;
    let ready = holder.ready().await?;

    let refused = b.run_refused(&[&k], &[], 75).await?;
    for want in [
        host_name()?,
        holder.pid()?.to_string(),
        format!("token:   {}", ready.token()),
        "held-through-a".to_string(),
    ] {
        ensure!(
            refused.stderr.contains(&want),
            "{want:?} not named: {refused:?}"
        );
    }

    let record = b.inspect_json(&k).await?;
    ensure!(record["state"] == "held", "{record}");
    ensure!(record["scope"] == "global", "{record}");
    ensure!(record["token"] == ready.token(), "{record}");
    ensure!(record["holder"]["agent_id"] == a_id.as_str(), "{record}");
    ensure!(record["holder"]["pid"] == holder.pid()?, "{record}");
    ensure!(
        record["expires_in_ms"]
            .as_u64()
            .is_some_and(|ms| ms <= 30_000),
        "a held record expires: {record}"
    );

    holder.end_and_expect_success().await?;
    let token = b.token_of_a_run(&k).await?;
    ensure!(token > ready.token(), "{token} after {}", ready.token());
    Ok(())
}

async fn a_killed_run_frees_its_key_for_the_other_host_at_once(store: impl Store) -> Result<()> {
    let space = Space::create(store, "killed-run").await?;
    let a = space.agent("", &[]).await?;
    let b = space.agent("", &[]).await?;
    let k = key("killed-run");
    let (run, ready) = a.run_attached(&[&k], HOLD).await?;
    let mut client = b.client().await?;
    ensure!(client.is_held(&k).await?, "B does not see A's lease");

    // SIGKILL the whole run: the agent sees end of file and releases.
    let killed = Instant::now();
    run.signal(Signal::SIGKILL)?;
    run.kill_group()?;
    let deadline = Deadline::new(Duration::from_secs(5), "the key to be free through B");
    while client.is_held(&k).await? {
        deadline.tick().await?;
    }
    let freed = killed.elapsed();
    let token = b.token_of_a_run(&k).await?;
    ensure!(token > ready.token(), "{token} after {}", ready.token());
    eprintln!("freed {freed:?} after the kill");
    Ok(())
}

async fn a_lost_host_s_lease_is_taken_over_after_its_ttl_and_not_before(
    store: impl Store,
) -> Result<()> {
    const TTL: Duration = Duration::from_secs(5);
    let resolution = store.stamp_resolution();
    let space = Space::create(store, "host-loss").await?;
    let mut a = space.agent("p", &["--ttl", "5s"]).await?;
    // B's own leases last 30 s, so nothing renews B's record before it is read below.
    let b = space.agent("p", &["--ttl", "30s"]).await?;
    let b_id = b.agent_id().await?;
    let k = key("host-loss");
    let (mut held, first) = a.run_attached(&[&k], HOLD).await?;

    // The host dies: the agent is SIGKILLed and releases nothing.
    a.kill().await?;
    let killed = Instant::now();
    let mut waiter = b.run(&[&k], &["--wait", "30s"], HOLD)?;
    // A's run outlives its agent only until its lease's deadline; it must be gone
    // before B takes over (invariant 4).
    let a_run = tokio::spawn(async move {
        let status = held.wait().await;
        (Instant::now(), status, held)
    });

    // The record as A last wrote it. A is dead, so it cannot change any more; the
    // pause lets a write A sent just before its death land first, so that this is
    // really A's last write (on loopback a request takes milliseconds).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let last_by_a = space.only_record("p").await?;
    let record = last_by_a.json()?;
    ensure!(
        record["state"] == "held" && record["token"] == first.token(),
        "the killed agent's record is not left held: {record}"
    );

    let second = waiter.ready().await?;
    let took = killed.elapsed();
    let (a_gone, a_status, a_run) = a_run.await?;
    let a_status = a_status?;
    ensure!(
        a_status.code() == Some(76),
        "A's run: {:?}",
        a_run.finish().await?
    );
    ensure!(second.token() > first.token(), "{second:?} after {first:?}");

    // Not before: where the store stamps writes with its own clock (HTTP stores
    // in whole seconds: a write stamped `t` happened in [t, t + 1 s)), A's last
    // write happened before `last_by_a + resolution` and B's takeover at or after
    // its own stamp. So `B's stamp >= A's stamp + TTL + resolution` proves B wrote
    // no earlier than TTL after A's last write, by one clock, with no agent's wall
    // clock involved.
    let taken = space.only_record("p").await?;
    let record = taken.json()?;
    ensure!(
        record["holder"]["agent_id"] == b_id.as_str() && record["token"] == second.token(),
        "the record is not B's takeover: {record}"
    );
    if let (Some(before), Some(after)) = (last_by_a.written, taken.written) {
        let gap = after.duration_since(before).unwrap_or_default();
        ensure!(
            gap >= TTL + resolution,
            "B took the key {gap:?} (store clock) after A's last write: sooner than the TTL"
        );
        eprintln!("store-clock gap {gap:?}");
    }
    // And promptly: B takes over once the store's clock passes A's last write by
    // TTL + grace (0.5 s) + 1 s of date resolution, seen at B's next poll.
    let bound = TTL + Duration::from_millis(3500);
    ensure!(
        took <= bound,
        "B took the key {took:?} after A died (bound {bound:?})"
    );
    // A's run stopped before B's command started. B's acquire comes a moment
    // before its command, so this is the order as closely as the test can see it.
    ensure!(
        a_gone.duration_since(killed) < took,
        "A's run ended {:?} after the kill, B acquired {took:?} after it",
        a_gone.duration_since(killed)
    );
    eprintln!("B took over {took:?} after the kill");
    waiter.end_and_expect_success().await?;
    Ok(())
}

async fn force_from_the_other_host_stops_the_first_run_at_its_next_renewal(
    store: impl Store,
) -> Result<()> {
    let space = Space::create(store, "force").await?;
    // TTL 6 s: A renews, and so notices the takeover, about every 2 s.
    let a = space.agent("", &["--ttl", "6s"]).await?;
    let b = space.agent("", &["--ttl", "6s"]).await?;
    let k = key("force");
    let (first, first_ready) = a.hold(&k).await?;

    let forced_at = Instant::now();
    let mut second = b.run(&[&k], &["--force"], HOLD)?;
    let second_ready = second.ready().await?;
    ensure!(
        second_ready.token() > first_ready.token(),
        "{second_ready:?} after {first_ready:?}"
    );
    let stopped = first.finish().await?;
    let noticed = forced_at.elapsed();
    stopped.expect_stopped()?;
    ensure!(
        noticed < Duration::from_secs(4),
        "the takeover was noticed after {noticed:?}: not at the first renewal (TTL 6 s)"
    );
    let record = a.inspect_json(&k).await?;
    ensure!(
        record["state"] == "held" && record["token"] == second_ready.token(),
        "{record}"
    );
    second.end_and_expect_success().await?;
    Ok(())
}

async fn a_store_pause_shorter_than_the_ttl_loses_no_lease(store: impl Store) -> Result<()> {
    let own = store.start_own().await?;
    let space = Space::create_at(store, own.endpoint.clone(), "short-pause").await?;
    let a = space.agent("p", &["--ttl", "6s"]).await?;
    let k = key("short-pause");
    let (mut run, ready) = a.hold(&k).await?;

    // The fault itself: the store answers nothing for 2 s (renewals go every 2 s,
    // the lease's deadline is 5 s after the last one).
    own.pause()?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    own.resume()?;

    // The lease lives on. Without a renewal after the pause, the run would be
    // stopped at its deadline, at most 5 s after the last renewal before it:
    // a run still going 7 s after the pause proves a renewal landed.
    let ended = tokio::time::timeout(Duration::from_secs(7), run.wait()).await;
    ensure!(
        ended.is_err(),
        "the run ended after a pause shorter than the TTL: {ended:?}"
    );
    let body = space.only_record("p").await?.json()?;
    ensure!(
        body["state"] == "held" && body["token"] == ready.token(),
        "the lease changed hands or was dropped: {body}"
    );
    run.end();
    let done = run.finish().await?;
    done.expect_code(0)?;
    ensure!(!done.stderr.contains("lost"), "{done:?}");
    Ok(())
}

async fn a_store_pause_longer_than_the_ttl_stops_the_holder_before_anyone_takes_over(
    store: impl Store,
) -> Result<()> {
    let own = store.start_own().await?;
    let space = Space::create_at(store, own.endpoint.clone(), "long-pause").await?;
    let a = space.agent("p", &["--ttl", "6s"]).await?;
    let b = space.agent("p", &["--ttl", "6s"]).await?;
    let k = key("long-pause");
    let (mut held, first) = a.hold(&k).await?;
    let mut waiter = b.run(&[&k], &["--wait", "60s"], HOLD)?;

    own.pause()?;
    let paused = Instant::now();
    // A cannot renew: its run is told at the lease's deadline (≤ 5 s after the last
    // renewal) and stopped within the kill grace (1 s for a 6 s TTL).
    let a_done =
        crate::support::within(Duration::from_secs(15), "A's run to stop", held.wait()).await??;
    let a_gone = Instant::now();
    ensure!(
        a_done.code() == Some(76),
        "A's run: {:?}",
        held.finish().await?
    );
    // Keep the store stopped past TTL + grace + 1 s, so that B may take over as
    // soon as it can ask.
    tokio::time::sleep_until((paused + Duration::from_secs(9)).into()).await;
    own.resume()?;
    let second = waiter.ready().await?;
    let b_started = Instant::now();
    ensure!(
        a_gone < b_started,
        "B's run started before A's run was stopped"
    );
    ensure!(second.token() > first.token(), "{second:?} after {first:?}");
    waiter.end_and_expect_success().await?;
    Ok(())
}

/// `holder` runs on `k` while `other` is refused it (code 75), then lets it go.
async fn held_while_refused(holder: &TestAgent, other: &TestAgent, k: &str) -> Result<Ready> {
    let (held, ready) = holder.hold(k).await?;
    other
        .run(&[k], &[], "echo must-not-run")?
        .finish()
        .await?
        .expect_code(75)?;
    held.end_and_expect_success().await?;
    Ok(ready)
}

/// libfaketime moves an agent's wall clock; exclusion, crash release and
/// takeover timing must not notice.
async fn agents_whose_wall_clocks_are_hours_off_change_nothing(store: impl Store) -> Result<()> {
    const TTL: Duration = Duration::from_secs(5);
    let space = Space::create(store, "skewed-clocks").await?;
    let mut ahead = space
        .agent_with_clock_offset("p", &["--ttl", "5s"], "+5h")
        .await?;
    let behind = space
        .agent_with_clock_offset("p", &["--ttl", "5s"], "-5h")
        .await?;
    let k = key("skewed");

    // Exclusion: a holder whose clock is 5 h ahead is not taken for expired by
    // one 5 h behind, and the other way round.
    let first = held_while_refused(&ahead, &behind, &k).await?;
    let second = held_while_refused(&behind, &ahead, &k).await?;
    ensure!(second.token() > first.token());

    // Host loss: the agent ahead dies holding the key; the one behind takes over
    // after the TTL, not at once (its clock would call any record stale) and not
    // never (its clock would call any record fresh).
    let (mut held, third) = ahead.run_attached(&[&k], HOLD).await?;
    ahead.kill().await?;
    let killed = Instant::now();
    let mut waiter = behind.run(&[&k], &["--wait", "30s"], HOLD)?;
    let fourth = waiter.ready().await?;
    let took = killed.elapsed();
    ensure!(fourth.token() > third.token());
    ensure!(
        took >= TTL - TTL / 3,
        "taken over {took:?} after the kill: before the TTL"
    );
    ensure!(
        took <= TTL + Duration::from_millis(3500),
        "taken over only {took:?} after the kill"
    );
    let _ = held.wait().await;
    waiter.end_and_expect_success().await?;
    Ok(())
}

async fn the_store_s_own_failures_make_runs_exit_69_with_a_clear_message(
    store: impl Store,
) -> Result<()> {
    let at = store.shared()?;
    let failures = store.failures(&at).await?;
    ensure!(
        !failures.is_empty(),
        "{} lists no failure modes",
        store.name()
    );
    for failure in failures {
        let what = &failure.what;
        let agent = TestAgent::start_with_env(AgentOptions::new(&failure.uri), &failure.env)
            .await
            .with_context(|| format!("starting an agent on {what}"))?;
        let started = Instant::now();
        let out = agent
            .run(&[&key("failure")], &[], "echo must-not-run")?
            .finish()
            .await?;
        out.expect_code(69).with_context(|| what.clone())?;
        ensure!(!out.stdout.contains("must-not-run"), "{what}: {out:?}");
        for name in &failure.names {
            ensure!(
                out.stderr.contains(name.as_str()),
                "{what}: {name:?} is not named: {out:?}"
            );
        }
        ensure!(
            agent.log().contains(failure.names[0].as_str()),
            "{what}: no start-up warning names {:?}:\n{}",
            failure.names[0],
            agent.log()
        );
        ensure!(
            started.elapsed() < WAIT,
            "{what}: the run took {:?} to fail",
            started.elapsed()
        );
        if let Some(secret) = &failure.secret {
            ensure!(
                !out.stderr.contains(secret.as_str())
                    && !out.stdout.contains(secret.as_str())
                    && !agent.log().contains(secret.as_str()),
                "{what}: the secret leaked"
            );
        }
    }
    Ok(())
}

async fn records_read_back_with_the_store_s_own_tools_as_json_beside_meltano_state(
    store: impl Store,
) -> Result<()> {
    let space = Space::create(store, "records").await?;
    // Meltano's own files under the same prefix stay untouched.
    let state_object = "meltano/dev:tap-x-to-target-y/state.json";
    space.put(state_object, br#"{"completed": {}}"#).await?;
    space.put("meltano/dev:tap-x-to-target-y/lock", b"").await?;
    let a = space.agent("meltano", &[]).await?;
    let a_id = a.agent_id().await?;
    let k = "dev:tap-x-to-target-y";

    let (run, ready) = a.hold(k).await?;
    let record = space.only_record("meltano").await?;
    ensure!(
        record.name == format!("meltano/{RECORDS}dev%3Atap-x-to-target-y.json"),
        "{record:?}"
    );
    let held = record.json()?;
    ensure!(held["key"] == k, "{held}");
    ensure!(held["state"] == "held", "{held}");
    ensure!(held["token"] == ready.token(), "{held}");
    ensure!(held["ttl_ms"] == 30_000, "{held}");
    ensure!(
        held["lease_id"].as_str().is_some_and(|s| !s.is_empty()),
        "{held}"
    );
    let now = now_ms();
    ensure!(
        held["renewed_at_ms"]
            .as_u64()
            .is_some_and(|ms| ms <= now && now - ms < 60_000),
        "{held}"
    );
    let holder = &held["holder"];
    ensure!(holder["agent_id"] == a_id.as_str(), "{held}");
    ensure!(holder["host"] == host_name()?.as_str(), "{held}");
    ensure!(holder["pid"] == run.pid()?, "{held}");
    ensure!(holder["token"] == ready.token(), "{held}");

    run.end_and_expect_success().await?;
    let free = space.only_record("meltano").await?.json()?;
    ensure!(free["state"] == "free", "{free}");
    ensure!(
        free["token"] == ready.token(),
        "release keeps the token: {free}"
    );
    ensure!(
        free["holder"].is_null() && free["lease_id"].is_null(),
        "{free}"
    );
    // Meltano's state is still there, as it was.
    let state = space.get(state_object).await?;
    ensure!(
        state.as_deref() == Some(r#"{"completed": {}}"#),
        "Meltano's state.json changed: {state:?}"
    );
    Ok(())
}

/// `runlock history --json KEY` through `agent`: (kind, token, agent id,
/// from_token) of each event, oldest first.
async fn history_of(agent: &TestAgent, k: &str) -> Result<Vec<(String, u64, String, Option<u64>)>> {
    let events = agent.history_json(k).await?;
    events
        .iter()
        .map(|e| {
            Ok((
                e["kind"].as_str().context("kind")?.to_string(),
                e["token"].as_u64().context("token")?,
                e["agent_id"].as_str().context("agent_id")?.to_string(),
                e["from_token"].as_u64(),
            ))
        })
        .collect()
}

async fn history_lists_every_grant_force_release_expiry_and_break_from_either_host(
    store: impl Store,
) -> Result<()> {
    let space = Space::create(store, "history").await?;
    let mut a = space.agent("", &["--ttl", "5s"]).await?;
    let b = space.agent("", &["--ttl", "5s"]).await?;
    let (a_id, b_id) = (a.agent_id().await?, b.agent_id().await?);
    let k = key("history");

    // Granted to A, forced by B, released by B.
    let (t1, t2) = a.held_then_forced_through(&b, &k).await?;

    // Granted to A, whose host dies: B takes the key over once it expired.
    let (dying, third) = a.hold(&k).await?;
    let t3 = third.token();
    a.wait_attached(third.pid).await?;
    a.kill().await?;
    let mut taker = b.run(&[&k], &["--wait", "30s"], HOLD)?;
    let t4 = taker.ready().await?.token();
    dying.finish().await?.expect_code(76)?;

    // Broken through a third agent (A's host back): the holder's agent is B.
    let c = space.agent("", &["--ttl", "5s"]).await?;
    let c_id = c.agent_id().await?;
    c.runlock_output(&["release", &k]).await?.expect_code(0)?;
    taker.finish().await?.expect_code(76)?;

    let a_id_s = a_id.as_str();
    let (b_id_s, c_id_s) = (b_id.as_str(), c_id.as_str());
    let want = [
        ("granted", t1, a_id_s, None),
        ("forced", t2, b_id_s, Some(t1)),
        ("released", t2, b_id_s, None),
        ("granted", t3, a_id_s, None),
        ("expired", t3, a_id_s, None),
        ("granted", t4, b_id_s, None),
    ];
    for reader in [&b, &c] {
        let events = history_of(reader, &k).await?;
        ensure!(events.len() == want.len() + 1, "{events:?}");
        for (got, want) in events.iter().zip(&want) {
            let got = (got.0.as_str(), got.1, got.2.as_str(), got.3);
            ensure!(got == *want, "{got:?} where {want:?} was due: {events:?}");
        }
        let (kind, token, agent, from) = &events[want.len()];
        ensure!(
            kind == "broken" && agent == c_id_s && *from == Some(t4) && *token > t4,
            "the break: {events:?}"
        );
    }
    // `inspect` names the last incident: the break.
    let record = c.inspect_json(&k).await?;
    ensure!(
        record["incident"]["kind"] == "broken" && record["incident"]["agent_id"] == c_id_s,
        "{record}"
    );
    Ok(())
}

/// (kind, token) of each event of `k`'s history through `agent`.
async fn kinds_of(agent: &TestAgent, k: &str) -> Result<Vec<(String, u64)>> {
    Ok(history_of(agent, k)
        .await?
        .into_iter()
        .map(|(kind, token, _, _)| (kind, token))
        .collect())
}

/// The store requests of an uncontended acquire and release, counted by a
/// proxy in front of the store: the history rides in the record, so each
/// is still one conditional write, however long the history.
async fn the_history_costs_no_store_request(store: impl Store) -> Result<()> {
    use crate::support::client::{release, RawClient};
    use crate::support::rewriting_proxy::{RequestHead, RewritingProxy};
    use crate::support::stores::unique_name;
    use runlock_protocol::{AcquireRequest, AgentMessage, ClientMessage};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let at = store.shared()?;
    let bucket = unique_name("counted");
    store.create(&at, &bucket).await?;
    let requests = Arc::new(AtomicUsize::new(0));
    let deletes = Arc::new(AtomicUsize::new(0));
    let (counter, delete_counter) = (requests.clone(), deletes.clone());
    // The agent's probe object (its start-up proof's) is counted apart: the
    // agent removes it in the background, at a moment of its choosing.
    let count = Arc::new(move |head: &mut RequestHead| {
        if !head.target.contains("probe-") {
            counter.fetch_add(1, Ordering::SeqCst);
        } else if head.method == "DELETE" {
            delete_counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    let proxy = RewritingProxy::start(&at, count).await?;
    let proxied = proxy.endpoint.clone();
    let uri = store.uri(&at, &bucket, "p");
    let agent = TestAgent::start_with_env(AgentOptions::new(&uri), &store.env(&proxied)).await?;
    let mut conn: RawClient = agent.client().await?;
    let acquire = |k: &str| {
        ClientMessage::Acquire(AcquireRequest {
            slots: 1,
            keys: vec![k.to_string()],
            ttl_ms: Some(60_000),
            wait_ms: 0,
            force: false,
            command: "counted".into(),
            on_lost: runlock_protocol::OnLost::Term,
        })
    };
    let k = key("counted");
    let pair = async |conn: &mut RawClient| -> Result<(usize, usize)> {
        let before = requests.load(Ordering::SeqCst);
        let lease_id = match conn.call(acquire(&k)).await? {
            AgentMessage::Acquired { mut leases, .. } => leases.pop().context("no lease")?.lease_id,
            other => anyhow::bail!("acquire: {other:?}"),
        };
        let acquired = requests.load(Ordering::SeqCst);
        let released = conn.call(release(vec![lease_id])).await?;
        ensure!(
            matches!(released, AgentMessage::Released { count: 1 }),
            "{released:?}"
        );
        let after = requests.load(Ordering::SeqCst);
        Ok((acquired - before, after - acquired))
    };
    // From the first acquire (of a key never seen) on, no proof and no history read.
    let first = pair(&mut conn).await?;
    let second = pair(&mut conn).await?;
    let third = pair(&mut conn).await?;
    eprintln!(
        "{}: store requests per (acquire, release): first {first:?}, then {second:?}, {third:?}",
        store.name()
    );
    // An acquire: its write, then the slot-count check's read of slot 1
    // (invariant 10; never written for a plain key, so the only read).
    for counted in [first, second, third] {
        ensure!(counted == (2, 1), "(acquire, release): {counted:?}");
    }
    let kinds = kinds_of(&agent, &k).await?;
    let want: Vec<(String, u64)> = (1..=3)
        .flat_map(|t| [("granted".to_string(), t), ("released".to_string(), t)])
        .collect();
    ensure!(kinds == want, "{kinds:?}");
    // The agent checked at its start that the store keeps its conditions,
    // and removes its probe object within 10 s of that.
    let tidied = Deadline::new(WAIT, "the agent to remove its probe object");
    while deletes.load(Ordering::SeqCst) == 0 {
        tidied.tick().await?;
    }
    Ok(())
}
