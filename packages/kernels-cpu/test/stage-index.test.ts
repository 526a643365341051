import { describe, expect, it } from "vitest";
import {
  indexFor, indexFold, indexPageBounds, indexPages, indexSelection, pageIndex, PAGE_INDEX_FORMS, selectionForKvHead, type CpuStageJob, type DType,
  type PageIndexForm, type Tensor,
} from "@hybridgen/core";
import { indexChosenOffset, indexWant } from "@hybridgen/spec";
import { toArrayBuffer, type Pointer } from "bun:ffi";
import { createCpuBackend, NativeCpuStage, nativeSelectorPrimitives, storeKeys, type CpuTensor } from "../src/index.js";
import { randn, rng, SEED, supportedIsas } from "./helpers.js";

/** K with outlier channels and a per-page amplitude, as real keys have (the index's scales differ page to page). */
function keysLike(r: () => number, kvHeads: number, cap: number, d: number): Float32Array {
  const k = randn(r, kvHeads * cap * d);
  for (let i = 0; i < k.length; i++) k[i] = k[i]! * (i % d % 5 === 0 ? 6 : 1) * (1 + (Math.floor(i / d / 7) % 4));
  return k;
}

function job(slot: 0 | 1, k: Tensor, v: Tensor, n: number, budget: number, form: PageIndexForm, pageSize: number, superPages: number, epoch = 0): CpuStageJob {
  return { slot, k, v, offloaded: n, kmax: budget, scale: 0.125, work: { kind: "index", budget, form, pageSize, superPages }, storeEpoch: epoch };
}

describe(`the page index, native (seed ${SEED})`, () => {
  for (const isa of supportedIsas()) {
    it(`${isa}: indexFold stores the reference's bytes (every dtype, folded in steps, on the pool and on the caller); indexPages keeps the flat choice within f32 rounding`, () => {
      const r = rng(3311), P = nativeSelectorPrimitives(isa);
      for (const form of PAGE_INDEX_FORMS) {
        // The 8B's heads: its folds of many rows run on the pool, its folds of one row on the caller.
        for (const [dtype, kvHeads, group, d, page, sup] of [["f32", 2, 4, 24, 8, 4], ["bf16", 3, 2, 36, 16, 3], ["f16", 1, 8, 64, 5, 7], ["bf16", 8, 4, 128, 16, 4]] as [DType, number, number, number, number, number][]) {
          const cap = 333, what = `${isa} ${form} ${dtype} d=${d} page=${page} super=${sup}`;
          using cpu = createCpuBackend({ threads: 2, isa });
          const K = cpu.alloc([kvHeads, cap, d], dtype) as CpuTensor;
          cpu.write(K, keysLike(r, kvHeads, cap, d));
          const keys = storeKeys(K), native = pageIndex(kvHeads, d, cap, page, sup, form);
          let at = 0;
          for (const to of [1, page, 3 * page + 1, 200, 331]) {
            P.indexFold(keys, at, to, native);
            at = to;
            const ref = pageIndex(kvHeads, d, cap, page, sup, form);
            indexFold(keys, 0, to, ref);
            expect(Buffer.from(native.data).equals(Buffer.from(ref.data)), `${what} after ${to} rows`).toBe(true);
            for (const want of [1, 3, 12, 1000]) {
              const q = randn(r, kvHeads * group * d), got = P.indexPages(q, group, native, to, want), exp = indexPages(q, group, ref, to, want);
              const bounds = indexPageBounds(q, group, ref, to), count = Math.ceil(to / page);
              expect(got.want).toBe(exp.want);
              for (let g = 0; g < kvHeads; g++) {
                const b = (p: number) => bounds[g * count + p]!;
                const mine = Array.from(got.pages.subarray(g * got.want, (g + 1) * got.want), b), theirs = Array.from(exp.pages.subarray(g * exp.want, (g + 1) * exp.want), b);
                const tol = 1e-5 * Math.max(1, ...theirs.map(Math.abs));
                mine.forEach((x, i) => expect(Math.abs(x - theirs[i]!), `${what} n=${to} want=${want} head ${g} #${i}`).toBeLessThanOrEqual(tol));
              }
            }
          }
          cpu.free(K);
        }
      }
    });

    it(`${isa}: indexFold on a stage's pool (each head's rows cut into parts at super-pages) stores the reference's bytes`, () => {
      const r = rng(3313);
      using cpu = createCpuBackend({ threads: 1, isa });
      using stage = new NativeCpuStage(cpu, { threads: 4 });
      for (const form of PAGE_INDEX_FORMS) {
        const kvHeads = 2, d = 64, cap = 4000, page = 16, sup = 4;
        const K = cpu.alloc([kvHeads, cap, d], "bf16") as CpuTensor;
        cpu.write(K, keysLike(r, kvHeads, cap, d));
        const keys = storeKeys(K), native = pageIndex(kvHeads, d, cap, page, sup, form);
        let at = 0;
        // From row 0, then from rows inside a page and inside a super-page: every part's first page and super-page are shared with the fold before.
        for (const to of [1000, 3333, 3999]) {
          stage.primitives.indexFold(keys, at, to, native);
          at = to;
          const ref = pageIndex(kvHeads, d, cap, page, sup, form);
          indexFold(keys, 0, to, ref);
          expect(Buffer.from(native.data).equals(Buffer.from(ref.data)), `${isa} ${form} after ${to} rows`).toBe(true);
        }
        cpu.free(K);
      }
    });

    it(`${isa}: indexFoldMany (a batch's rows × layers in one call, small folds as one pool op, a first fold alone) stores each item's indexFold bytes`, () => {
      const r = rng(3314);
      using cpu = createCpuBackend({ threads: 1, isa });
      using stage = new NativeCpuStage(cpu, { threads: 3 });
      for (const form of PAGE_INDEX_FORMS) {
        const kvHeads = 2, d = 64, cap = 3000, page = 16, sup = 4;
        const stores = [0, 1, 2].map(() => {
          const K = cpu.alloc([kvHeads, cap, d], "bf16") as CpuTensor;
          cpu.write(K, keysLike(r, kvHeads, cap, d));
          return K;
        });
        const mine = stores.map(() => pageIndex(kvHeads, d, cap, page, sup, form)), ref = stores.map(() => pageIndex(kvHeads, d, cap, page, sup, form));
        const done = [0, 0, 0];
        // Store 0 folds one row a step, store 1 two (one across a page edge), store 2 its first 2 500 rows at once, then one; a step with nothing for store 0.
        for (const steps of [[1, 2, 2500], [2, 4, 2501], [2, 6, 2502], [3, 7, 2503]]) {
          const items = steps.map((to, i) => ({ keys: storeKeys(stores[i]!), from: done[i]!, to, index: mine[i]! }));
          stage.primitives.indexFoldMany!(items);
          steps.forEach((to, i) => {
            indexFold(storeKeys(stores[i]!), done[i]!, to, ref[i]!);
            done[i] = to;
            expect(Buffer.from(mine[i]!.data).equals(Buffer.from(ref[i]!.data)), `${isa} ${form} store ${i} after ${to} rows`).toBe(true);
          });
        }
        expect(() => stage.primitives.indexFoldMany!([{ keys: storeKeys(stores[0]!), from: 5, to: 4, index: mine[0]! }])).toThrow(/^indexFold: rows \[5, 4\) out of range/);
        for (const K of stores) cpu.free(K);
      }
    });

    it(`${isa}: the stage's index job equals indexSelection on the native primitives, rows folded in steps, afresh in a new epoch`, () => {
      const r = rng(3312), P = nativeSelectorPrimitives(isa);
      using cpu = createCpuBackend({ threads: 2, isa });
      for (const form of PAGE_INDEX_FORMS) {
        const kvHeads = 2, group = 4, heads = kvHeads * group, d = 40, cap = 420, page = 8, sup = 4, dtype: DType = "bf16";
        using stage = new NativeCpuStage(cpu, { threads: 2 });
        stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: cap, dtype });
        const K = cpu.alloc([kvHeads, cap, d], dtype) as CpuTensor, V = cpu.alloc([kvHeads, cap, d], dtype);
        cpu.write(K, keysLike(r, kvHeads, cap, d));
        cpu.write(V, randn(r, kvHeads * cap * d));
        const keys = storeKeys(K);
        const check = (n: number, budget: number, epoch: number) => {
          const q = randn(r, heads * d), slot = (budget & 1) as 0 | 1;
          stage.query(slot).set(q);
          stage.submit(job(slot, K, V, n, budget, form, page, sup, epoch));
          stage.wait();
          const x = indexFor(P, { index: null, summarized: 0 }, keys, n, page, sup, form);
          const want = indexSelection(P, q, group, keys, x, n, budget), o = stage.output(slot);
          for (let g = 0; g < kvHeads; g++) {
            expect(Array.from(o.ids.subarray(g * o.kmax, g * o.kmax + o.counts[g]!)), `${isa} ${form} n=${n} K=${budget} head ${g}`).toEqual(Array.from(selectionForKvHead(want, g)));
          }
        };
        for (const [n, budget] of [[1, 1], [9, 5], [63, 17], [64, 64], [300, 40], [419, 0], [419, 100]]) check(n, budget, 0);
        cpu.write(K, keysLike(r, kvHeads, cap, d));
        check(419, 33, 1);
        cpu.free(K);
        cpu.free(V);
      }
    });
  }

  it("a job whose pages a device chose (after the query) fills its lists from them: equal to indexSelection; a page out of range is one line", () => {
    const r = rng(3313), P = nativeSelectorPrimitives("generic");
    using cpu = createCpuBackend({ threads: 2 });
    const kvHeads = 2, group = 4, heads = kvHeads * group, d = 32, cap = 300, page = 8, sup = 4, dtype: DType = "bf16";
    using stage = new NativeCpuStage(cpu, { threads: 2 });
    expect(stage.takesChosenPages).toBe(true);
    stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: cap, dtype });
    const K = cpu.alloc([kvHeads, cap, d], dtype) as CpuTensor, V = cpu.alloc([kvHeads, cap, d], dtype);
    cpu.write(K, keysLike(r, kvHeads, cap, d));
    cpu.write(V, randn(r, kvHeads * cap * d));
    const keys = storeKeys(K);
    // chosenPages is where a device's copy lands: indexChosenOffset bytes into the slot's query region
    const chosenView = (slot: 0 | 1, n: number) => new Int32Array(toArrayBuffer(stage.hostStaging(slot).query.address as Pointer, indexChosenOffset(heads, d), n * 4));
    stage.chosenPages(1).set([7, 8, 9]);
    expect(Array.from(chosenView(1, 3))).toEqual([7, 8, 9]);
    for (const form of PAGE_INDEX_FORMS) {
      for (const [n, budget] of [[1, 1], [63, 17], [299, 40], [299, 299]]) {
        const q = randn(r, heads * d), slot = (budget & 1) as 0 | 1, want = indexWant(budget, n, page);
        const x = indexFor(P, { index: null, summarized: 0 }, keys, n, page, sup, form);
        const best = P.indexPages(q, group, x, n, want);
        stage.query(slot).set(q);
        chosenView(slot, kvHeads * want).set(best.pages);
        stage.submit({ ...job(slot, K, V, n, budget, form, page, sup), work: { kind: "index", budget, form, pageSize: page, superPages: sup, chosen: true } });
        stage.wait();
        const exp = indexSelection(P, q, group, keys, x, n, budget), o = stage.output(slot);
        for (let g = 0; g < kvHeads; g++) {
          expect(Array.from(o.ids.subarray(g * o.kmax, g * o.kmax + o.counts[g]!)), `${form} n=${n} K=${budget} head ${g}`).toEqual(Array.from(selectionForKvHead(exp, g)));
        }
      }
    }
    stage.query(0).set(randn(r, heads * d));
    chosenView(0, kvHeads * 6).set([0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 38]);
    stage.submit({ ...job(0, K, V, 300, 40, "int8", page, sup), work: { kind: "index", budget: 40, form: "int8", pageSize: page, superPages: sup, chosen: true } });
    expect(() => stage.wait()).toThrow(/^cpu stage: the device's chosen page 38 is out of range \[0, 38\)$/);
    cpu.free(K);
    cpu.free(V);
  });

  it("a bad form or page size from a job is a one-line error before anything runs", () => {
    using cpu = createCpuBackend({ threads: 1 });
    using stage = new NativeCpuStage(cpu, { threads: 1 });
    stage.prepare({ heads: 2, kvHeads: 1, headDim: 8, storeCapacity: 32, dtype: "f32" });
    const K = cpu.alloc([1, 32, 8]), V = cpu.alloc([1, 32, 8]);
    expect(() => stage.submit(job(0, K, V, 20, 4, "int2" as PageIndexForm, 4, 4))).toThrow(/^page index: form "int2" does not exist \(forms: int8, int4\)$/);
    expect(() => stage.submit(job(0, K, V, 20, 4, "int8", 0, 4))).toThrow(/^cpu stage: index page size must be an integer in \[1, 4096\], got 0$/);
    cpu.free(K);
    cpu.free(V);
  });
});
