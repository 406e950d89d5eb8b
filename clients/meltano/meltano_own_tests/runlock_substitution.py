"""pytest plugin: Meltano's own tests with ``runlock+`` in front of every
state backend URI they use, without a change to Meltano's files.

Meltano's tests get a state store manager in two ways, and both are
substituted here:

- from the project's ``state_backend.uri`` (``systemdb`` unless a test sets
  another), through Meltano's ``state_store_manager_from_project_settings``,
  which ``StateService`` calls, and some tests call themselves: it is called
  here as if the setting were ``runlock+URI`` (``runlock+systemdb://`` for
  ``systemdb``), with whatever else it was given, Meltano's session
  included, and so reaches the add-on as Meltano hands it over;
- from a fixture that builds one of Meltano's stores itself, from a URI or
  a session (``subject``, ``db_store``, ``s3_manager``, …): its value is
  replaced by the add-on's manager around it, as the add-on wraps the store
  Meltano builds for ``runlock+URI``.

The add-on is imported first, as Meltano does at start-up for every command
(its setting), so that its own hooks are in place before Meltano's tests
import anything. Its agent is the one ``RUNLOCK_SOCKET`` names.
"""

from __future__ import annotations

import json
import os
import sys
import typing as t

import pytest

import runlock_meltano  # noqa: F401  (its hooks, installed on import)
from runlock_meltano.backend import RunlockStateStoreManager
from runlock_meltano.building import FUNCTION, MODULES, SettingsWithUri

from meltano.core.state_store import SYSTEMDB
from meltano.core.state_store.base import StateStoreManager

#: How many managers each way substituted, for the runner's check that it happened.
SUBSTITUTED = {"settings": 0, "fixtures": 0}


def runlock_uri(uri: str) -> str:
    return "runlock+systemdb://" if uri == SYSTEMDB else f"runlock+{uri}"


def _substituting(build: t.Callable[..., StateStoreManager]) -> t.Callable[..., StateStoreManager]:
    def state_store_manager_from_project_settings(settings_service: t.Any, session: t.Any = None) -> StateStoreManager:
        uri = runlock_uri(settings_service.get("state_backend.uri"))
        SUBSTITUTED["settings"] += 1
        return build(SettingsWithUri(settings_service, uri), session)

    return state_store_manager_from_project_settings


def pytest_configure(config: pytest.Config) -> None:
    import meltano.core.state_service  # noqa: F401  (it binds the function by name)

    build = getattr(sys.modules[MODULES[0]], FUNCTION)
    substituted = _substituting(build)
    for name in MODULES:
        setattr(sys.modules[name], FUNCTION, substituted)


def _meltanos_store(value: object) -> bool:
    kind = type(value)  # not __class__: the add-on's manager answers as its store
    return (
        isinstance(value, StateStoreManager)
        and kind is not RunlockStateStoreManager
        and kind.__module__.startswith("meltano.")
    )


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[t.Any], request: pytest.FixtureRequest) -> t.Any:
    value = yield
    if not _meltanos_store(value):
        return value
    uri = getattr(value, "uri", SYSTEMDB)
    wrapped = RunlockStateStoreManager(runlock_uri(uri), inner=value)
    # pytest hands later requests of the fixture what it cached, not what this returns.
    cached = fixturedef.cached_result
    if cached is not None:
        fixturedef.cached_result = (wrapped, *cached[1:])
    SUBSTITUTED["fixtures"] += 1
    return wrapped


def pytest_sessionfinish(session: pytest.Session) -> None:
    # One line per process (each pytest-xdist worker counts its own).
    path = os.environ.get("RUNLOCK_OWN_TESTS_SUBSTITUTED")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(SUBSTITUTED) + "\n")
