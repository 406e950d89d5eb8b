//! A fleet on one store (invariant 9): agents that start together, as a
//! fleet's pods do at the top of the hour, never refuse each other; and a
//! listing through any one of them shows what each refused. Each case
//! runs once per shared store (`stores::fleet::CASE::STORE`); BENCHMARKS.md has the
//! larger herds.

use crate::support::client::RawClient;
use crate::support::run::HOLD;
use crate::support::stores::{Azure, Etcd, Gcs, Ministack, PgBouncer, Postgres, Space, Store, S3};
use crate::support::{key, Deadline, TestAgent, WAIT};
use anyhow::{ensure, Result};
use runlock_protocol::{AgentMessage, ClientMessage, ListKeysRequest};
use std::time::Duration;

test_matrix!(
    [
        s3: S3,
        ministack: Ministack,
        azure: Azure,
        gcs: Gcs,
        postgres: Postgres,
        pgbouncer: PgBouncer,
        etcd: Etcd,
    ];
    agents_started_together_are_each_granted_their_own_key,
);

/// As many agents as a 2-core CI machine starts at once without the test
/// measuring its own load; `scripts/fleet` (BENCHMARKS.md) goes to 200.
const HERD: usize = 30;

/// Each run's `--wait`, as in a fleet's schedule.
const RUN_WAIT: Duration = Duration::from_secs(60);

async fn agents_started_together_are_each_granted_their_own_key(store: impl Store) -> Result<()> {
    let space = Space::create(store, "herd").await?;
    // All at once: every agent's start checks the store (the object stores'
    // proof) while the others do.
    let agents: Vec<TestAgent> =
        futures::future::try_join_all((0..HERD).map(|_| space.agent("fleet", &[]))).await?;
    let wait = format!("{}s", RUN_WAIT.as_secs());
    let runs = agents
        .iter()
        .enumerate()
        .map(|(i, agent)| {
            agent.run(
                &[&key(&format!("herd-{i}"))],
                &["--wait", &wait, "--ttl", "15s"],
                "echo granted",
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let finished = futures::future::try_join_all(
        runs.into_iter()
            .map(|run| run.finish_within(RUN_WAIT + Duration::from_secs(10))),
    )
    .await?;
    let refused: Vec<String> = finished
        .iter()
        .filter(|run| run.code() != Some(0) || !run.stdout.contains("granted"))
        .map(|run| format!("{run:?}"))
        .collect();
    ensure!(
        refused.is_empty(),
        "{} of {HERD} runs were not granted: {refused:#?}",
        refused.len()
    );
    every_agent_s_refusal_is_listed_through_any_one(&agents).await
}

/// The herd's refusals, each known only to its agent, are all listed
/// through one of them, from the agents' reports.
async fn every_agent_s_refusal_is_listed_through_any_one(agents: &[TestAgent]) -> Result<()> {
    let shared = key("herd-shared");
    let mut holding = agents[0].run(&[&shared], &[], HOLD)?;
    holding.ready().await?;
    let shared_key = shared.as_str();
    let tries = agents[1..]
        .iter()
        .map(|agent| async move { agent.run(&[shared_key], &[], "true")?.finish().await });
    for tried in futures::future::try_join_all(tries).await? {
        tried.expect_code(75)?;
    }
    let mut client = RawClient::connect(agents[0].socket()).await?;
    client.hello().await?;
    let deadline = Deadline::new(WAIT, "every agent's refusal listed through the first");
    loop {
        let request = ClientMessage::ListKeys(ListKeysRequest {
            prefix: shared.clone(),
            cursor: None,
            free: false,
            events_since_ms: Some(0),
        });
        let refused = match client.call(request).await? {
            AgentMessage::Keys { keys, .. } => keys.into_iter().flat_map(|k| k.refused).count(),
            other => anyhow::bail!("list_keys: {other:?}"),
        };
        if refused == agents.len() - 1 {
            break;
        }
        deadline.tick().await?;
    }
    holding.end_and_expect_success().await
}
