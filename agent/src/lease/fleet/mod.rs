//! Fleet reporting: what only this agent knows of the fleet's keys (the runs
//! waiting through it, the acquires it refused) written to the store as its
//! report (`report`), and every agent's reports read back for listings
//! (`reading`). It knows the store and this agent's name, not the registry:
//! the registry keeps [`Here`] under its lock beside the waiter queues, and
//! hands the writer what they say.

mod reading;
mod refusals;
mod report;

pub(super) use reading::Reading;
pub(super) use report::{Here, Said};

use crate::backend::{Backend, ReportName};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long one reading of the reports serves listings: the pages of one
/// listing, and the tabs of the page, cost the store one reading, while a
/// report changes at most once per `report::SPACING` anyway.
const FRESH_FOR: Duration = Duration::from_secs(2);

/// This agent's side of the fleet's reports: its own report's writer, and
/// the latest reading of everyone's.
pub(super) struct Fleet {
    store: Arc<dyn Backend>,
    host: String,
    /// This agent's report's name: `None` for an agent id no store may name.
    own: Option<ReportName>,
    /// Owns the writer and the removals of silent reports.
    tasks: TaskTracker,
    /// The latest reading, and when it was read; held while a reading
    /// runs, so that listings at once wait for one instead of each
    /// starting their own.
    last: tokio::sync::Mutex<Option<(Instant, Arc<Reading>)>>,
}

impl Fleet {
    /// The reports of the agent `agent_id` on `host`, kept in `store`; the
    /// tasks it starts belong to `tasks`.
    pub(super) fn new(
        store: Arc<dyn Backend>,
        host: &str,
        agent_id: &str,
        tasks: TaskTracker,
    ) -> Fleet {
        Fleet {
            store,
            host: host.to_string(),
            own: ReportName::new(agent_id),
            tasks,
            last: Default::default(),
        }
    }

    /// Starts writing this agent's report: what `here` says (`None` once
    /// the registry is gone), each time `changed` is told, until `closing`.
    pub(super) fn publish(
        &self,
        here: impl Fn() -> Option<Said> + Send + 'static,
        changed: Arc<Notify>,
        closing: CancellationToken,
    ) {
        let Some(own) = self.own.clone() else {
            return;
        };
        let writer = report::Writer {
            store: self.store.clone(),
            host: self.host.clone(),
            own,
        };
        self.tasks.spawn(writer.run(here, changed, closing));
    }

    /// What the other agents' reports say, read again once [`FRESH_FOR`]
    /// old.
    pub(super) async fn reading(&self) -> Arc<Reading> {
        let mut last = self.last.lock().await;
        if let Some((at, reading)) = last.as_ref() {
            if at.elapsed() < FRESH_FOR {
                return reading.clone();
            }
        }
        let reading = Reading::read(&self.store, self.own.as_ref(), &self.tasks).await;
        let reading = Arc::new(reading);
        *last = Some((Instant::now(), reading.clone()));
        reading
    }
}
