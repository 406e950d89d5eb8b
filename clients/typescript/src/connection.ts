// One connection to the agent: the handshake, requests matched to replies by
// id, and events handed to whoever listens. It keeps nothing a crash could
// leak: when the process dies the kernel closes the socket, and the agent
// frees the connection's keys (SPEC 5.3).

import { createConnection, type Socket } from "node:net";
import { ProtocolError, RunlockError, Unavailable } from "./errors.js";
import { hello, parseAgent, messageId, type AgentMessage, type Welcome } from "./messages.js";
import { decodeBody, encodeFrame, FrameReader, type Body } from "./wire.js";
import { VERSION } from "./version.js";

export const CLIENT_NAME = `runlock-typescript ${VERSION}`;

/** How long the agent may take to answer `hello` (its own handshake bound). */
export const HELLO_TIMEOUT_MS = 5_000;
/** How long past a request's own wait a reply may take before the agent is
 * deemed hung (its backend requests time out after a few seconds). */
export const REPLY_SLACK_MS = 30_000;
/** How long one page of `list_keys` may take (up to a thousand records). */
export const LIST_PAGE_TIMEOUT_MS = 60_000;

type Reply = Exclude<AgentMessage, { type: "error" | "lost" | "renewed" | "forcing" | "restarting" }>;

interface Pending {
  resolve(reply: Reply): void;
  reject(err: RunlockError): void;
  timer: NodeJS.Timeout | undefined;
}

/** What ended a connection, for whoever holds leases on it. */
export type Ending = { readonly restarting: boolean; readonly error: RunlockError };

export class Connection {
  /** The agent's `welcome`. */
  readonly welcome: Welcome;
  /** Called with each event (`lost`, `renewed`, `forcing`, `restarting`). */
  onEvent: (event: AgentMessage) => void = () => {};
  /** Called once when the connection ends, whatever ended it. */
  onEnd: (ending: Ending) => void = () => {};

  private nextId = 1;
  private readonly pending = new Map<number, Pending & { waitMs: number | undefined }>();
  private ended: RunlockError | undefined;
  private restarting = false;

  private constructor(
    readonly path: string,
    private readonly socket: Socket,
    welcome: Welcome,
  ) {
    this.welcome = welcome;
  }

  /** Connects and says hello; Unavailable when no agent answers in time. */
  static open(path: string): Promise<Connection> {
    return new Promise((resolve, reject) => {
      const socket = createConnection({ path });
      const reader = new FrameReader();
      let settled = false;
      const fail = (err: RunlockError): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        socket.destroy();
        reject(err);
      };
      const timer = setTimeout(
        () => fail(new Unavailable(`the agent at ${path} did not answer hello within ${HELLO_TIMEOUT_MS} ms`)),
        HELLO_TIMEOUT_MS,
      );
      socket.on("error", (err) => fail(new Unavailable(`cannot reach the agent at ${path}: ${err.message}`)));
      socket.on("close", () => fail(new Unavailable(`the agent at ${path} closed the connection during hello`)));
      const onData = (chunk: Buffer): void => {
        let bodies: Uint8Array[];
        try {
          bodies = reader.push(chunk);
        } catch (err) {
          fail(err as RunlockError);
          return;
        }
        if (bodies.length === 0) return;
        // The first frame answers hello: an error before welcome (with or
        // without id) is the agent's refusal (SPEC 5.1).
        let first: AgentMessage;
        try {
          first = parseAgent(decodeBody(bodies[0]!));
        } catch (err) {
          fail(err as RunlockError);
          return;
        }
        if (first.type === "error") return fail(first.error);
        if (first.type !== "welcome") return fail(new ProtocolError(`expected welcome, got ${first.type}`));
        if (first.version !== 1) return fail(new ProtocolError(`the agent answered version ${first.version}`));
        settled = true;
        clearTimeout(timer);
        socket.removeAllListeners();
        const { type: _type, id: _id, ...welcome } = first;
        const connection = new Connection(path, socket, welcome);
        connection.follow(reader, bodies.slice(1));
        resolve(connection);
      };
      socket.on("data", onData);
      socket.on("connect", () => {
        socket.write(encodeFrame(hello(CLIENT_NAME, process.pid)));
      });
    });
  }

  private follow(reader: FrameReader, already: Uint8Array[]): void {
    const dispatch = (bodies: Uint8Array[]): void => {
      for (const body of bodies) this.dispatch(body);
    };
    this.socket.on("data", (chunk: Buffer) => {
      try {
        dispatch(reader.push(chunk));
      } catch (err) {
        this.end(err as RunlockError); // an oversized frame: the stream is lost
      }
    });
    this.socket.on("error", (err) => this.end(new Unavailable(`connection to the agent at ${this.path} failed: ${err.message}`)));
    this.socket.on("close", () => this.end(new Unavailable(`the agent at ${this.path} closed the connection`)));
    dispatch(already);
  }

  private dispatch(raw: Uint8Array): void {
    let body: Body;
    try {
      body = decodeBody(raw);
    } catch (err) {
      // The frame's boundary is known, so the stream stays in step; nothing
      // can be matched to a request without an id.
      this.end(err as RunlockError);
      return;
    }
    let message: AgentMessage;
    try {
      message = parseAgent(body);
    } catch (err) {
      const id = messageId(body);
      if (id !== undefined && this.pending.has(id)) this.settle(id, err as RunlockError);
      else this.end(err as RunlockError);
      return;
    }
    if (message.id === undefined) {
      if (message.type === "error") {
        // Input the agent could not attribute: fail what is outstanding (SPEC 4).
        this.end(message.error);
        return;
      }
      if (message.type === "restarting") this.restarting = true;
      if (message.type === "forcing") this.extendForForcing(message.waitMs);
      if (message.type !== "unknown") this.onEvent(message); // an unknown event is a newer agent's
      return;
    }
    if (message.type === "error") this.settle(message.id, message.error);
    else if (message.type === "unknown") {
      this.settle(message.id, new ProtocolError(`unexpected reply type ${message.wireType}`));
    } else this.settle(message.id, message as Reply);
  }

  private settle(id: number, outcome: Reply | RunlockError): void {
    const pending = this.pending.get(id);
    if (pending === undefined) return;
    this.pending.delete(id);
    clearTimeout(pending.timer);
    if (outcome instanceof RunlockError) pending.reject(outcome);
    else pending.resolve(outcome);
  }

  /** A forced acquire or a break waits for the displaced run: its reply may
   * come that much later (or, with no deadline, whenever that run stops). */
  private extendForForcing(waitMs: number | undefined): void {
    for (const [id, pending] of this.pending) {
      if (pending.waitMs === undefined) continue; // not one that can force
      clearTimeout(pending.timer);
      pending.timer = waitMs === undefined ? undefined : this.timeout(id, waitMs + REPLY_SLACK_MS);
    }
  }

  private timeout(id: number, ms: number): NodeJS.Timeout {
    return setTimeout(() => {
      this.settle(id, new Unavailable(`the agent at ${this.path} did not answer within ${ms} ms`));
    }, ms);
  }

  /** Sends the request `build` makes with a fresh id; resolves with its reply,
   * rejects with the agent's error. `timeoutMs` bounds the wait; a request
   * that can force (acquire, break) gives `forcing: true`, so that a
   * `forcing` event extends its bound. */
  request(build: (id: number) => Body, timeoutMs: number, forcing = false): Promise<Reply> {
    if (this.ended) return Promise.reject(this.ended);
    const id = this.nextId++;
    let frame: Uint8Array;
    try {
      frame = encodeFrame(build(id));
    } catch (err) {
      return Promise.reject(err as Error);
    }
    return new Promise<Reply>((resolve, reject) => {
      this.pending.set(id, { resolve, reject, timer: this.timeout(id, timeoutMs), waitMs: forcing ? timeoutMs : undefined });
      this.socket.write(frame);
    });
  }

  /** Closes the connection; the agent then frees whatever it still holds. */
  close(): void {
    this.end(new Unavailable("connection closed"));
  }

  get closed(): boolean {
    return this.ended !== undefined;
  }

  private end(error: RunlockError): void {
    if (this.ended) return;
    this.ended = error;
    this.socket.destroy();
    for (const id of [...this.pending.keys()]) this.settle(id, error);
    this.onEnd({ restarting: this.restarting, error });
  }
}
