// A real runlockd for tests, on a socket of its own, with an empty
// configuration and none of the caller's RUNLOCK_* settings (as
// clients/python's runlock.testing does).

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createConnection } from "node:net";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";

/** The repository: this file runs from clients/typescript/build/test/. */
export const REPO = resolve(fileURLToPath(import.meta.url), "../../../../..");
export const VECTORS = join(REPO, "protocol", "vectors");

/** Bounds every start-up and shutdown of an agent. */
const AGENT_START_TIMEOUT_MS = 20_000;
const NOT_INHERITED = ["RUNLOCK_", "AWS_", "NOTIFY_"];

let built: string | undefined;

/** $RUNLOCKD, else the workspace's debug runlockd (built with cargo once). */
export function runlockd(): string {
  if (process.env["RUNLOCKD"]) return process.env["RUNLOCKD"];
  if (built) return built;
  const build = spawnSync("cargo", ["build", "-q", "-p", "runlock-agent", "--bin", "runlockd"], { cwd: REPO, stdio: "inherit" });
  if (build.status !== 0) throw new Error("cargo build of runlockd failed (or set RUNLOCKD to a built binary)");
  const meta = spawnSync("cargo", ["metadata", "--format-version", "1", "--no-deps"], { cwd: REPO, encoding: "utf8" });
  built = join(JSON.parse(meta.stdout).target_directory as string, "debug", "runlockd");
  return built;
}

/** A directory under /tmp: a Unix socket path must stay under ~108 bytes. */
export function workdir(): string {
  return mkdtempSync("/tmp/runlock-ts-");
}

export type BackendName = "memory" | "file";

export class Agent {
  readonly socket: string;
  readonly backend: string;
  private readonly proc: ChildProcess;
  private readonly logPath: string;
  private exited: Promise<number | null>;

  private constructor(readonly dir: string, backend: BackendName | string, name: string, extraEnv: Record<string, string>) {
    this.socket = join(dir, `${name}.sock`);
    this.backend = backend === "memory" ? "memory://" : backend === "file" ? `file://${join(dir, "locks")}` : backend;
    this.logPath = join(dir, `${name}.log`);
    const config = join(dir, `${name}.toml`);
    writeFileSync(config, "");
    const env = {
      ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !NOT_INHERITED.some((prefix) => k.startsWith(prefix)))),
      ...extraEnv,
    };
    const log = openSync(this.logPath, "w");
    this.proc = spawn(runlockd(), ["--config", config, "--socket", this.socket, "--backend", this.backend], {
      env,
      stdio: ["ignore", log, log],
    });
    closeSync(log);
    this.exited = new Promise((done) => this.proc.once("exit", (code) => done(code)));
  }

  /** Starts an agent in `dir` on `backend` (a name, or a URI with the
   * environment it needs) and waits (bounded) until its socket accepts. */
  static async start(dir: string, backend: BackendName | string, name = "agent", env: Record<string, string> = {}): Promise<Agent> {
    const agent = new Agent(dir, backend, name, env);
    const deadline = Date.now() + AGENT_START_TIMEOUT_MS;
    for (;;) {
      if (agent.proc.exitCode !== null) throw new Error(`runlockd exited: ${agent.log()}`);
      if (await accepts(agent.socket)) return agent;
      if (Date.now() > deadline) {
        await agent.stop("SIGKILL");
        throw new Error(`runlockd did not listen within ${AGENT_START_TIMEOUT_MS} ms: ${agent.log()}`);
      }
      await sleep(20);
    }
  }

  log(): string {
    return readFileSync(this.logPath, "utf8");
  }

  /** Ends the agent (SIGKILL if `signal` has not within the bound). */
  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill(signal);
      const timer = setTimeout(() => this.proc.kill("SIGKILL"), AGENT_START_TIMEOUT_MS);
      await this.exited;
      clearTimeout(timer);
    }
  }
}

function accepts(path: string): Promise<boolean> {
  return new Promise((done) => {
    const probe = createConnection({ path });
    probe.once("connect", () => {
      probe.destroy();
      done(true);
    });
    probe.once("error", () => done(false));
  });
}

/** Runs `body` against a fresh agent on `backend`, then stops it and removes its directory. */
export async function withAgent(backend: BackendName, body: (agent: Agent) => Promise<void>): Promise<void> {
  const dir = workdir();
  const agent = await Agent.start(dir, backend);
  try {
    await body(agent);
  } finally {
    await agent.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** A fresh bucket in moto at RUNLOCK_TEST_S3_ENDPOINT (scripts/test starts it)
 * and what an agent needs to use it, as clients/python's tests do; undefined
 * without the emulator, which fails in CI rather than pass unnoticed. */
export async function s3Backend(): Promise<{ uri: string; env: Record<string, string> } | undefined> {
  const endpoint = process.env["RUNLOCK_TEST_S3_ENDPOINT"];
  if (!endpoint) {
    if (process.env["CI"]) throw new Error("RUNLOCK_TEST_S3_ENDPOINT is not set (source tests/scripts/moto.sh; moto_start)");
    return undefined;
  }
  const bucket = `runlock-ts-${Math.random().toString(16).slice(2, 10)}`;
  // moto accepts an unsigned bucket creation, as the Rust tests use it.
  const created = await fetch(`${endpoint}/${bucket}`, { method: "PUT", signal: AbortSignal.timeout(10_000) });
  if (!created.ok) throw new Error(`creating bucket ${bucket}: ${created.status}`);
  return {
    uri: `s3://${bucket}/locks`,
    env: {
      AWS_ENDPOINT_URL: endpoint,
      AWS_ENDPOINT_URL_S3: endpoint,
      AWS_ACCESS_KEY_ID: "test",
      AWS_SECRET_ACCESS_KEY: "test",
      AWS_REGION: "us-east-1",
      AWS_EC2_METADATA_DISABLED: "true",
    },
  };
}
