"""The public API: :func:`lock` (a context manager holding a lease),
:func:`status`, :func:`inspect` and :func:`break_lock`.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import shlex
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import messages
from ._connection import Connection
from ._follower import EventFollower
from ._reattacher import Reattacher
from ._socket_path import resolve
# The timing constants live in _timeouts, shared with the reattach thread;
# they are named here too, where they have always been.
from ._timeouts import LIST_PAGE_TIMEOUT_S as LIST_PAGE_TIMEOUT_S
from ._timeouts import REATTACH_PAUSE_MAX_S as REATTACH_PAUSE_MAX_S
from ._timeouts import REATTACH_PAUSE_MIN_S as REATTACH_PAUSE_MIN_S
from ._timeouts import RELEASE_WAIT_S as RELEASE_WAIT_S
from ._timeouts import REPLY_SLACK_S as REPLY_SLACK_S
from ._wire import close_fds
from .errors import LockLost, ProtocolError, RunlockError
from .messages import (
    AgentMessage,
    Grant,
    KeyEvent,
    KeyListing,
    KeyRecord,
    LeaseInfo,
    LostEvent,
    Welcome,
)

_log = logging.getLogger("runlock")

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


def _wait_millis(wait: float) -> int:
    """``wait`` in the wire's milliseconds: ``math.inf`` is the wait without
    bound (the longest the protocol carries), as ``--wait infinity`` is the
    shim's."""
    if wait == math.inf:
        return _MAX_MILLIS
    return _millis(wait, "wait")


_MAX_U32 = (1 << 32) - 1


def _uint32(value: int, what: str) -> int:
    """A count the wire carries as uint32; whether the agent accepts it (slots:
    1 to 64) is the agent's to say, as for a TTL."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_U32:
        raise ValueError(f"{what} must be an int from 0 to {_MAX_U32}, got {value!r}")
    return value


def _unlock(fds: List[int]) -> None:
    """Drops each kernel lock: ``LOCK_UN`` on one copy drops it for every
    process sharing the open file description, children included (SPEC 5.4)."""
    for fd in fds:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as err:
            _log.debug("runlock: unlocking descriptor %d failed: %s", fd, err)


def _default_command() -> str:
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return shlex.join(argv)


class Lease:
    """Leases on one or more keys, held for as long as the connection is open.

    Use it as a context manager (``with runlock.lock(...) as lease``), or call
    :meth:`release` yourself. One key: ``lease.key``, ``lease.token`` and
    ``lease.lease_id`` (and ``lease.slot``, the slot granted, when the key was
    taken with ``slots``). Several keys: ``lease.keys`` (sorted), and the mappings
    ``lease.tokens`` and ``lease.lease_ids`` from key to value; ``lease.grants``
    holds one :class:`~runlock.Grant` per key in sorted order.

    A background thread reads the agent's events while the block runs, so a
    loss is seen at once: ``on_lost`` (if given) is called on that thread, once
    per lost lease; either way :attr:`lost` is set and :meth:`check` raises.

    Where leases outlive the agent (``agent.leases_survive_agent``), an agent
    that restarts or goes away is not a loss: another thread reconnects to the
    same socket and has the next agent adopt the leases (SPEC 8.7), until
    their deadline. On ``file://`` the lease also keeps the kernel locks
    (:attr:`lock_fds`), so the keys stay locked while no agent runs.
    """

    def __init__(
        self,
        conn: Connection,
        acquired: messages.Acquired,
        on_lost: Optional[OnLost],
        lock_fds: Sequence[int] = (),
    ):
        self._path = conn.path
        self._on_lost = on_lost
        self._lock = threading.Lock()
        # Wakes wait_reattached() whenever who holds the leases changes.
        self._changed = threading.Condition(self._lock)
        self._lost_flag = threading.Event()
        self._lost: List[LostEvent] = []
        self._released = False
        self.grants: Tuple[Grant, ...] = acquired.leases
        self._active: Dict[str, Grant] = {g.lease_id: g for g in acquired.leases}
        # One kernel lock per lease on file://, by lease id (SPEC 5.4).
        self._fds: Dict[str, int] = {g.lease_id: fd for g, fd in zip(acquired.leases, lock_fds)}
        self._valid_for: Dict[str, int] = {}
        # time.monotonic() past which a lease is no longer guaranteed without
        # an agent. Leases granted without valid_for_ms cannot expire while
        # held (file://: this process holds the lock), so they have no deadline.
        self._valid_until: Dict[str, float] = {}
        self._expires = acquired.valid_for_ms is not None
        if acquired.valid_for_ms is not None:
            self._learn_valid_for(list(self._active), acquired.valid_for_ms)
        #: The TTL the agent applied, in milliseconds.
        self.ttl_ms: int = acquired.ttl_ms
        #: True once the agent said it is restarting, until another takes the leases over.
        self.agent_restarting = False
        self._welcome = conn.welcome
        # The connection that holds the leases; None while reattaching.
        self._conn: Optional[Connection] = conn
        # Connections of agents that said `restarting`: kept open until another
        # agent holds the leases, as the shim does, so the old agent never sees
        # the run end before the next one has taken it over.
        self._retired: List[Connection] = []
        self._reattaches = 0
        # The handle keeps the state; reading the agent's events and seeking
        # the next agent are pieces of their own that change it under _lock.
        self._reattacher = Reattacher(self)
        self._follower = EventFollower(self)
        self._follower.follow(conn)

    # ------------------------------------------------------------------ what is held

    @property
    def agent(self) -> Welcome:
        """The ``welcome`` of the agent holding the leases (the last one while
        reattaching): backend, scope, whether leases outlive it."""
        with self._lock:
            return self._welcome

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
    def slot(self) -> Optional[int]:
        """The slot granted, 0-based, when the key was taken with ``slots``
        (None for a plain key); :attr:`token` is that slot's own token. Only
        when one key was locked: several keys have it in :attr:`grants`."""
        return self._single().slot

    @property
    def valid_for_ms(self) -> Optional[int]:
        """Where leases outlive the agent and can expire: the shortest guarantee
        last reported (``acquired``, then ``renewed`` events); None elsewhere."""
        with self._lock:
            return min(self._valid_for.values()) if self._valid_for else None

    @property
    def lock_fds(self) -> Tuple[int, ...]:
        """The kernel locks of the keys still held (``file://`` only; empty
        elsewhere), one descriptor per key in :attr:`keys` order.

        They are close-on-exec: pass them to ``subprocess`` with
        ``pass_fds=lease.lock_fds`` so a child shares the lock. They are
        unlocked and closed when the lease is released or lost; do not close
        them yourself.
        """
        with self._lock:
            return tuple(self._fds[g.lease_id] for g in self.grants if g.lease_id in self._fds)

    # ------------------------------------------------------------------ reattaching

    @property
    def reattaching(self) -> bool:
        """True while the agent is gone and the next one is sought (the leases are still held)."""
        with self._lock:
            return self._conn is None and bool(self._active) and not self._released

    @property
    def reattaches(self) -> int:
        """How many times a new agent took the leases over."""
        with self._lock:
            return self._reattaches

    def wait_reattached(self, timeout: Optional[float] = None, *, count: int = 1) -> bool:
        """Blocks until a new agent has taken the leases over ``count`` times
        in all (True), or until they are lost or released or ``timeout``
        seconds pass (False)."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._reattaches >= count or self._released or not self._active, timeout
            )
            return self._reattaches >= count

    def _learn_valid_for(self, lease_ids: Sequence[str], valid_for_ms: int) -> None:
        """Records a guarantee from now on (called with ``_lock`` held, or from __init__)."""
        until = time.monotonic() + valid_for_ms / 1000
        for lease_id in lease_ids:
            self._valid_for[lease_id] = valid_for_ms
            self._valid_until[lease_id] = until

    def _deadline(self) -> Optional[float]:
        """When the leases stop being guaranteed without an agent (called with
        ``_lock`` held); None when they cannot expire while held (file://)."""
        if not self._expires:
            return None
        known = [self._valid_until[i] for i in self._active if i in self._valid_until]
        return min(known) if known else time.monotonic()

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
                except Exception:  # runs on a background thread: log, do not kill it
                    _log.exception("runlock: on_lost callback failed")

    def _lose_all(self, reason: str, message: str) -> None:
        with self._lock:
            if self._released:
                return
            gone, self._active = list(self._active.values()), {}
            fds, self._fds = list(self._fds.values()), {}
            self._changed.notify_all()
        _unlock(fds)
        close_fds(fds)
        self._lose([LostEvent(g.lease_id, g.key, reason, message) for g in gone])

    def _held_through(self, conn: Connection) -> bool:
        """Whether ``conn`` is the connection holding the leases now."""
        with self._lock:
            return conn is self._conn

    def _lose_one(self, event: LostEvent) -> None:
        """The agent says one lease is lost: its lock goes, and the loss is told."""
        with self._lock:
            ours = self._active.pop(event.lease_id, None) is not None
            fd = self._fds.pop(event.lease_id, None)
        if fd is not None:
            _unlock([fd])
            close_fds([fd])
        if ours:
            self._lose([event])

    def _renewed(self, lease_id: str, valid_for_ms: int) -> None:
        """The agent renewed a lease: its guarantee runs from now."""
        with self._lock:
            if lease_id in self._active:
                self._learn_valid_for([lease_id], valid_for_ms)


    # ------------------------------------------------------------------ release

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Releases every lease still held and closes the connection. Idempotent.

        Closing alone would release too (the agent releases a connection's
        leases at end-of-file); the explicit ``release`` makes it deliberate
        and visible in the agent's log. During a reattach it stops retrying,
        and releases through the next agent if the attempt in flight reaches one.
        """
        with self._lock:
            if self._released:
                return
            self._released = True
            lease_ids = list(self._active)
            self._active = {}
            fds, self._fds = list(self._fds.values()), {}
            reattacher = self._reattacher.thread
            self._changed.notify_all()
        self._reattacher.stop()
        # Unlocked before the agent is told, for every holder (a child left
        # behind too): the agent marks the record free only once it can take
        # the lock itself, so there is no moment with two holders (SPEC 5.4).
        _unlock(fds)
        try:
            if reattacher is not None and reattacher is not threading.current_thread():
                self._reattacher.end(reattacher)
            with self._lock:
                conn = self._conn
            # From an on_lost callback (the reader thread) a request would wait
            # forever for its own reply: closing alone releases there.
            if lease_ids and conn is not None and not conn.closed and not conn.on_reader_thread():
                request = messages.release(conn.next_id(), lease_ids=lease_ids)
                conn.request(request, timeout=REPLY_SLACK_S)
        except RunlockError as err:
            _log.debug("runlock: release failed (%s); closing releases anyway", err)
        finally:
            close_fds(fds)
            with self._lock:
                conns = ([self._conn] if self._conn is not None else []) + self._retired
                self._retired = []
            for conn in conns:
                conn.close()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def]
        self.release()
        if self._on_lost is None:
            # Raised even when the block raised: the loss is the larger fact
            # (its work ran unprotected); the block's exception is chained.
            self.check()

    def __repr__(self) -> str:
        if self._released:
            state = "released"
        elif self.lost:
            state = "lost"
        elif self.reattaching:
            state = "reattaching"
        else:
            state = "held"
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
    slots: int = 1,
) -> Lease:
    """Takes one key (a ``str``) or several (a list: all or none, in sorted order).

    ``wait`` is how many seconds to wait while a key is held (0: raise
    :class:`~runlock.Held` at once; after waiting, :class:`~runlock.Timeout`;
    ``math.inf``: as long as it takes, as the shim's ``--wait infinity``).
    ``ttl`` is the lease's time to live in seconds (the agent's default when
    None); the agent renews it while the connection is open. ``force`` takes
    the keys from their holders (needs force rights). ``command`` is recorded
    in the holder (default: this process's command line).

    ``slots`` lets each key admit that many holders at once (1 to 64) across
    every agent sharing the backend; each holder gets one slot
    (:attr:`Lease.slot`) with its own fencing token, and ``force`` takes one
    slot. Everyone must take a key with the same count: a holder that took it
    with another raises :class:`~runlock.SlotsMismatch`. 1 is a plain key.

    The lease is acquired when this is called and held until :meth:`Lease.release`
    or the end of the ``with`` block.
    """
    key_list = [keys] if isinstance(keys, str) else list(keys)
    if not key_list or not all(isinstance(k, str) for k in key_list):
        raise ValueError("keys must be a str or a non-empty sequence of str")
    wait_ms = _wait_millis(wait)
    ttl_ms = None if ttl is None else _millis(ttl, "ttl")
    _uint32(slots, "slots")
    conn = Connection(resolve(socket))
    fds: List[int] = []
    try:
        request = messages.acquire(
            conn.next_id(),
            key_list,
            ttl_ms=ttl_ms,
            wait_ms=wait_ms or None,
            force=True if force else None,
            command=_default_command() if command is None else command,
            slots=slots,
        )
        # Waiting without bound, the agent's answer has no deadline either.
        reply_within = None if wait_ms == _MAX_MILLIS else wait_ms / 1000 + REPLY_SLACK_S
        reply, fds = conn.request_fds(request, timeout=reply_within)
        if not isinstance(reply, messages.Acquired):
            raise ProtocolError(f"unexpected answer to acquire: {reply!r}")
        if fds and len(fds) != len(reply.leases):
            raise ProtocolError(
                f"the agent passed {len(fds)} lock descriptors for {len(reply.leases)} leases"
            )
        return Lease(conn, reply, on_lost, fds)
    except BaseException:
        _unlock(fds)
        close_fds(fds)
        conn.close()  # releases anything taken, e.g. on KeyboardInterrupt mid-wait
        raise


def _one_shot(socket: SocketPath, build: Callable[[int], Dict[str, Any]]) -> AgentMessage:
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


def list_keys(
    prefix: str = "",
    *,
    free: bool = False,
    events_since_ms: Optional[int] = None,
    socket: SocketPath = None,
) -> Iterator[KeyListing]:
    """Every key the store records, from every host that shares it
    (``runlock list``), read a page at a time as they are iterated: held
    keys, and with ``free`` the others too; those that start with ``prefix``.
    A page the store fails raises where the iteration reached it, after the
    keys of the pages before."""
    conn = Connection(resolve(socket))
    try:
        cursor: Optional[str] = None
        while True:
            request = messages.list_keys(
                conn.next_id(), prefix, cursor, free=free, events_since_ms=events_since_ms
            )
            reply = conn.request(request, timeout=LIST_PAGE_TIMEOUT_S)
            if not isinstance(reply, messages.Keys):
                raise ProtocolError(f"unexpected answer to list_keys: {reply!r}")
            yield from reply.keys
            if reply.cursor is None:
                return
            if not reply.keys and reply.cursor == cursor:
                # An agent that cannot move on would be asked forever.
                raise ProtocolError(f"list_keys made no progress at cursor {cursor!r}")
            cursor = reply.cursor
    finally:
        conn.close()


def history(key: str, limit: Optional[int] = None, *, socket: SocketPath = None) -> List[KeyEvent]:
    """The latest events of ``key``, oldest first (``runlock history``): every
    grant, release, force, break, expiry and loss the backend's record keeps
    (at most 32), or the latest ``limit`` of them."""
    reply = _one_shot(socket, lambda i: messages.history(i, key, limit))
    if not isinstance(reply, messages.Events):
        raise ProtocolError(f"unexpected answer to history: {reply!r}")
    return list(reply.events)


def break_lock(key: str, *, slot: Optional[int] = None, socket: SocketPath = None) -> int:
    """Breaks whoever holds ``key`` (``runlock release KEY``; needs force rights);
    for a key with slots, ``slot`` names the one slot to break. Like a force,
    it returns only once the broken run has stopped or its deadline has
    passed, so that no waiter starts beside it (the ``forcing`` event says
    how long at most).

    Returns 1 if a lease was broken, 0 if the key (or slot) was free.
    """
    if slot is not None:
        _uint32(slot, "slot")
    reply = _one_shot(socket, lambda i: messages.release(i, key=key, slot=slot))
    if not isinstance(reply, messages.Released):
        raise ProtocolError(f"unexpected answer to release: {reply!r}")
    return reply.count
