// The protocol's messages (SPEC sections 6 and 7). Requests are built in the
// reference encoder's field order, so they encode to the vectors' exact
// bytes; agent messages are read by schema into typed objects. Unknown enum
// values are kept as the string they are (SPEC 3.3).

import { fromWire, type RunlockError } from "./errors.js";
import { decode, type Schema } from "./fields.js";
import type { Body } from "./wire.js";

export const PROTOCOL_VERSION = 1;

const NONE: readonly never[] = Object.freeze([]);

/** Who holds a lease (SPEC 7.1). `slot` and `slots` only for a key with slots. */
export interface Holder {
  readonly host: string;
  readonly agentId: string;
  readonly pid: number;
  readonly uid: number;
  readonly gid: number;
  readonly user: string;
  readonly command: string;
  readonly acquiredAtMs: number;
  readonly token: number;
  readonly slot?: number;
  readonly slots?: number;
}

const HOLDER: Schema = {
  host: ["str", "required"],
  agent_id: ["str", "required"],
  pid: ["u32", "required"],
  uid: ["u32", "required"],
  gid: ["u32", { default: 0 }],
  user: ["str", "required"],
  command: ["str", "required"],
  acquired_at_ms: ["u64", "required"],
  token: ["u64", "required"],
  slot: ["u32", "optional"],
  slots: ["u32", "optional"],
};

/** One key granted by `acquire` (SPEC 7.2); `slot` for a key with slots,
 * whose `token` is then that slot's own. */
export interface Grant {
  readonly key: string;
  readonly leaseId: string;
  readonly token: number;
  readonly slot?: number;
}

const GRANT: Schema = {
  key: ["str", "required"],
  lease_id: ["str", "required"],
  token: ["u64", "required"],
  slot: ["u32", "optional"],
};

/** One entry of a key's history (SPEC 7.6). */
export interface KeyEvent {
  /** granted, released, forced, broken, expired, lost, adopted (or newer). */
  readonly kind: string;
  readonly atMs: number;
  /** store or agent: whose clock `atMs` is. */
  readonly clock: string;
  readonly token: number;
  readonly fromToken?: number;
  readonly host: string;
  readonly agentId: string;
  readonly pid: number;
  readonly uid: number;
  readonly user: string;
  readonly reason: string;
  readonly slot?: number;
}

const KEY_EVENT: Schema = {
  kind: ["str", "required"],
  at_ms: ["u64", "required"],
  clock: ["str", "required"],
  token: ["u64", "required"],
  from_token: ["u64", "optional"],
  host: ["str", "required"],
  agent_id: ["str", "required"],
  pid: ["u32", "required"],
  uid: ["u32", "required"],
  user: ["str", "required"],
  reason: ["str", { default: "" }],
  slot: ["u32", "optional"],
};

/** A key's record in the backend, as `inspect` reports it (SPEC 7.4). For a
 * key with slots, `slots` and `holders` (one per held slot); `state`, `token`,
 * `holder` and `expiresInMs` are then the lowest held slot's. */
export interface KeyRecord {
  readonly key: string;
  /** free or held (or a newer value). */
  readonly state: string;
  readonly token: number;
  readonly holder?: Holder;
  readonly expiresInMs?: number;
  /** host or global. */
  readonly scope: string;
  /** The key's last force, break, expiry or loss, when its history keeps one. */
  readonly incident?: KeyEvent;
  readonly slots?: number;
  readonly holders: readonly Holder[];
}

const KEY_RECORD: Schema = {
  key: ["str", "required"],
  state: ["str", "required"],
  token: ["u64", "required"],
  holder: [{ object: HOLDER }, "optional"],
  expires_in_ms: ["u64", "optional"],
  scope: ["str", "required"],
  incident: [{ object: KEY_EVENT }, "optional"],
  slots: ["u32", "optional"],
  holders: [{ array: HOLDER }, { default: NONE }],
};

/** One lease as `status` (the `list` request) reports it (SPEC 7.3);
 * `leaseId` is "" for another user's lease. */
export interface LeaseInfo {
  readonly key: string;
  readonly leaseId: string;
  readonly ttlMs: number;
  readonly holder: Holder;
  readonly childPid?: number;
}

const LEASE_INFO: Schema = {
  key: ["str", "required"],
  lease_id: ["str", "required"],
  ttl_ms: ["u64", "required"],
  holder: [{ object: HOLDER }, "required"],
  child_pid: ["u32", "optional"],
};

/** An acquire an agent refused because its key was held (SPEC 7.8). */
export interface Refusal {
  readonly atMs: number;
  readonly host: string;
  readonly uid: number;
  readonly user: string;
  readonly pid: number;
  readonly waitedMs: number;
}

const REFUSAL: Schema = {
  at_ms: ["u64", "required"],
  host: ["str", { default: "" }],
  uid: ["u32", "required"],
  user: ["str", "required"],
  pid: ["u32", "required"],
  waited_ms: ["u64", { default: 0 }],
};

/** An acquire waiting for a key, through any agent (SPEC 7.8). */
export interface Waiter {
  readonly host: string;
  readonly uid: number;
  readonly user: string;
  readonly pid: number;
  readonly sinceMs: number;
}

const WAITER: Schema = {
  host: ["str", "required"],
  uid: ["u32", "required"],
  user: ["str", "required"],
  pid: ["u32", "required"],
  since_ms: ["u64", "required"],
};

/** One key of a `listKeys` page (SPEC 7.7): its record, or why it could not be read. */
export interface KeyListing {
  readonly key: string;
  readonly record?: KeyRecord;
  readonly unreadable?: string;
  readonly events: readonly KeyEvent[];
  readonly eventsOmitted: number;
  readonly waitingHere: number;
  readonly waiters: readonly Waiter[];
  readonly refused: readonly Refusal[];
}

const KEY_LISTING: Schema = {
  key: ["str", "required"],
  record: [{ object: KEY_RECORD }, "optional"],
  unreadable: ["str", "optional"],
  events: [{ array: KEY_EVENT }, { default: NONE }],
  events_omitted: ["u32", { default: 0 }],
  waiting_here: ["u32", { default: 0 }],
  waiters: [{ array: WAITER }, { default: NONE }],
  refused: [{ array: REFUSAL }, { default: NONE }],
};

/** The agent's answer to `hello` (SPEC 6.2). */
export interface Welcome {
  readonly version: number;
  readonly agent: string;
  readonly agentId: string;
  readonly backend: string;
  readonly scope: string;
  readonly defaultTtlMs: number;
  /** fail, warn or skip: what the operator wants runs to do without a backend. */
  readonly onUnavailable: string;
  readonly leasesSurviveAgent: boolean;
}

/** A lease ended while held: the agent's `lost` event (`forced`, `broken`,
 * `expired`), or this client's own `restarting` and `agent_gone` (the agent
 * said it is going away, or the connection ended). `holder` is the new holder
 * after `forced`. */
export interface LostEvent {
  readonly leaseId: string;
  readonly key: string;
  readonly reason: string;
  readonly message: string;
  readonly holder?: Holder;
}

/** A forced acquire (or a break) has taken `key` and waits, at most `waitMs`
 * (undefined: no deadline, on file://), for the run it took it from to stop. */
export interface Forcing {
  readonly key: string;
  readonly holder?: Holder;
  readonly waitMs?: number;
}

/** A lease was renewed: it stays guaranteed for `validForMs` from now. */
export interface Renewed {
  readonly leaseId: string;
  readonly validForMs: number;
}

/** Every agent message, by `type`; `unknown` for a type this client does not know. */
export type AgentMessage = { readonly id: number | undefined } & (
  | ({ readonly type: "welcome" } & Welcome)
  | {
      readonly type: "acquired";
      readonly leases: readonly Grant[];
      readonly ttlMs: number;
      readonly validForMs?: number;
      readonly locks: number;
    }
  | { readonly type: "released"; readonly count: number }
  | { readonly type: "leases"; readonly leases: readonly LeaseInfo[]; readonly omitted: number }
  | { readonly type: "record"; readonly record: KeyRecord }
  | { readonly type: "events"; readonly key: string; readonly events: readonly KeyEvent[] }
  | { readonly type: "keys"; readonly keys: readonly KeyListing[]; readonly cursor?: string }
  | { readonly type: "attached" | "pong" | "restarting" }
  | { readonly type: "error"; readonly error: RunlockError }
  | ({ readonly type: "lost" } & LostEvent)
  | ({ readonly type: "forcing" } & Forcing)
  | ({ readonly type: "renewed" } & Renewed)
  | { readonly type: "unknown"; readonly wireType: string }
);

const REPLIES: Readonly<Record<string, Schema>> = {
  welcome: {
    version: ["u16", "required"],
    agent: ["str", "required"],
    agent_id: ["str", "required"],
    backend: ["str", "required"],
    scope: ["str", "required"],
    default_ttl_ms: ["u64", "required"],
    on_unavailable: ["str", { default: "fail" }],
    leases_survive_agent: ["bool", { default: false }],
  },
  acquired: {
    leases: [{ array: GRANT }, "required"],
    ttl_ms: ["u64", "required"],
    valid_for_ms: ["u64", "optional"],
    locks: ["u32", { default: 0 }],
  },
  released: { count: ["u32", "required"] },
  leases: { leases: [{ array: LEASE_INFO }, "required"], omitted: ["u32", { default: 0 }] },
  events: { key: ["str", "required"], events: [{ array: KEY_EVENT }, "required"] },
  keys: { keys: [{ array: KEY_LISTING }, "required"], cursor: ["str", "optional"] },
  attached: {},
  pong: {},
  restarting: {},
  lost: {
    lease_id: ["str", "required"],
    key: ["str", "required"],
    reason: ["str", "required"],
    message: ["str", "required"],
    holder: [{ object: HOLDER }, "optional"],
  },
  forcing: { key: ["str", "required"], holder: [{ object: HOLDER }, "optional"], wait_ms: ["u64", "optional"] },
  renewed: { lease_id: ["str", "required"], valid_for_ms: ["u64", "required"] },
};

const ERROR: Schema = {
  code: ["str", "required"],
  message: ["str", "required"],
  key: ["str", "optional"],
  holder: [{ object: HOLDER }, "optional"],
  holders: [{ array: HOLDER }, { default: NONE }],
};

/** The body's `id` when it is readable, even if the rest is not (SPEC 3.4). */
export function messageId(body: Body): number | undefined {
  const id = body["id"];
  return typeof id === "number" && Number.isInteger(id) && id >= 0 ? id : undefined;
}

/** A decoded agent body as a typed message; ProtocolError when a field is
 * missing or of the wrong type. */
export function parseAgent(body: Body): AgentMessage {
  const { id } = decode<{ id?: number }>({ id: ["u64", "optional"], type: ["str", "required"] }, body);
  const type = body["type"] as string;
  if (type === "record") {
    return { type, id, record: decode<KeyRecord>(KEY_RECORD, body) };
  }
  if (type === "error") {
    const e = decode<{ code: string; message: string; key?: string; holder?: Holder; holders: Holder[] }>(ERROR, body);
    return { type, id, error: fromWire(e.code, e.message, e.key, e.holder, e.holders) };
  }
  const schema = REPLIES[type];
  if (schema === undefined) return { type: "unknown", id, wireType: type };
  return { ...decode<object>(schema, body), type, id } as AgentMessage;
}

// ---------------------------------------------------------------- requests

function withId(id: number | undefined, type: string): Body {
  return id === undefined ? { type } : { id, type };
}

/** `hello`, the first message of every connection. */
export function hello(client: string, pid: number, options: { takesLocks?: boolean } = {}): Body {
  const message: Body = { type: "hello", version: PROTOCOL_VERSION, client, pid };
  if (options.takesLocks) message["takes_locks"] = true;
  return message;
}

export interface AcquireFields {
  ttlMs?: number | undefined;
  waitMs?: number | undefined;
  force?: boolean | undefined;
  command?: string | undefined;
  onLost?: "term" | "kill" | "ignore" | undefined;
  slots?: number | undefined;
}

/** `acquire`. `command` and `on_lost` are always written, as the reference
 * encoder does; `slots` only when not 1, so a plain key keeps its bytes. */
export function acquire(id: number, keys: readonly string[], fields: AcquireFields = {}): Body {
  const message = withId(id, "acquire");
  message["keys"] = [...keys];
  if (fields.ttlMs !== undefined) message["ttl_ms"] = fields.ttlMs;
  if (fields.waitMs !== undefined) message["wait_ms"] = fields.waitMs;
  if (fields.force !== undefined) message["force"] = fields.force;
  message["command"] = fields.command ?? "";
  message["on_lost"] = fields.onLost ?? "term";
  if (fields.slots !== undefined && fields.slots !== 1) message["slots"] = fields.slots;
  return message;
}

/** `release` of leases this connection holds. */
export function releaseLeases(id: number, leaseIds: readonly string[]): Body {
  if (leaseIds.length === 0) throw new RangeError("release needs at least one lease id");
  return { ...withId(id, "release"), lease_ids: [...leaseIds] };
}

/** `release{key}`: breaks whoever holds `key` (or its `slot`). */
export function breakKey(id: number, key: string, slot?: number): Body {
  const message = { ...withId(id, "release"), key };
  return slot === undefined ? message : { ...message, slot };
}

/** `attach`: names the process group `on_lost` acts on. */
export function attach(id: number, pid: number, pgid: number): Body {
  return { ...withId(id, "attach"), pid, pgid };
}

/** `reattach`: has a new agent adopt leases taken through one that stopped. */
export function reattach(id: number, leases: readonly Grant[], onLost = "term"): Body {
  const wire = leases.map((g) => {
    const lease: Body = { key: g.key, lease_id: g.leaseId, token: g.token };
    if (g.slot !== undefined) lease["slot"] = g.slot;
    return lease;
  });
  return { ...withId(id, "reattach"), leases: wire, on_lost: onLost };
}

/** A request without fields: `list` or `ping`. */
export function simple(id: number, type: "list" | "ping"): Body {
  return withId(id, type);
}

/** `inspect`: a key's record in the backend. */
export function inspect(id: number, key: string): Body {
  return { ...withId(id, "inspect"), key };
}

/** `history`: the key's latest events; `limit` 0 (or none) for all it keeps. */
export function history(id: number, key: string, limit?: number): Body {
  const message: Body = { ...withId(id, "history"), key };
  if (limit !== undefined) message["limit"] = limit;
  return message;
}

export interface ListKeysFields {
  prefix?: string | undefined;
  cursor?: string | undefined;
  free?: boolean | undefined;
  eventsSinceMs?: number | undefined;
}

/** `list_keys`: one page of the backend's keys. */
export function listKeys(id: number, fields: ListKeysFields = {}): Body {
  const message = withId(id, "list_keys");
  if (fields.prefix !== undefined) message["prefix"] = fields.prefix;
  if (fields.cursor !== undefined) message["cursor"] = fields.cursor;
  if (fields.free !== undefined) message["free"] = fields.free;
  if (fields.eventsSinceMs !== undefined) message["events_since_ms"] = fields.eventsSinceMs;
  return message;
}
