//! What a store is handed when it is opened: where its tasks run, when they
//! must end, and whom it tells what it saw. A store reaches nothing else of
//! the agent.

use std::future::Future;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What a store reports beside its answers (the agent's metrics implement it).
pub trait StoreObserver: Send + Sync {
    /// `store` (`s3`, `gcs`, `azure` or `postgresql`) answered "slow down";
    /// the request is retried.
    fn throttled(&self, store: &'static str);
}

/// Sees nothing: for check-config and tests.
pub struct Unobserved;

impl StoreObserver for Unobserved {
    fn throttled(&self, _: &'static str) {}
}

/// A store's share of the agent.
#[derive(Clone)]
pub struct StoreContext {
    /// Every task the store starts, waited for at shutdown.
    tasks: TaskTracker,
    /// Cancelled at shutdown once no lease needs the store any more.
    closing: CancellationToken,
    /// Told what the store saw.
    pub observer: Arc<dyn StoreObserver>,
}

impl Default for StoreContext {
    fn default() -> StoreContext {
        StoreContext::new(Arc::new(Unobserved))
    }
}

impl StoreContext {
    /// A context whose store tells `observer`.
    pub fn new(observer: Arc<dyn StoreObserver>) -> StoreContext {
        StoreContext {
            tasks: TaskTracker::new(),
            closing: CancellationToken::new(),
            observer,
        }
    }

    /// Runs `task` to its end, even past closing: for a write, which is
    /// never cut short, but which has its own timeout.
    pub fn spawn<F>(&self, task: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task)
    }

    /// Runs `task` until it ends or the store is closing, whichever is first.
    pub fn spawn_until_closing<F>(&self, task: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let closing = self.closing.clone();
        self.tasks.spawn(async move {
            closing.run_until_cancelled_owned(task).await;
        })
    }

    /// A token cancelled once the store is closing (or by its holder).
    pub fn closing(&self) -> CancellationToken {
        self.closing.child_token()
    }

    /// Tells the store's tasks to end and waits for them until `deadline`;
    /// returns how many are still running.
    pub async fn close(&self, deadline: Instant) -> usize {
        self.closing.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout_at(deadline, self.tasks.wait()).await;
        self.tasks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn closing_ends_the_waiting_tasks_and_waits_for_the_writes() {
        let context = StoreContext::default();
        let waiting = context.spawn_until_closing(std::future::pending());
        let (wrote, written) = tokio::sync::oneshot::channel();
        context.spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let _ = wrote.send(());
        });
        let started = Instant::now();
        assert_eq!(context.close(started + Duration::from_secs(5)).await, 0);
        assert!(waiting.is_finished());
        assert_eq!(written.await, Ok(()));
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_past_the_deadline_is_counted_not_awaited() {
        let context = StoreContext::default();
        context.spawn(tokio::time::sleep(Duration::from_secs(60)));
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(context.close(deadline).await, 1);
        assert_eq!(Instant::now(), deadline);
    }
}
