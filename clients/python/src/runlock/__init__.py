"""Python client for runlockd, the runlock agent.

    import runlock

    with runlock.lock("dev:tap-x-to-target-y", wait=30, ttl=30) as lease:
        run_pipeline(fencing_token=lease.token)

    with runlock.lock("warehouse", slots=3, wait=600) as lease:  # at most 3 at once
        load(slot=lease.slot, fencing_token=lease.token)

See README.md for lock-loss semantics; protocol/SPEC.md for the wire protocol.
"""

from ._connection import __version__
from .api import Lease, break_lock, history, inspect, list_keys, lock, status
from .errors import (
    BadRequest,
    ConfigError,
    Forbidden,
    Held,
    Internal,
    InvalidKey,
    LockLost,
    NotOwner,
    ProtocolError,
    RunlockError,
    SlotsMismatch,
    Timeout,
    Unavailable,
    Unsupported,
)
from ._records import Grant, Holder, KeyEvent, KeyListing, KeyRecord, LeaseInfo
from .messages import LostEvent, Welcome

__all__ = [
    "__version__",
    "lock",
    "status",
    "inspect",
    "history",
    "list_keys",
    "break_lock",
    "Lease",
    "Grant",
    "Holder",
    "KeyEvent",
    "KeyListing",
    "KeyRecord",
    "LeaseInfo",
    "LostEvent",
    "Welcome",
    "RunlockError",
    "Held",
    "Timeout",
    "SlotsMismatch",
    "Unavailable",
    "InvalidKey",
    "Forbidden",
    "NotOwner",
    "Unsupported",
    "BadRequest",
    "Internal",
    "ProtocolError",
    "ConfigError",
    "LockLost",
]
