"""The add-on's errors. Each names the run that holds the state ID, as the
shim's "held" error does: Meltano prints the message and the run fails."""

from __future__ import annotations

import datetime

import runlock
from meltano.core.error import MeltanoError
from meltano.core.runner import RunnerError
from meltano.core.state_store.base import StateIDLockedError


def describe(holder: runlock.Holder | None) -> str:
    """``pid 42 on host-b (user ci) since 2026-01-02T03:04:05Z, token 7: meltano run …``"""
    if holder is None:
        return "an unknown holder"
    since = datetime.datetime.fromtimestamp(holder.acquired_at_ms / 1000, tz=datetime.timezone.utc)
    return (
        f"pid {holder.pid} on {holder.host} (user {holder.user}) "
        f"since {since.strftime('%Y-%m-%dT%H:%M:%SZ')}, token {holder.token}: {holder.command}"
    )


class Refused(StateIDLockedError, RunnerError, MeltanoError):
    """What Meltano's own state stores raise for a locked state ID. Raised as
    a job starts, it is also what Meltano prints as a message, not a
    traceback: a RunnerError from ``meltano run``'s blocks (as Meltano's own
    "already running"), a MeltanoError from ``meltano el``/``elt``."""


class RunHeld(Refused):
    """Another run holds the state ID: this run must not start."""

    def __init__(self, state_id: str, holder: runlock.Holder | None):
        super().__init__(
            f"runlock: {state_id!r} is already running: held by {describe(holder)}. "
            "Wait for it to end, or take it over with --force (MELTANO_RUN_FORCE=true)"
        )
        self.state_id = state_id
        self.holder = holder


class StaleRun(Refused):
    """This run's lease on the state ID is no longer the current one (forced,
    broken, expired): its state write is refused, so the newer run's stays."""

    def __init__(self, state_id: str, token: int, why: str, holder: runlock.Holder | None):
        now = f"now held by {describe(holder)}" if holder is not None else "now free"
        super().__init__(
            f"runlock: state write for {state_id!r} refused: this run's lease (token {token}) "
            f"is no longer the current one ({why}); {now}"
        )
        self.state_id = state_id
        self.holder = holder


class LockUnavailable(Refused):
    """The agent could not be asked (and ``on_unavailable`` is ``fail``), or
    refused for another reason than the key being held (force rights, …)."""

    def __init__(self, state_id: str, err: runlock.RunlockError):
        policy = " (on_unavailable = fail; see RUNLOCK_ON_UNAVAILABLE)" if err.code in (None, "unavailable") else ""
        super().__init__(f"runlock: cannot lock or check {state_id!r}: {err.message}{policy}")
        self.state_id = state_id
