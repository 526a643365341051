import { describe, expect, it } from "vitest";
import {
  HybridgenError,
  PlacementSchema,
  MemoryTierSchema,
  SchedulerBoundsSchema,
  StepTimingsSchema,
  checkPlacement,
  clampBudget,
  clampK,
  headLayout,
  kvBytesPerToken,
  kvCacheBytes,
  parseStepTimings,
  referencePrimitives as P,
  seededRandom,
  selectionForKvHead,
  validateSelection,
} from "../src/index.js";

/** Plain reference: sort indices by (value desc, NaN last, index asc), take k, return ascending (or in rank order). */
function refTopK(v: Float32Array, k: number, n = v.length, ascending = true): number[] {
  const idx = Array.from({ length: n }, (_, i) => i);
  const key = (i: number) => (Number.isNaN(v[i]) ? -Infinity : v[i]!);
  idx.sort((a, b) => {
    const na = Number.isNaN(v[a]), nb = Number.isNaN(v[b]);
    if (na !== nb) return na ? 1 : -1;
    return key(b) - key(a) || a - b;
  });
  const top = idx.slice(0, Math.max(0, Math.min(k, n)));
  return ascending ? top.sort((a, b) => a - b) : top;
}

describe("referencePrimitives.topK", () => {
  it("matches a sort-based reference on fresh random logits (exact index sets)", () => {
    const r = seededRandom(1234);
    for (let trial = 0; trial < 60; trial++) {
      const n = 1 + Math.floor(r() * 3000);
      const v = new Float32Array(n);
      for (let i = 0; i < n; i++) v[i] = (r() - 0.5) * 20;
      const k = Math.floor(r() * (n + 3));
      expect(Array.from(P.topK(v, k))).toEqual(refTopK(v, k));
    }
  });
  it("breaks ties by lower index and ranks NaN last, with heavy duplicates", () => {
    const r = seededRandom(99);
    for (let trial = 0; trial < 40; trial++) {
      const n = 2 + Math.floor(r() * 500);
      const v = new Float32Array(n);
      for (let i = 0; i < n; i++) v[i] = r() < 0.1 ? NaN : Math.floor(r() * 4); // few distinct values
      const k = Math.floor(r() * n);
      expect(Array.from(P.topK(v, k))).toEqual(refTopK(v, k));
    }
  });
  it("honours length (a view longer than the offloaded count)", () => {
    const r = seededRandom(7);
    const v = new Float32Array(1000);
    for (let i = 0; i < v.length; i++) v[i] = r();
    v[900] = 1e9; // beyond length: must not be chosen
    expect(Array.from(P.topK(v, 10, 800))).toEqual(refTopK(v, 10, 800));
    expect(() => P.topK(v, 3, 1001)).toThrow(HybridgenError);
    expect(() => P.topK(v, 2.5)).toThrow(/integer/);
  });
  it("large stores (the sampled fast path) equal the reference for many value distributions", () => {
    const r = seededRandom(4321);
    const gens: ((i: number, n: number) => number)[] = [
      () => (r() - 0.5) * 20, // uniform
      (i) => i, // ascending: the largest all at the end
      (i, n) => n - i, // descending
      () => Math.floor(r() * 3), // three distinct values: ties everywhere
      () => (r() < 0.2 ? NaN : r()), // NaN-heavy
      (i) => (i % 1024 === 7 ? 100 + (i % 5) : r()), // spikes where an even sample never looks
      () => (r() < 0.001 ? 1e6 * r() : -r()), // a few outliers
    ];
    for (const [g, gen] of gens.entries()) {
      for (const n of [8192, 50_000, 131_072 + 17]) {
        const v = Float32Array.from({ length: n }, (_, i) => gen(i, n));
        const order = refTopK(v, n, n, false); // full ranking once; each k is a prefix
        for (const k of [1, 64, 300, Math.floor(n / 16), Math.floor(n / 4)]) {
          const want = order.slice(0, k).sort((a, b) => a - b);
          expect(Array.from(P.topK(v, k)), `gen ${g} n ${n} k ${k}`).toEqual(want);
        }
      }
    }
  });
  it("stays correct on adversarial sorted and constant inputs", () => {
    const asc = Float32Array.from({ length: 5000 }, (_, i) => i);
    expect(Array.from(P.topK(asc, 5))).toEqual([4995, 4996, 4997, 4998, 4999]);
    const flat = new Float32Array(5000).fill(2.5);
    expect(Array.from(P.topK(flat, 4))).toEqual([0, 1, 2, 3]);
  });
});

describe("referencePrimitives row reductions", () => {
  it("maxRows / sumRows equal an element-wise f64 reference", () => {
    const r = seededRandom(5);
    const rows = Array.from({ length: 4 }, () => Float32Array.from({ length: 333 }, () => (r() - 0.5) * 8));
    const max = P.maxRows(rows, 300);
    const sum = P.sumRows(rows, 300);
    expect(max.length).toBe(300);
    for (let j = 0; j < 300; j++) {
      expect(max[j]).toBe(Math.max(...rows.map((x) => x[j]!)));
      expect(Math.abs(sum[j]! - rows.reduce((s, x) => s + x[j]!, 0))).toBeLessThan(1e-5); // f32 accumulation
    }
    expect(() => P.maxRows([new Float32Array(3)], 4)).toThrow(/fewer than length 4/);
    expect(Array.from(P.range(5, 3))).toEqual([5, 6, 7]);
  });
});

describe("validateSelection", () => {
  const limits = { offloaded: 100, kvHeads: 2, k: 10, source: 'selector "demo"' };
  it("normalises to sorted Int32Array and accepts plain arrays", () => {
    const s = validateSelection({ kind: "shared", ids: [9, 3, 50] }, limits);
    expect(s.kind).toBe("shared");
    expect(Array.from(selectionForKvHead(s, 1))).toEqual([3, 9, 50]);
    const p = validateSelection({ kind: "perKvHead", ids: [Int32Array.of(4, 1), Int32Array.of(99)] }, limits);
    expect(Array.from(selectionForKvHead(p, 0))).toEqual([1, 4]);
    expect(Array.from(selectionForKvHead(p, 1))).toEqual([99]);
  });
  it("rejects out-of-range, duplicate, over-budget and misshapen results, naming the source", () => {
    expect(() => validateSelection({ kind: "shared", ids: [1, 100] }, limits)).toThrow(/selector "demo".*id 100 out of range \[0, 100\)/);
    expect(() => validateSelection({ kind: "shared", ids: [-1] }, limits)).toThrow(/id -1 out of range/);
    expect(() => validateSelection({ kind: "shared", ids: [4, 2, 4] }, limits)).toThrow(/duplicate id 4/);
    expect(() => validateSelection({ kind: "shared", ids: Int32Array.from({ length: 11 }, (_, i) => i) }, limits)).toThrow(/more than K = 10/);
    expect(() => validateSelection({ kind: "perKvHead", ids: [[1]] }, limits)).toThrow(/1 lists, expected one per KV head \(2\)/);
    expect(() => validateSelection({ kind: "perKvHead", ids: [[1], [2, 2]] }, limits)).toThrow(/KV head 1 has duplicate id 2/);
    expect(() => validateSelection([1, 2, 3], limits)).toThrow(HybridgenError);
    expect(() => validateSelection({ kind: "shared", ids: [1.5] }, limits)).toThrow('selector "demo": ids[0] is 1.5, not an integer slot');
    // Without a budget ("all"-style selectors) only the offloaded count limits the length.
    expect(validateSelection({ kind: "shared", ids: P.range(0, 100) }, { offloaded: 100, kvHeads: 2 }).kind).toBe("shared");
  });
});

describe("clampBudget", () => {
  it("clamps K to the offloaded count and says so", () => {
    expect(clampBudget(64, 1000)).toEqual({ budget: 64, clamped: false });
    expect(clampBudget(64, 10)).toEqual({ budget: 10, clamped: true });
    expect(clampBudget(0, 0)).toEqual({ budget: 0, clamped: false });
    expect(() => clampBudget(-1, 10)).toThrow(/K must be a non-negative integer, got -1/);
  });
});

describe("headLayout", () => {
  it("derives the GQA group size and rejects bad layouts", () => {
    expect(headLayout(32, 8, 128)).toEqual({ heads: 32, kvHeads: 8, headDim: 128, groupSize: 4 });
    expect(() => headLayout(6, 4, 64)).toThrow(/not a positive multiple/);
  });
});

describe("scheduler contract", () => {
  it("parses step timings and rejects negative or missing times with the path", () => {
    const t = parseStepTimings({ step: 3, tGpuMs: 4, tCpuMs: 2.5, tTxMs: 0.4, k: 128, timing: "post", offloaded: 4096 });
    expect(t.timing).toBe("post");
    expect(() => parseStepTimings({ step: 3, tGpuMs: -1, tCpuMs: 1, tTxMs: 0, k: 1, timing: "pre", offloaded: 0 })).toThrow(/tGpuMs/);
    expect(parseStepTimings({ step: 3, tGpuMs: 4, tCpuMs: 2.5, tTxMs: 0.4, tWaitMs: 1.5, k: 128, timing: "pre", offloaded: 4096 }).tWaitMs).toBe(1.5);
    expect(() => parseStepTimings({ step: 3, tGpuMs: 4, tCpuMs: 2.5, tTxMs: 0.4, tWaitMs: -1, k: 128, timing: "pre", offloaded: 4096 })).toThrow(/tWaitMs/);
    expect(StepTimingsSchema.safeParse({ step: 0, tGpuMs: 1, tCpuMs: 1, tTxMs: 1, k: 1, timing: "mid", offloaded: 1 }).success).toBe(false);
  });
  it("bounds default kMin and reject kMax < kMin; clampK keeps the invariant", () => {
    expect(SchedulerBoundsSchema.parse({}).kMin).toBe(64);
    expect(SchedulerBoundsSchema.safeParse({ kMin: 100, kMax: 50 }).success).toBe(false);
    expect(clampK(3, { kMin: 16 })).toBe(16);
    expect(clampK(1e9, { kMin: 16, kMax: 512 })).toBe(512);
    expect(clampK(100.4, { kMin: 16 })).toBe(100);
  });
});

describe("memory contract", () => {
  it("kv bytes per token: Llama-3.1-8B bf16 is 128 KiB (64 KiB K + 64 KiB V)", () => {
    const b = kvBytesPerToken({ layers: 32, kvHeads: 8, headDim: 128 }, "bf16");
    expect(b).toEqual({ k: 65536, v: 65536, total: 131072 });
    expect(kvCacheBytes({ layers: 32, kvHeads: 8, headDim: 128 }, "bf16", 131072)).toBe(16 * 2 ** 30);
    expect(kvBytesPerToken({ layers: 6, kvHeads: 6, headDim: 48 }, "f32").total).toBe(2 * 6 * 6 * 48 * 4);
    expect(() => kvBytesPerToken({ layers: 0, kvHeads: 8, headDim: 128 })).toThrow(/layers/);
  });
  it("tier and placement schemas; checkPlacement names an unknown tier", () => {
    const tiers = [
      MemoryTierSchema.parse({ id: "node0", kind: "dram", numaNode: 0, capacityBytes: 2 ** 34 }),
      MemoryTierSchema.parse({ id: "node1", kind: "cxl", numaNode: 1, capacityBytes: 2 ** 36 }),
    ];
    expect(MemoryTierSchema.safeParse({ id: "f", kind: "file", capacityBytes: 1 }).success).toBe(false);
    const p = PlacementSchema.parse({ policy: "semantic", k: { mode: "fill", order: ["node0"] }, v: { mode: "fill", order: ["node1", "node0"] } });
    expect(() => checkPlacement(p, tiers)).not.toThrow();
    const bad = PlacementSchema.parse({ policy: "interleave", k: { mode: "interleave", tiers: ["node0", "node7"] }, v: { mode: "fill", order: ["node0"] } });
    expect(() => checkPlacement(bad, tiers)).toThrow(/K pool names tier "node7"/);
  });
});
