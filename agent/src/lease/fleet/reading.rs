//! The fleet's waiters and refusals as a listing shows them: every other
//! agent's report as the store keeps it, and this agent's own as they are
//! now. Reports are written by agents anyone may run, so each is bounded,
//! its strings cut, and a report that cannot be read is left out.

use super::report::{AgentReport, Here, Keyed, MOST_REFUSALS, MOST_WAITERS, SILENT_FOR};
use crate::backend::history::Stamp;
use crate::backend::{Backend, ReportName};
use crate::lease::queue::Queues;
use crate::shown;
use runlock_protocol::{Key, Refusal, Waiter, MAX_LISTED_REFUSALS, MAX_LISTED_WAITERS};
use std::collections::HashMap;
use std::sync::Arc;
use tokio_util::task::TaskTracker;

/// The other agents' waiters and refusals, by key, as read once.
#[derive(Default)]
pub(in crate::lease) struct Reading {
    waiters: HashMap<Key, Vec<Waiter>>,
    refused: HashMap<Key, Vec<Refusal>>,
}

impl Reading {
    /// Reads every report. A store that cannot list them leaves them out
    /// (said in a warning): the keys are still listed.
    pub(super) async fn read(
        store: &Arc<dyn Backend>,
        own: Option<&ReportName>,
        tasks: &TaskTracker,
    ) -> Reading {
        let mut reading = Reading::default();
        let reports = match store.reports().await {
            Ok(reports) => reports,
            Err(err) => {
                tracing::warn!(
                    error = %err,
                    "could not read the agents' reports: listings show this agent's waiters \
                     and refusals only"
                );
                return reading;
            }
        };
        let now = Stamp::agent_now().at_ms;
        for stored in reports {
            if Some(&stored.agent) == own {
                continue; // this agent's own, as they are now, are added per key
            }
            let Some(report) = stored
                .body
                .ok()
                .and_then(|body| serde_json::from_slice::<AgentReport>(&body).ok())
            else {
                continue;
            };
            // Agents' clocks differ by seconds at most where this matters:
            // a day of silence, two minutes of waiting.
            if report.written_at_ms + SILENT_FOR.as_millis() as u64 <= now {
                remove_silent(store, stored.agent, tasks);
                continue;
            }
            reading.add(report, now);
        }
        reading
    }

    /// `key`'s waiters and refusals since `since_ms` (none without it),
    /// through every agent, this one's as `queues` and `here` say now: as
    /// the listing shows them, bounded.
    pub(in crate::lease) fn of(
        &self,
        key: &Key,
        since_ms: Option<u64>,
        queues: &Queues,
        here: &Here,
    ) -> (Vec<Waiter>, Vec<Refusal>) {
        let mut waiters: Vec<Waiter> = (queues.waiting_for(key).cloned())
            .chain(self.waiters.get(key).into_iter().flatten().cloned())
            .collect();
        waiters.sort_by_key(|w| w.since_ms);
        waiters.truncate(MAX_LISTED_WAITERS);
        let mut refused = match since_ms {
            Some(since) => (here.refusals.of(key, since).into_iter())
                .chain(
                    (self.refused.get(key).into_iter().flatten())
                        .filter(|r| r.at_ms >= since)
                        .cloned(),
                )
                .collect(),
            None => Vec::new(),
        };
        refused.sort_by_key(|r| r.at_ms);
        let skip = refused.len().saturating_sub(MAX_LISTED_REFUSALS);
        (waiters, refused.split_off(skip))
    }

    /// Adds what `report` says, its strings cut; its waiters only while
    /// they stand.
    fn add(&mut self, report: AgentReport, now_ms: u64) {
        let host = shown::cut(&report.host, shown::MAX_NAME_LEN);
        if now_ms <= report.waiters_until_ms {
            file_by_key(&mut self.waiters, report.waiters, MOST_WAITERS, &host);
        }
        file_by_key(&mut self.refused, report.refusals, MOST_REFUSALS, &host);
    }
}

/// Removes a report silent for a day, without holding up the listing.
fn remove_silent(store: &Arc<dyn Backend>, agent: ReportName, tasks: &TaskTracker) {
    let store = store.clone();
    tasks.spawn(async move {
        if let Err(err) = store.remove_report(&agent).await {
            tracing::debug!(%agent, error = %err, "could not remove a silent agent's report");
        }
    });
}

/// Files at most `most` of `items` under their keys, each shown as from
/// `host`; one whose key is not valid is left out.
fn file_by_key<T: Reported>(
    into: &mut HashMap<Key, Vec<T>>,
    items: Vec<Keyed<T>>,
    most: usize,
    host: &str,
) {
    for item in items.into_iter().take(most) {
        if let Ok(key) = Key::new(&item.key) {
            into.entry(key).or_default().push(item.of.shown_from(host));
        }
    }
}

/// A waiter or a refusal in another agent's report: shown with that agent's
/// host, and its user name cut.
trait Reported {
    fn shown_from(self, host: &str) -> Self;
}

impl Reported for Waiter {
    fn shown_from(self, host: &str) -> Self {
        let user = shown::cut(&self.user, shown::MAX_NAME_LEN);
        let host = host.to_string();
        Waiter { host, user, ..self }
    }
}

impl Reported for Refusal {
    fn shown_from(self, host: &str) -> Self {
        let user = shown::cut(&self.user, shown::MAX_NAME_LEN);
        let host = host.to_string();
        Refusal { host, user, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(written_at_ms: u64, waiters_until_ms: u64) -> AgentReport {
        AgentReport {
            host: "h".repeat(1000),
            written_at_ms,
            waiters_until_ms,
            waiters: vec![Keyed {
                key: "k".into(),
                of: Waiter {
                    host: "forged".into(),
                    uid: 7,
                    user: "u".into(),
                    pid: 9,
                    since_ms: 1,
                },
            }],
            refusals: vec![
                Keyed {
                    key: "k".into(),
                    of: Refusal {
                        at_ms: 5,
                        host: "forged".into(),
                        uid: 7,
                        user: "u".into(),
                        pid: 9,
                        waited_ms: 0,
                    },
                },
                Keyed {
                    key: "not a key\n".into(),
                    of: Refusal {
                        at_ms: 5,
                        host: String::new(),
                        uid: 7,
                        user: "u".into(),
                        pid: 9,
                        waited_ms: 0,
                    },
                },
            ],
        }
    }

    #[test]
    fn a_reports_waiters_stand_only_until_it_says_and_its_host_is_the_reports() {
        let key = Key::new("k").expect("valid");
        let mut reading = Reading::default();
        reading.add(report(0, 100), 50);
        let waiter = &reading.waiters[&key][0];
        assert!(waiter.host.len() <= shown::MAX_NAME_LEN, "cut");
        assert!(
            waiter.host.starts_with('h'),
            "the report's host, not the entry's"
        );
        assert_eq!(
            reading.refused[&key].len(),
            1,
            "the invalid key is left out"
        );

        let mut late = Reading::default();
        late.add(report(0, 100), 101);
        assert!(late.waiters.is_empty(), "its agent is gone");
        assert_eq!(late.refused[&key].len(), 1, "refusals stay for the day");
    }
}
