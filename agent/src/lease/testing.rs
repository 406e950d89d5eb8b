//! What the registry's tests share: a registry on memory://, connections and requests.

pub(super) use super::{
    AcquireRequest, ConnId, Event, Events, Granted, Identity, LeaseError, PeerCred, Policy,
    Registry,
};
pub(super) use crate::backend::forwarding::{Forwarding, Hooks};
pub(super) use crate::backend::{MemoryBackend, ProfiledBackend};
pub(super) use crate::process::Peer;
pub(super) use runlock_protocol::{Key, Lease, OnLost};
pub(super) use std::sync::Arc;
pub(super) use std::time::Duration;
pub(super) use tokio::sync::mpsc;
pub(super) use tokio_util::sync::CancellationToken;

pub(super) const ROOT: PeerCred = PeerCred {
    pid: 1,
    uid: 0,
    gid: 0,
};

/// A user other than root (uid 4242), as a peer.
pub(super) const USER: PeerCred = PeerCred {
    pid: 2,
    uid: 4242,
    gid: 4242,
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

/// `req` acquired on a task of its own and never cancelled: a run that
/// waits, or a force that waits for the run it displaced.
pub(super) fn spawn_acquire(
    registry: &Arc<Registry>,
    conn: ConnId,
    req: AcquireRequest,
) -> tokio::task::JoinHandle<Result<Granted, LeaseError>> {
    let registry = registry.clone();
    tokio::spawn(async move { registry.acquire(conn, req, &CancellationToken::new()).await })
}

/// [`spawn_acquire`] of a request that waits, returned once it is in its
/// (first) key's queue.
pub(super) async fn spawn_queued(
    registry: &Arc<Registry>,
    conn: ConnId,
    req: AcquireRequest,
) -> tokio::task::JoinHandle<Result<Granted, LeaseError>> {
    let key = req.keys[0].clone();
    let before = waiting(registry, &key);
    let task = spawn_acquire(registry, conn, req);
    // Yields, not a timeout: paused time does not advance while a task runs.
    for _ in 0..100_000 {
        if waiting(registry, &key) > before {
            return task;
        }
        tokio::task::yield_now().await;
    }
    panic!("the request never joined the queue of {key}");
}

pub(super) fn waiting(registry: &Registry, key: &str) -> usize {
    let key = Key::new(key).expect("valid");
    registry.state().queues.len(&key)
}

/// A fresh memory store with `hooks` in front of it: for tests that stage
/// something around `acquire` or `end` (a race, an announced release).
pub(super) fn hooked<H: Hooks>(hooks: H) -> Arc<Forwarding<H>> {
    Arc::new(Forwarding {
        inner: Arc::new(MemoryBackend::default()).into(),
        hooks,
    })
}
