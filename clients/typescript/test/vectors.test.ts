// The protocol's golden vectors (protocol/vectors/): every body decodes to the
// JSON its README gives, canonical ones re-encode byte for byte, every
// request this package builds matches its vector, and the framing matches
// frame-ping.bin.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { Held, InvalidKey, ProtocolError, RunlockError, SlotsMismatch, Timeout } from "../src/errors.js";
import * as messages from "../src/messages.js";
import type { AgentMessage } from "../src/messages.js";
import { decodeBody, encodeBody, encodeFrame, FrameReader, MAX_BODY_LEN } from "../src/wire.js";
import { VECTORS } from "./agent.js";

/** Each vector's file name → the JSON value its README section gives. */
function readmeValues(): Map<string, unknown> {
  const text = readFileSync(join(VECTORS, "README.md"), "utf8");
  const values = new Map<string, unknown>();
  for (const section of text.split(/^### /m).slice(1)) {
    const name = /^`([^`]+)`/.exec(section)?.[1];
    const json = /```json\n([\s\S]*?)\n```/.exec(section)?.[1];
    assert.ok(name && json, `a README section without a name or JSON: ${section.slice(0, 60)}`);
    values.set(name, JSON.parse(json));
  }
  return values;
}

const VALUES = readmeValues();
const CANONICAL = readdirSync(VECTORS).filter((n) => n.endsWith(".msgpack")).sort();
const DECODE_ONLY = readdirSync(join(VECTORS, "decode-only"))
  .filter((n) => n.endsWith(".msgpack"))
  .map((n) => `decode-only/${n}`)
  .sort();
const raw = (name: string): Uint8Array => new Uint8Array(readFileSync(join(VECTORS, name)));
const parse = (name: string): AgentMessage => messages.parseAgent(decodeBody(raw(name)));

function of<T extends AgentMessage["type"]>(message: AgentMessage, type: T): Extract<AgentMessage, { type: T }> {
  assert.equal(message.type, type);
  return message as Extract<AgentMessage, { type: T }>;
}

test("every vector file is described in the README", () => {
  assert.ok(CANONICAL.length > 30 && DECODE_ONLY.length > 0);
  for (const name of [...CANONICAL, ...DECODE_ONLY, "frame-ping.bin"]) {
    assert.ok(VALUES.has(name), `${name} missing from the vectors README`);
  }
});

describe("each vector decodes to the README's value", () => {
  for (const name of [...CANONICAL, ...DECODE_ONLY]) {
    test(name, () => assert.deepStrictEqual(decodeBody(raw(name)), VALUES.get(name)));
  }
});

describe("each canonical vector re-encodes byte for byte", () => {
  for (const name of CANONICAL) {
    test(name, () => assert.deepStrictEqual(encodeBody(decodeBody(raw(name))), raw(name)));
  }
});

// Built with this package's request builders, not from the decoded map, so
// that the builders' field order is what is checked.
const BUILT: Record<string, () => messages.AgentMessage | Record<string, unknown>> = {
  "client-hello.msgpack": () => messages.hello("runlock 0.1.0", 4242),
  "client-hello-takes-locks.msgpack": () => messages.hello("runlock 0.1.0", 4242, { takesLocks: true }),
  "client-acquire-minimal.msgpack": () => messages.acquire(1, ["dev:tap-x-to-target-y"]),
  "client-acquire-full.msgpack": () =>
    messages.acquire(2, ["dev:b", "dev:a"], {
      ttlMs: 30000,
      waitMs: 60000,
      force: true,
      command: "meltano run tap-x target-y",
      onLost: "kill",
    }),
  "client-acquire-slots.msgpack": () =>
    messages.acquire(11, ["warehouse"], { waitMs: 60000, command: "meltano run tap-x target-y", slots: 3 }),
  "client-release-lease-ids.msgpack": () => messages.releaseLeases(3, ["lease-0001", "lease-0002"]),
  "client-release-key.msgpack": () => messages.breakKey(4, "dev:a"),
  "client-release-key-slot.msgpack": () => messages.breakKey(12, "warehouse", 2),
  "client-attach.msgpack": () => messages.attach(5, 4300, 4300),
  "client-reattach.msgpack": () => messages.reattach(9, [{ key: "dev:a", leaseId: "lease-0001", token: 12 }], "term"),
  "client-list.msgpack": () => messages.simple(6, "list"),
  "client-inspect.msgpack": () => messages.inspect(7, "dev:a"),
  "client-ping.msgpack": () => messages.simple(8, "ping"),
  "client-history.msgpack": () => messages.history(10, "dev:a", 3),
  "client-list_keys.msgpack": () =>
    messages.listKeys(11, { prefix: "dev:", cursor: '{"page":"token-2"}', free: true, eventsSinceMs: 1700000000000 }),
};

test("every client vector has a builder", () => {
  assert.deepStrictEqual(Object.keys(BUILT).sort(), CANONICAL.filter((n) => n.startsWith("client-")));
});

describe("each built request matches its vector's bytes", () => {
  for (const [name, build] of Object.entries(BUILT)) {
    test(name, () => assert.deepStrictEqual(encodeBody(build() as Record<string, unknown>), raw(name)));
  }
});

describe("each agent vector parses into a typed message", () => {
  for (const name of [...CANONICAL, ...DECODE_ONLY].filter((n) => n.split("/").pop()!.startsWith("agent-"))) {
    test(name, () => {
      const value = VALUES.get(name) as { id?: number; type: string };
      const message = parse(name);
      assert.equal(message.id, value.id);
      assert.equal(message.type === "unknown", value.type === "moved", `${name}: ${message.type}`);
    });
  }
});

const HOLDER = {
  host: "runner-01",
  agentId: "5b0e7c1a-3f4d-4e8a-9c2b-7d1e6f0a4b3c",
  pid: 4242,
  uid: 1000,
  gid: 1000,
  user: "etl",
  command: "meltano run tap-x target-y",
  acquiredAtMs: 1700000000000,
  token: 41,
};

test("errors map to their classes, with the holder", () => {
  const held = of(parse("agent-error-held.msgpack"), "error").error;
  assert.ok(held instanceof Held && !(held instanceof Timeout));
  assert.equal(held.key, "dev:tap-x-to-target-y");
  assert.deepStrictEqual(held.holder, HOLDER);
  assert.deepStrictEqual(held.holders, []);
  const timeout = of(parse("agent-error-timeout.msgpack"), "error").error;
  assert.ok(timeout instanceof Timeout && timeout instanceof Held && timeout.holder?.token === 12);
  const invalid = of(parse("agent-error-invalid-key.msgpack"), "error").error;
  assert.ok(invalid instanceof InvalidKey && invalid.key === "dev\nx");
  const unknown = of(parse("decode-only/agent-error-unknown-code.msgpack"), "error").error;
  assert.equal(unknown.constructor, RunlockError);
  assert.equal(unknown.code, "quota_exceeded");
  assert.equal(unknown.message, "too many");
});

test("welcome, acquired, record, leases, lost, forcing, renewed", () => {
  const welcome = of(parse("agent-welcome.msgpack"), "welcome");
  assert.equal(welcome.leasesSurviveAgent, true);
  assert.equal(welcome.defaultTtlMs, 60000);
  const acquired = of(parse("agent-acquired.msgpack"), "acquired");
  assert.deepStrictEqual(acquired.leases, [
    { key: "dev:a", leaseId: "lease-0001", token: 12 },
    { key: "dev:b", leaseId: "lease-0002", token: 3 },
  ]);
  assert.equal(acquired.validForMs, 25000);
  assert.equal(acquired.locks, 0);
  assert.equal(of(parse("agent-acquired-locks.msgpack"), "acquired").locks, 1);
  const free = of(parse("agent-record-free.msgpack"), "record").record;
  assert.deepStrictEqual(free, { key: "dev:a", state: "free", token: 12, scope: "global", holders: [] });
  const held = of(parse("agent-record-held-file.msgpack"), "record").record;
  assert.ok(held.holder !== undefined && held.expiresInMs === undefined && held.scope === "host");
  const leases = of(parse("agent-leases.msgpack"), "leases");
  assert.deepStrictEqual(leases.leases.map((l) => l.childPid), [4300, undefined]);
  const lost = of(parse("agent-lost-forced.msgpack"), "lost");
  assert.equal(lost.reason, "forced");
  assert.equal(lost.holder?.token, 13);
  assert.equal(of(parse("agent-lost-expired.msgpack"), "lost").holder, undefined);
  const forcing = of(parse("agent-forcing.msgpack"), "forcing");
  assert.equal(forcing.waitMs, 33000);
  assert.equal(forcing.holder?.token, 12);
  assert.equal(of(parse("agent-forcing-no-deadline.msgpack"), "forcing").waitMs, undefined);
  const renewed = of(parse("agent-renewed.msgpack"), "renewed");
  assert.deepStrictEqual({ leaseId: renewed.leaseId, validForMs: renewed.validForMs }, { leaseId: "lease-0001", validForMs: 25000 });
  assert.deepStrictEqual(parse("decode-only/agent-pong-unknown-fields.msgpack"), { type: "pong", id: 8 });
  assert.equal(of(parse("decode-only/agent-unknown-event.msgpack"), "unknown").wireType, "moved");
});

test("history events and the record's incident", () => {
  const events = of(parse("agent-events.msgpack"), "events");
  assert.deepStrictEqual(events.events.map((e) => e.kind), ["granted", "forced", "released"]);
  const forced = events.events[1]!;
  assert.deepStrictEqual([forced.token, forced.fromToken, forced.clock, forced.user], [13, 12, "store", "root"]);
  assert.equal(events.events[0]!.fromToken, undefined);
  assert.equal(events.events[0]!.reason, "");
  assert.deepStrictEqual(of(parse("agent-record-held-incident.msgpack"), "record").record.incident, forced);
  assert.equal(of(parse("agent-record-held.msgpack"), "record").record.incident, undefined);
});

test("a listing says how many events it left out", () => {
  assert.deepStrictEqual(of(parse("agent-keys.msgpack"), "keys").keys.map((k) => k.eventsOmitted), [0, 0]);
  const cut = of(parse("agent-keys-events-omitted.msgpack"), "keys");
  assert.equal(cut.cursor, undefined);
  assert.equal(cut.keys[0]!.eventsOmitted, 2047);
  assert.equal(cut.keys[0]!.events.length, 1);
});

test("slots: the grant, the record and the errors name them", () => {
  assert.deepStrictEqual(of(parse("agent-acquired-slot.msgpack"), "acquired").leases, [
    { key: "warehouse", leaseId: "lease-0007", token: 5, slot: 1 },
  ]);
  const slotHolder = (pid: number, token: number, slot: number, slots: number) => ({ ...HOLDER, pid, token, slot, slots });
  const record = of(parse("agent-record-slots.msgpack"), "record").record;
  assert.equal(record.slots, 3);
  assert.deepStrictEqual(record.holders, [slotHolder(4242, 9, 0, 3), slotHolder(4250, 4, 2, 3)]);
  const held = of(parse("agent-error-held-slots.msgpack"), "error").error;
  assert.ok(held instanceof Held);
  assert.deepStrictEqual(held.holders, [slotHolder(4242, 9, 0, 2), slotHolder(4250, 5, 1, 2)]);
  const mismatch = of(parse("agent-error-slots-mismatch.msgpack"), "error").error;
  assert.ok(mismatch instanceof SlotsMismatch && !(mismatch instanceof Held));
  assert.equal(mismatch.heldWith, 5);
  assert.deepStrictEqual(mismatch.holders, [slotHolder(4242, 9, 0, 5)]);
});

test("frame-ping.bin: the framing, both ways", () => {
  const frame = raw("frame-ping.bin");
  assert.deepStrictEqual(encodeFrame(messages.simple(1, "ping")), frame);
  const reader = new FrameReader();
  // Byte by byte: a frame is whole only once its last byte has come.
  const bodies = [...frame].flatMap((byte) => reader.push(Buffer.from([byte])));
  assert.equal(bodies.length, 1);
  assert.deepStrictEqual(decodeBody(bodies[0]!), VALUES.get("frame-ping.bin"));
  assert.equal(reader.midFrame, false);
});

test("oversized frames are refused both ways, before any body", () => {
  assert.throws(() => encodeFrame({ type: "inspect", key: "x".repeat(MAX_BODY_LEN) }), ProtocolError);
  const header = Buffer.alloc(4);
  header.writeUInt32BE(MAX_BODY_LEN + 1);
  assert.throws(() => new FrameReader().push(header), ProtocolError);
});

test("what the wire has no place for is refused before sending", () => {
  // SPEC 3.2: str, never bin. 80 bytes of UTF-8 take str 8 (d9 50).
  const body = Buffer.from(encodeBody({ type: "inspect", key: "é".repeat(40) }));
  assert.ok(body.includes(Buffer.concat([Buffer.from([0xd9, 0x50]), Buffer.from("é".repeat(40))])));
  for (const bad of [new Uint8Array([1]), 1.5, -1, 2 ** 64, null, new Date()]) {
    assert.throws(() => encodeBody({ type: "inspect", key: bad }), /cannot|integer/);
  }
});

describe("undecodable bodies are protocol errors", () => {
  const cases: Record<string, number[]> = {
    "not a map": [0x92, 0x01, 0x02],
    "a non-string key": [0x81, 0x01, 0x02],
    "bytes after the map": [0x81, 0xa4, ...Buffer.from("type"), 0xa4, ...Buffer.from("pong"), 0x00],
    "a bin value": [0x81, 0xa4, ...Buffer.from("type"), 0xc4, 0x01, 0x70],
    "a float value": [0x81, 0xa1, 0x78, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0],
    "a negative value": [0x81, 0xa1, 0x78, 0xff],
    "a uint64 beyond 2^53": [0x81, 0xa1, 0x78, 0xcf, 0x00, 0x20, 0, 0, 0, 0, 0, 1],
  };
  for (const [what, bytes] of Object.entries(cases)) {
    test(what, () => assert.throws(() => decodeBody(new Uint8Array(bytes)), ProtocolError));
  }
});

describe("fields of the wrong type or range are protocol errors", () => {
  const cases: Record<string, Record<string, unknown>> = {
    "a required field missing": { type: "released" },
    "a bool for an integer": { type: "released", count: true },
    "over uint32": { type: "released", count: 2 ** 32 },
    "a number for a string": { type: "renewed", lease_id: 3, valid_for_ms: 1 },
    "a negative slot": { type: "acquired", ttl_ms: 1, leases: [{ key: "k", lease_id: "l", token: 1, slot: -1 }] },
    "slots as a string": { type: "record", key: "k", state: "free", token: 0, scope: "host", slots: "3" },
    "holders as a map": { type: "record", key: "k", state: "free", token: 0, scope: "host", holders: {} },
    "a holder that is no map": { type: "error", code: "held", message: "m", holders: [1] },
  };
  for (const [what, body] of Object.entries(cases)) {
    test(what, () => assert.throws(() => messages.parseAgent(body), ProtocolError));
  }
});
