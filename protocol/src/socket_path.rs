//! The one rule for where the agent's socket lives, used by agent and shim alike:
//! `--socket`, else `RUNLOCK_SOCKET`, else the configuration file's `socket`,
//! else `/run/runlock/agent.sock` for root and
//! `$XDG_RUNTIME_DIR/runlock/agent.sock` for everyone else.

use std::path::PathBuf;

/// The variable that names the socket when no flag does.
pub const SOCKET_ENV: &str = "RUNLOCK_SOCKET";

/// The variable that names the agent's configuration file.
pub const CONFIG_ENV: &str = "RUNLOCK_CONFIG";

/// The agent's configuration file when no flag or variable names one.
pub const SYSTEM_CONFIG: &str = "/etc/runlock/runlockd.toml";

/// Root's socket path.
pub const SYSTEM_SOCKET: &str = "/run/runlock/agent.sock";

/// Resolves the socket path from an explicit flag, the environment and the
/// configuration file's setting.
pub fn resolve(flag: Option<PathBuf>, configured: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(path) = flag {
        return Ok(path);
    }
    let from_env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(path) = from_env(SOCKET_ENV).map(PathBuf::from).or(configured) {
        return Ok(path);
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
