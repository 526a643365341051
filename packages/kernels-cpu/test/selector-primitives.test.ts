import { describe, expect, it } from "vitest";
import { offloadedKeys, pageSummaries, referencePrimitives as ref, type DType } from "@hybridgen/spec";
import { createCpuBackend, NativeCpuStage, nativeSelectorPrimitives, storeKeys, type CpuTensor, type SelectorIsa } from "../src/index.js";
import { bf16Value, randn, rng, SEED, supportedIsas } from "./helpers.js";

const DTYPES: DType[] = ["f32", "f16", "bf16"];
const ISAS: SelectorIsa[] = supportedIsas();

/** Relative closeness for sums whose order differs (vector lanes vs one accumulator). */
function expectClose(got: Float32Array, want: Float32Array, n: number, what: string): void {
  for (let i = 0; i < n; i++) {
    const tol = 1e-5 * Math.max(1, Math.abs(want[i]!)) * 8;
    if (!(Math.abs(got[i]! - want[i]!) <= tol)) throw new Error(`${what}: [${i}] ${got[i]} vs ${want[i]} (seed ${SEED})`);
  }
}

describe("native selector primitives", () => {
  for (const isa of ISAS) {
    it(`${isa}: match the reference on f32/f16/bf16 stores at sizes off the vector width`, () => {
      const r = rng(71);
      using be = createCpuBackend({ threads: 1 });
      const P = nativeSelectorPrimitives(isa);
      for (const d of [3, 13, 64, 67]) {
        for (const dtype of DTYPES) {
          const kvHeads = 1 + Math.floor(r() * 3), G = 1 + Math.floor(r() * 3), cap = 50 + Math.floor(r() * 40);
          const t = be.alloc([kvHeads, cap, d], dtype) as CpuTensor;
          be.write(t, randn(r, kvHeads * cap * d, 2));
          const keys = storeKeys(t);
          const what = `${isa} ${dtype} d=${d} kv=${kvHeads} G=${G}`;
          const from = 1 + Math.floor(r() * 10), to = cap - Math.floor(r() * 10), page = 1 + Math.floor(r() * 17);
          // Summaries: both folded in the same uneven steps must agree exactly (min/max rounded outward to bf16 alike).
          const a = pageSummaries(kvHeads, d, cap, page), b = pageSummaries(kvHeads, d, cap, page);
          for (const [x, y] of [[0, from], [from, from + 1], [from + 1, to]] as const) {
            ref.summarizePages(keys, x, y, a);
            P.summarizePages(keys, x, y, b);
          }
          expect(b.min, what).toEqual(a.min);
          expect(b.max, what).toEqual(a.max);
          const q = randn(r, kvHeads * G * d);
          const count = Math.ceil(to / page);
          expectClose(P.pageBounds(q, G, b, count), ref.pageBounds(q, G, a, count), kvHeads * count, `pageBounds ${what}`);
          expectClose(P.keyScores(q, G, keys, from, to), ref.keyScores(q, G, keys, from, to), kvHeads * (to - from), `keyScores ${what}`);
          const rr = Math.min(d, 1 + Math.floor(r() * 9));
          const ch = Int32Array.from({ length: kvHeads * rr }, () => Math.floor(r() * d));
          const pa = offloadedKeys("f32", kvHeads, cap, rr), pb = offloadedKeys("f32", kvHeads, cap, rr);
          ref.gatherChannels(keys, ch, from, to, pa);
          P.gatherChannels(keys, ch, from, to, pb);
          expect(pb.data, what).toEqual(pa.data);
        }
      }
    });
  }

  for (const isa of ISAS) {
    it(`${isa}: bf16 summaries rounded outward as the reference, bit for bit: exact values, negatives, rounding boundaries, ±0, ±∞, subnormals, NaN`, () => {
      const r = rng(72);
      const P = nativeSelectorPrimitives(isa);
      const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
      const fromBits = (b: number) => { u32[0] = b >>> 0; return f32[0]!; };
      // exact in bf16 / a half ulp / just past / just short of an exact value (a carry), either sign
      const edge = [1, -1, 0.15625, -0.15625, 1 + 2 ** -8, -(1 + 2 ** -8), fromBits(0x3f800001), fromBits(0xbf800001), fromBits(0x3f7fffff),
        fromBits(0xbf7fffff), 0, -0, fromBits(1), fromBits(0x80000001), fromBits(0x7f7fffff), fromBits(0xff7fffff), Infinity, -Infinity];
      for (const d of [3, 8, 16, 21, 64]) {
        for (const withNaN of [false, true]) {
          const kvHeads = 2, cap = 70, page = 1 + Math.floor(r() * 9), what = `${isa} d=${d} page=${page}${withNaN ? " with NaN" : ""} (seed ${SEED})`;
          const data = Float32Array.from({ length: kvHeads * cap * d }, () => {
            const x = r();
            if (withNaN && x < 0.02) return NaN;
            return x < 0.5 ? edge[Math.floor(r() * edge.length)]! : (r() * 2 - 1) * 4;
          });
          const keys = offloadedKeys("f32", kvHeads, cap, d, data);
          const a = pageSummaries(kvHeads, d, cap, page), b = pageSummaries(kvHeads, d, cap, page);
          for (const [x, y] of [[0, 9], [9, 10], [10, 41], [41, cap]] as const) {
            ref.summarizePages(keys, x, y, a);
            P.summarizePages(keys, x, y, b);
          }
          expect(b.min, what).toEqual(a.min);
          expect(b.max, what).toEqual(a.max);
          if (withNaN) continue;
          // Outward: every page's min at or below each of its values, its max at or above.
          for (let g = 0; g < kvHeads; g++) {
            for (let s = 0; s < cap; s++) {
              for (let c = 0; c < d; c++) {
                const v = data[(g * cap + s) * d + c]!, at = (g * a.pageCapacity + Math.floor(s / page)) * d + c;
                if (!(bf16Value(a.min[at]!) <= v && bf16Value(a.max[at]!) >= v)) throw new Error(`${what}: ${v} outside [${bf16Value(a.min[at]!)}, ${bf16Value(a.max[at]!)}]`);
              }
            }
          }
        }
      }
    });
  }

  it.runIf(ISAS.includes("avx512"))("avx512: page bounds are the AVX2 loop's bits: GQA 1..8, head dims off 16, odd and even page counts, ±0, ±∞ and NaN, on a stage's pool too", () => {
    const r = rng(73);
    const avx2 = nativeSelectorPrimitives("avx2"), avx512 = nativeSelectorPrimitives("avx512");
    using be = createCpuBackend({ threads: 1, isa: "avx512" });
    using stage = new NativeCpuStage(be, { threads: 3 });
    const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
    const bf16 = (v: number) => { f32[0] = v; return u32[0]! >>> 16; };
    const special = [0, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, bf16(1), bf16(-1), bf16(3e38), bf16(-3e38)];
    for (const d of [16, 21, 32, 48, 64, 67, 128]) {
      for (const G of [1, 2, 3, 4, 5, 8]) {
        const kvHeads = 1 + Math.floor(r() * 3), page = 4, cap = page * (1 + Math.floor(r() * 700));
        const pages = pageSummaries(kvHeads, d, cap, page);
        for (let i = 0; i < pages.min.length; i++) {
          const special1 = r() < 0.03;
          const a = bf16((r() * 2 - 1) * 4), b = bf16((r() * 2 - 1) * 4);
          pages.min[i] = special1 ? special[Math.floor(r() * special.length)]! : bf16Value(a) < bf16Value(b) ? a : b;
          pages.max[i] = special1 ? special[Math.floor(r() * special.length)]! : bf16Value(a) < bf16Value(b) ? b : a;
        }
        const q = randn(r, kvHeads * G * d);
        for (let i = 0; i < q.length; i++) if (r() < 0.05) q[i] = [0, -0, NaN, -NaN][Math.floor(r() * 4)]!;
        for (const count of new Set([1, 2, 3, 17, pages.pageCapacity - 1, pages.pageCapacity].filter((c) => c >= 1 && c <= pages.pageCapacity))) {
          const what = `d=${d} G=${G} kv=${kvHeads} count=${count} (seed ${SEED})`;
          const want = new Uint32Array(avx2.pageBounds(q, G, pages, count).buffer);
          expect(new Uint32Array(avx512.pageBounds(q, G, pages, count).buffer), what).toEqual(want);
          expect(new Uint32Array(stage.primitives.pageBounds(q, G, pages, count).buffer), `pool ${what}`).toEqual(want);
        }
      }
    }
  });

  it("store keys are a live view of the tensor (no copy), and bad arguments are refused before C runs", () => {
    using be = createCpuBackend({ threads: 1 });
    const t = be.alloc([2, 10, 4], "bf16") as CpuTensor;
    const keys = storeKeys(t);
    expect(keys).toMatchObject({ dtype: "bf16", kvHeads: 2, capacity: 10, headDim: 4 });
    be.write(t, Float32Array.of(1.5), 4 * 13);
    expect(keys.data[4 * 13]).toBe(0x3fc0);
    expect(storeKeys(t)).toBe(keys);
    const P = nativeSelectorPrimitives();
    expect(() => P.keyScores(new Float32Array(8), 1, keys, 0, 11)).toThrow(/keyScores: rows \[0, 11\) out of range \[0, 10\]/);
    expect(() => P.keyScores(new Float32Array(8), 1, { ...keys, data: new Float32Array(80) }, 0, 10)).toThrow(/bf16 keys need a Uint16Array/);
    expect(() => P.gatherChannels(keys, Int32Array.of(0, 4), 0, 5, offloadedKeys("f32", 2, 10, 1))).toThrow(/channel 4 out of range/);
    expect(() => P.pageBounds(new Float32Array(8), 1, pageSummaries(2, 4, 10, 4), 4)).toThrow(/page count 4 out of range \[0, 3\]/);
  });

  it("the native stage hands selectors its store's keys in place and native primitives", () => {
    using be = createCpuBackend({ threads: 1 });
    using other = createCpuBackend({ threads: 1 });
    using stage = new NativeCpuStage(be, { threads: 1 });
    stage.prepare({ heads: 4, kvHeads: 2, headDim: 8, storeCapacity: 12, dtype: "f16" });
    const k = be.alloc([2, 12, 8], "f16") as CpuTensor;
    be.write(k, randn(rng(5), 2 * 12 * 8));
    const keys = stage.offloadedKeys(k);
    expect(keys.data.buffer).toBe(storeKeys(k).data.buffer);
    const q = randn(rng(6), 32);
    expect(stage.primitives.keyScores(q, 2, keys, 0, 12)).toEqual(nativeSelectorPrimitives().keyScores(q, 2, keys, 0, 12));
    expect(() => stage.offloadedKeys(other.alloc([2, 12, 8], "f16"))).toThrow(/not a tensor of this CpuBackend/);
    expect(() => stage.offloadedKeys(be.alloc([2, 12, 8], "bf16"))).toThrow(/store K is bf16, the stage was prepared for f16/);
  });
});
