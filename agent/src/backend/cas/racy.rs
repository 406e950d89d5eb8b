//! A store that is atomic one request at a time but not under concurrency:
//! it checks a write's condition, then writes, in two steps, so writers that
//! all check before the first writes all succeed (as SeaweedFS, RustFS and
//! versitygw were found to do in 2026). The proof must refuse it
//! (`memory-cas://racy`, for the agent's tests). Its variant
//! `memory-cas://racy-under-load` writes in two steps only while more than
//! two writes are in flight, as a store whose window opens under load: the
//! start's proof trusts it, `check-config`'s must not.

use super::{CasError, CasResult, CasStore, MemoryCasStore, Names, Precondition, Read, Site};
use async_trait::async_trait;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Default)]
pub struct RacyCasStore {
    inner: MemoryCasStore,
    /// Writes in flight at once from which the check and the write come
    /// apart; 0: always.
    racy_from: usize,
    in_flight: AtomicUsize,
}

impl RacyCasStore {
    /// Racy only while more than two writes are in flight.
    pub fn under_load() -> RacyCasStore {
        RacyCasStore {
            racy_from: 3,
            ..RacyCasStore::default()
        }
    }

    /// Every object's name, for tests.
    #[cfg(test)]
    pub fn names(&self) -> Vec<String> {
        self.inner.names()
    }
}

/// Counts a write in flight for as long as it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl CasStore for RacyCasStore {
    fn site(&self) -> &Site {
        self.inner.site()
    }

    async fn probe(&self) -> CasResult<()> {
        Ok(())
    }

    async fn get(&self, name: &str) -> CasResult<Read> {
        self.inner.get(name).await
    }

    async fn put(&self, name: &str, body: Vec<u8>, when: Precondition<'_>) -> CasResult<String> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let _in_flight = InFlight(&self.in_flight);
        // The request's way to the store: the writes sent together arrive together.
        tokio::task::yield_now().await;
        let current = self.inner.get(name).await?.object.map(|o| o.version);
        if current.as_deref() != when.version() {
            return Err(CasError::Conflict);
        }
        if self.in_flight.load(Ordering::SeqCst) >= self.racy_from {
            // Between the check and the write, other requests go on.
            tokio::task::yield_now().await;
        }
        Ok(self.inner.overwrite(name, body))
    }

    async fn list(&self, prefix: &str, page: Option<&str>, limit: usize) -> CasResult<Names> {
        self.inner.list(prefix, page, limit).await
    }

    async fn delete(&self, name: &str) -> CasResult<()> {
        self.inner.delete(name).await
    }
}
