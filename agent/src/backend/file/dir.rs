//! The lock directory's names, each looked up through the directory's open
//! descriptor with `O_NOFOLLOW`: a name never resolves through a symbolic
//! link, and whether a file opened is still the one its name holds can be
//! asked (`same_inode`).

use super::*;
use crate::unpoisoned::Unpoisoned;

impl Inner {
    /// A name in the lock directory, for messages.
    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The open lock directory; reopened (and checked again) from its path if
    /// it was deleted, so that runs go on once it is back.
    pub(super) fn dir(&self) -> BackendResult<Arc<File>> {
        let mut dir = self.dir_fd.locked();
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

    /// The names in `dir` (those that are UTF-8: every name this backend
    /// writes), unsorted.
    pub(super) fn names_in(&self, dir: &File) -> BackendResult<Vec<String>> {
        let mut listing = nix::dir::Dir::openat(
            Some(dir.as_raw_fd()),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.io_error("listing", "", e))?;
        let mut names = Vec::new();
        for entry in listing.iter() {
            let entry = entry.map_err(|e| self.io_error("listing", "", e))?;
            if let Ok(name) = entry.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }

    /// Opens `name` in `dir`, which must exist (see [`Inner::try_open`]).
    pub(super) fn open(&self, dir: &File, name: &str, flags: OFlag) -> BackendResult<File> {
        self.try_open(dir, name, flags)?
            .ok_or_else(|| self.io_error("opening", name, nix::errno::Errno::ENOENT))
    }

    /// Opens `name` in `dir` (created 0600 with `O_CREAT`), never through a
    /// link; `Ok(None)` when it does not exist. A link, or anything but a
    /// plain file with one name, is `Corrupt`: that key stays unusable until
    /// a person removes it, and nothing outside the directory is touched. A
    /// file wider than 0600 (an earlier layout's 0640) is tightened.
    pub(super) fn try_open(
        &self,
        dir: &File,
        name: &str,
        flags: OFlag,
    ) -> BackendResult<Option<File>> {
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
        if mode & !FILE_MODE != 0 {
            nix::sys::stat::fchmod(file.as_raw_fd(), Mode::from_bits_truncate(mode & FILE_MODE))
                .map_err(|e| self.io_error("restricting the mode of", name, e))?;
        }
        Ok(Some(file))
    }

    /// Whether `name` in `dir` is still `file` (not replaced by a force, or removed).
    pub(super) fn same_inode(&self, dir: &File, file: &File, name: &str) -> BackendResult<bool> {
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
    pub(super) fn open_gate(&self, dir: &File, exclusive: bool) -> BackendResult<Option<File>> {
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
        let locked = ofd_lock_within(&gate, kind, GATE_WAIT)
            .map_err(|e| self.io_error("locking", GATE_FILE, e))?;
        if !locked {
            return Err(BackendError::Unavailable(format!(
                "the force gate {} has been locked by another process for {} ({}); \
                 runlock's agents hold it for milliseconds",
                self.path(GATE_FILE).display(),
                humantime::format_duration(GATE_WAIT),
                blocker::range_blocker(&gate, kind),
            )));
        }
        Ok(Some(gate))
    }
}
