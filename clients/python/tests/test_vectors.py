"""The protocol's golden vectors (protocol/vectors/): every agent message
decodes to what the vectors README's JSON says, every client message this
package builds encodes to the canonical bytes, and the framing matches
frame-ping.bin.
"""

from __future__ import annotations

import json
import re
import socket
import struct
from pathlib import Path
from typing import Any, Dict

import msgpack
import pytest

import runlock
from runlock import _wire, messages
from runlock.errors import ProtocolError
from runlock.messages import Grant

VECTORS = Path(__file__).resolve().parent.parent.parent.parent / "protocol" / "vectors"


def readme_values() -> Dict[str, Any]:
    """Maps each vector's file name to the JSON value its README section gives."""
    text = (VECTORS / "README.md").read_text()
    sections = re.findall(r"^### `([^`]+)`\n(.*?)(?=^### |\Z)", text, re.S | re.M)
    values = {}
    for name, body in sections:
        block = re.search(r"```json\n(.*?)\n```", body, re.S)
        assert block, f"README has no JSON for {name}"
        values[name] = json.loads(block.group(1))
    return values


VALUES = readme_values()
CANONICAL = sorted(p.name for p in VECTORS.glob("*.msgpack"))
DECODE_ONLY = sorted("decode-only/" + p.name for p in (VECTORS / "decode-only").glob("*.msgpack"))


def test_every_vector_file_is_described() -> None:
    assert CANONICAL and DECODE_ONLY
    for name in CANONICAL + DECODE_ONLY + ["frame-ping.bin"]:
        assert name in VALUES, f"{name} missing from the vectors README"


@pytest.mark.parametrize("name", CANONICAL + DECODE_ONLY)
def test_vector_decodes_to_the_readme_value(name: str) -> None:
    assert _wire.decode_body((VECTORS / name).read_bytes()) == VALUES[name]


@pytest.mark.parametrize("name", CANONICAL)
def test_canonical_vector_reencodes_byte_for_byte(name: str) -> None:
    raw = (VECTORS / name).read_bytes()
    assert _wire.encode_body(_wire.decode_body(raw)) == raw


# Each client vector, built with this package's request builders rather than
# from the decoded map, so the builders' field order is what is checked.
BUILT = {
    "client-hello.msgpack": lambda: messages.hello("runlock 0.1.0", 4242),
    "client-hello-takes-locks.msgpack": lambda: messages.hello(
        "runlock 0.1.0", 4242, takes_locks=True
    ),
    "client-acquire-minimal.msgpack": lambda: messages.acquire(1, ["dev:tap-x-to-target-y"]),
    "client-acquire-full.msgpack": lambda: messages.acquire(
        2,
        ["dev:b", "dev:a"],
        ttl_ms=30000,
        wait_ms=60000,
        force=True,
        command="meltano run tap-x target-y",
        on_lost="kill",
    ),
    "client-release-lease-ids.msgpack": lambda: messages.release(
        3, lease_ids=["lease-0001", "lease-0002"]
    ),
    "client-release-key.msgpack": lambda: messages.release(4, key="dev:a"),
    "client-acquire-slots.msgpack": lambda: messages.acquire(
        11, ["warehouse"], wait_ms=60000, command="meltano run tap-x target-y", slots=3
    ),
    "client-release-key-slot.msgpack": lambda: messages.release(12, key="warehouse", slot=2),
    "client-attach.msgpack": lambda: messages.attach(5, 4300, 4300),
    "client-reattach.msgpack": lambda: messages.reattach(
        9, [Grant("dev:a", "lease-0001", 12)], on_lost="term"
    ),
    "client-list.msgpack": lambda: messages.simple(6, "list"),
    "client-inspect.msgpack": lambda: messages.inspect(7, "dev:a"),
    "client-ping.msgpack": lambda: messages.simple(8, "ping"),
    "client-history.msgpack": lambda: messages.history(10, "dev:a", limit=3),
    "client-list_keys.msgpack": lambda: messages.list_keys(
        11, "dev:", '{"page":"token-2"}', free=True, events_since_ms=1700000000000
    ),
}


def test_every_client_vector_has_a_builder() -> None:
    assert sorted(BUILT) == [n for n in CANONICAL if n.startswith("client-")]


@pytest.mark.parametrize("name", sorted(BUILT))
def test_built_request_matches_canonical_bytes(name: str) -> None:
    assert _wire.encode_body(BUILT[name]()) == (VECTORS / name).read_bytes()


def parse(name: str) -> messages.AgentMessage:
    return messages.parse_agent(_wire.decode_body((VECTORS / name).read_bytes()))


@pytest.mark.parametrize(
    "name",
    [n for n in CANONICAL + DECODE_ONLY if n.split("/")[-1].startswith("agent-")],
)
def test_agent_vector_parses_into_a_typed_message(name: str) -> None:
    message = parse(name)
    value = VALUES[name]
    assert message.id == value.get("id")
    if value["type"] in ("moved",):
        assert isinstance(message, messages.Unknown)
    else:
        assert not isinstance(message, messages.Unknown)


def test_holder_fields() -> None:
    error = parse("agent-error-held.msgpack")
    assert isinstance(error, messages.Error)
    exc = error.exception()
    assert type(exc) is runlock.Held and exc.key == "dev:tap-x-to-target-y"
    assert exc.holder == runlock.Holder(
        host="runner-01",
        agent_id="5b0e7c1a-3f4d-4e8a-9c2b-7d1e6f0a4b3c",
        pid=4242,
        uid=1000,
        gid=1000,
        user="etl",
        command="meltano run tap-x target-y",
        acquired_at_ms=1700000000000,
        token=41,
    )


def test_error_codes_map_to_exceptions() -> None:
    timeout = parse("agent-error-timeout.msgpack").exception()  # type: ignore[union-attr]
    assert type(timeout) is runlock.Timeout and isinstance(timeout, runlock.Held)
    assert timeout.holder is not None and timeout.holder.token == 12
    invalid = parse("agent-error-invalid-key.msgpack").exception()  # type: ignore[union-attr]
    assert type(invalid) is runlock.InvalidKey and invalid.key == "dev\nx"
    unknown = parse("decode-only/agent-error-unknown-code.msgpack").exception()  # type: ignore[union-attr]
    assert type(unknown) is runlock.RunlockError and unknown.code == "quota_exceeded"
    assert unknown.message == "too many"


def test_welcome_acquired_record_lost_renewed() -> None:
    welcome = parse("agent-welcome.msgpack")
    assert isinstance(welcome, messages.Welcome)
    assert welcome.leases_survive_agent is True and welcome.default_ttl_ms == 60000
    acquired = parse("agent-acquired.msgpack")
    assert isinstance(acquired, messages.Acquired)
    assert acquired.leases == (Grant("dev:a", "lease-0001", 12), Grant("dev:b", "lease-0002", 3))
    assert acquired.valid_for_ms == 25000
    assert acquired.locks == 0  # absent: no descriptors came with it
    with_locks = parse("agent-acquired-locks.msgpack")
    assert with_locks == messages.Acquired(
        leases=(Grant("dev:a", "lease-0001", 12),), ttl_ms=30000, valid_for_ms=None, id=2, locks=1
    )
    free = parse("agent-record-free.msgpack")
    assert isinstance(free, messages.Record)
    assert free.record == runlock.KeyRecord(key="dev:a", state="free", token=12, scope="global")
    held = parse("agent-record-held-file.msgpack")
    assert isinstance(held, messages.Record) and held.record.holder is not None
    assert held.record.expires_in_ms is None and held.record.scope == "host"
    leases = parse("agent-leases.msgpack")
    assert isinstance(leases, messages.Leases)
    assert [lease.child_pid for lease in leases.leases] == [4300, None]
    lost = parse("agent-lost-forced.msgpack")
    assert isinstance(lost, messages.Lost) and lost.event.reason == "forced"
    assert lost.event.holder is not None and lost.event.holder.token == 13
    expired = parse("agent-lost-expired.msgpack")
    assert isinstance(expired, messages.Lost) and expired.event.holder is None
    forcing = parse("agent-forcing.msgpack")
    assert isinstance(forcing, messages.Forcing) and forcing.wait_ms == 33000
    assert forcing.holder is not None and forcing.holder.token == 12
    assert "at most 33s" in forcing.describe() and "ann@runner-01" in forcing.describe()
    unbounded = parse("agent-forcing-no-deadline.msgpack")
    assert isinstance(unbounded, messages.Forcing) and unbounded.wait_ms is None
    assert "no deadline" in unbounded.describe()
    renewed = parse("agent-renewed.msgpack")
    assert renewed == messages.Renewed(lease_id="lease-0001", valid_for_ms=25000)
    assert parse("decode-only/agent-pong-unknown-fields.msgpack") == messages.Empty("pong", 8)


def test_frame_ping_bin() -> None:
    raw = (VECTORS / "frame-ping.bin").read_bytes()
    assert _wire.encode_frame(messages.simple(1, "ping")) == raw
    left, right = socket.socketpair()
    with left, right:
        left.sendall(raw)
        body = _wire.read_frame(right)
        assert body is not None and _wire.decode_body(body) == VALUES["frame-ping.bin"]
        left.close()
        assert _wire.read_frame(right) is None  # clean end-of-file between frames


def test_oversized_frames_are_refused_both_ways() -> None:
    with pytest.raises(ProtocolError):
        _wire.encode_frame({"type": "inspect", "key": "x" * _wire.MAX_BODY_LEN})
    left, right = socket.socketpair()
    with left, right:
        # Only the header is sent: the reader must refuse before reading a body.
        left.sendall(struct.pack(">I", _wire.MAX_BODY_LEN + 1))
        with pytest.raises(ProtocolError):
            _wire.read_frame(right)


def test_strings_go_in_the_str_family_and_bytes_are_refused() -> None:
    # SPEC 3.2: str, never bin. 80 bytes of UTF-8 take str 8 (d9), not bin 8 (c4).
    body = _wire.encode_body({"type": "inspect", "key": "\u00e9" * 40})
    assert b"\xd9\x50" + "\u00e9".encode() * 40 in body and b"\xc4" not in body
    for bad in [b"k", bytearray(b"k"), 1.5, -1, 1 << 64, {1: "x"}]:
        with pytest.raises(ValueError):
            _wire.encode_body({"type": "inspect", "key": bad})


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 18446744073709552.0])
def test_a_duration_the_wire_cannot_carry_is_refused_before_connecting(seconds: float) -> None:
    # No agent at this socket: the ValueError shows nothing was sent.
    with pytest.raises(ValueError):
        runlock.lock("k", ttl=seconds, socket="/nonexistent/agent.sock")
    if seconds == float("inf"):
        return  # a wait without bound, as the shim's --wait infinity (test_agent)
    with pytest.raises(ValueError):
        runlock.lock("k", wait=seconds, socket="/nonexistent/agent.sock")


def test_truncated_frame_is_a_protocol_error() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(struct.pack(">I", 10) + b"\x82")
        left.close()
        with pytest.raises(ProtocolError):
            _wire.read_frame(right)


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb([1, 2]),  # not a map
        b"\x82\xa4type\xa4pong\xa4type\xa4pong",  # a key twice
        b"\x81\x01\x02",  # a non-string key
        b"\x81\xa4type\xa4pong\x00",  # bytes after the map
    ],
)
def test_undecodable_bodies(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        _wire.decode_body(body)


@pytest.mark.parametrize(
    "body",
    [
        {"type": "released"},  # required field missing
        {"type": "released", "count": -1},  # negative
        {"type": "released", "count": True},  # a bool is not an integer
        {"type": "released", "count": 1 << 32},  # over uint32
        {"type": "renewed", "lease_id": 3, "valid_for_ms": 1},  # wrong type
    ],
)
def test_bad_fields_are_protocol_errors(body: Dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        messages.parse_agent(body)


def test_history_events_and_incident() -> None:
    events = parse("agent-events.msgpack")
    assert isinstance(events, messages.Events) and events.key == "dev:a"
    assert [e.kind for e in events.events] == ["granted", "forced", "released"]
    forced = events.events[1]
    assert (forced.token, forced.from_token, forced.clock, forced.user) == (13, 12, "store", "root")
    assert events.events[0].from_token is None and events.events[0].reason == ""
    assert events.events[2].reason == "its run ended"
    record = parse("agent-record-held-incident.msgpack")
    assert isinstance(record, messages.Record)
    assert record.record.incident == forced
    assert parse("agent-record-held.msgpack").record.incident is None  # type: ignore[union-attr]


def test_a_listing_says_how_many_events_it_left_out() -> None:
    whole = parse("agent-keys.msgpack")
    assert isinstance(whole, messages.Keys)
    assert [k.events_omitted for k in whole.keys] == [0, 0]
    cut = parse("agent-keys-events-omitted.msgpack")
    assert isinstance(cut, messages.Keys) and cut.cursor is None
    assert cut.keys[0].events_omitted == 2047 and len(cut.keys[0].events) == 1


def slot_holder(pid: int, token: int, slot: int, slots: int) -> runlock.Holder:
    """A holder of the slot vectors, which differ only in these fields."""
    return runlock.Holder(
        host="runner-01",
        agent_id="5b0e7c1a-3f4d-4e8a-9c2b-7d1e6f0a4b3c",
        pid=pid,
        uid=1000,
        gid=1000,
        user="etl",
        command="meltano run tap-x target-y",
        acquired_at_ms=1700000000000,
        token=token,
        slot=slot,
        slots=slots,
    )


def test_a_plain_key_has_no_slot_anywhere() -> None:
    acquired = parse("agent-acquired.msgpack")
    assert isinstance(acquired, messages.Acquired)
    assert [g.slot for g in acquired.leases] == [None, None]
    error = parse("agent-error-held.msgpack")
    assert isinstance(error, messages.Error) and error.holders == ()
    exc = error.exception()
    assert isinstance(exc, runlock.Held) and exc.holders == []
    assert exc.holder is not None and (exc.holder.slot, exc.holder.slots) == (None, None)
    record = parse("agent-record-held.msgpack")
    assert isinstance(record, messages.Record)
    assert record.record.slots is None and record.record.holders == ()
    events = parse("agent-events.msgpack")
    assert isinstance(events, messages.Events) and {e.slot for e in events.events} == {None}


def test_slot_grant_record_and_errors() -> None:
    acquired = parse("agent-acquired-slot.msgpack")
    assert isinstance(acquired, messages.Acquired)
    assert acquired.leases == (Grant("warehouse", "lease-0007", 5, slot=1),)

    record = parse("agent-record-slots.msgpack")
    assert isinstance(record, messages.Record)
    first, third = slot_holder(4242, 9, 0, 3), slot_holder(4250, 4, 2, 3)
    assert record.record == runlock.KeyRecord(
        key="warehouse",
        state="held",
        token=9,
        scope="global",
        holder=first,
        expires_in_ms=29000,
        slots=3,
        holders=(first, third),
    )

    held = parse("agent-error-held-slots.msgpack").exception()  # type: ignore[union-attr]
    assert type(held) is runlock.Held and held.key == "warehouse"
    assert held.holders == [slot_holder(4242, 9, 0, 2), slot_holder(4250, 5, 1, 2)]
    assert held.holder == held.holders[0]

    mismatch = parse("agent-error-slots-mismatch.msgpack").exception()  # type: ignore[union-attr]
    assert type(mismatch) is runlock.SlotsMismatch and mismatch.code == "slots_mismatch"
    assert isinstance(mismatch, runlock.BadRequest) and not isinstance(mismatch, runlock.Held)
    assert mismatch.key == "warehouse" and mismatch.held_with == 5
    assert mismatch.holders == [slot_holder(4242, 9, 0, 5)] and mismatch.holder == mismatch.holders[0]
    assert "5 slots" in mismatch.message and "asks 3 slots" in mismatch.message


def test_a_slot_lease_is_reattached_with_its_slot() -> None:
    # The next agent must adopt the slot's own record, so the slot travels
    # with the lease (SPEC 7.2), after the fields a plain lease has.
    request = messages.reattach(9, [Grant("warehouse", "lease-0007", 5, slot=1)])
    assert request["leases"] == [{"key": "warehouse", "lease_id": "lease-0007", "token": 5, "slot": 1}]
    assert list(request["leases"][0]) == ["key", "lease_id", "token", "slot"]


@pytest.mark.parametrize(
    "body",
    [
        {"type": "acquired", "ttl_ms": 1, "leases": [{"key": "k", "lease_id": "l", "token": 1, "slot": -1}]},
        {"type": "acquired", "ttl_ms": 1, "leases": [{"key": "k", "lease_id": "l", "token": 1, "slot": 1 << 32}]},
        {"type": "record", "key": "k", "state": "free", "token": 0, "scope": "host", "slots": "3"},
        {"type": "record", "key": "k", "state": "free", "token": 0, "scope": "host", "holders": {}},
        {"type": "error", "code": "held", "message": "m", "holders": [1]},
    ],
)
def test_bad_slot_fields_are_protocol_errors(body: Dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        messages.parse_agent(body)


def test_slots_and_slot_the_wire_cannot_carry_are_refused_before_connecting() -> None:
    for bad in [-1, 1 << 32, True, 3.0, "3"]:
        with pytest.raises(ValueError):
            runlock.lock("k", slots=bad, socket="/nonexistent/agent.sock")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            runlock.break_lock("k", slot=bad, socket="/nonexistent/agent.sock")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        messages.release(1, lease_ids=["l"], slot=0)
