"""Framing and body encoding (SPEC sections 2 and 3): a 4-byte big-endian
length, then one MessagePack map. This is the only module that touches bytes,
and the descriptors that arrive with them (SPEC 5.4).
"""

from __future__ import annotations

import array
import os
import socket
import struct
import time
from typing import Any, Dict, List, Optional, Tuple

import msgpack

from .errors import ProtocolError

#: Largest body either side may send (SPEC 2): 1 MiB.
MAX_BODY_LEN = 1 << 20

_LEN = struct.Struct(">I")

#: The agent passes at most this many descriptors per message (SPEC 5.4), so
#: one recvmsg with room for them never has the kernel drop any.
MAX_FDS_PER_MESSAGE = 250
_FD_ROOM = socket.CMSG_SPACE(MAX_FDS_PER_MESSAGE * array.array("i").itemsize)


_MAX_UINT = (1 << 64) - 1


def _check_wire_value(value: Any, where: str) -> None:
    """Refuses what SPEC 3.2 has no place for, before it reaches the agent as
    an undecodable body: bytes (bin, where the protocol only has str), floats,
    negative or over-u64 integers, and maps with non-str keys."""
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        if not 0 <= value <= _MAX_UINT:
            raise ValueError(f"{where}: {value} is not an unsigned 64-bit integer")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where}: map key {key!r} is not a str")
            _check_wire_value(item, f"{where}.{key}")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_wire_value(item, f"{where}[{index}]")
        return
    raise ValueError(f"{where}: a {type(value).__name__} cannot be sent (SPEC 3.2)")


def encode_body(message: Dict[str, Any]) -> bytes:
    """Encodes one map, keeping the dict's insertion order.

    Callers build dicts in the reference encoder's field order (``id``,
    ``type``, then the SPEC tables' order), which reproduces the vectors byte
    for byte; msgpack already picks the smallest integer format.
    ``use_bin_type`` keeps str in the str family (SPEC 3.2: never bin); bytes,
    which would be bin, are refused with the rest of what SPEC has no place for.
    """
    _check_wire_value(message, "message")
    body: bytes = msgpack.packb(message, use_bin_type=True)
    return body


def _pairs_to_dict(pairs: List[Tuple[Any, Any]]) -> Dict[str, Any]:
    # SPEC 3.1: string keys only, and no key twice (the agent treats both as
    # undecodable, and so do we rather than silently keep the last value).
    result: Dict[str, Any] = {}
    for key, value in pairs:
        if not isinstance(key, str):
            raise ProtocolError(f"map key {key!r} is not a string")
        if key in result:
            raise ProtocolError(f"map key {key!r} appears twice")
        result[key] = value
    return result


def decode_body(body: bytes) -> Dict[str, Any]:
    """Decodes one body into a dict (field order preserved).

    Raises ProtocolError when it is not exactly one map with string keys.
    """
    try:
        value = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=False,  # checked in _pairs_to_dict with a clearer message
            object_pairs_hook=_pairs_to_dict,
        )
    except ProtocolError:
        raise
    except (ValueError, msgpack.UnpackException) as err:  # ExtraData, FormatError, bad UTF-8...
        raise ProtocolError(f"cannot decode message: {err}") from err
    if not isinstance(value, dict):
        raise ProtocolError("cannot decode message: not a MessagePack map")
    return value


def encode_frame(message: Dict[str, Any]) -> bytes:
    """Encodes a message with its length prefix; refuses bodies over 1 MiB (SPEC 2)."""
    body = encode_body(message)
    if len(body) > MAX_BODY_LEN:
        raise ProtocolError(f"message of {len(body)} bytes is over the {MAX_BODY_LEN}-byte limit")
    return _LEN.pack(len(body)) + body


def close_fds(fds: List[int]) -> None:
    """Closes descriptors this client will not keep (a failure leaves nothing to undo)."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _recv(sock: socket.socket, count: int, fds: List[int]) -> bytes:
    """One ``recvmsg`` of at most ``count`` bytes, adding the descriptors that
    came with them to ``fds``.

    A plain ``recv`` would have the kernel discard them. They are received
    close-on-exec, so no subprocess inherits one unless asked to (pass_fds).
    """
    data, ancillary, _flags, _addr = sock.recvmsg(count, _FD_ROOM, socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            # A truncated control message can end in part of an int: not a descriptor.
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
            fds.extend(received)
    return data


def _read_exactly(
    sock: socket.socket, count: int, fds: List[int], deadline: Optional[float] = None
) -> Optional[bytes]:
    """Reads ``count`` bytes; None on end-of-file before the first byte.
    Descriptors that arrive with them are added to ``fds``.

    Each read asks for no more than the bytes still missing, so every byte
    read, and every descriptor, belongs to this frame: the kernel hands
    descriptors over with the first byte read of the message that carried
    them, and ends that read with the message.

    With a ``deadline`` (a ``time.monotonic()`` value) the whole read ends by
    then with ``socket.timeout``, however slowly the bytes trickle in.
    """
    chunks = []
    remaining = count
    while remaining:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            sock.settimeout(left)
        chunk = _recv(sock, min(remaining, 65536), fds)
        if not chunk:
            if remaining == count:
                return None
            raise ProtocolError("connection closed in the middle of a frame")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame_fds(
    sock: socket.socket, deadline: Optional[float] = None
) -> Optional[Tuple[bytes, List[int]]]:
    """Reads one frame: its body and the descriptors passed with its bytes
    (SPEC 5.4), which the caller owns and must keep or close. None when the
    agent closed the connection cleanly. ``deadline`` bounds the whole frame
    (see ``_read_exactly``).

    The length is checked before anything of the body is read or allocated
    (SPEC 2): an oversized frame raises ProtocolError and the caller must drop
    the connection, since the stream cannot be resynchronised.
    """
    fds: List[int] = []
    try:
        header = _read_exactly(sock, _LEN.size, fds, deadline)
        if header is None:
            close_fds(fds)
            return None
        (length,) = _LEN.unpack(header)
        if length > MAX_BODY_LEN:
            raise ProtocolError(
                f"agent sent a {length}-byte frame, over the {MAX_BODY_LEN}-byte limit"
            )
        body = _read_exactly(sock, length, fds, deadline)
        if body is None:
            raise ProtocolError("connection closed in the middle of a frame")
    except BaseException:
        close_fds(fds)
        raise
    return body, fds


def read_frame(sock: socket.socket, deadline: Optional[float] = None) -> Optional[bytes]:
    """As :func:`read_frame_fds`, for a frame that may carry no descriptor:
    any that came with it are closed at once."""
    frame = read_frame_fds(sock, deadline)
    if frame is None:
        return None
    body, fds = frame
    close_fds(fds)
    return body
