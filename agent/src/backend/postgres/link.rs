//! One connection kept while it is used, and let go once it is not: an agent
//! with nothing to do holds no connection, so a fleet larger than the
//! server's `max_connections` is served in turns (issue 28).

use crate::backend::StoreContext;
use crate::unpoisoned::Unpoisoned;
use std::future::Future;
use std::sync::{Arc, Mutex as SyncMutex, Weak};
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_postgres::Client;

/// A connection unused this long is closed. Longer than a waiter's longest
/// pause between tries (the default `poll_interval`, jittered), so an agent
/// with a waiter keeps its connection, and with it its `LISTEN`.
pub const IDLE_CLOSE: Duration = Duration::from_secs(2);

/// A live connection.
pub struct Link {
    /// The client.
    pub client: Client,
    /// The task that drives the connection: stopped with the link, so a
    /// connection to a server that stopped answering does not linger.
    driver: tokio::task::AbortHandle,
    last_used: SyncMutex<Instant>,
    /// Let go for being idle: the driver is left to say goodbye to the server
    /// (it ends once the client is gone) rather than cut off mid-word.
    idle: std::sync::atomic::AtomicBool,
}

impl Link {
    /// `client`, driven by the task `driver`.
    pub fn new(client: Client, driver: tokio::task::AbortHandle) -> Link {
        Link {
            client,
            driver,
            last_used: SyncMutex::new(Instant::now()),
            idle: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn touch(&self) {
        *self.last_used.locked() = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used.locked().elapsed()
    }
}

impl std::ops::Deref for Link {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if !self.idle.load(std::sync::atomic::Ordering::Relaxed) {
            self.driver.abort();
        }
    }
}

/// The slot of the one connection, made on demand and closed when idle.
#[derive(Default)]
pub struct Kept {
    slot: Arc<Mutex<Option<Arc<Link>>>>,
}

/// A link handed out for one operation: the link counts as used until it is dropped.
pub struct InUse(Arc<Link>);

impl std::ops::Deref for InUse {
    type Target = Arc<Link>;
    fn deref(&self) -> &Arc<Link> {
        &self.0
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.touch();
    }
}

impl Kept {
    /// The current connection, or one `connect` makes (closed when idle by a
    /// task of `context`'s).
    pub async fn get<E, Fut>(
        &self,
        context: &StoreContext,
        connect: impl FnOnce() -> Fut,
    ) -> Result<InUse, E>
    where
        Fut: Future<Output = Result<Link, E>>,
    {
        let mut slot = self.slot.lock().await;
        if let Some(link) = slot.as_ref().filter(|l| !l.client.is_closed()) {
            link.touch();
            return Ok(InUse(link.clone()));
        }
        *slot = None;
        let link = Arc::new(connect().await?);
        *slot = Some(link.clone());
        context.spawn_until_closing(close_when_idle(
            Arc::downgrade(&self.slot),
            Arc::downgrade(&link),
        ));
        Ok(InUse(link))
    }

    /// Drops `link` if it is still the current one, so the next use reconnects.
    pub async fn forget(&self, link: &Arc<Link>) {
        let mut slot = self.slot.lock().await;
        if slot
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, link))
        {
            *slot = None;
        }
    }
}

/// Closes `link` once no operation has used it for [`IDLE_CLOSE`]; ends
/// early if it is replaced or the slot goes.
async fn close_when_idle(slot: Weak<Mutex<Option<Arc<Link>>>>, link: Weak<Link>) {
    loop {
        let idle_for = match link.upgrade() {
            Some(link) => link.idle_for(),
            None => return,
        };
        tokio::time::sleep(IDLE_CLOSE.saturating_sub(idle_for) + Duration::from_millis(10)).await;
        let (Some(slot), Some(link)) = (slot.upgrade(), link.upgrade()) else {
            return;
        };
        let mut slot = slot.lock().await;
        if !slot
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, &link))
        {
            return;
        }
        // Held by the slot and by us only: no operation has it.
        if Arc::strong_count(&link) == 2 && link.idle_for() >= IDLE_CLOSE {
            link.idle.store(true, std::sync::atomic::Ordering::Relaxed);
            *slot = None;
            tracing::debug!("closed the idle PostgreSQL connection");
            return;
        }
    }
}
