//! One scheduler renews every lease: a single `DelayQueue` (not a task per
//! lease) firing at TTL/3 with jitter, with bounded concurrency toward the store.

use crate::backend::{Backend, BackendError, LeaseRef};
use crate::registry::Registry;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::time::{delay_queue, DelayQueue};

/// How many renewals may be in flight toward the backend at once.
const MAX_IN_FLIGHT: usize = 64;
/// The moment a holder stops trusting its lease: the send time of its last
/// successful write + TTL − a safety margin of TTL/6. Others may take the key
/// only after the store's clock passes that write + TTL + grace, so the margin
/// plus the grace is the time the run has to stop (`kill_grace` fits in it).
pub fn deadline(last_write_sent: Instant, ttl: Duration) -> Instant {
    last_write_sent + ttl - ttl / 6
}

enum Command {
    Start(LeaseRef, Duration, Instant),
    Stop(String),
}

/// The handle the registry uses to add and remove leases.
pub struct Renewals {
    commands: mpsc::UnboundedSender<Command>,
}

impl Renewals {
    /// Starts the scheduler task; it ends when the registry is dropped.
    pub fn start(backend: Arc<dyn Backend>, registry: Weak<Registry>) -> Renewals {
        let (commands, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(backend, registry, rx));
        Renewals { commands }
    }

    /// Renews `lease`, granted by a write sent at `sent`, every TTL/3 until stopped.
    pub fn start_lease(&self, lease: LeaseRef, ttl: Duration, sent: Instant) {
        let _ = self.commands.send(Command::Start(lease, ttl, sent));
    }

    /// Stops renewing a lease (idempotent).
    pub fn stop(&self, lease_id: &str) {
        let _ = self.commands.send(Command::Stop(lease_id.to_string()));
    }
}

struct Entry {
    lease: LeaseRef,
    ttl: Duration,
    /// Send time of the last successful renewal (or of the grant).
    last_ok: Instant,
    slot: Option<delay_queue::Key>,
}

impl Entry {
    fn deadline(&self) -> Instant {
        deadline(self.last_ok, self.ttl)
    }
}

fn period(ttl: Duration) -> Duration {
    (ttl / 3).mul_f64(0.9 + 0.2 * fastrand::f64())
}

enum Outcome {
    Renewed(Instant),
    /// The store says the lease is someone else's now.
    Lost,
    /// No renewal succeeded before the lease's deadline.
    Expired,
    Failed(String),
}

async fn run(
    backend: Arc<dyn Backend>,
    registry: Weak<Registry>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut queue: DelayQueue<String> = DelayQueue::new();
    let mut entries: HashMap<String, Entry> = HashMap::new();
    let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let (done_tx, mut done) = mpsc::unbounded_channel::<(String, Outcome)>();
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(Command::Start(lease, ttl, sent)) => {
                    let id = lease.lease_id.clone();
                    let slot = Some(queue.insert(id.clone(), period(ttl)));
                    entries.insert(id, Entry { lease, ttl, last_ok: sent, slot });
                }
                Some(Command::Stop(id)) => {
                    if let Some(Entry { slot: Some(slot), .. }) = entries.remove(&id) {
                        queue.remove(&slot);
                    }
                }
            },
            Some(due) = queue.next(), if !queue.is_empty() => {
                let id = due.into_inner();
                let Some(entry) = entries.get_mut(&id) else { continue };
                entry.slot = None;
                let (lease, ttl, deadline) = (entry.lease.clone(), entry.ttl, entry.deadline());
                let (backend, limit, done_tx) = (backend.clone(), limit.clone(), done_tx.clone());
                tokio::spawn(async move {
                    // A store that hangs must not keep a lease past its deadline.
                    let renewed = tokio::time::timeout_at(deadline, async {
                        let _permit = limit.acquire_owned().await;
                        let sent = Instant::now();
                        backend.renew(&lease, ttl).await.map(|()| sent)
                    });
                    let outcome = match renewed.await {
                        Ok(Ok(sent)) => Outcome::Renewed(sent),
                        Ok(Err(BackendError::LeaseMismatch)) => Outcome::Lost,
                        Ok(Err(err)) => Outcome::Failed(err.to_string()),
                        Err(_) => Outcome::Expired,
                    };
                    let _ = done_tx.send((lease.lease_id, outcome));
                });
            }
            Some((id, outcome)) = done.recv() => {
                let Some(entry) = entries.get_mut(&id) else { continue };
                let taken = match outcome {
                    Outcome::Renewed(sent) => {
                        entry.last_ok = sent;
                        entry.slot = Some(queue.insert(id.clone(), period(entry.ttl)));
                        continue;
                    }
                    Outcome::Lost => true,
                    Outcome::Expired => false,
                    Outcome::Failed(error) => {
                        let retry = Duration::from_millis(250).mul_f64(0.5 + fastrand::f64());
                        tracing::warn!(key = %entry.lease.key, %error, "renewal failed, retrying until the lease's deadline");
                        // The retry is raced against the deadline like any renewal.
                        entry.slot = Some(queue.insert(id.clone(), retry.min(entry.deadline() - Instant::now())));
                        continue;
                    }
                };
                let Some(entry) = entries.remove(&id) else { continue };
                let Some(registry) = registry.upgrade() else { return };
                tokio::spawn(async move { registry.renewal_lost(&entry.lease, taken).await });
            }
        }
    }
}
