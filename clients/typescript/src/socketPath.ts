// The socket rule (SPEC 1, docs/src/agent.md "The socket rule"): the same
// path the shim and the agent find.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ConfigError } from "./errors.js";

export const SYSTEM_SOCKET = "/run/runlock/agent.sock";
const SYSTEM_CONFIG = "/etc/runlock/runlockd.toml";

function nonEmpty(name: string): string | undefined {
  const value = process.env[name];
  return value ? value : undefined;
}

/** The agent configuration's top-level `socket` setting, when it is a plain
 * basic string (the form the book shows); a file that is missing or cannot be
 * read is skipped, as the shim goes on without it. */
export function configuredSocket(): string | undefined {
  let text: string;
  try {
    text = readFileSync(nonEmpty("RUNLOCK_CONFIG") ?? SYSTEM_CONFIG, "utf8");
  } catch {
    return undefined;
  }
  for (const line of text.split("\n")) {
    if (/^\s*\[/.test(line)) return undefined; // tables begin: no top-level key after this
    const found = /^\s*socket\s*=\s*"([^"\\]+)"\s*(#.*)?$/.exec(line);
    if (found) return found[1];
  }
  return undefined;
}

/** The socket path: `explicit`, else RUNLOCK_SOCKET, else the configuration's
 * `socket`, else root's or $XDG_RUNTIME_DIR's; ConfigError when none applies. */
export function resolveSocket(explicit?: string): string {
  if (explicit !== undefined) return explicit;
  const found = nonEmpty("RUNLOCK_SOCKET") ?? configuredSocket();
  if (found) return found;
  if (process.geteuid?.() === 0) return SYSTEM_SOCKET;
  const runtime = nonEmpty("XDG_RUNTIME_DIR");
  if (runtime) return join(runtime, "runlock", "agent.sock");
  throw new ConfigError(
    "no runlock socket: pass `socket`, set RUNLOCK_SOCKET or XDG_RUNTIME_DIR, or run as root",
  );
}
