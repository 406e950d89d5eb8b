//! Runs a force displaced that may still be running. A force puts a new,
//! locked `KEY.run` in place of the one the displaced run holds locked, and
//! its agent waits on that old file until the run has let go. Should the
//! forcer's agent die meanwhile, its lock on the new `KEY.run` dies with it,
//! and a grant through the free name would run beside the displaced run. So
//! the force keeps the old file under a second name, `.KEY.run.TOKEN` (the
//! displaced run's token), which also keeps its inode from being reused,
//! and its record lists the run; every later grant of the key asks the
//! runs listed: one still running refuses a plain acquire and is waited
//! for by a force, and one that has stopped is dropped, its name removed.

use super::run_file::{RunFile, RunLock};
use super::transport::{flock, lock_name};
use super::{BackendResult, FileRecord, Inner};
use crate::backend::Displaced;
use nix::errno::Errno;
use nix::fcntl::{OFlag, RenameFlags};
use runlock_protocol::{Holder, Key, KeyState};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

/// A run a force took the key from, as the forced record lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisplacedRun {
    pub(super) holder: Holder,
    /// The `KEY.run` it holds.
    pub(super) run: RunFile,
}

/// A displaced run that may still be running, and what tells when it has stopped.
pub(super) struct Running {
    pub(super) run: DisplacedRun,
    pub(super) lock: RunLock,
}

/// The listed runs of a key that still run, and the second names of those
/// that have stopped, to remove once a record no longer lists them.
#[derive(Default)]
pub(super) struct Checked {
    pub(super) running: Vec<Running>,
    pub(super) stopped: Vec<String>,
}

/// The second name of the `KEY.run` (`lock_name`) that the run with
/// `token` holds: a dot name, which no key's file has.
fn aside_name(lock_name: &str, token: u64) -> String {
    format!(".{lock_name}.{token}")
}

impl Inner {
    /// Puts a new locked file (`new_name`) in place of the key's `KEY.run`,
    /// whose run (with `token`) is displaced, keeping the old file as
    /// `.KEY.run.TOKEN`: exchanged in one rename where the file system can,
    /// else moved aside first, under the force gate that orders every grant.
    /// No `token`: the old file's holder is no run, and it is renamed over.
    pub(super) fn put_in_place(
        &self,
        dir: &File,
        key: &Key,
        new_name: &str,
        token: Option<u64>,
    ) -> nix::Result<()> {
        let run = lock_name(key);
        let dir_fd = Some(dir.as_raw_fd());
        let Some(token) = token else {
            return nix::fcntl::renameat(dir_fd, new_name, dir_fd, run.as_str());
        };
        let aside = aside_name(&run, token);
        match nix::fcntl::renameat2(
            dir_fd,
            new_name,
            dir_fd,
            run.as_str(),
            RenameFlags::RENAME_EXCHANGE,
        ) {
            Ok(()) => nix::fcntl::renameat(dir_fd, new_name, dir_fd, aside.as_str()),
            // `KEY.run` removed meanwhile: its run is known by its inode alone.
            Err(Errno::ENOENT) => nix::fcntl::renameat(dir_fd, new_name, dir_fd, run.as_str()),
            Err(Errno::EINVAL | Errno::EOPNOTSUPP | Errno::ENOSYS) => {
                nix::fcntl::renameat(dir_fd, run.as_str(), dir_fd, aside.as_str())?;
                nix::fcntl::renameat(dir_fd, new_name, dir_fd, run.as_str())
            }
            Err(err) => Err(err),
        }
    }

    /// Which runs that `record` names still run, though `through`, the
    /// `KEY.run` now locked, is not theirs: those it lists as displaced,
    /// and its holder, if its `KEY.run` was another file (removed or
    /// replaced since, by a cleanup job, by hand, or by a force whose agent
    /// died before it wrote this record): the lock free under that name
    /// proves nothing then. The newest first.
    pub(super) fn check_displaced(
        &self,
        dir: &File,
        key: &Key,
        record: Option<&FileRecord>,
        through: RunFile,
    ) -> BackendResult<Checked> {
        let mut checked = Checked::default();
        let Some(record) = record else {
            return Ok(checked);
        };
        let holder_elsewhere = (record.state == KeyState::Held)
            .then(|| record.holder.clone().zip(record.store.run))
            .flatten()
            .filter(|(_, run)| *run != through)
            .map(|(holder, run)| DisplacedRun { holder, run });
        for run in holder_elsewhere.iter().chain(&record.store.displaced) {
            let aside = aside_name(&lock_name(key), run.holder.token);
            match self.running(dir, &aside, run)? {
                Some(lock) => checked.running.push(Running {
                    run: run.clone(),
                    lock,
                }),
                None => checked.stopped.push(aside),
            }
        }
        Ok(checked)
    }

    /// What tells when `run` stops, while it runs: the lock on its file,
    /// through the second name where it still names that file, else as the
    /// kernel or the holder's process tells (`run_file.rs`).
    fn running(
        &self,
        dir: &File,
        aside: &str,
        run: &DisplacedRun,
    ) -> BackendResult<Option<RunLock>> {
        let named = self
            .try_open(dir, aside, OFlag::O_RDONLY)
            .ok()
            .flatten()
            .filter(|file| RunFile::of(file).is_ok_and(|f| f == run.run));
        if let Some(file) = named {
            let free = flock(&file, libc::LOCK_EX | libc::LOCK_NB)
                .map_err(|e| self.io_error("locking", aside, e))?;
            if free {
                let _ = flock(&file, libc::LOCK_UN);
                return Ok(None);
            }
            return Ok(Some(RunLock::Open(Arc::new(file))));
        }
        let pid = run.holder.pid;
        Ok(self
            .run_lives(run.run, pid)
            .then_some(RunLock::Unnamed(run.run, pid)))
    }

    /// Removes the second names of displaced runs that have stopped, once
    /// the record that listed them has been replaced.
    pub(super) fn remove_aside(&self, dir: &File, names: &[String]) {
        for name in names {
            let _ = nix::unistd::unlinkat(
                Some(dir.as_raw_fd()),
                name.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

/// What a force waits for: every run still running that it displaced, the
/// newest first (whose holder it names).
pub(super) fn waited_for(running: &[Running], ttl: Duration) -> Option<Displaced> {
    let newest = running.first()?;
    let lock = match running {
        [one] => one.lock.clone(),
        all => RunLock::All(all.iter().map(|r| r.lock.clone()).collect()),
    };
    Some(Displaced {
        token: newest.run.holder.token,
        holder: Some(newest.run.holder.clone()),
        ttl,
        lock: Some(lock),
    })
}
