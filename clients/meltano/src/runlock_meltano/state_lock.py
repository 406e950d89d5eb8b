"""Meltano's state lock (``acquire_lock``, around each read-merge-write of a
state) taken through runlock: atomic across hosts, renewed while held, freed
when the process dies. Its key is not the state ID, which the run lock holds
for a whole run: ``meltano state set`` while a run goes on must still work,
as it does with Meltano's own lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import runlock

from . import settings
from .errors import describe
from .policy import go_on_unlocked
from meltano.core.state_store.base import StateIDLockedError

#: The state lock's key is this, then the state ID.
KEY_PREFIX = "meltano-state-write:"

#: How long a state write waits for another one on the same state ID.
WAIT_S = 30.0


def key(state_id: str) -> str:
    return KEY_PREFIX + state_id


@contextmanager
def state_lock(state_id: str, *, wait: float = WAIT_S) -> Iterator[None]:
    lease = _take(state_id, wait)
    try:
        yield
    finally:
        if lease is not None:
            lease.release()


def _take(state_id: str, wait: float) -> runlock.Lease | None:
    try:
        return runlock.lock(key(state_id), wait=wait, socket=settings.socket())
    except runlock.Held as err:  # Timeout too
        raise StateIDLockedError(
            f"runlock: the state of {state_id!r} is being written by {describe(err.holder)} "
            f"(waited {wait:g} s)"
        ) from None
    except runlock.RunlockError as err:
        go_on_unlocked(state_id, err, "writing the state of")
        return None
