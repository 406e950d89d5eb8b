"""Exceptions raised by the runlock client.

Everything derives from :class:`RunlockError`, so ``except runlock.RunlockError``
catches every failure of this package. Agent errors map from their wire ``code``
(SPEC section 9); a code this client does not know still raises a plain
:class:`RunlockError`, because the spec makes an unknown code a failure.
"""

from __future__ import annotations

import time
import unicodedata
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Type

if TYPE_CHECKING:  # only for annotations: messages imports this module
    from .messages import Holder, LostEvent


class RunlockError(Exception):
    """Any failure of a runlock operation.

    ``code`` is the agent's error code (``None`` for failures found on this
    side), ``message`` the human text (shown as is, never parsed) and ``key``
    the key the error is about, when there is one.
    """

    def __init__(self, message: str, *, code: Optional[str] = None, key: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.key = key


class NamesHolders(RunlockError):
    """An error that names who holds the key: ``holder``, and for a key with
    slots ``holders`` (each with its ``slot`` and token; ``holder`` is the
    first). For a plain key ``holders`` is empty."""

    #: The code an instance made in Python (not from the wire) carries.
    default_code = ""

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        key: Optional[str] = None,
        holder: Optional["Holder"] = None,
        holders: "Sequence[Holder]" = (),
    ):
        super().__init__(message, code=code or self.default_code, key=key)
        self.holder = holder
        self.holders = list(holders)

    def __str__(self) -> str:
        """The message, then each holder's fields on lines of their own, as
        the shim prints them for exit 75: host, pid, user, command, since,
        token (and the slot, for a key with slots)."""
        holders = self.holders or ([self.holder] if self.holder is not None else [])
        text = _escape(self.message)
        for h in holders:
            indent = "  "
            if h.slot is not None:
                of = f" (of {h.slots})" if h.slots is not None else ""
                text += f"\n  slot {h.slot}{of}:"
                indent = "    "
            text += _holder_lines(h, indent)
        return text


def _holder_lines(h: "Holder", indent: str) -> str:
    return "".join(
        f"\n{indent}{name + ':':<8} {value}"
        for name, value in (
            ("host", _escape(h.host)),
            ("pid", h.pid),
            ("user", f"{_escape(h.user)} (uid {h.uid})"),
            ("command", _escape(h.command)),
            ("since", _since(h.acquired_at_ms)),
            ("token", h.token),
        )
    )


def _escape(text: str) -> str:
    """``text`` with every character a terminal could act on or hide
    (controls, zero-width and bidi marks, line separators) as a visible
    escape, as the shim writes it: a holder's fields come from other users."""
    out = []
    for c in text:
        if c in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c])
        elif unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\u{{{ord(c):x}}}")
        else:
            out.append(c)
    return "".join(out)


def _since(ms: int) -> str:
    """``2026-11-30T04:05:06.000Z (3m 2s ago)``."""
    try:
        at = datetime.fromtimestamp(ms / 1000, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{ms}ms after the epoch"
    text = at.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"
    ago = int(time.time() - ms / 1000)
    if ago < 0:
        return text
    days, rest = divmod(ago, 86400)
    parts = [f"{days}day{'s' if days != 1 else ''}"] if days else []
    for amount, unit in ((rest // 3600, "h"), (rest // 60 % 60, "m"), (rest % 60, "s")):
        if amount:
            parts.append(f"{amount}{unit}")
    return f"{text} ({' '.join(parts) or '0s'} ago)"


class Held(NamesHolders):
    """The key is held by someone else; ``holder`` says who (host, pid, user, token...).

    For a key with slots every slot is held: ``holders`` names each slot's
    holder (with its ``slot`` and token), ``holder`` the first of them.
    """

    default_code = "held"


class Timeout(Held):
    """The key stayed held for the whole ``wait``.

    A subclass of :class:`Held` because it is the same condition after waiting:
    ``except runlock.Held`` covers both.
    """


class Unavailable(RunlockError):
    """The agent cannot be reached (no socket, refused, gone), or its backend cannot."""


class InvalidKey(RunlockError):
    """A key breaks the key rules (1 to 512 bytes of UTF-8, no control or invisible characters)."""


class Forbidden(RunlockError):
    """``force`` (or breaking a key) without force rights on the agent."""


class NotOwner(RunlockError):
    """A release named a lease this connection does not hold."""


class Unsupported(RunlockError):
    """The agent (or its backend) does not support the request."""


class BadRequest(RunlockError):
    """The agent could not accept the request as sent (for example a TTL out of range)."""


class SlotsMismatch(BadRequest, NamesHolders):
    """The key is held by a holder that took it with another count of slots
    than this acquire asked: a key's slots are one count for every holder.

    A subclass of :class:`BadRequest`, not of :class:`Held`: waiting does not
    cure it, the counts must agree. ``message`` names both counts and the
    holders; ``holders`` lists them (each with its ``slot`` and ``slots``),
    ``holder`` the first, and :attr:`held_with` is their count.
    """

    default_code = "slots_mismatch"

    @property
    def held_with(self) -> Optional[int]:
        """How many slots the live holders took the key with (None if the
        agent named no holder); 1 for a plain key's holder."""
        first = self.holders[0] if self.holders else self.holder
        if first is None:
            return None
        return 1 if first.slots is None else first.slots


class Internal(RunlockError):
    """The agent failed internally; its log has the details."""


class ProtocolError(RunlockError):
    """The conversation with the agent broke the protocol: an oversized or
    undecodable frame, an unexpected reply, or a protocol version the agent
    does not speak."""


class ConfigError(RunlockError):
    """No socket path could be found (no ``socket=``, ``RUNLOCK_SOCKET``,
    configuration file or ``XDG_RUNTIME_DIR``)."""


class LockLost(RunlockError):
    """A lease ended while the protected block ran.

    ``event`` is the first :class:`~runlock.LostEvent`, ``events`` all of them
    (one per lost lease).
    """

    def __init__(self, events: "List[LostEvent]"):
        first = events[0]
        super().__init__(
            f"lock on {first.key!r} lost ({first.reason}): {first.message}",
            code=None,
            key=first.key,
        )
        self.event = first
        self.events = list(events)


_BY_CODE: Dict[str, Type[RunlockError]] = {
    "held": Held,
    "timeout": Timeout,
    "unavailable": Unavailable,
    "invalid_key": InvalidKey,
    "forbidden": Forbidden,
    "not_owner": NotOwner,
    "unsupported": Unsupported,
    "unsupported_version": ProtocolError,
    "bad_request": BadRequest,
    "internal": Internal,
    "slots_mismatch": SlotsMismatch,
}


def from_wire(
    code: str,
    message: str,
    key: Optional[str] = None,
    holder: "Optional[Holder]" = None,
    holders: "Sequence[Holder]" = (),
) -> RunlockError:
    """Builds the exception for an agent ``error`` reply; unknown codes give a plain RunlockError."""
    cls = _BY_CODE.get(code, RunlockError)
    if issubclass(cls, NamesHolders):
        return cls(message, code=code, key=key, holder=holder, holders=holders)
    return cls(message, code=code, key=key)
