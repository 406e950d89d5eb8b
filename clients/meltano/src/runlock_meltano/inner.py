"""The URI inside ``runlock+SCHEME://…``, whose store (Meltano's own, or
an add-on's) keeps the state where it was, in its own format; and URIs
fit for messages. The store is built as Meltano builds it (building.py).
"""

from __future__ import annotations

from urllib.parse import urlparse

from meltano.core.state_store.base import UnsupportedStateBackendURIError

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
