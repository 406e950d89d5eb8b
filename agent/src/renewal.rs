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
/// A lease is given up this long before its TTL runs out since the last good renewal.
const SAFETY_MARGIN_SHARE: u32 = 6;

enum Command {
    Start(LeaseRef, Duration),
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

    /// Renews `lease` every TTL/3 until stopped.
    pub fn start_lease(&self, lease: LeaseRef, ttl: Duration) {
        let _ = self.commands.send(Command::Start(lease, ttl));
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
        self.last_ok + self.ttl - self.ttl / SAFETY_MARGIN_SHARE
    }
}

fn period(ttl: Duration) -> Duration {
    (ttl / 3).mul_f64(0.9 + 0.2 * fastrand::f64())
}

enum Outcome {
    Renewed(Instant),
    Lost,
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
                Some(Command::Start(lease, ttl)) => {
                    let id = lease.lease_id.clone();
                    let slot = Some(queue.insert(id.clone(), period(ttl)));
                    entries.insert(id, Entry { lease, ttl, last_ok: Instant::now(), slot });
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
                let (lease, ttl) = (entry.lease.clone(), entry.ttl);
                let (backend, limit, done_tx) = (backend.clone(), limit.clone(), done_tx.clone());
                tokio::spawn(async move {
                    let Ok(_permit) = limit.acquire_owned().await else { return };
                    let sent = Instant::now();
                    let outcome = match backend.renew(&lease, ttl).await {
                        Ok(()) => Outcome::Renewed(sent),
                        Err(BackendError::LeaseMismatch) => Outcome::Lost,
                        Err(err) => Outcome::Failed(err.to_string()),
                    };
                    let _ = done_tx.send((lease.lease_id, outcome));
                });
            }
            Some((id, outcome)) = done.recv() => {
                let Some(entry) = entries.get_mut(&id) else { continue };
                let lost = match outcome {
                    Outcome::Renewed(sent) => {
                        entry.last_ok = sent;
                        entry.slot = Some(queue.insert(id.clone(), period(entry.ttl)));
                        false
                    }
                    Outcome::Lost => true,
                    Outcome::Failed(error) => {
                        let retry = Duration::from_millis(250).mul_f64(0.5 + fastrand::f64());
                        if Instant::now() + retry >= entry.deadline() {
                            tracing::warn!(key = %entry.lease.key, %error, "renewal failed until the lease's deadline");
                            true
                        } else {
                            tracing::warn!(key = %entry.lease.key, %error, "renewal failed, retrying");
                            entry.slot = Some(queue.insert(id.clone(), retry));
                            false
                        }
                    }
                };
                if lost {
                    let Some(entry) = entries.remove(&id) else { continue };
                    let Some(registry) = registry.upgrade() else { return };
                    tokio::spawn(async move { registry.renewal_lost(&entry.lease).await });
                }
            }
        }
    }
}
