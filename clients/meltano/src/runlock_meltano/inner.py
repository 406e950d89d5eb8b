"""Meltano's own state store for the scheme inside ``runlock+SCHEME://…``:
state stays where it was, in Meltano's format, read and written by the code
Meltano would use without the add-on.
"""

from __future__ import annotations

import typing as t
from urllib.parse import urlparse

from meltano.core.db import project_engine
from meltano.core.project import Project
from meltano.core.state_store import SCHEME_TO_NAMESPACE, SYSTEMDB, StateBackend
from meltano.core.state_store.base import StateStoreManager, UnsupportedStateBackendURIError
from meltano.core.state_store.db import DBStateStoreManager

PREFIX = "runlock+"


def inner_uri(uri: str) -> str:
    """``runlock+s3://bucket/prefix`` → ``s3://bucket/prefix``."""
    if not uri.startswith(PREFIX):
        raise UnsupportedStateBackendURIError(f"not a runlock state backend URI: {redact(uri)!r}")
    inner = uri[len(PREFIX):]
    scheme = urlparse(inner).scheme
    if not scheme or scheme.startswith(PREFIX):
        raise UnsupportedStateBackendURIError(
            f"{redact(uri)!r} names no store: use runlock+file://, runlock+s3://, runlock+gs://, "
            "runlock+azure://, runlock+systemdb://, or runlock+ before the URI of any state backend installed"
        )
    return inner


def redact(uri: str) -> str:
    """``uri`` fit for a message: its user information (keys, passwords)
    and every query value (SAS tokens, signatures) replaced by ``***``,
    whatever its shape, a scheme missing or malformed included."""
    rest, _, fragment = uri.partition("#")
    rest, has_query, query = rest.partition("?")
    # Where the authority starts: after `scheme://`, `//`, or the `runlock+` prefix.
    start = 0
    if rest.startswith(PREFIX):
        start = len(PREFIX)
    slashes = rest.find("//", start)
    colon = rest.find(":", start)
    if slashes != -1 and (colon == -1 or colon + 1 == slashes or slashes == start):
        start = slashes + 2
    # The last `@`, not the authority's: a password may hold a `/`, and a
    # path with an `@` only loses some of its text to the redaction.
    at = rest.rfind("@", start)
    if at != -1:
        rest = rest[:start] + "***" + rest[at:]
    if has_query:
        pairs = (pair.partition("=") for pair in query.split("&"))
        rest += "?" + "&".join(f"{name}=***" if sep else "***" for name, sep, _ in pairs)
    if fragment:
        rest += "#***"
    return rest


def open_inner(uri: str, settings: dict[str, t.Any]) -> StateStoreManager:
    """The manager Meltano would use for the inner URI: its own, or an
    add-on's (any ``meltano.state_backends`` entry point), found as Meltano
    finds it, given the settings Meltano gave this one (``state_backend.*``)
    and the inner scheme's own (``state_backend.s3.*``, an add-on's
    ``state_backend.NAME.*``), read from the active project."""
    inner = inner_uri(uri)
    scheme = urlparse(inner).scheme
    project = Project.find()
    if scheme == SYSTEMDB:
        return DBStateStoreManager(session=project_engine(project)[1]())
    factory = StateBackend.get_manager_factory(scheme=scheme)
    namespace = SCHEME_TO_NAMESPACE.get(scheme, scheme)
    kwargs = {**settings, **scheme_settings(project, namespace), "uri": inner}
    return factory(**kwargs)


def scheme_settings(project: Project, namespace: str) -> dict[str, t.Any]:
    """``state_backend.NAMESPACE.….NAME`` settings as ``{NAME: value}``, as
    Meltano gives them to the store of that namespace (the last part names it)."""
    service = project.settings
    found = {}
    for definition in service.setting_definitions:
        parts = definition.name.split(".")
        if len(parts) >= 3 and parts[0] == "state_backend" and parts[1] == namespace:
            found[parts[-1]] = service.get(definition.name)
    return found
