"""End to end: the real Meltano with the add-on, two projects as two hosts,
each with its own agent and system database, sharing one store (file:// and
s3:// through moto, where Meltano's own S3 store writes the state)."""

from __future__ import annotations

import socket
import time
from typing import List

from conftest import STATE_ID, Host

#: A duplicate run must be refused at once: well within Meltano's own start-up.
REFUSAL_BOUND_S = 30.0


def committed(host: Host, expected: object) -> None:
    """Waits (bounded) until the store holds ``expected`` as the pipeline's state."""
    deadline = time.monotonic() + 60
    while True:
        state = host.state()
        if state == expected:
            return
        assert time.monotonic() < deadline, f"the state stayed {state!r}, not {expected!r}"


def test_a_second_unwrapped_run_fails_naming_the_holder(hosts: List[Host]) -> None:
    a, b = hosts
    first = a.run("a")
    a.wait_started(1, first)

    started = time.monotonic()
    second = b.run("b")
    status = second.wait()
    took = time.monotonic() - started
    out = second.output()
    assert status != 0, out
    assert f"{STATE_ID!r} is already running" in out, out
    assert f"pid {first.pid} on {socket.gethostname()}" in out, out
    assert " since " in out, out
    assert b.started() == [], "the second run's tap ran"
    assert took < REFUSAL_BOUND_S, took

    # `meltano state …` takes no run lock, while the run holds the key.
    listed = b.meltano("state", "list")
    assert listed.wait() == 0, listed.output()
    assert STATE_ID in listed.output()
    assert b.state() == {"singer_state": {"run": "a"}}

    a.release_taps()
    assert first.wait() == 0, first.output()
    assert a.state() == {"singer_state": {"run": "a", "step": "last"}}


def test_a_killed_run_frees_the_key_at_once_and_its_state_stays(hosts: List[Host]) -> None:
    a, b = hosts
    first = a.run("a")
    a.wait_started(1, first)
    committed(b, {"singer_state": {"run": "a"}})

    first.proc.kill()  # SIGKILL to Meltano alone, as a crash would
    first.proc.wait(timeout=30)
    second = b.run("b")
    b.wait_started(1, second)
    assert b.seen() == [{"run": "a"}], "the next run did not read the killed run's state"
    b.release_taps()
    assert second.wait() == 0, second.output()
    assert b.state() == {"singer_state": {"run": "b", "step": "last"}}


def test_a_forced_run_fences_the_state_writes_of_the_run_it_took_over(hosts: List[Host]) -> None:
    a, b = hosts
    first = a.run("a")
    a.wait_started(1, first)
    committed(b, {"singer_state": {"run": "a"}})

    forced = b.run("b", MELTANO_RUN_FORCE="true")
    b.wait_started(1, forced)
    assert b.seen() == [{"run": "a"}]
    committed(b, {"singer_state": {"run": "b"}})

    # A's tap now emits its last state; Meltano on A must not write it.
    a.release_taps()
    first.wait()
    out = first.output()
    assert "state write for 'dev:tap-counter-to-target-state' refused" in out, out
    assert f"now held by pid {forced.pid} on {socket.gethostname()}" in out, out
    assert b.state() == {"singer_state": {"run": "b"}}

    b.release_taps()
    assert forced.wait() == 0, forced.output()
    assert b.state() == {"singer_state": {"run": "b", "step": "last"}}
