//! The timing decorator: every request of the backend inside it, timed
//! by operation and result.

use super::{Metrics, Operation};
use crate::backend::{
    AcquireSpec, Adopted, Adopter, Backend, BackendResult, Displaced, Ending, Grant, LeaseRef,
    ListPage, Listed, PageAsk, ProfiledBackend, Renewed, ReportName, Reports, StoredReport,
};
use async_trait::async_trait;
use runlock_protocol::{Key, KeyEvent, KeyRecord};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Wraps `store`'s backend so every request is timed into `metrics`. What
/// the store is stays as it was.
pub fn instrument(store: ProfiledBackend, metrics: Arc<Metrics>) -> ProfiledBackend {
    ProfiledBackend {
        backend: Arc::new(TimedBackend::new(store.backend, metrics)),
        profile: store.profile,
    }
}

/// A backend that times each request of the one inside it: every `Backend`
/// method is an operation, so the compiler sees that each is passed on.
pub struct TimedBackend {
    inner: Arc<dyn Backend>,
    metrics: Arc<Metrics>,
}

impl TimedBackend {
    /// Times `inner`'s requests into `metrics`.
    pub fn new(inner: Arc<dyn Backend>, metrics: Arc<Metrics>) -> TimedBackend {
        TimedBackend { inner, metrics }
    }
}

impl TimedBackend {
    /// `call`'s answer, its time noted under `operation`.
    async fn timed<T>(
        &self,
        operation: Operation,
        call: impl std::future::Future<Output = BackendResult<T>>,
    ) -> BackendResult<T> {
        let started = Instant::now();
        let result = call.await;
        self.metrics.backend_request(operation, started, &result);
        result
    }
}

#[async_trait]
impl Backend for TimedBackend {
    async fn acquire(&self, spec: &AcquireSpec) -> BackendResult<Grant> {
        self.timed(Operation::Acquire, self.inner.acquire(spec))
            .await
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Duration) -> BackendResult<Renewed> {
        self.timed(Operation::Renew, self.inner.renew(lease, ttl))
            .await
    }

    async fn end(&self, lease: &LeaseRef, ending: &Ending) -> BackendResult<()> {
        self.timed(Operation::Release, self.inner.end(lease, ending))
            .await
    }

    async fn inspect(&self, key: &Key) -> BackendResult<KeyRecord> {
        self.timed(Operation::Inspect, self.inner.inspect(key))
            .await
    }

    async fn history(&self, key: &Key) -> BackendResult<Vec<KeyEvent>> {
        self.timed(Operation::History, self.inner.history(key))
            .await
    }

    async fn list(&self, ask: PageAsk<'_>) -> BackendResult<ListPage> {
        self.timed(Operation::List, self.inner.list(ask)).await
    }

    async fn list_slots(&self, key: &Key) -> BackendResult<Option<Vec<Listed>>> {
        self.timed(Operation::List, self.inner.list_slots(key))
            .await
    }

    async fn adopt(&self, lease: &LeaseRef, by: &Adopter) -> BackendResult<Adopted> {
        self.timed(Operation::Adopt, self.inner.adopt(lease, by))
            .await
    }

    async fn confirm_stopped(&self, lease: &LeaseRef) -> BackendResult<()> {
        self.timed(Operation::Displaced, self.inner.confirm_stopped(lease))
            .await
    }

    async fn displaced_stopped(&self, key: &Key, displaced: &Displaced) -> BackendResult<bool> {
        self.timed(
            Operation::Displaced,
            self.inner.displaced_stopped(key, displaced),
        )
        .await
    }
}

#[async_trait]
impl Reports for TimedBackend {
    async fn put_report(&self, agent: &ReportName, body: Vec<u8>) -> BackendResult<()> {
        self.timed(Operation::Report, self.inner.put_report(agent, body))
            .await
    }

    async fn reports(&self) -> BackendResult<Vec<StoredReport>> {
        self.timed(Operation::Report, self.inner.reports()).await
    }

    async fn remove_report(&self, agent: &ReportName) -> BackendResult<()> {
        self.timed(Operation::Report, self.inner.remove_report(agent))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::super::exposition::value;
    use super::*;
    use crate::backend::{BackendError, MemoryBackend};
    use runlock_protocol::Holder;

    #[tokio::test]
    async fn the_decorator_times_each_backend_request_by_result() {
        let metrics = Arc::new(Metrics::new());
        let backend = TimedBackend::new(Arc::new(MemoryBackend::default()), metrics.clone());
        let key = Key::new("k").expect("valid");
        let spec = AcquireSpec {
            key: key.clone(),
            lease_id: "l1".into(),
            holder: Holder {
                slot: None,
                slots: None,
                host: "h".into(),
                agent_id: "a".into(),
                pid: 1,
                uid: 0,
                gid: 0,
                user: "root".into(),
                command: "test".into(),
                acquired_at_ms: 0,
                token: 0,
            },
            ttl: Duration::from_secs(30),
            force: false,
            breaking: false,
        };
        let grant = backend.acquire(&spec).await.expect("free");
        let again = AcquireSpec {
            lease_id: "l2".into(),
            ..spec
        };
        assert!(matches!(
            backend.acquire(&again).await,
            Err(BackendError::Held(..))
        ));
        backend.inspect(&key).await.expect("inspect");
        let lease = LeaseRef {
            key,
            lease_id: "l1".into(),
            token: grant.holder.token,
        };
        backend.release(&lease).await.expect("release");
        let text = metrics.render();
        let count = |op: &str, result: &str| {
            value(
                &text,
                &format!(
                    r#"runlock_backend_request_duration_seconds_count{{operation="{op}",result="{result}"}}"#
                ),
            )
        };
        assert_eq!(count("acquire", "ok"), Some(1.0), "{text}");
        assert_eq!(count("acquire", "held"), Some(1.0), "{text}");
        assert_eq!(count("inspect", "ok"), Some(1.0), "{text}");
        assert_eq!(count("release", "ok"), Some(1.0), "{text}");
        assert_eq!(count("renew", "ok"), Some(0.0), "{text}");
    }
}
