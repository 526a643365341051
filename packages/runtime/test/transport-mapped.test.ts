/** The mapped transport: the device gathers the selected rows from the mapped host store by the stage's ids. */
import { describe, expect, it } from "vitest";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { queryPreSelector, topKSelector } from "./hybrid-helpers.js";
import { CONTEXT, LAYERS, runTransport } from "./transport-run.js";

describe("the mapped transport", () => {
  const { files } = tinyModel({ seed: testSeed(354), maxPositions: 64, heads: 4, kvHeads: 2, layers: LAYERS });
  const tokens = randomIds(testSeed(454), CONTEXT);

  it("is chosen where the link gathers rows and the stage does not queue a step; the host transport's logits bit for bit", () => {
    for (const logits of ["exact", "speculative", "verified"] as const) {
      for (const c of [
        { logits, selector: () => topKSelector(true), timing: "post" as const, k: 3 },
        { logits, selector: queryPreSelector, timing: "pre" as const, k: 3 },
      ]) {
        const host = runTransport(files, tokens, "host", c), mapped = runTransport(files, tokens, "gathers", c);
        expect(mapped.name).toBe("mapped");
        expect(mapped.choice.rowPaths).toEqual(["mapped", "mapped", "mapped"]);
        expect(mapped.summary).toContain("; transport mapped: V rows read by the device from pinned host memory (3 of 3 layers)");
        mapped.out.forEach((l, i) => expect(maxAbsDiff(l, host.out[i]!), `${logits} ${c.timing} forward ${i}`).toBe(0));
      }
    }
  });

  it("verified layers that keep K of their candidates: a mapped layer keeps on the device (keepRows), a staged one on the host (the dropped columns −∞), the host transport's kept logits either way; a copies-only link keeps on the host", () => {
    const c = { logits: "verified" as const, selector: () => topKSelector(true), timing: "post" as const, k: 3, keep: 1 };
    const host = runTransport(files, tokens, "host", c), every = runTransport(files, tokens, "host", { ...c, keep: undefined });
    for (const [setting, unmappedV] of [["gathers", []], ["gathers", [1]], ["copies", []]] as const) {
      const kept = runTransport(files, tokens, setting, { ...c, unmappedV: [...unmappedV] });
      expect(kept.name, setting).toBe(setting === "copies" ? "staged" : "mapped");
      expect(kept.handedOff).toBe(0);
      kept.out.forEach((l, i) => expect(maxAbsDiff(l, host.out[i]!), `${setting} [${unmappedV.join()}] forward ${i}`).toBeLessThan(1e-5));
    }
    expect(host.out.some((l, i) => maxAbsDiff(l, every.out[i]!) > 1e-4)).toBe(true); // keeping drops candidates that weighed something
  });

  it("a layer whose store the link does not map is staged within the mapped transport; a stage that queues cannot hand off such a step", () => {
    const c = { logits: "verified" as const, selector: () => topKSelector(true), timing: "post" as const, k: 3, unmappedV: [1] };
    const host = runTransport(files, tokens, "host", c);
    for (const setting of ["gathers", "queue"] as const) {
      const mixed = runTransport(files, tokens, setting, c);
      expect(mixed.name, setting).toBe("mapped");
      expect(mixed.choice.rowPaths).toEqual(["mapped", "staged", "mapped"]);
      expect(mixed.handedOff).toBe(0);
      mixed.out.forEach((l, i) => expect(maxAbsDiff(l, host.out[i]!), `${setting} forward ${i}`).toBe(0));
    }
  });
});
