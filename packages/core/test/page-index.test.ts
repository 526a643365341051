import { describe, expect, it } from "vitest";
import {
  BackendCpuStage, HybridgenError, indexFold, indexPageBounds, indexPages, indexSelection, offloadedKeys, pageIndex, PAGE_INDEX_FORMS, ReferenceBackend,
  referencePrimitives as P, selectionForKvHead, type CpuStageJob, type OffloadedKeys, type PageIndex, type PageIndexForm,
} from "../src/index.js";
import { makeRng, randomArray, testSeed } from "../src/testing/index.js";

/** Keys with a few outlier channels and a scale that changes from page to page, as real K has. */
function keysLike(r: () => number, kvHeads: number, cap: number, d: number): OffloadedKeys {
  const data = new Float32Array(kvHeads * cap * d);
  for (let i = 0; i < data.length; i++) {
    const c = i % d, row = Math.floor(i / d);
    const amp = (c % 7 === 0 ? 8 : 1) * (1 + (Math.floor(row / 5) % 3));
    data[i] = (r() * 2 - 1) * amp;
  }
  return offloadedKeys("f32", kvHeads, cap, d, data);
}

/** q·k in f64 per (KV head, slot): the max over the group's query heads. */
function exactScores(q: Float32Array, G: number, keys: OffloadedKeys, n: number): Float64Array[] {
  const { kvHeads, headDim: d, capacity } = keys, out: Float64Array[] = [];
  for (let g = 0; g < kvHeads; g++) {
    const row = new Float64Array(n);
    for (let s = 0; s < n; s++) {
      let best = -Infinity;
      for (let j = 0; j < G; j++) {
        let sum = 0;
        for (let c = 0; c < d; c++) sum += q[(g * G + j) * d + c]! * keys.data[(g * capacity + s) * d + c]!;
        best = Math.max(best, sum);
      }
      row[s] = best;
    }
    out.push(row);
  }
  return out;
}

/** The flat choice: the `want` best pages by bound, ties to the lower page. */
function flatBest(bounds: Float32Array, g: number, count: number, want: number): number[] {
  const row = Array.from(bounds.subarray(g * count, (g + 1) * count), (b, p) => ({ b, p }));
  return row.sort((x, y) => y.b - x.b || x.p - y.p).slice(0, want).map((x) => x.p);
}

describe("page index (the spec's definition)", () => {
  for (const form of PAGE_INDEX_FORMS) {
    it(`${form}: every page bound and super-page bound is an upper bound of q·k over its rows`, () => {
      const r = makeRng(testSeed(3301)), kvHeads = 2, G = 3, d = 12, cap = 200, n = 187, page = 5, superPages = 4;
      const keys = keysLike(r, kvHeads, cap, d), x = pageIndex(kvHeads, d, cap, page, superPages, form);
      indexFold(keys, 0, n, x);
      for (let trial = 0; trial < 20; trial++) {
        const q = randomArray(r, kvHeads * G * d), exact = exactScores(q, G, keys, n);
        const bounds = indexPageBounds(q, G, x, n), count = Math.ceil(n / page);
        for (let g = 0; g < kvHeads; g++) {
          for (let p = 0; p < count; p++) {
            const top = Math.max(...exact[g]!.subarray(p * page, Math.min(n, (p + 1) * page)));
            expect(bounds[g * count + p]!, `${form} head ${g} page ${p}`).toBeGreaterThanOrEqual(top - 1e-4 * Math.abs(top));
          }
        }
        // A super-page's bound: one page of a super-page-sized index covers the same rows.
        const whole = pageIndex(kvHeads, d, cap, page * superPages, 1, form);
        indexFold(keys, 0, n, whole);
        const wb = indexPageBounds(q, G, whole, n), wc = Math.ceil(n / (page * superPages));
        for (let g = 0; g < kvHeads; g++) {
          for (let u = 0; u < wc; u++) {
            const top = Math.max(...exact[g]!.subarray(u * page * superPages, Math.min(n, (u + 1) * page * superPages)));
            expect(wb[g * wc + u]!).toBeGreaterThanOrEqual(top - 1e-4 * Math.abs(top));
          }
        }
      }
    });

    it(`${form}: super-page pruning returns the flat choice (never drops a page whose bound beats the want-th best) and reads fewer pages`, () => {
      const r = makeRng(testSeed(3302)), kvHeads = 3, G = 2, d = 16, cap = 1200, page = 8, superPages = 8;
      const keys = keysLike(r, kvHeads, cap, d), x = pageIndex(kvHeads, d, cap, page, superPages, form);
      let read = 0, all = 0;
      for (const n of [1, 7, 64, 65, 500, 1200]) {
        indexFold(keys, 0, n, x);
        const count = Math.ceil(n / page);
        for (const want of [0, 1, 3, 9, count, count + 4]) {
          // a query close to one stored key makes a few pages stand out, as attention does
          const q = randomArray(r, kvHeads * G * d);
          const hot = Math.floor(r() * n);
          for (let g = 0; g < kvHeads; g++) for (let j = 0; j < G; j++) for (let c = 0; c < d; c++) q[(g * G + j) * d + c] += 2 * keys.data[(g * cap + hot) * d + c]!;
          const got = indexPages(q, G, x, n, want), bounds = indexPageBounds(q, G, x, n), w = Math.min(want, count);
          expect(got.want).toBe(w);
          for (let g = 0; g < kvHeads; g++) {
            expect(Array.from(got.pages.subarray(g * w, (g + 1) * w)), `${form} n ${n} want ${want} head ${g}`).toEqual(flatBest(bounds, g, count, w));
          }
          read += got.pagesRead;
          all += kvHeads * count;
        }
      }
      expect(read).toBeLessThan(all);
    });

    it(`${form}: folding rows as they are evicted gives the bytes of a rebuild`, () => {
      const r = makeRng(testSeed(3303)), kvHeads = 2, d = 10, cap = 300, page = 6, superPages = 3;
      const keys = keysLike(r, kvHeads, cap, d);
      const steps = pageIndex(kvHeads, d, cap, page, superPages, form);
      let at = 0;
      while (at < 277) {
        const to = Math.min(277, at + 1 + Math.floor(r() * 20));
        indexFold(keys, at, to, steps);
        at = to;
        const once = pageIndex(kvHeads, d, cap, page, superPages, form);
        indexFold(keys, 0, at, once);
        expect(Buffer.from(steps.data).equals(Buffer.from(once.data)), `${form} after ${at} rows`).toBe(true);
      }
    });
  }

  it("int4 reads half the bytes of int8 a page, a quarter of Quest's bf16 summaries", () => {
    const i8 = pageIndex(8, 128, 4096, 16, 16, "int8"), i4 = pageIndex(8, 128, 4096, 16, 16, "int4");
    expect(i8.codeBytes).toBe(256);
    expect(i4.codeBytes).toBe(128);
  });

  it("indexSelection fills K per KV head from the chosen pages, the last one by exact q·k", () => {
    const r = makeRng(testSeed(3304)), kvHeads = 2, G = 2, d = 8, cap = 100, n = 93, page = 4;
    const keys = keysLike(r, kvHeads, cap, d), x = pageIndex(kvHeads, d, cap, page, 4, "int8");
    indexFold(keys, 0, n, x);
    for (const k of [1, 4, 6, 30, 93]) {
      const q = randomArray(r, kvHeads * G * d), sel = indexSelection(P, q, G, keys, x, n, k);
      const want = Math.min(Math.ceil(n / page), Math.ceil(k / page) + 1), pages = indexPages(q, G, x, n, want);
      for (let g = 0; g < kvHeads; g++) {
        const ids = Array.from(selectionForKvHead(sel, g));
        expect(ids.length).toBe(k);
        expect(ids).toEqual([...ids].sort((a, b) => a - b));
        const chosen = new Set(Array.from(pages.pages.subarray(g * pages.want, (g + 1) * pages.want)));
        for (const id of ids) expect(chosen.has(Math.floor(id / page))).toBe(true);
      }
    }
  });

  it("bad values are one-line errors: a form that does not exist, a page size of 0, a shape the bytes do not hold", () => {
    const msg = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        expect(e).toBeInstanceOf(HybridgenError);
        return (e as Error).message;
      }
      throw new Error("no error");
    };
    expect(msg(() => pageIndex(2, 8, 10, 4, 4, "int2" as PageIndexForm))).toBe('page index: form "int2" does not exist (forms: int8, int4)');
    expect(msg(() => pageIndex(2, 8, 10, 0, 4, "int8"))).toBe("page index: page size must be a positive integer, got 0");
    expect(msg(() => pageIndex(2, 8, 10, 4, 0, "int8"))).toBe("page index: pages per super-page must be a positive integer, got 0");
    expect(msg(() => pageIndex(2, 8, 1000, 4, 4, "int8", new Uint8Array(64)))).toMatch(/^page index: 64 bytes do not hold the index's \d+$/);
    const keys = offloadedKeys("f32", 2, 10, 8), small: PageIndex = pageIndex(2, 8, 8, 4, 4, "int8");
    expect(msg(() => indexFold(keys, 0, 10, small))).toMatch(/^indexFold: an index of 2 KV heads × headDim 8 × 2 pages does not fit keys/);
  });
});

describe("BackendCpuStage's index work", () => {
  it("equals indexSelection on a fresh index as the store grows, and afresh in a new epoch", () => {
    const r = makeRng(testSeed(3305));
    using be = new ReferenceBackend();
    const heads = 4, kvHeads = 2, d = 6, cap = 120, page = 4, superPages = 3;
    using stage = new BackendCpuStage(be);
    stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: cap, dtype: "f32" });
    const K = be.alloc([kvHeads, cap, d]), V = be.alloc([kvHeads, cap, d]);
    be.write(K, randomArray(r, kvHeads * cap * d));
    const check = (n: number, budget: number, epoch: number, form: PageIndexForm) => {
      const q = randomArray(r, heads * d);
      stage.query(0).set(q);
      const job: CpuStageJob = { slot: 0, k: K, v: V, offloaded: n, kmax: budget, scale: 0.3, work: { kind: "index", budget, form, pageSize: page, superPages }, storeEpoch: epoch };
      stage.submit(job);
      stage.wait();
      const keys = stage.offloadedKeys(K), x = pageIndex(kvHeads, d, cap, page, superPages, form);
      indexFold(keys, 0, n, x);
      const want = indexSelection(P, q, heads / kvHeads, keys, x, n, budget), out = stage.output(0);
      for (let g = 0; g < kvHeads; g++) {
        expect(Array.from(out.ids.subarray(g * budget, g * budget + out.counts[g]!)), `n=${n} K=${budget}`).toEqual(Array.from(selectionForKvHead(want, g)));
      }
    };
    for (const [n, budget] of [[3, 2], [9, 5], [37, 6], [61, 13], [118, 20]]) check(n, budget, 0, "int8");
    be.write(K, randomArray(r, kvHeads * cap * d));
    check(118, 20, 1, "int4");
    for (const t of [K, V]) be.free(t);
  });
});
