import { describe, expect, it } from "vitest";
import { headLayout, pageSummaries, referencePrimitives as P, type HeadLayout, type OffloadedKeys, type PreSelectionInput, type TokenSelector } from "@hybridgen/spec";
import { createSelector, exactTopK, infinigen, pairSelectors, quest } from "../src/index.js";
import { rng } from "./helpers.js";
import { DTYPES, encodeKeys, keyValue } from "./key-helpers.js";

const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);

/** Uniform keys in [-2, 2); `bf16Exact` truncates them to bf16 values (which f16 also holds, or flushes to 0). */
function randomKeys(r: () => number, dtype: "f32" | "f16" | "bf16", kvHeads: number, capacity: number, headDim: number, bf16Exact = false): OffloadedKeys {
  return encodeKeys(dtype, kvHeads, capacity, headDim, Float32Array.from({ length: kvHeads * capacity * headDim }, () => {
    f32[0] = (r() - 0.5) * 4;
    if (bf16Exact) u32[0] = u32[0]! & 0xffff0000;
    return f32[0]!;
  }));
}

function preInput<S>(sel: TokenSelector<S>, layout: HeadLayout, keys: OffloadedKeys, offloaded: number, k: number, query: Float32Array, state?: S): PreSelectionInput<S> {
  return {
    timing: "pre", layer: 0, step: 0, sequence: 0, offloaded, k, layout, query, speculative: false,
    positions: P.range(4, keys.capacity), state: state ?? sel.initState({ layer: 0, sequence: 0, layout }), primitives: P, keys,
  };
}

/** Exact top-K per KV head from q·k computed here (max over the group), for comparison. */
function exactIds(layout: HeadLayout, keys: OffloadedKeys, n: number, k: number, query: Float32Array): Int32Array[] {
  const { kvHeads, groupSize: G, headDim: d } = layout;
  const sel = exactTopK();
  const logits = Array.from({ length: layout.heads }, (_, h) => Float32Array.from({ length: n }, (_, s) => {
    const g = Math.floor(h / G);
    let sum = 0;
    for (let c = 0; c < d; c++) sum += query[h * d + c]! * keyValue(keys, (g * keys.capacity + s) * d + c);
    return sum;
  }));
  const out = sel.select({ ...preInput(sel, layout, keys, n, k, query), timing: "post", logits });
  return Array.from({ length: kvHeads }, (_, g) => (out.kind === "shared" ? out.ids : out.ids[g]!));
}

describe("reference key primitives", () => {
  it("summarizePages folded step by step equals one pass, and pageBounds bounds every token's q·k", () => {
    const r = rng(11);
    for (const dtype of DTYPES) {
      const layout = headLayout(6, 2, 5), cap = 53, keys = randomKeys(r, dtype, 2, cap, 5);
      const once = pageSummaries(2, 5, cap, 7), steps = pageSummaries(2, 5, cap, 7);
      P.summarizePages(keys, 0, 45, once);
      for (let at = 0; at < 45;) {
        const to = Math.min(45, at + 1 + Math.floor(r() * 9));
        P.summarizePages(keys, at, to, steps);
        at = to;
      }
      expect(steps.min.subarray(0, 7 * 5)).toEqual(once.min.subarray(0, 7 * 5));
      expect(steps.max).toEqual(once.max);
      const q = Float32Array.from({ length: 30 }, () => r() - 0.5);
      const pages = Math.ceil(45 / 7);
      const bounds = P.pageBounds(q, 3, once, pages);
      const scores = P.keyScores(q, 3, keys, 0, 45);
      for (let g = 0; g < 2; g++) {
        for (let s = 0; s < 45; s++) expect(scores[g * 45 + s]!).toBeLessThanOrEqual(bounds[g * pages + Math.floor(s / 7)]! + 1e-5);
      }
    }
  });

  it("gatherChannels packs the chosen channels, and keyScores over them is the partial dot product", () => {
    const r = rng(12);
    const keys = randomKeys(r, "bf16", 2, 20, 6), packed = encodeKeys("f32", 2, 20, 2, new Float32Array(80));
    const ch = Int32Array.of(1, 4, 0, 5);
    P.gatherChannels(keys, ch, 3, 17, packed);
    for (let g = 0; g < 2; g++) {
      for (let s = 3; s < 17; s++) {
        for (let i = 0; i < 2; i++) expect(packed.data[(g * 20 + s) * 2 + i]).toBe(keyValue(keys, (g * 20 + s) * 6 + ch[g * 2 + i]!));
      }
    }
    expect(packed.data[(0 * 20 + 2) * 2]).toBe(0);
  });

  it("refuses bad shapes with one line", () => {
    const keys = randomKeys(rng(1), "f32", 1, 8, 4);
    expect(() => P.keyScores(new Float32Array(3), 1, keys, 0, 8)).toThrow(/query has 3 values/);
    expect(() => P.keyScores(new Float32Array(4), 1, keys, 0, 9)).toThrow(/rows \[0, 9\) out of range/);
    expect(() => P.summarizePages(keys, 0, 8, pageSummaries(1, 4, 4, 2))).toThrow(/do not fit/);
    expect(() => pageSummaries(1, 4, 8, 0)).toThrow(/page size/);
  });
});

describe("quest and infinigen", () => {
  it("are built-ins, pre-QKᵀ only, with checked options", () => {
    expect(createSelector("quest").timings).toEqual(["pre"]);
    expect(createSelector("infinigen", { channels: 4 }).timings).toEqual(["pre"]);
    expect(() => createSelector("quest", { pageSize: 0 })).toThrow(/selector "quest" options: pageSize/);
    expect([quest().needsKeys, infinigen().needsKeys, exactTopK().needsKeys]).toEqual([true, true, false]);
    expect(pairSelectors({ post: exactTopK(), pre: quest() }).needsKeys).toBe(true);
    expect(() => createSelector("infinigen", { channels: 2.5 })).toThrow(/selector "infinigen" options: channels/);
  });

  it("return valid selections (≤ K ids per KV head, ascending, distinct) on random stores of every dtype", () => {
    const r = rng(21);
    for (let t = 0; t < 30; t++) {
      const kvHeads = 1 + Math.floor(r() * 3), G = 1 + Math.floor(r() * 3), d = 2 + Math.floor(r() * 15);
      const layout = headLayout(kvHeads * G, kvHeads, d), n = 1 + Math.floor(r() * 300), cap = n + Math.floor(r() * 20);
      const keys = randomKeys(r, DTYPES[t % 3]!, kvHeads, cap, d), k = Math.floor(r() * (n + 1));
      const q = Float32Array.from({ length: layout.heads * d }, () => r() - 0.5);
      for (const sel of [quest({ pageSize: 1 + Math.floor(r() * 20) }), infinigen({ channels: 1 + Math.floor(r() * 10) })] as TokenSelector<unknown>[]) {
        const out = sel.select(preInput(sel, layout, keys, n, k, q));
        expect(out.kind).toBe(k === 0 ? "shared" : "perKvHead");
        for (let g = 0; g < kvHeads; g++) {
          const ids = out.kind === "perKvHead" ? out.ids[g]! : out.ids;
          expect(ids.length).toBe(k);
          for (let i = 1; i < ids.length; i++) expect(ids[i]!).toBeGreaterThan(ids[i - 1]!);
        }
      }
    }
  });

  it("reduce to exact top-K at their limits: one-token pages (keys exact in bf16), every channel", () => {
    const r = rng(22);
    for (const dtype of DTYPES) {
      // Quest's summaries are bf16 rounded outward: on keys bf16 holds exactly a one-token page's
      // bound is its q·k (other keys' bounds sit up to a bf16 ulp a channel above it).
      const layout = headLayout(4, 2, 8), n = 90, keys = randomKeys(r, dtype, 2, 100, 8, true);
      const q = Float32Array.from({ length: 32 }, () => r() - 0.5);
      const want = exactIds(layout, keys, n, 10, q);
      for (const sel of [quest({ pageSize: 1 }), infinigen({ channels: 8 })] as TokenSelector<unknown>[]) {
        const out = sel.select(preInput(sel, layout, keys, n, 10, q));
        if (out.kind !== "perKvHead") throw new Error("per KV head expected");
        expect(out.ids.map((a) => Array.from(a))).toEqual(want.map((a) => Array.from(a)));
      }
    }
  });

  it("find a planted key, and keep finding it as the store grows step by step", () => {
    const r = rng(23);
    for (const dtype of DTYPES) {
      const d = 16, cap = 400, layout = headLayout(4, 2, d);
      const values = Float32Array.from({ length: 2 * cap * d }, () => (r() - 0.5) * 0.5);
      const q = Float32Array.from({ length: 4 * d }, () => r() - 0.5);
      // KV head 1's slot 137 points where its query heads look: a large q·k.
      for (let c = 0; c < d; c++) values[(cap + 137) * d + c] = 3 * (q[2 * d + c]! + q[3 * d + c]!);
      const keys = encodeKeys(dtype, 2, cap, d, values);
      for (const sel of [quest(), infinigen()] as TokenSelector<unknown>[]) {
        let state: unknown;
        for (const n of [150, 151, 170, 199, 300]) {
          const input = preInput(sel, layout, keys, n, 8, q, state);
          state = input.state;
          const out = sel.select(input);
          const ids = out.kind === "perKvHead" ? out.ids[1]! : out.ids;
          expect(Array.from(ids), `${sel.name} ${dtype} n=${n}`).toContain(137);
        }
      }
    }
  });

  it("fail with one line when the engine passes no keys", () => {
    const sel = quest(), layout = headLayout(2, 1, 4), keys = randomKeys(rng(3), "f32", 1, 10, 4);
    const input = { ...preInput(sel, layout, keys, 10, 3, new Float32Array(8)), keys: undefined };
    expect(() => sel.select(input)).toThrow(/selector "quest" needs the layer.s offloaded keys, and the engine passed none/);
  });
});
