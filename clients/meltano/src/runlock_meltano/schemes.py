"""``runlock+NAME`` for every state backend installed, not only Meltano's own.

Meltano picks a state backend by the scheme of ``state_backend.uri``: the
name of an entry point in the group ``meltano.state_backends``. The add-on's
package declares ``runlock+file``, ``runlock+s3``, ``runlock+gs``,
``runlock+azure`` and ``runlock+systemdb``; a backend another package
installs (an add-on's ``dummy``, say) gets its ``runlock+dummy`` here, at run
time, from a distribution finder: the way ``importlib.metadata`` documents to
extend its search ("Extending the search algorithm"). Its one distribution
declares ``runlock+NAME`` → :class:`RunlockStateStoreManager` for each
installed ``NAME`` that has no ``runlock+NAME`` yet, and nothing else.

The finder is installed when the add-on is imported, which Meltano does at
start-up (the add-on's setting, settings.py), before it reads
``state_backend.uri`` and looks its backend up. It answers both
``importlib.metadata`` and its backport, ``importlib_metadata``, which
Meltano uses before Python 3.12.
"""

from __future__ import annotations

import importlib.metadata as stdlib_metadata
import os
import pathlib
import re
import sys
import threading
import typing as t
from collections.abc import Iterable, Iterator

GROUP = "meltano.state_backends"

PREFIX = "runlock+"

#: The manager every ``runlock+`` scheme names.
MANAGER = "runlock_meltano.backend:RunlockStateStoreManager"

#: The finder's one distribution.
NAME = "runlock-meltano-wrapped-state-backends"

#: Set on the finder: how a second install (a reloaded module) knows one is there.
MARK = "_runlock_wrapped_state_backends"


def wrapped_names(installed: Iterable[str]) -> list[str]:
    """``runlock+NAME`` for each installed backend ``NAME`` that is not one
    itself and has none declared already, in order, once each."""
    names = list(dict.fromkeys(installed))
    declared = set(names)
    return [PREFIX + name for name in names if not name.startswith(PREFIX) and PREFIX + name not in declared]


def entry_points_text(names: Iterable[str]) -> str:
    """``entry_points.txt`` declaring each of ``names`` as :data:`MANAGER`."""
    lines = [f"[{GROUP}]", *(f"{name} = {MANAGER}" for name in names)]
    return "\n".join(lines) + "\n"


class _Metadata:
    """The files of the finder's distribution, for either library."""

    finder: WrappedBackendsFinder
    library: t.Any

    def read_text(self, filename: str | os.PathLike[str]) -> str | None:
        if str(filename) == "METADATA":
            return f"Metadata-Version: 2.1\nName: {NAME}\nVersion: 0\n"
        if str(filename) == "entry_points.txt":
            return entry_points_text(self.finder.names(self.library))
        return None

    def locate_file(self, path: str | os.PathLike[str]) -> pathlib.Path:
        # It has no files: nothing of it is on disk.
        return pathlib.Path(path)


class _StdlibDistribution(_Metadata, stdlib_metadata.Distribution):
    library = stdlib_metadata


def _backport() -> tuple[t.Any, type | None]:
    """``importlib_metadata`` and its ``Distribution`` subclass, where Meltano
    uses it (before Python 3.12); ``(None, None)`` without it."""
    if sys.version_info >= (3, 12):
        return None, None
    try:
        import importlib_metadata
    except ImportError:
        return None, None

    class _BackportDistribution(_Metadata, importlib_metadata.Distribution):
        library = importlib_metadata

    return importlib_metadata, _BackportDistribution


class WrappedBackendsFinder:
    """A ``sys.meta_path`` finder that finds no module, and one distribution."""

    def __init__(self) -> None:
        self._backport, self._backport_distribution = _backport()
        # The backends installed, per library: packages are not installed
        # under a running Meltano, and each look-up scans every distribution.
        self._names: dict[int, list[str]] = {}
        self._scanning = threading.local()
        setattr(self, MARK, True)

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        return None

    def find_distributions(self, context: t.Any = None) -> Iterator[t.Any]:
        name = getattr(context, "name", None)
        if name is not None and re.sub(r"[-_.]+", "-", name).lower() != NAME:
            return
        # A search of other directories (another environment's) does not find it.
        path = vars(context).get("path") if context is not None else None
        if path is not None and path != sys.path:
            return
        if getattr(self._scanning, "active", False):
            return  # this finder's own scan of the installed backends
        if self._backport is not None and isinstance(context, self._backport.DistributionFinder.Context):
            distribution: t.Any = self._backport_distribution
        else:
            distribution = _StdlibDistribution
        found = distribution()
        found.finder = self
        yield found

    def names(self, library: t.Any) -> list[str]:
        """The ``runlock+NAME`` entry points to declare, found through
        ``library`` (the one that asks)."""
        key = id(library)
        if key not in self._names:
            self._scanning.active = True
            try:
                installed = [ep.name for ep in library.entry_points(group=GROUP)]
            finally:
                self._scanning.active = False
            self._names[key] = wrapped_names(installed)
        return self._names[key]


def install() -> None:
    """Adds the finder to ``sys.meta_path`` once, however often it is called."""
    if not any(getattr(finder, MARK, False) for finder in sys.meta_path):
        sys.meta_path.append(WrappedBackendsFinder())
