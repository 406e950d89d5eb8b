//! A backend that passes every request on to another, but for what its
//! [`Hooks`] do in place of `acquire` or `end`: the decorators that change
//! one request (Meltano's guard, the tests' staged stores) write only that one.

use super::{
    AcquireSpec, Adopted, Adopter, Backend, BackendResult, Displaced, Ending, Grant, LeaseRef,
    ListPage, Listed, PageAsk, Profile, Profiled, ProfiledBackend, Renewed, ReportName, Reports,
    StoredReport,
};
use async_trait::async_trait;
use runlock_protocol::{Key, KeyEvent, KeyRecord};
use std::time::Duration;

/// `inner`, with `hooks` in front of it.
pub(crate) struct Forwarding<H> {
    pub(crate) inner: ProfiledBackend,
    pub(crate) hooks: H,
}

/// What a [`Forwarding`] backend does in place of passing a request on; by
/// default, it passes it on.
#[async_trait]
pub(crate) trait Hooks: Send + Sync + 'static {
    async fn acquire(&self, inner: &dyn Backend, spec: &AcquireSpec) -> BackendResult<Grant> {
        inner.acquire(spec).await
    }

    async fn end(
        &self,
        inner: &dyn Backend,
        lease: &LeaseRef,
        ending: &Ending,
    ) -> BackendResult<()> {
        inner.end(lease, ending).await
    }

    /// What the backend is, given what `inner` is.
    fn profile(&self, inner: Profile) -> Profile {
        inner
    }
}

impl<H: Hooks> Profiled for Forwarding<H> {
    fn profile(&self) -> Profile {
        self.hooks.profile(self.inner.profile.clone())
    }
}

#[async_trait]
impl<H: Hooks> Backend for Forwarding<H> {
    async fn acquire(&self, spec: &AcquireSpec) -> BackendResult<Grant> {
        self.hooks.acquire(&*self.inner.backend, spec).await
    }

    async fn renew(&self, lease: &LeaseRef, ttl: Duration) -> BackendResult<Renewed> {
        self.inner.backend.renew(lease, ttl).await
    }

    async fn end(&self, lease: &LeaseRef, ending: &Ending) -> BackendResult<()> {
        self.hooks.end(&*self.inner.backend, lease, ending).await
    }

    async fn inspect(&self, key: &Key) -> BackendResult<KeyRecord> {
        self.inner.backend.inspect(key).await
    }

    async fn history(&self, key: &Key) -> BackendResult<Vec<KeyEvent>> {
        self.inner.backend.history(key).await
    }

    async fn list(&self, ask: PageAsk<'_>) -> BackendResult<ListPage> {
        self.inner.backend.list(ask).await
    }

    async fn list_slots(&self, key: &Key) -> BackendResult<Option<Vec<Listed>>> {
        self.inner.backend.list_slots(key).await
    }

    async fn adopt(&self, lease: &LeaseRef, by: &Adopter) -> BackendResult<Adopted> {
        self.inner.backend.adopt(lease, by).await
    }

    async fn confirm_stopped(&self, lease: &LeaseRef) -> BackendResult<()> {
        self.inner.backend.confirm_stopped(lease).await
    }

    async fn displaced_stopped(&self, key: &Key, displaced: &Displaced) -> BackendResult<bool> {
        self.inner.backend.displaced_stopped(key, displaced).await
    }
}

#[async_trait]
impl<H: Hooks> Reports for Forwarding<H> {
    async fn put_report(&self, agent: &ReportName, body: Vec<u8>) -> BackendResult<()> {
        self.inner.backend.put_report(agent, body).await
    }

    async fn reports(&self) -> BackendResult<Vec<StoredReport>> {
        self.inner.backend.reports().await
    }

    async fn remove_report(&self, agent: &ReportName) -> BackendResult<()> {
        self.inner.backend.remove_report(agent).await
    }
}
