"""End to end: the real Meltano with the add-on, two projects as two hosts,
each with its own agent and system database, sharing one store (file://,
s3:// through moto, where Meltano's own S3 store writes the state, and a
third party's store, dummy://)."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import List
from urllib.parse import quote

import runlock
from conftest import MELTANO_BOUND_S, OTHER_STATE_ID, STATE_ID, Host, Run, Store, dummy_store, file_store

#: A run refused because another holds its key: skipped, not failed (EX_TEMPFAIL,
#: as the shim exits for a held key).
SKIPPED = 75

#: A duplicate run must be refused at once: well within Meltano's own start-up.
REFUSAL_BOUND_S = 30.0

#: A killed run's key is free when its connection closes, not after a TTL (30 s).
FREED_BOUND_S = 5.0


def committed(host: Host, expected: object) -> None:
    """Waits (bounded) until the store holds ``expected`` as the pipeline's state."""
    deadline = time.monotonic() + 60
    while True:
        state = host.state()
        if state == expected:
            return
        assert time.monotonic() < deadline, f"the state stayed {state!r}, not {expected!r}"


def refused_naming(second: Run, first: Run, host: Host, state_id: str = STATE_ID, started: int = 0) -> float:
    """Waits for ``second`` and checks it was refused at once, as a skipped
    run (exit 75), naming ``first`` as the holder of ``state_id``, before its
    tap started (``started`` taps had before it); returns how long it took."""
    start = time.monotonic()
    status = second.wait()
    took = time.monotonic() - start
    out = second.output()
    assert status == SKIPPED, out
    assert f"{state_id!r} is already running" in out, out
    assert f"pid {first.pid} on {socket.gethostname()}" in out, out
    assert " since " in out and "Traceback" not in out, out
    assert len(host.started()) == started, "the refused run's tap ran"
    assert took < REFUSAL_BOUND_S, took
    return took


def test_a_second_unwrapped_run_fails_naming_the_holder(hosts: List[Host]) -> None:
    a, b = hosts
    first = a.run("a")
    a.wait_started(1, first)

    took = refused_naming(b.run("b"), first, b)
    print(f"\nrefused in {took:.2f} s, Meltano's start-up included ({b.store.name})")

    # `meltano state …` takes no run lock, while the run holds the key.
    listed = b.meltano("state", "list")
    assert listed.wait() == 0, listed.output()
    assert STATE_ID in listed.output()
    assert b.state() == {"singer_state": {"run": "a"}}

    a.release_taps()
    assert first.wait() == 0, first.output()
    assert a.state() == {"singer_state": {"run": "a", "step": "last"}}


def test_runs_that_read_no_state_are_locked_as_meltano_starts_them(runlockd: Path, workdir: Path) -> None:
    store = file_store(workdir)
    a = Host("a", runlockd, workdir, store)
    # B reaches its agent through the add-on's setting, with no RUNLOCK_SOCKET.
    b = Host("b", runlockd, workdir, store, socket_setting=True)
    try:
        # --full-refresh reads no state, and this tap writes none until released.
        first = a.run("a", "--full-refresh", TAP_HOLD_FIRST="1")
        a.wait_started(1, first)
        record = runlock.inspect(STATE_ID, socket=a.agent.socket)
        assert record.state == "held" and record.holder is not None, record
        assert record.holder.pid == first.pid, record

        for argv in (
            ["run", "tap-counter", "target-state", "--full-refresh"],
            ["el", "tap-counter", "target-state", "--full-refresh", f"--state-id={STATE_ID}"],
        ):
            took = refused_naming(b.meltano(*argv, TAP_TAG="b"), first, b)
            print(f"\n`meltano {argv[0]} --full-refresh` refused in {took:.2f} s, Meltano's start-up included")

        a.release_taps()
        assert first.wait() == 0, first.output()
        assert a.state() == {"singer_state": {"run": "a", "step": "last"}}
    finally:
        a.close()
        b.close()


def test_a_refused_pipeline_ends_a_run_of_several_with_75_and_a_failure_still_with_1(
    runlockd: Path, workdir: Path
) -> None:
    store = file_store(workdir)
    a = Host("a", runlockd, workdir, store)
    b = Host("b", runlockd, workdir, store)
    try:
        holder = a.meltano("run", "tap-other", "target-state", TAP_TAG="a")
        a.wait_started(1, holder)

        # B's taps do not hold: its first pipeline runs to its end, then
        # Meltano starts the second one's job, held by A.
        b.release_taps()
        both = b.meltano("run", "tap-counter", "target-state", "tap-other", "target-state", TAP_TAG="b")
        refused_naming(both, holder, b, OTHER_STATE_ID, started=1)
        assert b.state() == {"singer_state": {"run": "b", "step": "last"}}, "the first pipeline's state"

        # A real failure is one still: Meltano's status, 1.
        failed = b.run("b", TAP_FAIL="1")
        assert failed.wait() == 1, failed.output()
        assert "already running" not in failed.output(), failed.output()
        assert len(b.started()) == 2

        # A forced run of the held pipeline runs, and ends as Meltano does.
        forced = b.meltano("run", "tap-other", "target-state", "--force", TAP_TAG="forced")
        assert forced.wait() == 0, forced.output()
        assert len(b.started()) == 3
    finally:
        a.close()
        b.close()


def test_a_third_partys_state_backend_keeps_the_state_under_its_own_lock(runlockd: Path, workdir: Path) -> None:
    """``runlock+dummy://``: Meltano's look-up finds the add-on for a scheme
    another package installed, and the add-on hands the state to that
    package's store, with its setting, taking the store's own lock inside
    runlock's around each write (that store refusing nothing itself)."""
    host = Host("a", runlockd, workdir, dummy_store(workdir))
    try:
        host.release_taps()
        run = host.run("a")
        assert run.wait() == 0, run.output()
        assert host.state() == {"singer_state": {"run": "a", "step": "last"}}
        root = workdir / "dummy"
        stored = json.loads((root / (quote(STATE_ID, safe="") + ".state")).read_text())
        assert stored["completed"] == {"singer_state": {"run": "a", "step": "last"}}, stored
        log = host.agent.log()
        assert f"acquired key={STATE_ID} " in log and f"acquired key=meltano-state-write:{STATE_ID} " in log, log
        held = set()
        writes = 0
        for line in (root / "journal").read_text().splitlines():
            what, state_id = line.split(" ", 1)
            if what == "lock":
                held.add(state_id)
            elif what == "unlock":
                held.discard(state_id)
            else:
                assert state_id in held, f"{line!r} outside the store's own lock"
                writes += 1
        assert writes >= 2, "Meltano wrote the state once per STATE message"
    finally:
        host.close()


def test_a_killed_run_frees_the_key_at_once_and_its_state_stays(hosts: List[Host]) -> None:
    a, b = hosts
    first = a.run("a")
    a.wait_started(1, first)
    committed(b, {"singer_state": {"run": "a"}})

    first.proc.kill()  # SIGKILL to Meltano alone, as a crash would
    first.proc.wait(timeout=30)
    killed = time.monotonic()
    while runlock.inspect(STATE_ID, socket=b.agent.socket).state != "free":
        assert time.monotonic() - killed < FREED_BOUND_S, "the killed run's lock stayed held"
        time.sleep(0.005)
    print(f"\nkey free {1000 * (time.monotonic() - killed):.1f} ms after the SIGKILL ({b.store.name})")
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
    # Whether Meltano then exits non-zero depends on when the write fails
    # (README): what must hold is that the write is refused.
    first.wait()
    out = first.output()
    assert "state write for 'dev:tap-counter-to-target-state' refused" in out, out
    assert f"now held by pid {forced.pid} on {socket.gethostname()}" in out, out
    assert b.state() == {"singer_state": {"run": "b"}}

    b.release_taps()
    assert forced.wait() == 0, forced.output()
    assert b.state() == {"singer_state": {"run": "b", "step": "last"}}


def test_a_run_wrapped_by_the_shim_takes_the_key_once(hosts: List[Host], runlockd: Path) -> None:
    a, b = hosts
    shim = str(runlockd.parent / "runlock")
    wrapped = a.run("a", wrap=[shim, "run", "--meltano", "--"])
    a.wait_started(1, wrapped)
    committed(b, {"singer_state": {"run": "a"}})
    refused = b.run("b")
    assert refused.wait() == SKIPPED
    assert f"{STATE_ID!r} is already running" in refused.output(), refused.output()

    a.release_taps()
    assert wrapped.wait() == 0, wrapped.output()
    assert a.state() == {"singer_state": {"run": "a", "step": "last"}}
    assert "held by the runlock run around this one" in wrapped.output(), wrapped.output()
    grants = [line for line in a.agent.log().splitlines() if f"acquired key={STATE_ID} " in line]
    assert len(grants) == 1, a.agent.log()


def test_the_system_database_form_keeps_state_in_meltanos_database(runlockd: Path, workdir: Path) -> None:
    store = Store("systemdb", f"file://{workdir / 'locks'}", "runlock+systemdb://")
    host = Host("a", runlockd, workdir, store)
    try:
        host.release_taps()
        run = host.run("a")
        assert run.wait() == 0, run.output()
        assert host.state() == {"singer_state": {"run": "a", "step": "last"}}
        assert f"acquired key={STATE_ID} " in host.agent.log()
        db = sqlite3.connect(host.root / ".meltano" / "meltano.db")
        try:
            [(completed,)] = db.execute("SELECT completed_state FROM state WHERE state_id = ?", (STATE_ID,))
        finally:
            db.close()
        assert json.loads(completed) == {"singer_state": {"run": "a", "step": "last"}}
    finally:
        host.close()


def test_on_sqlite_a_run_and_a_state_command_do_not_wait_on_each_others_database_lock(
    runlockd: Path, workdir: Path
) -> None:
    """``runlock+systemdb://`` on SQLite, Meltano's default system database,
    which lets one writer at a time: the add-on works in the session Meltano
    hands it, and leaves no write of its own uncommitted. So while a run
    holds its key, its state read and its token recorded in the fence, its
    tap blocked, a `meltano state set` of another pipeline goes through, and
    the run then goes on to its end. A write that waited on the other's lock
    past SQLite's busy timeout (5 s) would fail: "database is locked"."""
    store = Store("systemdb", f"file://{workdir / 'locks'}", "runlock+systemdb://")
    host = Host("a", runlockd, workdir, store)
    try:
        before = {"singer_state": {"run": "before"}}
        seeded = host.meltano("state", "set", "--force", STATE_ID, json.dumps(before))
        assert seeded.wait() == 0, seeded.output()
        run = host.run("a", TAP_HOLD_FIRST="1")
        host.wait_started(1, run)
        assert host.seen() == [before["singer_state"]]

        by_hand = {"singer_state": {"set": "by hand"}}
        start = time.monotonic()
        done = host.meltano("state", "set", "--force", OTHER_STATE_ID, json.dumps(by_hand))
        assert done.wait() == 0, done.output()
        took = time.monotonic() - start
        assert run.proc.poll() is None, f"the run ended before its tap was released: {run.output()}"
        assert host.state(OTHER_STATE_ID) == by_hand
        print(f"\n`meltano state set` beside a holding run: {took:.2f} s, Meltano's start-up included")

        host.release_taps()
        assert run.wait() == 0, run.output()
        assert host.state() == {"singer_state": {"run": "a", "step": "last"}}
        # The fence was kept in Meltano's database, through its session: the run's token.
        db = sqlite3.connect(host.root / ".meltano" / "meltano.db")
        try:
            [(token,)] = db.execute("SELECT token FROM runlock_fence WHERE state_id = ?", (STATE_ID,))
        finally:
            db.close()
        assert token == runlock.inspect(STATE_ID, socket=host.agent.socket).token, token
    finally:
        host.close()


def test_meltanos_own_check_goes_on_working_beside_it(runlockd: Path, workdir: Path) -> None:
    host = Host("a", runlockd, workdir, file_store(workdir))
    try:
        first = host.run("a")
        host.wait_started(1, first)
        # The same project, so the same system database: Meltano's check comes first.
        second = host.run("b")
        assert second.wait() == 1, second.output()
        assert "pipeline is already running" in second.output(), second.output()
        assert "runlock:" not in second.output(), second.output()
        assert len(host.started()) == 1
        host.release_taps()
        assert first.wait() == 0, first.output()
    finally:
        host.close()


def test_a_uri_meltano_hands_over_but_the_add_on_refuses_is_shown_without_its_secrets(workdir: Path) -> None:
    """Meltano picks a state backend by the URI's scheme, lowercased: this
    mixed-case one reaches the add-on, which refuses it, and says so."""
    store = Store("mixed", "memory://", "Runlock+s3://AKIAEXAMPLE:hunter2@bucket/state?sig=s3cr3t")
    project = workdir / "p"
    project.mkdir()
    (project / "meltano.yml").write_text(
        "project_id: runlock-addon-e2e\nsend_anonymous_usage_stats: false\n"
        f"state_backend:\n  uri: '{store.state_uri}'\n"
    )
    meltano = str(Path(sys.executable).parent / "meltano")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNLOCK_", "MELTANO_", "AWS_"))}
    for level in ("info", "debug"):
        done = subprocess.run(
            [meltano, "--log-level", level, "state", "list"], cwd=project, capture_output=True, text=True,
            env={**env, "MELTANO_DISABLE_TRACKING": "true", "COLUMNS": "200"}, timeout=MELTANO_BOUND_S,
        )
        out = done.stdout + done.stderr
        assert done.returncode == 1, out
        assert "not a runlock state backend URI: 'Runlock+s3://***@bucket/state?sig=***'" in out, out
        for secret in ("AKIAEXAMPLE", "hunter2", "s3cr3t"):
            assert secret not in out, out
