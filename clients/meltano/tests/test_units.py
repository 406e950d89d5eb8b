"""The add-on's parts against a real runlockd on memory:// (an in-memory
store for Meltano's part), without Meltano's CLI: run locks, the fence,
the state lock, the policy when no agent answers, and the URI forms."""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, Optional

import click
import pytest
import runlock
from conftest import serve_this_process
from meltano.core.error import MeltanoError
from meltano.core.job.job import Job, State
from meltano.core.runner import RunnerError
from meltano.core.state_store import StateBackend
from meltano.core.state_store.filesystem import LocalFilesystemStateStoreManager
from meltano.core.state_store.base import MeltanoState, StateIDLockedError, StateStoreManager, UnsupportedStateBackendURIError
from runlock.testing import Agent

from runlock_meltano import LockUnavailable, RunHeld, RunlockStateStoreManager, StaleRun
from runlock_meltano import fence, invocation, job_start, runs, schemes, settings, state_lock
from runlock_meltano.inner import inner_uri
from runlock_meltano.invocation import Invocation
from runlock_meltano.runs import RunLocks, shim_token

STATE_ID = "dev:tap-x-to-target-y"
RUN = Invocation(runs_pipelines=True)
FORCED = Invocation(runs_pipelines=True, force=True)


class MemoryStore(StateStoreManager):
    """The store under the add-on, in memory: what it hands writes to. Not
    one of Meltano's own, so the add-on takes its lock too (inside its own)."""

    label = "Memory"

    def __init__(self, observe: Callable[[], object] = lambda: None) -> None:
        super().__init__()
        self.states: Dict[str, MeltanoState] = {}
        #: Each time its lock was taken: the state ID, and what ``observe`` said then.
        self.locked: list[tuple[str, object]] = []
        self.observe = observe

    def set(self, state: MeltanoState) -> None:
        self.states[state.state_id] = state

    def get(self, state_id: str) -> Optional[MeltanoState]:
        return self.states.get(state_id)

    def delete(self, state_id: str) -> None:
        self.states.pop(state_id, None)

    def get_state_ids(self, pattern: Optional[str] = None) -> Iterable[str]:
        return list(self.states)

    @contextmanager
    def acquire_lock(self, state_id: str, *, retry_seconds: float) -> Iterator[None]:
        self.locked.append((state_id, self.observe()))
        yield


@pytest.fixture
def agent(runlockd: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    yield from serve_this_process(runlockd, workdir, monkeypatch, {})


def manager(store: MemoryStore, now: Invocation, env: Optional[Dict[str, str]] = None) -> RunlockStateStoreManager:
    """One Meltano process's backend (its own run locks)."""
    runs = RunLocks(current=lambda: now, env=env if env is not None else {})
    return RunlockStateStoreManager("runlock+file:///unused", inner=store, runs=runs)


def state(value: str) -> MeltanoState:
    return MeltanoState(STATE_ID, completed_state={"singer_state": {"v": value}})


def test_a_run_locks_its_state_id_at_its_first_read_and_a_second_run_is_refused(agent: Agent) -> None:
    store = MemoryStore()
    first = manager(store, RUN)
    assert first.get(STATE_ID) is None
    [held] = runlock.status()
    assert held.key == STATE_ID and held.holder.pid == os.getpid()

    with pytest.raises(RunHeld) as refused:
        manager(store, RUN).get(STATE_ID)
    assert f"held by pid {os.getpid()} on " in str(refused.value)
    assert refused.value.holder is not None and refused.value.holder.token == held.holder.token
    first.runs.release_all()


def test_state_commands_take_no_run_lock(agent: Agent) -> None:
    store = MemoryStore()
    running = manager(store, RUN)
    running.update(state("run"))
    other = manager(store, invocation.NOT_A_RUN)
    assert other.get(STATE_ID) == state("run")
    assert list(other.get_state_ids()) == [STATE_ID]
    other.update(state("set by hand"))  # `meltano state set`: the state lock only
    assert store.states[STATE_ID] == state("set by hand")
    assert [lease.key for lease in runlock.status()] == [STATE_ID]
    running.runs.release_all()


def test_a_forced_run_fences_the_writes_of_the_run_it_took_over(agent: Agent) -> None:
    store = MemoryStore()
    old = manager(store, RUN)
    old.update(state("old"))
    new = manager(store, FORCED)
    new.update(state("new"))
    lost = None
    old_lease = old.runs.ensure(STATE_ID)
    assert old_lease is not None and old_lease.lease is not None
    lost = old_lease.lease.wait_lost(10)
    assert lost is not None and lost.reason == "forced"

    with pytest.raises(StaleRun) as refused:
        old.update(state("stale"))
    assert "refused" in str(refused.value) and f"now held by pid {os.getpid()}" in str(refused.value)
    with pytest.raises(StaleRun):
        old.clear(STATE_ID)
    assert store.states[STATE_ID] == state("new")
    new.runs.release_all()


def test_the_fence_reads_the_record_when_no_loss_was_reported(agent: Agent) -> None:
    store = MemoryStore()
    # A run wrapped by `runlock run` whose token is no longer the key's: the
    # record in the store says so, with no event on any connection of ours.
    with runlock.lock(STATE_ID) as current:
        stale = manager(store, RUN, {"RUNLOCK_KEY": STATE_ID, "RUNLOCK_TOKEN": str(current.token - 1)})
        with pytest.raises(StaleRun) as refused:
            stale.update(state("stale"))
        assert f"token {current.token - 1}" in str(refused.value)
        assert store.states == {}

        # The wrapped run that holds it writes, and takes the key no second time.
        wrapped = manager(store, RUN, {"RUNLOCK_KEY": f"a\n{STATE_ID}", "RUNLOCK_TOKEN": f"9\n{current.token}"})
        wrapped.update(state("wrapped"))
        assert store.states[STATE_ID] == state("wrapped")
        assert [lease.key for lease in runlock.status()] == [STATE_ID]


def test_the_state_lock_is_taken_through_runlock_and_waits_bounded(agent: Agent) -> None:
    with runlock.lock(state_lock.key(STATE_ID)):
        with pytest.raises(StateIDLockedError) as refused:
            with state_lock.state_lock(STATE_ID, wait=0.2):
                pass
        assert "is being written by pid" in str(refused.value)
    with state_lock.state_lock(STATE_ID, wait=0):
        [held] = runlock.status()
        assert held.key == "meltano-state-write:" + STATE_ID
    assert runlock.status() == []


@pytest.mark.parametrize("policy", ["fail", "warn", "skip", "nonsense"])
def test_no_agent_on_unavailable_decides(
    policy: str, workdir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RUNLOCK_SOCKET", str(workdir / "nobody.sock"))
    monkeypatch.delenv("RUNLOCK_ON_UNAVAILABLE", raising=False)
    config = workdir / "runlockd.toml"
    config.write_text(f'on_unavailable = "{policy}"\n')
    monkeypatch.setenv("RUNLOCK_CONFIG", str(config))
    store = MemoryStore()
    caplog.set_level(logging.INFO, "runlock_meltano")
    if policy in ("fail", "nonsense"):
        with pytest.raises(LockUnavailable, match="cannot reach the agent"):
            manager(store, RUN).get(STATE_ID)
        assert store.states == {}
        return
    backend = manager(store, RUN)
    backend.update(state(policy))
    assert store.states[STATE_ID] == state(policy)
    assert ("WITHOUT A LOCK" in caplog.text) == (policy == "warn")


def test_the_environment_overrides_the_files_policy(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNLOCK_SOCKET", str(workdir / "nobody.sock"))
    config = workdir / "runlockd.toml"
    config.write_text('on_unavailable = "skip"\n')
    monkeypatch.setenv("RUNLOCK_CONFIG", str(config))
    monkeypatch.setenv("RUNLOCK_ON_UNAVAILABLE", "fail")
    with pytest.raises(LockUnavailable):
        manager(MemoryStore(), RUN).get(STATE_ID)


def test_shim_token_reads_the_wrapping_runs_keys() -> None:
    env = {"RUNLOCK_KEY": "a\nb", "RUNLOCK_TOKEN": "3\n7", "RUNLOCK_LEASE_ID": "x\ny"}
    assert shim_token("b", env) == 7
    assert shim_token("c", env) is None
    assert shim_token("a", {"RUNLOCK_KEY": "a"}) is None  # unlocked under on_unavailable
    assert shim_token("a", {"RUNLOCK_KEY": "a", "RUNLOCK_TOKEN": "x"}) is None


def test_inner_uris() -> None:
    assert inner_uri("runlock+s3://bucket/prefix") == "s3://bucket/prefix"
    assert inner_uri("runlock+file:///srv/state") == "file:///srv/state"
    assert inner_uri("runlock+systemdb://") == "systemdb://"
    for bad in ("s3://bucket", "runlock+", "runlock+runlock+s3://b", "runlock+/path"):
        with pytest.raises(UnsupportedStateBackendURIError):
            inner_uri(bad)


def test_a_uri_naming_no_store_is_shown_without_its_secrets() -> None:
    for uri in (
        "runlock+//AKIAEXAMPLE:hunter2@bucket/state?X-Amz-Signature=s3cr3t&sig=s3cr3t",
        "runlock+:hunter2@bucket/state",
        "Runlock+s3://AKIAEXAMPLE:hunter2@bucket/state?sv=2024&sig=s3cr3t",
        "runlock+//user:pass/with/slashes:hunter2@host/state",
    ):
        with pytest.raises(UnsupportedStateBackendURIError) as refused:
            inner_uri(uri)
        message = str(refused.value)
        for secret in ("AKIAEXAMPLE", "hunter2", "s3cr3t", "pass/with"):
            assert secret not in message, message
        assert "***@" in message, message
    with pytest.raises(UnsupportedStateBackendURIError, match="'runlock\\+/srv/state' names no store"):
        inner_uri("runlock+/srv/state")  # nothing secret: shown as it is


def test_the_invocation_is_meltanos_command() -> None:
    seen: Dict[str, Invocation] = {}

    @click.group(name="meltano")
    def cli() -> None:
        pass

    @cli.command(name="run")
    @click.option("--force", is_flag=True, envvar="MELTANO_RUN_FORCE")
    def run(force: bool) -> None:
        seen["run"] = invocation.current()

    @cli.group(name="state")
    def state_group() -> None:
        pass

    @state_group.command(name="list")
    def state_list() -> None:
        seen["state"] = invocation.current()

    for argv in (["run"], ["state", "list"]):
        cli.main(argv, standalone_mode=False)
    assert seen == {"run": Invocation(True, False), "state": invocation.NOT_A_RUN}
    cli.main(["run", "--force"], standalone_mode=False)
    assert seen["run"] == Invocation(True, True)


class Session:
    """What Meltano's Job.run writes the job through (its system database)."""

    def __init__(self) -> None:
        self.saved: list[State] = []

    def add(self, job: Job) -> None:
        self.saved.append(job.state)

    def commit(self) -> None:
        pass


def test_importing_the_add_on_wraps_meltanos_job_run_once() -> None:
    hooked = Job.run
    original = getattr(hooked, job_start.ORIGINAL)  # the package's import installed it
    assert job_start.install() and job_start.install()
    assert Job.run is hooked
    assert not hasattr(original, job_start.ORIGINAL), "wrapped twice"

    class ChangedJob:
        def run(self, session: object) -> None:
            pass

    before = ChangedJob.run
    assert not job_start.install(ChangedJob)  # not the method expected: left alone
    assert ChangedJob.run is before


def test_a_job_start_locks_its_state_id_only_under_a_runlock_state_backend(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = RunLocks(current=lambda: RUN, env={})
    monkeypatch.setattr(runs, "RUN_LOCKS", first)

    async def held_inside(session: Session) -> list[str]:
        async with Job(job_name=STATE_ID).run(session):
            return [lease.key for lease in runlock.status()]

    monkeypatch.setattr(settings, "state_backend_uri", lambda: "s3://bucket/state")
    assert asyncio.run(held_inside(Session())) == []
    monkeypatch.setattr(settings, "state_backend_uri", lambda: "runlock+s3://bucket/state")
    assert asyncio.run(held_inside(Session())) == [STATE_ID]

    # Another process's run is refused before Meltano marks its job running.
    monkeypatch.setattr(runs, "RUN_LOCKS", RunLocks(current=lambda: RUN, env={}))
    session = Session()
    with pytest.raises(RunHeld, match=f"held by pid {os.getpid()} on "):
        asyncio.run(held_inside(session))
    assert session.saved == []
    first.release_all()


def test_a_run_refused_as_held_is_skipped_and_every_other_refusal_fails() -> None:
    held = RunHeld(STATE_ID, None)
    # Meltano's CLI ends with a MeltanoError's exit_code(); `meltano run` ends
    # any RunnerError of a block with 1 before that.
    assert held.exit_code() == 75
    assert isinstance(held, MeltanoError) and not isinstance(held, RunnerError)
    for failure in (
        StaleRun(STATE_ID, 1, "forced", None),
        LockUnavailable(STATE_ID, runlock.RunlockError("cannot reach the agent")),
    ):
        assert isinstance(failure, RunnerError) and failure.exit_code() == 1


def test_a_refusal_is_logged_without_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    root = logging.getLogger()
    for error, quiet in ((RunHeld(STATE_ID, None), True), (RunHeld(STATE_ID, None), False), (ValueError("x"), False)):
        if quiet:
            error.log_without_traceback()  # type: ignore[union-attr]
        caplog.clear()
        try:
            raise error
        except Exception:
            # As Meltano's job log handler logs an exception of a block.
            root.error(str(error), exc_info=True)
        [record] = caplog.records
        assert record.getMessage() == str(error)
        assert (record.exc_info is None) == quiet, error


def test_an_add_ons_store_keeps_its_own_lock_inside_runlocks(agent: Agent) -> None:
    store = MemoryStore(observe=lambda: sorted(lease.key for lease in runlock.status()))
    backend = manager(store, RUN)
    assert not backend.fence.meltanos_own
    backend.update(state("run"))
    backend.clear(STATE_ID)
    both = sorted([STATE_ID, state_lock.key(STATE_ID)])
    assert store.locked == [(STATE_ID, both), (STATE_ID, both)]
    assert store.states == {}
    backend.runs.release_all()


def test_a_fence_in_the_store_is_kept_for_meltanos_own_stores_only(workdir: Path) -> None:
    own = LocalFilesystemStateStoreManager(uri=f"file://{workdir}", lock_timeout_seconds=10)

    class BuiltOnMeltanos(type(own)):  # type: ignore[misc]
        """An add-on's store built on Meltano's class: it may keep state otherwise."""

    assert type(fence.for_store(own)) is fence.FileFence and fence.for_store(own).meltanos_own
    for other in (BuiltOnMeltanos(uri=f"file://{workdir}", lock_timeout_seconds=10), MemoryStore()):
        kept = fence.for_store(other)
        assert type(kept) is fence.StoreFence and not kept.meltanos_own


def test_every_installed_state_backend_gets_its_runlock_scheme() -> None:
    assert schemes.wrapped_names(["file", "dummy", "runlock+file", "runlock+x", "dummy"]) == ["runlock+dummy"]
    manager_path = "runlock_meltano.backend:RunlockStateStoreManager"
    # Meltano's library (the backport before Python 3.12) and the standard one.
    libraries: list = [importlib.metadata]
    if sys.version_info < (3, 12):
        import importlib_metadata

        libraries.append(importlib_metadata)
    for library in libraries:
        found = library.entry_points(group=schemes.GROUP)
        # tests/scripts/meltano.sh installs the dummy backend (tests/fixtures/).
        assert {"dummy", "runlock+dummy", "runlock+file", "runlock+systemdb"} <= found.names, found.names
        assert found["runlock+dummy"].value == manager_path
        assert found["runlock+dummy"].load() is RunlockStateStoreManager
        assert not any(name.startswith("runlock+runlock+") for name in found.names)
        # The finder's distribution declares only what no package does.
        added = library.distribution(schemes.NAME).entry_points
        assert "runlock+dummy" in added.names and "runlock+file" not in added.names
        assert library.version("meltano")  # other look-ups find what they did
        elsewhere = library.distributions(path=[str(Path(__file__).parent)])
        assert schemes.NAME not in {dist.metadata["Name"] for dist in elsewhere}
    assert StateBackend.get_manager_factory(scheme="runlock+dummy") is RunlockStateStoreManager
    schemes.install()
    schemes.install()
    assert sum(1 for finder in sys.meta_path if getattr(finder, schemes.MARK, False)) == 1
