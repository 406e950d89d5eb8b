// Framing and body encoding (SPEC sections 2 and 3): a 4-byte big-endian
// length, then one MessagePack map. The only module that touches bytes.

import { Decoder, Encoder } from "@msgpack/msgpack";
import { ProtocolError } from "./errors.js";

/** Largest body either side may send (SPEC 2): 1 MiB. */
export const MAX_BODY_LEN = 1 << 20;

/** A decoded body: one map with string keys. */
export type Body = Record<string, unknown>;

// The encoder picks the smallest integer format, as the reference encoder does
// (SPEC 3.2), and writes strings in the str family. (Not with useBigInt64,
// which would write a number over 2^32, an instant in ms, as a float.)
const encoder = new Encoder({ ignoreUndefined: true });
// The decoder's useBigInt64: a uint64 arrives as a bigint, so that one beyond
// 2^53 is never silently rounded; `normalise` turns the ones a number holds
// exactly back into numbers.
const decoder = new Decoder({
  useBigInt64: true,
  // SPEC 3.1: string keys only (the library's default also lets numbers through).
  mapKeyConverter: (key: unknown) => {
    if (typeof key !== "string") {
      throw new ProtocolError(`map key ${String(key)} is not a string`);
    }
    return key;
  },
});

/** Refuses what SPEC 3.2 has no place for, before it reaches the agent. */
function checkWireValue(value: unknown, where: string): void {
  if (value === undefined || typeof value === "boolean" || typeof value === "string") {
    return;
  }
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value) || value < 0) {
      throw new RangeError(`${where}: ${value} is not an unsigned integer this client can send`);
    }
    return;
  }
  if (Array.isArray(value)) {
    value.forEach((item, index) => checkWireValue(item, `${where}[${index}]`));
    return;
  }
  if (isPlainObject(value)) {
    for (const [key, item] of Object.entries(value)) {
      checkWireValue(item, `${where}.${key}`);
    }
    return;
  }
  throw new TypeError(`${where}: a ${typeof value} cannot be sent (SPEC 3.2)`);
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== "object" || value === null) return false;
  const proto = Object.getPrototypeOf(value) as unknown;
  return proto === Object.prototype || proto === null;
}

/** Encodes one map in its insertion order (builders use the reference order,
 * which reproduces the vectors byte for byte). */
export function encodeBody(message: Body): Uint8Array {
  checkWireValue(message, "message");
  return encoder.encode(message);
}

/** Turns 64-bit integers that a number holds exactly into numbers; refuses
 * what this client cannot carry (bin, ext, floats, negative or huge integers). */
function normalise(value: unknown, where: string): unknown {
  if (typeof value === "bigint") {
    if (value < 0n) throw new ProtocolError(`${where}: ${value} is negative`);
    if (value > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw new ProtocolError(`${where}: ${value} is beyond 2^53, which this client cannot hold exactly`);
    }
    return Number(value);
  }
  if (typeof value === "number") {
    if (!Number.isInteger(value)) throw new ProtocolError(`${where}: floats are not used (SPEC 3.2)`);
    if (value < 0) throw new ProtocolError(`${where}: ${value} is negative (integers are unsigned, SPEC 3.2)`);
    return value;
  }
  if (value === null || typeof value === "string" || typeof value === "boolean") return value;
  if (Array.isArray(value)) return value.map((item, index) => normalise(item, `${where}[${index}]`));
  if (isPlainObject(value)) {
    for (const key of Object.keys(value)) value[key] = normalise(value[key], `${where}.${key}`);
    return value;
  }
  throw new ProtocolError(`${where}: bin and ext values are not used (SPEC 3.2)`);
}

/** Decodes one body; ProtocolError unless it is exactly one map with string keys. */
export function decodeBody(body: Uint8Array): Body {
  let value: unknown;
  try {
    value = decoder.decode(body);
  } catch (err) {
    if (err instanceof ProtocolError) throw err;
    throw new ProtocolError(`cannot decode message: ${(err as Error).message}`);
  }
  if (!isPlainObject(value)) {
    throw new ProtocolError("cannot decode message: not a MessagePack map");
  }
  return normalise(value, "message") as Body;
}

/** A message with its length prefix; refuses bodies over 1 MiB (SPEC 2). */
export function encodeFrame(message: Body): Uint8Array {
  const body = encodeBody(message);
  if (body.length > MAX_BODY_LEN) {
    throw new ProtocolError(`message of ${body.length} bytes is over the ${MAX_BODY_LEN}-byte limit`);
  }
  const frame = new Uint8Array(4 + body.length);
  new DataView(frame.buffer).setUint32(0, body.length);
  frame.set(body, 4);
  return frame;
}

/** Cuts a byte stream into frame bodies. The length is checked before any of
 * the body is kept (SPEC 2): an oversized frame throws, and the stream cannot
 * be read on. */
export class FrameReader {
  private chunks: Buffer[] = [];
  private buffered = 0;

  /** Adds bytes; returns the bodies now complete, in order. */
  push(chunk: Buffer): Uint8Array[] {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    const bodies: Uint8Array[] = [];
    for (;;) {
      if (this.buffered < 4) break;
      const head = this.take(4, false);
      const length = head.readUInt32BE(0);
      if (length > MAX_BODY_LEN) {
        throw new ProtocolError(`agent sent a ${length}-byte frame, over the ${MAX_BODY_LEN}-byte limit`);
      }
      if (this.buffered < 4 + length) break;
      this.take(4, true);
      bodies.push(this.take(length, true));
    }
    return bodies;
  }

  /** True while part of a frame is waiting for the rest. */
  get midFrame(): boolean {
    return this.buffered > 0;
  }

  private take(count: number, consume: boolean): Buffer {
    const joined = this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks);
    const taken = Buffer.from(joined.subarray(0, count));
    if (consume) {
      const rest = joined.subarray(count);
      this.chunks = rest.length ? [rest] : [];
      this.buffered = rest.length;
    } else {
      this.chunks = [joined];
    }
    return taken;
  }
}
