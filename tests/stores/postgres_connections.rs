//! PostgreSQL as operators run it (issue 28): an agent holds a connection
//! only while it uses one, so a fleet larger than the server's (or the
//! role's) connection limit is served in turns; a server out of connections
//! (SQLSTATE 53300) is waited out within the run's `--wait`, counted in
//! `runlock_store_throttled_total`, and named when the wait runs out. A
//! role's `CONNECTION LIMIT` stands for `max_connections`: the same refusal,
//! without starving the other tests of the shared server.

use crate::agent::metrics::{metrics_address, scrape, value};
use crate::support::run::HOLD;
use crate::support::stores::{unique_name, Postgres, Space};
use crate::support::{key, AgentOptions, Deadline, TestAgent, WAIT};
use anyhow::{ensure, Result};
use std::time::Duration;

const THROTTLED: &str = "runlock_store_throttled_total{store=\"postgresql\"}";

/// A connection of the test's own, as the superuser (trusted on loopback).
async fn connect(uri: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(uri, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// The role's one connection, once the agent has let its own go.
async fn take_the_only_connection(uri: &str) -> Result<tokio_postgres::Client> {
    let deadline = Deadline::new(WAIT, "the role's connection to be free");
    loop {
        match connect(uri).await {
            Ok(client) => return Ok(client),
            Err(err) if format!("{err:#}").contains("too many connections") => {
                deadline.tick().await?
            }
            Err(err) => return Err(err),
        }
    }
}

/// A role that may open `limit` connections and make the lock table in
/// `space`; returns the space's URI as that role.
async fn capped_role(space: &Space, limit: u32) -> Result<String> {
    let role = unique_name("capped").replace('-', "_");
    let admin = connect(&space.uri("")).await?;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN CONNECTION LIMIT {limit};
             GRANT CREATE ON DATABASE \"{}\" TO {role};",
            space.name
        ))
        .await?;
    Ok(space.uri("").replacen("postgres@", &format!("{role}@"), 1))
}

/// Connections open as `application_name` `app`, by the server's count.
async fn connections(admin: &tokio_postgres::Client, app: &str) -> Result<i64> {
    let row = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await?;
    Ok(row.get(0))
}

/// Waits until `app` holds no connection.
async fn until_it_holds_none(admin: &tokio_postgres::Client, app: &str, when: &str) -> Result<()> {
    let deadline = Deadline::new(WAIT, format!("the agent to close its connection {when}"));
    while connections(admin, app).await? > 0 {
        deadline.tick().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_holds_a_connection_only_while_it_uses_one() -> Result<()> {
    let space = Space::create(Postgres, "idle").await?;
    let admin = connect(&space.uri("")).await?;
    let app = unique_name("idle");
    let uri = format!("{}?application_name={app}", space.uri(""));
    let agent = TestAgent::start_with_env(AgentOptions::new(uri), &space.env()).await?;
    // Its start-up check connected (and made the table), then let go.
    until_it_holds_none(&admin, &app, "after its start-up check").await?;

    // While a run holds a key (renewed every TTL/3 = 1 s), it connects.
    let k = key("idle");
    let mut run = agent.run(&[&k], &["--ttl", "3s"], HOLD)?;
    run.ready().await?;
    let deadline = Deadline::new(WAIT, "a connection while the key is held");
    while connections(&admin, &app).await? == 0 {
        deadline.tick().await?;
    }
    run.end_and_expect_success().await?;
    until_it_holds_none(&admin, &app, "once its run ended").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_agents_than_their_role_may_connect_are_all_served() -> Result<()> {
    const AGENTS: usize = 16;
    const LIMIT: u32 = 4;
    let space = Space::create(Postgres, "capped").await?;
    let uri = capped_role(&space, LIMIT).await?;
    let agents = futures::future::try_join_all((0..AGENTS).map(|_| {
        let mut options = AgentOptions::new(uri.clone());
        options.args = ["--metrics", "127.0.0.1:0"].map(String::from).to_vec();
        TestAgent::start_with_env(options, &[])
    }))
    .await?;
    let runs = agents
        .iter()
        .enumerate()
        .map(|(i, agent)| {
            let k = key(&format!("capped-{i}"));
            agent.run(
                &[&k],
                &["--wait", "60s", "--ttl", "6s"],
                "sleep 1; echo served",
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let finished = futures::future::try_join_all(
        runs.into_iter()
            .map(|run| run.finish_within(Duration::from_secs(90))),
    )
    .await?;
    let unserved: Vec<String> = finished
        .iter()
        .filter(|run| run.code() != Some(0) || run.stdout != "served\n")
        .map(|run| format!("{run:?}"))
        .collect();
    ensure!(
        unserved.is_empty(),
        "{} of {AGENTS} agents on {LIMIT} connections were not served: {unserved:#?}",
        unserved.len()
    );
    // The limit was met (the test is not vacuous) and waited out.
    let mut throttled = 0.0;
    for agent in &agents {
        throttled += value(&scrape(metrics_address(agent)?).await?, THROTTLED).unwrap_or(0.0);
    }
    ensure!(throttled >= 1.0, "no agent met the connection limit");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_connections_is_waited_out_counted_and_named() -> Result<()> {
    let space = Space::create(Postgres, "full").await?;
    let uri = capped_role(&space, 1).await?;
    let mut options = AgentOptions::new(uri.clone());
    options.args = ["--metrics", "127.0.0.1:0"].map(String::from).to_vec();
    let agent = TestAgent::start_with_env(options, &[]).await?;
    let metrics = metrics_address(&agent)?;
    let throttled = || async {
        Ok::<_, anyhow::Error>(value(&scrape(metrics).await?, THROTTLED).unwrap_or(0.0))
    };

    // The role's one connection is the test's: the run waits, and is
    // served once the test lets it go.
    let blocker = take_the_only_connection(&uri).await?;
    let before = throttled().await?;
    let run = agent.run(&[&key("full")], &["--wait", "60s"], "echo served")?;
    let deadline = Deadline::new(WAIT, "the agent to meet the connection limit");
    while throttled().await? <= before {
        deadline.tick().await?;
    }
    drop(blocker);
    let served = run.finish().await?;
    served.expect_output("served\n")?;

    // Full for longer than a short wait: unavailable, naming the limit.
    let _blocker = take_the_only_connection(&uri).await?;
    let refused = agent
        .run_refused(&[&key("full-out")], &["--wait", "2s"], 69)
        .await?;
    ensure!(
        refused.stderr.contains("too many connections") && refused.stdout.is_empty(),
        "the refusal does not name the limit: {refused:?}"
    );
    Ok(())
}
