import { describe, expect, it } from "vitest";
import { referencePrimitives as ref } from "@hybridgen/spec";
import { cpuFeatures, createCpuBackend, NativeCpuStage, nativeSelectorPrimitives, type SelectorIsa } from "../src/index.js";
import { rng, SEED } from "./helpers.js";

/** Rows with many ties, ±0, ±Infinity and NaN (both signs), at sizes off any vector width. */
function nasty(r: () => number, n: number): Float32Array {
  const x = new Float32Array(n);
  const pool = [0, -0, 1, -1, 0.5, Infinity, -Infinity, NaN, -NaN, 3.25, -3.25];
  const spread = r() < 0.5;
  for (let i = 0; i < n; i++) {
    const u = r();
    x[i] = u < 0.3 ? pool[Math.floor(r() * pool.length)]! : spread ? (r() - 0.5) * 1e6 : Math.round((r() - 0.5) * 16) / 4;
  }
  if (r() < 0.3) x.fill(NaN, 0, Math.floor(n / 2)); // more NaNs than non-NaNs
  return x;
}

const sizes = [1, 2, 7, 13, 31, 100, 1001, 4097, 9000, 20011];
const ISAS: SelectorIsa[] = cpuFeatures().avx2 ? ["generic", "avx2"] : ["generic"];

describe("native topK", () => {
  for (const isa of ISAS) it(`${isa}: matches the reference: ties to the lower index, NaN below every number, ±0 equal, k clamped`, () => {
    const r = rng(91);
    const P = nativeSelectorPrimitives(isa);
    for (const n of sizes) {
      for (let trial = 0; trial < 4; trial++) {
        const x = nasty(r, n + 3);
        const length = trial === 3 ? n : n + 3;
        for (const k of [0, 1, 2, Math.floor(n / 3), n - 1, n, n + 5, -2]) {
          const want = ref.topK(x, k, length), got = P.topK(x, k, length);
          if (got.length !== want.length || got.some((v, i) => v !== want[i]))
            throw new Error(`topK ${isa} n=${n} length=${length} k=${k}: ${got.slice(0, 8)} vs ${want.slice(0, 8)} (seed ${SEED})`);
        }
      }
    }
  });

  it("on a stage's pool gives the serial result, and reads a subarray in place", () => {
    const r = rng(92);
    using be = createCpuBackend({ threads: 1 });
    using stage = new NativeCpuStage(be, { threads: 3 });
    const serial = nativeSelectorPrimitives();
    for (const n of [4096, 12289, 40000, 70001]) {
      const x = nasty(r, n + 10).subarray(7, 7 + n);
      for (const k of [1, 64, 1000, n - 3]) expect(stage.primitives.topK(x, k), `n=${n} k=${k} seed ${SEED}`).toEqual(serial.topK(x, k));
      expect(stage.primitives.topK(x, 100)).toEqual(ref.topK(x, 100));
    }
  });

  it("stays exact when a strided sample misjudges the row (the large values sit exactly where it looks)", () => {
    const P = nativeSelectorPrimitives(), n = 8192;
    const x = Float32Array.from({ length: n }, (_, i) => (i % 16 === 8 ? 10 : Math.sin(i)));
    for (const k of [100, 700, 1000, 2000]) expect(P.topK(x, k), `k=${k}`).toEqual(ref.topK(x, k));
    x.fill(NaN, 0, n - 3000); // a NaN-deep row: the sampled threshold lands on NaN
    for (const k of [5, 1000]) expect(P.topK(x, k), `NaN k=${k}`).toEqual(ref.topK(x, k));
  });

  it("refuses bad arguments with the reference's messages", () => {
    const P = nativeSelectorPrimitives();
    expect(() => P.topK(new Float32Array(4), 1.5)).toThrow(/topK: k must be an integer, got 1.5/);
    expect(() => P.topK(new Float32Array(4), 1, 5)).toThrow(/topK: values has 4 elements, fewer than length 5/);
    expect(() => P.topK(new Float32Array(4), 1, -1)).toThrow(/topK: length must be a non-negative integer/);
    expect(P.topK(new Float32Array(0), 3)).toEqual(new Int32Array(0));
  });
});
