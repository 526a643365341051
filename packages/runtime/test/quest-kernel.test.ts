import { afterAll, describe, expect, it } from "vitest";
import { headLayout, selectionForKvHead, type DType, type TokenSelector } from "@hybridgen/core";
import { cpuFeatures, createCpuBackend, NativeCpuStage, type CpuTensor, type Isa } from "@hybridgen/kernels-cpu";
import { createSelector } from "@hybridgen/selectors";
import { decodePreTiny, PROMPT, STEPS } from "./tiny-model.js";

const f = cpuFeatures();
const ISAS: Isa[] = ["generic", ...(f.avx2 ? ["avx2" as const] : []), ...(f.avx512 ? ["avx512" as const] : [])];

/** Uniform values in [-2, 2), then rows of KV heads ≥ 1 repeating a block of three pages, in equal pairs (ties). */
function keys(seed: number, kvHeads: number, cap: number, d: number, page: number): Float32Array {
  let s = seed >>> 0;
  const next = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32) * 4 - 2;
  const k = Float32Array.from({ length: kvHeads * cap * d }, next);
  for (let g = 1; g < kvHeads; g++) {
    for (let t = 0; t < cap; t++) {
      const src = t >= 3 * page ? t % (3 * page) : t - (t % 2);
      if (src !== t) k.copyWithin((g * cap + t) * d, (g * cap + src) * d, (g * cap + src + 1) * d);
    }
  }
  return k;
}

describe("quest's select() and the stage's Quest kernel", () => {
  for (const isa of ISAS) {
    it(`${isa}: the native stage's quest job picks what quest's select() picks on the stage's primitives (GQA 1/4/8, ties)`, () => {
      using be = createCpuBackend({ threads: 2, isa });
      const cases: [DType, number, number, number, number][] = [["f32", 2, 1, 20, 7], ["bf16", 2, 4, 36, 16], ["f16", 1, 8, 64, 5]];
      for (const [dtype, kvHeads, group, d, pageSize] of cases) {
        const cap = 333, heads = kvHeads * group, layout = headLayout(heads, kvHeads, d);
        using stage = new NativeCpuStage(be, { threads: 2 });
        stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: cap, dtype });
        const K = be.alloc([kvHeads, cap, d], dtype) as CpuTensor, V = be.alloc([kvHeads, cap, d], dtype);
        be.write(K, keys(7 + d, kvHeads, cap, d, pageSize));
        const sel = createSelector("quest", { pageSize });
        const state = sel.initState({ layer: 0, sequence: 0, layout });
        for (const [step, n, k] of [[0, 100, 9], [1, 101, 33], [2, 250, 1], [3, 331, 50]] as const) {
          const q = Float32Array.from(keys(step * 31 + 1, heads, 1, d, pageSize));
          stage.query(0).set(q);
          stage.submit({ slot: 0, k: K, v: V, offloaded: n, kmax: k, scale: 0.1, work: { kind: "quest", budget: k, pageSize } });
          stage.wait();
          const want = sel.select({
            timing: "pre", layer: 0, step, sequence: 0, offloaded: n, positions: Int32Array.from({ length: cap }, (_, i) => i), k, layout, state,
            primitives: stage.primitives, keys: stage.offloadedKeys(K), query: q, speculative: false,
          });
          const out = stage.output(0);
          for (let g = 0; g < kvHeads; g++) {
            expect(Array.from(out.ids.subarray(g * k, g * k + out.counts[g]!)), `${dtype} G=${group} n=${n} K=${k} head ${g}`)
              .toEqual(Array.from(selectionForKvHead(want, g)));
          }
        }
        be.free(K);
        be.free(V);
      }
    });
  }
});

describe("hybrid decode with quest pre-QKᵀ on the CPU backend", () => {
  const backend = createCpuBackend({ threads: 1 });
  afterAll(() => backend.close());
  const prompt = Int32Array.from({ length: PROMPT }, (_, i) => (i * 37 + 11) % 256);

  async function decode(selector: TokenSelector, logits: "exact" | "verified") {
    const r = await decodePreTiny(backend, 5, prompt, selector, logits);
    expect(r.steps).toBe(STEPS);
    return r;
  }


  for (const logits of ["exact", "verified"] as const) {
    it(`${logits}: the stage's Quest kernel gives the tokens and logits of quest's select() in JS, and no JS selection time`, async () => {
      const quest = createSelector("quest", { pageSize: 4 });
      expect(quest.kernel).toEqual({ name: "quest", pageSize: 4 });
      const inJs: TokenSelector = { ...quest, kernel: undefined }; // the path before the kernel: select() on this thread
      const a = await decode(quest, logits), b = await decode(inJs, logits);
      expect(a.tokens).toEqual(b.tokens);
      a.logits.forEach((l, i) => expect(l, `forward ${i}`).toEqual(b.logits[i]));
      expect(a.jsMs).toBe(0);
      expect(b.jsMs).toBeGreaterThan(0);
    });
  }
});
