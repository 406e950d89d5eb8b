"""How a ``runlock+`` store is built (building.py): around the manager
Meltano builds for the inner URI, through Meltano's own function, with
every argument Meltano passes, its system database session included, and
no connection of the add-on's own. In-process, with Meltano's real
projects and stores; no agent is needed to build one, nor to read."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, List

import pytest
from conftest import dummy_store, project_with
from meltano.core.project import Project
from meltano.core.state_store.base import MeltanoState
from meltano.core.state_store.db import DBStateStoreManager
from meltano.core.state_store.filesystem import LocalFilesystemStateStoreManager
from meltano.core.state_store.s3.backend import S3StateStoreManager
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from runlock_meltano import RunlockStateStoreManager, building

STATE_ID = "dev:tap-x-to-target-y"


def build(project: Project, session: object = None) -> RunlockStateStoreManager:
    """What Meltano's StateService does: the function, looked up where
    Meltano's own module has it."""
    from meltano.core import state_service

    built = state_service.state_store_manager_from_project_settings(project.settings, session)
    assert type(built) is RunlockStateStoreManager, type(built)
    return built


@pytest.fixture
def connects() -> Iterator[List[object]]:
    """Every DBAPI connection opened meanwhile, by any engine."""
    opened: List[object] = []

    def record(dbapi_connection: object, _record: object) -> None:
        opened.append(dbapi_connection)

    event.listen(Engine, "connect", record)
    try:
        yield opened
    finally:
        event.remove(Engine, "connect", record)


def test_importing_the_add_on_wraps_meltanos_function_once_where_meltano_calls_it() -> None:
    from meltano.core import state_service, state_store

    wrapper = state_store.state_store_manager_from_project_settings
    assert getattr(wrapper, building.ORIGINAL, None) is not None
    assert state_service.state_store_manager_from_project_settings is wrapper
    assert building.install() and building.install()
    assert state_store.state_store_manager_from_project_settings is wrapper
    assert building.meltanos_function() is getattr(wrapper, building.ORIGINAL)


def test_a_system_database_store_works_in_meltanos_own_session(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, connects: List[object]
) -> None:
    """What Meltano's session holds, uncommitted, the add-on reads; and it
    opens no connection to the database besides Meltano's."""
    from meltano.core.job_state import JobState

    project = project_with(workdir, monkeypatch, f"sqlite:///{workdir / 'meltano.db'}", "  uri: runlock+systemdb://\n")
    engine = create_engine(f"sqlite:///{workdir / 'meltano.db'}")
    JobState.__table__.create(engine)  # type: ignore[attr-defined]
    connection = engine.connect()
    transaction = connection.begin()
    session = Session(bind=connection)
    try:
        session.add(JobState(state_id=STATE_ID, completed_state={"singer_state": {"by": "meltano"}}, partial_state={}))
        session.flush()
        before = len(connects)

        built = build(project, session)
        assert type(built.inner) is DBStateStoreManager and built.inner.session is session
        got = built.get(STATE_ID)
        assert got is not None and got.completed_state == {"singer_state": {"by": "meltano"}}
        assert len(connects) == before, "the add-on opened a connection of its own"
        built.close()
        assert session.is_active, "the add-on closed Meltano's session"
    finally:
        transaction.rollback()
        connection.close()
        engine.dispose()


def test_a_system_database_store_handed_no_session_gets_meltanos_and_closes_it(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Meltano hands no session (its upgrade's StateService, say): its own
    function opens one for the store, as for plain systemdb, and the add-on
    closes it with the store, since no one else has it."""
    project = project_with(workdir, monkeypatch, f"sqlite:///{workdir / 'meltano.db'}", "  uri: runlock+systemdb://\n")
    built = build(project)
    assert type(built.inner) is DBStateStoreManager
    closed: List[object] = []
    event.listen(built.inner.session, "after_transaction_end", lambda *_: closed.append(True))
    built.inner.session.connection()  # the session's transaction begins
    built.close()
    assert closed, "the session Meltano opened for the store stayed open"


@pytest.mark.parametrize("scheme", ["file", "s3", "dummy"])
def test_every_other_store_is_the_one_meltano_builds_for_the_inner_uri(
    scheme: str, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings Meltano passes, shared (``lock_timeout_seconds``) and the
    store's own (``state_backend.s3.*``, an add-on's ``state_backend.dummy.*``),
    reach the inner store as they reach it without the add-on."""
    inner = {
        "file": f"file://{workdir / 'state'}",
        "s3": "s3://bucket/prefix",
        "dummy": dummy_store(workdir).state_uri.removeprefix("runlock+"),
    }[scheme]
    own = {
        "file": "",
        "s3": "  s3:\n    endpoint_url: http://127.0.0.1:1\n    aws_access_key_id: id\n    aws_secret_access_key: key\n",
        "dummy": dummy_store(workdir).meltano_settings,
    }[scheme]
    project = project_with(workdir, monkeypatch, f"sqlite:///{workdir / 'meltano.db'}", f"  uri: runlock+{inner}\n  lock_timeout_seconds: 7\n{own}")
    built = build(project)

    # Meltano's own build, for the plain URI.
    project.settings.set(["state_backend", "uri"], inner)
    original = building.meltanos_function()
    assert original is not None
    plain = original(project.settings)
    assert type(built.inner) is type(plain)
    assert vars(built.inner).keys() == vars(plain).keys()
    for name, value in vars(plain).items():
        if name not in ("_client", "client", "_lock"):  # made per instance
            assert getattr(built.inner, name) == value, name
    if scheme == "s3":
        assert isinstance(built.inner, S3StateStoreManager)
        assert built.inner.endpoint_url == "http://127.0.0.1:1" and built.inner.lock_timeout_seconds == 7


def test_it_answers_as_the_store_it_wraps_but_for_a_managers_operations(workdir: Path) -> None:
    store = LocalFilesystemStateStoreManager(uri=f"file://{workdir / 'state'}", lock_timeout_seconds=7)
    built = RunlockStateStoreManager("runlock+" + store.uri, inner=store)
    assert isinstance(built, LocalFilesystemStateStoreManager) and isinstance(built, RunlockStateStoreManager)
    assert type(built) is RunlockStateStoreManager
    assert built.state_dir == store.state_dir and built.lock_timeout_seconds == 7
    assert built.label == f"{store.label}, locked by runlock"
    assert type(built).get is RunlockStateStoreManager.get
    with pytest.raises(AttributeError):
        built.no_such_attribute  # noqa: B018
    # A manager's operations are the add-on's: a write through its fence.
    built.set(MeltanoState(STATE_ID, partial_state={}, completed_state={"singer_state": {"x": 1}}))
    got = store.get(STATE_ID)
    assert got is not None and got.completed_state == {"singer_state": {"x": 1}}
