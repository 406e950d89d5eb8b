//! The one rule for where the agent's socket lives, used by agent and shim alike:
//! `--socket`, else `RUNLOCK_SOCKET`, else `/run/runlock/agent.sock` for root and
//! `$XDG_RUNTIME_DIR/runlock/agent.sock` for everyone else.

use std::path::PathBuf;

/// The variable that names the socket when no flag does.
pub const SOCKET_ENV: &str = "RUNLOCK_SOCKET";

/// Root's socket path.
pub const SYSTEM_SOCKET: &str = "/run/runlock/agent.sock";

/// Resolves the socket path from an explicit flag and the environment.
pub fn resolve(flag: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(path) = flag {
        return Ok(path);
    }
    let from_env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(path) = from_env(SOCKET_ENV) {
        return Ok(PathBuf::from(path));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(PathBuf::from(SYSTEM_SOCKET));
    }
    match from_env("XDG_RUNTIME_DIR") {
        Some(dir) => Ok(PathBuf::from(dir).join("runlock").join("agent.sock")),
        None => Err(format!(
            "no socket path: pass --socket, or set {SOCKET_ENV} or XDG_RUNTIME_DIR"
        )),
    }
}
