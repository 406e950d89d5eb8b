"""Lock descriptors (SPEC 5.4) and reattaching (SPEC 8.7), played by scripted
fake agents: what arrives with which frame is kept or closed, the release
order, and each way a reattach ends, including those the real agent cannot
be made to show on demand (busy, unavailable, refused, a deadline passing)."""

from __future__ import annotations

import errno
import fcntl
import os
import queue
import select
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

import pytest

import runlock
from runlock import _wire, api

BOUND_S = 10.0

SURVIVING = {
    "type": "welcome", "version": 1, "agent": "fake", "agent_id": "f", "backend": "file:///x",
    "scope": "host", "default_ttl_ms": 30000, "leases_survive_agent": True,
}
LEASE = {"key": "k", "lease_id": "L1", "token": 7}

Script = Callable[[socket.socket], None]


def read(conn: socket.socket) -> Dict[str, Any]:
    return _wire.decode_body(_wire.read_frame(conn) or b"")


def send(conn: socket.socket, message: Dict[str, Any], fds: Sequence[int] = ()) -> None:
    frame = _wire.encode_frame(message)
    if fds:
        socket.send_fds(conn, [frame], list(fds))
    else:
        conn.sendall(frame)


def greet(conn: socket.socket, welcome: Dict[str, Any] = SURVIVING) -> None:
    hello = read(conn)
    assert hello["type"] == "hello" and hello["takes_locks"] is True
    send(conn, welcome)


def serve(path: str, scripts: List[Script]) -> threading.Thread:
    """Plays one agent per connection, in order, on one listening socket:
    a connection's end is its agent's end, the next accept the next agent."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    listener.settimeout(BOUND_S)

    def run() -> None:
        with listener:
            for script in scripts:
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(BOUND_S)
                    script(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def acquired(request: Dict[str, Any], **fields: Any) -> Dict[str, Any]:
    return {"id": request["id"], "type": "acquired", "leases": [LEASE], "ttl_ms": 30000, **fields}


def locked_file(tmp_path: Path) -> Tuple[Path, int]:
    """A file and a descriptor holding its flock, as the file backend hands out."""
    path = tmp_path / "k.lock"
    path.touch()
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return path, fd


def grants_then_crashes(lock_fd: int) -> Script:
    """An agent that grants the lease with `lock_fd` and then goes away."""

    def script(conn: socket.socket) -> None:
        greet(conn)
        send(conn, acquired(read(conn), locks=1), [lock_fd])
        os.close(lock_fd)

    return script


def is_locked(path: Path) -> bool:
    """Whether someone holds the flock (another open file description, so
    this process's own copies count as someone)."""
    probe = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(probe)


def closed_everywhere(read_end: int) -> bool:
    """True once every write end of the pipe is closed (bounded wait)."""
    ready, _, _ = select.select([read_end], [], [], BOUND_S)
    return bool(ready) and os.read(read_end, 1) == b""


def is_open_on(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == path.stat().st_ino
    except OSError as err:
        assert err.errno == errno.EBADF
        return False


def test_lock_descriptors_are_kept_unlocked_before_release_then_closed(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")
    lock_path, lock_fd = locked_file(tmp_path)
    at_release: "queue.Queue[bool]" = queue.Queue()

    def agent(conn: socket.socket) -> None:
        greet(conn)
        send(conn, acquired(read(conn), locks=1), [lock_fd])
        os.close(lock_fd)  # the run's copy is now the only one
        request = read(conn)
        assert request["type"] == "release" and request["lease_ids"] == ["L1"]
        at_release.put(is_locked(lock_path))
        send(conn, {"id": request["id"], "type": "released", "count": 1})

    thread = serve(path, [agent])
    lease = runlock.lock("k", socket=path)
    (fd,) = lease.lock_fds
    assert is_open_on(fd, lock_path) and is_locked(lock_path)
    assert not os.get_inheritable(fd)  # a subprocess gets it only through pass_fds
    lease.release()
    assert at_release.get(timeout=BOUND_S) is False, "still locked when release was sent"
    assert lease.lock_fds == () and not is_open_on(fd, lock_path)
    thread.join(BOUND_S)


def test_descriptors_that_come_with_any_other_frame_are_closed(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")
    pipes = [os.pipe() for _ in range(4)]
    lock_path, lock_fd = locked_file(tmp_path)
    done = threading.Event()

    def agent(conn: socket.socket) -> None:
        hello = read(conn)
        assert hello["takes_locks"] is True
        send(conn, SURVIVING, [pipes[0][1]])  # with the welcome
        request = read(conn)
        send(conn, {"type": "moved"}, [pipes[1][1]])  # an unknown event
        send(conn, {"type": "renewed", "lease_id": "L1", "valid_for_ms": 1000}, [pipes[2][1]])
        # One more than `locks`: the first is taken, the rest closed.
        send(conn, acquired(request, locks=1), [lock_fd, pipes[3][1]])
        done.wait(BOUND_S)

    thread = serve(path, [agent])
    lease = runlock.lock("k", socket=path)
    os.close(lock_fd)
    for read_end, write_end in pipes:
        os.close(write_end)  # the copies that went to the client are the only ones left
        assert closed_everywhere(read_end), "a descriptor from the agent was kept open"
        os.close(read_end)
    assert len(lease.lock_fds) == 1 and is_locked(lock_path)
    done.set()
    lease.release()
    assert not is_locked(lock_path)
    thread.join(BOUND_S)


def test_locks_spread_over_several_messages_are_taken_in_lease_order(tmp_path: Path) -> None:
    # Over 250 descriptors do not fit one message (SPEC 5.4): the agent sends
    # the frame's bytes in parts, each with up to 250 of them.
    path = str(tmp_path / "fake.sock")
    count = 300
    files = [tmp_path / f"k{i:03}.lock" for i in range(count)]
    leases: List[Dict[str, Any]] = [
        {"key": f"k{i:03}", "lease_id": f"L{i}", "token": i + 1} for i in range(count)
    ]

    def agent(conn: socket.socket) -> None:
        greet(conn)
        request = read(conn)
        frame = _wire.encode_frame({"id": request["id"], "type": "acquired", "leases": leases,
                                    "ttl_ms": 30000, "locks": count})
        fds = []
        for file in files:
            file.touch()
            fds.append(os.open(file, os.O_RDONLY))
        socket.send_fds(conn, [frame[:10]], fds[:250])
        socket.send_fds(conn, [frame[10:]], fds[250:])
        for fd in fds:
            os.close(fd)
        request = read(conn)
        send(conn, {"id": request["id"], "type": "released", "count": count})

    thread = serve(path, [agent])
    lease = runlock.lock([lease["key"] for lease in leases], socket=path)
    assert [os.fstat(fd).st_ino for fd in lease.lock_fds] == [f.stat().st_ino for f in files]
    lease.release()
    thread.join(BOUND_S)


def test_fewer_descriptors_than_locks_fails_the_acquire(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")
    read_end, write_end = os.pipe()
    ended = threading.Event()

    def agent(conn: socket.socket) -> None:
        greet(conn)
        send(conn, acquired(read(conn), locks=2), [write_end])
        assert _wire.read_frame(conn) is None  # the client gives up the connection
        ended.set()

    thread = serve(path, [agent])
    with pytest.raises(runlock.ProtocolError):
        runlock.lock("k", socket=path)
    os.close(write_end)
    assert closed_everywhere(read_end)
    os.close(read_end)
    assert ended.wait(BOUND_S)
    thread.join(BOUND_S)


def reattached_by(leases: List[Dict[str, Any]], answers: "queue.Queue[Dict[str, Any]]") -> Script:
    """An agent that takes the leases over, after checking the request."""

    def agent(conn: socket.socket) -> None:
        greet(conn)
        request = read(conn)
        assert request["type"] == "reattach" and request["leases"] == leases
        assert request["on_lost"] == "term"
        send(conn, {"id": request["id"], "type": "acquired", "leases": leases, "ttl_ms": 30000,
                    "valid_for_ms": 20000})
        send(conn, {"type": "renewed", "lease_id": "L1", "valid_for_ms": 15000})
        request = read(conn)  # what comes next: the release
        answers.put(request)
        send(conn, {"id": request["id"], "type": "released", "count": 1})

    return agent


def test_restarting_agent_then_busy_then_unavailable_then_reattached(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")
    after: "queue.Queue[Dict[str, Any]]" = queue.Queue()
    stopping = threading.Event()

    def first(conn: socket.socket) -> None:
        greet(conn)
        send(conn, acquired(read(conn), valid_for_ms=10000))
        stopping.wait(BOUND_S)
        send(conn, {"type": "restarting"})

    def busy(conn: socket.socket) -> None:
        send(conn, {"type": "error", "code": "unavailable", "message": "agent busy: 1 connection"})

    def backend_down(conn: socket.socket) -> None:
        greet(conn)
        request = read(conn)
        assert request["type"] == "reattach"
        send(conn, {"id": request["id"], "type": "error", "code": "unavailable", "message": "s3 down"})
        assert _wire.read_frame(conn) is None  # the client drops it before trying again

    thread = serve(path, [first, busy, backend_down, reattached_by([LEASE], after)])
    events: "queue.Queue[runlock.LostEvent]" = queue.Queue()
    lease = runlock.lock("k", socket=path, on_lost=events.put)
    stopping.set()
    assert lease.wait_reattached(BOUND_S), "not reattached"
    assert lease.lost is None and events.empty()
    assert lease.token == 7 and lease.lease_id == "L1" and lease.reattaches == 1
    assert not lease.reattaching and not lease.agent_restarting
    # The first guarantee was 10 s: the reattach's acquired (20 s), or the
    # new agent's renewed after it (15 s), replaced it.
    assert lease.valid_for_ms in (20000, 15000)
    lease.release()
    request = after.get(timeout=BOUND_S)
    assert request["type"] == "release" and request["lease_ids"] == ["L1"]
    thread.join(BOUND_S)


def test_a_slot_lease_is_asked_for_and_reattached_with_its_slot(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")
    slot_lease = {**LEASE, "slot": 2}
    after: "queue.Queue[Dict[str, Any]]" = queue.Queue()

    def first(conn: socket.socket) -> None:
        greet(conn)
        request = read(conn)
        assert request["type"] == "acquire" and request["slots"] == 3
        send(conn, {**acquired(request, valid_for_ms=10000), "leases": [slot_lease]})
        # Then it crashes: the connection ends.

    thread = serve(path, [first, reattached_by([slot_lease], after)])
    with runlock.lock("k", slots=3, socket=path) as lease:
        assert lease.slot == 2 and lease.token == 7
        assert lease.wait_reattached(BOUND_S), "not reattached"
        assert lease.slot == 2 and lease.lost is None
    request = after.get(timeout=BOUND_S)
    assert request["type"] == "release" and request["lease_ids"] == ["L1"]
    thread.join(BOUND_S)


@pytest.mark.parametrize(
    "code, message",
    [("not_owner", "lease L1 is no longer held"), ("forbidden", "another uid's lease")],
)
def test_a_refused_reattach_is_a_loss_and_unlocks(tmp_path: Path, code: str, message: str) -> None:
    path = str(tmp_path / "fake.sock")
    lock_path, lock_fd = locked_file(tmp_path)

    # It crashes: the connection ends without `restarting`.
    first = grants_then_crashes(lock_fd)

    def refusing(conn: socket.socket) -> None:
        greet(conn)
        request = read(conn)
        send(conn, {"id": request["id"], "type": "error", "code": code, "message": message})

    thread = serve(path, [first, refusing])
    with pytest.raises(runlock.LockLost) as caught:
        with runlock.lock("k", socket=path) as lease:
            event = lease.wait_lost(BOUND_S)
            assert event is not None and event.reason == "reattach_refused"
            assert code in event.message and message in event.message
            assert lease.lock_fds == () and not is_locked(lock_path)
            assert not lease.wait_reattached(0)
    assert caught.value.event.reason == "reattach_refused"
    thread.join(BOUND_S)


def test_no_agent_before_the_deadline_is_a_loss(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")
    valid_for_s = 0.4

    def first(conn: socket.socket) -> None:
        greet(conn)
        send(conn, acquired(read(conn), valid_for_ms=int(valid_for_s * 1000)))

    thread = serve(path, [first])
    events: "queue.Queue[runlock.LostEvent]" = queue.Queue()
    started = time.monotonic()
    lease = runlock.lock("k", socket=path, on_lost=events.put)
    thread.join(BOUND_S)
    os.unlink(path)  # no agent from now on
    event = events.get(timeout=BOUND_S)
    assert event.reason == "expired" and event.lease_id == "L1"
    assert time.monotonic() - started >= valid_for_s, "lost before the deadline"
    assert not lease.reattaching
    lease.release()


def test_without_a_deadline_the_lock_is_kept_until_release(tmp_path: Path) -> None:
    # file:// without an agent: no valid_for_ms, so no deadline; the run's
    # descriptor holds the key, and release() ends the retrying.
    path = str(tmp_path / "fake.sock")
    lock_path, lock_fd = locked_file(tmp_path)
    retrying = threading.Event()

    first = grants_then_crashes(lock_fd)

    def busy(conn: socket.socket) -> None:
        send(conn, {"type": "error", "code": "unavailable", "message": "agent busy"})
        retrying.set()

    thread = serve(path, [first, busy])
    lease = runlock.lock("k", socket=path)
    assert retrying.wait(BOUND_S), "no reattach after the connection ended"
    thread.join(BOUND_S)
    os.unlink(path)  # no agent from now on: the retries go on
    assert lease.reattaching and lease.lost is None and is_locked(lock_path)
    assert lease.valid_for_ms is None
    started = time.monotonic()
    lease.release()
    assert time.monotonic() - started < 2, "release waited on the retrying"
    assert not is_locked(lock_path) and lease.lost is None and not lease.reattaching
    assert not [t for t in threading.enumerate() if t.name.startswith("runlock-reattach-")]


def test_release_while_a_reattach_is_in_flight_releases_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "fake.sock")
    lock_path, lock_fd = locked_file(tmp_path)
    asked = threading.Event()
    answer = threading.Event()
    after: "queue.Queue[Tuple[Dict[str, Any], bool]]" = queue.Queue()
    unlocked = threading.Event()
    real_unlock = api._unlock

    def unlock(fds: List[int]) -> None:
        real_unlock(fds)
        if fds:
            unlocked.set()

    monkeypatch.setattr(api, "_unlock", unlock)

    first = grants_then_crashes(lock_fd)

    def slow(conn: socket.socket) -> None:
        greet(conn)
        request = read(conn)
        asked.set()
        answer.wait(BOUND_S)
        send(conn, {"id": request["id"], "type": "acquired", "leases": [LEASE], "ttl_ms": 30000})
        release = read(conn)
        after.put((release, is_locked(lock_path)))
        send(conn, {"id": release["id"], "type": "released", "count": 1})

    thread = serve(path, [first, slow])
    lease = runlock.lock("k", socket=path)
    assert asked.wait(BOUND_S)
    releasing = threading.Thread(target=lease.release)
    releasing.start()
    assert unlocked.wait(BOUND_S)  # release() has begun: the reply now arrives after it
    assert not is_locked(lock_path)
    answer.set()
    releasing.join(BOUND_S)
    assert not releasing.is_alive()
    request, locked = after.get(timeout=BOUND_S)
    assert request["type"] == "release" and request["lease_ids"] == ["L1"] and not locked
    assert lease.lost is None and lease.reattaches == 0
    thread.join(BOUND_S)


def test_an_agent_whose_leases_do_not_survive_it_is_a_loss_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")
    memory = dict(SURVIVING, backend="memory://", leases_survive_agent=False)

    def first(conn: socket.socket) -> None:
        greet(conn, memory)
        send(conn, acquired(read(conn)))

    thread = serve(path, [first])
    lease = runlock.lock("k", socket=path)
    event = lease.wait_lost(BOUND_S)
    assert event is not None and event.reason == "agent_gone"
    assert not lease.reattaching and lease.reattaches == 0
    with pytest.raises(runlock.LockLost):
        lease.__exit__(None, None, None)
    thread.join(BOUND_S)
