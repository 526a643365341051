/** apps/bench/train/output_error.py: a layer's output change at K beside the mass K holds, on needle-3l's initial weights (numpy alone). */
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";

const train = fileURLToPath(new URL("../train/tiny_retrieval.py", import.meta.url));
const script = fileURLToPath(new URL("../train/output_error.py", import.meta.url));
const numpy = spawnSync("python3", ["-c", "import numpy"]).status === 0;
const dir = mkdtempSync(join(tmpdir(), "output-error-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const run = (args: string[]) => spawnSync("python3", [script, join(dir, "needle-3l"), ...args], { encoding: "utf8", timeout: 100_000, env: { ...process.env, OPENBLAS_NUM_THREADS: "1" } });

describe.skipIf(!numpy)("output_error.py", () => {
  it("per layer the K for mass 0.95 and for a change under 5% / 1%; keeping every offloaded token keeps the full mass and output", () => {
    expect(spawnSync("python3", [train, "--out", dir, "--parity"], { encoding: "utf8", timeout: 100_000 }).status).toBe(0);
    for (const at of ["question", "haystack"]) {
      const r = run(["--length", "400", "--window", "64", "--prompts", "1", "--rows", "2", "--at", at]);
      expect(r.status, r.stderr).toBe(0);
      const rows = r.stdout.split("\n").filter((l) => /^\| \d+ \|/.test(l));
      expect(rows).toHaveLength(3);
      for (const row of rows) {
        const [, , kMass, k5, k1, mass64, change64] = row.split("|").map((c) => c.trim());
        expect(Number(kMass)).toBeGreaterThanOrEqual(4);
        // A smaller change needs at least as many tokens.
        expect(Number(k1)).toBeGreaterThanOrEqual(Number(k5));
        expect(Number(mass64)).toBeLessThanOrEqual(1);
        expect(Number(change64)).toBeGreaterThanOrEqual(0);
      }
      const m = /every offloaded token kept: mass ([\d.]+), change ([\de.+-]+)/.exec(r.stdout);
      expect(m, r.stdout).not.toBeNull();
      expect(Number(m![1])).toBeCloseTo(1, 6);
      expect(Number(m![2])).toBeLessThan(1e-9);
    }
  });

  it("a length inside the window is a one-line error", () => {
    const r = run(["--length", "60", "--window", "64"]);
    expect(r.status).not.toBe(0);
    expect(r.stderr.trim()).toBe("--length must exceed the window and sinks (68)");
  });
});
