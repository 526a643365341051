import { describe, expect, it } from "vitest";
import { questPages, questSelection, selectionForKvHead, type CpuStage, type CpuStageJob, type DType, type Tensor } from "@hybridgen/spec";
import { BackendCpuStage, ReferenceBackend } from "@hybridgen/spec/kit";
import { createCpuBackend, NativeCpuStage, nativeSelectorPrimitives, storeKeys, type CpuTensor } from "../src/index.js";
import { randn, rng, SEED, supportedIsas } from "./helpers.js";

/**
 * K rows of `kvHeads` heads: head 0 fresh random; the others repeat a block of three pages (equal
 * page bounds far apart) whose rows come in equal pairs (equal exact scores in the page that does
 * not fit). `grid` puts every value on onGrid's lattice (bounds and scores exact in f32 and f64).
 */
function keysWithTies(r: () => number, kvHeads: number, cap: number, d: number, page: number, grid: boolean): Float32Array {
  const k = randn(r, kvHeads * cap * d, 2);
  for (let g = 1; g < kvHeads; g++) {
    const base = g * cap * d, period = 3 * page;
    for (let t = 0; t < cap; t++) {
      const src = t >= period ? t % period : t % 2 === 1 ? t - 1 : t;
      if (src !== t) k.copyWithin(base + t * d, base + src * d, base + (src + 1) * d);
    }
  }
  if (grid) for (let i = 0; i < k.length; i++) k[i] = onGrid(k[i]!);
  return k;
}

/**
 * v to a multiple of 1/8, then moved by 2^-10 (up for odd eighths, down for even): from 1/4 up
 * (a bf16 ulp of 2^-9 or more) that is off bf16's lattice, so the summaries' outward rounding
 * shows in f32 and f16 stores, while the keys, their rounded summaries (multiples of 2^-10) and a
 * query of multiples of 1/8 keep every bound and score exact in f32 and f64, ties included.
 */
function onGrid(v: number): number {
  const e = Math.round(v * 8);
  return e / 8 + (e & 1 ? 2 ** -10 : -(2 ** -10));
}

const gridded = (x: Float32Array) => x.map((v) => Math.round(v * 8) / 8);

function job(slot: 0 | 1, k: Tensor, v: Tensor, n: number, budget: number, pageSize: number, epoch = 0, keys = false): CpuStageJob {
  return { slot, k, v, offloaded: n, kmax: budget, scale: 0.125, work: { kind: "quest", budget, pageSize }, keys, storeEpoch: epoch };
}

function run(stage: CpuStage, j: CpuStageJob): void {
  stage.submit(j);
  stage.wait();
}

/** The ids of list g of a stage output. */
function listOf(stage: CpuStage, slot: 0 | 1, g: number): number[] {
  const o = stage.output(slot);
  return Array.from(o.ids.subarray(g * o.kmax, g * o.kmax + o.counts[g]!));
}

describe(`the stage's Quest kernel (seed ${SEED})`, () => {
  for (const isa of supportedIsas()) {
    it(`${isa}: equals questSelection on the native primitives: GQA 1/4/8, sizes off the vector width and page, ties, rows folded in steps`, () => {
      const r = rng(201);
      const P = nativeSelectorPrimitives(isa);
      using cpu = createCpuBackend({ threads: 2, isa });
      const cases: [DType, number, number, number, number][] = [ // dtype, kvHeads, group, headDim, page
        ["f32", 2, 1, 20, 7], ["bf16", 3, 4, 36, 16], ["f16", 2, 8, 13, 5], ["f32", 1, 4, 67, 16], ["bf16", 2, 8, 64, 3],
      ];
      for (const [dtype, kvHeads, group, d, page] of cases) {
        const cap = 401, heads = kvHeads * group, what = `${isa} ${dtype} kv=${kvHeads} G=${group} d=${d} page=${page}`;
        using stage = new NativeCpuStage(cpu, { threads: 2 });
        stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: cap, dtype });
        const K = cpu.alloc([kvHeads, cap, d], dtype) as CpuTensor, V = cpu.alloc([kvHeads, cap, d], dtype);
        cpu.write(K, keysWithTies(r, kvHeads, cap, d, page, false));
        cpu.write(V, randn(r, kvHeads * cap * d));
        const keys = storeKeys(K);
        // The store grows as the window evicts: the stage folds only the new rows in.
        for (const n of [1, page - 1 || 1, page + 1, 2 * page + 3, 150, 151, 397]) {
          const q = randn(r, heads * d);
          for (const budget of new Set([1, Math.min(n, page), Math.min(n, 2 * page + 1), Math.floor(n / 2), n])) {
            const slot = (budget & 1) as 0 | 1;
            stage.query(slot).set(q);
            run(stage, job(slot, K, V, n, budget, page));
            const pages = questPages(P, { pages: null, summarized: 0 }, keys, n, page);
            const want = questSelection(P, q, group, keys, pages, n, budget);
            for (let g = 0; g < kvHeads; g++) {
              expect(listOf(stage, slot, g), `${what} n=${n} K=${budget} head ${g}`).toEqual(Array.from(selectionForKvHead(want, g)));
            }
          }
        }
        // Rows below n rewritten (a restored checkpoint): a new epoch summarizes afresh.
        cpu.write(K, keysWithTies(r, kvHeads, cap, d, page, false));
        const q = randn(r, heads * d);
        stage.query(0).set(q);
        run(stage, job(0, K, V, 397, 40, page, 1));
        const want = questSelection(P, q, group, keys, questPages(P, { pages: null, summarized: 0 }, keys, 397, page), 397, 40);
        for (let g = 0; g < kvHeads; g++) expect(listOf(stage, 0, g), `${what} new epoch`).toEqual(Array.from(selectionForKvHead(want, g)));
        cpu.free(K);
        cpu.free(V);
      }
    });

    it(`${isa}: the native stage's quest job equals BackendCpuStage's (ids, logits, V and K rows)`, () => {
      const r = rng(202);
      using cpu = createCpuBackend({ threads: 2, isa });
      const ref = new ReferenceBackend();
      for (const dtype of ["f32", "bf16", "f16"] as DType[]) {
        const kvHeads = 2, group = 4, heads = kvHeads * group, d = 24, cap = 300, page = 16;
        const native = new NativeCpuStage(cpu, { threads: 2 }), portable = new BackendCpuStage(ref);
        const shape = { heads, kvHeads, headDim: d, storeCapacity: cap, dtype, stageKeys: true };
        native.prepare(shape);
        portable.prepare(shape);
        // Values on onGrid's lattice: bounds (on outward-rounded summaries) and scores are exact in both stages, so ties break the same way.
        const kData = keysWithTies(r, kvHeads, cap, d, page, true), vData = randn(r, kvHeads * cap * d);
        const a = { K: cpu.alloc([kvHeads, cap, d], dtype), V: cpu.alloc([kvHeads, cap, d], dtype) };
        const b = { K: ref.alloc([kvHeads, cap, d], dtype), V: ref.alloc([kvHeads, cap, d], dtype) };
        for (const [be, s] of [[cpu, a], [ref, b]] as const) {
          be.write(s.K, kData);
          be.write(s.V, vData);
        }
        for (const [n, budget] of [[41, 10], [200, 37], [299, 64], [299, 0]] as const) {
          const q = gridded(randn(r, heads * d, 2));
          for (const slot of [0, 1] as const) {
            native.query(slot).set(q);
            portable.query(slot).set(q);
            run(native, job(slot, a.K, a.V, n, budget, page, 0, slot === 1));
            run(portable, job(slot, b.K, b.V, n, budget, page, 0, slot === 1));
            const x = native.output(slot), y = portable.output(slot), what = `${dtype} n=${n} K=${budget} slot ${slot}`;
            expect(Array.from(x.counts), what).toEqual(Array.from(y.counts));
            expect(Array.from(x.counts), what).toEqual(new Array(kvHeads).fill(budget));
            for (let g = 0; g < kvHeads; g++) expect(listOf(native, slot, g), what).toEqual(listOf(portable, slot, g));
            for (let i = 0; i < heads * budget; i++) {
              if (x.logits[i] !== y.logits[i]) expect(Math.abs(x.logits[i]! - y.logits[i]!), `${what} logit ${i}`).toBeLessThan(2e-5);
            }
            const rows = kvHeads * budget * d;
            if (rows === 0) continue;
            expect(cpu.read(x.values, 0, rows), what).toEqual(ref.read(y.values, 0, rows));
            if (slot === 1) expect(cpu.read(x.keys!, 0, rows), what).toEqual(ref.read(y.keys!, 0, rows));
          }
        }
        native.close();
        portable.close();
        for (const t of [a.K, a.V]) cpu.free(t);
        for (const t of [b.K, b.V]) ref.free(t);
      }
      expect(ref.liveTensors()).toBe(0);
    });
  }

  it("bad quest jobs are one-line errors before anything reaches C", () => {
    using cpu = createCpuBackend({ threads: 1 });
    using stage = new NativeCpuStage(cpu);
    stage.prepare({ heads: 2, kvHeads: 1, headDim: 8, storeCapacity: 20, dtype: "f32" });
    const K = cpu.alloc([1, 20, 8]), V = cpu.alloc([1, 20, 8]);
    expect(() => stage.submit(job(0, K, V, 10, 11, 4))).toThrow(/width 11 out of range/);
    expect(() => stage.submit({ ...job(0, K, V, 10, 4, 4), kmax: 3 })).toThrow(/quest budget 4 out of range \[0, 3\]/);
    expect(() => stage.submit(job(0, K, V, 10, 4, 0))).toThrow(/quest page size must be an integer in \[1, 4096\], got 0/);
    cpu.free(K);
    cpu.free(V);
  });
});
