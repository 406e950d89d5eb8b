"""The add-on's errors. Each names the run that holds the state ID, as the
shim's "held" error does, and Meltano prints the message, not a traceback.
A run refused because another holds its state ID ends Meltano with 75, the
shim's status for a held key; every other refusal is a failure (1)."""

from __future__ import annotations

import datetime
import logging
import typing as t
import weakref

import runlock
from meltano.core.error import ExitCode, MeltanoError
from meltano.core.runner import RunnerError
from meltano.core.state_store.base import StateIDLockedError

#: EX_TEMPFAIL: another run holds the key, so this one did not start (the
#: shim's exit status for it, which schedulers are told to treat as skipped).
EXIT_HELD = 75


def describe(holder: runlock.Holder | None) -> str:
    """``pid 42 on host-b (user ci) since 2026-01-02T03:04:05Z, token 7: meltano run …``"""
    if holder is None:
        return "an unknown holder"
    since = datetime.datetime.fromtimestamp(holder.acquired_at_ms / 1000, tz=datetime.timezone.utc)
    return (
        f"pid {holder.pid} on {holder.host} (user {holder.user}) "
        f"since {since.strftime('%Y-%m-%dT%H:%M:%SZ')}, token {holder.token}: {holder.command}"
    )


class RunHeld(StateIDLockedError, MeltanoError):
    """Another run holds the state ID: this run must not start. A skipped run,
    not a failed one: raised as a job starts, it reaches Meltano's CLI, which
    ends the process with a MeltanoError's :meth:`exit_code`, here
    :data:`EXIT_HELD`. Not a RunnerError, which ``meltano run`` ends with 1
    whatever it is (a failed block)."""

    def __init__(self, state_id: str, holder: runlock.Holder | None):
        super().__init__(
            f"runlock: {state_id!r} is already running: held by {describe(holder)}. "
            "Wait for it to end, or take it over with --force (MELTANO_RUN_FORCE=true)"
        )
        self.state_id = state_id
        self.holder = holder

    def exit_code(self) -> ExitCode:
        # Meltano's ExitCode names 0, 1 and 2 only; its CLI hands the value to
        # sys.exit as the int it is.
        return t.cast(ExitCode, EXIT_HELD)

    def log_without_traceback(self) -> None:
        """Has the log record that carries this refusal keep its message and
        drop its traceback. ``meltano run`` logs an exception of a block that
        is not a RunnerError with its traceback (its job log handler, around
        the job's start) before its CLI prints the message; a refusal is no
        bug, and its message says all there is."""
        root = logging.getLogger()
        if _QUIET not in root.filters:
            root.addFilter(_QUIET)
        _QUIET.refusals.add(self)


class _WithoutTraceback(logging.Filter):
    """Drops the traceback of records that carry one of ``refusals``."""

    def __init__(self) -> None:
        super().__init__()
        self.refusals: weakref.WeakSet[BaseException] = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is not None and record.exc_info[1] in self.refusals:
            record.exc_info = None
            record.exc_text = None
        return True


_QUIET = _WithoutTraceback()


class Refused(StateIDLockedError, RunnerError, MeltanoError):
    """What Meltano's own state stores raise for a locked state ID, and a
    failure of the run: a RunnerError from ``meltano run``'s blocks (Meltano
    logs it as a failed block, without a traceback, and exits 1), a
    MeltanoError from ``meltano el``/``elt`` (exit 1)."""


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
