"""How a ``runlock+`` state backend is built: around the manager Meltano
builds for the inner URI, with everything Meltano passes, its database
session included.

Meltano builds its state store manager in one function,
``state_store_manager_from_project_settings(settings, session)``. For
``systemdb`` it hands its own store the session of the command or run
(``meltano state``'s, a run's); for any other scheme it calls the entry
point named by the scheme with the settings alone. So an add-on's manager,
``runlock+systemdb://`` included, never sees that session: a store built
with a session of its own would neither see Meltano's uncommitted writes
nor leave SQLite's one writer lock to Meltano's session in the same process.

So the add-on wraps that function when it is imported (at Meltano's
start-up, for its setting: settings.py): for a ``runlock+`` URI, it calls
Meltano's own function with the URI without ``runlock+`` and the same
session, and wraps what comes back. The add-on opens no connection of its
own; when Meltano hands no session, Meltano's function opens one, as it
does for plain ``systemdb``. Where Meltano calls the entry point itself
(from a reference to its function taken before the add-on was imported),
the store is built by Meltano's function too, from the active project's
settings, without a session (:func:`meltanos_manager`). A Meltano without
the function gets an error naming it: its store could not be built as
Meltano builds it.
"""

from __future__ import annotations

import functools
import logging
import sys
import typing as t
from urllib.parse import urlparse

from .inner import PREFIX, inner_uri, redact

if t.TYPE_CHECKING:
    from meltano.core.state_store.base import StateStoreManager

_log = logging.getLogger("runlock_meltano")

#: Meltano's name for its system database store (``meltano.core.state_store.SYSTEMDB``).
SYSTEMDB = "systemdb"

#: Meltano's function, and the modules that bind it by name (Meltano 4.4.1:
#: its StateService's module), so that a module imported earlier calls the
#: wrapper too.
FUNCTION = "state_store_manager_from_project_settings"
MODULES = ("meltano.core.state_store", "meltano.core.state_service")

#: Set on the wrapper, to Meltano's own function: how a second install knows.
ORIGINAL = "_runlock_original"

Build = t.Callable[..., "StateStoreManager"]


class SettingsWithUri:
    """Meltano's settings service, the same in every setting but
    ``state_backend.uri``, which reads as ``uri`` (the inner store's)."""

    def __init__(self, settings: t.Any, uri: str):
        self._settings = settings
        self._uri = uri

    def get(self, name: str, *args: t.Any, **kwargs: t.Any) -> t.Any:
        if name == "state_backend.uri":
            return self._uri
        return self._settings.get(name, *args, **kwargs)

    def __getattr__(self, name: str) -> t.Any:
        return getattr(self._settings, name)


def is_runlock(uri: object) -> bool:
    """Whether Meltano picks a ``runlock+`` entry point for ``uri``: by its
    scheme, which ``urlparse`` lowercases (``Runlock+s3://`` too, which the
    add-on then refuses, naming it)."""
    return isinstance(uri, str) and urlparse(uri).scheme.startswith(PREFIX)


def meltanos_uri(uri: str) -> str:
    """The inner URI as Meltano's setting would be: ``systemdb`` for
    ``runlock+systemdb://``, which Meltano matches exactly."""
    inner = inner_uri(uri)
    return SYSTEMDB if urlparse(inner).scheme == SYSTEMDB else inner


def _module_function() -> Build | None:
    module = sys.modules.get(MODULES[0])
    if module is None:
        try:
            import meltano.core.state_store as module
        except ImportError:
            return None
    found = getattr(module, FUNCTION, None)
    return t.cast(Build, found) if callable(found) else None


def meltanos_function() -> Build | None:
    """Meltano's own function, unwrapped; None if this Meltano has none."""
    found = _module_function()
    return t.cast(Build, getattr(found, ORIGINAL, found))


def install() -> bool:
    """Wraps Meltano's function, once however often it is called, in every
    module of :data:`MODULES` imported so far (the others import the
    wrapper from the first). False if this Meltano has no such function."""
    current = _module_function()
    if current is None:
        _log.debug("runlock: Meltano has no %s; a runlock+ store is built without Meltano's session", FUNCTION)
        return False
    wrapper = current if hasattr(current, ORIGINAL) else wrapping(current)
    for name in MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, FUNCTION, None) in (current, getattr(current, ORIGINAL, None)):
            setattr(module, FUNCTION, wrapper)
    return True


def wrapping(original: Build) -> Build:
    @functools.wraps(original)
    def state_store_manager_from_project_settings(
        settings_service: t.Any, session: t.Any = None
    ) -> StateStoreManager:
        uri = settings_service.get("state_backend.uri")
        if not is_runlock(uri):
            return original(settings_service, session)
        from .backend import RunlockStateStoreManager

        # Every runlock+ scheme is the add-on's, whether or not Meltano's
        # look-up would find its entry point (schemes.py): the inner one is
        # looked up by Meltano, which names it if it finds none.
        inner = original(SettingsWithUri(settings_service, meltanos_uri(uri)), session)
        return RunlockStateStoreManager(uri, inner=inner, owns_session=session is None)

    setattr(state_store_manager_from_project_settings, ORIGINAL, original)
    return state_store_manager_from_project_settings


def meltanos_manager(uri: str) -> StateStoreManager:
    """The manager Meltano builds for the inner URI of ``uri`` from the
    active project's settings, without a session: for Meltano's call of the
    entry point itself (the function not wrapped), which hands none."""
    from meltano.core.project import Project

    original = meltanos_function()
    if original is None:
        raise RuntimeError(f"runlock: this Meltano has no {FUNCTION} to build the store of {redact(uri)!r} with")
    return original(SettingsWithUri(Project.find().settings, meltanos_uri(uri)), None)
