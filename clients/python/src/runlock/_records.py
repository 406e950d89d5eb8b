"""The objects nested in agent messages (SPEC section 7.2): holders,
grants, leases, events, key records and listings, as frozen dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ._fields import _U32, _field, _int, _list, _map, _str


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
