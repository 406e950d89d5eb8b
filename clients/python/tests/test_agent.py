"""The client against a real runlockd (memory:// and file://, see conftest;
the restart tests on file:// and s3://)."""

from __future__ import annotations

import math
import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List

import pytest

import runlock
from conftest import Backend
from runlock.testing import Agent

#: Every wait on another thread or process is bounded by this.
BOUND_S = 10.0


def test_lock_and_unlock_with_a_growing_token(agent: Agent) -> None:
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


def test_held_names_the_holder(agent: Agent) -> None:
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


def test_timeout_after_waiting_names_the_holder(agent: Agent) -> None:
    with runlock.lock("dev:busy", socket=agent.socket) as lease:
        with pytest.raises(runlock.Timeout) as caught:
            runlock.lock("dev:busy", socket=agent.socket, wait=0.3)
    assert isinstance(caught.value, runlock.Held)
    assert caught.value.holder is not None and caught.value.holder.token == lease.token


def test_held_prints_its_holder_as_the_shim_does(agent: Agent, runlockd: Path) -> None:
    with runlock.lock("dev:shown", socket=agent.socket, command="pytest holder") as lease:
        with pytest.raises(runlock.Timeout) as caught:
            runlock.lock("dev:shown", socket=agent.socket, wait=0.1)
        shim = subprocess.run(
            [str(runlockd.parent / "runlock"), "--socket", str(agent.socket), "run"]
            + ["--key", "dev:shown", "--", "true"],
            capture_output=True,
            text=True,
            timeout=BOUND_S,
        )
    assert shim.returncode == 75, shim.stderr
    printed = str(caught.value).splitlines()
    assert printed[0] == caught.value.message
    for line in [
        f"  host:    {socket.gethostname()}",
        f"  pid:     {os.getpid()}",
        f"  command: pytest holder",
        f"  token:   {lease.token}",
    ]:
        assert line in printed, f"{line!r} not in {printed}"
    assert any(line.startswith(f"  user:    ") and f"(uid {os.getuid()})" in line for line in printed)
    # The same fields in the same words as the shim's exit-75 message; the
    # "since" line too, but for how long ago, which may have ticked on.
    by_field = lambda lines: {l.split(":")[0].strip(): l for l in lines if l.startswith("  ")}
    ours, shims = by_field(printed), by_field(shim.stderr.splitlines())
    assert ours.keys() == shims.keys() == {"host", "pid", "user", "command", "since", "token"}
    for name in ("host", "pid", "user", "command", "token"):
        assert ours[name] == shims[name]
    assert ours["since"].split(" (")[0] == shims["since"].split(" (")[0]


def test_an_infinite_wait_waits_until_the_holder_releases(agent: Agent) -> None:
    first = runlock.lock("dev:forever", socket=agent.socket)
    done: "queue.Queue[object]" = queue.Queue()

    def waiter() -> None:
        try:
            with runlock.lock("dev:forever", socket=agent.socket, wait=math.inf) as lease:
                done.put(lease.token)
        except BaseException as err:  # reported to the main thread
            done.put(err)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    # Still waiting while the key is held (about blocking, not synchronisation).
    with pytest.raises(queue.Empty):
        done.get(timeout=0.3)
    first.release()
    token = done.get(timeout=BOUND_S)
    assert isinstance(token, int) and token > first.token, token
    thread.join(BOUND_S)


def test_wait_succeeds_once_the_holder_releases(agent: Agent) -> None:
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


def test_history_lists_grants_forces_and_releases_in_order(agent: Agent) -> None:
    key = "dev:history"
    # The forced lock is granted once the first is stopped or past its
    # deadline (TTL + grace: 2.5 s here), and this thread holds the first.
    with pytest.raises(runlock.LockLost):
        with runlock.lock(key, socket=agent.socket, ttl=2) as first:
            with runlock.lock(key, socket=agent.socket, force=True) as second:
                pass
    assert first.lost is not None and first.lost.reason == "forced"
    events = runlock.history(key, socket=agent.socket)
    kinds = [(e.kind, e.token) for e in events]
    assert kinds == [("granted", first.token), ("forced", second.token), ("released", second.token)], kinds
    assert events[1].from_token == first.token and events[1].pid == os.getpid()
    assert [e.kind for e in runlock.history(key, limit=1, socket=agent.socket)] == ["released"]
    assert runlock.inspect(key, socket=agent.socket).incident == events[1]


def test_invalid_key(agent: Agent) -> None:
    with pytest.raises(runlock.InvalidKey) as caught:
        runlock.lock("dev\nx", socket=agent.socket)
    assert caught.value.key == "dev\nx" and caught.value.code == "invalid_key"
    with pytest.raises(runlock.InvalidKey):
        runlock.inspect("x" * 513, socket=agent.socket)
    # A zero-width space would make a key look like another.
    with pytest.raises(runlock.InvalidKey) as caught:
        runlock.lock("night\u200bly", socket=agent.socket)
    assert "invisible" in str(caught.value)


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


def test_force_fires_the_first_holders_on_lost(agent: Agent) -> None:
    events: "queue.Queue[runlock.LostEvent]" = queue.Queue()
    # Granted at the first's deadline (2.5 s): this thread still holds it.
    with runlock.lock("dev:force", socket=agent.socket, on_lost=events.put, ttl=2) as first:
        with runlock.lock("dev:force", socket=agent.socket, force=True) as second:
            event = events.get(timeout=BOUND_S)
            assert event.reason == "forced"
            assert event.key == "dev:force" and event.lease_id == first.lease_id
            assert event.holder is not None and event.holder.token == second.token
            assert second.token > first.token
            assert first.lost == event
    # on_lost was given, so leaving the block does not raise.


def test_loss_without_on_lost_raises_when_the_block_exits(agent: Agent) -> None:
    with pytest.raises(runlock.LockLost) as caught:
        # The break frees the key once this block (the run) ends, or at the
        # lease's deadline, TTL + grace: 2.5 s.
        with runlock.lock("dev:broken", socket=agent.socket, ttl=2) as lease:
            assert runlock.break_lock("dev:broken", socket=agent.socket) == 1
            assert lease.wait_lost(BOUND_S) is not None
            with pytest.raises(runlock.LockLost):
                lease.check()
    assert caught.value.event.reason == "broken"
    assert runlock.inspect("dev:broken", socket=agent.socket).state == "free"


def test_killed_holder_frees_the_key_promptly(agent: Agent) -> None:
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
        stdout = child.stdout
        assert stdout is not None
        threading.Thread(target=lambda: line.put(stdout.readline()), daemon=True).start()
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


def test_status_and_inspect(agent: Agent) -> None:
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


def test_list_keys_pages_through_every_key_held_and_free(agent: Agent) -> None:
    keys = [f"list:{i:04}" for i in range(600)]
    with runlock.lock(keys, socket=agent.socket, ttl=20) as lease:
        runlock.lock("list:free", socket=agent.socket).release()
        held = list(runlock.list_keys("list:", socket=agent.socket))
        assert [k.key for k in held] == keys
        first = held[0]
        assert first.record is not None and first.record.state == "held"
        assert first.record.holder is not None and first.record.holder.pid == os.getpid()
        assert first.record.token == lease.tokens["list:0000"]
        every = {k.key: k for k in runlock.list_keys("list:", free=True, socket=agent.socket)}
        assert len(every) == 601
        free = every["list:free"].record
        assert free is not None and free.state == "free" and free.token > 0
    assert list(runlock.list_keys("list:", socket=agent.socket)) == []
    with pytest.raises(runlock.InvalidKey):
        list(runlock.list_keys("bad\x01", socket=agent.socket))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_agent_stopping_is_a_loss_where_locks_die_with_it(memory_agent: Agent, sig: int) -> None:
    events: "queue.Queue[runlock.LostEvent]" = queue.Queue()
    with runlock.lock("dev:restart", socket=memory_agent.socket, on_lost=events.put) as lease:
        assert lease.agent.leases_survive_agent is False and lease.lock_fds == ()
        memory_agent.stop(sig)
        # memory:// locks die with the agent: `restarting` (SIGTERM) or the
        # connection's end (SIGKILL) is the loss, and no reattach is tried.
        event = events.get(timeout=BOUND_S)
        assert event.key == "dev:restart"
        if sig == signal.SIGTERM:
            assert event.reason == "restarting" and lease.agent_restarting
        else:
            assert event.reason == "agent_gone"
        assert not lease.reattaching and lease.reattaches == 0
    assert lease.released
    assert events.empty(), "the connection's end must not report the loss twice"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_agent_restart_keeps_the_lease_and_the_key_held_all_through(
    runlockd: Path, workdir: Path, surviving_backend: Backend, sig: int
) -> None:
    """Stopped (SIGTERM: `restarting`; SIGKILL: a crash) and started again on
    the same socket and backend, the agent takes the lease over: no loss, the
    same token, and another agent on the backend finds the key held in the gap."""
    backend, env = surviving_backend.uri, surviving_backend.env
    first = Agent(runlockd, workdir, backend, name="first", env=env)
    # On another socket, for looking at the backend while `first` is down.
    watcher = Agent(runlockd, workdir, backend, name="watcher", env=env)
    agents = [first, watcher]
    key = "dev:tap-x-to-target-y"
    events: "queue.Queue[runlock.LostEvent]" = queue.Queue()
    try:
        with runlock.lock(key, socket=first.socket, ttl=30, on_lost=events.put) as lease:
            token, first_id = lease.token, lease.agent.agent_id
            assert lease.agent.leases_survive_agent
            if surviving_backend.name == "file":
                assert len(lease.lock_fds) == 1 and lease.valid_for_ms is None
            else:
                assert lease.lock_fds == () and lease.valid_for_ms is not None
            first.stop(sig)

            gap = runlock.inspect(key, socket=watcher.socket)
            assert gap.state == "held" and gap.token == token, "key free while no agent held it"
            with pytest.raises(runlock.Held):
                runlock.lock(key, socket=watcher.socket)
            assert lease.lost is None

            second = Agent(runlockd, workdir, backend, name="second", socket=first.socket, env=env)
            agents.append(second)
            assert lease.wait_reattached(BOUND_S), f"not reattached: {second.log()}"
            assert lease.lost is None and events.empty()
            assert lease.token == token and lease.reattaches == 1
            assert lease.agent.agent_id not in ("", first_id)
            lease.check()
            record = runlock.inspect(key, socket=watcher.socket)
            assert record.state == "held" and record.token == token
            assert record.holder is not None and record.holder.agent_id == lease.agent.agent_id
            with pytest.raises(runlock.Held):
                runlock.lock(key, socket=watcher.socket)
        assert lease.released and lease.lost is None and events.empty()
        assert runlock.inspect(key, socket=watcher.socket).state == "free"
        with runlock.lock(key, socket=watcher.socket) as after:
            assert after.token > token
    finally:
        for started in agents:
            started.stop()


def test_a_lease_broken_while_no_agent_ran_is_lost_at_reattach(
    runlockd: Path, workdir: Path, surviving_backend: Backend
) -> None:
    """Broken through another agent while its own was down, the lease is
    refused (`not_owner`) by the next agent: a loss, and its lock is let go."""
    backend, env = surviving_backend.uri, surviving_backend.env
    first = Agent(runlockd, workdir, backend, name="first", env=env)
    watcher = Agent(runlockd, workdir, backend, name="watcher", env=env)
    agents = [first, watcher]
    key = "dev:broken-in-the-gap"
    try:
        with pytest.raises(runlock.LockLost) as caught:
            with runlock.lock(key, socket=first.socket, ttl=6) as lease:
                first.stop(signal.SIGKILL)
                # The break takes the key at once and frees it once this run
                # has stopped or its deadline passed: it runs aside meanwhile.
                breaking = ThreadPoolExecutor(1)
                broken = breaking.submit(runlock.break_lock, key, socket=watcher.socket)
                deadline = time.monotonic() + BOUND_S
                while runlock.inspect(key, socket=watcher.socket).token == lease.token:
                    assert time.monotonic() < deadline, "the break never took the key"
                    time.sleep(0.02)
                second = Agent(runlockd, workdir, backend, name="second", socket=first.socket, env=env)
                agents.append(second)
                event = lease.wait_lost(BOUND_S)
                assert event is not None and event.reason == "reattach_refused"
                assert "not_owner" in event.message
                assert lease.lock_fds == () and not lease.reattaching
        assert caught.value.event.reason == "reattach_refused"
        assert broken.result(timeout=BOUND_S) == 1
        breaking.shutdown()
        with runlock.lock(key, socket=watcher.socket) as after:
            assert after.token > lease.token
    finally:
        for started in agents:
            started.stop()


def test_file_locks_are_the_runs_and_release_drops_them_for_children(
    runlockd: Path, workdir: Path
) -> None:
    agent = Agent(runlockd, workdir, f"file://{workdir / 'locks'}")
    child = None
    try:
        with runlock.lock(["dev:b", "dev:a"], socket=agent.socket) as lease:
            fds = lease.lock_fds
            assert len(fds) == 2 and not any(os.get_inheritable(fd) for fd in fds)
            child = subprocess.Popen(
                [sys.executable, "-c", "import sys; sys.stdin.read()"],
                stdin=subprocess.PIPE,
                pass_fds=fds,
            )
            for fd in fds:  # the child has the very lock files
                assert os.stat(f"/proc/{child.pid}/fd/{fd}").st_ino == os.fstat(fd).st_ino
        # Release unlocked them first, for every holder: the child left behind
        # does not keep the keys.
        assert lease.lock_fds == () and child.poll() is None
        for key in ("dev:a", "dev:b"):
            assert runlock.inspect(key, socket=agent.socket).state == "free"
        with runlock.lock(["dev:a", "dev:b"], socket=agent.socket) as again:
            assert again.tokens["dev:a"] > lease.tokens["dev:a"]
    finally:
        if child is not None:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(BOUND_S)
        agent.stop()


def test_release_from_on_lost_does_not_deadlock(agent: Agent) -> None:
    done = threading.Event()

    def on_lost(event: runlock.LostEvent) -> None:
        lease.release()  # runs on the reader thread
        done.set()

    lease = runlock.lock("dev:selfrelease", socket=agent.socket, on_lost=on_lost)
    with runlock.lock("dev:selfrelease", socket=agent.socket, force=True):
        assert done.wait(BOUND_S)
    assert lease.released


def test_socket_from_the_config_file(
    agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "runlockd.toml"
    config.write_text(f'socket = "{agent.socket}"\nbackend = "memory://"\n')
    monkeypatch.delenv("RUNLOCK_SOCKET", raising=False)
    monkeypatch.setenv("RUNLOCK_CONFIG", str(config))
    if sys.version_info < (3, 11):
        pytest.skip("the configuration file is read with tomllib (Python 3.11+)")
    assert runlock.status() == []


def test_socket_from_environment(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNLOCK_SOCKET", agent.socket)
    assert runlock.status() == []

