// A node-cron 4 `RunCoordinator`: a `distributed` task runs only where its
// runlock key could be taken, and holds the key while it runs.

import type { RunCoordinator } from "node-cron";
import { lock, type Lease, type Where } from "./api.js";
import { Held } from "./errors.js";
import type { LostEvent } from "./messages.js";

/** The shortest and longest TTL the agent accepts (SPEC 6.1 `acquire`). */
const TTL_RANGE = [1_000, 86_400_000] as const;

export interface RunlockCoordinatorOptions extends Where {
  /** The runlock key for node-cron's key (`<task name>:<scheduled ISO time>`).
   * By default the task name: runs of one task never overlap, across every
   * process and host sharing the agent's backend. */
  keyFor?: (cronKey: string) => string;
  /** How many runs of one key at once (runlock slots); 1 by default. */
  slots?: number;
  /** Called when a running task's lease is lost; without it, the loss is
   * thrown from `onComplete`, which node-cron logs as an error. */
  onLost?: (event: LostEvent, cronKey: string) => void;
}

/** The task name in node-cron's key, which ends `:<ISO time>` (itself holding colons). */
export function taskName(cronKey: string): string {
  const found = /^(.*):\d{4}-\d{2}-\d{2}T[\d:.]+Z$/.exec(cronKey);
  return found ? found[1]! : cronKey;
}

/** Elects the run that takes the task's key (at once, never waiting); the
 * others are skipped as `not-elected`. The key is held until `onComplete`,
 * or until this process dies: the agent frees it when the connection ends.
 * An unreachable agent rejects, and node-cron then skips the run
 * (`coordinator-error`): no run goes unprotected. */
export class RunlockCoordinator implements RunCoordinator {
  private readonly held = new Map<string, Lease>();

  constructor(private readonly options: RunlockCoordinatorOptions = {}) {}

  async shouldRun(cronKey: string, ttlMs: number): Promise<boolean> {
    const key = (this.options.keyFor ?? taskName)(cronKey);
    const onLost = this.options.onLost;
    try {
      const lease = await lock(key, {
        socket: this.options.socket,
        slots: this.options.slots,
        // node-cron's distributedLease, where the agent accepts it.
        ttlMs: ttlMs >= TTL_RANGE[0] && ttlMs <= TTL_RANGE[1] ? Math.round(ttlMs) : undefined,
        command: `node-cron ${cronKey}`,
        onLost: onLost && ((event) => onLost(event, cronKey)),
      });
      this.held.set(cronKey, lease);
      return true;
    } catch (err) {
      if (err instanceof Held) return false;
      throw err;
    }
  }

  async onComplete(cronKey: string): Promise<void> {
    const lease = this.held.get(cronKey);
    this.held.delete(cronKey);
    await lease?.release();
  }

  /** The lease a run of `taskName` holds here, while it runs: its `token`
   * to hand to the work, its `signal` that aborts if the lease is lost. */
  leaseOf(name: string): Lease | undefined {
    for (const [cronKey, lease] of this.held) {
      if (taskName(cronKey) === name) return lease;
    }
    return undefined;
  }
}
