//! This agent's report in the store: what only it knows of the fleet's
//! keys (the runs waiting through it, the acquires it refused), so that a
//! listing through any agent shows them (`reading`). Written when it
//! changed, at most every [`SPACING`]; rewritten while runs wait, so that a
//! reader can tell an agent gone from one whose waiters still wait; never
//! written by an agent nothing happened on.

use super::refusals::Refusals;
use crate::backend::history::Stamp;
use crate::backend::{Backend, ReportName, MAX_REPORT_LEN};
use crate::lease::queue::Queues;
use runlock_protocol::{Key, Refusal, Waiter};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Writes of one report are at least this far apart: a busy agent costs
/// the store one write per this interval, and a change shows within it.
pub(super) const SPACING: Duration = Duration::from_secs(5);
/// While runs wait, the report is written again this often, and says its
/// waiters stand for twice as long: past that, its agent is gone.
const WAITERS_REWRITTEN: Duration = Duration::from_secs(60);
/// A report with refusals is written again this often even when nothing
/// changed, so that only the report of an agent gone falls silent for…
const KEPT_ALIVE: Duration = Duration::from_secs(6 * 60 * 60);
/// …this long, after which any agent listing removes it: its refusals are
/// past the day a listing shows.
pub(super) const SILENT_FOR: Duration = Duration::from_secs(25 * 60 * 60);
/// A report holds at most this many waiters, the longest waiting first…
pub(super) const MOST_WAITERS: usize = 1000;
/// …and this many refusals, the newest.
pub(super) const MOST_REFUSALS: usize = 1000;
/// After a failed write, the next try waits this long.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// One agent's report, as JSON in the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct AgentReport {
    /// The agent's host.
    pub(super) host: String,
    /// When it was written, by its agent's clock (ms since the epoch).
    pub(super) written_at_ms: u64,
    /// Until when its waiters stand, by its agent's clock: the agent writes
    /// again before then while any wait.
    pub(super) waiters_until_ms: u64,
    #[serde(default)]
    pub(super) waiters: Vec<Keyed<Waiter>>,
    /// The acquires refused in the last day, oldest first.
    #[serde(default)]
    pub(super) refusals: Vec<Keyed<Refusal>>,
}

/// A waiter or refusal with the key it was for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Keyed<T> {
    pub(super) key: String,
    #[serde(flatten)]
    pub(super) of: T,
}

impl AgentReport {
    fn is_empty(&self) -> bool {
        self.waiters.is_empty() && self.refusals.is_empty()
    }
}

/// What this agent's report is made of, kept under the registry's lock
/// beside the waiter queues it lists: the acquires refused here, and a
/// count of changes, told to the writer.
#[derive(Default)]
pub(in crate::lease) struct Here {
    pub(super) refusals: Refusals,
    generation: u64,
    changed: Arc<Notify>,
}

/// What the report says as it stands, and the change it reflects.
pub(in crate::lease) struct Said {
    generation: u64,
    waiters: Vec<Keyed<Waiter>>,
    refusals: Vec<Keyed<Refusal>>,
}

impl Here {
    /// What the report says has changed (a waiter came or went).
    pub(in crate::lease) fn changed(&mut self) {
        self.generation += 1;
        self.changed.notify_one();
    }

    /// An acquire of `key` (a key with slots: its base) was refused.
    pub(in crate::lease) fn refused(&mut self, key: Key, refusal: Refusal) {
        self.refusals.note(key, refusal);
        self.changed();
    }

    /// Told at each change: the writer waits on it.
    pub(in crate::lease) fn on_change(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    /// What the report says now, with the waiters of `queues`.
    pub(in crate::lease) fn said(&self, queues: &Queues) -> Said {
        let mut waiters: Vec<Keyed<Waiter>> = (queues.every_waiter())
            .map(|(key, who)| Keyed {
                key: key.to_string(),
                of: who.clone(),
            })
            .collect();
        waiters.sort_by_key(|w| w.of.since_ms);
        waiters.truncate(MOST_WAITERS);
        let refusals = (self.refusals.newest(MOST_REFUSALS).into_iter())
            .map(|(key, refusal)| Keyed {
                key: key.to_string(),
                of: refusal,
            })
            .collect();
        Said {
            generation: self.generation,
            waiters,
            refusals,
        }
    }
}

/// Writes one agent's report to the store.
pub(super) struct Writer {
    pub(super) store: Arc<dyn Backend>,
    pub(super) host: String,
    pub(super) own: ReportName,
}

impl Writer {
    /// Writes what `here` says whenever `changed` is told, paced, until
    /// `closing` (or until `here` says nothing: its registry is gone); then
    /// once more, if it changed, so that its waiters, gone with their
    /// connections, are not shown.
    pub(super) async fn run(
        self,
        here: impl Fn() -> Option<Said>,
        changed: Arc<Notify>,
        closing: CancellationToken,
    ) {
        let mut published = 0;
        let mut last_write: Option<Instant> = None;
        // When the report must be written even if nothing changed.
        let mut rewrite_at: Option<Instant> = None;
        loop {
            let rewrite = async {
                match rewrite_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let last = tokio::select! {
                _ = closing.cancelled() => true,
                _ = changed.notified() => false,
                _ = rewrite => false,
            };
            if !last {
                if let Some(at) = last_write {
                    tokio::select! {
                        _ = closing.cancelled() => {}
                        _ = tokio::time::sleep_until(at + SPACING) => {}
                    }
                }
            }
            let now = Stamp::agent_now().at_ms;
            let Some(said) = here() else {
                return;
            };
            let report = AgentReport {
                host: self.host.clone(),
                written_at_ms: now,
                waiters_until_ms: now + 2 * WAITERS_REWRITTEN.as_millis() as u64,
                waiters: said.waiters,
                refusals: said.refusals,
            };
            let due =
                said.generation != published || rewrite_at.is_some_and(|at| at <= Instant::now());
            if due {
                rewrite_at = match self.write(&report).await {
                    Ok(()) => {
                        published = said.generation;
                        last_write = Some(Instant::now());
                        if !report.waiters.is_empty() {
                            Some(Instant::now() + WAITERS_REWRITTEN)
                        } else if !report.is_empty() {
                            Some(Instant::now() + KEPT_ALIVE)
                        } else {
                            None
                        }
                    }
                    Err(()) => Some(Instant::now() + RETRY_AFTER),
                };
            }
            if last || closing.is_cancelled() {
                return;
            }
        }
    }

    async fn write(&self, report: &AgentReport) -> Result<(), ()> {
        let body = serde_json::to_vec(report).map_err(|_| ())?;
        if body.len() > MAX_REPORT_LEN {
            tracing::warn!(
                bytes = body.len(),
                "this agent's report is too long to write"
            );
            return Err(());
        }
        match self.store.put_report(&self.own, body).await {
            Ok(()) => Ok(()),
            Err(err) => {
                tracing::warn!(
                    error = %err,
                    "could not write this agent's report of its waiters and refusals; \
                     listings through other agents miss them until it is written"
                );
                Err(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Reports, StoredReport};
    use crate::lease::testing::*;
    use crate::lease::KeysQuery;

    /// The reports `store` keeps, once `done` says they are as awaited.
    async fn reports_once(
        store: &MemoryBackend,
        done: impl Fn(&[StoredReport]) -> bool,
    ) -> Vec<StoredReport> {
        let wait = async {
            loop {
                let reports = store.reports().await.expect("memory answers");
                if done(&reports) {
                    return reports;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("the reports became as awaited")
    }

    fn since_ever() -> KeysQuery {
        KeysQuery {
            prefix: String::new(),
            cursor: None,
            free: false,
            events_since_ms: Some(0),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_agent_nothing_happened_on_writes_no_report() {
        let store = Arc::new(MemoryBackend::default());
        let registry = agent(store.clone(), "agent-1");
        let (conn, _events) = connect(&registry, ROOT);
        take(&registry, conn, &["k"]).await.expect("free");
        tokio::time::sleep(KEPT_ALIVE * 2).await;
        assert!(store.reports().await.expect("memory").is_empty());
    }

    #[tokio::test]
    async fn a_refusal_through_one_agent_is_listed_through_another() {
        let store = Arc::new(MemoryBackend::default());
        let (one, two) = (
            agent(store.clone(), "agent-1"),
            agent(store.clone(), "agent-2"),
        );
        let (holder, _e1) = connect(&one, ROOT);
        take(&one, holder, &["k"]).await.expect("free");
        let (refused, _e2) = connect(&two, ROOT);
        assert!(take(&two, refused, &["k"]).await.is_err(), "held");
        let reports = reports_once(&store, |r| !r.is_empty()).await;
        assert_eq!(reports[0].agent.as_str(), "agent-2");

        let page = one
            .list_keys_for(holder, since_ever())
            .await
            .expect("listed");
        let refusals = &page.keys[0].refused;
        assert_eq!(refusals.len(), 1, "{refusals:?}");
        assert_eq!(refusals[0].host, "test-host");
        let through_two = two
            .list_keys_for(refused, since_ever())
            .await
            .expect("listed");
        assert_eq!(
            &through_two.keys[0].refused, refusals,
            "the refusing agent shows its own once, not again from its report"
        );
    }

    #[tokio::test]
    async fn a_report_silent_for_a_day_is_removed_by_a_listing() {
        let store = Arc::new(MemoryBackend::default());
        let silent = ReportName::new("gone").expect("plain");
        let old = AgentReport {
            host: "old-host".into(),
            written_at_ms: 1,
            ..AgentReport::default()
        };
        let body = serde_json::to_vec(&old).expect("serializes");
        store.put_report(&silent, body).await.expect("memory");
        let registry = agent(store.clone(), "agent-1");
        let (conn, _events) = connect(&registry, ROOT);
        registry
            .list_keys_for(conn, since_ever())
            .await
            .expect("listed");
        reports_once(&store, |r| r.is_empty()).await;
    }
}
