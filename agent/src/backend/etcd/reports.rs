//! Agents' reports on etcd: one key per agent (`{prefix}.agents/<agent
//! id>.json`), a dot name no escaped key spells, so that no listing of keys
//! reads one and the watch for releases never takes one for a record.

use super::*;

/// Reports read in one request.
const REPORTS_PAGE: i64 = 1000;

impl EtcdBackend {
    fn reports_under(&self) -> String {
        format!("{}.agents/", self.connection.prefix)
    }
}

#[async_trait]
impl Reports for EtcdBackend {
    /// A plain put: only its agent writes it.
    async fn put_report(&self, agent: &ReportName, body: Vec<u8>) -> BackendResult<()> {
        let name = &format!("{}{}", self.reports_under(), agent.file_name());
        self.bounded(async {
            self.connection
                .request(|c| {
                    let body = body.clone();
                    async move { c.put(name.as_str(), body, None).await }
                })
                .await?;
            Ok(())
        })
        .await
    }

    /// A request per thousand reports.
    async fn reports(&self) -> BackendResult<Vec<StoredReport>> {
        let under = self.reports_under();
        // invariant: the prefix ends with `/`, which has a successor
        let end = listing::successor(under.as_bytes()).unwrap_or_default();
        let mut start = under.as_bytes().to_vec();
        let mut reports = Vec::new();
        self.bounded(async {
            loop {
                let page = Get::key(start.as_slice())
                    .with_range(end.clone())
                    .with_limit(REPORTS_PAGE);
                let answer = self
                    .connection
                    .request(|c| {
                        let page = page.clone();
                        async move { c.get(page).await }
                    })
                    .await?;
                let more = answer.more;
                let kvs = answer.kvs;
                for kv in &kvs {
                    let agent = kv
                        .key_str()
                        .ok()
                        .and_then(|name| name.strip_prefix(under.as_str()))
                        .and_then(ReportName::from_file_name);
                    if let Some(agent) = agent {
                        reports.push(StoredReport::read(agent, kv.value().to_vec()));
                    }
                }
                match kvs.last() {
                    Some(last) if more => start = [last.key(), &[0]].concat(),
                    _ => return Ok(()),
                }
            }
        })
        .await?;
        Ok(reports)
    }

    async fn remove_report(&self, agent: &ReportName) -> BackendResult<()> {
        let name = &format!("{}{}", self.reports_under(), agent.file_name());
        self.bounded(async {
            self.connection
                .request(|c| async move { c.delete(name.as_str()).await })
                .await?;
            Ok(())
        })
        .await
    }
}
