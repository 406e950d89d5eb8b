"""The connection's handling of what the real agent rarely sends: events
between a request and its reply, unknown events and fields, unknown error
codes and an oversized frame, played by a scripted fake agent."""

from __future__ import annotations

import queue
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict

import pytest

import runlock
from runlock import _connection, _wire

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


def test_a_listing_that_stops_moving_fails_instead_of_asking_forever(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")

    def script(conn: socket.socket) -> None:
        first = read(conn)
        key = {"key": "a", "record": {"key": "a", "state": "free", "token": 1, "scope": "host"}}
        send(conn, {"id": first["id"], "type": "keys", "keys": [key], "cursor": "c1"})
        # An agent that cannot fit the next key, answering the same cursor forever.
        while True:
            body = _wire.read_frame(conn)
            if body is None:
                return
            request = _wire.decode_body(body)
            assert request["cursor"] == "c1"
            send(conn, {"id": request["id"], "type": "keys", "keys": [], "cursor": "c1"})

    thread = serve(path, script)
    listed = []
    with pytest.raises(runlock.ProtocolError, match="no progress"):
        for key in runlock.list_keys(socket=path):
            listed.append(key.key)
    assert listed == ["a"]
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


def listen(path: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    return listener


def test_an_agent_at_its_limits_refuses_and_that_is_not_an_outage(tmp_path: Path) -> None:
    # The agent's "busy": one error without id, sent before it reads anything, then close.
    path = str(tmp_path / "fake.sock")
    listener = listen(path)
    busy = {"type": "error", "code": "unavailable", "message": "agent busy: 64 connections"}

    def run() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                send(conn, busy)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    for attempt in (lambda: runlock.status(socket=path), lambda: runlock.lock("k", socket=path)):
        with pytest.raises(runlock.Unavailable) as caught:
            attempt()
        assert caught.value.code == "unavailable"  # the agent's answer: a refusal, not unreachable
        assert "refused the connection: agent busy: 64 connections" in caught.value.message
    thread.join(BOUND_S)
    listener.close()


def test_an_agent_that_never_answers_is_unavailable_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "fake.sock")
    listener = listen(path)  # never accepts: the kernel completes the connect anyway
    monkeypatch.setattr(_connection, "HANDSHAKE_TIMEOUT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(runlock.Unavailable) as caught:
        runlock.status(socket=path)
    assert time.monotonic() - started < BOUND_S
    assert caught.value.code is None
    assert caught.value.message.startswith(f"the agent at {path} did not answer within 0.5s")
    listener.close()


def test_an_agent_trickling_bytes_is_bound_by_the_whole_handshake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "fake.sock")
    listener = listen(path)
    done = threading.Event()

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            read(conn)
            conn.sendall(struct.pack(">I", 100))
            # One byte per 0.2 s never trips a per-read timeout of 0.5 s.
            while not done.wait(0.2):
                conn.sendall(b"\x00")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    monkeypatch.setattr(_connection, "HANDSHAKE_TIMEOUT_S", 0.5)
    with pytest.raises(runlock.Unavailable) as caught:
        runlock.status(socket=path)
    done.set()
    assert "did not answer within 0.5s" in caught.value.message
    thread.join(BOUND_S)
    listener.close()
