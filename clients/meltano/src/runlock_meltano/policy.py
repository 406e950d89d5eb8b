"""What to do when the agent cannot be reached: the host's ``on_unavailable``,
found as the shim finds it (docs/src/agent.md "When the backend cannot be reached"):
``RUNLOCK_ON_UNAVAILABLE``, else the ``on_unavailable`` of the agent's
configuration file (``$RUNLOCK_CONFIG``, else /etc/runlock/runlockd.toml),
else ``fail``.
"""

from __future__ import annotations

import enum
import logging
import os

import runlock

from .errors import LockUnavailable

try:  # Python 3.11+; older Pythons read no configuration file (as the client)
    import tomllib as _toml
except ImportError:  # pragma: no cover - depends on the interpreter
    _toml = None  # type: ignore[assignment]

_log = logging.getLogger("runlock_meltano")

ON_UNAVAILABLE_ENV = "RUNLOCK_ON_UNAVAILABLE"
CONFIG_ENV = "RUNLOCK_CONFIG"
SYSTEM_CONFIG = "/etc/runlock/runlockd.toml"


class OnUnavailable(enum.Enum):
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"


def on_unavailable() -> OnUnavailable:
    """The host's policy; an unknown value means ``fail``, with a warning."""
    value = os.environ.get(ON_UNAVAILABLE_ENV) or _configured()
    if value is None:
        return OnUnavailable.FAIL
    try:
        return OnUnavailable(value)
    except ValueError:
        _log.warning("runlock: on_unavailable %r is not fail, warn or skip; using fail", value)
        return OnUnavailable.FAIL


def _configured() -> str | None:
    if _toml is None:
        return None
    path = os.environ.get(CONFIG_ENV) or SYSTEM_CONFIG
    try:
        with open(path, "rb") as handle:
            value = _toml.load(handle).get("on_unavailable")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # TOMLDecodeError is a ValueError
        _log.warning("runlock: ignoring %s: %s", path, err)
        return None
    return value if isinstance(value, str) and value else None


def agent_unreachable(err: runlock.RunlockError) -> bool:
    """Whether ``err`` means no agent (or no backend behind it) could be
    asked: the case ``on_unavailable`` decides. An agent that answered "busy"
    was reached and refused, so that is never a reason to go on unlocked."""
    if isinstance(err, runlock.ConfigError):
        return True
    if not isinstance(err, runlock.Unavailable):
        return False
    return not err.message.startswith("agent busy")


def go_on_unlocked(state_id: str, err: runlock.RunlockError, doing: str) -> None:
    """Returns when ``err`` means the agent could not be asked and the host's
    ``on_unavailable`` lets ``doing`` (say, "running") go on without a lock,
    warning loudly under ``warn``; raises :class:`LockUnavailable` otherwise,
    and for any other refusal (forbidden, invalid key, …)."""
    if not agent_unreachable(err):
        raise LockUnavailable(state_id, err) from None
    policy = on_unavailable()
    if policy is OnUnavailable.FAIL:
        raise LockUnavailable(state_id, err) from None
    if policy is OnUnavailable.WARN:
        _log.warning("runlock: WARNING: %s %r WITHOUT A LOCK (on_unavailable = warn): %s", doing, state_id, err.message)
