//! `scripts/fleet STORE N`: N real agents (release build) started together on
//! one store's emulator, as a fleet's pods start at the top of the hour, and
//! one table of what happened (BENCHMARKS.md, "Fleet"). Nothing here asserts
//! a figure; `tests/stores/fleet.rs` holds the invariant with a smaller herd.
//!
//! The workload (issue 28):
//! 1. every agent starts at once and runs one command on a key of its own
//!    (`--wait 60s`, TTL 15 s): the time from the herd's start to each run's
//!    end is its first grant;
//! 2. every second agent then queues one run on one shared key; each run
//!    notes when it started and ended, so the turns, the handover (one run's
//!    end to the next one's start) and any overlap are read off afterwards;
//! 3. the store's requests per second with every agent idle, then with every
//!    agent holding 10 leases at the default TTL (30 s); and the agents'
//!    total RSS.
//!
//! Store requests are counted at the store: a counting HTTP proxy in front of
//! moto, Azurite and fake-gcs-server; PostgreSQL's committed transactions
//! (`pg_stat_database`); etcd's handled gRPC calls (its `/metrics`).

use anyhow::Result;
use runlock_tests::bench_args::run_store_bench;
use runlock_tests::on_store_named;
use runlock_tests::run::HOLD;
use runlock_tests::store_requests::StoreRequests;
use runlock_tests::stores::{Space, Store};
use runlock_tests::{rss_kib, AgentOptions, Run, TestAgent};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The first runs' `--wait`, and the shared key's queue's.
const WAIT: Duration = Duration::from_secs(60);
/// The TTL of every run.
const TTL: &str = "15s";
/// How long each turn on the shared key holds it.
const TURN: Duration = Duration::from_millis(200);
/// How long the shared key's queue is watched at most.
const QUEUE_TIME: Duration = Duration::from_secs(90);
/// The window store requests are counted over.
const SAMPLE: Duration = Duration::from_secs(30);
/// How long waiters poll before their requests are counted: past their
/// first, quicker polls.
const SETTLE: Duration = Duration::from_secs(3);
/// Leases each agent holds in the busy sample.
const LEASES_EACH: usize = 10;

fn main() -> Result<()> {
    let usage = "usage: scripts/fleet STORE N   (STORE: s3, azure, gcs, postgres, pgbouncer, etcd)";
    run_store_bench(usage, async |store, n| {
        let figures = on_store_named!(store.as_str(), fleet(n))?;
        print_table(&store, n, &figures);
        Ok(())
    })
}

/// What one fleet run measured.
struct Figures {
    first_grant: Vec<Duration>,
    refused: usize,
    failed: Vec<String>,
    turns: usize,
    queued: usize,
    handovers: Vec<Duration>,
    overlaps: usize,
    idle_per_second: f64,
    waiting_per_second: f64,
    waiters: usize,
    busy_per_second: f64,
    holding: usize,
    hold_errors: Vec<String>,
    rss_mib: f64,
}

async fn fleet(store: impl Store, n: usize) -> Result<Figures> {
    let mut space = Space::create(store, "fleet").await?;
    let counter = StoreRequests::count(&mut space).await?;

    let scratch = tempfile::Builder::new()
        .prefix("runlock-fleet")
        .tempdir_in("/tmp")?;
    runlock_tests::bins::bins()?; // built before the clock starts
    let env = space.env();
    let agent = || {
        let mut options = AgentOptions::new(space.uri("fleet"));
        options.log_on_drop = false;
        TestAgent::start_with_env(options, &env)
    };
    let started = Instant::now();
    let wait = format!("{}s", WAIT.as_secs());
    // Each agent runs its first command as soon as it is ready, as a pod's
    // job does once its agent is up.
    let wait = &wait;
    let herd = futures::future::join_all((0..n).map(|i| async move {
        let agent = agent().await?;
        let run = agent.run(
            &[&format!("own-{i}")],
            &["--wait", wait, "--ttl", TTL],
            "true",
        )?;
        let finished = run.finish_within(WAIT + Duration::from_secs(30)).await;
        anyhow::Ok((agent, finished, started.elapsed()))
    }))
    .await;
    let (mut agents, mut first_grant, mut refused, mut failed) =
        (Vec::new(), Vec::new(), 0, Vec::new());
    for started in herd {
        let (agent, finished, at) = match started {
            Ok(started) => started,
            Err(err) => {
                failed.push(format!("agent: {err:#}"));
                continue;
            }
        };
        agents.push(agent);
        match finished {
            Ok(run) if run.code() == Some(0) => first_grant.push(at),
            Ok(run) if run.code() == Some(75) => refused += 1,
            Ok(run) => failed.push(format!("exit {:?}: {}", run.code(), run.stderr.trim())),
            Err(err) => failed.push(format!("{err:#}")),
        }
    }

    // The shared key: every second agent queues one turn.
    let log = scratch.path().join("turns");
    let turn = format!(
        "echo start $(date +%s.%N) >> {log}; sleep {}; echo end $(date +%s.%N) >> {log}",
        TURN.as_secs_f64(),
        log = log.display()
    );
    let queue_wait = format!("{}s", QUEUE_TIME.as_secs());
    let queue: Vec<Run> = agents
        .iter()
        .step_by(2)
        .map(|agent| agent.run(&["shared"], &["--wait", &queue_wait, "--ttl", TTL], &turn))
        .collect::<Result<_>>()?;
    let queued = queue.len();
    futures::future::join_all(
        queue
            .into_iter()
            .map(|run| run.finish_within(QUEUE_TIME + Duration::from_secs(30))),
    )
    .await;
    let (turns, handovers, overlaps) =
        read_turns(&std::fs::read_to_string(&log).unwrap_or_default());

    let idle_per_second = counter.per_second_over(SAMPLE).await?;

    // Waiting: every other agent waits for a key the first one holds.
    let (waiting_per_second, waiters) = match agents.split_first() {
        Some((holder, others)) if !others.is_empty() => {
            let mut held = holder.run(&["contended"], &["--ttl", TTL], HOLD)?;
            held.ready().await?;
            let patience = format!("{}s", (SAMPLE + WAIT).as_secs());
            let waiting: Vec<Run> = others
                .iter()
                .map(|agent| agent.run(&["contended"], &["--wait", &patience], "true"))
                .collect::<Result<_>>()?;
            // Past the first, quicker polls (20 ms doubling to the interval).
            tokio::time::sleep(SETTLE).await;
            let rate = counter.per_second_over(SAMPLE).await?;
            drop(waiting); // killed: none of them takes a turn
            held.end();
            held.finish().await?;
            (rate, others.len())
        }
        _ => (0.0, 0),
    };
    let keys: Vec<String> = (0..LEASES_EACH).map(|k| format!("busy-{k}")).collect();
    let mut holders = Vec::new();
    for (i, agent) in agents.iter().enumerate() {
        let mine: Vec<String> = keys.iter().map(|k| format!("{k}-{i}")).collect();
        let refs: Vec<&str> = mine.iter().map(String::as_str).collect();
        // The default TTL: what a fleet's holders renew at.
        holders.push(agent.run(&refs, &["--wait", wait], HOLD)?);
    }
    // A herd's 10 leases each are many writes at once: a holder is waited
    // for in rounds of the harness's bound, up to the runs' own --wait.
    let (mut holding, mut hold_errors) = (0, Vec::new());
    for holder in holders.iter_mut() {
        for _ in 0..(WAIT.as_secs() / 15).max(1) {
            match holder.ready().await {
                Ok(_) => {
                    holding += 1;
                    break;
                }
                Err(err) if hold_errors.len() < 3 => hold_errors.push(format!("{err:#}")),
                Err(_) => {}
            }
        }
    }
    let busy_per_second = counter.per_second_over(SAMPLE).await?;
    let rss_mib = agents
        .iter()
        .filter_map(|a| a.pid())
        .filter_map(|pid| rss_kib(pid).ok())
        .sum::<u64>() as f64
        / 1024.0;
    drop(holders);
    Ok(Figures {
        first_grant,
        refused,
        failed,
        turns,
        queued,
        handovers,
        overlaps,
        idle_per_second,
        waiting_per_second,
        waiters,
        busy_per_second,
        holding,
        hold_errors,
        rss_mib,
    })
}

/// The turns on the shared key from the runs' own notes: how many, the gaps
/// between one's end and the next one's start, and how many began before the
/// one before them ended (none, if the lock holds).
fn read_turns(text: &str) -> (usize, Vec<Duration>, usize) {
    let mut events: Vec<(f64, bool)> = text
        .lines()
        .filter_map(|line| {
            let (what, at) = line.split_once(' ')?;
            Some((at.trim().parse().ok()?, what == "start"))
        })
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut turns, mut inside, mut overlaps) = (0, 0usize, 0);
    let mut last_end: Option<f64> = None;
    let mut handovers = Vec::new();
    for (at, is_start) in events {
        if is_start {
            turns += 1;
            if inside > 0 {
                overlaps += 1;
            }
            inside += 1;
            if let Some(end) = last_end.take() {
                handovers.push(Duration::from_secs_f64((at - end).max(0.0)));
            }
        } else {
            inside = inside.saturating_sub(1);
            last_end = Some(at);
        }
    }
    (turns, handovers, overlaps)
}

fn quantile(samples: &[Duration], q: f64) -> String {
    if samples.is_empty() {
        return "-".into();
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    format!("{:.2} s", sorted[at].as_secs_f64())
}

fn print_table(store: &str, n: usize, f: &Figures) {
    let when = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    println!("fleet: {store}, {n} agents (unix time {when})");
    println!("| figure | value |");
    println!("| --- | --- |");
    let rows = [
        (
            "granted their own key",
            format!("{} of {n}", f.first_grant.len()),
        ),
        (
            "first grant p50 / p99 / max (from the herd's start)",
            format!(
                "{} / {} / {}",
                quantile(&f.first_grant, 0.5),
                quantile(&f.first_grant, 0.99),
                quantile(&f.first_grant, 1.0)
            ),
        ),
        ("refused (75)", f.refused.to_string()),
        ("failed (other exits)", f.failed.len().to_string()),
        (
            "shared key: turns of those queued",
            format!("{} of {}", f.turns, f.queued),
        ),
        (
            "shared key: handover p50 / p99",
            format!(
                "{} / {}",
                quantile(&f.handovers, 0.5),
                quantile(&f.handovers, 0.99)
            ),
        ),
        ("shared key: overlapping turns", f.overlaps.to_string()),
        (
            "store requests/s, all idle",
            format!("{:.1}", f.idle_per_second),
        ),
        (
            "store requests/s, the others waiting for one agent's key",
            format!(
                "{:.1} ({:.2} per waiting agent, {} waiting)",
                f.waiting_per_second,
                f.waiting_per_second / f.waiters.max(1) as f64,
                f.waiters
            ),
        ),
        (
            "store requests/s, 10 leases each",
            format!(
                "{:.1} ({} agents holding theirs)",
                f.busy_per_second, f.holding
            ),
        ),
        ("agents' total RSS", format!("{:.0} MiB", f.rss_mib)),
    ];
    for (name, value) in rows {
        println!("| {name} | {value} |");
    }
    for failure in f.failed.iter().take(5) {
        println!("failed: {failure}");
    }
    for error in &f.hold_errors {
        println!("not holding: {error}");
    }
}
