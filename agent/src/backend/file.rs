//! `file://DIR`: one file per key, held with an open-file-description lock
//! (`F_OFD_SETLK`), so the kernel releases a key the moment the agent dies.
//! The file also records the holder and the fencing token, which survives
//! every release and restart.
//!
//! Force cannot break another process's kernel lock, so it writes a new file
//! (locked, with a larger token) and renames it over the key's path; the old
//! holder still locks the unlinked inode and learns of the loss at its next
//! renewal, when the path no longer names its inode. `.force.lock` orders a
//! force against plain acquisitions (shared for those, exclusive for force),
//! so no two grants read the same previous token.

use super::{AcquireSpec, Backend, BackendError, Capabilities, Grant, LeaseRef};
use async_trait::async_trait;
use runlock_protocol::{Holder, Key, KeyRecord, KeyState, Scope};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The record each key's file holds, as JSON a person can read.
#[derive(Debug, Serialize, Deserialize)]
struct FileRecord {
    key: String,
    state: KeyState,
    token: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder: Option<Holder>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    forced_from: Option<u64>,
}

/// A directory of lock files.
#[derive(Clone)]
pub struct FileBackend {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    /// Open (and so locked) files by lease id; dropping one unlocks its key.
    held: Mutex<HashMap<String, File>>,
}

impl FileBackend {
    /// Opens (creating if needed) the lock directory.
    pub fn open(dir: PathBuf) -> anyhow::Result<FileBackend> {
        use anyhow::Context as _;
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating lock directory {}", dir.display()))?;
        let probe = dir.join(GATE_FILE);
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&probe)
            .with_context(|| format!("lock directory {} is not writable", dir.display()))?;
        Ok(FileBackend {
            inner: Arc::new(Inner {
                dir,
                held: Mutex::new(HashMap::new()),
            }),
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Inner) -> Result<T, BackendError> + Send + 'static,
    ) -> Result<T, BackendError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || op(&inner))
            .await
            .map_err(|e| BackendError::Unavailable(format!("file backend task failed: {e}")))?
    }
}

const GATE_FILE: &str = ".force.lock";

/// Opens (creating if needed) a file we lock and write in place.
fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)
}

fn io_error(what: &str, path: &Path, err: io::Error) -> BackendError {
    BackendError::Unavailable(format!("{what} {}: {err}", path.display()))
}

/// The file name for a key.
fn file_name(key: &Key) -> String {
    format!("{}.lock", super::key_name::escaped(key))
}

fn flock(kind: libc::c_int) -> libc::flock {
    // SAFETY: flock is plain old data; all-zero is a valid value to start from.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock
}

/// Takes an OFD lock on the whole file; `Ok(false)` when another holds it.
fn ofd_lock(file: &File, kind: libc::c_int, wait: bool) -> io::Result<bool> {
    let lock = flock(kind);
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    loop {
        // SAFETY: the descriptor is open for the call and `lock` outlives it.
        if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &lock) } == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) | Some(libc::EACCES) if !wait => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// Whether some other open file description holds a write-conflicting lock.
fn ofd_is_locked(file: &File) -> io::Result<bool> {
    let mut lock = flock(libc::F_WRLCK);
    // SAFETY: as above; F_OFD_GETLK writes into `lock`.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut lock) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
}

fn same_inode(file: &File, path: &Path) -> io::Result<bool> {
    let ours = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(theirs) => Ok(ours.ino() == theirs.ino() && ours.dev() == theirs.dev()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn read_bytes(mut file: &File) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.rewind()?;
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Writes the record in place (the lock belongs to this inode, so no rename).
fn write_record(mut file: &File, record: &FileRecord, durable: bool) -> io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    bytes.push(b'\n');
    file.rewind()?;
    file.write_all(&bytes)?;
    file.set_len(bytes.len() as u64)?;
    if durable {
        // The token must never go backwards, even across a power loss.
        file.sync_data()?;
    }
    Ok(())
}

/// The record (and its holder) that grants `spec` with `token`.
fn held_record(spec: &AcquireSpec, token: u64, forced_from: Option<u64>) -> (Holder, FileRecord) {
    let holder = Holder {
        token,
        ..spec.holder.clone()
    };
    let record = FileRecord {
        key: spec.key.to_string(),
        state: KeyState::Held,
        token,
        holder: Some(holder.clone()),
        forced_from,
    };
    (holder, record)
}

/// Reads a record another process may be writing this instant: a torn read
/// (a short or mixed file) is retried briefly. `Ok(None)` means it stayed
/// empty or unreadable.
fn read_record_settled(
    file: &File,
    wanted: impl Fn(&FileRecord) -> bool,
) -> io::Result<Option<FileRecord>> {
    for _ in 0..50 {
        let bytes = read_bytes(file)?;
        if let Ok(record) = serde_json::from_slice::<FileRecord>(&bytes) {
            if wanted(&record) {
                return Ok(Some(record));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(None)
}

impl Inner {
    fn path(&self, key: &Key) -> PathBuf {
        self.dir.join(file_name(key))
    }

    fn open_gate(&self, exclusive: bool) -> Result<File, BackendError> {
        let path = self.dir.join(GATE_FILE);
        let gate = open_rw(&path).map_err(|e| io_error("opening", &path, e))?;
        let kind = if exclusive {
            libc::F_WRLCK
        } else {
            libc::F_RDLCK
        };
        ofd_lock(&gate, kind, true).map_err(|e| io_error("locking", &path, e))?;
        Ok(gate)
    }

    fn remember(&self, lease_id: &str, file: File) {
        // invariant: nothing panics while holding this lock
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lease_id.to_string(), file);
    }

    fn acquire(&self, spec: &AcquireSpec) -> Result<Grant, BackendError> {
        let sent = tokio::time::Instant::now();
        let _gate = self.open_gate(spec.force)?;
        let path = self.path(&spec.key);
        loop {
            let file = open_rw(&path).map_err(|e| io_error("opening", &path, e))?;
            if !ofd_lock(&file, libc::F_WRLCK, false).map_err(|e| io_error("locking", &path, e))? {
                let current = read_record_settled(&file, |r| r.state == KeyState::Held)
                    .map_err(|e| io_error("reading", &path, e))?;
                if spec.force {
                    return self.take_over(spec, &path, current);
                }
                return Err(BackendError::Held(
                    current.and_then(|r| r.holder).map(Box::new),
                ));
            }
            // A force may have renamed a new file over the path between our open and lock.
            if !same_inode(&file, &path).map_err(|e| io_error("checking", &path, e))? {
                continue;
            }
            let bytes = read_bytes(&file).map_err(|e| io_error("reading", &path, e))?;
            let previous = if bytes.is_empty() {
                0
            } else {
                serde_json::from_slice::<FileRecord>(&bytes)
                    .map_err(|e| {
                        BackendError::Corrupt(format!(
                            "lock file {} is not a runlock record ({e}); move it aside to free the key",
                            path.display()
                        ))
                    })?
                    .token
            };
            let (holder, record) = held_record(spec, previous + 1, None);
            write_record(&file, &record, true).map_err(|e| io_error("writing", &path, e))?;
            self.remember(&spec.lease_id, file);
            return Ok(Grant { holder, sent });
        }
    }

    /// Force: a new locked file with a larger token renamed over the path.
    fn take_over(
        &self,
        spec: &AcquireSpec,
        path: &Path,
        current: Option<FileRecord>,
    ) -> Result<Grant, BackendError> {
        let current = current.ok_or_else(|| {
            BackendError::Corrupt(format!(
                "lock file {} is held but its record cannot be read; cannot take it over",
                path.display()
            ))
        })?;
        let temp = self.dir.join(format!(".take-{}", spec.lease_id));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&temp)
            .map_err(|e| io_error("creating", &temp, e))?;
        let (holder, record) = held_record(spec, current.token + 1, Some(current.token));
        let placed = ofd_lock(&file, libc::F_WRLCK, false)
            .and_then(|_| write_record(&file, &record, true))
            .and_then(|_| std::fs::rename(&temp, path))
            .and_then(|_| File::open(&self.dir)?.sync_all());
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&temp);
            return Err(io_error("replacing", path, e));
        }
        self.remember(&spec.lease_id, file);
        Ok(Grant {
            holder,
            sent: tokio::time::Instant::now(),
        })
    }

    fn renew(&self, lease: &LeaseRef) -> Result<(), BackendError> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let file = held
            .get(&lease.lease_id)
            .ok_or(BackendError::LeaseMismatch)?;
        let path = self.path(&lease.key);
        match same_inode(file, &path) {
            Ok(true) => Ok(()),
            Ok(false) => Err(BackendError::LeaseMismatch),
            Err(e) => Err(io_error("checking", &path, e)),
        }
    }

    fn release(&self, lease: &LeaseRef) -> Result<(), BackendError> {
        let Some(file) = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&lease.lease_id)
        else {
            return Ok(());
        };
        let path = self.path(&lease.key);
        // Leave a `free` record (keeping the token) only if the path is still ours;
        // after a force it names the new holder's file.
        if same_inode(&file, &path).unwrap_or(false) {
            let record = FileRecord {
                key: lease.key.to_string(),
                state: KeyState::Free,
                token: lease.token,
                holder: None,
                forced_from: None,
            };
            // Not synced: a lost `free` record is harmless, the kernel lock is the truth.
            write_record(&file, &record, false).map_err(|e| io_error("writing", &path, e))?;
        }
        drop(file); // closing the description drops the lock
        Ok(())
    }

    fn inspect(&self, key: &Key) -> Result<KeyRecord, BackendError> {
        let path = self.path(key);
        let mut record = KeyRecord {
            key: key.to_string(),
            state: KeyState::Free,
            token: 0,
            holder: None,
            expires_in_ms: None,
            scope: Scope::Host,
        };
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(record),
            Err(e) => return Err(io_error("opening", &path, e)),
        };
        let locked = ofd_is_locked(&file).map_err(|e| io_error("checking", &path, e))?;
        let wanted = |r: &FileRecord| !locked || r.state == KeyState::Held;
        let stored =
            read_record_settled(&file, wanted).map_err(|e| io_error("reading", &path, e))?;
        if locked {
            record.state = KeyState::Held;
        }
        if let Some(stored) = stored {
            record.token = stored.token;
            record.holder = if locked { stored.holder } else { None };
        }
        Ok(record)
    }
}

#[async_trait]
impl Backend for FileBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            scope: Scope::Host,
            survives_agent: false,
            needs_renewal: true,
        }
    }

    fn describe(&self) -> String {
        format!("file://{}", self.inner.dir.display())
    }

    async fn acquire(&self, spec: &AcquireSpec) -> Result<Grant, BackendError> {
        let spec = spec.clone();
        self.blocking(move |inner| inner.acquire(&spec)).await
    }

    async fn renew(&self, lease: &LeaseRef, _ttl: Duration) -> Result<(), BackendError> {
        let lease = lease.clone();
        self.blocking(move |inner| inner.renew(&lease)).await
    }

    async fn release(&self, lease: &LeaseRef) -> Result<(), BackendError> {
        let lease = lease.clone();
        self.blocking(move |inner| inner.release(&lease)).await
    }

    async fn inspect(&self, key: &Key) -> Result<KeyRecord, BackendError> {
        let key = key.clone();
        self.blocking(move |inner| inner.inspect(&key)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fixtures::{lease, spec};

    const TTL: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn two_backends_on_one_directory_exclude_each_other_and_tokens_grow() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = FileBackend::open(dir.path().into()).expect("open");
        let two = FileBackend::open(dir.path().into()).expect("open");
        let first = one
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect("free key");
        assert_eq!(first.holder.token, 1);
        match two.acquire(&spec("k", "l2", false, TTL)).await {
            Err(BackendError::Held(Some(h))) => assert_eq!(h.token, 1),
            other => panic!("expected held, got {other:?}"),
        }
        assert_eq!(
            two.inspect(&Key::new("k").expect("valid"))
                .await
                .expect("inspect")
                .state,
            KeyState::Held
        );
        one.release(&lease("k", "l1", 1)).await.expect("release");
        let record = two
            .inspect(&Key::new("k").expect("valid"))
            .await
            .expect("inspect");
        assert_eq!((record.state, record.token), (KeyState::Free, 1));
        let second = two
            .acquire(&spec("k", "l2", false, TTL))
            .await
            .expect("freed");
        assert_eq!(second.holder.token, 2);
    }

    #[tokio::test]
    async fn force_takes_over_and_the_old_holder_sees_the_loss_at_renewal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = FileBackend::open(dir.path().into()).expect("open");
        let two = FileBackend::open(dir.path().into()).expect("open");
        one.acquire(&spec("k", "l1", false, TTL))
            .await
            .expect("free key");
        let forced = two
            .acquire(&spec("k", "l2", true, TTL))
            .await
            .expect("force");
        assert_eq!(forced.holder.token, 2);
        assert!(matches!(
            one.renew(&lease("k", "l1", 1), Duration::from_secs(1))
                .await,
            Err(BackendError::LeaseMismatch)
        ));
        two.renew(&lease("k", "l2", 2), Duration::from_secs(1))
            .await
            .expect("still ours");
        // The loser's release must not overwrite the new holder's record.
        one.release(&lease("k", "l1", 1)).await.expect("release");
        let record = one
            .inspect(&Key::new("k").expect("valid"))
            .await
            .expect("inspect");
        assert_eq!((record.state, record.token), (KeyState::Held, 2));
        two.release(&lease("k", "l2", 2)).await.expect("release");
        assert_eq!(
            one.acquire(&spec("k", "l3", false, TTL))
                .await
                .expect("free")
                .holder
                .token,
            3
        );
    }

    #[tokio::test]
    async fn a_corrupt_record_is_reported_not_overwritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let backend = FileBackend::open(dir.path().into()).expect("open");
        std::fs::write(dir.path().join("k.lock"), b"not json").expect("write");
        match backend.acquire(&spec("k", "l1", false, TTL)).await {
            Err(BackendError::Corrupt(msg)) => assert!(msg.contains("k.lock"), "{msg}"),
            other => panic!("expected corrupt, got {other:?}"),
        }
        assert_eq!(
            std::fs::read(dir.path().join("k.lock")).expect("read"),
            b"not json"
        );
    }
}
