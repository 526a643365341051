import { afterAll, describe, expect, it } from "vitest";
import { indexPageBounds, pageIndex, type Backend, type DeviceIndexShape, type Tensor } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createSelector } from "@hybridgen/selectors";
import { loadModel } from "@hybridgen/core";
import { createHybridAttention } from "../src/index.js";
import { CONTEXT, decodeTiny, PROMPT, STEPS, tinyFiles } from "./tiny-model.js";

/**
 * A CPU backend that "ranks on the device" the way Backend.indexRank is defined: the page-major
 * page level read back into the definition's index, the flat choice over every page's bound (ties to the lower page),
 * the pages written after the query. `calls` counts the rankings.
 */
function rankingBackend(): { backend: Backend; calls: { n: number } } {
  const backend: Backend = createCpuBackend({ threads: 1 }), calls = { n: 0 };
  backend.indexRankScratch = (x: DeviceIndexShape, want: number) => (want <= x.pageCapacity ? 64 : 0);
  backend.indexRank = (out: Tensor, outOffset: number, index: Tensor, x: DeviceIndexShape, q: Tensor, count: number, want: number) => {
    calls.n++;
    const form = x.form === 1 ? "int8" : "int4", cb = form === "int8" ? 2 * x.headDim : x.headDim, pageSize = 1;
    const raw = backend.read(index), bytes = new Uint8Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength)), ix = pageIndex(x.kvHeads, x.headDim, x.pageCapacity * pageSize, pageSize, 1, form);
    const scales = new Float32Array(ix.data.buffer, ix.pageScales, x.kvHeads * x.pageCapacity), dev = new Float32Array(bytes.buffer, x.scalesOffset, x.pageCapacity * x.kvHeads);
    for (let p = 0; p < x.pageCapacity; p++) {
      for (let g = 0; g < x.kvHeads; g++) {
        ix.data.set(bytes.subarray((p * x.kvHeads + g) * cb, (p * x.kvHeads + g + 1) * cb), ix.pageCodes + (g * x.pageCapacity + p) * cb);
        scales[g * x.pageCapacity + p] = dev[p * x.kvHeads + g]!;
      }
    }
    const bounds = indexPageBounds(backend.read(q, 0, x.kvHeads * x.group * x.headDim), x.group, ix, count * pageSize), pages = new Int32Array(x.kvHeads * want);
    for (let g = 0; g < x.kvHeads; g++) {
      const order = Array.from({ length: count }, (_, p) => p).sort((a, b) => bounds[g * count + b]! - bounds[g * count + a]! || a - b);
      pages.set(order.slice(0, want), g * want);
    }
    backend.write(out, new Float32Array(pages.buffer), outOffset / 4);
  };
  return { backend, calls };
}

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
