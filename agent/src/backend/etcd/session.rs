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
use crate::backend::{BackendError, BackendResult};
use crate::unpoisoned::Unpoisoned;
use runlock_protocol::timing;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The agent's shared etcd leases, one per TTL.
pub(super) struct Sessions {
    connection: Arc<Connection>,
    by_ttl: Mutex<HashMap<Duration, Arc<Session>>>,
    /// One grant at a time: acquires that start together share one lease.
    granting: tokio::sync::Mutex<()>,
}

/// One shared etcd lease.
struct Session {
    id: i64,
    ttl: Duration,
    /// When the last grant or keep-alive that etcd answered was sent: etcd
    /// keeps the lease at least `lease_seconds(ttl)` from there.
    kept: Mutex<Instant>,
    /// Held across a keep-alive, so that renewals arriving meanwhile share it.
    keeping: tokio::sync::Mutex<()>,
}

impl Session {
    fn new(id: i64, ttl: Duration, sent: Instant) -> Session {
        Session {
            id,
            ttl,
            kept: Mutex::new(sent),
            keeping: tokio::sync::Mutex::new(()),
        }
    }

    fn kept(&self) -> Instant {
        *self.kept.locked()
    }

    /// The last keep-alive, if it is at most TTL/6 old.
    fn fresh(&self) -> Option<Instant> {
        let kept = self.kept();
        (kept.elapsed() <= timing::margin(self.ttl)).then_some(kept)
    }

    /// Whether etcd has surely let it run out.
    fn run_out(&self) -> bool {
        self.kept().elapsed() >= Duration::from_secs(lease_seconds(self.ttl) as u64)
    }
}

impl Sessions {
    pub(super) fn new(connection: Arc<Connection>) -> Sessions {
        Sessions {
            connection,
            by_ttl: Mutex::new(HashMap::new()),
            granting: tokio::sync::Mutex::new(()),
        }
    }

    fn session(&self, ttl: Duration) -> Option<Arc<Session>> {
        self.by_ttl.locked().get(&ttl).cloned()
    }

    /// The lease to put a new key on, and when it was last kept alive (the
    /// key's clock starts there): the agent's lease for `ttl`, kept alive
    /// first if that was more than TTL/6 ago, or a new one if it is gone.
    pub(super) async fn for_grant(&self, ttl: Duration) -> BackendResult<(i64, Instant)> {
        if let Some(session) = self.session(ttl) {
            match self.keep(&session).await {
                Ok(sent) => return Ok((session.id, sent)),
                Err(Problem::Expected(LeaseGone)) => {}
                Err(problem) => return Err(self.connection.unavailable(problem)),
            }
        }
        let _one = self.granting.lock().await;
        // Another acquire may have granted one meanwhile.
        if let Some(session) = self.session(ttl) {
            if let Some(sent) = session.fresh() {
                return Ok((session.id, sent));
            }
        }
        let seconds = lease_seconds(ttl);
        let sent = Instant::now();
        let granted = self
            .connection
            .request(|c| async move { c.lease_grant(seconds).await })
            .await?;
        let mut by_ttl = self.by_ttl.locked();
        // Leases of TTLs no longer held go with their last key: drop the
        // ones etcd has surely let run out, so that the map stays small.
        by_ttl.retain(|_, s| !s.run_out());
        by_ttl.insert(ttl, Arc::new(Session::new(granted, ttl, sent)));
        Ok((granted, sent))
    }

    /// Renews a key on lease `id`: when etcd's clock for it last restarted.
    /// `LeaseMismatch` when that lease is gone (every key on it with it).
    pub(super) async fn renew(&self, id: i64, ttl: Duration) -> BackendResult<Instant> {
        let Some(session) = self.session(ttl).filter(|s| s.id == id) else {
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
    pub(super) fn gone(&self, id: i64) {
        self.by_ttl.locked().retain(|_, s| s.id != id);
    }

    /// The session's last keep-alive if it is at most TTL/6 old, else a new one.
    async fn keep(&self, session: &Session) -> Result<Instant, Problem> {
        if let Some(sent) = session.fresh() {
            return Ok(sent);
        }
        let _one = session.keeping.lock().await;
        if let Some(sent) = session.fresh() {
            return Ok(sent); // kept alive while this renewal waited
        }
        let sent = Instant::now();
        let id = session.id;
        self.connection
            .call(|c| async move { c.lease_keep_alive(id).await })
            .await?;
        *session.kept.locked() = sent;
        Ok(sent)
    }
}
