"""runlock inside Meltano: a state backend (``state_backend.uri:
runlock+s3://…``, ``runlock+file://…``, …) that locks each run's state ID
through the host's runlockd, takes Meltano's state lock through it, and
refuses state writes from a run whose lease is no longer current. See README.md.
"""

from .backend import RunlockStateStoreManager
from .errors import LockUnavailable, RunHeld, StaleRun

__all__ = ["RunlockStateStoreManager", "RunHeld", "StaleRun", "LockUnavailable"]
