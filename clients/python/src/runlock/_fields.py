"""Readers of an agent body's fields: each checks the wire type and range
and raises ProtocolError for a missing required field or a wrong type.
``decode`` reads a whole dataclass with them, each field as its type says.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, Dict, List, Tuple, Type, TypeVar

from .errors import ProtocolError

_U16 = (1 << 16) - 1
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1

#: Field metadata for ``decode``: an int's largest value (else unsigned 64
#: bits); ``absent`` is what a field the dataclass requires reads as when an
#: older agent leaves it out.
U32 = {"limit": _U32}


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


T = TypeVar("T")


def decode(cls: Type[T], body: Dict[str, Any], **given: Any) -> T:
    """``cls``, a dataclass, from ``body``; the fields in ``given`` are not
    read. Each other field is read as its type says: ``str``, ``int`` (at
    most its metadata's ``limit``), ``bool``, another such dataclass (a map),
    ``Optional`` of one of those (absent reads as None), or a tuple of
    dataclasses (an array). A field with a default may be absent."""
    values = dict(given)
    fields: Tuple[Tuple[dataclasses.Field[Any], Any], ...] = _fields_of(cls)  # type: ignore[arg-type]
    for f, hint in fields:
        if f.name not in given:
            values[f.name] = _read(body, f, hint)
    return cls(**values)


@functools.lru_cache(maxsize=None)
def _fields_of(cls: type) -> Tuple[Tuple[dataclasses.Field[Any], Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls))


def _read(body: Dict[str, Any], f: dataclasses.Field[Any], hint: Any) -> Any:
    name = f.name
    absent: Any = f.metadata.get("absent", f.default)
    if f.default_factory is not dataclasses.MISSING:
        absent = f.default_factory()
    optional = typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint)
    if optional:
        absent = None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    required = absent is dataclasses.MISSING
    if hint is bool:
        return _bool(body, name, absent)
    if hint is str:
        value = _str(body, name, required=required)
    elif hint is int:
        value = _int(body, name, required=required, limit=f.metadata.get("limit", _U64))
    elif typing.get_origin(hint) is tuple:
        if not required and _field(body, name, False) is None:
            return absent
        item = typing.get_args(hint)[0]
        return tuple(decode(item, _map(v, f"an item of {name!r}")) for v in _list(body, name))
    else:
        raw = _field(body, name, required)
        value = None if raw is None else decode(hint, _map(raw, f"field {name!r}"))
    return absent if value is None else value
