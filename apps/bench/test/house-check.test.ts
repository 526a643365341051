/**
 * Issue 37's done-when checks (src/house-check.ts) as a ratchet: every check named in HOLDING must
 * be met. A landing that makes another one hold adds its name here, so it cannot slip back.
 */
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { houseChecks } from "../src/house-check.js";

const ROOT = fileURLToPath(new URL("../../..", import.meta.url));

/** The checks that hold today; add a name when a landing makes its check hold. */
const HOLDING: readonly string[] = [
  "core ≤ 8k source lines",
  "selectors/scheduler/memtier/backends import only the spec",
  "one assembly site",
  "no lab code in packages",
  "no NOTES in packages",
  "the step's transports each in their own file with a test",
  "README tables generated and checked",
  "README commands tested",
  "backends registered by name",
  "hybrid flags from the runtime's schema",
];

describe("house checks", () => {
  const checks = houseChecks(ROOT);
  it("name every done-when check once, each with what it found", () => {
    expect(checks.map((c) => c.name)).toEqual([
      "core ≤ 8k source lines",
      "selectors/scheduler/memtier/backends import only the spec",
      "one assembly site",
      "no lab code in packages",
      "no NOTES in packages",
      "the step's transports each in their own file with a test",
      "README tables generated and checked",
      "README commands tested",
      "backends registered by name",
      "hybrid flags from the runtime's schema",
    ]);
    for (const c of checks) expect(c.detail, c.name).not.toBe("");
  });

  for (const name of HOLDING) {
    it(`still holds: ${name}`, () => {
      const c = checks.find((x) => x.name === name)!;
      expect(c.met, `${name}: ${c.detail}`).toBe(true);
    });
  }
});
