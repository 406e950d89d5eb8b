#!/usr/bin/env bash
# The TypeScript client's checks, for scripts/test and CI; exits non-zero on
# any failure. Node.js and npm through scripts/lib/need.sh; the packages from
# package-lock.json (`npm ci`); tsc builds the package and its declarations;
# the tarball `npm pack` makes is installed into a scratch project and
# type-checked from there (so its types are seen to work); then node's test
# runner, against a real runlockd: $RUNLOCKD, else the workspace's debug build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../scripts/lib/need.sh"
need node nodejs
need npm npm
cd "$here"

if [ -z "${RUNLOCKD:-}" ]; then
    (cd ../.. && cargo build -q -p runlock-agent --bin runlockd)
    RUNLOCKD="$(cd ../.. && cargo metadata --format-version 1 --no-deps | node -pe 'JSON.parse(require("fs").readFileSync(0)).target_directory')/debug/runlockd"
    export RUNLOCKD
fi

echo "-- npm ci, tsc"
npm ci --no-audit --no-fund --loglevel=error
npm run --silent build
npm run --silent build:test

echo "-- the packed package, as a typed dependency of strict code"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
tarball="$scratch/$(npm pack --silent --pack-destination "$scratch")"
mkdir "$scratch/app"
cat >"$scratch/app/package.json" <<'JSON'
{ "name": "uses-runlock", "private": true, "type": "module" }
JSON
cat >"$scratch/app/app.ts" <<'TS'
import { lock, Held, type Lease } from "runlock";
import { RunlockCoordinator } from "runlock/node-cron";

export async function token(key: string): Promise<number> {
  const lease: Lease = await lock(key, { waitMs: 1500 });
  try {
    return lease.token;
  } finally {
    await lease.release();
  }
}
export const coordinator = new RunlockCoordinator({ keyFor: (cronKey) => `jobs:${cronKey}` });
export const isHeld = (err: unknown): boolean => err instanceof Held;
TS
(cd "$scratch/app" && npm install --no-audit --no-fund --loglevel=error --prefer-offline "$tarball" \
    && "$here/node_modules/.bin/tsc" --strict --noEmit --skipLibCheck --module NodeNext --moduleResolution NodeNext \
        --types node --typeRoots "$here/node_modules/@types" app.ts \
    && node --input-type=module -e 'import("runlock").then((m) => { if (typeof m.lock !== "function") process.exit(1); })')

echo "-- node --test"
node --test --test-reporter=spec --test-concurrency=2 --test-timeout=120000 build/test/*.test.js
