// Reads an agent body's fields by a schema: each field's wire type and range
// is checked, a missing required field or a wrong type is a ProtocolError,
// unknown fields are ignored (SPEC 3.3). Names turn from the wire's
// snake_case into camelCase.

import { ProtocolError } from "./errors.js";
import type { Body } from "./wire.js";

const LIMITS = { u16: 0xffff, u32: 0xffffffff, u64: Number.MAX_SAFE_INTEGER } as const;

/** A field's wire type: a scalar, a nested object, or an array of objects. */
export type Kind = "str" | "bool" | keyof typeof LIMITS | { object: Schema } | { array: Schema };

/** `required`; `optional` (absent reads as undefined); or a default. */
export type Presence = "required" | "optional" | { default: unknown };

export type Schema = Readonly<Record<string, readonly [Kind, Presence]>>;

function camel(name: string): string {
  return name.replace(/_([a-z])/g, (_, letter: string) => letter.toUpperCase());
}

function isMap(value: unknown): value is Body {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function readValue(kind: Kind, value: unknown, where: string): unknown {
  if (kind === "str") {
    if (typeof value !== "string") throw new ProtocolError(`${where}: ${String(value)} is not a string`);
    return value;
  }
  if (kind === "bool") {
    if (typeof value !== "boolean") throw new ProtocolError(`${where}: ${String(value)} is not a boolean`);
    return value;
  }
  if (typeof kind === "string") {
    if (typeof value !== "number" || !Number.isInteger(value) || value < 0 || value > LIMITS[kind]) {
      throw new ProtocolError(`${where}: ${String(value)} is not a ${kind} (an unsigned integer in range)`);
    }
    return value;
  }
  if ("object" in kind) {
    if (!isMap(value)) throw new ProtocolError(`${where}: not a map`);
    return decode(kind.object, value, where);
  }
  if (!Array.isArray(value)) throw new ProtocolError(`${where}: not an array`);
  return value.map((item, index) => {
    if (!isMap(item)) throw new ProtocolError(`${where}[${index}]: not a map`);
    return decode(kind.array, item, `${where}[${index}]`);
  });
}

/** The object `schema` describes, read from `body`. */
export function decode<T>(schema: Schema, body: Body, where = String(body["type"] ?? "message")): T {
  const out: Record<string, unknown> = {};
  for (const [name, [kind, presence]] of Object.entries(schema)) {
    const value = body[name];
    if (value === undefined) {
      if (presence === "required") throw new ProtocolError(`${where}: missing field ${name}`);
      if (presence !== "optional") out[camel(name)] = presence.default;
      continue;
    }
    out[camel(name)] = readValue(kind, value, `${where}.${name}`);
  }
  return out as T;
}
