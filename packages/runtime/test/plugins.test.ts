// Selector plugins through createHybridAttention on the CPU backend: loaded by path, handed the
// native stage's primitives like the built-ins, and unable to change the result by writing into
// their input.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import {
  loadModel, referencePrimitives, type SelectorPrimitives,
} from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { CONTEXT, PROMPT, STEPS, TINY_CONFIG, decodeTiny, tinyFiles as tinyModelFiles } from "./tiny-model.js";
import { createHybridAttention, hybridPlan } from "../src/index.js";

const tinyFiles = () => tinyModelFiles(5);

const backend = createCpuBackend({ threads: 1 });
const here = dirname(fileURLToPath(import.meta.url));
// Inside the package, so the plugins' import of @hybridgen/selectors resolves to the runtime's own.
const tmp = mkdtempSync(join(here, ".plugins-"));
afterAll(() => {
  backend.close();
  rmSync(tmp, { recursive: true, force: true });
});

const prompt = Int32Array.from({ length: PROMPT }, (_, i) => (i * 37 + 11) % 256);

/** Exact top-K per KV head in plain JS through the primitives (no kernel hint: select() runs); `vandal` then writes over its input. */
const plugin = (name: string, vandal: boolean) => `import { defineSelector } from "@hybridgen/selectors";
export const seen = [];
export default defineSelector({
  name: "${name}",
  timings: ["post"],
  select: (input) => {
    const { offloaded: n, k, logits, layout, primitives: P } = input;
    seen.push(P);
    const ids = [];
    for (let g = 0; g < layout.kvHeads; g++) ids.push(P.topK(P.maxRows(logits.slice(g * layout.groupSize, (g + 1) * layout.groupSize), n), k, n));
    ${vandal ? "for (const row of logits) row.fill(1e6); input.query.fill(-3); input.positions.fill(0);" : ""}
    return { kind: "perKvHead", ids };
  },
});
`;
writeFileSync(join(tmp, "clean.ts"), plugin("js-topk", false));
writeFileSync(join(tmp, "vandal.ts"), plugin("js-topk-vandal", true));

/** Prompt, then STEPS steps fed with `feed` (else greedy); the logits of every forward. */
async function run(selector: string, feed?: number[], selectorOptions?: Record<string, unknown>) {
  using model = loadModel(tinyFiles(), backend, { maxContext: CONTEXT, gpuKvBudget: 16, sinkTokens: 2 });
  using ha = await createHybridAttention(model, backend, { selector, scheduler: "fixed", k: 6, timing: "post", logits: "exact", ...(selectorOptions ? { selectorOptions } : {}) });
  return { ...decodeTiny(model, prompt, feed), plan: hybridPlan(ha)! };
}

describe("plugins through createHybridAttention", () => {
  it("a plugin loaded by path runs, and chooses as the built-in topk's native kernel does", async () => {
    const builtin = await run("topk");
    const mine = await run(join(tmp, "clean.ts"), builtin.tokens);
    expect(mine.plan.selector).toBe("js-topk");
    for (let i = 0; i < mine.logits.length; i++) {
      const a = mine.logits[i]!, b = builtin.logits[i]!;
      let worst = 0;
      for (let j = 0; j < a.length; j++) worst = Math.max(worst, Math.abs(a[j]! - b[j]!));
      expect(worst, `forward ${i}`).toBeLessThan(1e-5);
    }
  });

  it("writing into input.logits, query and positions changes nothing: same tokens, same logits", async () => {
    const clean = await run(join(tmp, "clean.ts"));
    const vandal = await run(join(tmp, "vandal.ts"));
    expect(vandal.plan.selector).toBe("js-topk-vandal");
    expect(vandal.tokens).toEqual(clean.tokens);
    for (let i = 0; i < clean.logits.length; i++) expect(Array.from(vandal.logits[i]!), `forward ${i}`).toEqual(Array.from(clean.logits[i]!));
  });

  it("the plugin gets the native stage's primitives, with the reference's results", async () => {
    const mod = (await import(join(tmp, "clean.ts"))) as { seen: SelectorPrimitives[] };
    mod.seen.length = 0;
    await run(join(tmp, "clean.ts"));
    expect(mod.seen.length).toBe(STEPS * TINY_CONFIG.num_hidden_layers);
    const P = mod.seen[0]!;
    for (const name of ["topK", "summarizePages", "pageBounds", "keyScores", "gatherChannels"] as const) {
      expect(P[name], name).not.toBe(referencePrimitives[name]);
    }
    const values = Float32Array.from({ length: 1000 }, (_, i) => Math.sin(i * 12.9898) * 437.5);
    expect(Array.from(P.topK(values, 37))).toEqual(Array.from(referencePrimitives.topK(values, 37)));
  });

  it("plugin options are checked by its schema; a missing module is one line", async () => {
    await expect(run("topk", undefined, { shared: true, sharde: 1 })).rejects.toThrow('selector "topk" options: unknown key "sharde" (it takes shared)');
    await expect(run(join(tmp, "missing.ts"))).rejects.toThrow(`no module at ${join(tmp, "missing.ts")}`);
  });
});
