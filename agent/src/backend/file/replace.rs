//! Writing a file of the lock directory whole: into a spare beside it
//! (`.NAME.spare`), then exchanged with it in one rename. A write that
//! fails half way (a full disk, a quota, an agent killed between its write
//! and its truncation) leaves the file as it was, where a write in place
//! would leave it cut, unreadable and its key unusable. The spare then
//! holds the previous version, and is written over next time: a rename over
//! the file instead makes ext4 start writing the new file out (its
//! `auto_da_alloc`), which cost ~0.7 ms a write here, against ~0.04 ms.

use nix::errno::Errno;
use nix::fcntl::{OFlag, RenameFlags};
use nix::sys::stat::Mode;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::os::unix::io::{AsRawFd, FromRawFd};

use super::settings::FILE_MODE;

/// Replaces `name` in `dir` with `bytes`; `durable`: synced, rename included,
/// before it returns. Only under the lock that orders every writer of `name`.
pub(super) fn replace(dir: &File, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    // A dot name, which no key's file can have.
    let spare = format!(".{name}.spare");
    let dir_fd = Some(dir.as_raw_fd());
    let fd = nix::fcntl::openat(
        dir_fd,
        spare.as_str(),
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(FILE_MODE),
    )?;
    // SAFETY: openat just returned this descriptor and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || meta.nlink() != 1 {
        // Written through, it would change a file runlock did not make.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{spare} is not a plain file with one name; remove it"),
        ));
    }
    file.write_all_at(bytes, 0)?;
    file.set_len(bytes.len() as u64)?;
    if durable {
        file.sync_data()?;
    }
    let exchanged = nix::fcntl::renameat2(
        dir_fd,
        spare.as_str(),
        dir_fd,
        name,
        RenameFlags::RENAME_EXCHANGE,
    );
    match exchanged {
        Ok(()) => {}
        // Not there yet, or a file system that cannot exchange (NFS): moved.
        Err(Errno::ENOENT | Errno::EINVAL | Errno::EOPNOTSUPP | Errno::ENOSYS) => {
            nix::fcntl::renameat(dir_fd, spare.as_str(), dir_fd, name)?
        }
        Err(err) => return Err(err.into()),
    }
    if durable {
        // The rename itself, or a reboot could bring the old file back.
        dir.sync_all()?;
    }
    Ok(())
}
