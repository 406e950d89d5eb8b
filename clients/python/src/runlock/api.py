"""The public API: :func:`lock` (a context manager holding a lease),
:func:`status`, :func:`inspect` and :func:`break_lock`.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import sys
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import messages
from ._connection import Connection
from ._socket_path import resolve
from .errors import LockLost, ProtocolError, RunlockError
from .messages import AgentMessage, Grant, KeyRecord, LeaseInfo, LostEvent, Welcome

_log = logging.getLogger("runlock")

#: How long past the requested ``wait`` an answer may take before the agent is
#: deemed hung (backend requests time out after a few seconds on the agent).
REPLY_SLACK_S = 30.0

SocketPath = Union[str, "os.PathLike[str]", None]
OnLost = Callable[[LostEvent], None]


#: The wire carries durations as u64 milliseconds (SPEC): a longer one must
#: not be sent, nor wrap.
_MAX_MILLIS = (1 << 64) - 1


def _millis(seconds: float, what: str) -> int:
    if not math.isfinite(seconds):
        raise ValueError(f"{what} must be a finite number of seconds")
    if seconds < 0:
        raise ValueError(f"{what} must not be negative")
    millis = int(round(seconds * 1000))
    if millis > _MAX_MILLIS:
        raise ValueError(f"{what} is too long: the protocol carries at most {_MAX_MILLIS}ms")
    return millis


def _default_command() -> str:
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return shlex.join(argv)


class Lease:
    """Leases on one or more keys, held for as long as the connection is open.

    Use it as a context manager (``with runlock.lock(...) as lease``), or call
    :meth:`release` yourself. One key: ``lease.key``, ``lease.token`` and
    ``lease.lease_id``. Several keys: ``lease.keys`` (sorted), and the mappings
    ``lease.tokens`` and ``lease.lease_ids`` from key to value; ``lease.grants``
    holds one :class:`~runlock.Grant` per key in sorted order.

    A background thread reads the agent's events while the block runs, so a
    loss is seen at once: ``on_lost`` (if given) is called on that thread, once
    per lost lease; either way :attr:`lost` is set and :meth:`check` raises.
    """

    def __init__(self, conn: Connection, acquired: messages.Acquired, on_lost: Optional[OnLost]):
        self._conn = conn
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._lost_flag = threading.Event()
        self._lost: List[LostEvent] = []
        self._released = False
        self.grants: Tuple[Grant, ...] = acquired.leases
        self._active: Dict[str, Grant] = {g.lease_id: g for g in acquired.leases}
        self._valid_for: Dict[str, int] = {}
        if acquired.valid_for_ms is not None:
            self._valid_for = {g.lease_id: acquired.valid_for_ms for g in acquired.leases}
        #: The TTL the agent applied, in milliseconds.
        self.ttl_ms: int = acquired.ttl_ms
        #: True once the agent said it is restarting.
        self.agent_restarting = False
        conn.set_handlers(self._on_event, self._on_close)

    # ------------------------------------------------------------------ what is held

    @property
    def agent(self) -> Welcome:
        """The agent's ``welcome``: backend, scope, whether leases outlive it."""
        return self._conn.welcome

    @property
    def keys(self) -> Tuple[str, ...]:
        """The keys held, in sorted order (the agent's order)."""
        return tuple(g.key for g in self.grants)

    @property
    def tokens(self) -> Dict[str, int]:
        """Fencing token per key: hand it to the work so stale writers can be refused."""
        return {g.key: g.token for g in self.grants}

    @property
    def lease_ids(self) -> Dict[str, str]:
        """Lease id per key."""
        return {g.key: g.lease_id for g in self.grants}

    def _single(self) -> Grant:
        if len(self.grants) != 1:
            raise ValueError(
                f"this lease holds {len(self.grants)} keys; use .tokens, .lease_ids or .grants"
            )
        return self.grants[0]

    @property
    def key(self) -> str:
        """The key (only when one key was locked)."""
        return self._single().key

    @property
    def token(self) -> int:
        """The fencing token (only when one key was locked)."""
        return self._single().token

    @property
    def lease_id(self) -> str:
        """The lease id (only when one key was locked)."""
        return self._single().lease_id

    @property
    def valid_for_ms(self) -> Optional[int]:
        """Where leases outlive the agent: the shortest guarantee last reported
        (``acquired``, then ``renewed`` events); None elsewhere."""
        with self._lock:
            return min(self._valid_for.values()) if self._valid_for else None

    # ------------------------------------------------------------------ loss

    @property
    def lost(self) -> Optional[LostEvent]:
        """The first loss, or None while every lease is held."""
        with self._lock:
            return self._lost[0] if self._lost else None

    @property
    def lost_events(self) -> List[LostEvent]:
        """Every loss so far, one per lost lease."""
        with self._lock:
            return list(self._lost)

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[LostEvent]:
        """Blocks until a lease is lost (or ``timeout`` seconds pass); returns the loss or None."""
        self._lost_flag.wait(timeout)
        return self.lost

    def check(self) -> None:
        """Raises :class:`~runlock.LockLost` if any lease was lost; call it
        between steps of long work to stop early."""
        events = self.lost_events
        if events:
            raise LockLost(events)

    def _lose(self, events: List[LostEvent]) -> None:
        if not events:
            return
        with self._lock:
            self._lost.extend(events)
        self._lost_flag.set()
        if self._on_lost is not None:
            for event in events:
                try:
                    self._on_lost(event)
                except Exception:  # runs on the reader thread: log, do not kill it
                    _log.exception("runlock: on_lost callback failed")

    def _lose_all(self, reason: str, message: str) -> None:
        with self._lock:
            if self._released:
                return
            gone, self._active = list(self._active.values()), {}
        self._lose([LostEvent(g.lease_id, g.key, reason, message) for g in gone])

    def _on_event(self, message: AgentMessage) -> None:
        if isinstance(message, messages.Lost):
            with self._lock:
                ours = self._active.pop(message.event.lease_id, None) is not None
            if ours:
                self._lose([message.event])
        elif isinstance(message, messages.Renewed):
            with self._lock:
                if message.lease_id in self._active:
                    self._valid_for[message.lease_id] = message.valid_for_ms
        elif isinstance(message, messages.Restarting):
            self.agent_restarting = True
            if not self.agent.leases_survive_agent:
                # file:// and memory:// locks die with the agent (SPEC 5.3).
                self._lose_all("restarting", "the agent is restarting and its locks end with it")
            # Otherwise the leases outlive the agent, but this client does not
            # reattach: the loss is reported when the connection closes.

    def _on_close(self, error: RunlockError) -> None:
        self._lose_all("agent_gone", f"lost the agent: {error.message}")

    # ------------------------------------------------------------------ release

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Releases every lease still held and closes the connection. Idempotent.

        Closing alone would release too (the agent releases a connection's
        leases at end-of-file); the explicit ``release`` makes it deliberate
        and visible in the agent's log.
        """
        with self._lock:
            if self._released:
                return
            self._released = True
            lease_ids = list(self._active)
            self._active = {}
        try:
            # From an on_lost callback (the reader thread) a request would wait
            # forever for its own reply: closing alone releases there.
            if lease_ids and not self._conn.closed and not self._conn.on_reader_thread():
                request = messages.release(self._conn.next_id(), lease_ids=lease_ids)
                self._conn.request(request, timeout=REPLY_SLACK_S)
        except RunlockError as err:
            _log.debug("runlock: release failed (%s); closing releases anyway", err)
        finally:
            self._conn.close()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def]
        self.release()
        if self._on_lost is None:
            # Raised even when the block raised: the loss is the larger fact
            # (its work ran unprotected); the block's exception is chained.
            self.check()

    def __repr__(self) -> str:
        state = "released" if self._released else ("lost" if self.lost else "held")
        return f"<runlock.Lease {dict(self.tokens)!r} {state}>"


def lock(
    keys: Union[str, Sequence[str]],
    *,
    wait: float = 0,
    ttl: Optional[float] = None,
    force: bool = False,
    on_lost: Optional[OnLost] = None,
    socket: SocketPath = None,
    command: Optional[str] = None,
) -> Lease:
    """Takes one key (a ``str``) or several (a list: all or none, in sorted order).

    ``wait`` is how many seconds to wait while a key is held (0: raise
    :class:`~runlock.Held` at once; after waiting, :class:`~runlock.Timeout`).
    ``ttl`` is the lease's time to live in seconds (the agent's default when
    None); the agent renews it while the connection is open. ``force`` takes
    the keys from their holders (needs force rights). ``command`` is recorded
    in the holder (default: this process's command line).

    The lease is acquired when this is called and held until :meth:`Lease.release`
    or the end of the ``with`` block.
    """
    key_list = [keys] if isinstance(keys, str) else list(keys)
    if not key_list or not all(isinstance(k, str) for k in key_list):
        raise ValueError("keys must be a str or a non-empty sequence of str")
    wait_ms = _millis(wait, "wait")
    ttl_ms = None if ttl is None else _millis(ttl, "ttl")
    conn = Connection(resolve(socket))
    try:
        request = messages.acquire(
            conn.next_id(),
            key_list,
            ttl_ms=ttl_ms,
            wait_ms=wait_ms or None,
            force=True if force else None,
            command=_default_command() if command is None else command,
        )
        reply = conn.request(request, timeout=wait_ms / 1000 + REPLY_SLACK_S)
        if not isinstance(reply, messages.Acquired):
            raise ProtocolError(f"unexpected answer to acquire: {reply!r}")
        return Lease(conn, reply, on_lost)
    except BaseException:
        conn.close()  # releases anything taken, e.g. on KeyboardInterrupt mid-wait
        raise


def _one_shot(socket: SocketPath, build: Callable[[int], dict]) -> AgentMessage:
    conn = Connection(resolve(socket))
    try:
        return conn.request(build(conn.next_id()), timeout=REPLY_SLACK_S)
    finally:
        conn.close()


def status(*, socket: SocketPath = None) -> List[LeaseInfo]:
    """Every lease held through the agent, on every connection (``runlock status``)."""
    reply = _one_shot(socket, lambda i: messages.simple(i, "list"))
    if not isinstance(reply, messages.Leases):
        raise ProtocolError(f"unexpected answer to list: {reply!r}")
    return list(reply.leases)


def inspect(key: str, *, socket: SocketPath = None) -> KeyRecord:
    """The backend's record of ``key``: free or held, holder, last token (``runlock inspect``)."""
    reply = _one_shot(socket, lambda i: messages.inspect(i, key))
    if not isinstance(reply, messages.Record):
        raise ProtocolError(f"unexpected answer to inspect: {reply!r}")
    return reply.record


def break_lock(key: str, *, socket: SocketPath = None) -> int:
    """Breaks whoever holds ``key`` (``runlock release KEY``; needs force rights).

    Returns 1 if a lease was broken, 0 if the key was free.
    """
    reply = _one_shot(socket, lambda i: messages.release(i, key=key))
    if not isinstance(reply, messages.Released):
        raise ProtocolError(f"unexpected answer to release: {reply!r}")
    return reply.count
