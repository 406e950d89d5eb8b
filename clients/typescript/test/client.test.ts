// The client against a real runlockd, on memory:// and on file://.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import {
  breakLock,
  Held,
  history,
  inspect,
  InvalidKey,
  listKeys,
  lock,
  LockLost,
  SlotsMismatch,
  status,
  Timeout,
  Unavailable,
  withLock,
  type Forcing,
  type Lease,
  type LostEvent,
  type Renewed,
} from "../src/index.js";
import { Agent, s3Backend, withAgent, workdir, type BackendName } from "./agent.js";

/** How soon a killed holder's key must be free: the shim's bound (tests/shim/crash_release.rs). */
const CRASH_RELEASE_BOUND_MS = 5_000;

for (const backend of ["memory", "file"] as BackendName[]) {
  describe(`against runlockd on ${backend}://`, () => {
    test("lock and release, with a token that grows", () =>
      withAgent(backend, async ({ socket }) => {
        const first = await lock("dev:a", { socket });
        assert.deepStrictEqual(first.keys, ["dev:a"]);
        assert.ok(first.token >= 1 && first.leaseId.length > 0);
        assert.equal(first.slot, undefined);
        await first.release();
        await first.release(); // idempotent
        const second = await lock("dev:a", { socket, ttlMs: 5_000 });
        assert.ok(second.token > first.token, `${second.token} after ${first.token}`);
        assert.equal(second.ttlMs, 5_000);
        await second.release();
      }));

    test("several keys: all of them, sorted, each with its token", () =>
      withAgent(backend, async ({ socket }) => {
        const lease = await lock(["dev:b", "dev:a"], { socket });
        assert.deepStrictEqual(lease.keys, ["dev:a", "dev:b"]);
        assert.deepStrictEqual(Object.keys(lease.tokens), ["dev:a", "dev:b"]);
        assert.throws(() => lease.token, RangeError);
        await assert.rejects(lock("dev:b", { socket }), Held);
        await lease.release();
      }));

    test("a held key is refused at once, naming its holder", () =>
      withAgent(backend, async ({ socket }) => {
        const lease = await lock("dev:a", { socket, command: "etl nightly" });
        const err = await lock("dev:a", { socket }).then(() => assert.fail("granted twice"), (e: unknown) => e);
        assert.ok(err instanceof Held && !(err instanceof Timeout));
        assert.equal(err.code, "held");
        assert.equal(err.holder?.pid, process.pid);
        assert.equal(err.holder?.token, lease.token);
        assert.equal(err.holder?.command, "etl nightly");
        await lease.release();
      }));

    test("waiting: a timeout names the holder; a release wakes the waiter", () =>
      withAgent(backend, async ({ socket }) => {
        const lease = await lock("dev:a", { socket });
        await assert.rejects(lock("dev:a", { socket, waitMs: 200 }), (e) => e instanceof Timeout && e.holder?.token === lease.token);
        const waiter = lock("dev:a", { socket, waitMs: 30_000 });
        // The waiter is queued once the agent's listing shows it waiting.
        await until(async () => (await first(listKeys("dev:a", { socket })))?.waitingHere === 1);
        await lease.release();
        const next = await waiter;
        assert.ok(next.token > lease.token);
        await next.release();
      }));

    test("force: the holder is told (signal, lost, release) and the forcer is told it waits", () =>
      withAgent(backend, async ({ socket }) => {
        const holder = await lock("dev:a", { socket });
        const lostEvent = once(holder, "lost") as Promise<[LostEvent]>;
        const forcing: Forcing[] = [];
        // The forced grant comes once the displaced run has stopped: its release below.
        const forced = lock("dev:a", { socket, force: true, onForcing: (e) => forcing.push(e) });
        const [event] = await lostEvent;
        assert.equal(event.reason, "forced");
        assert.ok(holder.signal.aborted && holder.signal.reason instanceof LockLost);
        await assert.rejects(holder.lost, LockLost);
        assert.throws(() => holder.check(), LockLost);
        await assert.rejects(holder.release(), (e) => e instanceof LockLost && e.event.reason === "forced");
        const forcer = await forced;
        assert.equal(event.holder?.token, forcer.token);
        assert.ok(forcer.token > holder.token);
        // The forcer was told whom it displaced, while the agent waited for that run.
        assert.equal(forcing.length, 1);
        assert.equal(forcing[0]!.key, "dev:a");
        assert.equal(forcing[0]!.holder?.token, holder.token);
        assert.equal((await inspect("dev:a", { socket })).holder?.token, forcer.token);
        await forcer.release();
      }));

    test("with onLost the caller has taken charge: release does not reject", () =>
      withAgent(backend, async ({ socket }) => {
        const seen: LostEvent[] = [];
        // The run stops when told: onLost releases, and the break is answered then.
        const holder: Lease = await lock("dev:a", {
          socket,
          onLost: (e) => {
            seen.push(e);
            void holder.release();
          },
        });
        assert.equal(await breakLock("dev:a", { socket }), 1);
        assert.equal(seen.length, 1);
        assert.equal(seen[0]!.reason, "broken");
        await holder.release();
        assert.equal(await breakLock("dev:a", { socket }), 0); // free by now
      }));

    test("withLock releases after the work, and rejects with LockLost if the lease was lost", () =>
      withAgent(backend, async ({ socket }) => {
        const token = await withLock("dev:a", (lease) => lease.token, { socket });
        assert.equal((await inspect("dev:a", { socket })).state, "free");
        let broken: Promise<number> | undefined;
        const work = withLock(
          "dev:a",
          async (lease) => {
            broken = breakLock("dev:a", { socket }); // answered once this run has stopped
            await once(lease.signal, "abort");
            return "done";
          },
          { socket },
        );
        await assert.rejects(work, (e) => e instanceof LockLost && e.event.reason === "broken");
        assert.equal(await broken, 1);
        assert.ok((await inspect("dev:a", { socket })).token > token);
      }));

    test("status, inspect, history and listKeys", () =>
      withAgent(backend, async ({ socket }) => {
        const lease = await lock("dev:a", { socket, command: "etl run" });
        const leases = await status({ socket });
        assert.deepStrictEqual(leases.map((l) => [l.key, l.leaseId, l.holder.token]), [["dev:a", lease.leaseId, lease.token]]);
        const record = await inspect("dev:a", { socket });
        assert.equal(record.state, "held");
        assert.equal(record.holder?.command, "etl run");
        assert.equal(record.scope, "host");
        await lease.release();
        const events = await history("dev:a", { socket });
        assert.deepStrictEqual(events.map((e) => [e.kind, e.token]), [["granted", lease.token], ["released", lease.token]]);
        assert.deepStrictEqual((await history("dev:a", { socket, limit: 1 })).map((e) => e.kind), ["released"]);
        const other = await lock("dev:b", { socket });
        const held: string[] = [];
        for await (const listing of listKeys("dev:", { socket })) held.push(listing.key);
        assert.deepStrictEqual(held, ["dev:b"]);
        const all: string[] = [];
        for await (const listing of listKeys("dev:", { socket, free: true })) all.push(`${listing.key} ${listing.record?.state}`);
        assert.deepStrictEqual(all.sort(), ["dev:a free", "dev:b held"]);
        await other.release();
      }));

    test("slots: holders on distinct slots, a fourth refused, another count refused", () =>
      withAgent(backend, async ({ socket }) => {
        const leases = await Promise.all([0, 1, 2].map(() => lock("warehouse", { socket, slots: 3 })));
        assert.deepStrictEqual(leases.map((l) => l.slot).sort(), [0, 1, 2]);
        const fourth = await lock("warehouse", { socket, slots: 3 }).catch((e: unknown) => e);
        assert.ok(fourth instanceof Held);
        assert.deepStrictEqual(fourth.holders.map((h) => h.slot), [0, 1, 2]);
        const mismatch = await lock("warehouse", { socket, slots: 2 }).catch((e: unknown) => e);
        assert.ok(mismatch instanceof SlotsMismatch);
        assert.equal(mismatch.heldWith, 3);
        const record = await inspect("warehouse", { socket });
        assert.equal(record.slots, 3);
        assert.equal(record.holders.length, 3);
        const onSlotOne = leases.find((l) => l.slot === 1)!;
        const broken = breakLock("warehouse", { socket, slot: 1 });
        await assert.rejects(onSlotOne.lost, LockLost);
        await assert.rejects(onSlotOne.release(), LockLost);
        assert.equal(await broken, 1);
        for (const lease of leases) if (lease !== onSlotOne) await lease.release();
      }));

    test("an invalid key is refused, and bad numbers never leave the process", () =>
      withAgent(backend, async ({ socket }) => {
        await assert.rejects(lock("dev\nx", { socket }), (e) => e instanceof InvalidKey && e.key === "dev\nx");
        await assert.rejects(lock("k", { socket: "/nonexistent/agent.sock", waitMs: -1 }), RangeError);
        await assert.rejects(lock("k", { socket: "/nonexistent/agent.sock", ttlMs: 1.5 }), RangeError);
        await assert.rejects(lock("k", { socket: "/nonexistent/agent.sock", slots: 2 ** 32 }), RangeError);
      }));

    test("a killed holder's key is free within the shim's bound", (t) =>
      withAgent(backend, async ({ socket }) => {
        const holder = join(fileURLToPath(import.meta.url), "..", "holder.js");
        const child = spawn(process.execPath, [holder, socket, "dev:crash"], { stdio: ["ignore", "pipe", "inherit"] });
        t.after(() => child.kill("SIGKILL")); // whatever fails below, no holder is left behind
        const [line] = (await once(child.stdout!, "data")) as [Buffer];
        assert.match(line.toString(), /^held \d+/);
        assert.equal((await inspect("dev:crash", { socket })).holder?.pid, child.pid);
        const started = Date.now();
        child.kill("SIGKILL");
        const lease = await lock("dev:crash", { socket, waitMs: 30_000 });
        const took = Date.now() - started;
        assert.ok(took < CRASH_RELEASE_BOUND_MS, `the key was free only after ${took} ms`);
        await lease.release();
        const events = await history("dev:crash", { socket });
        // The killed holder's grant, then its release by the agent as its client went away.
        assert.deepStrictEqual(events.slice(0, 2).map((e) => [e.kind, e.pid, e.reason]), [
          ["granted", child.pid, ""],
          ["released", child.pid, "client gone"],
        ]);
      }));

    test("an agent that stops takes the lease with it: a loss", async () => {
      const dir = workdir();
      const agent = await Agent.start(dir, backend);
      try {
        const lease = await lock("dev:a", { socket: agent.socket });
        await agent.stop("SIGTERM");
        await assert.rejects(lease.lost, (e) => e instanceof LockLost && ["restarting", "agent_gone"].includes(e.event.reason));
        await assert.rejects(lease.release(), LockLost);
      } finally {
        await agent.stop("SIGKILL");
        rmSync(dir, { recursive: true, force: true });
      }
    });
  });
}

test("on s3:// (leases that outlive the agent) renewals are told and say how long the lease stands", async (t) => {
  const backend = await s3Backend();
  if (backend === undefined) return t.skip("RUNLOCK_TEST_S3_ENDPOINT is not set (source tests/scripts/moto.sh; moto_start)");
  const dir = workdir();
  const agent = await Agent.start(dir, backend.uri, "agent", backend.env);
  try {
    const lease = await lock("dev:renewed", { socket: agent.socket, ttlMs: 1_000 });
    assert.equal(lease.agent.leasesSurviveAgent, true);
    assert.ok(lease.validForMs !== undefined && lease.validForMs <= 1_000);
    // The agent renews every TTL/3.
    const [renewed] = (await once(lease, "renewed")) as [Renewed];
    assert.equal(renewed.leaseId, lease.leaseId);
    assert.ok(renewed.validForMs > 0 && renewed.validForMs <= 1_000);
    assert.equal(lease.validForMs, renewed.validForMs);
    await lease.release();
  } finally {
    await agent.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("no agent at the socket is Unavailable, without a code", async () => {
  const err = await lock("k", { socket: "/nonexistent/agent.sock" }).catch((e: unknown) => e);
  assert.ok(err instanceof Unavailable);
  assert.equal(err.code, undefined);
});

async function first<T>(items: AsyncIterable<T>): Promise<T | undefined> {
  for await (const item of items) return item;
  return undefined;
}

/** Polls `condition` every 20 ms until it holds, for at most 10 s. */
async function until(condition: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!(await condition())) {
    if (Date.now() > deadline) assert.fail("condition not met within 10 s");
    await new Promise((done) => setTimeout(done, 20));
  }
}
