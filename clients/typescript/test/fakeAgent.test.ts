// A scripted fake agent, for what the real one rarely sends: a refusal
// before welcome, unknown events and fields, an event between a request
// and its reply, an oversized frame, another protocol version.

import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { createServer, type Socket } from "node:net";
import { join } from "node:path";
import { test } from "node:test";
import { lock, inspect, LockLost, ProtocolError, RunlockError, Unavailable } from "../src/index.js";
import { decodeBody, encodeFrame, FrameReader, type Body } from "../src/wire.js";
import { workdir } from "./agent.js";

const WELCOME = {
  type: "welcome",
  version: 1,
  agent: "fake 0",
  agent_id: "fake",
  backend: "memory://",
  scope: "host",
  default_ttl_ms: 60000,
};

/** Serves one connection: `script` gets each request and sends what it likes. */
async function fakeAgent(
  script: (request: Body, send: (message: Body | Uint8Array) => void, socket: Socket) => void,
): Promise<{ socket: string; close(): void }> {
  const dir = workdir();
  const path = join(dir, "fake.sock");
  const server = createServer((socket) => {
    const reader = new FrameReader();
    const send = (message: Body | Uint8Array): void => {
      socket.write(message instanceof Uint8Array ? message : encodeFrame(message));
    };
    socket.on("data", (chunk) => {
      for (const body of reader.push(chunk)) script(decodeBody(body), send, socket);
    });
    socket.on("error", () => {});
  });
  await new Promise<void>((done) => server.listen(path, done));
  return {
    socket: path,
    close: () => {
      server.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const grant = (id: unknown): Body => ({
  id: id as number,
  type: "acquired",
  leases: [{ key: "k", lease_id: "l1", token: 7 }],
  ttl_ms: 60000,
});

test("a refusal before welcome is the agent's answer: busy is Unavailable with its code", { timeout: 10_000 }, async () => {
  const agent = await fakeAgent((_, send) => send({ type: "error", code: "unavailable", message: "agent busy: connections" }));
  try {
    const err = await lock("k", { socket: agent.socket }).catch((e: unknown) => e);
    assert.ok(err instanceof Unavailable);
    assert.equal(err.code, "unavailable");
    assert.match(err.message, /agent busy/);
  } finally {
    agent.close();
  }
});

test("another protocol version is a ProtocolError", { timeout: 10_000 }, async () => {
  const agent = await fakeAgent((_, send) => send({ type: "error", code: "unsupported_version", message: "speaks 2" }));
  try {
    await assert.rejects(lock("k", { socket: agent.socket }), ProtocolError);
  } finally {
    agent.close();
  }
});

test("unknown events and fields are ignored; a lost reason this client does not know is a loss", { timeout: 10_000 }, async () => {
  const agent = await fakeAgent((request, send) => {
    if (request["type"] === "hello") {
      send({ ...WELCOME, shiny: { new: [1, 2] } });
    } else if (request["type"] === "acquire") {
      send({ type: "moved", to: "elsewhere" }); // a newer agent's event
      send({ ...grant(request["id"]), extra: "ignored" });
      send({ type: "lost", lease_id: "l1", key: "k", reason: "quarantined", message: "a newer reason" });
    } else if (request["type"] === "release") {
      send({ id: request["id"] as number, type: "released", count: 0 });
    }
  });
  try {
    const lease = await lock("k", { socket: agent.socket });
    assert.equal(lease.token, 7);
    await assert.rejects(lease.lost, (e) => e instanceof LockLost && e.event.reason === "quarantined");
    await assert.rejects(lease.release(), LockLost);
  } finally {
    agent.close();
  }
});

test("an unknown error code is still a failure", { timeout: 10_000 }, async () => {
  const agent = await fakeAgent((request, send) => {
    if (request["type"] === "hello") send(WELCOME);
    else send({ id: request["id"] as number, type: "error", code: "quota_exceeded", message: "too many" });
  });
  try {
    const err = await inspect("k", { socket: agent.socket }).catch((e: unknown) => e);
    assert.ok(err instanceof RunlockError);
    assert.equal(err.constructor, RunlockError);
    assert.equal(err.code, "quota_exceeded");
  } finally {
    agent.close();
  }
});

test("an oversized frame from the agent ends the connection: the lease is lost", { timeout: 10_000 }, async () => {
  let held: Socket | undefined;
  const agent = await fakeAgent((request, send, socket) => {
    if (request["type"] === "hello") send(WELCOME);
    else if (request["type"] === "acquire") {
      send(grant(request["id"]));
      held = socket;
    }
  });
  try {
    const lease = await lock("k", { socket: agent.socket });
    const header = new Uint8Array(4);
    new DataView(header.buffer).setUint32(0, (1 << 20) + 1);
    held!.write(header);
    await assert.rejects(lease.lost, (e) => e instanceof LockLost && e.event.reason === "agent_gone" && /over the/.test(e.event.message));
  } finally {
    agent.close();
  }
});
