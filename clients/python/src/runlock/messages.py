"""The protocol's messages (SPEC sections 6 and 7) as Python values.

Requests are built as dicts in the reference encoder's field order, so they
encode to the vectors' exact bytes. Agent messages are parsed into frozen
dataclasses; unknown fields are ignored and unknown enum values kept as the
string they are (SPEC 3.3), while a missing required field or a value of the
wrong type raises ProtocolError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import errors
from .errors import ProtocolError

PROTOCOL_VERSION = 1

_U16 = (1 << 16) - 1
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1

# --------------------------------------------------------------------------- requests


def _with_id(request_id: Optional[int], kind: str) -> Dict[str, Any]:
    message: Dict[str, Any] = {}
    if request_id is not None:
        message["id"] = request_id
    message["type"] = kind
    return message


def hello(
    client: str, pid: int, request_id: Optional[int] = None, *, takes_locks: bool = False
) -> Dict[str, Any]:
    """``hello``: the first message of every connection. ``takes_locks`` is
    written only when true, so a plain hello keeps its vector's bytes."""
    message = _with_id(request_id, "hello")
    message.update(version=PROTOCOL_VERSION, client=client, pid=pid)
    if takes_locks:
        message["takes_locks"] = True
    return message


def acquire(
    request_id: int,
    keys: Sequence[str],
    *,
    ttl_ms: Optional[int] = None,
    wait_ms: Optional[int] = None,
    force: Optional[bool] = None,
    command: str = "",
    on_lost: str = "term",
    slots: int = 1,
) -> Dict[str, Any]:
    """``acquire``. Optional fields left as None are omitted, as the reference
    encoder omits them; ``command`` and ``on_lost`` are always written, as it
    does; ``slots`` only when not 1 (a plain key), so plain keys keep their bytes."""
    message = _with_id(request_id, "acquire")
    message["keys"] = list(keys)
    if ttl_ms is not None:
        message["ttl_ms"] = ttl_ms
    if wait_ms is not None:
        message["wait_ms"] = wait_ms
    if force is not None:
        message["force"] = force
    message["command"] = command
    message["on_lost"] = on_lost
    if slots != 1:
        message["slots"] = slots
    return message


def release(
    request_id: int,
    *,
    lease_ids: Optional[Sequence[str]] = None,
    key: Optional[str] = None,
    slot: Optional[int] = None,
) -> Dict[str, Any]:
    """``release``: exactly one of a non-empty ``lease_ids`` or a ``key`` (to
    break); with ``key``, ``slot`` names the one slot to break."""
    if bool(lease_ids) == (key is not None):
        raise ValueError("release needs either lease_ids or key, not both")
    if slot is not None and key is None:
        raise ValueError("release: slot goes with key")
    message = _with_id(request_id, "release")
    if lease_ids:
        message["lease_ids"] = list(lease_ids)
    else:
        message["key"] = key
        if slot is not None:
            message["slot"] = slot
    return message


def attach(request_id: int, pid: int, pgid: int) -> Dict[str, Any]:
    """``attach``: names the process (group) that ``on_lost`` acts on."""
    message = _with_id(request_id, "attach")
    message.update(pid=pid, pgid=pgid)
    return message


def reattach(request_id: int, leases: Sequence["Grant"], on_lost: str = "term") -> Dict[str, Any]:
    """``reattach`` (SPEC 8.7): has the next agent adopt leases taken through
    one that has stopped."""
    message = _with_id(request_id, "reattach")
    message["leases"] = [_lease(g) for g in leases]
    message["on_lost"] = on_lost
    return message


def _lease(grant: "Grant") -> Dict[str, Any]:
    # A slot's lease names its slot, so the next agent adopts that slot's record.
    lease: Dict[str, Any] = {"key": grant.key, "lease_id": grant.lease_id, "token": grant.token}
    if grant.slot is not None:
        lease["slot"] = grant.slot
    return lease


def simple(request_id: int, kind: str) -> Dict[str, Any]:
    """A request without fields: ``list`` or ``ping``."""
    return _with_id(request_id, kind)


def inspect(request_id: int, key: str) -> Dict[str, Any]:
    """``inspect``: read a key's record in the backend."""
    message = _with_id(request_id, "inspect")
    message["key"] = key
    return message


def history(request_id: int, key: str, limit: Optional[int] = None) -> Dict[str, Any]:
    """``history``: the latest events of a key (all the record keeps when ``limit`` is None)."""
    message = _with_id(request_id, "history")
    message["key"] = key
    if limit is not None:
        message["limit"] = limit
    return message


def list_keys(
    request_id: int,
    prefix: str = "",
    cursor: Optional[str] = None,
    free: bool = False,
    events_since_ms: Optional[int] = None,
) -> Dict[str, Any]:
    """``list_keys``: one page of the keys the store records, from every host."""
    message = _with_id(request_id, "list_keys")
    if prefix:
        message["prefix"] = prefix
    if cursor is not None:
        message["cursor"] = cursor
    if free:
        message["free"] = True
    if events_since_ms is not None:
        message["events_since_ms"] = events_since_ms
    return message


# --------------------------------------------------------------------------- field readers


def _field(body: Dict[str, Any], name: str, required: bool) -> Any:
    if name not in body:
        if required:
            raise ProtocolError(f"{body.get('type', 'message')!s}: missing field {name!r}")
        return None
    return body[name]


def _int(body: Dict[str, Any], name: str, *, required: bool = True, limit: int = _U64) -> Any:
    value = _field(body, name, required)
    if value is None and not required:
        return None
    # bool is an int subclass in Python, but never an integer on the wire.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ProtocolError(f"field {name!r}: {value!r} is not an unsigned integer in range")
    return value


def _str(body: Dict[str, Any], name: str, *, required: bool = True) -> Any:
    value = _field(body, name, required)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ProtocolError(f"field {name!r}: {value!r} is not a string")
    return value


def _bool(body: Dict[str, Any], name: str, default: bool) -> bool:
    value = _field(body, name, False)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ProtocolError(f"field {name!r}: {value!r} is not a boolean")
    return value


def _map(value: Any, what: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what}: {value!r} is not a map")
    return value


def _list(body: Dict[str, Any], name: str) -> List[Any]:
    value = _field(body, name, True)
    if not isinstance(value, list):
        raise ProtocolError(f"field {name!r}: {value!r} is not an array")
    return value


# --------------------------------------------------------------------------- nested objects


@dataclass(frozen=True)
class Holder:
    """Who holds a lease (SPEC 7.1), as the agent recorded it from SO_PEERCRED."""

    host: str
    agent_id: str
    pid: int
    uid: int
    gid: int
    user: str
    command: str
    acquired_at_ms: int
    token: int
    #: For a key with slots: the slot held (0-based) and how many slots the
    #: holder took the key with; None for a plain key.
    slot: Optional[int] = None
    slots: Optional[int] = None

    @classmethod
    def from_wire(cls, value: Any) -> "Holder":
        body = _map(value, "holder")
        return cls(
            host=_str(body, "host"),
            agent_id=_str(body, "agent_id"),
            pid=_int(body, "pid", limit=_U32),
            uid=_int(body, "uid", limit=_U32),
            gid=_int(body, "gid", required=False, limit=_U32) or 0,
            user=_str(body, "user"),
            command=_str(body, "command"),
            acquired_at_ms=_int(body, "acquired_at_ms"),
            token=_int(body, "token"),
            slot=_int(body, "slot", required=False, limit=_U32),
            slots=_int(body, "slots", required=False, limit=_U32),
        )


def _holder(body: Dict[str, Any]) -> Optional[Holder]:
    value = _field(body, "holder", False)
    return None if value is None else Holder.from_wire(value)


def _holders(body: Dict[str, Any]) -> Tuple[Holder, ...]:
    """``holders``: every held slot's holder, for a key with slots (absent: none)."""
    if _field(body, "holders", False) is None:
        return ()
    return tuple(Holder.from_wire(v) for v in _list(body, "holders"))


def _incident(body: Dict[str, Any]) -> Optional[KeyEvent]:
    value = _field(body, "incident", False)
    return None if value is None else KeyEvent.from_wire(value)


@dataclass(frozen=True)
class Grant:
    """One key granted by ``acquire`` (SPEC 7.2 ``Lease``); ``slot`` is the
    slot granted (0-based) for a key with slots, None for a plain key, and
    ``token`` then that slot's own fencing token."""

    key: str
    lease_id: str
    token: int
    slot: Optional[int] = None

    @classmethod
    def from_wire(cls, value: Any) -> "Grant":
        body = _map(value, "lease")
        return cls(
            key=_str(body, "key"),
            lease_id=_str(body, "lease_id"),
            token=_int(body, "token"),
            slot=_int(body, "slot", required=False, limit=_U32),
        )


@dataclass(frozen=True)
class LeaseInfo:
    """One lease as ``status()`` (the ``list`` request) reports it (SPEC 7.3)."""

    key: str
    lease_id: str
    ttl_ms: int
    holder: Holder
    child_pid: Optional[int] = None

    @classmethod
    def from_wire(cls, value: Any) -> "LeaseInfo":
        body = _map(value, "lease")
        return cls(
            key=_str(body, "key"),
            lease_id=_str(body, "lease_id"),
            ttl_ms=_int(body, "ttl_ms"),
            holder=Holder.from_wire(_field(body, "holder", True)),
            child_pid=_int(body, "child_pid", required=False, limit=_U32),
        )


@dataclass(frozen=True)
class KeyEvent:
    """One entry of a key's history (SPEC 7.6): what happened, when (ms since
    the epoch, by ``clock``: ``store`` or ``agent``), to which token, and who
    acted (for ``expired`` and ``lost``: whose lease it was; pid 0 where no
    client acted). ``kind`` is ``granted``, ``released``, ``forced``,
    ``broken``, ``expired``, ``lost`` or ``adopted`` (or a newer agent's
    value, kept as is); ``from_token`` is the token taken over by a force or
    break; ``slot`` the slot it is about, for a key with slots."""

    kind: str
    at_ms: int
    clock: str
    token: int
    host: str
    agent_id: str
    pid: int
    uid: int
    user: str
    from_token: Optional[int] = None
    reason: str = ""
    slot: Optional[int] = None

    @classmethod
    def from_wire(cls, value: Any) -> "KeyEvent":
        body = _map(value, "event")
        return cls(
            kind=_str(body, "kind"),
            at_ms=_int(body, "at_ms"),
            clock=_str(body, "clock"),
            token=_int(body, "token"),
            host=_str(body, "host"),
            agent_id=_str(body, "agent_id"),
            pid=_int(body, "pid", limit=_U32),
            uid=_int(body, "uid", limit=_U32),
            user=_str(body, "user"),
            from_token=_int(body, "from_token", required=False),
            reason=_str(body, "reason", required=False) or "",
            slot=_int(body, "slot", required=False, limit=_U32),
        )


@dataclass(frozen=True)
class KeyRecord:
    """A key's record in the backend, as ``inspect()`` reports it (SPEC 7.4).

    ``state`` is ``"free"`` or ``"held"`` (or a newer agent's value, kept as is);
    ``expires_in_ms`` is None when free and on backends whose locks do not expire.

    For a key with slots, ``slots`` is their count and ``holders`` has one
    :class:`Holder` per held slot (each with its ``slot`` and token), while
    ``state``, ``token``, ``holder`` and ``expires_in_ms`` are the lowest
    held slot's (slot 0's when all are free). For a plain key ``slots`` is
    None and ``holders`` empty.
    """

    key: str
    state: str
    token: int
    scope: str
    holder: Optional[Holder] = None
    expires_in_ms: Optional[int] = None
    #: The key's last force, break, expiry or loss, when its history holds one.
    incident: Optional[KeyEvent] = None
    slots: Optional[int] = None
    holders: Tuple[Holder, ...] = ()


def _record(body: Dict[str, Any]) -> KeyRecord:
    return KeyRecord(
        key=_str(body, "key"),
        state=_str(body, "state"),
        token=_int(body, "token"),
        scope=_str(body, "scope"),
        holder=_holder(body),
        expires_in_ms=_int(body, "expires_in_ms", required=False),
        incident=_incident(body),
        slots=_int(body, "slots", required=False, limit=_U32),
        holders=_holders(body),
    )


@dataclass(frozen=True)
class Refusal:
    """An acquire an agent refused because its key was held (SPEC 7.8)."""

    at_ms: int
    uid: int
    user: str
    pid: int
    waited_ms: int = 0
    #: The host of the agent that refused it.
    host: str = ""

    @classmethod
    def from_wire(cls, value: Any) -> "Refusal":
        body = _map(value, "a refusal")
        return cls(
            at_ms=_int(body, "at_ms"),
            uid=_int(body, "uid", limit=_U32),
            user=_str(body, "user"),
            pid=_int(body, "pid", limit=_U32),
            waited_ms=_int(body, "waited_ms", required=False) or 0,
            host=_str(body, "host", required=False) or "",
        )


@dataclass(frozen=True)
class Waiter:
    """An acquire waiting for a key, through any agent (SPEC 7.8)."""

    host: str
    uid: int
    user: str
    pid: int
    since_ms: int

    @classmethod
    def from_wire(cls, value: Any) -> "Waiter":
        body = _map(value, "a waiter")
        return cls(
            host=_str(body, "host"),
            uid=_int(body, "uid", limit=_U32),
            user=_str(body, "user"),
            pid=_int(body, "pid", limit=_U32),
            since_ms=_int(body, "since_ms"),
        )


@dataclass(frozen=True)
class KeyListing:
    """One key of a ``list_keys()`` listing (SPEC 7.7): its record as
    ``inspect()`` reports it, or why it could not be read (``record`` is then
    None and ``key`` is the store's name for it)."""

    key: str
    record: Optional[KeyRecord] = None
    unreadable: Optional[str] = None
    #: Its events since the ``events_since_ms`` asked for, oldest first.
    events: Tuple[KeyEvent, ...] = ()
    #: How many acquires wait for it through the answering agent.
    waiting_here: int = 0
    #: The acquires waiting for it through any agent, longest waiting first.
    waiters: Tuple[Waiter, ...] = ()
    #: The acquires of it any agent refused since ``events_since_ms``, oldest first.
    refused: Tuple[Refusal, ...] = ()

    @classmethod
    def from_wire(cls, value: Any) -> "KeyListing":
        body = _map(value, "a key listing")
        record = body.get("record")
        return cls(
            key=_str(body, "key"),
            record=None if record is None else _record(_map(record, "a key's record")),
            unreadable=_str(body, "unreadable", required=False),
            events=()
            if _field(body, "events", False) is None
            else tuple(KeyEvent.from_wire(v) for v in _list(body, "events")),
            waiting_here=_int(body, "waiting_here", required=False, limit=_U32) or 0,
            waiters=()
            if _field(body, "waiters", False) is None
            else tuple(Waiter.from_wire(v) for v in _list(body, "waiters")),
            refused=()
            if _field(body, "refused", False) is None
            else tuple(Refusal.from_wire(v) for v in _list(body, "refused")),
        )


# --------------------------------------------------------------------------- agent messages


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
