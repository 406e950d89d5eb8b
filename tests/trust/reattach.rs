//! `reattach` by the owner only (issue 27, item 5): a member of the socket
//! group (`nobody`) who has learnt another user's lease id and token cannot
//! adopt that lease, whether its run has ended while no agent ran (file://)
//! or still holds it through another agent (file://, S3, PostgreSQL); and no
//! member is shown a lease id that is not its own.

use crate::agent::restart::leases_of;
use crate::support::agent::FileBackendDir;
use crate::support::client::RawClient;
use crate::support::stores::{Postgres, Space, S3};
use crate::support::{key, AgentOptions, TestAgent};
use crate::trust::access::{as_nobody, member_holds, NOBODY, RUNLOCK_GROUP};
use anyhow::{bail, ensure, Context, Result};
use runlock_protocol::{AgentMessage, ClientMessage, ErrorCode, Lease};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// An agent on `backend` whose socket (at `socket`, or its own) belongs to
/// the socket group, in a directory `nobody` may pass through.
async fn member_agent(
    backend: &str,
    env: &[(String, String)],
    socket: Option<&Path>,
) -> Result<TestAgent> {
    let options = AgentOptions {
        socket: socket.map(Path::to_path_buf),
        args: vec![
            "--ttl".into(),
            "6s".into(),
            "--socket-group".into(),
            RUNLOCK_GROUP.to_string(),
        ],
        ..AgentOptions::new(backend)
    };
    let agent = TestAgent::start_with_env(options, env).await?;
    let dir = socket.and_then(Path::parent).unwrap_or(agent.dir());
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    Ok(agent)
}

/// Root's lease on `k` through `agent`, as root (its owner) is shown it.
async fn roots_lease(agent: &TestAgent, k: &str) -> Result<Lease> {
    let leases = leases_of(agent).await?;
    let info = leases
        .iter()
        .find(|l| l.key == k)
        .with_context(|| format!("no lease on {k}: {leases:?}"))?;
    ensure!(
        !info.lease_id.is_empty(),
        "root is not shown its own lease id"
    );
    Ok(Lease {
        key: info.key.clone(),
        lease_id: info.lease_id.clone(),
        token: info.holder.token,
        slot: None,
    })
}

/// `nobody` sends `reattach` with `lease` through `agent`: refused as no
/// longer held, never `acquired` (a token handed out a second time).
async fn nobody_cannot_reattach(agent: &TestAgent, lease: &Lease) -> Result<()> {
    let mut nobody =
        RawClient::connect_as(agent.socket(), NOBODY, NOBODY, &[RUNLOCK_GROUP]).await?;
    nobody.hello().await?;
    let reply = nobody
        .call(ClientMessage::Reattach {
            leases: vec![lease.clone()],
            on_lost: Default::default(),
        })
        .await?;
    match reply {
        AgentMessage::Error(err) if err.code == ErrorCode::NotOwner => Ok(()),
        other => bail!("nobody's reattach of root's lease was answered {other:?}"),
    }
}

/// The key's history as `agent` reports it holds no `adopted` event.
async fn never_adopted(agent: &TestAgent, k: &str) -> Result<()> {
    let out = agent.runlock_output(&["history", k, "--json"]).await?;
    out.expect_code(0)?;
    ensure!(!out.stdout.contains("adopted"), "{out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_adopt_a_run_that_ended_while_no_agent_ran() -> Result<()> {
    let locks = FileBackendDir::new()?;
    let mut agent = member_agent(&locks.uri(), &[], None).await?;
    let k = key("ended-unseen");
    let (run, ready) = agent.hold(&k).await?;
    let lease = roots_lease(&agent, &k).await?;

    // Root's run ends while no agent runs: its record still names it, its lock is free.
    agent.kill().await?;
    run.end_and_expect_success().await?;
    let again = member_agent(&locks.uri(), &[], Some(agent.socket())).await?;

    nobody_cannot_reattach(&again, &lease).await?;
    ensure!(
        leases_of(&again).await?.is_empty(),
        "the agent holds a lease after the refused reattach"
    );
    // Root's next run takes the key with a larger token, and no one adopted
    // root's finished run in its name.
    let next = again.token_of_a_run(&k).await?;
    ensure!(next > ready.token(), "{next} after {}", ready.token());
    never_adopted(&again, &k).await
}

/// Root's run holds `k` through one agent; `nobody` tries to adopt it
/// through another on the same store. The run keeps its lease, unmoved.
async fn a_member_cannot_adopt_a_live_lease(backend: &str, env: &[(String, String)]) -> Result<()> {
    let holding = member_agent(backend, env, None).await?;
    let other = member_agent(backend, env, None).await?;
    let k = key("live-lease");
    let (mut run, ready) = holding.hold(&k).await?;
    let lease = roots_lease(&holding, &k).await?;

    nobody_cannot_reattach(&other, &lease).await?;
    let record = other.inspect_json(&k).await?;
    ensure!(
        record["state"] == "held" && record["token"] == ready.token(),
        "{record}"
    );
    let holder_agent = holding.agent_id().await?;
    ensure!(record["holder"]["agent_id"] == holder_agent, "{record}");
    never_adopted(&other, &k).await?;

    run.end();
    let out = run.finish().await?;
    out.expect_code(0)?;
    ensure!(!out.stderr.contains("lost"), "{out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_adopt_a_live_file_lease_through_another_agent() -> Result<()> {
    let locks = FileBackendDir::new()?;
    a_member_cannot_adopt_a_live_lease(&locks.uri(), &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_adopt_a_live_s3_lease_through_another_agent() -> Result<()> {
    let space = Space::create(S3, "reattach-live").await?;
    a_member_cannot_adopt_a_live_lease(&space.uri("state"), &space.env()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_adopt_a_live_postgres_lease_through_another_agent() -> Result<()> {
    let space = Space::create(Postgres, "reattach-live").await?;
    a_member_cannot_adopt_a_live_lease(&space.uri("state"), &space.env()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_is_shown_its_own_lease_ids_only() -> Result<()> {
    let agent = member_agent("memory://", &[], None).await?;
    let (roots_key, nobodys_key) = (key("ids-root"), key("ids-nobody"));
    let (mut roots, _) = agent.hold(&roots_key).await?;
    let (mut nobodys, _) = member_holds(&agent, &nobodys_key).await?;
    let root_lease = roots_lease(&agent, &roots_key).await?;

    let out = as_nobody(&agent, &[RUNLOCK_GROUP], &["status", "--json"])?
        .finish()
        .await?;
    out.expect_code(0)?;
    ensure!(!out.stdout.contains(&root_lease.lease_id), "{out:?}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(out.stdout.trim())
        .with_context(|| format!("status --json printed non-JSON: {out:?}"))?;
    let row = |k: &str| rows.iter().find(|r| r["key"] == k).cloned();
    let theirs = row(&roots_key).with_context(|| format!("root's lease not listed: {out:?}"))?;
    ensure!(theirs["lease_id"].is_null(), "{theirs}");
    let own = row(&nobodys_key).with_context(|| format!("own lease not listed: {out:?}"))?;
    ensure!(
        own["lease_id"].as_str().is_some_and(|id| !id.is_empty()),
        "{own}"
    );
    // Nor does root, who may force, see nobody's: it needs none to force or break.
    let out = agent.runlock_output(&["status", "--json"]).await?;
    ensure!(
        own["lease_id"]
            .as_str()
            .is_some_and(|id| !out.stdout.contains(id)),
        "{out:?}"
    );
    roots.end();
    nobodys.end();
    roots.finish().await?.expect_code(0)?;
    nobodys.finish().await?.expect_code(0)?;
    Ok(())
}
