//! The timing decorator: every request of the backend inside it, timed
//! by operation and result.

use super::{Metrics, Operation, GLOBAL};
use crate::backend::{
    AcquireSpec, Adopted, Adopter, Backend, BackendResult, Displaced, Ending, Grant, LeaseRef,
    ListPage, PageAsk, ProfiledBackend, Renewed, ReportName, StoredReport,
};
use async_trait::async_trait;
use runlock_protocol::{Key, KeyEvent, KeyRecord};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Wraps `store`'s backend so every request is timed, once [`start`] has run;
/// otherwise returns it as it is. What the store is stays as it was.
pub fn instrument(store: ProfiledBackend) -> ProfiledBackend {
    match GLOBAL.get() {
        Some(metrics) => ProfiledBackend {
            backend: Arc::new(TimedBackend {
                inner: store.backend,
                metrics: metrics.clone(),
            }),
            profile: store.profile,
        },
        None => store,
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

#[async_trait]
impl Backend for TimedBackend {
    async fn acquire(&self, spec: &AcquireSpec) -> BackendResult<Grant> {
        let started = Instant::now();
        let result = self.inner.acquire(spec).await;
        self.metrics
            .backend_request(Operation::Acquire, started, &result);
        result
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Duration) -> BackendResult<Renewed> {
        let started = Instant::now();
        let result = self.inner.renew(lease, ttl).await;
        self.metrics
            .backend_request(Operation::Renew, started, &result);
        result
    }

    async fn end(&self, lease: &LeaseRef, ending: &Ending) -> BackendResult<()> {
        let started = Instant::now();
        let result = self.inner.end(lease, ending).await;
        self.metrics
            .backend_request(Operation::Release, started, &result);
        result
    }

    async fn inspect(&self, key: &Key) -> BackendResult<KeyRecord> {
        let started = Instant::now();
        let result = self.inner.inspect(key).await;
        self.metrics
            .backend_request(Operation::Inspect, started, &result);
        result
    }

    async fn history(&self, key: &Key) -> BackendResult<Vec<KeyEvent>> {
        let started = Instant::now();
        let result = self.inner.history(key).await;
        self.metrics
            .backend_request(Operation::History, started, &result);
        result
    }

    async fn list(&self, ask: PageAsk<'_>) -> BackendResult<ListPage> {
        let started = Instant::now();
        let result = self.inner.list(ask).await;
        self.metrics
            .backend_request(Operation::List, started, &result);
        result
    }

    async fn adopt(&self, lease: &LeaseRef, by: &Adopter) -> BackendResult<Adopted> {
        let started = Instant::now();
        let result = self.inner.adopt(lease, by).await;
        self.metrics
            .backend_request(Operation::Adopt, started, &result);
        result
    }

    async fn confirm_stopped(&self, lease: &LeaseRef) -> BackendResult<()> {
        let started = Instant::now();
        let result = self.inner.confirm_stopped(lease).await;
        self.metrics
            .backend_request(Operation::Displaced, started, &result);
        result
    }

    async fn displaced_stopped(&self, key: &Key, displaced: &Displaced) -> BackendResult<bool> {
        let started = Instant::now();
        let result = self.inner.displaced_stopped(key, displaced).await;
        self.metrics
            .backend_request(Operation::Displaced, started, &result);
        result
    }

    async fn put_report(&self, agent: &ReportName, body: Vec<u8>) -> BackendResult<()> {
        let started = Instant::now();
        let result = self.inner.put_report(agent, body).await;
        self.metrics
            .backend_request(Operation::Report, started, &result);
        result
    }

    async fn reports(&self) -> BackendResult<Vec<StoredReport>> {
        let started = Instant::now();
        let result = self.inner.reports().await;
        self.metrics
            .backend_request(Operation::Report, started, &result);
        result
    }

    async fn remove_report(&self, agent: &ReportName) -> BackendResult<()> {
        let started = Instant::now();
        let result = self.inner.remove_report(agent).await;
        self.metrics
            .backend_request(Operation::Report, started, &result);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::value;
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
