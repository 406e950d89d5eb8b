// The public API: `lock` (a Lease held until released), `withLock`, and the
// one-shot calls `status`, `inspect`, `history`, `listKeys`, `breakLock`.

import { EventEmitter } from "node:events";
import { Connection, LIST_PAGE_TIMEOUT_MS, REPLY_SLACK_MS, type Ending } from "./connection.js";
import { LockLost, ProtocolError, RunlockError, Unavailable } from "./errors.js";
import * as messages from "./messages.js";
import type {
  AgentMessage,
  Forcing,
  Grant,
  KeyEvent,
  KeyListing,
  KeyRecord,
  LeaseInfo,
  LostEvent,
  Renewed,
  Welcome,
} from "./messages.js";
import { resolveSocket } from "./socketPath.js";

const MAX_U32 = 0xffffffff;

function millis(value: number | undefined, what: string): number | undefined {
  if (value === undefined) return undefined;
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(`${what} must be a non-negative whole number of milliseconds, got ${value}`);
  }
  return value;
}

function uint32(value: number | undefined, what: string): number | undefined {
  if (value === undefined) return undefined;
  if (!Number.isInteger(value) || value < 0 || value > MAX_U32) {
    throw new RangeError(`${what} must be a whole number from 0 to ${MAX_U32}, got ${value}`);
  }
  return value;
}

/** This process's command line, shell-quoted, as the holder records it. */
function defaultCommand(): string {
  const quote = (word: string): string => (/^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'"'"'`)}'`);
  return [process.argv0, ...process.execArgv, ...process.argv.slice(1)].map(quote).join(" ");
}

type Reply<T extends AgentMessage["type"]> = Extract<AgentMessage, { type: T }>;

function expect<T extends AgentMessage["type"]>(reply: AgentMessage, type: T): Reply<T> {
  if (reply.type !== type) throw new ProtocolError(`expected ${type}, got ${reply.type}`);
  return reply as Reply<T>;
}

/** Where the agent is: the socket path, or the socket rule when absent. */
export interface Where {
  socket?: string | undefined;
}

export interface LockOptions extends Where {
  /** How long to wait while a key is held: 0 (the default) rejects with Held
   * at once, otherwise with Timeout after waiting. */
  waitMs?: number;
  /** The leases' time to live, 1 000 to 86 400 000; the agent's default when
   * absent. The agent renews them while the connection is open. */
  ttlMs?: number;
  /** Take the keys from their holders (force rights); resolves once each
   * displaced run has stopped or its deadline has passed. */
  force?: boolean;
  /** How many holders each key admits at once, 1 to 64 (1: a plain key). */
  slots?: number;
  /** Recorded in the holder; this process's command line by default. */
  command?: string;
  /** Called once per lost lease. With it, `release()` does not reject for the
   * loss: the caller has taken charge of it. */
  onLost?: (event: LostEvent) => void;
  /** Called when a forced acquire waits for a displaced run to stop. */
  onForcing?: (event: Forcing) => void;
}

/** Leases on one or more keys, held for as long as its connection is open
 * (the agent renews them). A loss is hard to miss: `signal` aborts and
 * `lost` rejects with LockLost, `check()` throws it, and `release()` rejects
 * with it unless `onLost` was given. Events: `lost` (LostEvent), `renewed`
 * (Renewed). */
export class Lease extends EventEmitter<{ lost: [LostEvent]; renewed: [Renewed] }> {
  /** One grant per key, in sorted key order. */
  readonly grants: readonly Grant[];
  /** The TTL the agent applied. */
  readonly ttlMs: number;
  /** The agent's `welcome`: backend, scope, whether leases outlive it. */
  readonly agent: Welcome;
  /** Aborted, with the LockLost as its reason, when a lease is lost. */
  readonly signal: AbortSignal;
  /** Rejects with LockLost when a lease is lost; pending otherwise. */
  readonly lost: Promise<never>;
  /** The guarantee the agent last reported (`acquired`, then `renewed`), where leases can outlive it. */
  validForMs: number | undefined;

  private readonly lostEventsList: LostEvent[] = [];
  private readonly active: Map<string, Grant>;
  private readonly abort = new AbortController();
  private rejectLost!: (err: LockLost) => void;
  private released: Promise<void> | undefined;

  /** @internal */
  constructor(
    private readonly conn: Connection,
    acquired: Reply<"acquired">,
    private readonly onLost: ((event: LostEvent) => void) | undefined,
    early: readonly AgentMessage[] = [],
  ) {
    super();
    this.grants = acquired.leases;
    this.ttlMs = acquired.ttlMs;
    this.validForMs = acquired.validForMs;
    this.agent = conn.welcome;
    this.signal = this.abort.signal;
    this.active = new Map(acquired.leases.map((g) => [g.leaseId, g]));
    this.lost = new Promise<never>((_, reject) => {
      this.rejectLost = reject;
    });
    this.lost.catch(() => {}); // observed through signal, check() and release() too
    conn.onEvent = (event) => this.onEvent(event);
    conn.onEnd = (ending) => this.onEnd(ending);
    // Events that came in the same read as the grant, before this lease was there.
    for (const event of early) this.onEvent(event);
    if (conn.closed) {
      // It ended before this lease was there to hear it (the same read as the grant).
      this.onEnd({ restarting: false, error: new Unavailable(`the agent at ${conn.path} closed the connection`) });
    }
  }

  /** The keys held, sorted. */
  get keys(): string[] {
    return this.grants.map((g) => g.key);
  }

  /** Fencing token per key: hand it to the work, so stale writers can be refused. */
  get tokens(): Record<string, number> {
    return Object.fromEntries(this.grants.map((g) => [g.key, g.token]));
  }

  private single(): Grant {
    if (this.grants.length !== 1) {
      throw new RangeError(`this lease holds ${this.grants.length} keys; use tokens or grants`);
    }
    return this.grants[0]!;
  }

  /** The key (one key only). */
  get key(): string {
    return this.single().key;
  }
  /** The fencing token (one key only). */
  get token(): number {
    return this.single().token;
  }
  /** The lease id (one key only). */
  get leaseId(): string {
    return this.single().leaseId;
  }
  /** The slot held, for a key taken with slots (one key only). */
  get slot(): number | undefined {
    return this.single().slot;
  }

  /** Every loss so far, one per lost lease. */
  get lostEvents(): readonly LostEvent[] {
    return this.lostEventsList;
  }

  /** Throws LockLost if a lease has been lost: call it between steps of long work. */
  check(): void {
    if (this.lostEventsList.length > 0) throw new LockLost(this.lostEventsList);
  }

  private onEvent(event: AgentMessage): void {
    if (event.type === "lost") {
      const { type: _t, id: _i, ...lost } = event;
      if (this.active.delete(lost.leaseId)) this.loseOne(lost);
    } else if (event.type === "renewed" && this.active.has(event.leaseId)) {
      this.validForMs = event.validForMs;
      this.emit("renewed", { leaseId: event.leaseId, validForMs: event.validForMs });
    }
  }

  private onEnd(ending: Ending): void {
    if (this.released) return;
    // This client does not reattach: an agent that goes away takes the leases with it.
    const reason = ending.restarting ? "restarting" : "agent_gone";
    for (const grant of [...this.active.values()]) {
      this.active.delete(grant.leaseId);
      this.loseOne({ leaseId: grant.leaseId, key: grant.key, reason, message: ending.error.message });
    }
  }

  private loseOne(event: LostEvent): void {
    this.lostEventsList.push(event);
    if (this.lostEventsList.length === 1) {
      const err = new LockLost(this.lostEventsList);
      this.abort.abort(err);
      this.rejectLost(err);
    }
    this.emit("lost", event);
    this.onLost?.(event);
  }

  /** Releases what is still held and closes the connection; idempotent.
   * Rejects with LockLost if a lease was lost and no `onLost` was given. */
  release(): Promise<void> {
    this.released ??= this.releaseOnce();
    return this.released;
  }

  private async releaseOnce(): Promise<void> {
    const ids = [...this.active.keys()];
    try {
      if (ids.length > 0 && !this.conn.closed) {
        expect(await this.conn.request((id) => messages.releaseLeases(id, ids), REPLY_SLACK_MS), "released");
        this.active.clear();
      }
    } finally {
      this.conn.close(); // frees anything a failed release left held
    }
    if (this.lostEventsList.length > 0 && this.onLost === undefined) throw new LockLost(this.lostEventsList);
  }
}

/** Takes `keys` (one, or several: all in sorted order, or none) and resolves
 * with the Lease; rejects with Held, Timeout, Unavailable, ... */
export async function lock(keys: string | readonly string[], options: LockOptions = {}): Promise<Lease> {
  const list = typeof keys === "string" ? [keys] : [...keys];
  const waitMs = millis(options.waitMs, "waitMs");
  const fields: messages.AcquireFields = {
    ttlMs: millis(options.ttlMs, "ttlMs"),
    waitMs,
    force: options.force,
    command: options.command ?? defaultCommand(),
    slots: uint32(options.slots, "slots"),
  };
  const conn = await Connection.open(resolveSocket(options.socket));
  const early: AgentMessage[] = [];
  conn.onEvent = (event) => {
    if (event.type === "forcing") options.onForcing?.({ key: event.key, holder: event.holder, waitMs: event.waitMs });
    else early.push(event); // the lease's, once it is built
  };
  try {
    const reply = await conn.request((id) => messages.acquire(id, list, fields), (waitMs ?? 0) + REPLY_SLACK_MS, true);
    return new Lease(conn, expect(reply, "acquired"), options.onLost, early);
  } catch (err) {
    conn.close();
    throw err;
  }
}

/** Runs `work` while holding `keys`, then releases them. `work` gets the
 * lease, whose `signal` aborts if a lease is lost. Rejects with LockLost if
 * a lease was lost meanwhile (without `onLost`), even when `work` succeeded
 * or failed (its error is then the LockLost's `cause`). */
export async function withLock<T>(
  keys: string | readonly string[],
  work: (lease: Lease) => Promise<T> | T,
  options: LockOptions = {},
): Promise<T> {
  const lease = await lock(keys, options);
  let result: T;
  try {
    result = await work(lease);
  } catch (err) {
    try {
      await lease.release();
    } catch (releaseError) {
      if (releaseError instanceof LockLost) {
        (releaseError as { cause?: unknown }).cause = err;
        throw releaseError;
      }
    }
    throw err;
  }
  await lease.release();
  return result;
}

async function oneShot<T>(where: Where, use: (conn: Connection) => Promise<T>): Promise<T> {
  const conn = await Connection.open(resolveSocket(where.socket));
  try {
    return await use(conn);
  } finally {
    conn.close();
  }
}

/** Every lease held through the agent (`leaseId` is "" for another user's). */
export async function status(where: Where = {}): Promise<LeaseInfo[]> {
  return oneShot(where, async (conn) => [
    ...expect(await conn.request((id) => messages.simple(id, "list"), REPLY_SLACK_MS), "leases").leases,
  ]);
}

/** A key's record in the backend, whoever holds it, on any host. */
export async function inspect(key: string, where: Where = {}): Promise<KeyRecord> {
  return oneShot(where, async (conn) =>
    expect(await conn.request((id) => messages.inspect(id, key), REPLY_SLACK_MS), "record").record,
  );
}

/** A key's latest events, oldest first (the record keeps 32); `limit` keeps the latest that many. */
export async function history(key: string, options: Where & { limit?: number } = {}): Promise<KeyEvent[]> {
  const limit = uint32(options.limit, "limit");
  return oneShot(where(options), async (conn) => [
    ...expect(await conn.request((id) => messages.history(id, key, limit), REPLY_SLACK_MS), "events").events,
  ]);
}

function where(options: Where): Where {
  return { socket: options.socket };
}

export interface ListKeysOptions extends Where {
  /** List free keys too, not only held ones. */
  free?: boolean;
  /** Include each key's events (and refusals) at or after this instant (ms since the epoch). */
  eventsSinceMs?: number;
}

/** Every host's keys under `prefix`, from the store, a page at a time. */
export async function* listKeys(prefix = "", options: ListKeysOptions = {}): AsyncGenerator<KeyListing> {
  const eventsSinceMs = millis(options.eventsSinceMs, "eventsSinceMs");
  const conn = await Connection.open(resolveSocket(options.socket));
  try {
    let cursor: string | undefined;
    do {
      const fields = { prefix: prefix || undefined, cursor, free: options.free || undefined, eventsSinceMs };
      const page = expect(await conn.request((id) => messages.listKeys(id, fields), LIST_PAGE_TIMEOUT_MS), "keys");
      yield* page.keys;
      cursor = page.cursor;
    } while (cursor !== undefined);
  } finally {
    conn.close();
  }
}

/** Breaks whoever holds `key` (or its `slot`): force rights needed. Resolves
 * with 1 once that run has stopped, or 0 if the key was free. */
export async function breakLock(
  key: string,
  options: Where & { slot?: number; onForcing?: (event: Forcing) => void } = {},
): Promise<number> {
  const slot = uint32(options.slot, "slot");
  return oneShot(where(options), async (conn) => {
    conn.onEvent = (event) => {
      if (event.type === "forcing") options.onForcing?.({ key: event.key, holder: event.holder, waitMs: event.waitMs });
    };
    return expect(await conn.request((id) => messages.breakKey(id, key, slot), REPLY_SLACK_MS, true), "released").count;
  });
}

export { RunlockError };
