"""The run locks of this Meltano process, and the fence on its state writes.

An extract-load command locks each state ID as Meltano starts its job,
before the tap starts (job_start.py), or else at that ID's first state
access, and holds the lease until the process exits: the lease lives on
this process's connection to the agent, which the agent releases the
moment the connection closes, however the process ends.
A run wrapped by ``runlock run`` already holds the key (``RUNLOCK_KEY``,
``RUNLOCK_TOKEN``): it is used as it is, not taken a second time.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Mapping

import runlock

from . import invocation, settings
from .errors import RunHeld, StaleRun, describe
from .policy import go_on_unlocked

_log = logging.getLogger("runlock_meltano")


@dataclasses.dataclass(frozen=True)
class RunLease:
    """How this run holds one state ID. ``token`` is None when it runs
    unlocked (``on_unavailable`` = warn or skip); ``lease`` is None when the
    shim around the process holds it, or nothing does."""

    state_id: str
    token: int | None
    lease: runlock.Lease | None = None


def shim_token(state_id: str, env: Mapping[str, str]) -> int | None:
    """The token of ``state_id`` when a ``runlock run`` around this process
    holds it: its keys and tokens are newline-separated, in the same order."""
    keys = env.get("RUNLOCK_KEY", "").split("\n")
    tokens = env.get("RUNLOCK_TOKEN", "").split("\n")
    if state_id not in keys or len(tokens) != len(keys):
        return None
    try:
        return int(tokens[keys.index(state_id)])
    except ValueError:
        return None


class RunLocks:
    """One per process (:data:`RUN_LOCKS`); tests make their own."""

    def __init__(
        self,
        current: Callable[[], invocation.Invocation] = invocation.current,
        env: Mapping[str, str] = os.environ,
        socket: Callable[[], str | None] = settings.socket,
    ):
        self._current = current
        self._env = env
        self._socket = socket
        self._held: dict[str, RunLease] = {}
        self._lock = threading.Lock()
        self._exit_hook = False

    def ensure(self, state_id: str) -> RunLease | None:
        """This run's hold on ``state_id``, taken now if it is not yet; None
        outside an extract-load command. Raises :class:`RunHeld` when another
        run holds it."""
        now = self._current()
        if not now.runs_pipelines:
            return None
        with self._lock:
            held = self._held.get(state_id)
            if held is None:
                held = self._take(state_id, now.force)
                self._held[state_id] = held
            return held

    def _take(self, state_id: str, force: bool) -> RunLease:
        token = shim_token(state_id, self._env)
        if token is not None:
            _log.info("runlock: %r is held by the runlock run around this one (token %d)", state_id, token)
            return RunLease(state_id, token)
        try:
            lease = runlock.lock(state_id, force=force, on_lost=self._on_lost, socket=self._socket())
        except runlock.Held as err:
            raise RunHeld(state_id, err.holder) from None
        except runlock.RunlockError as err:
            go_on_unlocked(state_id, err, "running")
            return RunLease(state_id, None)
        if not self._exit_hook:
            # The connection's end releases anyway; releasing first says so in the agent's log.
            atexit.register(self.release_all)
            self._exit_hook = True
        _log.info("runlock: locked %r for this run (token %d%s)", state_id, lease.token, ", forced" if force else "")
        return RunLease(state_id, lease.token, lease)

    @staticmethod
    def _on_lost(event: runlock.LostEvent) -> None:
        who = f"; now held by {describe(event.holder)}" if event.holder is not None else ""
        _log.error(
            "runlock: this run lost its lock on %r (%s: %s)%s; its state writes will be refused",
            event.key, event.reason, event.message, who,
        )

    def fence(self, state_id: str) -> RunLease | None:
        """Raises :class:`StaleRun` unless this run's lease on ``state_id`` is
        still the key's current one, as far as the agent knows: no loss
        reported, and the store's record held with this lease's token.
        Returns this run's hold, or None when there is nothing to fence (not
        a run, or a run without a lock). Called right before each state
        write; a takeover landing after this check is for the state store's
        own fence to refuse (fence.py)."""
        held = self.ensure(state_id)
        if held is None or held.token is None:
            return None
        if held.lease is not None and (lost := held.lease.lost) is not None:
            raise StaleRun(state_id, held.token, f"{lost.reason}: {lost.message}", lost.holder)
        try:
            record = runlock.inspect(state_id, socket=self._socket())
        except runlock.RunlockError as err:
            go_on_unlocked(state_id, err, "writing the state of")
            return None
        if record.state != "held" or record.token != held.token:
            why = f"the store's record is {record.state} with token {record.token}"
            raise StaleRun(state_id, held.token, why, record.holder if record.state == "held" else None)
        return held

    def overtaken(self, state_id: str, token: int, recorded: int) -> None:
        """The state store records ``recorded``, higher than this run's
        ``token``, as the state ID's newest run: raises :class:`StaleRun`
        naming the key's holder. Returns only when the agent still says this
        run holds the key with ``token``: tokens then started over (the
        agent's lock store was replaced or reset), and the recorded one is
        from before; this run's is recorded in its place."""
        why = f"the state store records a newer run's token, {recorded}"
        try:
            record = runlock.inspect(state_id, socket=self._socket())
        except runlock.RunlockError:
            raise StaleRun(state_id, token, why, None) from None
        if record.state == "held" and record.token == token:
            _log.warning(
                "runlock: the state of %r records token %d, above this run's %d, which the agent says is current; "
                "the agent's tokens started over, so this run's replaces it",
                state_id, recorded, token,
            )
            return
        raise StaleRun(state_id, token, why, record.holder if record.state == "held" else None)

    def release_all(self) -> None:
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for run in held:
            if run.lease is not None:
                run.lease.release()


#: This process's run locks.
RUN_LOCKS = RunLocks()
