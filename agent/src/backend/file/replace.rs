//! Writing a file of the lock directory whole: to a name of its own beside
//! it, then renamed over it. A write that fails half way (a full disk, a
//! quota) leaves the file as it was, where a write in place would leave it
//! cut, unreadable and the key unusable.

use super::settings::FILE_MODE;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use std::fs::File;
use std::io::{self, Write as _};
use std::os::unix::io::{AsRawFd, FromRawFd};

/// Replaces `name` in `dir` with `bytes`; `durable`: synced, rename included,
/// before it returns.
pub(super) fn replace(dir: &File, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    // A dot name no key's file can have, unique so that no other writer or
    // a planted file is ever opened in its place.
    let temp = format!(".{name}.{}.new", uuid::Uuid::new_v4().simple());
    let dir_fd = Some(dir.as_raw_fd());
    let fd = nix::fcntl::openat(
        dir_fd,
        temp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(FILE_MODE),
    )?;
    // SAFETY: openat just returned this descriptor and nothing else owns it.
    let mut file = unsafe { File::from_raw_fd(fd) };
    let written = file
        .write_all(bytes)
        .and_then(|()| if durable { file.sync_data() } else { Ok(()) })
        .and_then(|()| Ok(nix::fcntl::renameat(dir_fd, temp.as_str(), dir_fd, name)?));
    if written.is_err() {
        let _ = nix::unistd::unlinkat(
            dir_fd,
            temp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    }
    written?;
    if durable {
        // The rename itself, or a reboot could bring the old file back.
        dir.sync_all()?;
    }
    Ok(())
}
