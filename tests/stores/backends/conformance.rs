//! One contract every backend keeps, run against each: memory:// and file://
//! here, and every network store on its emulator (which `scripts/test`
//! starts; without it those tests fail, never skip). Two backends opened on
//! one space stand for two hosts' agents, and a third, opened once the first
//! is dropped, for the next agent of the first host.

use crate::support::stores::{Azure, Etcd, Gcs, Ministack, PgBouncer, Postgres, Space, Store, S3};
use anyhow::{bail, ensure, Context, Result};
use runlock_agent::backend::cas::{AzureOptions, CasEngine, S3Options};
use runlock_agent::backend::testing::{adopter, gcs_on_emulator, lease, spec};
use runlock_agent::backend::{
    self, BackendError, BackendOptions, ProfiledBackend, Readiness, StoreContext,
};
use runlock_protocol::{Key, KeyState};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);
const KEY: &str = "dev:conformance";

/// The contract: `open` makes another agent on the same store each time.
async fn keeps_the_contract<F, Fut>(open: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<ProfiledBackend>>,
{
    let key = Key::new(KEY)?;
    let (first_agent, two) = (open().await?, open().await?.backend);
    // Whether a lease taken through an agent outlives it, for the next agent to adopt.
    let survives_agent = first_agent.profile.capabilities.survives_agent;
    let one = first_agent.backend;
    let free = one.inspect(&key).await?;
    ensure!(free.state == KeyState::Free, "a new key is free: {free:?}");

    // acquire, and held: the other agent is told who holds the key.
    let first = one.acquire(&spec(KEY, "l1", false, TTL)).await?;
    ensure!(first.holder.token >= 1, "{:?}", first.holder);
    match two.acquire(&spec(KEY, "l2", false, TTL)).await {
        Err(BackendError::Held(Some(holder), _)) => ensure!(
            (holder.host.as_str(), holder.token) == ("host-of-l1", first.holder.token),
            "{holder:?}"
        ),
        other => bail!("expected held by l1, got {other:?}"),
    }

    // inspect: either agent sees the holder and the token.
    let seen = two.inspect(&key).await?;
    ensure!(
        (seen.state, seen.token) == (KeyState::Held, first.holder.token),
        "{seen:?}"
    );
    ensure!(
        seen.holder.as_ref().map(|h| h.host.as_str()) == Some("host-of-l1"),
        "{seen:?}"
    );

    // renew, then release: the key is free again.
    let l1 = lease(KEY, "l1", first.holder.token);
    one.renew(&l1, TTL).await?;
    drop(first);
    one.release(&l1).await?;
    let seen = two.inspect(&key).await?;
    ensure!(seen.state == KeyState::Free, "released: {seen:?}");

    // tokens grow across holders.
    let second = two.acquire(&spec(KEY, "l2", false, TTL)).await?;
    ensure!(second.holder.token > l1.token, "{:?}", second.holder);

    // a force takes the key with a larger token; the old lease is no longer
    // ours, and letting it go frees nothing of the new holder's.
    let forced = one.acquire(&spec(KEY, "l3", true, TTL)).await?;
    ensure!(
        forced.holder.token > second.holder.token,
        "{:?}",
        forced.holder
    );
    let l2 = lease(KEY, "l2", second.holder.token);
    drop(second);
    match two.renew(&l2, TTL).await {
        Err(BackendError::LeaseMismatch) => {}
        other => bail!("renewing a forced-out lease: {other:?}"),
    }
    two.release(&l2).await?;
    let seen = two.inspect(&key).await?;
    ensure!(
        (seen.state, seen.token) == (KeyState::Held, forced.holder.token),
        "the forcer holds it: {seen:?}"
    );

    let l3 = lease(KEY, "l3", forced.holder.token);
    if !survives_agent {
        one.release(&l3).await?;
        return Ok(());
    }
    // adopt: the agent that granted l3 stops (the run keeps what it holds),
    // and the next agent on that host takes the lease over.
    drop(one);
    let next = open().await?.backend;
    match next
        .adopt(&lease(KEY, "l3", l3.token + 1), &adopter("next"))
        .await
    {
        Err(BackendError::LeaseMismatch) => {}
        other => bail!("adopting with the wrong token: {other:?}"),
    }
    // Another user's lease, with its id and token, is not adopted: the
    // stored record names its user.
    let stranger = backend::Adopter {
        uid: 4242,
        ..adopter("next")
    };
    match next.adopt(&l3, &stranger).await {
        Err(BackendError::LeaseMismatch) => {}
        other => bail!("adopting another user's lease: {other:?}"),
    }
    let adopted = next.adopt(&l3, &adopter("next")).await?;
    ensure!(
        (
            adopted.grant.holder.agent_id.as_str(),
            adopted.grant.holder.token
        ) == ("next", l3.token),
        "{:?}",
        adopted.grant.holder
    );
    ensure!(adopted.ttl == TTL, "{:?}", adopted.ttl);
    next.renew(&l3, TTL).await?;
    drop(forced); // the run ends
    next.release(&l3).await?;
    let after = two.acquire(&spec(KEY, "l4", false, TTL)).await?;
    ensure!(after.holder.token > l3.token, "{:?}", after.holder);
    Ok(())
}

/// A backend on `uri`, opened as the agent opens it, which must be ready.
async fn opened(uri: &str, options: &BackendOptions) -> Result<ProfiledBackend> {
    let opened = backend::open(uri, options, &StoreContext::default()).await?;
    ensure!(
        opened.readiness == Readiness::Ready,
        "{uri}: {:?}",
        opened.readiness
    );
    Ok(opened.store)
}

/// The settings an agent takes from `env` (what a store's fixture gives it),
/// as the configuration file would give them: this process's own
/// environment is shared by every test.
fn options_from(env: &[(String, String)]) -> BackendOptions {
    let var = |name: &str| {
        env.iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.clone())
    };
    BackendOptions {
        s3: S3Options {
            endpoint_url: var("AWS_ENDPOINT_URL"),
            region: var("AWS_REGION"),
            access_key_id: var("AWS_ACCESS_KEY_ID"),
            secret_access_key: var("AWS_SECRET_ACCESS_KEY").map(Into::into),
            ..S3Options::default()
        },
        azure: AzureOptions {
            connection_string: var("AZURE_STORAGE_CONNECTION_STRING").map(Into::into),
            ..AzureOptions::default()
        },
        ..BackendOptions::default()
    }
}

/// The contract on a fresh space of `store`'s emulator.
async fn store_keeps_the_contract(store: impl Store + Copy) -> Result<()> {
    let space = Space::create(store, "conformance").await?;
    let uri = space.uri("p");
    let env = space.env();
    keeps_the_contract(|| {
        let (uri, env, at) = (uri.clone(), env.clone(), space.at.url.clone());
        async move {
            if uri.starts_with("gs://") {
                // The emulator is named by an environment variable only.
                let store = gcs_on_emulator(&uri, &at)?;
                let engine = CasEngine::new(Arc::new(store));
                engine.prove().await.map_err(|unproven| {
                    anyhow::anyhow!("the emulator does not keep its promises: {unproven:?}")
                })?;
                return Ok(ProfiledBackend::from(Arc::new(engine)));
            }
            opened(&uri, &options_from(&env)).await
        }
    })
    .await
    .with_context(|| format!("{} at {}", store.name(), space.at.url))
}

#[tokio::test]
async fn memory_keeps_the_contract() -> Result<()> {
    // One process's memory is one store: both agents are the same backend.
    let shared = opened("memory://", &BackendOptions::default()).await?;
    keeps_the_contract(|| {
        let shared = shared.clone();
        async move { Ok(shared) }
    })
    .await
}

#[tokio::test]
async fn file_keeps_the_contract() -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("runlock-conformance")
        .tempdir_in("/tmp")?;
    let uri = format!("file://{}", dir.path().display());
    let options = BackendOptions::default();
    keeps_the_contract(|| opened(&uri, &options)).await
}

// Each store through its emulator, as the test `store_keeps_the_contract::STORE`.
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
    store_keeps_the_contract,
);
