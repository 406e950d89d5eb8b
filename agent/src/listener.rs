//! The agent's socket on its own path: the directory is created, a live agent
//! already on the path is refused, a stale socket file is replaced, and the
//! socket is made mode 0660. The guard unlinks it on a clean exit.

use anyhow::{bail, Context};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::net::UnixListener;

/// Removes the socket file when the agent stops, if it is still ours.
pub struct SocketGuard {
    path: PathBuf,
    inode: u64,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        // Another agent may have replaced a file we thought stale; leave its socket alone.
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds the agent's socket at `path`.
pub fn bind(path: &Path) -> anyhow::Result<(UnixListener, SocketGuard)> {
    use std::os::unix::fs::MetadataExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("creating socket directory {}", dir.display()))?;
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => bail!("another agent is already listening on {}", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            // A socket file nobody listens on: left by an agent that died.
            std::fs::remove_file(path)
                .with_context(|| format!("removing stale socket {}", path.display()))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("probing existing socket {}", path.display()));
        }
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    // bind() creates the file with the umask's mode, which never grants more than
    // 0755, and a socket needs write permission to connect: so the widening to
    // 0660 here never exposes it to anyone it should not reach.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("setting mode 0660 on {}", path.display()))?;
    let inode = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .ino();
    Ok((
        listener,
        SocketGuard {
            path: path.to_path_buf(),
            inode,
        },
    ))
}
