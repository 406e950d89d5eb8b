//! A store that is atomic one request at a time but not under concurrency:
//! it checks a write's condition, then writes, in two steps, so writers that
//! all check before the first writes all succeed (as SeaweedFS, RustFS and
//! versitygw were found to do in 2026). The proof must refuse it
//! (`memory-cas://racy`, for the agent's tests).

use super::{CasError, CasResult, CasStore, MemoryCasStore, Names, Precondition, Read, Site};
use async_trait::async_trait;

#[derive(Default)]
pub struct RacyCasStore {
    inner: MemoryCasStore,
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
        let current = self.inner.get(name).await?.object.map(|o| o.version);
        if current.as_deref() != when.version() {
            return Err(CasError::Conflict);
        }
        // Between the check and the write, other requests go on.
        tokio::task::yield_now().await;
        Ok(self.inner.overwrite(name, body))
    }

    async fn list(&self, prefix: &str, page: Option<&str>, limit: usize) -> CasResult<Names> {
        self.inner.list(prefix, page, limit).await
    }

    async fn delete(&self, name: &str) -> CasResult<()> {
        self.inner.delete(name).await
    }
}
