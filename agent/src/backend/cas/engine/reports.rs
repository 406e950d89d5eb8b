//! Agents' reports on an object store: one object per agent beside the lock
//! records (`prefix/.runlock/agents/<agent id>.json`), written only by its
//! agent, read by every listing again only where the store's listing says
//! it changed.

use super::{unavailable, CasEngine, LIST_READS_IN_FLIGHT};
use crate::backend::cas::{CasError, Precondition, Read};
use crate::backend::{BackendResult, ReportName, Reports, StoredReport};
use async_trait::async_trait;
use futures::StreamExt;

/// Names asked of the store at once when listing reports.
const REPORTS_PAGE: usize = 1000;

/// Where reports live beside records under `records` (which ends in
/// `.runlock/locks/` on a real store): apart from the records, so that a
/// listing of keys never reads one.
pub(super) fn reports_under(records: &str) -> String {
    match records.strip_suffix("locks/") {
        Some(runlock) => format!("{runlock}agents/"),
        // A test store's records have no prefix: a dot name is never a key's.
        None => format!("{records}.agents/"),
    }
}

impl CasEngine {
    fn report_name(&self, agent: &ReportName) -> String {
        format!("{}{}", self.reports, agent.file_name())
    }
}

#[async_trait]
impl Reports for CasEngine {
    /// Writes this agent's report over its last: conditionally on the
    /// version it last wrote, as a put must name one; when that is stale (a
    /// report removed as silent, or one left by an agent before a restart)
    /// it reads the version there is and writes over that.
    async fn put_report(&self, agent: &ReportName, body: Vec<u8>) -> BackendResult<()> {
        let name = self.report_name(agent);
        let mut version = self.report_version.lock().await;
        let written = match self
            .store
            .put(
                &name,
                body.clone(),
                Precondition::replacing(version.as_deref()),
            )
            .await
        {
            Err(CasError::Conflict) => {
                let Read { object, .. } = self.store.get(&name).await.map_err(unavailable)?;
                let there = object.map(|o| o.version);
                self.store
                    .put(&name, body, Precondition::replacing(there.as_deref()))
                    .await
            }
            other => other,
        };
        *version = Some(written.map_err(unavailable)?);
        Ok(())
    }

    /// Every report the store keeps, read again only where it changed.
    async fn reports(&self) -> BackendResult<Vec<StoredReport>> {
        let mut names = Vec::new();
        let mut page = None;
        loop {
            let listed = self
                .store
                .list(&self.reports, page.as_deref(), REPORTS_PAGE)
                .await
                .map_err(unavailable)?;
            names.extend(listed.names.into_iter().filter_map(|(name, version)| {
                let file = name.strip_prefix(self.reports.as_str())?;
                Some((ReportName::from_file_name(file)?, name, version))
            }));
            match listed.next {
                Some(next) => page = Some(next),
                None => break,
            }
        }
        let reads = names.into_iter().map(|(agent, name, version)| async move {
            let read = self
                .read_unless_unchanged(&name, version.as_deref())
                .await?;
            // Removed between the listing and the read: nothing to report.
            Ok(read.object.map(|o| StoredReport::read(agent, o.body)))
        });
        let read: Vec<BackendResult<Option<StoredReport>>> = futures::stream::iter(reads)
            .buffered(LIST_READS_IN_FLIGHT)
            .collect()
            .await;
        Ok(read
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect())
    }

    async fn remove_report(&self, agent: &ReportName) -> BackendResult<()> {
        self.store
            .delete(&self.report_name(agent))
            .await
            .map_err(unavailable)
    }
}

#[cfg(test)]
mod tests {
    use super::reports_under;

    #[test]
    fn reports_live_beside_the_records_never_among_them() {
        assert_eq!(reports_under("p/.runlock/locks/"), "p/.runlock/agents/");
        assert_eq!(reports_under(".runlock/locks/"), ".runlock/agents/");
        assert_eq!(reports_under(""), ".agents/");
    }
}
