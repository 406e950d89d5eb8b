//! What the registry's tests share: a registry on memory://, connections and requests.

pub(super) use super::{
    AcquireRequest, ConnId, Event, Events, Granted, Identity, LeaseError, PeerCred, Policy,
    Registry,
};
use crate::backend::{
    AcquireSpec, Adopted, Adopter, Backend, BackendError, Displaced, Ending, Grant, LeaseRef,
    ListFrom, ListPage, Profile, Profiled, Renewed,
};
pub(super) use crate::backend::{MemoryBackend, ProfiledBackend};
pub(super) use crate::process::Peer;
pub(super) use runlock_protocol::{Key, Lease, OnLost};
use runlock_protocol::{KeyEvent, KeyRecord};
pub(super) use std::sync::Arc;
pub(super) use std::time::Duration;
pub(super) use tokio::sync::mpsc;
pub(super) use tokio_util::sync::CancellationToken;

pub(super) const ROOT: PeerCred = PeerCred {
    pid: 1,
    uid: 0,
    gid: 0,
};

pub(super) fn registry() -> Arc<Registry> {
    agent(Arc::new(MemoryBackend::default()), "agent-1")
}

/// A registry over `store` with a 30 s TTL: the agent `agent_id` on
/// "test-host", as several agents sharing one store are in a test.
pub(super) fn agent(store: impl Into<ProfiledBackend>, agent_id: &str) -> Arc<Registry> {
    agent_with(store, agent_id, Policy::with_ttl(Duration::from_secs(30)))
}

/// The same, under `policy`.
pub(super) fn agent_with(
    store: impl Into<ProfiledBackend>,
    agent_id: &str,
    policy: Policy,
) -> Arc<Registry> {
    let identity = Identity {
        host: "test-host".into(),
        agent_id: agent_id.into(),
        uid: 0,
    };
    Registry::new(store, identity, policy)
}

pub(super) fn request(keys: &[&str], wait: Duration, force: bool) -> AcquireRequest {
    AcquireRequest {
        slots: 1,
        keys: keys.iter().map(|k| k.to_string()).collect(),
        ttl: None,
        wait,
        force,
        command: "test".into(),
        on_lost: OnLost::Ignore,
    }
}

pub(super) fn connect(registry: &Registry, peer: PeerCred) -> (ConnId, Events) {
    let shim = Peer::of_pid(std::process::id());
    registry.open_connection(peer, shim, &[])
}

pub(super) async fn take(
    registry: &Registry,
    conn: ConnId,
    keys: &[&str],
) -> Result<Vec<Lease>, LeaseError> {
    let never = CancellationToken::new();
    registry
        .acquire(conn, request(keys, Duration::ZERO, false), &never)
        .await
        .map(|g| g.leases)
}

pub(super) fn waiting(registry: &Registry, key: &str) -> usize {
    let key = Key::new(key).expect("valid");
    registry.state().queues.len(&key)
}

/// A memory store whose tests stage something around `acquire` or `end` (a
/// race, an announced release): every other request passes straight through.
pub(super) struct Hooked<H> {
    pub(super) store: Arc<MemoryBackend>,
    pub(super) hooks: H,
}

impl<H: Default> Default for Hooked<H> {
    fn default() -> Self {
        Hooked {
            store: Arc::default(),
            hooks: H::default(),
        }
    }
}

/// What a [`Hooked`] store does in place of passing a request on; by default,
/// it passes it on.
#[async_trait::async_trait]
pub(super) trait Hooks: Send + Sync + 'static {
    async fn acquire(
        &self,
        store: &MemoryBackend,
        spec: &AcquireSpec,
    ) -> Result<Grant, BackendError> {
        store.acquire(spec).await
    }

    async fn end(
        &self,
        store: &MemoryBackend,
        lease: &LeaseRef,
        ending: &Ending,
    ) -> Result<(), BackendError> {
        store.end(lease, ending).await
    }

    fn profile(&self, store: &MemoryBackend) -> Profile {
        store.profile()
    }
}

impl<H: Hooks> Profiled for Hooked<H> {
    fn profile(&self) -> Profile {
        self.hooks.profile(&self.store)
    }
}

#[async_trait::async_trait]
impl<H: Hooks> Backend for Hooked<H> {
    async fn acquire(&self, spec: &AcquireSpec) -> Result<Grant, BackendError> {
        self.hooks.acquire(&self.store, spec).await
    }
    async fn renew(&self, lease: &LeaseRef, ttl: Duration) -> Result<Renewed, BackendError> {
        self.store.renew(lease, ttl).await
    }
    async fn end(&self, lease: &LeaseRef, ending: &Ending) -> Result<(), BackendError> {
        self.hooks.end(&self.store, lease, ending).await
    }
    async fn inspect(&self, key: &Key) -> Result<KeyRecord, BackendError> {
        self.store.inspect(key).await
    }
    async fn history(&self, key: &Key) -> Result<Vec<KeyEvent>, BackendError> {
        self.store.history(key).await
    }
    async fn list(
        &self,
        prefix: &str,
        from: &ListFrom,
        limit: usize,
    ) -> Result<ListPage, BackendError> {
        self.store.list(prefix, from, limit).await
    }
    async fn adopt(&self, lease: &LeaseRef, by: &Adopter) -> Result<Adopted, BackendError> {
        self.store.adopt(lease, by).await
    }
    async fn confirm_stopped(&self, lease: &LeaseRef) -> Result<(), BackendError> {
        self.store.confirm_stopped(lease).await
    }
    async fn displaced_stopped(
        &self,
        key: &Key,
        displaced: &Displaced,
    ) -> Result<bool, BackendError> {
        self.store.displaced_stopped(key, displaced).await
    }
}
