// Errors of the runlock client. Agent errors map from their wire `code`
// (SPEC 9); a code this client does not know is still a failure: a plain
// RunlockError carrying it.

import type { Holder, LostEvent } from "./messages.js";

/** Any failure of a runlock operation. `code` is the agent's error code
 * (undefined for failures found on this side), `key` the key concerned. */
export class RunlockError extends Error {
  readonly code: string | undefined;
  readonly key: string | undefined;

  constructor(message: string, options: { code?: string | undefined; key?: string | undefined } = {}) {
    super(message);
    this.name = new.target.name;
    this.code = options.code;
    this.key = options.key;
  }
}

/** Options of the errors that name who holds the key. */
export interface HolderDetails {
  code?: string | undefined;
  key?: string | undefined;
  holder?: Holder | undefined;
  holders?: readonly Holder[] | undefined;
}

/** The key is held: `holder` says who; for a key with slots every slot is
 * held, and `holders` names each slot's holder (`holder` is the first). */
export class Held extends RunlockError {
  readonly holder: Holder | undefined;
  readonly holders: readonly Holder[];

  constructor(message: string, details: HolderDetails = {}) {
    super(message, { code: details.code ?? "held", key: details.key });
    this.holder = details.holder;
    this.holders = details.holders ?? [];
  }
}

/** Still held after waiting: the same condition as Held, after `waitMs`. */
export class Timeout extends Held {}

/** The agent cannot be reached (`code` undefined), or it or its backend is
 * unavailable (`code` "unavailable", such as "agent busy" at its limits). */
export class Unavailable extends RunlockError {}
/** A key breaks the key rules (SPEC 8.1). */
export class InvalidKey extends RunlockError {}
/** `force` or `breakLock` without force rights. */
export class Forbidden extends RunlockError {}
/** A release named a lease this connection does not hold. */
export class NotOwner extends RunlockError {}
/** The agent, or its backend, does not do this. */
export class Unsupported extends RunlockError {}
/** The agent could not accept the request as sent (a TTL out of range...). */
export class BadRequest extends RunlockError {}

/** The key is held by holders that took it with another count of slots:
 * waiting does not cure it. `heldWith` is their count (1 for a plain key). */
export class SlotsMismatch extends BadRequest {
  readonly holder: Holder | undefined;
  readonly holders: readonly Holder[];

  constructor(message: string, details: HolderDetails = {}) {
    super(message, { code: details.code ?? "slots_mismatch", key: details.key });
    this.holder = details.holder;
    this.holders = details.holders ?? [];
  }

  get heldWith(): number | undefined {
    const first = this.holders[0] ?? this.holder;
    return first === undefined ? undefined : (first.slots ?? 1);
  }
}

/** The agent failed; its log has the details. */
export class Internal extends RunlockError {}
/** The agent broke the protocol, or does not speak version 1. */
export class ProtocolError extends RunlockError {}
/** No socket path could be found. */
export class ConfigError extends RunlockError {}

/** A lease ended while it was held: the work ran, or runs, unprotected.
 * `event` is the first loss, `events` all of them. */
export class LockLost extends RunlockError {
  readonly event: LostEvent;
  readonly events: readonly LostEvent[];

  constructor(events: readonly LostEvent[]) {
    const first = events[0]!;
    super(`lock on ${JSON.stringify(first.key)} lost (${first.reason}): ${first.message}`, { key: first.key });
    this.event = first;
    this.events = [...events];
  }
}

const PLAIN: Record<string, new (message: string, options: { code?: string; key?: string | undefined }) => RunlockError> = {
  unavailable: Unavailable,
  invalid_key: InvalidKey,
  forbidden: Forbidden,
  not_owner: NotOwner,
  unsupported: Unsupported,
  unsupported_version: ProtocolError,
  bad_request: BadRequest,
  internal: Internal,
};

/** The error for an agent `error` reply; an unknown code gives a plain RunlockError. */
export function fromWire(
  code: string,
  message: string,
  key?: string,
  holder?: Holder,
  holders: readonly Holder[] = [],
): RunlockError {
  const details = { code, key, holder, holders };
  switch (code) {
    case "held":
      return new Held(message, details);
    case "timeout":
      return new Timeout(message, details);
    case "slots_mismatch":
      return new SlotsMismatch(message, details);
  }
  const Kind = PLAIN[code] ?? RunlockError;
  return new Kind(message, { code, key });
}
