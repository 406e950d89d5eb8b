//! `file://DIR`: three files per key. `KEY.run` is empty and exists only to
//! be locked (`flock`, exclusive); the run holds that locked open file
//! description itself (the agent hands it over, `Grant::lock`), as
//! `flock(1)`'s children do, so the key is held exactly as long as the run's
//! processes live, whether or not an agent does, and a kernel lock has no
//! deadline to miss. The run's descriptor is read-only on the empty file: it
//! can keep or drop the lock, nothing else. `KEY.lock` records the holder,
//! the fencing token and the `KEY.run` (device and inode) the grant locked,
//! and only agents open it, each write made while holding the key's lock,
//! whole into a spare beside it and exchanged with it in one rename
//! (`replace.rs`: a full disk leaves the old record). `KEY.tokens` keeps
//! the highest token ever reserved (`tokens.rs`).
//!
//! A `KEY.run` removed (a cleanup job ageing the directory) or replaced
//! while its run holds it would let the next agent lock a new file beside
//! that run: a record held through another inode than the name's is
//! believed while that run may still hold it (`run_file.rs`), and a force
//! waits for it as for any run it displaces. The holder's agent sees its
//! file gone at its next renewal, as after a force, and ending that lease
//! touches neither the run's lock nor the record.
//!
//! Force cannot break another process's kernel lock, so it puts a new,
//! locked `KEY.run` in place of the old one, which it keeps as
//! `.KEY.run.TOKEN` and lists in the record until its run has stopped
//! (`displaced.rs`); the old holder still locks that inode and learns of the
//! loss at its next check, when the name no longer names its inode.
//! `.force.lock` orders a force against every other record write (shared
//! for those, exclusive for force), so no two grants read the same previous
//! token.
//!
//! Making every token durable (`fdatasync`) would double the cost of an
//! acquisition, so tokens are reserved in durable blocks: `KEY.tokens` is
//! raised, synced, to the end of each block before its first token is handed
//! out, and a record says up to which token it has promised (`reserved`) and
//! on which boot it was written; within a block and a boot a record is
//! written without a sync (the page cache survives an agent's crash), and
//! after a reboot, when an unsynced write may have been lost, or when the
//! record is gone (removed, moved aside), the next token starts above
//! `KEY.tokens`.
//!
//! The directory is opened once and every name is looked up relative to it
//! (`openat`, `renameat`, `fstatat`) with `O_NOFOLLOW`: the agent runs as root
//! for every user of its socket, so a link planted where a lock file belongs
//! is refused, never followed out of the directory (`dir.rs`). A directory
//! that anyone but root and the agent's user could change is refused at start.
//! `view.rs` is what `history`, `inspect` and `list` show.
//!
//! Nothing here is for the socket's members: the directory is 0700 and its
//! files 0600 (a run is handed its lock as a descriptor, and never opens a
//! name), so no member can read a record or lock a file. The agent still
//! never waits without bound on a lock another process could hold: the
//! start-up probe locks a file of its own, the force gate is tried for at
//! most [`GATE_WAIT`], and a refusal that no record explains names the
//! process in the way where the kernel tells.

mod blocker;
mod dir;
mod displaced;
mod errors;
mod listed_names;
mod record;
mod replace;
mod reports;
mod run_file;
mod settings;
#[cfg(test)]
mod tests;
mod tokens;
mod transport;
mod view;

use super::history::{self, Stamp};
use super::key_name;
use super::{
    AcquireSpec, Adopted, Adopter, Backend, BackendError, BackendResult, Capabilities, Displaced,
    Ending, Grant, LeaseRef, ListFrom, ListPage, Listed, PageAsk, Profile, Profiled, Renewed,
    ReportName, Reports, StoredReport,
};
use crate::unpoisoned::Unpoisoned;
use anyhow::Context as _;
use async_trait::async_trait;
use displaced::{DisplacedRun, Running};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use record::{
    boot_id, held_record, read_bytes, read_record_settled, record_bytes, settle, FileRecord,
};
use run_file::RunFile;
pub use run_file::RunLock;
use runlock_protocol::{EventKind, Key, KeyEvent, KeyRecord, KeyState, Scope};
use settings::{open_dir, DIR_MODE, FILE_MODE};
use std::collections::HashMap;
use std::fs::{DirBuilder, File};

use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use transport::{file_name, flock, flock_excludes, lock_name, ofd_lock_within, tokens_name};

/// A directory of lock files.
#[derive(Clone)]
pub struct FileBackend {
    inner: Arc<Inner>,
}

struct Inner {
    /// The directory as configured: reopened from here only if it was deleted.
    dir: PathBuf,
    /// The directory, open: every file name is resolved relative to it.
    dir_fd: Mutex<Arc<File>>,
    /// The lock file of each lease held through this agent, by lease id.
    held: Mutex<HashMap<String, Held>>,
    /// This boot's id, or "" where the kernel gives none (every block is then durable).
    boot_id: String,
    /// `/proc/locks` names this directory's files as `stat` does (`run_file.rs`).
    kernel_lists_locks: bool,
    /// The names each listing in progress read on its first page.
    listed_names: listed_names::ListedNames,
}

/// A lease's lock file, open read-only: the locked description the run also
/// holds, or, for an adopted lease, a description of the same file the run
/// holds the lock through.
struct Held {
    lock: File,
    agent_id: String,
}

const GATE_FILE: &str = ".force.lock";
/// How long an acquisition, release or force waits for the gate: agents
/// hold it for a few file system calls, so a longer hold is someone else's.
const GATE_WAIT: Duration = Duration::from_secs(5);
/// How long a failed lock attempt waits before it is believed once more: a
/// `free` record beside a locked file is an agent between taking the lock and
/// writing, or `inspect` looking.
const SECOND_LOOK: Duration = Duration::from_millis(2);

impl FileBackend {
    /// Opens (creating if needed, mode 0700) the lock directory, refusing
    /// one that a user other than root or the agent's own could change, and
    /// taking its group's and others' permissions off (said in a warning).
    pub fn open(dir: PathBuf) -> anyhow::Result<FileBackend> {
        FileBackend::open_in_boot(dir, boot_id())
    }

    /// As [`FileBackend::open`], as if the host were in boot `boot_id`.
    fn open_in_boot(dir: PathBuf, boot_id: String) -> anyhow::Result<FileBackend> {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(&dir)
            .with_context(|| format!("creating lock directory {}", dir.display()))?;
        let dir_fd = open_dir(&dir)?;
        let mut inner = Inner {
            dir,
            dir_fd: Mutex::new(Arc::new(dir_fd)),
            held: Mutex::new(HashMap::new()),
            boot_id,
            kernel_lists_locks: false,
            listed_names: Default::default(),
        };
        let dir = inner.dir()?;
        match inner.open(&dir, GATE_FILE, OFlag::O_RDWR | OFlag::O_CREAT) {
            Ok(_) => {}
            Err(BackendError::Corrupt(why)) => {
                tracing::warn!("{why}; every --force is refused until it is removed");
            }
            Err(err) => {
                anyhow::bail!(
                    "lock directory {} is not writable: {err}",
                    inner.dir.display()
                )
            }
        }
        // A file of this agent's own, not a shared name: nobody else can
        // hold its lock, so no process can keep an agent from starting.
        let probe = format!(".probe-{}.run", uuid::Uuid::new_v4());
        let first = inner.open(
            &dir,
            &probe,
            OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_EXCL,
        )?;
        let second = inner.open(&dir, &probe, OFlag::O_RDONLY);
        inner.kernel_lists_locks = flock(&first, libc::LOCK_EX | libc::LOCK_NB).unwrap_or(false)
            && run_file::kernel_lists_locks(&first);
        let _ = flock(&first, libc::LOCK_UN);
        let _ = nix::unistd::unlinkat(
            Some(dir.as_raw_fd()),
            probe.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        flock_excludes(&first, &second?).with_context(|| {
            format!(
                "lock directory {}: its file system cannot be trusted to lock",
                inner.dir.display()
            )
        })?;
        Ok(FileBackend {
            inner: Arc::new(inner),
        })
    }

    /// Runs `op`, which makes a few local file system calls and may block on
    /// a slow disk, a sync or the force gate. On the agent's multi-threaded
    /// runtime it runs here at once, the runtime moving this thread's other
    /// tasks elsewhere meanwhile (`block_in_place`): handing it to another
    /// thread instead costs two wake-ups, which were most of an uncontended
    /// acquisition's time. Elsewhere (a test's runtime) it goes to the
    /// blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Inner) -> BackendResult<T> + Send + 'static,
    ) -> BackendResult<T> {
        if on_worker() {
            return tokio::task::block_in_place(|| op(&self.inner));
        }
        self.in_pool(op).await
    }

    /// Like [`FileBackend::blocking`], for an `op` of one key (acquire,
    /// renew, end, inspect) that waits only through [`off_worker`]: on the agent's
    /// runtime it runs inline, as a task, since `block_in_place` hands the
    /// worker to another thread and back, and those wake-ups were a third of
    /// an uncontended run's context switches in the agent.
    async fn inline<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Inner) -> BackendResult<T> + Send + 'static,
    ) -> BackendResult<T> {
        if on_worker() {
            return op(&self.inner);
        }
        self.in_pool(op).await
    }

    /// Runs `op` on the blocking pool (a current-thread runtime's, in tests).
    async fn in_pool<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Inner) -> BackendResult<T> + Send + 'static,
    ) -> BackendResult<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || op(&inner))
            .await
            .map_err(|e| BackendError::Unavailable(format!("file backend task failed: {e}")))?
    }
}

/// Whether this thread is a worker of a multi-threaded runtime (the
/// agent's), where `block_in_place` may be called.
fn on_worker() -> bool {
    use tokio::runtime::{Handle, RuntimeFlavor};
    Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread)
}

/// Runs `wait` (a sleep, a sync), the only slow part of an inline op, off
/// the runtime's worker where it is called on one, so that the worker's
/// other tasks go on meanwhile; elsewhere (the blocking pool) as it is.
fn off_worker<T>(wait: impl FnOnce() -> T) -> T {
    match on_worker() {
        true => tokio::task::block_in_place(wait),
        false => wait(),
    }
}

/// Sleeps for `pause`, off the runtime's worker.
fn pause(pause: Duration) {
    off_worker(|| std::thread::sleep(pause))
}

/// What a refused lock turned out to be, once the record beside it was read.
enum Refused {
    /// Held: by the record's holder, where the record names one.
    Held(Option<Box<FileRecord>>),
    /// Its holder let go while the record was read, and the lock is ours.
    LetGo,
}

impl Inner {
    fn remember(&self, lease_id: &str, lock: File, agent_id: &str) {
        let held = Held {
            lock,
            agent_id: agent_id.to_string(),
        };
        self.held.locked().insert(lease_id.to_string(), held);
    }

    /// The key's record; `None` when it was never written.
    fn read_record(
        &self,
        dir: &File,
        file: &File,
        name: &str,
    ) -> BackendResult<Option<FileRecord>> {
        let bytes = read_bytes(file).map_err(|e| self.io_error("reading", name, e))?;
        if bytes.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| self.not_a_record(dir, name, e))
    }

    /// A record that cannot be read (written by hand, or cut by a version
    /// that wrote in place): left as it is, with what freeing the key takes
    /// without handing out any of its tokens again.
    fn not_a_record(&self, dir: &File, name: &str, why: serde_json::Error) -> BackendError {
        let tokens = format!("{}.tokens", name.strip_suffix(".lock").unwrap_or(name));
        let then = match self.kept_tokens(dir, &tokens) {
            Ok(kept) if kept > 0 => format!(
                "moved aside, it frees the key, whose next token is then above {kept}, the \
                 highest it reserved ({tokens} keeps it)"
            ),
            _ => format!(
                "no {tokens} keeps the key's highest token, so its next token could not \
                 be told: to free the key, first write a number at least as high as its last \
                 token into {tokens}, then move it aside"
            ),
        };
        BackendError::Corrupt(format!(
            "lock file {} is not a runlock record ({why}); runlock leaves it as it is: {then}",
            self.path(name).display()
        ))
    }

    /// The record named `name` in `dir`; `None` when there is none yet.
    fn current_record(&self, dir: &File, name: &str) -> BackendResult<Option<FileRecord>> {
        match self.try_open(dir, name, OFlag::O_RDONLY)? {
            Some(file) => self.read_record(dir, &file, name),
            None => Ok(None),
        }
    }

    /// Reads a record another agent may be replacing this instant, opening
    /// its name again at each look (a description opened before a write is
    /// left on the old record): until `wanted` takes it, for a few
    /// milliseconds at most. `Ok(None)`: there is none, or none was wanted.
    fn read_settled(
        &self,
        dir: &File,
        name: &str,
        wanted: impl FnMut(&FileRecord) -> bool,
    ) -> BackendResult<Option<FileRecord>> {
        let look = || match self.try_open(dir, name, OFlag::O_RDONLY)? {
            Some(file) => read_bytes(&file)
                .map(Some)
                .map_err(|e| self.io_error("reading", name, e)),
            None => Ok(None),
        };
        settle(look, wanted)
    }

    /// Writes the record of a key whose lock this agent holds, whole beside
    /// it and exchanged with it: a failed write leaves the old record as it was.
    /// Never synced: the block it hands tokens from is kept durably in
    /// `KEY.tokens` first, and a lost record costs no token.
    fn write(&self, dir: &File, name: &str, record: &FileRecord) -> BackendResult<()> {
        replace::replace(dir, name, &record_bytes(record), false)
            .map_err(|e| self.io_error("writing", name, e))
    }

    fn acquire(&self, spec: &AcquireSpec) -> BackendResult<Grant> {
        let sent = tokio::time::Instant::now();
        let dir = self.dir()?;
        let _gate = self.open_gate(&dir, spec.force)?;
        let (name, lock_name) = (file_name(&spec.key), lock_name(&spec.key));
        loop {
            let lock = self.open(&dir, &lock_name, OFlag::O_RDONLY | OFlag::O_CREAT)?;
            if !self.try_lock(&dir, &lock, &lock_name, &name)? {
                match self.holder_record(&dir, &lock, &name)? {
                    Refused::LetGo => {} // the lock is ours now
                    Refused::Held(current) if spec.force => {
                        return self.take_over(&dir, spec, current.map(|r| *r), lock);
                    }
                    Refused::Held(current)
                        if !current
                            .as_ref()
                            .is_some_and(|r| r.state == KeyState::Held && r.holder.is_some()) =>
                    {
                        return Err(self.held_by_stranger(&lock, &lock_name));
                    }
                    Refused::Held(current) => {
                        let incident = current
                            .as_ref()
                            .and_then(|r| history::last_incident(&r.history));
                        return Err(BackendError::Held(
                            current.and_then(|r| r.holder).map(Box::new),
                            incident,
                        ));
                    }
                }
            }
            // A force may have renamed a new file over the name between our open and lock.
            if !self.same_inode(&dir, &lock, &lock_name)? {
                continue;
            }
            let granted = self.current_record(&dir, &name).and_then(|previous| {
                let run =
                    RunFile::of(&lock).map_err(|e| self.io_error("checking", &lock_name, e))?;
                let checked = self.check_displaced(&dir, &spec.key, previous.as_ref(), run)?;
                if let (false, Some(live)) = (spec.force, checked.running.first()) {
                    let incident = previous
                        .as_ref()
                        .and_then(|p| history::last_incident(&p.history));
                    return Err(BackendError::Held(
                        Some(Box::new(live.run.holder.clone())),
                        incident,
                    ));
                }
                let forced_from = checked.running.first().map(|live| live.run.holder.token);
                let block = self.token_block(&dir, &spec.key, previous.as_ref())?;
                let (holder, mut record) = held_record(
                    spec,
                    previous.as_ref(),
                    block,
                    run,
                    forced_from,
                    &self.boot_id,
                );
                record.store.displaced = checked.running.iter().map(|r| r.run.clone()).collect();
                self.write(&dir, &name, &record)?;
                self.remove_aside(&dir, &checked.stopped);
                let ttl = live_ttl(previous.as_ref()).unwrap_or(spec.ttl);
                Ok((holder, displaced::waited_for(&checked.running, ttl)))
            });
            let (holder, displaced) = match granted {
                Ok(granted) => granted,
                Err(err) => {
                    let _ = flock(&lock, libc::LOCK_UN);
                    return Err(err);
                }
            };
            let run = self.run_copy(&lock, &lock_name)?;
            self.remember(&spec.lease_id, lock, &spec.holder.agent_id);
            return Ok(Grant {
                holder,
                sent,
                lock: Some(run),
                displaced,
            });
        }
    }

    /// Tries the key's lock. A refusal is believed only once it has lasted
    /// [`SECOND_LOOK`] while the record says the key is free: a holder takes
    /// the lock before it writes its record, and `inspect` takes it shared
    /// for an instant to tell a stale record from a held key.
    fn try_lock(
        &self,
        dir: &File,
        lock: &File,
        lock_name: &str,
        name: &str,
    ) -> BackendResult<bool> {
        let attempt = || {
            flock(lock, libc::LOCK_EX | libc::LOCK_NB)
                .map_err(|e| self.io_error("locking", lock_name, e))
        };
        if attempt()? {
            return Ok(true);
        }
        let held = matches!(
            self.current_record(dir, name),
            Ok(Some(r)) if r.state == KeyState::Held
        );
        if held {
            return Ok(false);
        }
        pause(SECOND_LOOK);
        attempt()
    }

    /// The record of the holder of a key whose `lock` was just refused, read
    /// once its writer is done (a holder takes the lock before it writes);
    /// or, should the holder let go meanwhile, the lock, taken: waiting on
    /// for a held record would keep a waiter from a free key.
    fn holder_record(&self, dir: &File, lock: &File, name: &str) -> BackendResult<Refused> {
        let mut taken = false;
        let record = self.read_settled(dir, name, |r| {
            taken = r.state != KeyState::Held
                && flock(lock, libc::LOCK_EX | libc::LOCK_NB).unwrap_or(false);
            taken || r.state == KeyState::Held
        })?;
        Ok(match taken {
            true => Refused::LetGo,
            false => Refused::Held(record.map(Box::new)),
        })
    }

    /// A refusal that no record explains: `lock` is held, yet no record
    /// names a holder. Not a run any agent granted (it would have written
    /// its record before this was read): another program, or a process a
    /// run left behind that locked its descriptor again.
    fn held_by_stranger(&self, lock: &File, lock_name: &str) -> BackendError {
        BackendError::HeldUnrecorded(format!(
            "{} is locked by a process that no record names ({}): not a run any runlock \
             agent granted, but another program or a process left over from an earlier \
             run; the key is free once it lets go, or `--force` takes it over",
            self.path(lock_name).display(),
            blocker::flock_blocker(lock),
        ))
    }

    /// A duplicate of a held lock file's description, for the run.
    fn run_copy(&self, lock: &File, lock_name: &str) -> BackendResult<OwnedFd> {
        lock.try_clone()
            .map(OwnedFd::from)
            .map_err(|e| self.io_error("duplicating", lock_name, e))
    }

    /// Force: a new locked lock file renamed over the old, then the record.
    /// `old` is our own description of the old lock file, which the displaced
    /// run holds locked until it has stopped.
    fn take_over(
        &self,
        dir: &File,
        spec: &AcquireSpec,
        current: Option<FileRecord>,
        old: File,
    ) -> BackendResult<Grant> {
        let (name, lock_name) = (file_name(&spec.key), lock_name(&spec.key));
        // A lock with no held record beside it (a run's leftover process that
        // locked its descriptor again) is taken over from the record as it is.
        let current = match current {
            Some(current) => Some(current),
            None => self.read_settled(dir, &name, |_| true)?,
        };
        let current = current.ok_or_else(|| {
            BackendError::Corrupt(format!(
                "lock file {} is held but its record cannot be read; cannot take it over",
                self.path(&name).display()
            ))
        })?;
        let old_run = RunFile::of(&old).map_err(|e| self.io_error("checking", &lock_name, e))?;
        let checked = self.check_displaced(dir, &spec.key, Some(&current), old_run)?;
        // A process no record names (not a run) has no agent to stop it.
        let taken_from = (current.state == KeyState::Held)
            .then(|| current.holder.clone())
            .flatten();
        let temp = format!(".take-{}", uuid::Uuid::new_v4());
        let lock = self.open(dir, &temp, OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_EXCL)?;
        let aside = taken_from.as_ref().map(|holder| holder.token);
        let placed = flock(&lock, libc::LOCK_EX | libc::LOCK_NB)
            .and_then(|_| Ok(self.put_in_place(dir, &spec.key, &temp, aside)?));
        if let Err(e) = placed {
            let _ = nix::unistd::unlinkat(
                Some(dir.as_raw_fd()),
                temp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return Err(self.io_error("replacing", &lock_name, e));
        }
        let block = self.token_block(dir, &spec.key, Some(&current))?;
        let run = RunFile::of(&lock).map_err(|e| self.io_error("checking", &lock_name, e))?;
        let (holder, mut record) = held_record(
            spec,
            Some(&current),
            block,
            run,
            Some(current.token),
            &self.boot_id,
        );
        let taken = taken_from.map(|holder| Running {
            run: DisplacedRun {
                holder,
                run: old_run,
            },
            lock: RunLock::Open(Arc::new(old)),
        });
        let others = checked
            .running
            .into_iter()
            .filter(|r| Some(r.run.holder.token) != aside);
        let running: Vec<Running> = taken.into_iter().chain(others).collect();
        record.store.displaced = running.iter().map(|r| r.run.clone()).collect();
        self.write(dir, &name, &record)?;
        self.remove_aside(dir, &checked.stopped);
        let run = self.run_copy(&lock, &lock_name)?;
        self.remember(&spec.lease_id, lock, &spec.holder.agent_id);
        let ttl = live_ttl(Some(&current)).unwrap_or(spec.ttl);
        Ok(Grant {
            holder,
            sent: tokio::time::Instant::now(),
            lock: Some(run),
            displaced: displaced::waited_for(&running, ttl),
        })
    }

    fn renew(&self, lease: &LeaseRef) -> BackendResult<()> {
        let dir = self.dir()?;
        let held = self.held.locked();
        let held = held
            .get(&lease.lease_id)
            .ok_or(BackendError::LeaseMismatch)?;
        if self.same_inode(&dir, &held.lock, &lock_name(&lease.key))? {
            Ok(())
        } else {
            Err(BackendError::LeaseMismatch)
        }
    }

    /// Ends a lease: its record is marked free, then its lock dropped for
    /// every holder of the description (a daemon the run left behind too).
    /// The record is written only while this agent holds the lock on the
    /// key's current lock file and the record still names the lease: the
    /// run may have dropped the lock already, and then someone else may
    /// hold the key.
    fn release(&self, lease: &LeaseRef, ending: &Ending) -> BackendResult<()> {
        let Some(held) = self.held.locked().remove(&lease.lease_id) else {
            return Ok(());
        };
        let (name, lock_name) = (file_name(&lease.key), lock_name(&lease.key));
        let dir = self.dir()?;
        let _gate = self.open_gate(&dir, false)?;
        let ours = flock(&held.lock, libc::LOCK_EX | libc::LOCK_NB)
            .map_err(|e| self.io_error("locking", &lock_name, e))?
            && self.same_inode(&dir, &held.lock, &lock_name)?;
        if !ours {
            // The run still holds it (an adopted lease), or our `KEY.run` was
            // taken over, removed or replaced. Then the lock taken above is
            // the run's own, which a lease lost is ended while the run is
            // still being stopped: dropping it, or freeing the record, would
            // let a grant in beside that run (a forcer waits on that lock; a
            // waiter believes the record while the kernel lists it).
            return Ok(());
        }
        let result = self.free_record(&dir, &name, lease, &held.agent_id, ending);
        let _ = flock(&held.lock, libc::LOCK_UN);
        result
    }

    /// Marks the record free, keeping its token, if it still names `lease`
    /// as granted or adopted through this agent.
    fn free_record(
        &self,
        dir: &File,
        name: &str,
        lease: &LeaseRef,
        agent_id: &str,
        ending: &Ending,
    ) -> BackendResult<()> {
        let Some(mut record) = self.current_record(dir, name)? else {
            return Ok(());
        };
        let ours = record.held_by(&lease.lease_id, lease.token)
            && record
                .holder
                .as_ref()
                .is_some_and(|h| h.agent_id == agent_id);
        if !ours {
            return Ok(());
        }
        record.end(ending);
        record.store.ttl_ms = None;
        // Not synced: a lost `free` record is harmless, the kernel lock is the truth.
        self.write(dir, name, &record)
    }

    /// Takes over a lease granted through an agent that has stopped, whose
    /// run still holds the lock: the record must name the lease, its token
    /// and the adopter's user, and the key's lock file must still be locked
    /// (by the run). A free lock means the run has ended: the lease is over,
    /// whatever its record still says, and is not adopted.
    fn adopt(&self, lease: &LeaseRef, by: &Adopter) -> BackendResult<Adopted> {
        let (name, lock_name) = (file_name(&lease.key), lock_name(&lease.key));
        let dir = self.dir()?;
        // Exclusive, as for a force: no acquisition is then between taking
        // the key's lock and writing its record, so a lock held below is the
        // run's whose record is read, never a new holder's about to write
        // its own (which this write would overwrite with the old token).
        let _gate = match self.open_gate(&dir, true) {
            Err(BackendError::Corrupt(_)) => self.open_gate(&dir, false)?,
            gate => gate?,
        };
        let lock = self
            .try_open(&dir, &lock_name, OFlag::O_RDONLY)?
            .ok_or(BackendError::LeaseMismatch)?;
        let Some(mut record) = self.current_record(&dir, &name)?.filter(|r| {
            r.held_by(&lease.lease_id, lease.token) && r.holder.as_ref().is_some_and(|h| by.owns(h))
        }) else {
            return Err(BackendError::LeaseMismatch);
        };
        let mut holder = record.holder.clone().ok_or_else(|| {
            BackendError::Corrupt(format!(
                "{} is held but names no holder",
                self.path(&name).display()
            ))
        })?;
        // The run holds its lock exclusively; a shared lock we can take
        // means nobody holds it so (an `inspect` may hold it shared for an
        // instant): the run is gone, and so is its lease.
        let run_gone = flock(&lock, libc::LOCK_SH | libc::LOCK_NB)
            .map_err(|e| self.io_error("checking", &lock_name, e))?;
        if run_gone {
            let _ = flock(&lock, libc::LOCK_UN);
            return Err(BackendError::LeaseMismatch);
        }
        holder.agent_id = by.agent_id.clone();
        let adopted = history::event(
            EventKind::Adopted,
            &holder,
            record.token,
            Stamp::agent_now(),
        );
        history::push(&mut record.history, adopted);
        record.holder = Some(holder.clone());
        self.write(&dir, &name, &record)?;
        let ttl = Duration::from_millis(record.store.ttl_ms.unwrap_or(60_000));
        self.remember(&lease.lease_id, lock, &by.agent_id);
        Ok(Adopted::new(holder, tokio::time::Instant::now(), ttl))
    }
}

/// The TTL a record's holder was granted with.
fn live_ttl(record: Option<&FileRecord>) -> Option<Duration> {
    record?.store.ttl_ms.map(Duration::from_millis)
}

impl Profiled for FileBackend {
    fn profile(&self) -> Profile {
        Profile {
            capabilities: Capabilities {
                scope: Scope::Host,
                survives_agent: true,
                // Only to notice a force, which renames a new lock file over ours.
                needs_renewal: true,
                lease_expires: false,
                run_holds_lock: true,
            },
            min_ttl: Duration::ZERO,
            description: format!("file://{}", self.inner.dir.display()),
            releases: None,
        }
    }
}

#[async_trait]
impl Backend for FileBackend {
    async fn acquire(&self, spec: &AcquireSpec) -> BackendResult<Grant> {
        let spec = spec.clone();
        self.inline(move |inner| inner.acquire(&spec)).await
    }

    async fn renew(&self, lease: &LeaseRef, _ttl: Duration) -> BackendResult<Renewed> {
        let lease = lease.clone();
        self.inline(move |inner| inner.renew(&lease))
            .await
            .map(|()| Renewed::ByThisCall)
    }

    async fn end(&self, lease: &LeaseRef, ending: &Ending) -> BackendResult<()> {
        let (lease, ending) = (lease.clone(), ending.clone());
        self.inline(move |inner| inner.release(&lease, &ending))
            .await
    }

    async fn history(&self, key: &Key) -> BackendResult<Vec<KeyEvent>> {
        let key = key.clone();
        self.blocking(move |inner| inner.history(&key)).await
    }

    /// Inline: every grant reads the key's next slot record (the count
    /// check), and its only wait, a settling record, leaves the worker.
    async fn inspect(&self, key: &Key) -> BackendResult<KeyRecord> {
        let key = key.clone();
        self.inline(move |inner| inner.inspect(&key)).await
    }

    async fn list(&self, ask: PageAsk<'_>) -> BackendResult<ListPage> {
        let (prefix, from, limit) = (ask.prefix.to_string(), ask.from.clone(), ask.limit);
        self.blocking(move |inner: &Inner| {
            inner.list(PageAsk {
                prefix: &prefix,
                from: &from,
                limit,
            })
        })
        .await
    }

    async fn adopt(&self, lease: &LeaseRef, by: &Adopter) -> BackendResult<Adopted> {
        let (lease, by) = (lease.clone(), by.clone());
        self.blocking(move |inner| inner.adopt(&lease, &by)).await
    }

    /// Nothing to say: the run's lock is the word.
    async fn confirm_stopped(&self, _: &LeaseRef) -> BackendResult<()> {
        Ok(())
    }

    async fn displaced_stopped(&self, _: &Key, displaced: &Displaced) -> BackendResult<bool> {
        let Some(run) = displaced.lock.clone() else {
            return Ok(true);
        };
        self.blocking(move |inner| {
            inner
                .displaced_stopped(&run)
                .map_err(|e| BackendError::Unavailable(format!("locking a taken-over lock: {e}")))
        })
        .await
    }
}

#[async_trait]
impl Reports for FileBackend {
    async fn put_report(&self, agent: &ReportName, body: Vec<u8>) -> BackendResult<()> {
        let agent = agent.clone();
        self.blocking(move |inner| inner.put_report(&agent, &body))
            .await
    }

    async fn reports(&self) -> BackendResult<Vec<StoredReport>> {
        self.blocking(|inner| inner.reports()).await
    }

    async fn remove_report(&self, agent: &ReportName) -> BackendResult<()> {
        let agent = agent.clone();
        self.blocking(move |inner| inner.remove_report(&agent))
            .await
    }
}
