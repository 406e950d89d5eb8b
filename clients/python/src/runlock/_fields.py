"""Readers of an agent body's fields: each checks the wire type and range
and raises ProtocolError for a missing required field or a wrong type.
"""

from __future__ import annotations

from typing import Any, Dict, List

from .errors import ProtocolError

_U16 = (1 << 16) - 1
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


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
