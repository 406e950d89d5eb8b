//! Whether a run still holds a `KEY.run` whose name is gone: removed (a
//! cleanup job, `systemd-tmpfiles` ageing the directory) or replaced while
//! its run held it. Nobody can open that file again, so its lock is asked of
//! the kernel by device and inode (`/proc/locks`), or, where the kernel does
//! not say, the holder's process is.

use super::blocker::{inode_locked, process_lives};
use super::transport::flock;
use super::Inner;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::sync::Arc;

/// A file by device and inode, which outlive its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFile {
    pub(super) dev: u64,
    pub(super) ino: u64,
}

impl RunFile {
    pub(super) fn of(file: &File) -> io::Result<RunFile> {
        let meta = file.metadata()?;
        Ok(RunFile {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

/// What tells that a run taken over (`Displaced::lock`) has stopped.
#[derive(Debug, Clone)]
pub enum RunLock {
    /// Our own open file description of the `KEY.run` it holds, renamed away
    /// by the force: lockable once every process of the run has let go.
    Open(Arc<File>),
    /// A `KEY.run` whose name was removed before the force, so that no
    /// description of it can be opened; and the pid of the run's holder.
    Unnamed(RunFile, u32),
    /// Several runs, each displaced by a force whose agent died before the
    /// run stopped (`displaced.rs`): stopped once all have.
    All(Vec<RunLock>),
}

impl Inner {
    /// Whether the run `pid` that locked `run` may still hold it. Believed
    /// free only when the kernel lists no lock on it, or, where the kernel
    /// does not say (no `/proc/locks`, or one naming files otherwise than
    /// `stat` does, as on btrfs), once that process has exited.
    pub(super) fn run_lives(&self, run: RunFile, pid: u32) -> bool {
        let listed = self
            .kernel_lists_locks
            .then(|| inode_locked(run.dev, run.ino))
            .flatten();
        listed.unwrap_or_else(|| process_lives(pid))
    }

    /// Whether the run `displaced` from has stopped.
    pub(super) fn displaced_stopped(&self, run: &RunLock) -> io::Result<bool> {
        match run {
            RunLock::Open(old) => {
                let free = flock(old, libc::LOCK_EX | libc::LOCK_NB)?;
                if free {
                    let _ = flock(old, libc::LOCK_UN);
                }
                Ok(free)
            }
            RunLock::Unnamed(run, pid) => Ok(!self.run_lives(*run, *pid)),
            RunLock::All(runs) => {
                for run in runs {
                    if !self.displaced_stopped(run)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        }
    }
}

/// Whether `/proc/locks` lists the lock held through `locked`, a file of
/// the lock directory this process holds exclusively: where it does not,
/// it cannot tell whether a file whose name is gone is still locked.
pub(super) fn kernel_lists_locks(locked: &File) -> bool {
    RunFile::of(locked).is_ok_and(|f| inode_locked(f.dev, f.ino) == Some(true))
}
