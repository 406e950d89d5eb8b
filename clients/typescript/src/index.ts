// runlock for Node.js: a client of runlockd, the runlock agent, over its Unix
// socket (protocol/SPEC.md).

export { lock, withLock, status, inspect, history, listKeys, breakLock, Lease } from "./api.js";
export type { LockOptions, ListKeysOptions, Where } from "./api.js";
export * from "./errors.js";
export type {
  Forcing,
  Grant,
  Holder,
  KeyEvent,
  KeyListing,
  KeyRecord,
  LeaseInfo,
  LostEvent,
  Refusal,
  Renewed,
  Waiter,
  Welcome,
} from "./messages.js";
export { resolveSocket } from "./socketPath.js";
export { VERSION } from "./version.js";
