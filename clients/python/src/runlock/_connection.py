"""One connection to the agent: connect, ``hello``, then requests matched to
their replies by id while a background thread reads every frame.

The reader thread exists because events (``lost``, ``renewed``,
``restarting``) may arrive at any time, also while the caller's code runs and
sends nothing; Python cannot interrupt that code safely, so the thread records
them and hands them to the lease (SPEC 4).

The client says ``takes_locks`` (SPEC 5.4): the reader keeps the lock
descriptors that come with an ``acquired`` for the request it answers, and
closes every other descriptor it receives at once.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import socket
import threading
import time
from importlib import metadata
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import errors, messages
from ._wire import close_fds, decode_body, encode_frame, read_frame, read_frame_fds
from .errors import ProtocolError, RunlockError, Unavailable
from .messages import AgentMessage, Welcome

try:
    # The installed distribution's version, which the build took from the
    # Cargo workspace (setup.py): one version for the agent, shim and client.
    __version__ = metadata.version("runlock")
except metadata.PackageNotFoundError:  # imported from a checkout, not installed
    __version__ = "0+unknown"
CLIENT_NAME = f"runlock-python {__version__}"

_log = logging.getLogger("runlock")

#: Bounds the connect and the handshake together, as the shim does: a live
#: agent answers `hello` at once, so past this it is stopped or overloaded.
HANDSHAKE_TIMEOUT_S = 5.0

EventHandler = Callable[[AgentMessage], None]
CloseHandler = Callable[[RunlockError], None]


def _call(handler: Callable[[Any], None], arg: Any) -> None:
    """Runs a handler; a bug in it must not stop the reader thread."""
    try:
        handler(arg)
    except Exception:
        _log.exception("runlock: event handler failed")


class _Pending:
    """A request awaiting its reply; the reader thread fills it in."""

    __slots__ = ("done", "reply", "error", "fds", "extended_s")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: Optional[AgentMessage] = None
        self.error: Optional[RunlockError] = None
        #: Lock descriptors that came with the reply, owned by the requester.
        self.fds: List[int] = []
        #: How much longer the agent said it needs (``forcing``), not yet added.
        self.extended_s = 0.0


class Connection:
    """A handshaken connection with a reader thread.

    Handlers installed with :meth:`set_handlers`: ``on_event`` receives every
    message without id that is not an error (``lost``, ``renewed``,
    ``restarting``; unknown ones are dropped here); ``on_close`` is called
    once if the connection ends for any reason other than :meth:`close`. Both
    run on the reader thread, or in :meth:`set_handlers` for what came before.
    """

    def __init__(self, path: str, timeout: Optional[float] = None) -> None:
        """Connects and shakes hands within ``timeout`` seconds (at most
        HANDSHAKE_TIMEOUT_S, the default)."""
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._pending: Dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._closed: Optional[RunlockError] = None
        self._closing = False
        # Events and the end of the connection are held back until the owner
        # installs its handlers, so one that arrives right after a reply is not lost.
        self._dispatch_lock = threading.RLock()
        self._on_event: Optional[EventHandler] = None
        self._on_close: Optional[CloseHandler] = None
        self._backlog: List[AgentMessage] = []
        self._ended: Optional[RunlockError] = None
        bound = HANDSHAKE_TIMEOUT_S if timeout is None else min(timeout, HANDSHAKE_TIMEOUT_S)
        deadline = time.monotonic() + max(bound, 0.001)
        try:
            self._connect(deadline)
            self.welcome = self._handshake(deadline)
            self._sock.settimeout(None)
        except socket.timeout as err:
            self._sock.close()
            raise Unavailable(
                f"the agent at {path} did not answer within {bound:g}s"
                " (is runlockd stopped or overloaded?)"
            ) from err
        except OSError as err:
            self._sock.close()
            raise Unavailable(
                f"cannot reach the agent at {path}: {err.strerror or err} (is runlockd running?)"
            ) from err
        except BaseException:
            self._sock.close()
            raise
        self._reader = threading.Thread(
            target=self._read_loop, name=f"runlock-reader-{path}", daemon=True
        )
        self._reader.start()

    # ------------------------------------------------------------------ handshake

    def _connect(self, deadline: float) -> None:
        """Connects by ``deadline``. A full listen queue (``EAGAIN`` on a Unix
        socket) is an agent slow to accept, not a missing one: retried."""
        pause = 0.01
        while True:
            self._sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                self._sock.connect(self.path)
                return
            except BlockingIOError:
                if time.monotonic() + pause >= deadline:
                    raise socket.timeout("timed out") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.2)

    def _handshake(self, deadline: float) -> Welcome:
        """Sends ``hello`` and waits for ``welcome`` before the reader starts,
        so nothing else can be in flight yet (SPEC 5.1).

        Any ``error`` before ``welcome``, with hello's id or without one, is
        the agent's answer to hello: an agent at its connection limits sends
        ``unavailable`` ("agent busy") before reading anything and closes. It
        is raised as that error (:class:`Unavailable` for ``unavailable``),
        never taken for an agent that could not be reached.
        """
        try:
            hello = messages.hello(CLIENT_NAME, os.getpid(), takes_locks=True)
            self._sock.sendall(encode_frame(hello))
            unsent: Optional[OSError] = None
        except OSError as err:
            # The agent may have answered and closed before reading hello.
            unsent = err
        while True:
            try:
                body = read_frame(self._sock, deadline)
            except OSError:
                if unsent is not None:
                    raise unsent from None
                raise
            if body is None:
                if unsent is not None:
                    raise unsent
                raise Unavailable(f"the agent at {self.path} closed the connection during hello")
            reply = messages.parse_agent(decode_body(body))
            if isinstance(reply, Welcome):
                if reply.version != messages.PROTOCOL_VERSION:
                    raise ProtocolError(f"agent answered with protocol version {reply.version}")
                return reply
            if isinstance(reply, messages.Error):
                raise errors.from_wire(
                    reply.code,
                    f"the agent at {self.path} refused the connection: {reply.message}",
                    reply.key,
                    reply.holder,
                    reply.holders,
                )
            if reply.id is not None:
                raise ProtocolError(f"unexpected answer to hello: {reply!r}")
            # An event or unknown message before welcome carries nothing for us.

    # ------------------------------------------------------------------ requests

    def next_id(self) -> int:
        """A fresh request id (a counter: ids only need to be unique while pending)."""
        return next(self._ids)

    def request(self, message: Dict[str, Any], timeout: Optional[float] = None) -> AgentMessage:
        """Sends a request built with ``message["id"]`` and waits for its reply.

        An ``error`` reply raises its RunlockError. ``timeout`` bounds the wait
        for an agent that stopped answering: the connection is then closed
        (which releases anything it holds) and Unavailable raised. A lock
        descriptor that came with the reply is closed: use
        :meth:`request_fds` for an ``acquire``.
        """
        reply, fds = self.request_fds(message, timeout)
        close_fds(fds)
        return reply

    def request_fds(
        self, message: Dict[str, Any], timeout: Optional[float] = None
    ) -> Tuple[AgentMessage, List[int]]:
        """As :meth:`request`, also returning the lock descriptors that came
        with an ``acquired`` reply (``locks`` of them, in lease order), which
        the caller then owns."""
        request_id = message["id"]
        pending = _Pending()
        frame = encode_frame(message)  # refuses an oversized body before registering
        with self._state_lock:
            if self._closed is not None:
                raise self._closed
            self._pending[request_id] = pending
        try:
            with self._send_lock:
                self._sock.sendall(frame)
        except OSError as err:
            with self._state_lock:
                self._pending.pop(request_id, None)
            raise Unavailable(f"cannot send to the agent at {self.path}: {err}") from err
        if not self._wait(pending, timeout):
            self.close()
            # A reply that raced the close may have brought descriptors; once
            # closed, the reader has stopped, so nothing can arrive after this.
            close_fds(pending.fds)
            raise Unavailable(f"the agent at {self.path} did not answer within {timeout:g}s")
        if pending.error is not None:
            raise pending.error
        assert pending.reply is not None  # invariant: done is set with a reply or an error
        if isinstance(pending.reply, messages.Error):
            raise pending.reply.exception()
        return pending.reply, pending.fds

    def _wait(self, pending: _Pending, timeout: Optional[float]) -> bool:
        """Waits for the reply within ``timeout``, and the longer waits a
        ``forcing`` event announced meanwhile."""
        if timeout is None:
            return pending.done.wait()
        deadline = time.monotonic() + timeout
        while not pending.done.wait(max(deadline - time.monotonic(), 0.0)):
            with self._state_lock:
                extended, pending.extended_s = pending.extended_s, 0.0
            if extended <= 0:
                return False
            if extended == math.inf:  # until the displaced run stops (file://)
                return pending.done.wait()
            deadline += extended
        return True

    # ------------------------------------------------------------------ reader thread

    def _read_loop(self) -> None:
        while True:
            try:
                frame = read_frame_fds(self._sock)
            except ProtocolError as err:
                self._end(err)  # an oversized frame: the stream cannot resync (SPEC 2)
                return
            except OSError as err:
                self._end(Unavailable(f"connection to the agent at {self.path} failed: {err}"))
                return
            if frame is None:
                self._end(Unavailable(f"the agent at {self.path} closed the connection"))
                return
            body, fds = frame
            taken: List[int] = []
            try:
                taken = self._dispatch(body, fds)
            finally:
                # Only an acquired's locks are kept: a descriptor left open
                # here could hold a lock nobody knows of.
                close_fds([fd for fd in fds if fd not in taken])

    def _dispatch(self, body: bytes, fds: List[int]) -> List[int]:
        """Handles one frame; returns the descriptors of ``fds`` now owned by a
        requester (the caller closes the others)."""
        try:
            decoded = decode_body(body)
        except ProtocolError as err:
            _log.warning("runlock: ignoring an undecodable message from the agent: %s", err)
            return []
        try:
            message = messages.parse_agent(decoded)
        except ProtocolError as err:
            # The frame boundary is known, so the stream stays in step; only
            # the request it answers (if its id is readable) fails.
            request_id = messages.message_id(decoded)
            if request_id is None:
                _log.warning("runlock: ignoring an undecodable message from the agent: %s", err)
            else:
                self._complete(request_id, None, err)
            return []
        if message.id is not None:
            if isinstance(message, messages.Acquired) and message.locks:
                if len(fds) < message.locks:
                    # Leases without their locks would not be held across an
                    # agent restart: fail the acquire (its connection is then
                    # closed, which gives the keys back).
                    error = ProtocolError(
                        f"the agent said {message.locks} lock descriptors came with"
                        f" its reply, but {len(fds)} did"
                    )
                    self._complete(message.id, None, error)
                    return []
                taken = fds[: message.locks]
                return taken if self._complete(message.id, message, None, taken) else []
            self._complete(message.id, message, None)
        elif isinstance(message, messages.Error):
            # An error without id answers input the agent could not attribute:
            # fail everything outstanding (SPEC 4).
            self._fail_pending(ProtocolError(f"agent reported: {message.message}", code=message.code))
        elif isinstance(message, messages.Unknown):
            _log.debug("runlock: ignoring unknown event %r", message.type)
        elif isinstance(message, messages.Forcing):
            # A forced acquire waits for the run it displaces to stop: the
            # agent answers that much later (with no bound, where the run
            # holds a kernel lock of its own).
            _log.warning("runlock: %s", message.describe())
            longer = math.inf if message.wait_ms is None else message.wait_ms / 1000
            with self._state_lock:
                for waiting in self._pending.values():
                    waiting.extended_s += longer
        else:
            with self._dispatch_lock:
                if self._on_event is None:
                    self._backlog.append(message)
                else:
                    _call(self._on_event, message)
        return []

    def _complete(
        self,
        request_id: int,
        reply: Optional[AgentMessage],
        error: Optional[RunlockError],
        fds: Optional[List[int]] = None,
    ) -> bool:
        """Hands a reply (and its descriptors) to its request; False when no
        request awaits it, so the descriptors are the caller's to close."""
        with self._state_lock:
            pending = self._pending.pop(request_id, None)
        if pending is None:
            _log.debug("runlock: ignoring a reply to unknown request %d", request_id)
            return False
        pending.reply, pending.error = reply, error
        pending.fds = list(fds or [])
        pending.done.set()
        return True

    def _fail_pending(self, error: RunlockError) -> None:
        with self._state_lock:
            pending, self._pending = list(self._pending.values()), {}
        for item in pending:
            item.error = error
            item.done.set()

    def _end(self, error: RunlockError) -> None:
        with self._state_lock:
            if self._closed is None:
                self._closed = error
            notify = not self._closing
        self._fail_pending(error)
        if notify:
            with self._dispatch_lock:
                if self._on_close is None:
                    self._ended = error
                else:
                    _call(self._on_close, error)

    def set_handlers(self, on_event: EventHandler, on_close: CloseHandler) -> None:
        """Installs the event and close handlers, first replaying what arrived before."""
        with self._dispatch_lock:
            self._on_event, self._on_close = on_event, on_close
            backlog, self._backlog = self._backlog, []
            ended, self._ended = self._ended, None
            for message in backlog:
                _call(on_event, message)
            if ended is not None:
                _call(on_close, ended)

    def on_reader_thread(self) -> bool:
        """True inside a handler: a request from there would wait for a reply
        that only this thread can read."""
        return threading.current_thread() is self._reader

    # ------------------------------------------------------------------ closing

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def close(self) -> None:
        """Closes the connection; the agent releases whatever it still holds.

        ``shutdown`` comes first so the agent sees end-of-file even if a forked
        child still has a copy of the descriptor, and so the reader thread wakes.
        """
        with self._state_lock:
            if self._closing:
                return
            self._closing = True
            if self._closed is None:
                self._closed = Unavailable("connection closed")
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already disconnected
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=5)  # before close(), so recv never sees a reused fd
        self._sock.close()
        self._fail_pending(Unavailable("connection closed"))
