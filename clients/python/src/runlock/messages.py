"""The protocol's messages (SPEC sections 6 and 7) as Python values.

Requests are built as dicts in the reference encoder's field order, so they
encode to the vectors' exact bytes. Agent messages are parsed into frozen
dataclasses; unknown fields are ignored and unknown enum values kept as the
string they are (SPEC 3.3), while a missing required field or a value of the
wrong type raises ProtocolError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple, Union

from . import errors
from ._fields import _U16, _U64, U32, _int, _str, decode

# The requests and the nested objects live in modules of their own; this one
# names them too (``X as X``: re-exported), as it always has, for the
# client's modules and its users.
from ._records import Grant as Grant
from ._records import Holder as Holder
from ._records import KeyEvent as KeyEvent
from ._records import KeyListing as KeyListing
from ._records import KeyRecord as KeyRecord
from ._records import LeaseInfo as LeaseInfo
from ._records import Refusal as Refusal
from ._records import Waiter as Waiter
from ._requests import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._requests import acquire as acquire
from ._requests import attach as attach
from ._requests import hello as hello
from ._requests import history as history
from ._requests import inspect as inspect
from ._requests import list_keys as list_keys
from ._requests import reattach as reattach
from ._requests import release as release
from ._requests import simple as simple


@dataclass(frozen=True)
class Welcome:
    """Answer to ``hello``."""

    version: int = field(metadata={"limit": _U16})
    agent: str
    agent_id: str
    backend: str
    scope: str
    default_ttl_ms: int
    on_unavailable: str = "fail"
    leases_survive_agent: bool = False
    id: Optional[int] = None


@dataclass(frozen=True)
class Acquired:
    """Answer to ``acquire`` (and ``reattach``): one Grant per key, sorted by key.

    ``locks`` counts the lock descriptors passed with the frame, one per lease
    in order (SPEC 5.4); the connection hands them to whoever made the request.
    """

    leases: Tuple[Grant, ...]
    ttl_ms: int
    valid_for_ms: Optional[int] = None
    id: Optional[int] = None
    locks: int = field(default=0, metadata=U32)


@dataclass(frozen=True)
class Released:
    """Answer to ``release``."""

    count: int = field(metadata=U32)
    id: Optional[int] = None


@dataclass(frozen=True)
class Leases:
    """Answer to ``list``: as many leases as fit one frame, and how many
    more were left out."""

    leases: Tuple[LeaseInfo, ...]
    id: Optional[int] = None
    omitted: int = field(default=0, metadata=U32)


@dataclass(frozen=True)
class Record:
    """Answer to ``inspect``."""

    record: KeyRecord
    id: Optional[int] = None


@dataclass(frozen=True)
class Keys:
    """Answer to ``list_keys``: one page of keys; ``cursor`` asks for the
    next, None after the last."""

    keys: Tuple[KeyListing, ...]
    cursor: Optional[str] = None
    id: Optional[int] = None


@dataclass(frozen=True)
class Events:
    """Answer to ``history``: the key's latest events, oldest first."""

    key: str
    events: Tuple[KeyEvent, ...]
    id: Optional[int] = None


@dataclass(frozen=True)
class Empty:
    """A reply without fields: ``attached`` or ``pong``."""

    type: str
    id: Optional[int] = None


@dataclass(frozen=True)
class Error:
    """An ``error`` reply; ``exception()`` gives the matching RunlockError.
    ``holders`` names every held slot's holder, for a key with slots."""

    code: str
    message: str
    key: Optional[str] = None
    holder: Optional[Holder] = None
    id: Optional[int] = None
    holders: Tuple[Holder, ...] = ()

    def exception(self) -> errors.RunlockError:
        return errors.from_wire(self.code, self.message, self.key, self.holder, self.holders)


@dataclass(frozen=True)
class LostEvent:
    """A lease ended while held (the ``lost`` event, or the connection's end).

    ``reason`` is the agent's ``forced``, ``broken`` or ``expired`` (or a newer
    value), or one of this client's own: ``restarting`` (the agent said it is
    going away and its leases do not outlive it), ``agent_gone`` (the
    connection to such an agent ended), ``reattach_refused`` (the next agent
    answered the reattach with an error other than ``unavailable``) and
    ``expired`` (no agent took the lease over before its deadline). ``holder``
    is the new holder after ``forced``.
    """

    lease_id: str
    key: str
    reason: str
    message: str
    holder: Optional[Holder] = None


@dataclass(frozen=True)
class Lost:
    """The ``lost`` event."""

    event: LostEvent
    id: Optional[int] = None


@dataclass(frozen=True)
class Forcing:
    """The ``forcing`` event: a forced acquire (or a break) has taken ``key``
    and waits, at most ``wait_ms`` (``None``: with no deadline, where that
    run holds a kernel lock of its own, on ``file://``), for the run it took
    it from (``holder``, where known) to stop before it answers."""

    key: str
    wait_ms: Optional[int]
    holder: Optional[Holder] = None
    id: Optional[int] = None

    def describe(self) -> str:
        """The wait in words."""
        whose = "the run it was held by"
        if self.holder is not None:
            h = self.holder
            whose = f"the run of {h.user}@{h.host} (pid {h.pid}, token {h.token})"
        if self.wait_ms is None:
            how_long = "no deadline, as it holds its own lock (it is stopped once its shim reaches an agent)"
        else:
            how_long = f"at most {-(-self.wait_ms // 1000)}s"
        return f"{self.key!r} is taken over; waiting for {whose} to stop: {how_long}"


@dataclass(frozen=True)
class Renewed:
    """The ``renewed`` event: the lease stays guaranteed for ``valid_for_ms``."""

    lease_id: str
    valid_for_ms: int
    id: Optional[int] = None


@dataclass(frozen=True)
class Restarting:
    """The ``restarting`` event: the agent is about to close the connection."""

    id: Optional[int] = None


@dataclass(frozen=True)
class Unknown:
    """A message whose ``type`` this client does not know (ignored when it has no id)."""

    type: str
    id: Optional[int] = None
    body: Dict[str, Any] = field(default_factory=dict, compare=False)


AgentMessage = Union[
    Welcome, Acquired, Released, Leases, Record, Keys, Events, Empty, Error, Lost, Forcing,
    Renewed, Restarting, Unknown,
]


def message_id(body: Dict[str, Any]) -> Optional[int]:
    """The body's ``id`` if it is readable, even when the rest is not (SPEC 3.4)."""
    value = body.get("id")
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _U64:
        return value
    return None


def parse_agent(body: Dict[str, Any]) -> AgentMessage:
    """Turns a decoded agent body into a typed message."""
    request_id = _int(body, "id", required=False)
    kind = _str(body, "type")
    if kind == "record":
        return Record(record=decode(KeyRecord, body), id=request_id)
    if kind == "lost":
        return Lost(event=decode(LostEvent, body), id=request_id)
    if kind in ("attached", "pong"):
        return Empty(type=kind, id=request_id)
    of_kind = _MESSAGES.get(kind)
    if of_kind is None:
        return Unknown(type=kind, id=request_id, body=body)
    message: AgentMessage = decode(of_kind, body, id=request_id)
    return message


#: The messages read field by field, by ``type``.
_MESSAGES: Dict[str, Any] = {
    "welcome": Welcome,
    "acquired": Acquired,
    "released": Released,
    "leases": Leases,
    "keys": Keys,
    "events": Events,
    "error": Error,
    "forcing": Forcing,
    "renewed": Renewed,
    "restarting": Restarting,
}
