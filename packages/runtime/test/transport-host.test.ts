/** The host transport: on a backend without a host link, the backend reads the stage's buffers itself. */
import { describe, expect, it } from "vitest";
import { LlamaModel, ReferenceBackend } from "@hybridgen/core";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { allSelector, topKSelector } from "./hybrid-helpers.js";
import { CONTEXT, LAYERS, PROMPT, STEPS, runTransport } from "./transport-run.js";

describe("the host transport", () => {
  const { files } = tinyModel({ seed: testSeed(352), maxPositions: 64, heads: 4, kvHeads: 2, layers: LAYERS });
  const tokens = randomIds(testSeed(452), CONTEXT);

  it("is chosen without a host link, says so on the stats line, and with every token selected (exact logits) matches full attention", () => {
    const got = runTransport(files, tokens, "host", { logits: "exact", selector: () => allSelector(true), timing: "post", k: 4 });
    expect(got.name).toBe("host");
    expect(got.choice.rowPaths).toEqual([]);
    expect(got.summary).toContain("; transport host");
    const be = new ReferenceBackend();
    using model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: CONTEXT });
    const full = [model.forward(Int32Array.from(tokens.slice(0, PROMPT)), 0)];
    for (let t = PROMPT; t < tokens.length; t++) full.push(model.forward(Int32Array.of(tokens[t]!), t));
    got.out.forEach((l, i) => expect(maxAbsDiff(l, full[i]!), `forward ${i}`).toBeLessThan(1e-4));
  });

  it("verified layers that keep K of their candidates: the −∞ columns the handed-off step's keepRows writes, so the same logits; not every candidate's", () => {
    const c = { logits: "verified" as const, selector: () => topKSelector(true), timing: "post" as const, k: 3 };
    const kept = runTransport(files, tokens, "host", { ...c, keep: 1 }), handed = runTransport(files, tokens, "queue", { ...c, keep: 1 });
    expect(handed.handedOff).toBe(STEPS);
    kept.out.forEach((l, i) => expect(maxAbsDiff(l, handed.out[i]!), `forward ${i}`).toBeLessThan(1e-5));
    const every = runTransport(files, tokens, "host", c);
    expect(kept.out.some((l, i) => maxAbsDiff(l, every.out[i]!) > 1e-4)).toBe(true);
  });

  it("runs a JS selector's steps and a stage kernel's the same way: the same logits", () => {
    for (const logits of ["exact", "speculative", "verified"] as const) {
      const js = runTransport(files, tokens, "host", { logits, selector: () => topKSelector(false), timing: "post", k: 3 });
      const kernel = runTransport(files, tokens, "host", { logits, selector: () => topKSelector(true), timing: "post", k: 3 });
      kernel.out.forEach((l, i) => expect(maxAbsDiff(l, js.out[i]!), `${logits} forward ${i}`).toBe(0));
    }
  });
});
