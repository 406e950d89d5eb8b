"""Slots against the real runlockd (memory:// and file://, see conftest): a
key taken with ``slots=N`` admits N holders at once, each on its own slot
with its own fencing token; the N+1st is refused naming them all; another
count is refused as a mismatch; one slot is broken or freed alone."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Dict, List, Optional, Union

import pytest

import runlock
from conftest import Backend
from runlock.testing import Agent

#: Every wait on another thread is bounded by this.
BOUND_S = 10.0

KEY = "warehouse"


def hold_all(
    stack: ExitStack,
    agent: Agent,
    slots: int,
    on_lost: "Optional[Callable[[runlock.LostEvent], None]]" = None,
    ttl: Optional[float] = None,
) -> List[runlock.Lease]:
    """Takes every slot of KEY, each through its own connection, as separate runs would."""
    return [
        stack.enter_context(
            runlock.lock(
                KEY, slots=slots, socket=agent.socket, command=f"load {n}", on_lost=on_lost, ttl=ttl
            )
        )
        for n in range(slots)
    ]


def by_slot(holders: List[runlock.Holder]) -> Dict[int, int]:
    """Slot -> token, for every named holder (each must name its slot)."""
    named = {}
    for holder in holders:
        assert holder.slot is not None and holder.slots is not None, holder
        named[holder.slot] = holder.token
    return named


def test_three_hold_at_once_and_a_fourth_is_refused_naming_them(agent: Agent) -> None:
    with ExitStack() as stack:
        leases = hold_all(stack, agent, 3)
        assert {lease.slot for lease in leases} == {0, 1, 2}
        tokens = {lease.slot: lease.token for lease in leases}
        assert all(token >= 1 for token in tokens.values())
        assert len({lease.lease_id for lease in leases}) == 3

        record = runlock.inspect(KEY, socket=agent.socket)
        assert record.state == "held" and record.slots == 3
        assert by_slot(list(record.holders)) == tokens
        assert {h.slots for h in record.holders} == {3}
        assert {h.command for h in record.holders} == {"load 0", "load 1", "load 2"}
        # The lowest held slot stands for the key, as a client without slots reads it.
        assert record.holder == record.holders[0] and record.token == tokens[0]

        listed = [info for info in runlock.status(socket=agent.socket) if info.key == KEY]
        assert by_slot([info.holder for info in listed]) == tokens

        with pytest.raises(runlock.Held) as caught:
            runlock.lock(KEY, slots=3, socket=agent.socket)
        held = caught.value
        assert type(held) is runlock.Held and held.key == KEY
        assert "all 3 slots held" in held.message
        assert by_slot(held.holders) == tokens
        assert {h.pid for h in held.holders} == {os.getpid()}
        assert held.holder is not None and held.holder.slot == 0

        with pytest.raises(runlock.Timeout) as waited:
            runlock.lock(KEY, slots=3, wait=0.2, socket=agent.socket)
        assert by_slot(waited.value.holders) == tokens
    assert runlock.inspect(KEY, socket=agent.socket).holders == ()


def test_another_count_is_a_mismatch_naming_both(agent: Agent) -> None:
    with ExitStack() as stack:
        leases = hold_all(stack, agent, 3)
        for asked in (5, 1):
            with pytest.raises(runlock.SlotsMismatch) as caught:
                runlock.lock(KEY, slots=asked, socket=agent.socket)
            mismatch = caught.value
            assert mismatch.code == "slots_mismatch" and mismatch.key == KEY
            assert isinstance(mismatch, runlock.BadRequest)
            assert mismatch.held_with == 3
            assert "3 slots" in mismatch.message and f"asks {asked} slot" in mismatch.message
            assert mismatch.holders and {h.slots for h in mismatch.holders} == {3}
            held = {(lease.slot, lease.token) for lease in leases}
            assert set(by_slot(mismatch.holders).items()) <= held
        # Refused without taking anything: the three still hold, and only them.
        record = runlock.inspect(KEY, socket=agent.socket)
        assert by_slot(list(record.holders)) == {lease.slot: lease.token for lease in leases}

        # A plain key counts one slot: slots on it are a mismatch too.
        plain = stack.enter_context(runlock.lock("dev:plain", socket=agent.socket))
        with pytest.raises(runlock.SlotsMismatch) as caught:
            runlock.lock("dev:plain", slots=2, socket=agent.socket)
        assert caught.value.held_with == 1 and caught.value.holder is not None
        assert caught.value.holder.token == plain.token and plain.slot is None


def test_a_released_slot_lets_a_waiter_in_with_a_newer_token(agent: Agent) -> None:
    outcome: "queue.Queue[Union[runlock.Lease, BaseException]]" = queue.Queue()
    waiter_leases: List[runlock.Lease] = []

    def waiter() -> None:
        try:
            outcome.put(runlock.lock(KEY, slots=3, wait=BOUND_S, socket=agent.socket))
        except BaseException as err:  # reported to the main thread
            outcome.put(err)

    with ExitStack() as stack:
        leases = hold_all(stack, agent, 3)
        thread = threading.Thread(target=waiter)
        thread.start()
        try:
            # While every slot is held the waiter must still wait (an
            # assertion about blocking; the release below is what wakes it).
            with pytest.raises(queue.Empty):
                outcome.get(timeout=0.3)
            freed = leases[1]
            freed.release()
            got = outcome.get(timeout=BOUND_S)
            assert isinstance(got, runlock.Lease), got
            waiter_leases.append(got)
            assert got.slot == freed.slot and got.token > freed.token
            record = runlock.inspect(KEY, socket=agent.socket)
            assert len(record.holders) == 3
        finally:
            thread.join(BOUND_S)
            for lease in waiter_leases:
                lease.release()


def test_breaking_one_slot_ends_only_its_lease(agent: Agent) -> None:
    events: "queue.Queue[runlock.LostEvent]" = queue.Queue()
    with ExitStack() as stack:
        # The break frees the slot once its run (here, this block) has
        # stopped, or at its deadline: TTL + grace, 2.5 s.
        leases = hold_all(stack, agent, 2, on_lost=events.put, ttl=2)
        target = next(lease for lease in leases if lease.slot == 1)
        assert runlock.break_lock(KEY, slot=1, socket=agent.socket) == 1
        event = events.get(timeout=BOUND_S)
        assert event.reason == "broken" and event.lease_id == target.lease_id
        others = [lease for lease in leases if lease is not target]
        assert all(lease.lost is None for lease in others)
        record = runlock.inspect(KEY, socket=agent.socket)
        assert by_slot(list(record.holders)) == {0: others[0].token}
        assert runlock.break_lock(KEY, slot=1, socket=agent.socket) == 0  # already free
    broken = [e for e in runlock.history(KEY, socket=agent.socket) if e.kind == "broken"]
    # The break took the slot over (a token of its own) and then freed it.
    assert [(e.slot, e.from_token) for e in broken] == [(1, target.token)]
    assert broken[0].token > target.token


def test_force_takes_one_slot(agent: Agent) -> None:
    events: "queue.Queue[runlock.LostEvent]" = queue.Queue()
    with ExitStack() as stack:
        # The forced slot is granted at its holder's deadline (2.5 s): this
        # thread still holds it.
        leases = hold_all(stack, agent, 2, on_lost=events.put, ttl=2)
        forced = stack.enter_context(runlock.lock(KEY, slots=2, force=True, socket=agent.socket))
        event = events.get(timeout=BOUND_S)
        assert event.reason == "forced"
        victim = next(lease for lease in leases if lease.lease_id == event.lease_id)
        assert forced.slot == victim.slot and forced.token > victim.token
        assert event.holder is not None and event.holder.slot == forced.slot
        assert sum(lease.lost is not None for lease in leases) == 1


def test_slot_leases_are_kept_through_an_agent_crash(
    runlockd: Path, workdir: Path, surviving_backend: Backend
) -> None:
    """Killed and started again on the same socket, the agent takes every
    slot's lease over, each on its own slot with its own token."""
    backend, env = surviving_backend.uri, surviving_backend.env
    first = Agent(runlockd, workdir, backend, name="first", env=env)
    agents = [first]
    try:
        with ExitStack() as stack:
            leases = [
                stack.enter_context(runlock.lock(KEY, slots=2, ttl=30, socket=first.socket))
                for _ in range(2)
            ]
            held = {lease.slot: lease.token for lease in leases}
            assert set(held) == {0, 1}
            first.stop(signal.SIGKILL)
            second = Agent(runlockd, workdir, backend, name="second", socket=first.socket, env=env)
            agents.append(second)
            for lease in leases:
                assert lease.wait_reattached(BOUND_S), f"not reattached: {second.log()}"
                assert lease.lost is None
            record = runlock.inspect(KEY, socket=second.socket)
            assert by_slot(list(record.holders)) == held
            assert {h.agent_id for h in record.holders} == {second_id(leases)}
            with pytest.raises(runlock.Held):
                runlock.lock(KEY, slots=2, socket=second.socket)
        assert runlock.inspect(KEY, socket=second.socket).holders == ()
    finally:
        for started in agents:
            started.stop()


def second_id(leases: List[runlock.Lease]) -> str:
    """The one agent every lease is held through now."""
    ids = {lease.agent.agent_id for lease in leases}
    assert len(ids) == 1, ids
    return ids.pop()


def test_a_key_larger_than_a_frame_is_listed_cut_and_the_listing_ends(
    runlockd: Path, workdir: Path
) -> None:
    """64 slots, each keeping 32 events whose strings are as long as the agent
    shows them: the key's events alone are about 2 MiB, twice a frame. A
    listing that asks for events ends, shows every key (the one after the
    large one too), and says how many of its events it left out."""
    locks = workdir / "locks"
    with Agent(runlockd, workdir, f"file://{locks}") as agent:
        with ExitStack() as stack:
            for n in range(64):
                stack.enter_context(runlock.lock("big:key", slots=64, socket=agent.socket))
        for key in ("big:a", "big:z"):
            runlock.lock(key, socket=agent.socket).release()
        long = "x" * 250
        newest = 0
        for path in locks.glob("big%3Akey*.lock"):
            record = json.loads(path.read_text())
            first = record["history"][0]
            record["history"] = [
                {**first, "at_ms": first["at_ms"] + i, "host": long, "agent_id": long, "user": long,
                 "reason": long}
                for i in range(32)
            ]
            path.write_text(json.dumps(record))
            newest = max(newest, first["at_ms"] + 31)
        listed = list(runlock.list_keys("big:", free=True, events_since_ms=0, socket=agent.socket))
        assert sorted(k.key for k in listed) == ["big:a", "big:key", "big:z"]
        big = next(k for k in listed if k.key == "big:key")
        assert big.record is not None and big.record.slots == 64
        assert big.events and big.events_omitted > 0
        assert len(big.events) + big.events_omitted == 64 * 32
        # The newest are kept.
        assert max(e.at_ms for e in big.events) == newest
