"""The state store's own fence (fence.py), on Meltano's real stores: its
local file store, its S3 store on moto, its GCS store on fake-gcs-server,
its Azure store on Azurite, and its system database store on PostgreSQL
and SQLite, with a real runlockd. Two managers stand for two
Meltano processes (each its own run locks and its own store client).

The race the agent check alone leaves open: run A's write passes the check,
pauses before the store takes it, a forced run B takes the key over and
reads the state, and A's write then lands. Here A is paused at that very
point, and the store must refuse its write; and, with several runs adding
themselves to one state meanwhile, no update may be lost or applied out of
token order (the chaos harness's counter, tests/chaos/counter.py, through
Meltano's own stores)."""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import runlock
from conftest import pg_database, project_with, s3_bucket, serve_this_process
from meltano.core.state_store.base import MeltanoState, StateStoreManager
from runlock.testing import Agent

from runlock_meltano import RunlockStateStoreManager, StaleRun
from runlock_meltano.invocation import Invocation
from runlock_meltano.runs import RunLocks

STATE_ID = "dev:tap-x-to-target-y"
RUN = Invocation(runs_pipelines=True)
FORCED = Invocation(runs_pipelines=True, force=True)
NOT_A_RUN = Invocation(runs_pipelines=False)

#: Bounds each wait on the other thread.
WAIT_S = 30.0

Opener = Callable[[], StateStoreManager]


@pytest.fixture
def agent(runlockd: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    # TTL 2 s: a forced run waits for the run it displaces to stop, or for
    # that run's deadline (TTL + grace); A is held in this very process.
    yield from serve_this_process(runlockd, workdir, monkeypatch, {"RUNLOCK_TTL": "2s"})


def file_opener(workdir: Path) -> Opener:
    from meltano.core.state_store.filesystem import LocalFilesystemStateStoreManager

    uri = f"file://{workdir / 'state'}"
    return lambda: LocalFilesystemStateStoreManager(uri=uri, lock_timeout_seconds=10)


def s3_opener() -> Opener:
    from meltano.core.state_store.s3.backend import S3StateStoreManager

    uri = f"s3://{s3_bucket()}/state"
    endpoint = os.environ["RUNLOCK_TEST_S3_ENDPOINT"]
    return lambda: S3StateStoreManager(
        uri=uri, lock_timeout_seconds=10, endpoint_url=endpoint,
        aws_access_key_id="test", aws_secret_access_key="test",
    )


def gcs_opener(monkeypatch: pytest.MonkeyPatch) -> Opener:
    """Meltano's GCS store on fake-gcs-server at RUNLOCK_TEST_GCS_ENDPOINT
    (scripts/test starts it), which the client reaches as an emulator."""
    from google.cloud import storage
    from meltano.core.state_store.google.backend import GCSStateStoreManager

    endpoint = os.environ.get("RUNLOCK_TEST_GCS_ENDPOINT")
    assert endpoint, "RUNLOCK_TEST_GCS_ENDPOINT is not set (source tests/scripts/stores.sh; stores_start)"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    bucket = f"runlock-mel-{secrets.token_hex(6)}"
    storage.Client(project="test").create_bucket(bucket)
    uri = f"gs://{bucket}/state"
    return lambda: GCSStateStoreManager(uri=uri, lock_timeout_seconds=10)


def azure_opener() -> Opener:
    """Meltano's Azure store on Azurite (RUNLOCK_TEST_AZURE_CONNECTION_STRING)."""
    from azure.storage.blob import BlobServiceClient
    from meltano.core.state_store.azure.backend import AZStorageStateStoreManager

    connection = os.environ.get("RUNLOCK_TEST_AZURE_CONNECTION_STRING")
    assert connection, "RUNLOCK_TEST_AZURE_CONNECTION_STRING is not set (source tests/scripts/stores.sh; stores_start)"
    container = f"runlock-mel-{secrets.token_hex(6)}"
    BlobServiceClient.from_connection_string(connection).create_container(container)
    uri = f"azure://{container}/state"
    return lambda: AZStorageStateStoreManager(uri=uri, lock_timeout_seconds=10, connection_string=connection)


def make_state_table(uri: str) -> None:
    """Meltano's ``state`` table on ``uri``, made as its migrations make it.
    Its connection is closed at once, not whenever the engine is collected:
    a test counts the database's connections."""
    from meltano.core.job_state import JobState
    from sqlalchemy import create_engine

    engine = create_engine(uri)
    try:
        JobState.__table__.create(engine, checkfirst=True)  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def db_opener(uri: str) -> Opener:
    """Meltano's system database store on ``uri``, with its ``state`` table."""
    from meltano.core.state_store.db import DBStateStoreManager
    from sqlalchemy import create_engine
    from sqlalchemy.orm import sessionmaker

    make_state_table(uri)
    sessions = sessionmaker(bind=create_engine(uri), future=True)
    return lambda: DBStateStoreManager(session=sessions())


@pytest.fixture(params=["file", "s3", "gcs", "azure", "postgres", "sqlite"])
def opener(request: pytest.FixtureRequest, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Opener:
    if request.param == "file":
        return file_opener(workdir)
    if request.param == "s3":
        return s3_opener()
    if request.param == "gcs":
        return gcs_opener(monkeypatch)
    if request.param == "azure":
        return azure_opener()
    if request.param == "postgres":
        return db_opener(pg_database())
    return db_opener(f"sqlite:///{workdir / 'meltano.db'}")


def manager(opener: Opener, now: Invocation) -> RunlockStateStoreManager:
    """One Meltano process's backend: its own run locks and store client."""
    return RunlockStateStoreManager("runlock+unused://", inner=opener(), runs=RunLocks(current=lambda: now, env={}))


def state(value: str) -> MeltanoState:
    return MeltanoState(STATE_ID, partial_state={}, completed_state={"singer_state": {"run": value}})


def completed(backend: StateStoreManager) -> object:
    got = backend.get(STATE_ID)
    return None if got is None else got.completed_state


class Paused:
    """Replaces fence.before_store_write: the first write of ``who`` that
    reaches it waits there until :meth:`go`."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self._go = threading.Event()
        self.owner: Optional[int] = None

    def __call__(self, state_id: str) -> None:
        if self.owner == threading.get_ident() and not self.reached.is_set():
            self.reached.set()
            assert self._go.wait(WAIT_S), "never let go"

    def go(self) -> None:
        self._go.set()


def in_thread(paused: Paused, work: Callable[[], None]) -> Tuple[threading.Thread, List[BaseException]]:
    errors: List[BaseException] = []

    def run() -> None:
        paused.owner = threading.get_ident()
        try:
            work()
        except BaseException as err:  # handed to the test's thread
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_a_write_paused_past_every_check_is_refused_by_the_store_once_a_forced_run_started(
    agent: Agent, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runlock_meltano import fence

    a = manager(opener, RUN)
    a.update(state("a-first"))
    paused = Paused()
    monkeypatch.setattr(fence, "before_store_write", paused, raising=False)

    thread, errors = in_thread(paused, lambda: a.update(state("a-stale")))
    assert paused.reached.wait(WAIT_S), "A's write never reached the store's fence"

    # B takes the key over and reads the state, as a forced run starts.
    b = manager(opener, FORCED)
    assert completed(b) == {"singer_state": {"run": "a-first"}}
    [held] = [lease for lease in runlock.status() if lease.key == STATE_ID]
    assert held.holder.token == 2, held

    paused.go()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], StaleRun), errors
    assert f"now held by pid {os.getpid()} on " in str(errors[0]) and "token 2" in str(errors[0]), errors[0]
    assert completed(manager(opener, NOT_A_RUN)) == {"singer_state": {"run": "a-first"}}

    # B's own writes go on; A's stay refused.
    b.update(state("b"))
    with pytest.raises(StaleRun):
        a.update(state("a-later"))
    assert completed(manager(opener, NOT_A_RUN)) == {"singer_state": {"run": "b"}}
    b.runs.release_all()
    a.close()
    b.close()


def test_a_recorded_token_from_before_the_agents_tokens_started_over_gives_way(
    agent: Agent, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A newer token in the store than the agent's current one is no newer
    run when the agent says this run holds the key: its lock store was
    replaced, and tokens started over. Runs must not be refused forever."""
    from runlock_meltano import fence

    opener = file_opener(workdir)
    path = workdir / "state" / STATE_ID / "state.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"completed": {"singer_state": {"run": "old"}}, "partial": {}, fence.TOKEN_KEY: 99}))
    run = manager(opener, RUN)
    assert completed(run) == {"singer_state": {"run": "old"}}
    run.update(state("new"))
    assert json.loads(path.read_text())[fence.TOKEN_KEY] == 1
    assert "started over" in caplog.text
    run.runs.release_all()


def test_a_state_command_keeps_the_recorded_token(agent: Agent, workdir: Path) -> None:
    from runlock_meltano import fence

    opener = file_opener(workdir)
    path = workdir / "state" / STATE_ID / "state.json"
    run = manager(opener, RUN)
    run.update(state("run"))
    assert json.loads(path.read_text())[fence.TOKEN_KEY] == 1
    by_hand = manager(opener, NOT_A_RUN)
    by_hand.update(state("by hand"))
    written: Dict[str, object] = json.loads(path.read_text())
    assert written == {"completed": {"singer_state": {"run": "by hand"}}, "partial": {}, fence.TOKEN_KEY: 1}
    run.runs.release_all()


@pytest.mark.parametrize("built_by", ["meltanos function", "the entry point"])
def test_a_system_database_session_meltano_opens_for_the_store_is_closed_with_it(
    built_by: str, agent: Agent, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where Meltano hands no session (``StateService(project)``, or its
    call of the entry point itself, with settings alone), Meltano's function
    opens one for the store, as for plain systemdb, which no one else holds:
    the add-on closes it when Meltano closes the store (StateService.close),
    so no connection is left behind."""
    import psycopg
    from meltano.core import state_store
    from meltano.core.project import Project

    database = pg_database()
    make_state_table(database)
    project_with(workdir, monkeypatch, database, "  uri: runlock+systemdb://\n")
    name = database.rsplit("/", 1)[1]
    admin = os.environ["RUNLOCK_TEST_PG_URI"]

    def connections() -> int:
        with psycopg.connect(admin) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)).fetchone()
        assert row is not None
        return int(row[0])

    if built_by == "the entry point":
        backend = RunlockStateStoreManager("runlock+systemdb://", runs=RunLocks(current=lambda: NOT_A_RUN, env={}))
    else:
        built = state_store.state_store_manager_from_project_settings(Project.find().settings)
        assert type(built) is RunlockStateStoreManager
        backend = built
        backend.runs = RunLocks(current=lambda: NOT_A_RUN, env={})
    backend.update(state("by hand"))
    assert completed(backend) == {"singer_state": {"run": "by hand"}}
    assert connections() == 1
    backend.close()
    deadline = time.monotonic() + WAIT_S
    while connections() != 0:  # the server ends its side as it sees the close
        assert time.monotonic() < deadline, "the add-on's database connection stayed open"
        time.sleep(0.01)


def test_a_system_database_it_may_not_add_its_table_to_keeps_the_agent_check(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    """Meltano's database user may lack the right to create tables (its
    schema made by another role): runs go on, fenced through the agent."""
    import psycopg

    database = pg_database()
    make_state_table(database)  # by the owner
    plain = database.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        conn.execute("GRANT ALL ON state TO runlock_limited")
    limited = database.replace("://postgres@", "://runlock_limited@", 1)
    run = manager(db_opener(limited), RUN)
    run.update(state("run"))
    assert completed(manager(db_opener(database), NOT_A_RUN)) == {"singer_state": {"run": "run"}}
    assert "cannot create the table runlock_fence" in caplog.text, caplog.text
    assert "permission denied" in caplog.text, caplog.text
    with psycopg.connect(plain) as conn:
        row = conn.execute("SELECT to_regclass('runlock_fence')").fetchone()
    assert row == (None,)
    # The agent check still refuses a taken-over run.
    forced = manager(db_opener(limited), FORCED)
    forced.update(state("forced"))
    with pytest.raises(StaleRun):
        run.update(state("stale"))
    assert completed(forced) == {"singer_state": {"run": "forced"}}
    forced.runs.release_all()


def counted(tokens: List[int]) -> MeltanoState:
    """A state that counts its writes and lists, in order, the tokens of the runs that made them."""
    counter = {"count": len(tokens), "tokens": tokens}
    return MeltanoState(STATE_ID, partial_state={}, completed_state={"singer_state": counter})


def read_tokens(backend: RunlockStateStoreManager) -> Tuple[int, List[int]]:
    """As a run starts: its token (taking the lock), and the tokens the state lists."""
    held = backend.runs.ensure(STATE_ID)
    assert held is not None and held.token is not None
    got = backend.get(STATE_ID)
    return held.token, list(got.completed_state["singer_state"]["tokens"]) if got is not None else []


def increment(backend: RunlockStateStoreManager) -> int:
    """One run's read-modify-write of the counted state; returns its token."""
    token, tokens = read_tokens(backend)
    backend.update(counted(tokens + [token]))
    return token


def test_concurrent_runs_and_a_forced_one_lose_no_update_and_apply_none_out_of_token_order(
    agent: Agent, opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Meltano processes (threads, each its own run locks and store client)
    add themselves to one state, each under the state ID's lock, while one
    run's write is held past every check and a forced run takes over: the
    store refuses that write, and every other write is in the state, once,
    in token order. The chaos harness's counter workload, through Meltano's
    own state stores (scripts/chaos runs it on runlock's)."""
    from runlock_meltano import RunHeld, fence

    writers, rounds = 3, 3
    accepted: List[int] = []
    lock = threading.Lock()

    def run_rounds() -> None:
        deadline = time.monotonic() + 4 * WAIT_S
        done = 0
        while done < rounds:
            assert time.monotonic() < deadline, "never got the state ID's lock"
            backend = manager(opener, RUN)
            try:
                token = increment(backend)
            except RunHeld:
                time.sleep(0.02)  # another run has it: this one is skipped, and run again
                continue
            finally:
                backend.runs.release_all()
                backend.close()
            with lock:
                accepted.append(token)
            done += 1

    # A first run writes the state: a forced run records its token in a state
    # there is (with none yet, there is nothing for a stale write to overwrite).
    first = manager(opener, RUN)
    accepted.append(increment(first))
    first.runs.release_all()
    first.close()
    paused = Paused()
    monkeypatch.setattr(fence, "before_store_write", paused, raising=False)
    stale = manager(opener, RUN)
    thread, errors = in_thread(paused, lambda: accepted.append(increment(stale)))  # refused
    assert paused.reached.wait(WAIT_S), "the held run's write never reached the store's fence"
    others = [threading.Thread(target=run_rounds, daemon=True) for _ in range(writers)]
    for other in others:
        other.start()

    # A forced run takes over and reads the state, as its tap starts (its
    # token recorded in the store); the held write then lands (one process's
    # writes take turns: the add-on's state_lock), and the forced run writes
    # what it read, plus itself: had the held write landed, it would be lost.
    forced = manager(opener, FORCED)
    token, tokens = read_tokens(forced)
    paused.go()
    thread.join(WAIT_S)
    forced.update(counted(tokens + [token]))
    with lock:
        accepted.append(token)
    forced.runs.release_all()
    forced.close()
    for other in others:
        other.join(5 * WAIT_S)
    assert not thread.is_alive() and not any(other.is_alive() for other in others)
    stale.runs.release_all()
    stale.close()

    final = completed(manager(opener, NOT_A_RUN))
    assert isinstance(final, dict)
    written = final["singer_state"]
    # No update lost (the held write, had it landed, would be), none twice,
    # and in token order; then that every run's write was counted.
    assert written["count"] == len(accepted), (written, accepted)
    assert sorted(written["tokens"]) == sorted(accepted), (written, accepted)
    assert all(a < b for a, b in zip(written["tokens"], written["tokens"][1:])), written
    assert len(errors) == 1 and isinstance(errors[0], StaleRun), errors
    assert len(accepted) == writers * rounds + 2
