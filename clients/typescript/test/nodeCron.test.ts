// The node-cron RunCoordinator against a real runlockd: node-cron's own
// scheduler elects one of two instances of a task per tick.

import assert from "node:assert/strict";
import { test } from "node:test";
import cron, { type TaskContext } from "node-cron";
import { inspect } from "../src/index.js";
import { RunlockCoordinator, taskName } from "../src/nodeCron.js";
import { withAgent } from "./agent.js";

test("the task name is node-cron's key without its scheduled time", () => {
  assert.equal(taskName("nightly:2026-12-07T03:00:00.000Z"), "nightly");
  assert.equal(taskName("etl:dev:load:2026-12-07T03:00:05.000Z"), "etl:dev:load");
  assert.equal(taskName("no-time"), "no-time");
});

test("shouldRun takes the task's key at once; onComplete gives it back", () =>
  withAgent("memory", async ({ socket }) => {
    const here = new RunlockCoordinator({ socket });
    const there = new RunlockCoordinator({ socket });
    const key = "nightly:2026-12-07T03:00:00.000Z";
    assert.equal(await here.shouldRun(key, 30_000), true);
    assert.equal(await there.shouldRun(key, 30_000), false);
    const lease = here.leaseOf("nightly");
    assert.equal(lease?.key, "nightly");
    assert.equal(lease?.ttlMs, 30_000); // node-cron's distributedLease
    const record = await inspect("nightly", { socket });
    assert.equal(record.holder?.command, `node-cron ${key}`);
    await here.onComplete(key);
    assert.equal(here.leaseOf("nightly"), undefined);
    assert.equal(await there.shouldRun("nightly:2026-12-07T03:00:01.000Z", 30_000), true);
    await there.onComplete("nightly:2026-12-07T03:00:01.000Z");
    assert.equal((await inspect("nightly", { socket })).state, "free");
  }));

test("no agent: shouldRun rejects, so node-cron skips the run", async () => {
  const coordinator = new RunlockCoordinator({ socket: "/nonexistent/agent.sock" });
  await assert.rejects(coordinator.shouldRun("nightly:2026-12-07T03:00:00.000Z", 30_000));
});

test("two instances of a task scheduled every second: one runs each tick", () =>
  withAgent("memory", async ({ socket }) => {
    const outcomes = new Map<string, string[]>(); // tick → what each instance did
    const tokens: number[] = [];
    const note = (context: TaskContext, what: string): void => {
      const tick = context.date.toISOString();
      outcomes.set(tick, [...(outcomes.get(tick) ?? []), what]);
    };
    const ticksSeenByBoth = (): string[] => [...outcomes].filter(([, seen]) => seen.length === 2).map(([tick]) => tick);
    const instances = [new RunlockCoordinator({ socket }), new RunlockCoordinator({ socket })].map((coordinator) => {
      const task = cron.schedule(
        "* * * * * *",
        async () => {
          tokens.push(coordinator.leaseOf("backup")!.token);
          // Long enough that the other instance asks while this one runs
          // (both wake on the same tick), short enough to end before the next.
          await new Promise((done) => setTimeout(done, 600));
        },
        { name: "backup", distributed: true, runCoordinator: coordinator },
      );
      task.on("execution:finished", (context) => note(context, "ran"));
      task.on("execution:skipped", (context) => note(context, `skipped (${context.reason})`));
      return task;
    });
    try {
      const deadline = Date.now() + 15_000;
      while (ticksSeenByBoth().length < 3) {
        assert.ok(Date.now() < deadline, `ticks: ${JSON.stringify([...outcomes])}`);
        await new Promise((done) => setTimeout(done, 100));
      }
    } finally {
      for (const task of instances) await task.destroy();
    }
    for (const tick of ticksSeenByBoth()) {
      assert.deepStrictEqual(outcomes.get(tick)!.sort(), ["ran", "skipped (not-elected)"], tick);
    }
    assert.deepStrictEqual(tokens, [...tokens].sort((a, b) => a - b));
    assert.equal(new Set(tokens).size, tokens.length, "each run has a token of its own");
  }));
