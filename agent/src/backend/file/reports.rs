//! Agents' reports in the lock directory: `.agent-<agent id>.json`, a dot
//! file no key's name can be, written whole to a temporary name and
//! renamed over the last, so that a reader sees the old report or the new.

use super::*;
use crate::backend::{ReportName, StoredReport, MAX_REPORT_LEN};
use std::io::{Read as _, Write as _};

const REPORT_PREFIX: &str = ".agent-";

fn report_file(agent: &ReportName) -> String {
    format!("{REPORT_PREFIX}{}", agent.file_name())
}

impl Inner {
    /// [`Backend::put_report`].
    pub(super) fn put_report(&self, agent: &ReportName, body: &[u8]) -> BackendResult<()> {
        let dir = self.dir()?;
        let name = report_file(agent);
        let temp = format!(".report-{}", uuid::Uuid::new_v4());
        let dir_fd = Some(dir.as_raw_fd());
        let written = self
            .open(
                &dir,
                &temp,
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            )
            .and_then(|mut file| {
                file.write_all(body)
                    .map_err(|e| self.io_error("writing", &temp, e))
            })
            .and_then(|()| {
                nix::fcntl::renameat(dir_fd, temp.as_str(), dir_fd, name.as_str())
                    .map_err(|e| self.io_error("replacing", &name, e))
            });
        if written.is_err() {
            let _ = nix::unistd::unlinkat(
                dir_fd,
                temp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        written
    }

    /// [`Backend::reports`]: a report that cannot be read is listed with why.
    pub(super) fn reports(&self) -> BackendResult<Vec<StoredReport>> {
        let dir = self.dir()?;
        let names: Vec<ReportName> = (self.names_in(&dir)?.iter())
            .filter_map(|name| ReportName::from_file_name(name.strip_prefix(REPORT_PREFIX)?))
            .collect();
        let mut reports = Vec::with_capacity(names.len());
        for agent in names {
            let name = report_file(&agent);
            let read = match self.try_open(&dir, &name, OFlag::O_RDONLY) {
                Ok(None) => continue, // replaced or removed since listed
                Ok(Some(file)) => {
                    let mut body = Vec::new();
                    file.take(MAX_REPORT_LEN as u64 + 1)
                        .read_to_end(&mut body)
                        .map(|_| StoredReport::read(agent.clone(), body))
                        .map_err(|e| self.io_error("reading", &name, e).to_string())
                }
                Err(err) => Err(err.to_string()),
            };
            reports.push(read.unwrap_or_else(|why| StoredReport {
                agent,
                body: Err(why),
            }));
        }
        Ok(reports)
    }

    /// [`Backend::remove_report`].
    pub(super) fn remove_report(&self, agent: &ReportName) -> BackendResult<()> {
        let dir = self.dir()?;
        let name = report_file(agent);
        match nix::unistd::unlinkat(
            Some(dir.as_raw_fd()),
            name.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
            Err(err) => Err(self.io_error("removing", &name, err)),
        }
    }
}
