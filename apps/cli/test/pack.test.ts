import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { expect, it } from "vitest";

const SCRIPT = fileURLToPath(new URL("../../../scripts/pack-test.mjs", import.meta.url));

it("every package installs from its tarball and loads on its own (scripts/pack-test.mjs)", () => {
  const r = spawnSync("node", [SCRIPT], { encoding: "utf8", timeout: 240_000 });
  const output = `${r.stdout}${r.stderr}`;
  expect(r.status, output).toBe(0);
  expect(output).toContain("pack-test: all packages install and load on their own");
  expect(output).toMatch(/ok {3}kernels-cpu backend add\(\) matches JS/);
}, 300_000);
