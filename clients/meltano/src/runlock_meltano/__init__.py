"""runlock inside Meltano: a state backend (``state_backend.uri:
runlock+s3://…``, ``runlock+file://…``, ``runlock+NAME://…`` for any state
backend installed) that locks each run's state ID through the host's
runlockd as Meltano starts the run, takes Meltano's state lock through it,
and refuses state writes from a run whose lease is no longer current. See
README.md.
"""

from __future__ import annotations

import typing as t

from . import building, job_start, schemes

if t.TYPE_CHECKING:
    from .backend import RunlockStateStoreManager
    from .errors import LockUnavailable, RunHeld, StaleRun

# Meltano imports the add-on at start-up, for every command (its setting,
# settings.py): the moment to hook the start of Meltano's jobs, to offer
# runlock+NAME for every state backend installed, before Meltano looks one
# up, and to build a runlock+ store around Meltano's own, with its session.
job_start.install()
schemes.install()
building.install()

__all__ = ["RunlockStateStoreManager", "RunHeld", "StaleRun", "LockUnavailable"]


def __getattr__(name: str) -> object:
    # Imported when first asked for, not with the package: every Meltano
    # command imports it, and the state backend's imports (Meltano's file
    # stores, the client) would add some 90 ms to each one's start-up.
    if name == "RunlockStateStoreManager":
        from . import backend

        return backend.RunlockStateStoreManager
    if name in ("RunHeld", "StaleRun", "LockUnavailable"):
        from . import errors

        return getattr(errors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
