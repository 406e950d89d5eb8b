"""The client against a real runlockd (memory:// and file://, see conftest)."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import List

import pytest

import runlock

#: Every wait on another thread or process is bounded by this.
BOUND_S = 10.0


def test_lock_and_unlock_with_a_growing_token(agent) -> None:
    with runlock.lock("dev:tap-x-to-target-y", socket=agent.socket, ttl=30) as first:
        assert first.key == "dev:tap-x-to-target-y"
        assert first.lease_id and first.token >= 1
        assert first.ttl_ms == 30000
        assert first.lost is None
    assert first.released
    with runlock.lock("dev:tap-x-to-target-y", socket=agent.socket) as second:
        assert second.token > first.token
        assert second.lease_id != first.lease_id
    record = runlock.inspect("dev:tap-x-to-target-y", socket=agent.socket)
    assert record.state == "free" and record.token == second.token


def test_held_names_the_holder(agent) -> None:
    with runlock.lock("dev:held", socket=agent.socket, command="pytest holder") as lease:
        with pytest.raises(runlock.Held) as caught:
            runlock.lock("dev:held", socket=agent.socket)
    assert type(caught.value) is runlock.Held and caught.value.code == "held"
    holder = caught.value.holder
    assert holder is not None
    assert holder.pid == os.getpid()
    assert holder.host == socket.gethostname()
    assert holder.uid == os.getuid()
    assert holder.command == "pytest holder"
    assert holder.token == lease.token
    assert caught.value.key == "dev:held"


def test_timeout_after_waiting_names_the_holder(agent) -> None:
    with runlock.lock("dev:busy", socket=agent.socket) as lease:
        with pytest.raises(runlock.Timeout) as caught:
            runlock.lock("dev:busy", socket=agent.socket, wait=0.3)
    assert isinstance(caught.value, runlock.Held)
    assert caught.value.holder is not None and caught.value.holder.token == lease.token


def test_wait_succeeds_once_the_holder_releases(agent) -> None:
    first = runlock.lock("dev:queue", socket=agent.socket)
    acquired = threading.Event()
    results: List[object] = []

    def waiter() -> None:
        try:
            with runlock.lock("dev:queue", socket=agent.socket, wait=BOUND_S) as lease:
                results.append(lease.token)
                acquired.set()
        except BaseException as err:  # reported to the main thread
            results.append(err)
            acquired.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    # The waiter must still be waiting while the key is held (an assertion
    # about blocking, not synchronisation: the release below is what wakes it).
    assert not acquired.wait(0.3)
    first.release()
    assert acquired.wait(BOUND_S), "waiter not woken by the release"
    thread.join(BOUND_S)
    assert results and isinstance(results[0], int) and results[0] > first.token


def test_invalid_key(agent) -> None:
    with pytest.raises(runlock.InvalidKey) as caught:
        runlock.lock("dev\nx", socket=agent.socket)
    assert caught.value.key == "dev\nx" and caught.value.code == "invalid_key"
    with pytest.raises(runlock.InvalidKey):
        runlock.inspect("x" * 513, socket=agent.socket)


def test_unreachable_socket_is_unavailable(tmp_path: Path) -> None:
    missing = str(tmp_path / "nobody.sock")
    with pytest.raises(runlock.Unavailable):
        runlock.lock("dev:a", socket=missing)
    with pytest.raises(runlock.Unavailable):
        runlock.status(socket=missing)
    # A socket file nobody listens on (a dead agent's) is refused, also Unavailable.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "stale.sock"))
    stale.close()
    with pytest.raises(runlock.Unavailable):
        runlock.inspect("dev:a", socket=str(tmp_path / "stale.sock"))


def test_force_fires_the_first_holders_on_lost(agent) -> None:
    events: "queue.Queue[runlock.LostEvent]" = queue.Queue()
    with runlock.lock("dev:force", socket=agent.socket, on_lost=events.put) as first:
        with runlock.lock("dev:force", socket=agent.socket, force=True) as second:
            event = events.get(timeout=BOUND_S)
            assert event.reason == "forced"
            assert event.key == "dev:force" and event.lease_id == first.lease_id
            assert event.holder is not None and event.holder.token == second.token
            assert second.token > first.token
            assert first.lost == event
    # on_lost was given, so leaving the block does not raise.


def test_loss_without_on_lost_raises_when_the_block_exits(agent) -> None:
    with pytest.raises(runlock.LockLost) as caught:
        with runlock.lock("dev:broken", socket=agent.socket) as lease:
            assert runlock.break_lock("dev:broken", socket=agent.socket) == 1
            assert lease.wait_lost(BOUND_S) is not None
            with pytest.raises(runlock.LockLost):
                lease.check()
    assert caught.value.event.reason == "broken"
    assert runlock.inspect("dev:broken", socket=agent.socket).state == "free"


def test_killed_holder_frees_the_key_promptly(agent) -> None:
    src = Path(runlock.__file__).resolve().parent.parent
    script = textwrap.dedent(
        """
        import sys, time, runlock
        lease = runlock.lock("dev:crash", socket=sys.argv[1])
        print(lease.token, flush=True)
        time.sleep(600)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(src))
    child = subprocess.Popen(
        [sys.executable, "-c", script, agent.socket], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        line: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=lambda: line.put(child.stdout.readline()), daemon=True).start()
        token = int(line.get(timeout=BOUND_S))
        assert runlock.inspect("dev:crash", socket=agent.socket).state == "held"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(BOUND_S)
        started = time.monotonic()
        with runlock.lock("dev:crash", socket=agent.socket, wait=5) as lease:
            assert lease.token > token
        assert time.monotonic() - started < 2, "key not freed promptly after SIGKILL"
    finally:
        child.kill()
        child.wait()


def test_status_and_inspect(agent) -> None:
    with runlock.lock(["dev:b", "dev:a"], socket=agent.socket, ttl=20) as lease:
        assert lease.keys == ("dev:a", "dev:b")
        assert set(lease.tokens) == {"dev:a", "dev:b"}
        with pytest.raises(ValueError):
            lease.token  # several keys: use .tokens
        leases = {info.key: info for info in runlock.status(socket=agent.socket)}
        assert set(leases) == {"dev:a", "dev:b"}
        for key, info in leases.items():
            assert info.lease_id == lease.lease_ids[key]
            assert info.holder.pid == os.getpid() and info.holder.token == lease.tokens[key]
            assert info.ttl_ms == 20000
        record = runlock.inspect("dev:a", socket=agent.socket)
        assert record.state == "held" and record.token == lease.tokens["dev:a"]
        assert record.holder is not None and record.holder.pid == os.getpid()
        assert record.scope in ("host", "global")
    assert runlock.status(socket=agent.socket) == []
    assert runlock.inspect("dev:never", socket=agent.socket).state == "free"


def test_agent_stopping_is_a_loss(agent) -> None:
    events: "queue.Queue[runlock.LostEvent]" = queue.Queue()
    with runlock.lock("dev:restart", socket=agent.socket, on_lost=events.put) as lease:
        assert lease.agent.leases_survive_agent is False
        agent.stop(signal.SIGTERM)
        # memory:// and file:// locks die with the agent: `restarting` is the loss.
        event = events.get(timeout=BOUND_S)
        assert event.reason == "restarting" and event.key == "dev:restart"
        assert lease.agent_restarting
    assert lease.released
    assert events.empty(), "the connection's end must not report the loss twice"


def test_release_from_on_lost_does_not_deadlock(agent) -> None:
    done = threading.Event()

    def on_lost(event: runlock.LostEvent) -> None:
        lease.release()  # runs on the reader thread
        done.set()

    lease = runlock.lock("dev:selfrelease", socket=agent.socket, on_lost=on_lost)
    with runlock.lock("dev:selfrelease", socket=agent.socket, force=True):
        assert done.wait(BOUND_S)
    assert lease.released


def test_socket_from_the_config_file(agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "runlockd.toml"
    config.write_text(f'socket = "{agent.socket}"\nbackend = "memory://"\n')
    monkeypatch.delenv("RUNLOCK_SOCKET", raising=False)
    monkeypatch.setenv("RUNLOCK_CONFIG", str(config))
    if sys.version_info < (3, 11):
        pytest.skip("the configuration file is read with tomllib (Python 3.11+)")
    assert runlock.status() == []


def test_socket_from_environment(agent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNLOCK_SOCKET", agent.socket)
    assert runlock.status() == []
