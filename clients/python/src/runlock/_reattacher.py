"""The reattach thread of a lease: where leases outlive the agent, an agent
that restarts or goes away is not a loss; this seeks the next agent on the
same socket and has it adopt the leases (SPEC 8.7), until their deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, List, Optional

from . import messages
from ._connection import HANDSHAKE_TIMEOUT_S, Connection
from ._timeouts import REATTACH_PAUSE_MAX_S, REATTACH_PAUSE_MIN_S, RELEASE_WAIT_S, REPLY_SLACK_S
from ._wire import close_fds
from .errors import RunlockError
from .messages import Grant

if TYPE_CHECKING:
    from .api import Lease

_log = logging.getLogger("runlock")


def _retryable(err: RunlockError) -> bool:
    """Whether a reattach may be tried again after ``err``: anything but an
    agent's error answer (which has a code) other than ``unavailable``."""
    return err.code is None or err.code == "unavailable"


class Reattacher:
    """Reattaches ``lease`` on a thread of its own whenever its agent goes.

    Its fields are guarded by the lease's lock, as is what it changes of the
    lease: who holds the leases, their deadline, the count of reattaches.
    """

    def __init__(self, lease: Lease):
        self._lease = lease
        #: The thread seeking the next agent; None while an agent holds the leases.
        self.thread: Optional[threading.Thread] = None
        self._attempt: Optional[Connection] = None  # a reattach's connection, before it is adopted
        self._stop = threading.Event()  # set by release(): a reattach in progress gives up

    def agent_lost(self, conn: Connection, why: str) -> None:
        """The agent of ``conn`` is going or gone, and the leases outlive it:
        keep them (and their locks) and seek the next agent in the background."""
        lease = self._lease
        with lease._lock:
            if lease._released or not lease._active or conn is not lease._conn:
                return
            lease._conn = None
            lease._retired.append(conn)
            thread = threading.Thread(
                target=self._reattach, name=f"runlock-reattach-{lease._path}", daemon=True
            )
            self.thread = thread
        _log.info("runlock: %s; keeping the lease and reattaching", why)
        thread.start()

    def stop(self) -> None:
        """Has a reattach in progress give up (the lease is being released)."""
        self._stop.set()

    def _reattach(self) -> None:
        """Retries, 50 ms doubling to 500 ms apart, while no agent answers or it
        answers ``unavailable``, until the leases' deadline (the shim's rule)."""
        lease = self._lease
        pause = REATTACH_PAUSE_MIN_S
        while not self._stop.is_set():
            with lease._lock:
                grants = [g for g in lease.grants if g.lease_id in lease._active]
                deadline = lease._deadline()
            if not grants:
                return
            if deadline is not None and time.monotonic() >= deadline:
                lease._lose_all("expired", "no agent took the lease over before its deadline")
                return
            try:
                if self._try_reattach(grants, deadline):
                    return
            except Exception:  # a bug here must not leave the lease reattaching for ever unseen
                _log.exception("runlock: reattach attempt failed; trying again")
            wait = pause if deadline is None else min(pause, max(deadline - time.monotonic(), 0))
            self._stop.wait(wait)
            pause = min(pause * 2, REATTACH_PAUSE_MAX_S)

    def _try_reattach(self, grants: List[Grant], deadline: Optional[float]) -> bool:
        """One attempt; True when it settled the matter (adopted, refused, or
        released). Only an agent's error answer other than ``unavailable``
        refuses: no answer, a broken one or ``unavailable`` is tried again."""
        lease = self._lease

        def left() -> float:
            return REPLY_SLACK_S if deadline is None else max(deadline - time.monotonic(), 0.001)

        try:
            conn = Connection(lease._path, timeout=left())
        except RunlockError as err:
            if _retryable(err):  # no agent yet, or one too busy to take us
                _log.debug("runlock: reattach: %s", err)
                return False
            lease._lose_all("reattach_refused", err.message)
            return True
        with lease._lock:
            stopped = lease._released
            if not stopped:
                self._attempt = conn
        if stopped:
            conn.close()
            return True
        try:
            request = messages.reattach(conn.next_id(), grants)
            reply, fds = conn.request_fds(request, timeout=min(REPLY_SLACK_S, left()))
            close_fds(fds)  # the run keeps its own locks; a reattach passes none (SPEC 8.7)
        except RunlockError as err:
            conn.close()
            if _retryable(err):  # its backend cannot be reached, or it went away
                _log.debug("runlock: reattach: %s", err)
                return False
            lease._lose_all(
                "reattach_refused",
                f"the agent would not take the lease over ({err.code}): {err.message}",
            )
            return True
        finally:
            with lease._lock:
                self._attempt = None
        if not isinstance(reply, messages.Acquired):
            conn.close()
            _log.warning("runlock: reattach: unexpected answer %r; trying again", reply)
            return False
        self._adopt(conn, reply, grants)
        return True

    def _adopt(self, conn: Connection, reply: messages.Acquired, grants: List[Grant]) -> None:
        """``conn`` now holds the leases; its ``acquired`` resets their deadline."""
        lease = self._lease
        with lease._lock:
            released = lease._released
            if not released:
                lease._conn, lease._welcome = conn, conn.welcome
                retired, lease._retired = lease._retired, []
                if reply.valid_for_ms is not None:
                    lease._learn_valid_for(list(lease._active), reply.valid_for_ms)
                elif lease._expires:
                    # Leases that can expire, with no guarantee given: none beyond now.
                    lease._learn_valid_for(list(lease._active), 0)
                lease._reattaches += 1
                lease.agent_restarting = False
                self.thread = None
                lease._changed.notify_all()
        if released:
            # release() came while the reattach was in flight, and has already
            # unlocked: give the adopted leases back through this connection.
            try:
                ids = [g.lease_id for g in grants]
                conn.request(messages.release(conn.next_id(), lease_ids=ids), timeout=RELEASE_WAIT_S)
            except RunlockError as err:
                _log.debug("runlock: release after reattach failed (%s); closing releases anyway", err)
            finally:
                conn.close()
            return
        lease._follower.follow(conn)
        for old in retired:
            old.close()
        _log.info("runlock: reattached to the agent at %s; the lock was kept", lease._path)

    def end(self, thread: threading.Thread) -> None:
        """Lets a reattach in flight finish (it then releases through its
        agent), bounded: past RELEASE_WAIT_S its connection is closed, which
        has the agent release whatever it adopted."""
        thread.join(RELEASE_WAIT_S)
        if thread.is_alive():
            with self._lease._lock:
                attempt = self._attempt
            if attempt is not None:
                attempt.close()
            thread.join(HANDSHAKE_TIMEOUT_S)
