// `--selector PATH|PACKAGE[:export]` on stories15M: a plugin module runs like a built-in, alone
// or as a pair's half, gets options from --selector-options, and cannot change the text by
// writing into its input.
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BIN, requireBuiltBin, runBin } from "./helpers.js";
import { PROMPT, stories15M } from "./model-fixture.js";

const here = dirname(fileURLToPath(import.meta.url));
// Inside the app, so the plugins' import of @hybridgen/selectors resolves as an installed one.
const tmp = mkdtempSync(join(here, ".plugins-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** Exact top-K per KV head through the primitives, in JS; `vandal` then writes over its input. */
const topkPlugin = (name: string, vandal: boolean) => `import { defineSelector } from "@hybridgen/selectors";
export default defineSelector({
  name: "${name}",
  timings: ["post"],
  select: (input) => {
    const { offloaded: n, k, logits, layout, primitives: P } = input;
    const ids = [];
    for (let g = 0; g < layout.kvHeads; g++) ids.push(P.topK(P.maxRows(logits.slice(g * layout.groupSize, (g + 1) * layout.groupSize), n), k, n));
    ${vandal ? "for (const row of logits) row.fill(1e6); input.query.fill(-3); input.positions.fill(0);" : ""}
    return { kind: "perKvHead", ids };
  },
});
`;
const STRIDED = `import { z } from "zod";
import { defineSelector } from "@hybridgen/selectors";
export const strided = defineSelector({
  name: "strided",
  timings: ["pre"],
  options: z.object({ stride: z.number().int().positive().default(8) }),
  select: ({ offloaded, budget }, { stride }) => {
    const ids = [];
    for (let slot = offloaded - 1; slot >= 0 && ids.length < budget; slot -= stride) ids.push(slot);
    return { kind: "shared", ids };
  },
});
`;

const HY = ["generate", "-p", PROMPT, "-n", "60", "-t", "0", "--threads", "1", "--attention", "hybrid", "--gpu-kv-budget", "32", "--k", "8", "--logits", "exact"];

describe("hybridgen generate --selector PLUGIN (stories15M)", () => {
  beforeAll(async () => {
    requireBuiltBin();
    await stories15M();
    writeFileSync(join(tmp, "js-topk.ts"), topkPlugin("js-topk", false));
    writeFileSync(join(tmp, "vandal.ts"), topkPlugin("js-topk-vandal", true));
    writeFileSync(join(tmp, "strided.ts"), STRIDED);
    // At run time, after a few good steps: one throws at layer 2 of step 3, one returns an id past the offloaded tokens.
    const late = (name: string, body: string) => `import { defineSelector } from "@hybridgen/selectors";
export default defineSelector({ name: "${name}", timings: ["pre", "post"], select: ({ step, layer, offloaded }) => { ${body} } });
`;
    writeFileSync(join(tmp, "throws.ts"), late("late-throw", 'if (step >= 3 && layer === 2) throw new Error("lost my index"); return { kind: "shared", ids: [offloaded - 1] };'));
    writeFileSync(join(tmp, "bad-ids.ts"), late("late-bad-ids", "return { kind: \"shared\", ids: [step >= 3 ? offloaded + 3 : offloaded - 1] };"));
  });

  it("a plugin by path prints the built-in topk's text; one that writes into its input prints the same", () => {
    const builtin = runBin([...HY, "--selector", "topk"]);
    const plugin = runBin([...HY, "--selector", join(tmp, "js-topk.ts")]);
    const vandal = runBin([...HY, "--selector", join(tmp, "vandal.ts")]);
    for (const r of [builtin, plugin, vandal]) expect(r.code, r.stderr).toBe(0);
    expect(plugin.stderr).toContain("hybrid: selector js-topk, fixed scheduler (K 8 post, from the flags)");
    expect(vandal.stderr).toContain("hybrid: selector js-topk-vandal,");
    expect(plugin.stdout).toBe(builtin.stdout);
    expect(vandal.stdout).toBe(plugin.stdout);
  });

  it("relative PATH:export as a pair's pre half, with --selector-options; an unknown option key fails before the model loads", () => {
    const run = (extra: string[]) => spawnSync(BIN, [...HY, ...extra], { cwd: tmp, encoding: "utf8", timeout: 120_000 });
    const pair = run(["--selector", "topk+./strided.ts:strided", "--scheduler", "feedback", "--k-min", "8"]);
    expect(pair.status, pair.stderr).toBe(0);
    expect(pair.stderr).toContain("hybrid: selector topk+strided, feedback scheduler");
    const pre = run(["--selector", "./strided.ts:strided", "--timing", "pre", "--selector-options", '{"stride":4}']);
    expect(pre.status, pre.stderr).toBe(0);
    const bad = run(["--selector", "./strided.ts:strided", "--timing", "pre", "--selector-options", '{"strde":4}']);
    expect(bad.status).toBe(2);
    expect(bad.stdout).toBe("");
    expect(bad.stderr).toBe('error: selector "strided" options: unknown key "strde" (it takes stride)\n');
  });

  it("a plugin that throws or returns bad ids at run time: exit 2 and one error line naming it, pre or post", () => {
    for (const timing of ["post", "pre"]) {
      const thrown = runBin([...HY, "--timing", timing, "--selector", join(tmp, "throws.ts")]);
      expect(thrown.code, thrown.stderr).toBe(2);
      expect(thrown.stderr.split("\n").filter((l) => l.startsWith("error:"))).toEqual(['error: selector "late-throw" failed at layer 2, step 3: lost my index']);
      const bad = runBin([...HY, "--timing", timing, "--selector", join(tmp, "bad-ids.ts")]);
      expect(bad.code, bad.stderr).toBe(2);
      expect(bad.stderr).toMatch(/\nerror: selector "late-bad-ids" at layer 0, step 3: ids has id \d+ out of range \[0, \d+\)\n$/);
      expect(bad.stderr).not.toMatch(/internal error/);
    }
  });

  it("a bad plugin is one line and exit 2", () => {
    for (const [spec, msg] of [
      [join(tmp, "missing.ts"), `error: selector "${join(tmp, "missing.ts")}": no module at ${join(tmp, "missing.ts")}\n`],
      [`${join(tmp, "strided.ts")}:nope`, `error: selector "${join(tmp, "strided.ts")}:nope": the module has no export "nope"\n`],
      [`${join(tmp, "strided.ts")}:strided`, 'error: selector "strided" cannot run post-QKᵀ selection (it supports pre)\n'],
    ]) {
      const r = runBin([...HY, "--timing", "post", "--selector", spec!]);
      expect(r.code).toBe(2);
      expect(r.stderr).toBe(msg);
    }
  });
});
