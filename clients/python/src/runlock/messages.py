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
from ._fields import _U16, _U32, _U64, _bool, _int, _list, _str
from ._records import _holder, _holders, _record

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

    version: int
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
    locks: int = 0


@dataclass(frozen=True)
class Released:
    """Answer to ``release``."""

    count: int
    id: Optional[int] = None


@dataclass(frozen=True)
class Leases:
    """Answer to ``list``: as many leases as fit one frame, and how many
    more were left out."""

    leases: Tuple[LeaseInfo, ...]
    id: Optional[int] = None
    omitted: int = 0


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
    if kind == "welcome":
        return Welcome(
            version=_int(body, "version", limit=_U16),
            agent=_str(body, "agent"),
            agent_id=_str(body, "agent_id"),
            backend=_str(body, "backend"),
            scope=_str(body, "scope"),
            default_ttl_ms=_int(body, "default_ttl_ms"),
            on_unavailable=_str(body, "on_unavailable", required=False) or "fail",
            leases_survive_agent=_bool(body, "leases_survive_agent", False),
            id=request_id,
        )
    if kind == "acquired":
        return Acquired(
            leases=tuple(Grant.from_wire(v) for v in _list(body, "leases")),
            ttl_ms=_int(body, "ttl_ms"),
            valid_for_ms=_int(body, "valid_for_ms", required=False),
            id=request_id,
            locks=_int(body, "locks", required=False, limit=_U32) or 0,
        )
    if kind == "released":
        return Released(count=_int(body, "count", limit=_U32), id=request_id)
    if kind == "leases":
        return Leases(
            leases=tuple(LeaseInfo.from_wire(v) for v in _list(body, "leases")),
            id=request_id,
            omitted=_int(body, "omitted", limit=_U32, required=False) or 0,
        )
    if kind == "record":
        return Record(record=_record(body), id=request_id)
    if kind == "keys":
        return Keys(
            keys=tuple(KeyListing.from_wire(v) for v in _list(body, "keys")),
            cursor=_str(body, "cursor", required=False),
            id=request_id,
        )
    if kind == "events":
        return Events(
            key=_str(body, "key"),
            events=tuple(KeyEvent.from_wire(v) for v in _list(body, "events")),
            id=request_id,
        )
    if kind in ("attached", "pong"):
        return Empty(type=kind, id=request_id)
    if kind == "error":
        return Error(
            code=_str(body, "code"),
            message=_str(body, "message"),
            key=_str(body, "key", required=False),
            holder=_holder(body),
            id=request_id,
            holders=_holders(body),
        )
    if kind == "lost":
        event = LostEvent(
            lease_id=_str(body, "lease_id"),
            key=_str(body, "key"),
            reason=_str(body, "reason"),
            message=_str(body, "message"),
            holder=_holder(body),
        )
        return Lost(event=event, id=request_id)
    if kind == "forcing":
        return Forcing(
            key=_str(body, "key"),
            wait_ms=_int(body, "wait_ms", required=False),
            holder=_holder(body),
            id=request_id,
        )
    if kind == "renewed":
        return Renewed(
            lease_id=_str(body, "lease_id"),
            valid_for_ms=_int(body, "valid_for_ms"),
            id=request_id,
        )
    if kind == "restarting":
        return Restarting(id=request_id)
    return Unknown(type=kind, id=request_id, body=body)
