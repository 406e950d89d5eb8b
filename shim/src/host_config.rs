//! What the shim takes from the agent's configuration file: where the socket
//! is and what to do when the agent cannot be reached. Only these two
//! settings are read; the agent itself checks the whole file.

use runlock_protocol::socket_path::{CONFIG_ENV, SYSTEM_CONFIG};
use runlock_protocol::OnUnavailable;
use serde::Deserialize;
use std::path::PathBuf;

/// The variable that overrides the file's `on_unavailable`, as for the agent.
const ON_UNAVAILABLE_ENV: &str = "RUNLOCK_ON_UNAVAILABLE";

#[derive(Debug, Default, Deserialize)]
struct Shared {
    socket: Option<PathBuf>,
    on_unavailable: Option<String>,
}

/// The host's settings, as far as the shim needs them.
#[derive(Debug, Default)]
pub struct HostConfig {
    /// The file's `socket`, under `--socket` and `RUNLOCK_SOCKET`.
    pub socket: Option<PathBuf>,
    /// The policy when the agent cannot be reached.
    pub on_unavailable: OnUnavailable,
}

impl HostConfig {
    /// Reads `$RUNLOCK_CONFIG` or `/etc/runlock/runlockd.toml`; a file that is
    /// missing means defaults, one that cannot be read or parsed is warned about.
    pub fn load() -> HostConfig {
        let named = std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty());
        let path = named.map_or_else(|| PathBuf::from(SYSTEM_CONFIG), PathBuf::from);
        let shared = match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str::<Shared>(&text).unwrap_or_else(|err| {
                eprintln!(
                    "runlock: warning: ignoring {}: {}",
                    path.display(),
                    err.message()
                );
                Shared::default()
            }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Shared::default(),
            Err(err) => {
                eprintln!("runlock: warning: cannot read {}: {err}", path.display());
                Shared::default()
            }
        };
        let policy = std::env::var(ON_UNAVAILABLE_ENV)
            .ok()
            .filter(|v| !v.is_empty())
            .or(shared.on_unavailable);
        let on_unavailable = match policy.map(|p| p.parse::<OnUnavailable>()) {
            Some(Ok(policy)) => policy,
            Some(Err(why)) => {
                eprintln!("runlock: warning: on_unavailable {why}; using fail");
                OnUnavailable::Fail
            }
            None => OnUnavailable::Fail,
        };
        HostConfig {
            socket: shared.socket,
            on_unavailable,
        }
    }
}
