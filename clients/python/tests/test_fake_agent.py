"""The connection's handling of what the real agent rarely sends: events
between a request and its reply, unknown events and fields, unknown error
codes and an oversized frame, played by a scripted fake agent."""

from __future__ import annotations

import queue
import socket
import struct
import threading
from pathlib import Path
from typing import Any, Callable, Dict

import pytest

import runlock
from runlock import _wire

BOUND_S = 10.0

WELCOME = {
    "type": "welcome", "version": 1, "agent": "fake", "agent_id": "f", "backend": "memory://",
    "scope": "host", "default_ttl_ms": 30000, "future_field": [1, 2],
}


def serve(path: str, script: Callable[[socket.socket], None]) -> threading.Thread:
    """Answers one connection's hello with WELCOME, then runs ``script``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def run() -> None:
        conn, _ = listener.accept()
        listener.close()
        with conn:
            conn.settimeout(BOUND_S)
            hello = _wire.decode_body(_wire.read_frame(conn) or b"")
            assert hello["type"] == "hello" and hello["version"] == 1
            assert hello["client"].startswith("runlock-python ")
            conn.sendall(_wire.encode_frame(WELCOME))
            script(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def read(conn: socket.socket) -> Dict[str, Any]:
    return _wire.decode_body(_wire.read_frame(conn) or b"")


def send(conn: socket.socket, message: Dict[str, Any]) -> None:
    conn.sendall(_wire.encode_frame(message))


def grant(request: Dict[str, Any]) -> Dict[str, Any]:
    return {"id": request["id"], "type": "acquired", "ttl_ms": 30000, "valid_for_ms": 20000,
            "leases": [{"key": "k", "lease_id": "L1", "token": 7, "extra": True}]}


def test_events_unknown_messages_and_loss(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")
    closed = threading.Event()

    def script(conn: socket.socket) -> None:
        request = read(conn)
        assert request["type"] == "acquire" and request["id"] >= 1
        send(conn, {"type": "moved", "lease_id": "L1"})  # unknown event: ignored
        send(conn, grant(request))
        send(conn, {"type": "renewed", "lease_id": "L1", "valid_for_ms": 15000})
        send(conn, {"type": "renewed", "lease_id": "other", "valid_for_ms": 1})  # not ours
        send(conn, {"type": "lost", "lease_id": "other", "key": "x", "reason": "expired", "message": "m"})
        send(conn, {"type": "lost", "lease_id": "L1", "key": "k", "reason": "vanished", "message": "m"})
        # Every lease is lost, so release() only closes: no request, then end-of-file.
        assert _wire.read_frame(conn) is None
        closed.set()

    thread = serve(path, script)
    events: "queue.Queue[runlock.LostEvent]" = queue.Queue()
    lease = runlock.lock("k", socket=path, on_lost=events.put)
    event = events.get(timeout=BOUND_S)
    assert event.reason == "vanished"  # an unknown reason is kept as is
    assert lease.valid_for_ms == 15000
    assert events.empty()
    lease.release()
    assert closed.wait(BOUND_S)
    thread.join(BOUND_S)


def test_unknown_error_code_fails_the_request(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")

    def script(conn: socket.socket) -> None:
        request = read(conn)
        send(conn, {"id": request["id"], "type": "error", "code": "quota_exceeded", "message": "too many"})

    thread = serve(path, script)
    with pytest.raises(runlock.RunlockError) as caught:
        runlock.status(socket=path)
    assert type(caught.value) is runlock.RunlockError and caught.value.code == "quota_exceeded"
    thread.join(BOUND_S)


def test_oversized_frame_from_the_agent_is_a_loss(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")
    done = threading.Event()

    def script(conn: socket.socket) -> None:
        send(conn, grant(read(conn)))
        conn.sendall(struct.pack(">I", _wire.MAX_BODY_LEN + 1))
        done.wait(BOUND_S)

    thread = serve(path, script)
    lease = runlock.lock("k", socket=path)
    event = lease.wait_lost(BOUND_S)
    assert event is not None and event.reason == "agent_gone"
    with pytest.raises(runlock.LockLost):
        lease.__exit__(None, None, None)
    done.set()
    thread.join(BOUND_S)


def test_unsupported_version_is_a_protocol_error(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            read(conn)
            send(conn, {"type": "error", "code": "unsupported_version", "message": "speak 2"})

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    with pytest.raises(runlock.ProtocolError):
        runlock.status(socket=path)
    thread.join(BOUND_S)
    listener.close()
