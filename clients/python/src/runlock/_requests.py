"""The requests a client sends (SPEC section 6), built as dicts in the
reference encoder's field order, so they encode to the vectors' exact bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

if TYPE_CHECKING:
    from ._records import Grant

PROTOCOL_VERSION = 1


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
