//! The lock directory `file://DIR` names: opened once, and refused when
//! anyone but root and the agent's user could change it or a directory on the
//! way to it.

use anyhow::Context as _;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// A record names its holder's command line, and a lock file that others
/// could open they could lock: nothing here is for anyone but the agent's
/// user (the socket's group included; a run gets its lock as a descriptor).
pub(super) const FILE_MODE: u32 = 0o600;
pub(super) const DIR_MODE: u32 = 0o700;

/// Opens the lock directory after checking who can change it, and closes it
/// to everyone but its owner.
pub(super) fn open_dir(dir: &Path) -> anyhow::Result<File> {
    let real = resolve_checked(dir)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(&real)
        .with_context(|| format!("opening lock directory {}", dir.display()))?;
    close_to_others(dir, &file)?;
    Ok(file)
}

/// Takes every permission of the group and of others off the lock
/// directory (an earlier layout made it 0750 for the socket's group), saying
/// so; refuses the directory when that cannot be done. Through the open
/// descriptor, so it is the directory checked that is changed.
fn close_to_others(dir: &Path, file: &File) -> anyhow::Result<()> {
    let meta = file
        .metadata()
        .with_context(|| format!("checking lock directory {}", dir.display()))?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let closed = mode & !0o077;
    let open_to = match mode & 0o007 {
        0 => format!("group {}", group_name(meta.gid())),
        _ => "every user".to_string(),
    };
    nix::sys::stat::fchmod(
        file.as_raw_fd(),
        nix::sys::stat::Mode::from_bits_truncate(closed),
    )
    .with_context(|| {
        format!(
            "refusing lock directory {}: it is mode {mode:04o}, so {open_to} could read \
             holders' command lines and lock its files, and it could not be made \
             {closed:04o}",
            dir.display()
        )
    })?;
    tracing::warn!(
        "lock directory {} was mode {mode:04o}, open to {open_to}, who could read holders' \
         command lines and lock its files; it is now {closed:04o}",
        dir.display()
    );
    Ok(())
}

/// Resolves `dir` one name at a time, following links as the kernel would,
/// and refuses it when a directory looked through on the way, or the lock
/// directory itself, could be changed by someone else (see [`refuse_writers`]):
/// whoever could would choose where the agent writes as root.
pub(super) fn resolve_checked(dir: &Path) -> anyhow::Result<PathBuf> {
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
pub(super) fn push_components(todo: &mut Vec<std::ffi::OsString>, path: &Path) {
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
pub(super) fn refuse_writers(dir: &Path, place: &Path, is_lock_dir: bool) -> anyhow::Result<()> {
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

pub(super) fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(uid.into()) {
        Ok(Some(user)) => format!("uid {uid} ({})", user.name),
        _ => format!("uid {uid}"),
    }
}

pub(super) fn group_name(gid: u32) -> String {
    match nix::unistd::Group::from_gid(gid.into()) {
        Ok(Some(group)) => format!("{gid} ({})", group.name),
        _ => gid.to_string(),
    }
}
