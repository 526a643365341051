import { afterAll, describe, expect, it } from "vitest";
import { type Backend } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createSelector } from "@hybridgen/selectors";
import { loadModel } from "@hybridgen/core";
import { createHybridAttention } from "../src/index.js";
import { rankingBackend } from "./ranking-backend.js";
import { CONTEXT, decodeTiny, PROMPT, STEPS, tinyFiles } from "./tiny-model.js";

describe("the page index ranked on the device (a CPU backend standing in for the device's indexRank)", () => {
  const { backend, calls } = rankingBackend();
  afterAll(() => (backend as Backend & { close(): void }).close());
  const prompt = Int32Array.from({ length: PROMPT }, (_, i) => (i * 37 + 11) % 256);

  async function decode(placement: "host" | "device", form: "int8" | "int4", logits: "exact" | "verified") {
    using model = loadModel(tinyFiles(9), backend, { maxContext: CONTEXT, gpuKvBudget: 16, sinkTokens: 2 });
    const selector = createSelector("index", { form, pageSize: 4, superPages: 2, placement });
    using ha = await createHybridAttention(model, backend, { selector, scheduler: "fixed", k: 6, timing: "pre", logits });
    expect(ha.deviceIndex !== null).toBe(placement === "device");
    const before = calls.n, r = decodeTiny(model, prompt);
    expect(ha.stats.steps).toBe(STEPS);
    return { ...r, ranked: calls.n - before };
  }

  for (const form of ["int8", "int4"] as const) {
    for (const logits of ["exact", "verified"] as const) {
      it(`${form}, ${logits}: the device's pages give the tokens and logits of the stage's own search, every layer of every step ranked there`, async () => {
        const host = await decode("host", form, logits), device = await decode("device", form, logits);
        expect(host.ranked).toBe(0);
        expect(device.ranked).toBe(STEPS * 3);
        expect(device.tokens).toEqual(host.tokens);
        device.logits.forEach((l, i) => expect(l, `forward ${i}`).toEqual(host.logits[i]));
      });
    }
  }

  it("placement device on a backend that cannot rank is one line; auto falls back to the stage", async () => {
    using cpu = createCpuBackend({ threads: 1 });
    using model = loadModel(tinyFiles(9), cpu, { maxContext: CONTEXT, gpuKvBudget: 16, sinkTokens: 2 });
    await expect(createHybridAttention(model, cpu, { selector: createSelector("index", { placement: "device" }), scheduler: "fixed", k: 6, timing: "pre" }))
      .rejects.toThrow(/^page index: placement "device" needs a backend that ranks pages \(cpu: no\) and a CPU stage that takes them \(native: yes\)$/);
    using ha = await createHybridAttention(model, cpu, { selector: createSelector("index", { placement: "auto" }), scheduler: "fixed", k: 6, timing: "pre" });
    expect(ha.deviceIndex).toBeNull();
    expect(() => createSelector("index", { placement: "gpu" })).toThrow(/placement "gpu" does not exist \(auto, host, device\)/);
  });
});
