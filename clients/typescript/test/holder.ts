// A process that takes a key and holds it until killed: the crash test's
// victim. Prints the token once it holds the key.

import { lock } from "../src/index.js";

const [socket, key] = process.argv.slice(2);
const lease = await lock(key!, { socket: socket! });
process.stdout.write(`held ${lease.token}\n`);
setInterval(() => {}, 1 << 30); // the socket keeps the process alive anyway; this says so
