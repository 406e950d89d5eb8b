//! The agent's listening socket: either the one systemd passes by socket
//! activation (systemd owns its file), or one on its own path: the directory is
//! created, a live agent already on the path is refused, a stale socket file is
//! replaced, and the socket gets the configured group and mode (0660 by
//! default). The guard unlinks it on a clean exit. [`next_connection`] takes
//! connections from it (and from the metrics listener).

use anyhow::{bail, Context};
use nix::sys::socket::{getsockname, getsockopt, sockopt, SockType, UnixAddr};
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

/// How long a failed accept (out of descriptors and the like) is waited out:
/// trying again at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The next connection `accept` takes, or `None` once `shutdown` is
/// cancelled; a failed accept is logged (as one of `what` connections) and
/// tried again after [`ACCEPT_BACKOFF`].
pub async fn next_connection<S, Address, F>(
    accept: impl Fn() -> F,
    what: &str,
    shutdown: &CancellationToken,
) -> Option<S>
where
    F: Future<Output = std::io::Result<(S, Address)>>,
{
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            accepted = accept() => match accepted {
                Ok((stream, _)) => return Some(stream),
                Err(err) => {
                    tracing::warn!(error = %err, "cannot accept a {what} connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
}

/// Who may reach a socket the agent binds itself (systemd's socket unit sets
/// its own with `SocketGroup=` and `SocketMode=`).
#[derive(Debug, Clone, Copy)]
pub struct Permissions {
    /// The file mode.
    pub mode: u32,
    /// The owning group, if not the agent's.
    pub group: Option<u32>,
}

/// Listens on the socket systemd passed (`LISTEN_FDS`), or else binds `path`.
/// The guard is `None` for a passed socket: its file belongs to the .socket
/// unit and must outlive this agent, so nothing unlinks it.
pub fn open(
    path: &Path,
    permissions: Permissions,
) -> anyhow::Result<(UnixListener, Option<SocketGuard>)> {
    match activated()? {
        Some(listener) => {
            let passed = listener
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(Path::to_path_buf));
            let passed_path = passed.as_deref().unwrap_or(Path::new("(unnamed)"));
            tracing::info!(socket = %passed_path.display(), "listening on the socket systemd passed");
            if passed.as_deref() != Some(path) {
                tracing::warn!(
                    socket = %passed_path.display(),
                    configured = %path.display(),
                    "the configured socket path is not used: systemd's socket unit decides where the agent listens"
                );
            }
            Ok((listener, None))
        }
        None => {
            let (listener, guard) = bind(path, permissions)?;
            tracing::info!(socket = %path.display(), "listening on a socket of its own");
            Ok((listener, Some(guard)))
        }
    }
}

/// The listening socket systemd passed, if it passed one to this process.
fn activated() -> anyhow::Result<Option<UnixListener>> {
    // `false`: leave the variables set. Unsetting them from a multi-threaded
    // process can race with another thread's getenv, and LISTEN_PID already
    // keeps any child from taking the descriptors for its own.
    let fds: Vec<RawFd> = sd_notify::listen_fds_with_names(false)
        .context("reading LISTEN_FDS from systemd")?
        .map(|(fd, _name)| fd)
        .collect();
    let fd = match fds.as_slice() {
        [] => return Ok(None),
        [fd] => *fd,
        more => bail!(
            "systemd passed {} sockets; runlockd takes exactly one (one ListenStream= in runlockd.socket)",
            more.len()
        ),
    };
    // SAFETY: LISTEN_PID names this process, so systemd's protocol hands the
    // descriptor to it, and this is the only place that takes it (once, at start-up).
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let kind = getsockopt(&fd, sockopt::SockType).context("checking the socket systemd passed")?;
    let listening =
        getsockopt(&fd, sockopt::AcceptConn).context("checking the socket systemd passed")?;
    // nix fails getsockname::<UnixAddr> for any other address family.
    let unix = getsockname::<UnixAddr>(fd.as_raw_fd()).is_ok();
    if kind != SockType::Stream || !listening || !unix {
        bail!("systemd passed a socket that is not a listening Unix stream socket (use ListenStream=/path in runlockd.socket)");
    }
    let listener = std::os::unix::net::UnixListener::from(fd);
    listener
        .set_nonblocking(true)
        .context("making the socket systemd passed non-blocking")?;
    Ok(Some(
        UnixListener::from_std(listener).context("registering the socket systemd passed")?,
    ))
}

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

/// A listening socket at `path` that only this user can connect to until
/// its group and mode are set. bind() gives the file mode 0777 less the
/// umask (unix(7)), and connecting needs write permission on it, so under a
/// loose umask (002, 000) others could connect in between; on Linux the
/// file takes its mode from the socket's, which fchmod sets before bind.
fn bind_owner_only(path: &Path) -> std::io::Result<UnixListener> {
    use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag};
    use nix::sys::stat::{fchmod, Mode};
    let socket = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    fchmod(socket.as_raw_fd(), Mode::S_IRUSR | Mode::S_IWUSR)?;
    bind(socket.as_raw_fd(), &UnixAddr::new(path)?)?;
    listen(&socket, Backlog::MAXCONN)?;
    UnixListener::from_std(std::os::unix::net::UnixListener::from(socket))
}

/// Binds the agent's socket at `path`.
fn bind(path: &Path, permissions: Permissions) -> anyhow::Result<(UnixListener, SocketGuard)> {
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
    let listener = bind_owner_only(path).with_context(|| format!("binding {}", path.display()))?;
    if let Some(gid) = permissions.group {
        nix::unistd::chown(path, None, Some(gid.into()))
            .with_context(|| format!("giving {} to group {gid}", path.display()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(permissions.mode))
        .with_context(|| {
            format!(
                "setting mode {:04o} on {}",
                permissions.mode,
                path.display()
            )
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_file_is_born_reachable_by_its_owner_alone() {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let path = dir.path().join("agent.sock");
        let _listener = bind_owner_only(&path).expect("binding");
        let mode = std::fs::metadata(&path)
            .expect("the socket file")
            .permissions()
            .mode();
        // Whatever the umask: before its configured mode is set, no one but
        // this user may connect (bind alone gives 0777 less the umask).
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    }
}
