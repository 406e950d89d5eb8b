//! The file backend's transport: the kernel's locks (`flock` on a key's lock
//! file, OFD locks on the force gate) and the names a key's files have.

use crate::backend::key_name;
use anyhow::Context as _;
use runlock_protocol::Key;
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;

/// The name of a key's record.
pub(super) fn file_name(key: &Key) -> String {
    format!("{}.lock", key_name::escaped(key))
}

/// The name of the empty file whose lock holds a key.
pub(super) fn lock_name(key: &Key) -> String {
    format!("{}.run", key_name::escaped(key))
}

/// The name of the file that keeps the highest token reserved for a key.
pub(super) fn tokens_name(key: &Key) -> String {
    format!("{}.tokens", key_name::escaped(key))
}

/// Takes (`LOCK_EX`), tries (`| LOCK_NB`) or drops (`LOCK_UN`) a `flock`
/// lock; `Ok(false)` when another description holds it.
pub(super) fn flock(file: &File, operation: libc::c_int) -> io::Result<bool> {
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
/// The file is this agent's own, so nobody else should hold it: if someone
/// does, that is said, not waited for.
pub(super) fn flock_excludes(first: &File, second: &File) -> anyhow::Result<()> {
    if !flock(first, libc::LOCK_EX | libc::LOCK_NB).context("flock(LOCK_EX)")? {
        anyhow::bail!(
            "another process holds a lock on it ({})",
            super::blocker::flock_blocker(first)
        );
    }
    let second_got_it = flock(second, libc::LOCK_EX | libc::LOCK_NB).context("flock(LOCK_EX)");
    let _ = flock(second, libc::LOCK_UN);
    let _ = flock(first, libc::LOCK_UN);
    if second_got_it? {
        anyhow::bail!("flock(2) let two opens of one file hold an exclusive lock at once");
    }
    Ok(())
}

pub(super) fn range_lock(kind: libc::c_int) -> libc::flock {
    // SAFETY: flock is plain old data; all-zero is a valid value to start from.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock
}

/// Takes an OFD lock on the whole file within `limit`, trying again every
/// few milliseconds; `Ok(false)` when another still holds it then. Never a
/// blocking wait: whoever holds it could hold it for ever.
pub(super) fn ofd_lock_within(
    file: &File,
    kind: libc::c_int,
    limit: std::time::Duration,
) -> io::Result<bool> {
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_micros(100);
    loop {
        if ofd_lock(file, kind)? {
            return Ok(true);
        }
        if start.elapsed() >= limit {
            return Ok(false);
        }
        super::pause(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(5));
    }
}

/// Tries an OFD lock on the whole file, never waiting; `Ok(false)` when
/// another holds it.
pub(super) fn ofd_lock(file: &File, kind: libc::c_int) -> io::Result<bool> {
    let lock = range_lock(kind);
    loop {
        // SAFETY: the descriptor is open for the call and `lock` outlives it.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) } == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) | Some(libc::EACCES) => return Ok(false),
            _ => return Err(err),
        }
    }
}
