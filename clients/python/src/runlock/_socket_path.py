"""Where the agent's socket is: the same rule as the shim and the agent
(docs/src/agent.md "The socket rule", SPEC 1), so a Python program finds the host's agent
wherever ``runlock`` would.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Union

from .errors import ConfigError

try:  # Python 3.11+; older Pythons skip the configuration file (documented)
    import tomllib as _toml
except ImportError:  # pragma: no cover - depends on the interpreter
    _toml = None  # type: ignore[assignment]

SOCKET_ENV = "RUNLOCK_SOCKET"
CONFIG_ENV = "RUNLOCK_CONFIG"
SYSTEM_CONFIG = "/etc/runlock/runlockd.toml"
SYSTEM_SOCKET = "/run/runlock/agent.sock"

_log = logging.getLogger("runlock")


def _nonempty_env(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return value if value else None


def configured_socket() -> Optional[str]:
    """The ``socket`` setting of ``$RUNLOCK_CONFIG`` or /etc/runlock/runlockd.toml.

    A missing file is silent; one that cannot be read or parsed is logged and
    skipped, as the shim warns and goes on: the agent is the one that rejects
    a bad file.
    """
    if _toml is None:
        return None
    path = _nonempty_env(CONFIG_ENV) or SYSTEM_CONFIG
    try:
        with open(path, "rb") as handle:
            settings = _toml.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # TOMLDecodeError is a ValueError
        _log.warning("runlock: ignoring %s: %s", path, err)
        return None
    socket = settings.get("socket")
    return socket if isinstance(socket, str) and socket else None


def resolve(explicit: Union[str, "os.PathLike[str]", None] = None) -> str:
    """The socket path: ``explicit``, else ``RUNLOCK_SOCKET``, else the
    configuration file's ``socket``, else root's or ``$XDG_RUNTIME_DIR``'s."""
    if explicit is not None:
        return os.fspath(explicit)
    found = _nonempty_env(SOCKET_ENV) or configured_socket()
    if found:
        return found
    if os.geteuid() == 0:
        return SYSTEM_SOCKET
    runtime = _nonempty_env("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "runlock", "agent.sock")
    raise ConfigError(
        f"no socket path: pass socket=, or set {SOCKET_ENV} or XDG_RUNTIME_DIR"
    )
