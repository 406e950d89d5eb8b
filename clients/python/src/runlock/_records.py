"""The objects nested in agent messages (SPEC section 7.2): holders,
grants, leases, events, key records and listings, as frozen dataclasses,
which ``_fields.decode`` reads from the wire as their fields' types say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

from ._fields import U32


@dataclass(frozen=True)
class Holder:
    """Who holds a lease (SPEC 7.1), as the agent recorded it from SO_PEERCRED."""

    host: str
    agent_id: str
    pid: int = field(metadata=U32)
    uid: int = field(metadata=U32)
    #: 0 from an agent that did not send it.
    gid: int = field(metadata={**U32, "absent": 0})
    user: str
    command: str
    acquired_at_ms: int
    token: int
    #: For a key with slots: the slot held (0-based) and how many slots the
    #: holder took the key with; None for a plain key.
    slot: Optional[int] = field(default=None, metadata=U32)
    slots: Optional[int] = field(default=None, metadata=U32)


@dataclass(frozen=True)
class Grant:
    """One key granted by ``acquire`` (SPEC 7.2 ``Lease``); ``slot`` is the
    slot granted (0-based) for a key with slots, None for a plain key, and
    ``token`` then that slot's own fencing token."""

    key: str
    lease_id: str
    token: int
    slot: Optional[int] = field(default=None, metadata=U32)


@dataclass(frozen=True)
class LeaseInfo:
    """One lease as ``status()`` (the ``list`` request) reports it (SPEC 7.3)."""

    key: str
    lease_id: str
    ttl_ms: int
    holder: Holder
    child_pid: Optional[int] = field(default=None, metadata=U32)


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
    pid: int = field(metadata=U32)
    uid: int = field(metadata=U32)
    user: str
    from_token: Optional[int] = None
    reason: str = ""
    slot: Optional[int] = field(default=None, metadata=U32)


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
    slots: Optional[int] = field(default=None, metadata=U32)
    holders: Tuple[Holder, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """An acquire an agent refused because its key was held (SPEC 7.8)."""

    at_ms: int
    uid: int = field(metadata=U32)
    user: str
    pid: int = field(metadata=U32)
    waited_ms: int = 0
    #: The host of the agent that refused it.
    host: str = ""


@dataclass(frozen=True)
class Waiter:
    """An acquire waiting for a key, through any agent (SPEC 7.8)."""

    host: str
    uid: int = field(metadata=U32)
    user: str
    pid: int = field(metadata=U32)
    since_ms: int


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
    #: How many older events were left out so that the key fits one frame.
    events_omitted: int = field(default=0, metadata=U32)
    #: How many acquires wait for it through the answering agent.
    waiting_here: int = field(default=0, metadata=U32)
    #: The acquires waiting for it through any agent, longest waiting first.
    waiters: Tuple[Waiter, ...] = ()
    #: The acquires of it any agent refused since ``events_since_ms``, oldest first.
    refused: Tuple[Refusal, ...] = ()

