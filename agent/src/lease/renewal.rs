//! One scheduler renews every lease: a single `DelayQueue` (not a task per
//! lease) firing at TTL/3 with jitter, with bounded concurrency toward the
//! store. The renewals in flight are futures of the scheduler's own task, not
//! tasks of their own: at 100,000 leases, spawning one per renewal (and
//! waking a worker for it) cost more than the renewals themselves.
//! Where a held lease cannot expire (a kernel lock), the same checks only
//! look for a force: they have no deadline, and a late or failed one loses
//! nothing. It knows nothing of the registry: it reports renewals and losses
//! on a channel its owner drains ([`Report`]).

use super::observer::{Observer, Renewal};
use crate::backend::{Backend, BackendError, LeaseRef};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use runlock_protocol::timing;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::time::{delay_queue, DelayQueue};

/// How many renewals may be in flight toward the backend at once.
const MAX_IN_FLIGHT: usize = 64;
/// The moment a holder stops trusting its lease (`timing`: why it is safe).
pub fn deadline(last_write_sent: Instant, ttl: Duration) -> Instant {
    last_write_sent + timing::trusted_for(ttl)
}

/// How often the scheduler logs how late its renewals went out.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// How late renewals go out, in power-of-two millisecond buckets.
#[derive(Default)]
struct Lateness {
    buckets: [u64; 16],
    max: Duration,
}

impl Lateness {
    fn record(&mut self, late: Duration) {
        let ms = late.as_millis() as u64;
        let bucket = (u64::BITS - ms.leading_zeros()) as usize; // 0 ms → 0, 1 → 1, 2..3 → 2, …
        self.buckets[bucket.min(15)] += 1;
        self.max = self.max.max(late);
    }

    /// The bucket bound under which `q` of the samples fall, in milliseconds.
    fn quantile(counts: &[u64], q: f64) -> u64 {
        let total: u64 = counts.iter().sum();
        let mut seen = 0;
        for (bucket, count) in counts.iter().enumerate() {
            seen += count;
            if seen as f64 >= q * total as f64 {
                return if bucket == 0 { 1 } else { 1 << bucket };
            }
        }
        1 << 15
    }

    /// Logs the period's figures and starts a new period.
    fn report(&mut self, leases: usize) {
        let Lateness {
            buckets: counts,
            max,
        } = std::mem::take(self);
        let renewals: u64 = counts.iter().sum();
        if renewals > 0 {
            tracing::info!(
                leases,
                renewals,
                late_p50_ms = Self::quantile(&counts, 0.5),
                late_p99_ms = Self::quantile(&counts, 0.99),
                late_max_ms = max.as_secs_f64() * 1000.0,
                "renewal lateness over the last minute (bucket bounds)"
            );
        }
    }
}

enum Command {
    Start(LeaseRef, Duration, Instant),
    Stop(String),
    StopAll,
}

/// What the scheduler tells its owner, in the order it happened.
#[derive(Debug)]
pub enum Report {
    /// A lease was renewed; it may be trusted until `valid_until`.
    Renewed {
        lease_id: String,
        valid_until: Instant,
    },
    /// The scheduler gave a lease up: `taken` when the store says it is
    /// someone else's, otherwise its deadline passed without a renewal.
    Lost { lease: LeaseRef, taken: bool },
}

/// The handle the registry uses to add and remove leases.
pub struct Renewals {
    commands: mpsc::UnboundedSender<Command>,
}

impl Renewals {
    /// Starts the scheduler task on `tasks`, which reports on the receiver
    /// returned; it ends when this handle is dropped or `closing` is
    /// cancelled. `expires`: whether `backend`'s leases lapse unless renewed
    /// (`Capabilities::lease_expires`); `observer` is told of each renewal.
    pub fn start(
        backend: Arc<dyn Backend>,
        expires: bool,
        observer: Arc<dyn Observer>,
        tasks: &TaskTracker,
        closing: CancellationToken,
    ) -> (Renewals, mpsc::UnboundedReceiver<Report>) {
        let (commands, rx) = mpsc::unbounded_channel();
        let (reports, reported) = mpsc::unbounded_channel();
        tasks.spawn(run(backend, reports, rx, expires, observer, closing));
        (Renewals { commands }, reported)
    }

    /// Renews `lease`, granted by a write sent at `sent`, every TTL/3 until stopped.
    pub fn start_lease(&self, lease: LeaseRef, ttl: Duration, sent: Instant) {
        let _ = self.commands.send(Command::Start(lease, ttl, sent));
    }

    /// Stops renewing a lease (idempotent).
    pub fn stop(&self, lease_id: &str) {
        let _ = self.commands.send(Command::Stop(lease_id.to_string()));
    }

    /// Stops renewing every lease: the agent is handing them over.
    pub fn stop_all(&self) {
        let _ = self.commands.send(Command::StopAll);
    }
}

struct Entry {
    /// Shared with its renewal in flight, if any.
    lease: Arc<LeaseRef>,
    ttl: Duration,
    /// When the next renewal is meant to go out.
    due: Instant,
    /// Send time of the last successful renewal (or of the grant).
    last_ok: Instant,
    /// Renewals failed in a row since the last success.
    failures: u32,
    slot: Option<delay_queue::Key>,
}

impl Entry {
    /// `None` where the lease cannot expire.
    fn deadline(&self, expires: bool) -> Option<Instant> {
        expires.then(|| deadline(self.last_ok, self.ttl))
    }
}

fn period(ttl: Duration) -> Duration {
    timing::renewal_period(ttl).mul_f64(0.9 + 0.2 * fastrand::f64())
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
    reports: mpsc::UnboundedSender<Report>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    expires: bool,
    observer: Arc<dyn Observer>,
    closing: CancellationToken,
) {
    let mut queue: DelayQueue<String> = DelayQueue::new();
    let mut entries: HashMap<String, Entry> = HashMap::new();
    let mut in_flight = FuturesUnordered::new();
    let mut lateness = Lateness::default();
    let mut report = tokio::time::interval_at(Instant::now() + REPORT_EVERY, REPORT_EVERY);
    loop {
        tokio::select! {
            _ = closing.cancelled() => return,
            _ = report.tick() => lateness.report(entries.len()),
            command = commands.recv() => match command {
                None => return,
                Some(Command::Start(lease, ttl, sent)) => {
                    let id = lease.lease_id.clone();
                    let due = Instant::now() + period(ttl);
                    let slot = Some(queue.insert_at(id.clone(), due));
                    let lease = Arc::new(lease);
                    entries.insert(id, Entry { lease, ttl, due, last_ok: sent, failures: 0, slot });
                }
                Some(Command::Stop(id)) => {
                    if let Some(Entry { slot: Some(slot), .. }) = entries.remove(&id) {
                        queue.remove(&slot);
                    }
                }
                Some(Command::StopAll) => {
                    entries.clear();
                    queue.clear();
                }
            },
            // Past MAX_IN_FLIGHT, due renewals wait in the queue (and count as late).
            Some(due) = queue.next(), if !queue.is_empty() && in_flight.len() < MAX_IN_FLIGHT => {
                let id = due.into_inner();
                let Some(entry) = entries.get_mut(&id) else { continue };
                entry.slot = None;
                let sent = Instant::now();
                let late = sent.saturating_duration_since(entry.due);
                lateness.record(late);
                observer.renewal_sent(late);
                let (lease, ttl, deadline) = (entry.lease.clone(), entry.ttl, entry.deadline(expires));
                let backend = backend.clone();
                in_flight.push(async move {
                    let renew = backend.renew(&lease, ttl);
                    // A store that hangs must not keep a lease past its deadline.
                    let renewed = match deadline {
                        Some(deadline) => tokio::time::timeout_at(deadline, renew).await,
                        None => Ok(renew.await),
                    };
                    let outcome = match renewed {
                        Ok(Ok(renewed)) => Outcome::Renewed(renewed.since(sent)),
                        Ok(Err(BackendError::LeaseMismatch)) => Outcome::Lost,
                        Ok(Err(err)) => Outcome::Failed(err.to_string()),
                        Err(_) => Outcome::Expired,
                    };
                    (id, outcome)
                });
            }
            Some((id, outcome)) = in_flight.next(), if !in_flight.is_empty() => {
                let Some(entry) = entries.get_mut(&id) else { continue };
                let taken = match outcome {
                    Outcome::Renewed(sent) => {
                        observer.renewal_ended(Renewal::Ok);
                        entry.last_ok = sent;
                        if let Some(valid_until) = entry.deadline(expires) {
                            let _ = reports.send(Report::Renewed { lease_id: id.clone(), valid_until });
                        }
                        entry.failures = 0;
                        entry.due = Instant::now() + period(entry.ttl);
                        entry.slot = Some(queue.insert_at(id, entry.due));
                        continue;
                    }
                    Outcome::Lost => true,
                    Outcome::Expired => false,
                    Outcome::Failed(error) => {
                        observer.renewal_ended(Renewal::Retry);
                        // 250 ms doubling, jittered, never past a third of the TTL.
                        entry.failures += 1;
                        let backoff = Duration::from_millis(250) * 2u32.pow(entry.failures.min(8) - 1);
                        let retry = backoff.min(timing::renewal_period(entry.ttl)).mul_f64(0.5 + fastrand::f64());
                        tracing::warn!(key = %entry.lease.key.logged(), %error, "renewal failed, retrying until the lease's deadline (if it has one)");
                        // The retry is raced against the deadline like any renewal.
                        let retry_at = Instant::now() + retry;
                        entry.due = entry.deadline(expires).map_or(retry_at, |d| retry_at.min(d));
                        entry.slot = Some(queue.insert_at(id, entry.due));
                        continue;
                    }
                };
                observer.renewal_ended(Renewal::Lost);
                let Some(entry) = entries.remove(&id) else { continue };
                let lease = Arc::unwrap_or_clone(entry.lease);
                let _ = reports.send(Report::Lost { lease, taken });
            }
        }
    }
}
