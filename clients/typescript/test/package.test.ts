// The package's version is the runlock workspace's, everywhere it is written.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { VERSION } from "../src/index.js";
import { REPO } from "./agent.js";

test("the version is the workspace's", () => {
  const cargo = readFileSync(join(REPO, "Cargo.toml"), "utf8");
  const workspace = /\[workspace\.package\][^[]*?\nversion = "([^"]+)"/.exec(cargo)?.[1];
  assert.ok(workspace, "no [workspace.package] version in Cargo.toml");
  const pkg = JSON.parse(readFileSync(join(REPO, "clients", "typescript", "package.json"), "utf8")) as { version: string };
  assert.equal(pkg.version, workspace);
  assert.equal(VERSION, workspace);
});
