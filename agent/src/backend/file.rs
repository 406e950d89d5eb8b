//! `file://DIR`: two files per key. `KEY.run` is empty and exists only to
//! be locked (`flock`, exclusive); the run holds that locked open file
//! description itself (the agent hands it over, `Grant::lock`), as
//! `flock(1)`'s children do, so the key is held exactly as long as the run's
//! processes live, whether or not an agent does, and a kernel lock has no
//! deadline to miss. The run's descriptor is read-only on the empty file: it
//! can keep or drop the lock, nothing else. `KEY.lock` records the holder
//! and the fencing token, and only agents open it, each write made while
//! holding the key's lock.
//!
//! Force cannot break another process's kernel lock, so it renames a new,
//! locked `KEY.run` over the old one; the old holder still locks the
//! unlinked inode and learns of the loss at its next check, when the name no
//! longer names its inode. `.force.lock` orders a force against every other
//! record write (shared for those, exclusive for force), so no two grants
//! read the same previous token.
//!
//! Making every token durable (`fdatasync`) would double the cost of an
//! acquisition, so tokens are reserved in durable blocks: a record says up to
//! which token it has promised (`reserved`) and on which boot it was written;
//! within a block and a boot a token is written without a sync (the page
//! cache survives an agent's crash), and after a reboot, when an unsynced
//! write may have been lost, the next token starts above the whole block.
//!
//! The directory is opened once and every name is looked up relative to it
//! (`openat`, `renameat`, `fstatat`) with `O_NOFOLLOW`: the agent runs as root
//! for every user of its socket, so a link planted where a lock file belongs
//! is refused, never followed out of the directory. A directory that anyone
//! but root and the agent's user could change is refused at start.

use super::{AcquireSpec, Adopted, Backend, BackendError, Capabilities, Grant, LeaseRef};
use anyhow::Context as _;
use async_trait::async_trait;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use runlock_protocol::{Holder, Key, KeyRecord, KeyState, Scope};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, FromRawFd};
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
    /// The lease that holds the key, so that the next agent can adopt it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ttl_ms: Option<u64>,
    /// Every token up to this one may have been handed out: it is durable,
    /// `token` may not be.
    #[serde(default)]
    reserved: u64,
    /// The boot `token` was written in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    boot_id: String,
}

/// Tokens reserved by one durable write.
const TOKEN_BLOCK: u64 = 1024;

/// The token after `previous`, the block it falls in, and whether that block
/// must be written durably before the token is handed out.
fn next_token(previous: Option<&FileRecord>, boot_id: &str) -> (u64, u64, bool) {
    let (token, reserved, same_boot) = match previous {
        Some(r) => (r.token, r.reserved, r.boot_id == boot_id),
        None => (0, 0, false),
    };
    if same_boot && token < reserved {
        return (token + 1, reserved, false);
    }
    // A reboot may have lost any unsynced token up to `reserved`: start above it.
    let next = token.max(reserved) + 1;
    (next, next + TOKEN_BLOCK - 1, true)
}

/// This boot's id: a record written in another boot may have lost its last tokens.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_string())
        .unwrap_or_default()
}

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
}

/// A lease's lock file, open read-only: the locked description the run also
/// holds, or, for an adopted lease, a description of the same file the run
/// holds the lock through.
struct Held {
    lock: File,
    agent_id: String,
}

/// A record names its holder's command line, which is not for every user.
const FILE_MODE: u32 = 0o640;
const DIR_MODE: u32 = 0o750;
const GATE_FILE: &str = ".force.lock";
/// An empty file on which the agent checks at start that `flock` excludes.
const PROBE_FILE: &str = ".probe.run";
/// How long a failed lock attempt waits before it is believed once more: a
/// `free` record beside a locked file is an agent between taking the lock and
/// writing, or `inspect` looking.
const SECOND_LOOK: Duration = Duration::from_millis(2);

impl FileBackend {
    /// Opens (creating if needed, mode 0750) the lock directory, refusing
    /// one that a user other than root or the agent's own could change.
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
        let inner = Inner {
            dir,
            dir_fd: Mutex::new(Arc::new(dir_fd)),
            held: Mutex::new(HashMap::new()),
            boot_id,
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
        let first = inner.open(&dir, PROBE_FILE, OFlag::O_RDONLY | OFlag::O_CREAT)?;
        let second = inner.open(&dir, PROBE_FILE, OFlag::O_RDONLY)?;
        flock_excludes(&first, &second).with_context(|| {
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
        op: impl FnOnce(&Inner) -> Result<T, BackendError> + Send + 'static,
    ) -> Result<T, BackendError> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
            return tokio::task::block_in_place(|| op(&self.inner));
        }
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || op(&inner))
            .await
            .map_err(|e| BackendError::Unavailable(format!("file backend task failed: {e}")))?
    }
}

/// Opens the lock directory after checking who can change it.
fn open_dir(dir: &Path) -> anyhow::Result<File> {
    let real = resolve_checked(dir)?;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(&real)
        .with_context(|| format!("opening lock directory {}", dir.display()))
}

/// Resolves `dir` one name at a time, following links as the kernel would,
/// and refuses it when a directory looked through on the way, or the lock
/// directory itself, could be changed by someone else (see [`refuse_writers`]):
/// whoever could would choose where the agent writes as root.
fn resolve_checked(dir: &Path) -> anyhow::Result<PathBuf> {
    let absolute = std::path::absolute(dir)
        .with_context(|| format!("resolving lock directory {}", dir.display()))?;
    let mut todo: Vec<std::ffi::OsString> = Vec::new();
    push_components(&mut todo, &absolute);
    let mut real = PathBuf::from("/");
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            real.pop();
            continue;
        }
        refuse_writers(dir, &real, false)?;
        let next = real.join(&name);
        let meta = std::fs::symlink_metadata(&next)
            .with_context(|| format!("resolving lock directory {}", dir.display()))?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > 40 {
                anyhow::bail!("lock directory {}: too many symbolic links", dir.display());
            }
            let target = std::fs::read_link(&next)
                .with_context(|| format!("resolving lock directory {}", dir.display()))?;
            if target.is_absolute() {
                real = PathBuf::from("/");
            }
            push_components(&mut todo, &target);
        } else {
            real = next;
        }
    }
    refuse_writers(dir, &real, true)?;
    Ok(real)
}

/// Pushes `path`'s names so that the first is popped first (`.` dropped).
fn push_components(todo: &mut Vec<std::ffi::OsString>, path: &Path) {
    use std::path::Component;
    let names = path.components().filter_map(|c| match c {
        Component::Normal(name) => Some(name.to_os_string()),
        Component::ParentDir => Some("..".into()),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    });
    let names: Vec<_> = names.collect();
    todo.extend(names.into_iter().rev());
}

/// Like sshd's StrictModes: `place` must belong to root or the agent's user
/// and be writable by no group or other user. A directory on the way (not
/// the lock directory) may be a root-owned sticky one, as /tmp, where no one
/// else can rename or remove what is ours.
fn refuse_writers(dir: &Path, place: &Path, is_lock_dir: bool) -> anyhow::Result<()> {
    let euid = nix::unistd::geteuid().as_raw();
    let meta = std::fs::metadata(place)
        .with_context(|| format!("checking lock directory {}", dir.display()))?;
    let (owner, mode) = (meta.uid(), meta.mode() & 0o7777);
    let sticky_on_the_way = !is_lock_dir && owner == 0 && mode & libc::S_ISVTX != 0;
    let why = if owner != 0 && owner != euid {
        format!("is owned by {}", user_name(owner))
    } else if sticky_on_the_way {
        return Ok(());
    } else {
        match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => format!(
                "is writable by group {} and all users",
                group_name(meta.gid())
            ),
            (true, false) => format!("is writable by group {}", group_name(meta.gid())),
            (false, true) => "is writable by all users".to_string(),
            (false, false) => return Ok(()),
        }
    };
    let owners = match euid {
        0 => "root".to_string(),
        _ => format!("root or {}", user_name(euid)),
    };
    anyhow::bail!(
        "refusing lock directory {}: {} {why} (mode {mode:04o}, owner {}); it and the \
         directories above it must be owned by {owners} and writable by no one else",
        dir.display(),
        place.display(),
        user_name(owner),
    )
}

fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(uid.into()) {
        Ok(Some(user)) => format!("uid {uid} ({})", user.name),
        _ => format!("uid {uid}"),
    }
}

fn group_name(gid: u32) -> String {
    match nix::unistd::Group::from_gid(gid.into()) {
        Ok(Some(group)) => format!("{gid} ({})", group.name),
        _ => gid.to_string(),
    }
}

/// The name of a key's record.
fn file_name(key: &Key) -> String {
    format!("{}.lock", super::key_name::escaped(key))
}

/// The name of the empty file whose lock holds a key.
fn lock_name(key: &Key) -> String {
    format!("{}.run", super::key_name::escaped(key))
}

/// Takes (`LOCK_EX`), tries (`| LOCK_NB`) or drops (`LOCK_UN`) a `flock`
/// lock; `Ok(false)` when another description holds it.
fn flock(file: &File, operation: libc::c_int) -> io::Result<bool> {
    loop {
        // SAFETY: the descriptor is open for the duration of the call.
        if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// Whether a `flock` taken through `first` keeps `second` (another open of
/// the same file) out: the one thing this backend needs of the file system,
/// which some network and FUSE file systems do not do, granting every lock.
fn flock_excludes(first: &File, second: &File) -> anyhow::Result<()> {
    // Blocking: another agent starting may be checking the same file.
    flock(first, libc::LOCK_EX).context("flock(LOCK_EX)")?;
    let second_got_it = flock(second, libc::LOCK_EX | libc::LOCK_NB).context("flock(LOCK_EX)");
    let _ = flock(second, libc::LOCK_UN);
    let _ = flock(first, libc::LOCK_UN);
    if second_got_it? {
        anyhow::bail!("flock(2) let two opens of one file hold an exclusive lock at once");
    }
    Ok(())
}

fn range_lock(kind: libc::c_int) -> libc::flock {
    // SAFETY: flock is plain old data; all-zero is a valid value to start from.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock
}

/// Takes an OFD lock on the whole file; `Ok(false)` when another holds it.
fn ofd_lock(file: &File, kind: libc::c_int, wait: bool) -> io::Result<bool> {
    let lock = range_lock(kind);
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

/// The record (and its holder) that grants `spec` after `previous`, and
/// whether it must be written durably.
fn held_record(
    spec: &AcquireSpec,
    previous: Option<&FileRecord>,
    forced_from: Option<u64>,
    boot_id: &str,
) -> (Holder, FileRecord, bool) {
    let (token, reserved, durable) = next_token(previous, boot_id);
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
        lease_id: Some(spec.lease_id.clone()),
        ttl_ms: Some(spec.ttl.as_millis() as u64),
        reserved,
        boot_id: boot_id.to_string(),
    };
    (holder, record, durable)
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
    /// A name in the lock directory, for messages.
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn io_error(&self, what: &str, name: &str, err: impl Into<io::Error>) -> BackendError {
        let err = err.into();
        BackendError::Unavailable(format!("{what} {}: {err}", self.path(name).display()))
    }

    /// The open lock directory; reopened (and checked again) from its path if
    /// it was deleted, so that runs go on once it is back.
    fn dir(&self) -> Result<Arc<File>, BackendError> {
        // invariant: nothing panics while holding this lock
        let mut dir = self.dir_fd.lock().unwrap_or_else(|e| e.into_inner());
        let gone = dir
            .metadata()
            .map_err(|e| self.io_error("checking", "", e))?
            .nlink()
            == 0;
        if gone {
            let reopened =
                open_dir(&self.dir).map_err(|e| BackendError::Unavailable(format!("{e:#}")))?;
            *dir = Arc::new(reopened);
        }
        Ok(dir.clone())
    }

    /// Opens `name` in `dir`, which must exist (see [`Inner::try_open`]).
    fn open(&self, dir: &File, name: &str, flags: OFlag) -> Result<File, BackendError> {
        self.try_open(dir, name, flags)?
            .ok_or_else(|| self.io_error("opening", name, nix::errno::Errno::ENOENT))
    }

    /// Opens `name` in `dir` (created 0640 with `O_CREAT`), never through a
    /// link; `Ok(None)` when it does not exist. A link, or anything but a
    /// plain file with one name, is `Corrupt`: that key stays unusable until
    /// a person removes it, and nothing outside the directory is touched. A
    /// file opened for writing is tightened to 0640 if it was wider.
    fn try_open(&self, dir: &File, name: &str, flags: OFlag) -> Result<Option<File>, BackendError> {
        let fd = nix::fcntl::openat(
            Some(dir.as_raw_fd()),
            name,
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(FILE_MODE),
        );
        let fd = match fd {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => return Ok(None),
            Err(nix::errno::Errno::ELOOP) => {
                return Err(BackendError::Corrupt(format!(
                    "{} is a symbolic link, which runlock never follows; remove it",
                    self.path(name).display()
                )))
            }
            Err(err) => return Err(self.io_error("opening", name, err)),
        };
        // SAFETY: openat just returned this descriptor and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        let meta = file
            .metadata()
            .map_err(|e| self.io_error("checking", name, e))?;
        if !meta.file_type().is_file() || meta.nlink() != 1 {
            return Err(BackendError::Corrupt(format!(
                "{} is not a plain file with one name (a hard link, a directory or a device); \
                 remove it",
                self.path(name).display()
            )));
        }
        let mode = meta.mode() & 0o7777;
        if flags.contains(OFlag::O_RDWR) && mode & !FILE_MODE != 0 {
            nix::sys::stat::fchmod(file.as_raw_fd(), Mode::from_bits_truncate(mode & FILE_MODE))
                .map_err(|e| self.io_error("restricting the mode of", name, e))?;
        }
        Ok(Some(file))
    }

    /// Whether `name` in `dir` is still `file` (not replaced by a force, or removed).
    fn same_inode(&self, dir: &File, file: &File, name: &str) -> Result<bool, BackendError> {
        let ours = file
            .metadata()
            .map_err(|e| self.io_error("checking", name, e))?;
        match nix::sys::stat::fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(theirs) => Ok(ours.ino() == theirs.st_ino && ours.dev() == theirs.st_dev),
            Err(nix::errno::Errno::ENOENT) => Ok(false),
            Err(err) => Err(self.io_error("checking", name, err)),
        }
    }

    /// The gate, locked shared (plain acquisitions) or exclusive (force).
    /// `None` when `.force.lock` is not a plain file (a planted link): a
    /// force is refused, and a plain acquisition goes ahead without it, as
    /// no agent can force through that gate, so none needs ordering against.
    fn open_gate(&self, dir: &File, exclusive: bool) -> Result<Option<File>, BackendError> {
        let gate = match self.open(dir, GATE_FILE, OFlag::O_RDWR | OFlag::O_CREAT) {
            Ok(gate) => gate,
            Err(BackendError::Corrupt(why)) if !exclusive => {
                tracing::warn!("{why}; every --force is refused until it is removed");
                return Ok(None);
            }
            Err(err) => return Err(err),
        };
        let kind = if exclusive {
            libc::F_WRLCK
        } else {
            libc::F_RDLCK
        };
        ofd_lock(&gate, kind, true).map_err(|e| self.io_error("locking", GATE_FILE, e))?;
        Ok(Some(gate))
    }

    fn remember(&self, lease_id: &str, lock: File, agent_id: &str) {
        let held = Held {
            lock,
            agent_id: agent_id.to_string(),
        };
        // invariant: nothing panics while holding this lock
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lease_id.to_string(), held);
    }

    /// The key's record; `None` when it was never written.
    fn read_record(&self, file: &File, name: &str) -> Result<Option<FileRecord>, BackendError> {
        let bytes = read_bytes(file).map_err(|e| self.io_error("reading", name, e))?;
        if bytes.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            BackendError::Corrupt(format!(
                "lock file {} is not a runlock record ({e}); move it aside to free the key",
                self.path(name).display()
            ))
        })
    }

    /// Writes the record of a key whose lock this agent holds into `file`, the
    /// record file; a new one is made durable with its directory entry.
    fn write(
        &self,
        dir: &File,
        file: &File,
        name: &str,
        record: &FileRecord,
        durable: bool,
    ) -> Result<(), BackendError> {
        let new = file.metadata().map(|m| m.len() == 0).unwrap_or(false);
        write_record(file, record, durable || new)
            .and_then(|_| if new { dir.sync_all() } else { Ok(()) })
            .map_err(|e| self.io_error("writing", name, e))
    }

    fn acquire(&self, spec: &AcquireSpec) -> Result<Grant, BackendError> {
        let sent = tokio::time::Instant::now();
        let dir = self.dir()?;
        let _gate = self.open_gate(&dir, spec.force)?;
        let (name, lock_name) = (file_name(&spec.key), lock_name(&spec.key));
        loop {
            let lock = self.open(&dir, &lock_name, OFlag::O_RDONLY | OFlag::O_CREAT)?;
            if !self.try_lock(&dir, &lock, &lock_name, &name)? {
                let current = self.holder_record(&dir, &name)?;
                if spec.force {
                    return self.take_over(&dir, spec, current);
                }
                return Err(BackendError::Held(
                    current.and_then(|r| r.holder).map(Box::new),
                ));
            }
            // A force may have renamed a new file over the name between our open and lock.
            if !self.same_inode(&dir, &lock, &lock_name)? {
                continue;
            }
            let granted = self
                .open(&dir, &name, OFlag::O_RDWR | OFlag::O_CREAT)
                .and_then(|file| {
                    let previous = self.read_record(&file, &name)?;
                    let (holder, record, durable) =
                        held_record(spec, previous.as_ref(), None, &self.boot_id);
                    self.write(&dir, &file, &name, &record, durable)?;
                    Ok(holder)
                });
            let holder = match granted {
                Ok(holder) => holder,
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
    ) -> Result<bool, BackendError> {
        let attempt = || {
            flock(lock, libc::LOCK_EX | libc::LOCK_NB)
                .map_err(|e| self.io_error("locking", lock_name, e))
        };
        if attempt()? {
            return Ok(true);
        }
        let held = match self.try_open(dir, name, OFlag::O_RDONLY)? {
            Some(file) => matches!(
                self.read_record(&file, name),
                Ok(Some(r)) if r.state == KeyState::Held
            ),
            None => false,
        };
        if held {
            return Ok(false);
        }
        std::thread::sleep(SECOND_LOOK);
        attempt()
    }

    /// The record of a key someone holds, read once its writer is done.
    fn holder_record(&self, dir: &File, name: &str) -> Result<Option<FileRecord>, BackendError> {
        let Some(file) = self.try_open(dir, name, OFlag::O_RDONLY)? else {
            return Ok(None);
        };
        read_record_settled(&file, |r| r.state == KeyState::Held)
            .map_err(|e| self.io_error("reading", name, e))
    }

    /// A duplicate of a held lock file's description, for the run.
    fn run_copy(&self, lock: &File, lock_name: &str) -> Result<OwnedFd, BackendError> {
        lock.try_clone()
            .map(OwnedFd::from)
            .map_err(|e| self.io_error("duplicating", lock_name, e))
    }

    /// Force: a new locked lock file renamed over the old, then the record.
    fn take_over(
        &self,
        dir: &File,
        spec: &AcquireSpec,
        current: Option<FileRecord>,
    ) -> Result<Grant, BackendError> {
        let (name, lock_name) = (file_name(&spec.key), lock_name(&spec.key));
        // A lock with no held record beside it (a run's leftover process that
        // locked its descriptor again) is taken over from the record as it is.
        let current = match current {
            Some(current) => Some(current),
            None => match self.try_open(dir, &name, OFlag::O_RDONLY)? {
                Some(file) => read_record_settled(&file, |_| true)
                    .map_err(|e| self.io_error("reading", &name, e))?,
                None => None,
            },
        };
        let current = current.ok_or_else(|| {
            BackendError::Corrupt(format!(
                "lock file {} is held but its record cannot be read; cannot take it over",
                self.path(&name).display()
            ))
        })?;
        let temp = format!(".take-{}", uuid::Uuid::new_v4());
        let lock = self.open(dir, &temp, OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_EXCL)?;
        let dir_fd = Some(dir.as_raw_fd());
        let placed = flock(&lock, libc::LOCK_EX | libc::LOCK_NB).and_then(|_| {
            Ok(nix::fcntl::renameat(
                dir_fd,
                temp.as_str(),
                dir_fd,
                lock_name.as_str(),
            )?)
        });
        if let Err(e) = placed {
            let _ = nix::unistd::unlinkat(
                dir_fd,
                temp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return Err(self.io_error("replacing", &lock_name, e));
        }
        let (holder, record, durable) =
            held_record(spec, Some(&current), Some(current.token), &self.boot_id);
        let file = self.open(dir, &name, OFlag::O_RDWR | OFlag::O_CREAT)?;
        self.write(dir, &file, &name, &record, durable)?;
        let run = self.run_copy(&lock, &lock_name)?;
        self.remember(&spec.lease_id, lock, &spec.holder.agent_id);
        Ok(Grant {
            holder,
            sent: tokio::time::Instant::now(),
            lock: Some(run),
        })
    }

    fn renew(&self, lease: &LeaseRef) -> Result<(), BackendError> {
        let dir = self.dir()?;
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
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
    fn release(&self, lease: &LeaseRef) -> Result<(), BackendError> {
        let Some(held) = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&lease.lease_id)
        else {
            return Ok(());
        };
        let (name, lock_name) = (file_name(&lease.key), lock_name(&lease.key));
        let dir = self.dir()?;
        let _gate = self.open_gate(&dir, false)?;
        let ours = flock(&held.lock, libc::LOCK_EX | libc::LOCK_NB)
            .map_err(|e| self.io_error("locking", &lock_name, e))?
            && self.same_inode(&dir, &held.lock, &lock_name)?;
        if !ours {
            return Ok(()); // someone else holds the key, or the run still does (an adopted lease)
        }
        let result = self.free_record(&dir, &name, lease, &held.agent_id);
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
    ) -> Result<(), BackendError> {
        let Some(file) = self.try_open(dir, name, OFlag::O_RDWR)? else {
            return Ok(());
        };
        let Some(mut record) = self.read_record(&file, name)? else {
            return Ok(());
        };
        let ours = record.state == KeyState::Held
            && record.lease_id.as_deref() == Some(lease.lease_id.as_str())
            && record.token == lease.token
            && record
                .holder
                .as_ref()
                .is_some_and(|h| h.agent_id == agent_id);
        if !ours {
            return Ok(());
        }
        record.state = KeyState::Free;
        record.holder = None;
        record.lease_id = None;
        record.ttl_ms = None;
        record.forced_from = None;
        // Not synced: a lost `free` record is harmless, the kernel lock is the truth.
        self.write(dir, &file, name, &record, false)
    }

    /// Takes over a lease granted through an agent that has stopped, whose
    /// run still holds the lock: the record must name the lease and its
    /// token, and the key's lock file must be locked (by the run) or free
    /// (then this agent holds it, as nobody else took the key since).
    fn adopt(&self, lease: &LeaseRef, agent_id: &str) -> Result<Adopted, BackendError> {
        let (name, lock_name) = (file_name(&lease.key), lock_name(&lease.key));
        let dir = self.dir()?;
        let _gate = self.open_gate(&dir, false)?;
        let lock = self
            .try_open(&dir, &lock_name, OFlag::O_RDONLY)?
            .ok_or(BackendError::LeaseMismatch)?;
        let file = self
            .try_open(&dir, &name, OFlag::O_RDWR)?
            .ok_or(BackendError::LeaseMismatch)?;
        let Some(mut record) = self.read_record(&file, &name)?.filter(|r| {
            r.state == KeyState::Held
                && r.lease_id.as_deref() == Some(lease.lease_id.as_str())
                && r.token == lease.token
        }) else {
            return Err(BackendError::LeaseMismatch);
        };
        let mut holder = record.holder.clone().ok_or_else(|| {
            BackendError::Corrupt(format!(
                "{} is held but names no holder",
                self.path(&name).display()
            ))
        })?;
        // Whether the run holds it or nobody does, nobody else can take it now.
        let _ = flock(&lock, libc::LOCK_EX | libc::LOCK_NB)
            .map_err(|e| self.io_error("locking", &lock_name, e))?;
        holder.agent_id = agent_id.to_string();
        record.holder = Some(holder.clone());
        self.write(&dir, &file, &name, &record, false)?;
        let ttl = Duration::from_millis(record.ttl_ms.unwrap_or(60_000));
        self.remember(&lease.lease_id, lock, agent_id);
        Ok(Adopted {
            grant: Grant {
                holder,
                sent: tokio::time::Instant::now(),
                lock: None,
            },
            ttl,
        })
    }

    fn inspect(&self, key: &Key) -> Result<KeyRecord, BackendError> {
        let (name, lock_name) = (file_name(key), lock_name(key));
        let mut answer = KeyRecord {
            key: key.to_string(),
            state: KeyState::Free,
            token: 0,
            holder: None,
            expires_in_ms: None,
            scope: Scope::Host,
        };
        let dir = self.dir()?;
        let Some(file) = self.try_open(&dir, &name, OFlag::O_RDONLY)? else {
            return Ok(answer);
        };
        let Some(record) =
            read_record_settled(&file, |_| true).map_err(|e| self.io_error("reading", &name, e))?
        else {
            return Ok(answer);
        };
        answer.token = record.token;
        if record.state != KeyState::Held {
            return Ok(answer);
        }
        // A record left held by a run that ended with no agent to tell: the
        // lock says whether anyone still holds the key. Shared, and only for
        // an instant, so it never stands in a holder's way for long.
        let locked = match self.try_open(&dir, &lock_name, OFlag::O_RDONLY)? {
            Some(lock) => {
                let free = flock(&lock, libc::LOCK_SH | libc::LOCK_NB)
                    .map_err(|e| self.io_error("checking", &lock_name, e))?;
                !free
            }
            None => false,
        };
        if locked {
            answer.state = KeyState::Held;
            answer.holder = record.holder;
        }
        Ok(answer)
    }
}

#[async_trait]
impl Backend for FileBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            scope: Scope::Host,
            survives_agent: true,
            // Only to notice a force, which renames a new lock file over ours.
            needs_renewal: true,
            lease_expires: false,
            run_holds_lock: true,
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

    async fn adopt(&self, lease: &LeaseRef, agent_id: &str) -> Result<Adopted, BackendError> {
        let (lease, agent_id) = (lease.clone(), agent_id.to_string());
        self.blocking(move |inner| inner.adopt(&lease, &agent_id))
            .await
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

    fn record_at(dir: &Path, name: &str) -> FileRecord {
        serde_json::from_slice(&std::fs::read(dir.join(name)).expect("read")).expect("a record")
    }

    #[tokio::test]
    async fn the_run_gets_the_lock_read_only_on_an_empty_file_apart_from_the_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let backend = FileBackend::open(dir.path().into()).expect("open");
        let grant = backend
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect("free key");
        let lock = File::from(grant.lock.expect("a lock for the run"));
        let flags =
            nix::fcntl::fcntl(lock.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL).expect("flags");
        assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY);
        assert!(
            (&lock).write_all(b"token 0").is_err(),
            "the run could write"
        );
        let ino = |path: &Path| std::fs::metadata(path).expect("stat").ino();
        let meta = lock.metadata().expect("stat");
        assert_eq!(meta.len(), 0);
        assert_eq!(meta.ino(), ino(&dir.path().join("k.run")));
        assert_ne!(meta.ino(), ino(&dir.path().join("k.lock")));
        assert_eq!(meta.mode() & 0o7777 & !FILE_MODE, 0);
    }

    #[tokio::test]
    async fn a_lock_the_run_holds_outlives_its_agent_and_is_adopted_by_the_next() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = Key::new("k").expect("valid");
        let old = FileBackend::open(dir.path().into()).expect("open");
        let run = old
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect("free key")
            .lock
            .expect("a lock for the run");
        drop(old); // the agent dies; every descriptor it had is closed

        let new = FileBackend::open(dir.path().into()).expect("open");
        assert!(matches!(
            new.acquire(&spec("k", "l2", false, TTL)).await,
            Err(BackendError::Held(Some(h))) if h.token == 1
        ));
        assert_eq!(
            new.inspect(&key).await.expect("inspect").state,
            KeyState::Held
        );
        assert!(matches!(
            new.adopt(&lease("k", "l1", 2), "new-agent").await,
            Err(BackendError::LeaseMismatch)
        ));
        assert!(matches!(
            new.adopt(&lease("k", "other", 1), "new-agent").await,
            Err(BackendError::LeaseMismatch)
        ));
        let adopted = new
            .adopt(&lease("k", "l1", 1), "new-agent")
            .await
            .expect("adopt");
        assert_eq!(
            (
                adopted.grant.holder.token,
                adopted.grant.holder.agent_id.as_str()
            ),
            (1, "new-agent")
        );
        assert_eq!(adopted.ttl, TTL);
        new.renew(&lease("k", "l1", 1), TTL)
            .await
            .expect("still ours");
        // Held by the run alone: the adopting agent's copy does not lock it.
        assert!(matches!(
            new.acquire(&spec("k", "l3", false, TTL)).await,
            Err(BackendError::Held(_))
        ));

        // The run ends (its shim drops the lock), then the agent releases.
        flock(&File::from(run), libc::LOCK_UN).expect("unlock");
        new.release(&lease("k", "l1", 1)).await.expect("release");
        let record = record_at(dir.path(), "k.lock");
        assert_eq!((record.state, record.token), (KeyState::Free, 1));
        let next = new
            .acquire(&spec("k", "l4", false, TTL))
            .await
            .expect("free");
        assert_eq!(next.holder.token, 2);
    }

    #[tokio::test]
    async fn a_lock_taken_again_after_release_is_held_and_force_takes_it_higher() {
        let dir = tempfile::tempdir().expect("tempdir");
        let backend = FileBackend::open(dir.path().into()).expect("open");
        let run = backend
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect("free");
        let run = File::from(run.lock.expect("a lock for the run"));
        flock(&run, libc::LOCK_UN).expect("the shim drops it");
        backend
            .release(&lease("k", "l1", 1))
            .await
            .expect("release");
        // A process the run left behind locks its inherited description again.
        assert!(flock(&run, libc::LOCK_EX | libc::LOCK_NB).expect("relock"));
        assert!(matches!(
            backend.acquire(&spec("k", "l2", false, TTL)).await,
            Err(BackendError::Held(None))
        ));
        let forced = backend
            .acquire(&spec("k", "l3", true, TTL))
            .await
            .expect("force");
        assert_eq!(forced.holder.token, 2);
    }

    #[tokio::test]
    async fn a_record_left_held_by_a_run_that_ended_alone_reads_as_free() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = Key::new("k").expect("valid");
        let old = FileBackend::open(dir.path().into()).expect("open");
        let run = old
            .acquire(&spec("k", "l1", false, TTL))
            .await
            .expect("free");
        drop((old, run)); // agent and run both gone, the record still says held
        assert_eq!(record_at(dir.path(), "k.lock").state, KeyState::Held);
        let new = FileBackend::open(dir.path().into()).expect("open");
        let record = new.inspect(&key).await.expect("inspect");
        assert_eq!(
            (record.state, record.token, record.holder),
            (KeyState::Free, 1, None)
        );
        let next = new
            .acquire(&spec("k", "l2", false, TTL))
            .await
            .expect("free");
        assert_eq!(next.holder.token, 2);
    }

    #[test]
    fn a_lock_that_lets_a_second_holder_in_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        File::create(&path).expect("create");
        let first = File::open(&path).expect("open");
        let second = File::open(&path).expect("open");
        flock_excludes(&first, &second).expect("two opens exclude each other here");
        // A duplicate shares the open file description, so its lock is the
        // same lock: what a file system that grants every lock looks like.
        let same = first.try_clone().expect("dup");
        let err = flock_excludes(&first, &same).expect_err("caught");
        assert!(err.to_string().contains("at once"), "{err}");
        assert!(
            flock(&second, libc::LOCK_EX | libc::LOCK_NB).expect("try"),
            "left unlocked"
        );
    }

    #[test]
    fn tokens_come_from_durable_blocks_and_a_new_boot_starts_above_the_block() {
        let record = |token, reserved, boot: &str| FileRecord {
            key: "k".into(),
            state: KeyState::Free,
            token,
            holder: None,
            forced_from: None,
            lease_id: None,
            ttl_ms: None,
            reserved,
            boot_id: boot.into(),
        };
        assert_eq!(next_token(None, "a"), (1, TOKEN_BLOCK, true));
        assert_eq!(
            next_token(Some(&record(1, 1024, "a")), "a"),
            (2, 1024, false)
        );
        assert_eq!(
            next_token(Some(&record(1023, 1024, "a")), "a"),
            (1024, 1024, false)
        );
        assert_eq!(
            next_token(Some(&record(1024, 1024, "a")), "a"),
            (1025, 2048, true)
        );
        // After a reboot the record may lag behind what was handed out.
        assert_eq!(
            next_token(Some(&record(3, 1024, "a")), "b"),
            (1025, 2048, true)
        );
        // A record from before blocks (no reservation) goes on from its token.
        assert_eq!(next_token(Some(&record(7, 0, "")), "b"), (8, 1031, true));
    }

    #[tokio::test]
    async fn after_a_reboot_no_token_handed_out_before_it_comes_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let before = FileBackend::open_in_boot(dir.path().into(), "boot-1".into()).expect("open");
        let mut handed_out = Vec::new();
        for i in 0..3 {
            let id = format!("l{i}");
            let grant = before
                .acquire(&spec("k", &id, false, TTL))
                .await
                .expect("free");
            handed_out.push(grant.holder.token);
            before
                .release(&lease("k", &id, grant.holder.token))
                .await
                .expect("release");
        }
        assert_eq!(handed_out, [1, 2, 3]);
        assert_eq!(record_at(dir.path(), "k.lock").reserved, TOKEN_BLOCK);
        drop(before);
        // Power lost before tokens 2 and 3 reached the disk: it holds the first grant's record.
        let mut lagging = record_at(dir.path(), "k.lock");
        lagging.token = 1;
        std::fs::write(
            dir.path().join("k.lock"),
            serde_json::to_vec(&lagging).expect("json"),
        )
        .expect("write");
        let after = FileBackend::open_in_boot(dir.path().into(), "boot-2".into()).expect("open");
        let grant = after
            .acquire(&spec("k", "l9", false, TTL))
            .await
            .expect("free");
        assert_eq!(grant.holder.token, TOKEN_BLOCK + 1);
        assert_eq!(record_at(dir.path(), "k.lock").reserved, 2 * TOKEN_BLOCK);
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

    fn corrupt_naming(result: Result<Grant, BackendError>, name: &str) -> String {
        match result {
            Err(BackendError::Corrupt(msg)) => {
                assert!(msg.contains(name), "{msg}");
                msg
            }
            other => panic!("expected corrupt naming {name}, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_planted_link_is_refused_never_followed_and_other_keys_go_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let precious = outside.path().join("precious");
        let absent = outside.path().join("absent");
        std::fs::write(&precious, b"keep me").expect("write");
        let backend = FileBackend::open(dir.path().into()).expect("open");
        std::os::unix::fs::symlink(&precious, dir.path().join("k.lock")).expect("link");
        std::os::unix::fs::symlink(&absent, dir.path().join("d.lock")).expect("link");

        let msg = corrupt_naming(
            backend.acquire(&spec("k", "l1", false, TTL)).await,
            "k.lock",
        );
        assert!(msg.contains("symbolic link"), "{msg}");
        corrupt_naming(backend.acquire(&spec("k", "l2", true, TTL)).await, "k.lock");
        corrupt_naming(
            backend.acquire(&spec("d", "l3", false, TTL)).await,
            "d.lock",
        );
        corrupt_naming(backend.acquire(&spec("d", "l4", true, TTL)).await, "d.lock");
        assert!(matches!(
            backend.inspect(&Key::new("k").expect("valid")).await,
            Err(BackendError::Corrupt(_))
        ));
        assert_eq!(std::fs::read(&precious).expect("read"), b"keep me");
        assert!(!absent.exists(), "the link's target was created");
        let other = backend
            .acquire(&spec("other", "l5", false, TTL))
            .await
            .expect("another key is unaffected");
        assert_eq!(other.holder.token, 1);
    }

    #[tokio::test]
    async fn a_linked_gate_refuses_force_and_lets_plain_acquisitions_go_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let target = outside.path().join("gate-target");
        let backend = FileBackend::open(dir.path().into()).expect("open");
        std::fs::remove_file(dir.path().join(GATE_FILE)).expect("remove the gate");
        std::os::unix::fs::symlink(&target, dir.path().join(GATE_FILE)).expect("link");
        corrupt_naming(
            backend.acquire(&spec("k", "l1", true, TTL)).await,
            GATE_FILE,
        );
        backend
            .acquire(&spec("k", "l2", false, TTL))
            .await
            .expect("plain acquisitions need no gate no force can take");
        assert!(!target.exists(), "the gate's target was created");
        // An agent started on such a directory serves too.
        FileBackend::open(dir.path().into()).expect("open with a linked gate");
        assert!(!target.exists(), "the gate's target was created");
    }

    #[tokio::test]
    async fn lock_files_are_0640_and_a_wider_one_is_tightened() {
        use std::os::unix::fs::PermissionsExt;
        let top = tempfile::tempdir().expect("tempdir");
        let dir = top.path().join("new").join("locks");
        let backend = FileBackend::open(dir.clone()).expect("open");
        let mode = |path: &Path| std::fs::metadata(path).expect("stat").mode() & 0o7777;
        assert_eq!(mode(&dir) & !DIR_MODE, 0, "directory mode {:o}", mode(&dir));
        let wide = dir.join("wide.lock");
        std::fs::write(&wide, b"").expect("write");
        std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        backend
            .acquire(&spec("wide", "l1", false, TTL))
            .await
            .expect("free key");
        assert_eq!(mode(&wide), 0o640);
        backend
            .acquire(&spec("fresh", "l2", false, TTL))
            .await
            .expect("free key");
        let fresh = mode(&dir.join("fresh.lock"));
        assert_eq!(fresh & !FILE_MODE, 0, "new lock file mode {fresh:o}");
    }

    #[test]
    fn a_directory_others_can_change_is_refused_naming_it() {
        use std::os::unix::fs::PermissionsExt;
        let chmod = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod")
        };
        let top = tempfile::tempdir().expect("tempdir");
        let locks = top.path().join("locks");
        std::fs::create_dir(&locks).expect("mkdir");
        for (mode, who) in [(0o770, "group"), (0o703, "all users")] {
            chmod(&locks, mode);
            let Err(err) = FileBackend::open(locks.clone()) else {
                panic!("mode {mode:o} was accepted");
            };
            let msg = format!("{err:#}");
            assert!(msg.contains(&locks.display().to_string()), "{msg}");
            assert!(
                msg.contains(who) && msg.contains(&format!("{mode:04o}")),
                "{msg}"
            );
        }
        chmod(&locks, 0o700);
        FileBackend::open(locks.clone()).expect("a private directory");

        // A parent anyone can write, or one a link passes through, is refused too.
        let open = top.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        chmod(&open, 0o777);
        std::fs::create_dir(open.join("locks")).expect("mkdir");
        std::os::unix::fs::symlink(&locks, open.join("link")).expect("link");
        for given in [open.join("locks"), open.join("link")] {
            let Err(err) = FileBackend::open(given.clone()) else {
                panic!("{} was accepted", given.display());
            };
            let msg = format!("{err:#}");
            assert!(
                msg.contains(&format!("{} is writable by", open.display())) && msg.contains("0777"),
                "{msg}"
            );
        }
    }
}
