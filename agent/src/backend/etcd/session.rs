//! One etcd lease per agent and TTL, shared by every key the agent holds
//! with that TTL, as etcd's own `concurrency.Session` does: the keep-alive
//! traffic of an agent does not grow with its number of keys (etcd clusters
//! lose leases when tens of thousands are kept alive, etcd-io/etcd#11886).
//!
//! The lease is kept alive on demand, by the renewals of the keys on it: a
//! renewal that finds it kept alive within the last TTL/6 costs no request
//! and counts from that keep-alive's send time (`Renewed::Since`), so that a
//! holder still trusts its key no longer than etcd keeps it. An agent that
//! holds nothing sends nothing, and its lease runs out by itself; an agent
//! that dies stops keeping it alive, and etcd deletes every key on it. A
//! single run's end deletes its own key; nothing here revokes a lease.

use super::errors::{LeaseGone, Problem};
use super::lease_seconds;
use super::transport::Connection;
use crate::backend::BackendError;
use runlock_protocol::timing;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// The agent's shared etcd leases, one per TTL.
pub(super) struct Sessions {
    connection: Arc<Connection>,
    by_ttl: Mutex<HashMap<Duration, Arc<Session>>>,
}

/// One shared etcd lease.
struct Session {
    id: i64,
    ttl: Duration,
    /// When the last grant or keep-alive that etcd answered was sent: etcd
    /// keeps the lease at least `lease_seconds(ttl)` from there. Locked
    /// across a keep-alive, so that renewals arriving meanwhile share it.
    kept: Mutex<Instant>,
}

impl Sessions {
    pub(super) fn new(connection: Arc<Connection>) -> Sessions {
        Sessions {
            connection,
            by_ttl: Mutex::new(HashMap::new()),
        }
    }

    /// The lease to put a new key on, and when it was last kept alive (the
    /// key's clock starts there): the agent's lease for `ttl`, kept alive
    /// first if that was more than TTL/6 ago, or a new one if it is gone.
    pub(super) async fn for_grant(&self, ttl: Duration) -> Result<(i64, Instant), BackendError> {
        let mut by_ttl = self.by_ttl.lock().await;
        if let Some(session) = by_ttl.get(&ttl).cloned() {
            match self.keep(&session).await {
                Ok(sent) => return Ok((session.id, sent)),
                Err(Problem::Expected(LeaseGone)) => {}
                Err(problem) => return Err(self.connection.unavailable(problem)),
            }
        }
        // Leases of TTLs no longer held go with their last key: drop the
        // ones etcd has surely let run out, so that the map stays small.
        by_ttl.retain(|_, s| {
            s.kept.try_lock().map_or(true, |kept| {
                kept.elapsed() < Duration::from_secs(lease_seconds(s.ttl) as u64)
            })
        });
        let seconds = lease_seconds(ttl);
        let sent = Instant::now();
        let granted = self
            .connection
            .call(|mut c| async move { c.lease_grant(seconds, None).await })
            .await
            .map_err(|p| self.connection.unavailable(p))?;
        let session = Arc::new(Session {
            id: granted.id(),
            ttl,
            kept: Mutex::new(sent),
        });
        by_ttl.insert(ttl, session);
        Ok((granted.id(), sent))
    }

    /// Renews a key on lease `id`: when etcd's clock for it last restarted.
    /// `LeaseMismatch` when that lease is gone (every key on it with it).
    pub(super) async fn renew(&self, id: i64, ttl: Duration) -> Result<Instant, BackendError> {
        let session = self.by_ttl.lock().await.get(&ttl).cloned();
        let Some(session) = session.filter(|s| s.id == id) else {
            // Replaced after etcd said it was gone: so are its keys.
            return Err(BackendError::LeaseMismatch);
        };
        match self.keep(&session).await {
            Ok(sent) => Ok(sent),
            Err(Problem::Expected(LeaseGone)) => Err(BackendError::LeaseMismatch),
            Err(problem) => Err(self.connection.unavailable(problem)),
        }
    }

    /// Lease `id` is gone (a write on it was refused): the next grant makes another.
    pub(super) async fn gone(&self, id: i64) {
        self.by_ttl.lock().await.retain(|_, s| s.id != id);
    }

    /// The session's last keep-alive if it is at most TTL/6 old, else a new one.
    async fn keep(&self, session: &Session) -> Result<Instant, Problem> {
        let mut kept = session.kept.lock().await;
        if kept.elapsed() <= timing::margin(session.ttl) {
            return Ok(*kept);
        }
        let sent = Instant::now();
        let id = session.id;
        self.connection
            .call(|mut c| async move { c.lease_keep_alive(id).await.map(|_| ()) })
            .await?;
        *kept = sent;
        Ok(sent)
    }
}
