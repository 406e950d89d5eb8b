//! The Azure Blob adapter against Azurite, in this process: the conditional
//! writes as Azure answers them (409 for create-only, 412 for If-Match), the
//! store's clock, the lease engine over it with racing agents, and the store's
//! failures named without the key. Azurite is started by `scripts/test`;
//! without it these tests fail (they never skip). The cross-host scenarios
//! through real agents are in `tests/shim/scenarios.rs`.

use crate::support::stores::{azure, unique_name, Azure, Endpoint, Space, Store};
use anyhow::{bail, ensure, Context, Result};
use runlock_agent::backend::cas::{
    AzureOptions, AzureStore, CasEngine, CasError, CasStore, Precondition,
};
use runlock_agent::backend::{AcquireSpec, Backend, BackendError, LeaseRef, StoreContext};
use runlock_protocol::Key;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

fn options(endpoint: &str, key: &str) -> AzureOptions {
    AzureOptions {
        connection_string: Some(azure::connection_string_with_key(endpoint, key).into()),
        ..AzureOptions::default()
    }
}

/// A new, empty container in the shared Azurite.
struct Container {
    at: Endpoint,
    name: String,
}

impl Container {
    async fn create(hint: &str) -> Result<Container> {
        let at = Azure.shared()?;
        let name = unique_name(hint);
        Azure.create(&at, &name).await?;
        Ok(Container { at, name })
    }

    /// A container nobody creates.
    fn missing(hint: &str) -> Result<Container> {
        Ok(Container {
            at: Azure.shared()?,
            name: unique_name(hint),
        })
    }

    fn uri(&self, prefix: &str) -> String {
        Azure.uri(&self.at, &self.name, prefix)
    }

    /// The agent's adapter on it, records under `prefix`, signing with `key`.
    fn open_with_key(&self, prefix: &str, key: &str) -> Result<AzureStore> {
        AzureStore::open(
            &self.uri(prefix),
            &options(&self.at.url, key),
            &StoreContext::default(),
        )
    }

    fn open(&self, prefix: &str) -> Result<AzureStore> {
        self.open_with_key(prefix, azure::KEY)
    }

    /// Every blob under the records of `prefix`, read with the Python SDK.
    async fn records(&self, prefix: &str) -> Result<Vec<crate::support::stores::Record>> {
        Azure.objects().records(&self.at, &self.name, prefix).await
    }
}

/// A plain acquire of `key` for `lease`, with the shared fixtures' holder.
fn spec(key: &str, lease: &str) -> AcquireSpec {
    runlock_agent::backend::testing::spec(key, lease, false, Duration::from_secs(30))
}

/// `a` is within `slack` of `b`.
fn near(a: SystemTime, b: SystemTime, slack: Duration) -> bool {
    match a.duration_since(b) {
        Ok(after) => after <= slack,
        Err(before) => before.duration() <= slack,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_writes_keep_their_meaning_on_azurite() -> Result<()> {
    let container = Container::create("conditions").await?;
    let store = container.open("p")?;
    let name = format!("{}k.json", store.site().records);
    ensure!(name == "p/.runlock/locks/k.json", "{name}");

    let absent = store.get(&name).await?;
    ensure!(absent.object.is_none(), "{absent:?}");
    ensure!(
        store
            .put(
                &name,
                b"{}".to_vec(),
                Precondition::Matches("\"0x8D000000000000\"")
            )
            .await
            == Err(CasError::Conflict),
        "If-Match on a missing blob must fail as a conflict (Azure: 412)"
    );

    let first = store
        .put(&name, b"{\"n\":1}".to_vec(), Precondition::Absent)
        .await?;
    // Azure answers 409 BlobAlreadyExists here, not 412.
    ensure!(
        store
            .put(&name, b"{\"n\":9}".to_vec(), Precondition::Absent)
            .await
            == Err(CasError::Conflict),
        "create-only over an existing blob must be a conflict"
    );
    let second = store
        .put(&name, b"{\"n\":2}".to_vec(), Precondition::Matches(&first))
        .await?;
    ensure!(second != first, "a write must change the ETag");
    ensure!(
        store
            .put(&name, b"{\"n\":9}".to_vec(), Precondition::Matches(&first))
            .await
            == Err(CasError::Conflict),
        "a stale ETag must be a conflict (Azure: 412 ConditionNotMet)"
    );

    let read = store.get(&name).await?;
    let object = read.object.context("the blob")?;
    ensure!(object.body == b"{\"n\":2}", "{:?}", object.body);
    ensure!(object.version == second, "{} != {second}", object.version);
    // Azurite's clock is this machine's: both stamps must be now, and the
    // answer's Date no earlier than the write's Last-Modified.
    let now = SystemTime::now();
    let written = object.last_modified.context("no Last-Modified")?;
    let date = read.date.context("no Date")?;
    ensure!(
        near(written, now, Duration::from_secs(5)),
        "{written:?} vs {now:?}"
    );
    ensure!(
        date >= written,
        "Date {date:?} before Last-Modified {written:?}"
    );

    // The Python SDK sees what the adapter wrote.
    let blobs = container.records("p").await?;
    ensure!(
        blobs.len() == 1 && blobs[0].body == "{\"n\":2}",
        "{blobs:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_engines_on_one_key_make_one_holder_and_tokens_grow() -> Result<()> {
    const AGENTS: usize = 8;
    let container = Container::create("race").await?;
    let engines = (0..AGENTS)
        .map(|_| {
            let store = container.open("")?;
            Ok(Arc::new(CasEngine::new(Arc::new(store))))
        })
        .collect::<Result<Vec<_>>>()?;
    let tasks: Vec<_> = engines
        .iter()
        .enumerate()
        .map(|(i, engine)| {
            let engine = engine.clone();
            let spec = spec("dev:tap-race", &format!("l{i}"));
            tokio::spawn(async move { engine.acquire(&spec).await.map_err(anyhow::Error::from) })
        })
        .collect();
    let mut winners = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await? {
            Ok(grant) => winners.push((i, grant.holder.token)),
            Err(err) => match err.downcast_ref::<BackendError>() {
                Some(BackendError::Held(..)) => {}
                _ => bail!("agent {i}: {err:#}"),
            },
        }
    }
    ensure!(winners.len() == 1, "winners: {winners:?}");
    let (winner, token) = winners[0];
    ensure!(token == 1, "first token {token}");

    // The record, read with Azure's own SDK, names the winner.
    let record = container.records("").await?;
    ensure!(record.len() == 1, "{record:?}");
    let json = record[0].json()?;
    ensure!(
        json["state"] == "held" && json["holder"]["agent_id"] == format!("agent-of-l{winner}"),
        "{json}"
    );

    // Renew and release through the winner; another engine then takes token 2.
    let lease = LeaseRef {
        key: Key::new("dev:tap-race")?,
        lease_id: format!("l{winner}"),
        token,
    };
    engines[winner]
        .renew(&lease, Duration::from_secs(30))
        .await?;
    engines[winner].release(&lease).await?;
    let json = container.records("").await?[0].json()?;
    ensure!(json["state"] == "free" && json["token"] == 1, "{json}");
    let other = (winner + 1) % AGENTS;
    let next = engines[other]
        .acquire(&spec("dev:tap-race", &format!("l{other}")))
        .await?;
    ensure!(next.holder.token == 2, "{:?}", next.holder);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_failures_are_named_without_the_key() -> Result<()> {
    // A container nobody created.
    let missing = Container::missing("missing")?;
    match missing.open("p")?.probe().await {
        Err(CasError::Refused(text)) => ensure!(
            text.contains(&format!("container {} does not exist", missing.name)),
            "{text}"
        ),
        other => bail!("missing container: {other:?}"),
    }

    // A wrong (but well-formed) key: Azurite checks the Shared Key signature.
    let container = Container::create("wrong-key").await?;
    let wrong = azure::WRONG_KEY;
    let store = container.open_with_key("p", wrong)?;
    match store.probe().await {
        Err(CasError::Refused(text)) => {
            ensure!(
                text.contains(&format!("access denied to container {}", container.name)),
                "{text}"
            );
            ensure!(text.contains("check the account key"), "{text}");
            ensure!(
                !text.contains(wrong) && !text.contains(azure::KEY),
                "{text}"
            );
        }
        other => bail!("wrong key: {other:?}"),
    }
    // Through the engine, a run's acquire becomes `unavailable` with the same cause.
    let engine = CasEngine::new(Arc::new(store));
    match engine.acquire(&spec("k", "l1")).await {
        Err(BackendError::Unavailable(text)) => ensure!(text.contains("access denied"), "{text}"),
        other => bail!("acquire with a wrong key: {other:?}"),
    }

    // An endpoint where nothing listens.
    let port = crate::support::closed_port()?;
    let nowhere = format!("http://127.0.0.1:{port}/{}", azure::ACCOUNT);
    let store = AzureStore::open(
        "azure://locks",
        &options(&nowhere, azure::KEY),
        &StoreContext::default(),
    )?;
    match store.probe().await {
        Err(CasError::Unavailable(text)) => ensure!(
            text.starts_with(&format!("cannot reach Azure Blob at {nowhere}")),
            "{text}"
        ),
        other => bail!("refused endpoint: {other:?}"),
    }
    Ok(())
}

/// azure_core logs every request with its `Authorization: SharedKey
/// account:signature` header at `debug`; the agent drops client libraries'
/// events below `info`, so even `RUST_LOG=trace` writes no signature (nor the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_log_holds_no_shared_key_signature() -> Result<()> {
    let space = Space::create(Azure, "trace-log").await?;
    let log = space.trace_log_of_one_run(&[], &[]).await?;
    ensure!(
        log.contains("DEBUG runlock_agent") || log.contains("TRACE runlock_agent"),
        "the agent did not log verbosely: {log}"
    );
    ensure!(
        !log.contains("SharedKey") && !log.contains(azure::KEY),
        "a credential is in the trace log"
    );
    Ok(())
}
